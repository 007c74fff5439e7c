"""How well ``kvsim study`` spreads points over local Dask workers, and what a point costs
beyond its replay: the same 16-point study (4 GPU quotas x 4 seeds of the synthetic
default job) run with 1 and with 2 local workers, side by side, each into a fresh folder;
and, for the ceiling, the same replays in two plain processes (no Dask) run one after
another and at once.

Each study runs in a fresh Python process, as ``kvsim study`` would. For each worker count
it prints the study's wall time (from importing kvsim.study to the plots written: imports,
planning, cluster start, points, cluster close, table and plots), its parts, and the sum
of the points' replay times (``replay``'s engine loop, measured in the workers). Then:

- ``replay_pair_ceiling_x``: two processes each replaying the same 4 points (one per GPU
  quota, seed 0), started at once, against the same two run one after another: (the sum of
  the two alone) / (the span of the two at once). What 2 workers could reach at best on
  this machine, with no study, no Dask and no fixed cost: below 2.0 when two replays at
  once slow each other (shared caches, memory bandwidth, hyperthreads, other jobs);
- ``study_fixed_s``: the study's time outside its points phase (imports, cluster start,
  table, plots), with 1 and with 2 workers;
- ``points_overhead_s_per_point``: (the 1-worker points phase - the sum of its replay
  times) / 16: what a point costs in the points phase beyond its replay (loading the
  workload, sending the point and its results, writing the folder);
- ``points_parallelism_2_workers``: with 2 workers, the sum of replay times / the
  points phase's wall time (2.0: both workers busy replaying all along);
- ``study_overhead_s_per_point``: (1-worker study time - sum of its replay times) / 16,
  the issue's figure: the two above together, the fixed cost spread over the points;
- last, ``study_scaling_x``: 1-worker study time / 2-worker study time.

Points write their run folders without their own PNGs by default (``--point-plots`` to
draw them: about half a second of matplotlib a point, done in the workers).

    python benchmarks/study_scaling.py [--sessions 20] [--point-plots] [--keep DIR] [--no-ceiling]

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
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]  # the checkout, installed or not


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


CEILING_POINTS = (0, 4, 8, 12)   # one point per GPU quota, seed 0


def replay_points(spec: str) -> None:
    """Replay the ceiling's points in this (fresh) process once told to: imports, a warm-up
    replay and the points' preparation first, then 'ready' and a wait for a line on stdin.
    Prints the replays' start and end (CLOCK_MONOTONIC, the same in every process)."""
    from kvsim.config import validate_config
    from kvsim.run import prepare_run, replay
    from kvsim.study.execute import warm
    from kvsim.study.study import plan_study

    _, points = plan_study(spec)
    preps = [prepare_run(validate_config(points[i].config, points[i].name)) for i in CEILING_POINTS]
    warm()
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for prep in preps:
        replay(prep)
    print(json.dumps({"start": t0, "end": time.perf_counter()}), flush=True)


def replay_pair(spec: Path, together: bool) -> tuple[float, float]:
    """Two processes replaying the same points, at once or one after the other: (the sum of
    their replay times, the span from the first start to the last end)."""
    cmd = [sys.executable, __file__, "--replays", str(spec)]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                sys.exit(f"the ceiling's replay process failed (exit {p.wait()})")
        outs = []
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
            if not together:
                outs.append(json.loads(p.communicate()[0].strip().splitlines()[-1]))
        if together:
            outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return (sum(o["end"] - o["start"] for o in outs),
            max(o["end"] for o in outs) - min(o["start"] for o in outs))


def ceiling(spec: Path, rounds: int = 2) -> float:
    """replay_pair_ceiling_x over ``rounds`` alternations of one after another and at once."""
    alone = together = spread = 0.0
    for _ in range(rounds):
        a, _span = replay_pair(spec, together=False)
        s, span = replay_pair(spec, together=True)
        alone, together, spread = alone + a, together + span, spread + s
    print(f"replay pair ({len(CEILING_POINTS)} replays a process, {rounds} rounds, no Dask): "
          f"one after another {alone / rounds:.2f} s, at once {together / rounds:.2f} s; "
          f"a replay {100 * (spread / alone - 1):+.0f}% slower beside another")
    return alone / together


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    if sys.argv[1:2] == ["--replays"]:
        replay_points(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=20, help="synthetic sessions a point")
    ap.add_argument("--point-plots", action="store_true", help="each point draws its own PNGs")
    ap.add_argument("--keep", help="write the two studies here (default: a temporary folder)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the replay pair (replay_pair_ceiling_x)")
    args = ap.parse_args()
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvsim-study-scaling-"))
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / "scaling.yaml"
    spec.write_text(STUDY.format(base=ROOT / "configs" / "default.yaml", sessions=args.sessions,
                                 plots=str(args.point_plots).lower()))
    print(f"study: 16 points, {args.sessions} synthetic sessions each, point plots "
          f"{'on' if args.point_plots else 'off'}; folders under {tmp}")
    walls, replays, points_wall = {}, {}, {}
    ceiling_x = None
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
                  + ", ".join(f"{k} {v:.2f} s" for k, v in r["parts"].items()), flush=True)
        if not args.no_ceiling:
            ceiling_x = ceiling(spec)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    n = 16
    # replay-seconds done per second of the points phase: 2.0 would be two workers never
    # idle (a shared machine shows instead in the replays' sum growing with 2 workers)
    if ceiling_x is not None:
        print(f"replay_pair_ceiling_x: {ceiling_x:.2f}")
    print(f"study_fixed_s: 1 worker {walls[1] - points_wall[1]:.2f}, 2 workers {walls[2] - points_wall[2]:.2f}")
    print(f"points_overhead_s_per_point: {(points_wall[1] - replays[1]) / n:.3f}")
    print(f"points_parallelism_2_workers: {replays[2] / points_wall[2]:.2f}")
    print(f"study_overhead_s_per_point: {(walls[1] - replays[1]) / n:.3f}")
    print(f"study_scaling_x: {walls[1] / walls[2]:.2f}")


if __name__ == "__main__":
    main()
