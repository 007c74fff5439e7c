"""Hit ratio per eviction policy and cache budget: one GPU tier on the Mooncake
conversation trace (512-token pages, Llama 3 70B at tp 1: 160 MiB pages), replayed on
the sim backend with the arrivals spread out (``workload.time_scale``) so that requests
barely overlap. The hit ratio is over the last half of the requests (the first half
warms the cache): hit tokens / prompt tokens.

Prints a table, then one line per policy and budget: ``hit_ratio POLICY BUDGET: X``.

    python benchmarks/policy_curves.py [--trace PATH] [--policies lru,belady,...]
                                       [--budgets 80,400,1600,6400] [--limit N]
                                       [--time-scale S]

``belady`` is the offline optimum (it knows the trace's future): the bound the online
policies are measured against.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]  # the checkout, installed or not

from kvsim.config import load_config  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
BUDGETS_GIB = (80, 400, 1600, 6400)
POLICIES = ("lru", "belady")
TIME_SCALE = 100.0  # ~29 s between arrivals on average: a request is mostly done first


def config(policy: str, budget_gib: int, trace: Path, limit: int | None = None,
           time_scale: float = TIME_SCALE):
    sets = [f"cache.policy.eviction={policy}", "tp=1", "cache.tokens_per_block=512",
            f"cache.tiers=[{{level: gpu, quota: {budget_gib}GiB}}]",
            f"workload.path={trace}", f"workload.time_scale={time_scale}",
            "engine.gpu_free_watermark=0", "output.plots=false"]
    if limit is not None:
        sets.append(f"workload.limit={limit}")
    return load_config(ROOT / "configs" / "mooncake-conversation.yaml", sets)


def hit_ratio(policy: str, budget_gib: int, trace: Path = TRACE, limit: int | None = None,
              time_scale: float = TIME_SCALE) -> tuple[float, float]:
    """(hit ratio over the last half of the requests, replay wall seconds)."""
    prep = prepare_run(config(policy, budget_gib, trace, limit, time_scale))
    t0 = time.perf_counter()
    res = replay(prep)
    wall = time.perf_counter() - t0
    rows = sorted(res.rows, key=lambda r: (r.arrival_ns, r.rid))
    tail = rows[len(rows) // 2:]
    hits = sum(r.hit_gpu + r.hit_host + r.hit_disk for r in tail)
    return hits / max(1, sum(r.input_tokens for r in tail)), wall


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS_GIB)), help="GiB each")
    ap.add_argument("--limit", type=int, default=None, help="first N requests only")
    ap.add_argument("--time-scale", type=float, default=TIME_SCALE)
    a = ap.parse_args(argv)
    policies = a.policies.split(",")
    budgets = [int(b) for b in a.budgets.split(",")]
    table: dict[tuple[str, int], float] = {}
    for p in policies:
        for b in budgets:
            table[p, b], wall = hit_ratio(p, b, a.trace, a.limit, a.time_scale)
            print(f"# {p} {b} GiB: hit ratio {table[p, b]:.4f}, replay {wall:.1f} s",
                  file=sys.stderr, flush=True)
    print(f"{'policy':<12}" + "".join(f"{str(b) + ' GiB':>12}" for b in budgets))
    for p in policies:
        print(f"{p:<12}" + "".join(f"{table[p, b]:>12.4f}" for b in budgets))
    for p in policies:
        for b in budgets:
            print(f"hit_ratio {p} {b}: {table[p, b]:.4f}")


if __name__ == "__main__":
    main()
