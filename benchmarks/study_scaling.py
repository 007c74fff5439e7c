"""How well ``kvsim study`` spreads points over local Dask workers, and what a point costs
beyond its replay: the same 16-point study (4 GPU quotas x 4 seeds of the synthetic
default job) run with 1 and with 2 local workers, side by side, each into a fresh folder.

Each study runs in a fresh Python process, as ``kvsim study`` would. For each worker count
it prints the study's wall time (from importing kvsim.study to the plots written: imports,
cluster start, points, table and plots), its parts, and the sum of the points' replay
times (``replay``'s engine loop, measured in the workers). Then:

- ``study_overhead_s_per_point``: (1-worker study time - sum of its replay times) / 16:
  what a point costs beyond its replay when nothing runs in parallel (cluster start,
  sending the config, loading the workload, pickling the result back, writing the
  folder, the study's table and plots);
- ``points_parallelism_2_workers``: with 2 workers, the sum of replay times / the
  points phase's wall time (2.0: both workers busy replaying all along);
- last, ``study_scaling_x``: 1-worker study time / 2-worker study time.

Points write their run folders without their own PNGs by default (``--point-plots`` to
draw them: about half a second of matplotlib a point, done in the workers).

    python benchmarks/study_scaling.py [--sessions 20] [--point-plots] [--keep DIR]

The machine's other load shows in the replay sums: with 2 workers on 2 busy cores each
replay takes longer than alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


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


def one(spec: str, workers: int, out: str) -> None:
    """Run the study once in this (fresh) process; print its timings as JSON."""
    t0 = time.perf_counter()
    from kvsim.study.study import run_study

    rep = run_study(spec, workers=workers, out=out, progress=False)
    wall = time.perf_counter() - t0
    print(json.dumps({"wall": wall, "failures": rep.outcome.failures, "ran": rep.outcome.ran,
                      "replay": sum(rep.outcome.replay_s.values()),
                      "parts": {"imports": wall - sum(rep.timings.values()), **rep.timings}}))


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
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
    walls, replays, points_wall = {}, {}, {}
    try:
        for workers in (1, 2):
            out = tmp / f"workers-{workers}"
            shutil.rmtree(out, ignore_errors=True)
            proc = subprocess.run([sys.executable, __file__, "--one", str(spec), str(workers), str(out)],
                                  capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                sys.exit(f"the study with {workers} workers failed:\n{proc.stderr[-3000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            if r["failures"] or r["ran"] != 16:
                sys.exit(f"points failed: {r['failures']}")
            walls[workers], replays[workers] = r["wall"], r["replay"]
            points_wall[workers] = r["parts"]["points"]
            print(f"workers {workers}: study {r['wall']:.2f} s, sum of replays {r['replay']:.2f} s; "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in r["parts"].items()))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    n = 16
    # replay-seconds done per second of the points phase: 2.0 would be two workers never
    # idle (a shared machine shows instead in the replays' sum growing with 2 workers)
    print(f"points_parallelism_2_workers: {replays[2] / points_wall[2]:.2f}")
    print(f"study_overhead_s_per_point: {(walls[1] - replays[1]) / n:.3f}")
    print(f"study_scaling_x: {walls[1] / walls[2]:.2f}")


if __name__ == "__main__":
    main()
