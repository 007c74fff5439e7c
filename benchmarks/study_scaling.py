"""How well ``kvsim study`` spreads points over local Dask workers, and what a point costs
beyond its replay: the same 16-point study (4 GPU quotas x 4 seeds of the synthetic
default job) run with 1 and with 2 local workers, side by side, each into a fresh folder.

For each worker count it prints the study's wall time (cluster start, points, table and
plots: what ``kvsim study`` costs), the time of the points alone, and the sum of the
points' replay times (``replay``'s engine loop, measured in the workers). Then:

- ``study_overhead_s_per_point``: (1-worker study time - sum of its replay times) / 16:
  what a point costs beyond its replay when nothing runs in parallel (cluster start,
  sending the config, loading the workload, pickling the result back, writing the
  folder, the study's table and plots);
- last, ``study_scaling_x``: 1-worker study time / 2-worker study time.

Points write their run folders without their own PNGs by default (``--point-plots`` to
draw them: about half a second of matplotlib a point, done in the workers).

    python benchmarks/study_scaling.py [--sessions 20] [--point-plots] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.study.study import run_study  # noqa: E402

STUDY = """\
name: scaling
base: {base}
set:
  workload.synthetic.n_sessions: {sessions}
  output.plots: {plots}
grid:
  cache.tiers[0].quota: [8GiB, 12GiB, 16GiB, 24GiB]
seeds: [0, 1, 2, 3]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20, help="synthetic sessions a point")
    ap.add_argument("--point-plots", action="store_true", help="each point draws its own PNGs")
    ap.add_argument("--keep", help="write the two studies here (default: a temporary folder)")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvsim-study-scaling-"))
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / "scaling.yaml"
    spec.write_text(STUDY.format(base=ROOT / "configs" / "default.yaml", sessions=args.sessions,
                                 plots=str(args.point_plots).lower()))
    print(f"study: 16 points, {args.sessions} synthetic sessions each, point plots "
          f"{'on' if args.point_plots else 'off'}; folders under {tmp}")
    walls, replays = {}, {}
    try:
        for workers in (1, 2):
            out = tmp / f"workers-{workers}"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            rep = run_study(str(spec), workers=workers, out=str(out), progress=False)
            walls[workers] = time.perf_counter() - t0
            if rep.outcome.failures:
                sys.exit(f"points failed: {rep.outcome.failures}")
            replays[workers] = sum(rep.outcome.replay_s.values())
            print(f"workers {workers}: study {walls[workers]:.2f} s, points {rep.outcome.wall_s:.2f} s, "
                  f"sum of replays {replays[workers]:.2f} s, "
                  f"points ran {rep.outcome.ran}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    n = 16
    print(f"study_overhead_s_per_point: {(walls[1] - replays[1]) / n:.3f}")
    print(f"study_scaling_x: {walls[1] / walls[2]:.2f}")


if __name__ == "__main__":
    main()
