"""How the replay loop's own pace sets the two ``loop`` transfer terms, over the saved H200
compares (reads their logs; no replay, no GPU; seconds).

Per saved compare run after the fill change (the hw side's fill kernel in 64 KiB parts),
from its hw logs: the median host lag before a compute call (``hw_compute``'s last column:
how long the loop's thread ran since the event that woke it, i.e. one loop turn's Python),
the median one-page GPU -> host batch, and, where the log has the disk I/O spans, the
median hand-off of a one-page host -> disk batch (its wait for an I/O thread plus the time
from its piece's end until the loop saw it). Then a least-squares line of each against the
lag, its correlation, and leave-one-out errors. The committed profile's ``loop.transfer``
and ``loop.disk`` are constants; this is what a term scaled by the loop's pace would
predict.

    python3 benchmarks/loop_lag.py

Last line: ``gpu_to_host_vs_loop_lag_r: <correlation over the runs>``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.compare import read_report, saved_calls  # noqa: E402

RUNS = ["fill-in-parts-2026-11-30-0420", "sessions-10-12-2026-11-30-0429", "sessions-1-3-2026-11-30-0438",
        "18-turns-2026-11-30-0450", "sessions-10-12-calibrated-2026-11-30-0539",
        "sessions-1-3-loop-disk-2026-11-30-0559", "sessions-10-12-loop-disk-2026-11-30-0605",
        "sessions-10-12-calibrated-2026-11-30-0612"]


def line(x, y):
    """(intercept, slope, r, leave-one-out relative errors) of y against x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    A = np.vstack([np.ones_like(x), x]).T
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    loo = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        (ai, bi), *_ = np.linalg.lstsq(A[keep], y[keep], rcond=None)
        loo.append((ai + bi * x[i] - y[i]) / y[i])
    return float(a), float(b), float(np.corrcoef(x, y)[0, 1]), loo


def main() -> None:
    rows = []
    print("| run | loop lag p50 us | one-page GPU -> host p50 us | one-page host -> disk hand-off p50 us |")
    print("| --- | --- | --- | --- |")
    for run in RUNS:
        folder = ROOT / "docs" / "runs" / f"h200-agentic-slice-{run}"
        try:
            log = read_report(folder)["logs"]["hw"]
            calls = saved_calls(folder)["hw_compute"]
        except (OSError, KeyError, ValueError) as e:
            sys.exit(f"{folder}: expected a saved compare with hw logs: {e}")
        lag = statistics.median(c[5] for c in calls if len(c) > 5 and c[5] is not None)
        g2h = statistics.median(x["seconds"] for x in log
                                if x["src"] == "gpu" and x["dst"] == "host" and x["pages"] == 1)
        spans = [x["io_start_s"] + x["seconds"] - x["io_end_s"] for x in log
                 if x["src"] == "host" and x["dst"] == "disk" and x["pages"] == 1 and "io_end_s" in x]
        hand = statistics.median(spans) if spans else None
        rows.append((lag * 1e6, g2h * 1e6, None if hand is None else hand * 1e6))
        print(f"| {run} | {lag * 1e6:.1f} | {g2h * 1e6:.1f} | {'-' if hand is None else f'{hand * 1e6:.1f}'} |")
    a, b, r, loo = line([x[0] for x in rows], [x[1] for x in rows])
    print(f"one-page GPU -> host = {a:.1f} us + {b:.2f} x lag over {len(rows)} runs; r {r:.3f}; "
          f"leave-one-out errors {', '.join(f'{e * 100:+.1f}%' for e in loo)}")
    disk = [x for x in rows if x[2] is not None]
    if len(disk) >= 3:
        a, b, rd, loo = line([x[0] for x in disk], [x[2] for x in disk])
        print(f"host -> disk hand-off = {a:.1f} us + {b:.2f} x lag over {len(disk)} runs; r {rd:.3f}; "
              f"leave-one-out errors {', '.join(f'{e * 100:+.1f}%' for e in loo)}")
    print(f"gpu_to_host_vs_loop_lag_r: {r:.3f}")


if __name__ == "__main__":
    main()
