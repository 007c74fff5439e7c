"""What a point of a study over the whole Mooncake conversation trace costs, and how long
a 1,000-point study would take on this machine: a study of ``--points`` points (host
quotas 64 GiB, 68 GiB, ... on ``configs/mooncake-conversation.yaml``, the full trace,
12,031 requests) run with ``--workers`` local Dask workers, exactly as ``kvsim study``
runs it (fresh folder, table and study plots at the end; point plots off).

Prints the study's parts (imports, cluster start, points, table, plots), the per-point
times (``task``: a point's whole time in its worker, trace loading, replay and rendering
the folder's files included; ``replay``: the engine loop alone; ``client``: fetching the
files and writing the point's folder on the client, which does this for every point, one
at a time), and then:

- ``study_points_per_s``: points finished a second of the points phase;
- ``study_per_point_s``: the mean worker time a point (``task``);
- last, ``study_1000_points_projected_min``: the fixed cost (everything but the points)
  plus 1,000 points at the measured rate, in minutes. The rate of a short study includes
  its last round, where some workers already sit idle: the projection errs long.

    python benchmarks/study_mooncake.py [--workers N] [--points P] [--trace PATH]
                                        [--installed | --compiled] [--set key=value ...] [--keep DIR]

``--workers`` defaults to the machine's cores and ``--points`` to three rounds of them.
``--installed`` runs the kvsim this interpreter has installed (the compiled build:
``KVSIM_COMPILE=1 pip install .``); ``--compiled`` builds it in ``local/compiled-venv``
first when it is missing or stale, as ``benchmarks/sim_speed.py --compiled`` does (that
needs the package registry for the dependencies).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from kvsim_choice import choose  # noqa: E402

choose(__file__)

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"

STUDY = """\
name: mooncake-{points}
base: {base}
set:
  workload.path: {trace}
  output.plots: false
grid:
  cache.tiers[1].quota: [{quotas}]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="local Dask workers (default: the cores)")
    ap.add_argument("--points", type=int, help="points in the study (default: 3 x workers)")
    ap.add_argument("--trace", default=str(TRACE), help="the Mooncake conversation trace (JSONL)")
    ap.add_argument("--config", default=str(ROOT / "configs" / "mooncake-conversation.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="an override on the base config (repeatable)")
    ap.add_argument("--keep", help="write the study here (default: a temporary folder)")
    ap.add_argument("--installed", action="store_true", help="the installed kvsim (e.g. the compiled build)")
    ap.add_argument("--compiled", action="store_true", help="build local/compiled-venv if needed, run there")
    args = ap.parse_args()
    points = args.points or 3 * args.workers
    if points < 1 or args.workers < 1:
        sys.exit("--points and --workers must be at least 1")
    if not Path(args.trace).is_file():
        sys.exit(f"--trace {args.trace}: no such file")
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kvsim-study-mooncake-"))
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / "study.yaml"
    spec.write_text(STUDY.format(points=points, base=Path(args.config).resolve(),
                                 trace=json.dumps(str(Path(args.trace).resolve())),
                                 quotas=", ".join(f"{64 + 4 * i}GiB" for i in range(points))))
    out = tmp / "study"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    import kvsim.core.manager
    from kvsim.study.study import run_study

    kind = "compiled" if kvsim.core.manager.__file__.endswith(".so") else "pure Python"
    print(f"study: {points} points over {args.trace}, {args.workers} workers on {os.cpu_count()} cores, "
          f"kvsim {kind} ({Path(kvsim.core.manager.__file__).parent.parent})", flush=True)
    try:
        rep = run_study(str(spec), args.overrides, workers=args.workers, out=str(out), progress=False)
        wall = time.perf_counter() - t0
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    o = rep.outcome
    if o.failures:
        sys.exit(f"{len(o.failures)} points failed, e.g. {next(iter(o.failures.items()))}")
    parts = {"imports": wall - sum(rep.timings.values()), **rep.timings}
    fixed = wall - parts["points"]
    rate = o.ran / parts["points"]
    print(f"study {wall:.1f} s: " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))

    def stats(d: dict) -> str:
        v = sorted(d.values())
        return f"mean {statistics.fmean(v):.2f} s, median {statistics.median(v):.2f} s, {v[0]:.2f}-{v[-1]:.2f} s"

    print(f"per point: task {stats(o.task_s)}; replay {stats(o.replay_s)}; in the worker beside the "
          f"replay {stats({k: o.task_s[k] - o.replay_s[k] for k in o.task_s})}; client {stats(o.client_s)}")
    per_point = statistics.fmean(o.task_s.values())
    print(f"fixed cost (all but the points phase): {fixed:.2f} s; workers busy "
          f"{sum(o.task_s.values()) / (parts['points'] * args.workers):.2f} of the points phase; "
          f"the client busy {sum(o.client_s.values()) / parts['points']:.2f}")
    print(f"study_points_per_s: {rate:.3f}")
    print(f"study_per_point_s: {per_point:.2f}")
    print(f"study_1000_points_projected_min: {(fixed + 1000 / rate) / 60:.1f}")


if __name__ == "__main__":
    main()
