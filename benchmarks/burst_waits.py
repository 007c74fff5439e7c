"""Seed 003's burst: what the short requests that arrive during it wait for, the queue
(admission) or the manager (its bookkeeping charged to the executor,
``engine.manager_cost``), and their TTFT.

    python benchmarks/burst_waits.py [STUDY_FOLDER]

Reads the points of ``studies/burst-resize.yaml``'s run (default
``results/study-burst-resize``). For each point with a burst: the window from the burst's
arrival (the first request of 100K tokens or more) to the end of the last long request;
the short requests (under 100K tokens) that arrive in it: how many, their TTFT p50 and
p90, their queue time (arrival to admission) p50 and its share of their TTFT, and the
manager's time from ``summary.json`` (``manager.busy_s`` over the whole run, an upper
bound of what any request waited for it, and its longest single block ``max_s``). The
last line: ``burst_short_ttft_p50_s: value`` for ``burst-4-at-once-cpp-stats-page`` seed 0.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

LONG = 100_000


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "results/study-burst-resize")
    pts = sorted((folder / "points").glob("*")) if (folder / "points").is_dir() else []
    if not pts:
        print(f"{folder}: no points (run: kvsim study studies/burst-resize.yaml --out {folder})", file=sys.stderr)
        return 2
    last = None
    print(f"{'point':<44} {'short':>5} {'TTFT p50':>9} {'p90':>8} {'queue p50':>9} {'queue/TTFT':>10} "
          f"{'manager busy':>12} {'max block':>9}")
    for pt in pts:
        with open(pt / "requests.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["ttft_s"]]
        longs = [r for r in rows if int(r["input_tokens"]) >= LONG]
        if not longs:
            continue
        t0 = min(float(r["arrival_s"]) for r in longs)
        t1 = max(float(r["arrival_s"]) + float(r["e2e_s"]) for r in longs if r["e2e_s"])
        short = [r for r in rows if int(r["input_tokens"]) < LONG and t0 <= float(r["arrival_s"]) <= t1]
        if not short:
            continue
        ttft = [float(r["ttft_s"]) for r in short]
        queue = [float(r["queue_s"]) for r in short]
        m = json.loads((pt / "summary.json").read_text())["metrics"].get("manager", {})
        share = statistics.median(q / t for q, t in zip(queue, ttft) if t > 0)
        print(f"{pt.name:<44} {len(short):>5} {statistics.median(ttft):>8.2f}s {pct(ttft, 0.9):>7.1f}s "
              f"{statistics.median(queue):>8.2f}s {share:>10.1%} {m.get('busy_s', 0.0) * 1e3:>10.1f}ms "
              f"{m.get('max_s', 0.0) * 1e3:>7.2f}ms")
        if pt.name == "burst-4-at-once-cpp-stats-page__seed=0":
            last = statistics.median(ttft)
    if last is not None:
        print(f"burst_short_ttft_p50_s: {last:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
