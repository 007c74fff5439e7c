"""kvsim's eviction policies against libCacheSim's (PyPI ``libcachesim``, the Python
bindings of the simulator S3-FIFO's and SIEVE's authors maintain) on flat traces: one
block a request, no shared prefixes, one tier, one request at a time. The hit ratio of
each policy at each cache size, side by side, and the largest gap over all of them.

kvsim runs a real replay: a Mooncake JSONL trace written to a temporary folder (outside
the repository), one request a line, each a prompt of one 512-token block whose hash id
is the object's id (and one output token: no page beyond the prompt's), replayed by the
sim backend with one GPU tier of N pages (``engine.max_running=1``: one request at a
time, as libCacheSim serves them). So the hit ratio comes through the engine, the
manager's plans and the policy's own order, as in any run. libCacheSim serves the same
ids as objects of size 1 in a cache of N.

Pairs (kvsim -> libCacheSim): lru -> LRU, lfu -> LFU, s3-fifo -> S3FIFO (the same
defaults: small 0.1, ghost 0.9, move to main at 2 hits), arc -> ARC, sieve -> Sieve,
gdsf -> GDSF, lfu-da -> GDSF (GDSF with unit sizes and costs is LFU-DA as published;
libCacheSim's own ``LFUDA`` adds L at each hit instead of one and is not compared). On a
flat trace every kvsim page is at depth 0, so gdsf's depth-weighted cost is 1 and gdsf
equals lfu-da. libCacheSim's GDSF inserts before it evicts, so a new object of the lowest
value may be its own victim; a kvsim page is in use while room is made for it (evict,
then insert, as GreedyDual is described): the hit ratios agree, a few requests differ.

Traces: ``zipf`` (seeded: ``--zipf-requests`` requests over ``--zipf-objects`` objects,
popularity 1 / rank ** ``--zipf-alpha``) and ``mooncake`` (the conversation trace's hash
ids, every request's in order, flattened into one sequence). Sizes in pages.

Prints a table, then ``policy_vs_libcachesim_max_gap: X`` last.

    python benchmarks/policy_vs_libcachesim.py [--traces zipf,mooncake] [--trace PATH]
        [--policies lru,lfu,...] [--sizes-zipf 100,400,1600] [--sizes-mooncake 2000,8000,32000]
        [--limit N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.config import load_config  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
PAGE_TOKENS = 512
PAGE_BYTES = 160 * 2**20  # Llama 3 70B at tp 1: 320 KiB a token x 512 tokens
#: kvsim policy -> libCacheSim class name
PAIRS = {"lru": "LRU", "lfu": "LFU", "lfu-da": "GDSF", "gdsf": "GDSF", "s3-fifo": "S3FIFO",
         "arc": "ARC", "sieve": "Sieve"}
SIZES = {"zipf": (100, 400, 1600), "mooncake": (2000, 8000, 32000)}


def zipf_ids(n_requests: int, n_objects: int, alpha: float, seed: int = 0) -> list[int]:
    """``n_requests`` object ids in [0, n_objects), id k drawn with probability
    proportional to 1 / (k + 1) ** alpha (seeded: the same list every time)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n_objects + 1, dtype=np.float64) ** alpha
    return rng.choice(n_objects, size=n_requests, p=w / w.sum()).tolist()


def mooncake_ids(path: Path, limit: int | None = None) -> list[int]:
    """The trace's hash ids, request after request, in order (``limit``: the first N)."""
    out: list[int] = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.extend(json.loads(line)["hash_ids"])
                if limit is not None and len(out) >= limit:
                    return out[:limit]
    return out


def write_flat(ids: list[int], path: Path) -> None:
    """A Mooncake JSONL trace of one request an id: one full 512-token block, one output
    token, a millisecond apart."""
    with open(path, "w") as f:
        for i, o in enumerate(ids):
            f.write(f'{{"timestamp": {i}, "input_length": {PAGE_TOKENS}, "output_length": 1, '
                    f'"hash_ids": [{o}]}}\n')


