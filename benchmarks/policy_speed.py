"""Replay speed per eviction policy against LRU: full replays of the Mooncake conversation
trace with one GPU tier (the setup of benchmarks/policy_curves.py), run side by side in
one run, alternating LRU and the other policies so that a change in the machine's load
falls on all of them alike. Each replay runs in a fresh interpreter of its own (a child
process; ``--in-process`` runs them all in this one), so that no replay inherits another's
heap: run in one process, a replay after belady's large tables took up to twice the CPU
time of the same replay run first.

Each replay is timed in CPU time (``time.process_time``: this process's own, so other
work on a shared machine slows it far less than it slows wall time), whole and without
building its policy (``belady`` reads the trace's future once, before the replay starts:
the "loop" is the rest); its wall time is printed too. The garbage collector runs as in
any replay, for every policy alike.

Prints each replay, then per budget each policy's median CPU time and its ratio to LRU's
(the median over the rounds of its CPU time over that of the LRU replay run next to it),
whole and of the loop alone, then per policy ``NAME_over_lru_loop_x`` and
``NAME_over_lru_x: X``, the largest of those ratios over the budgets,
``belady_over_lru_x`` (the whole replay's) last.

    python benchmarks/policy_speed.py [--policies belady] [--budgets 80,6400]
                                      [--repeats 3] [--trace PATH] [--limit N] [--in-process]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]  # the checkout, installed or not

import policy_curves  # noqa: E402

import kvsim.run.pipeline  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402


def one_replay(policy: str, budget_gib: int, trace: Path, limit: int | None
               ) -> tuple[float, float, float, int]:
    """(replay CPU seconds, of which building the policy, replay wall seconds, requests
    completed); the trace is loaded untimed."""
    prep = prepare_run(policy_curves.config(policy, budget_gib, trace, limit))
    build = kvsim.run.pipeline.build_policy
    spent = [0.0]

    def timed_build(*args, **kwargs):
        t = time.process_time()
        try:
            return build(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - t

    kvsim.run.pipeline.build_policy = timed_build  # replay() looks it up when it runs
    try:
        gc.collect()
        w0, c0 = time.perf_counter(), time.process_time()
        res = replay(prep)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        kvsim.run.pipeline.build_policy = build
    return cpu, spent[0], wall, res.metrics["requests_completed"]


def child_replay(policy: str, budget_gib: int, trace: Path, limit: int | None
                 ) -> tuple[float, float, float, int]:
    """``one_replay`` in a fresh interpreter (this script with ``--one``)."""
    cmd = [sys.executable, __file__, "--one", policy, "--budgets", str(budget_gib),
           "--trace", str(trace)] + ([] if limit is None else ["--limit", str(limit)])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return tuple(json.loads(out.strip().splitlines()[-1]))  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="belady", help="compared with lru, comma-separated")
    ap.add_argument("--budgets", default="80,6400", help="GPU tier sizes, GiB each")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trace", type=Path, default=policy_curves.TRACE)
    ap.add_argument("--limit", type=int, default=None, help="first N requests only")
    ap.add_argument("--in-process", action="store_true", help="every replay in this process")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one replay, as JSON
    a = ap.parse_args(argv)
    if not a.trace.exists():
        print(f"{a.trace}: no such trace (pass --trace)", file=sys.stderr)
        return 2
    if a.one:
        print(json.dumps(one_replay(a.one, int(a.budgets), a.trace, a.limit)))
        return 0
    run_one = one_replay if a.in_process else child_replay
    others = [p for p in a.policies.split(",") if p and p != "lru"]
    budgets = [int(b) for b in a.budgets.split(",")]
    cpus: dict[tuple[str, int], list[float]] = {}
    loops: dict[tuple[str, int], list[float]] = {}
    for b in budgets:
        for r in range(a.repeats):
            order = ["lru", *others] if r % 2 == 0 else [*others, "lru"]
            for p in order:
                cpu, build, wall, done = run_one(p, b, a.trace, a.limit)
                cpus.setdefault((p, b), []).append(cpu)
                loops.setdefault((p, b), []).append(cpu - build)
                print(f"{b} GiB run {r + 1}: {p:<8} cpu {cpu:7.2f} s (loop {cpu - build:6.2f} s, "
                      f"building the policy {build:5.2f} s), wall {wall:7.2f} s, "
                      f"{done} requests", flush=True)
    ratios: dict[tuple[str, int], float] = {}
    loop_ratios: dict[tuple[str, int], float] = {}
    print(f"CPU time (process_time), {a.repeats} replays each, interleaved, "
          f"{'in this process' if a.in_process else 'each in its own process'}: the median, and "
          f"the median of the ratios to the lru replay of the same round (run back to back)")
    print(f"{'budget':>8} {'policy':<8} {'cpu s':>9} {'x lru':>7} {'loop s':>8} {'x lru':>7}")
    for b in budgets:
        base, lbase = statistics.median(cpus["lru", b]), statistics.median(loops["lru", b])
        print(f"{b:>5}GiB {'lru':<8} {base:9.2f} {1.0:7.2f} {lbase:8.2f} {1.0:7.2f}")
        for p in others:
            med, lmed = statistics.median(cpus[p, b]), statistics.median(loops[p, b])
            ratios[p, b] = statistics.median(
                x / y for x, y in zip(cpus[p, b], cpus["lru", b]))
            loop_ratios[p, b] = statistics.median(
                x / y for x, y in zip(loops[p, b], loops["lru", b]))
            print(f"{b:>5}GiB {p:<8} {med:9.2f} {ratios[p, b]:7.2f} {lmed:8.2f} "
                  f"{loop_ratios[p, b]:7.2f}")
    print("median ratio of CPU times to lru's, the largest over the budgets:")
    for p in sorted(others, key=lambda p: p == "belady"):  # belady's lines last
        name = p.replace("-", "_")
        print(f"{name}_over_lru_loop_x: {max(loop_ratios[p, b] for b in budgets):.2f}")
        print(f"{name}_over_lru_x: {max(ratios[p, b] for b in budgets):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