def kvsim_hits(flat: Path, policy: str, pages: int) -> list[bool]:
    """Whether each request of the flat trace ``flat`` hit, replayed by kvsim with one GPU
    tier of ``pages`` pages, one request at a time."""
    cfg = load_config(ROOT / "configs" / "mooncake-conversation.yaml", [
        f"cache.policy.eviction={policy}", "tp=1", f"cache.tokens_per_block={PAGE_TOKENS}",
        f"cache.tiers=[{{level: gpu, quota: {pages * PAGE_BYTES}}}]", f"workload.path={flat}",
        "engine.max_running=1", "engine.gpu_free_watermark=0", "output.plots=false"])
    res = replay(prepare_run(cfg))
    rows = sorted(res.rows, key=lambda r: (r.arrival_ns, r.rid))
    assert all(r.input_tokens == PAGE_TOKENS for r in rows) and len(rows) == sum(1 for _ in open(flat))
    return [r.hit_gpu == PAGE_TOKENS for r in rows]


def libcachesim_hits(ids: list[int], policy: str, pages: int) -> list[bool]:
    """Whether each request hit in libCacheSim's cache of the paired algorithm, ``pages``
    objects of size 1."""
    import libcachesim as lcs

    cache = getattr(lcs, PAIRS[policy])(pages)
    req = lcs.Request()
    req.obj_size = 1
    out = []
    for i, o in enumerate(ids):
        req.obj_id = o
        req.clock_time = i
        out.append(bool(cache.get(req)))
    return out


def compare(ids: list[int], policies: list[str], sizes: list[int],
            log=print) -> dict[tuple[str, int], tuple[float, float, int]]:
    """(policy, size) -> (kvsim's hit ratio, libCacheSim's, requests whose outcome
    differs)."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="kvsim-flat-") as d:
        flat = Path(d) / "flat.jsonl"
        write_flat(ids, flat)
        for p in policies:
            for n in sizes:
                t0 = time.perf_counter()
                a = kvsim_hits(flat, p, n)
                t1 = time.perf_counter()
                b = libcachesim_hits(ids, p, n)
                out[p, n] = (sum(a) / len(a), sum(b) / len(b), sum(x != y for x, y in zip(a, b)))
                log(f"# {p} {n} pages: kvsim {out[p, n][0]:.4f} ({t1 - t0:.1f} s), "
                    f"libCacheSim {out[p, n][1]:.4f}, {out[p, n][2]} requests differ")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="zipf,mooncake")
    ap.add_argument("--trace", type=Path, default=TRACE, help="the Mooncake conversation trace")
    ap.add_argument("--policies", default=",".join(PAIRS))
    ap.add_argument("--sizes-zipf", default=",".join(map(str, SIZES["zipf"])))
    ap.add_argument("--sizes-mooncake", default=",".join(map(str, SIZES["mooncake"])))
    ap.add_argument("--zipf-requests", type=int, default=200_000)
    ap.add_argument("--zipf-objects", type=int, default=20_000)
    ap.add_argument("--zipf-alpha", type=float, default=0.9)
    ap.add_argument("--limit", type=int, default=None, help="first N flattened ids only")
    a = ap.parse_args(argv)
    policies = [p for p in a.policies.split(",") if p]
    unknown = [p for p in policies if p not in PAIRS]
    if unknown:
        print(f"--policies: no libCacheSim pair for {', '.join(unknown)}", file=sys.stderr)
        return 2
    rows = []
    for name in a.traces.split(","):
        if name == "zipf":
            ids = zipf_ids(a.zipf_requests, a.zipf_objects, a.zipf_alpha)
            sizes = [int(x) for x in a.sizes_zipf.split(",")]
        elif name == "mooncake":
            if not a.trace.exists():
                print(f"{a.trace}: no such trace (pass --trace)", file=sys.stderr)
                return 2
            ids = mooncake_ids(a.trace)
            sizes = [int(x) for x in a.sizes_mooncake.split(",")]
        else:
            print(f"--traces: unknown trace {name!r} (zipf, mooncake)", file=sys.stderr)
            return 2
        if a.limit is not None:
            ids = ids[:a.limit]
        print(f"# {name}: {len(ids)} requests, {len(set(ids))} objects", file=sys.stderr,
              flush=True)
        res = compare(ids, policies, sizes, log=lambda s: print(s, file=sys.stderr, flush=True))
        rows += [(name, p, n, *res[p, n]) for p in policies for n in sizes]
    print(f"{'trace':<9} {'policy':<8} {'pages':>7} {'kvsim':>8} {'libCacheSim':>12} "
          f"{'gap':>8} {'differ':>7}")
    for name, p, n, k, lc, diff in rows:
        print(f"{name:<9} {p:<8} {n:>7} {k:>8.4f} {lc:>12.4f} {k - lc:>+8.4f} {diff:>7}")
    print(f"policy_vs_libcachesim_max_gap: {max(abs(k - lc) for _, _, _, k, lc, _ in rows):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
