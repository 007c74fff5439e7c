"""How far the compute stand-in's calibrated chain times move between calibrations.

The hw backend's stand-in (``kvsim_backends.hw.standin``) times each M's chain of GEMMs
once, at start, after a warm-up of GEMMs, and fills a step's GEMM time with chains by
those times: a chain timed 2% slow makes every prefill step of that backend run 2% short
of nominal. The GEMMs are power-bound (``kvsim.core.datapath.powerstate``): from idle
they run up to 14% faster, so the chain times depend on the headroom the warm-up leaves.
On the H200 grids of 2026-12-04/05 the chain times of one machine's backends differed
by up to 3%, and a cell's GEMM time alone fell as its backend's chain time rose (r =
-0.99 on most groups of cells).

This times the calibration ``--rounds`` times for each warm-up of ``--hot`` seconds of
GEMMs, alternating, each after ``--idle`` seconds idle and again back to back, on one
backend, and prints each M's chain time per calibration. Last line: the largest spread
(max / min - 1 over the calibrations, the worst M) for each warm-up:
``hw_standin_chain_spread_pct: 0.2 s X / 1.0 s Y``.

    python3 benchmarks/hw_standin.py [--hot 0.2,1.0] [--rounds 4] [--idle 2] [--json OUT]
        [--profile h200-pcie-calibrated]

Needs a CUDA GPU with CuPy (exit 2 without one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim.config.hardware import ProfileError, load_profile  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402
from kvsim.run.seam import settings_for  # noqa: E402
from kvsim.tools.fitkinds import KIND_MODEL  # noqa: E402


def _fail(msg: str) -> None:
    print(f"hw_standin: {msg}", file=sys.stderr)
    raise SystemExit(2)


def spread(rows: list[dict], hot: float) -> float:
    """The largest max / min - 1 of any M's chain time over the calibrations at ``hot``."""
    times: dict[str, list[float]] = {}
    for r in rows:
        if r["hot_s"] == hot:
            for m, s in r["chain_s"].items():
                times.setdefault(m, []).append(s)
    return max((max(v) / min(v) - 1.0 for v in times.values() if min(v) > 0), default=0.0)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hot", default="0.2,1.0", help="seconds of GEMMs before timing, comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--idle", type=float, default=2.0, help="seconds idle before the first of each pair")
    ap.add_argument("--json", default=None, help="write the calibrations here")
    ap.add_argument("--profile", default="h200-pcie-calibrated")
    a = ap.parse_args(argv)
    try:
        hots = [float(x) for x in a.hot.split(",") if x.strip()]
    except ValueError:
        _fail(f"--hot {a.hot}: expected seconds, comma-separated (e.g. 0.2,1.0)")
    if not hots or min(hots) <= 0 or a.rounds < 1 or a.idle < 0:
        _fail("--hot: positive seconds; --rounds: at least 1; --idle: at least 0")
    try:
        prof = load_profile(a.profile)
    except ProfileError as e:
        _fail(str(e))
    from kvsim_backends.hw.gpu import load_cupy
    if load_cupy() is None:
        _fail("needs CuPy and a CUDA GPU")
    from kvsim_backends.hw.backend import HwBackend
    from kvsim_backends.hw.runtime import RealtimeRuntime

    sf = partial(settings_for, profile=prof, model=KIND_MODEL)
    be = HwBackend(RealtimeRuntime(), sf(64 << 10, {Level.GPU: 4}, device="gpu"))
    rows: list[dict] = []
    try:
        stream = be.streams["compute"]
        for k in range(a.rounds):
            for idle in (a.idle, 0.0):
                for hot in hots:
                    time.sleep(idle)
                    c = be.standin.calibrate(stream, hot_s=hot)
                    rows.append({"round": k, "idle_s": idle, "hot_s": hot, "chain_s": c["chain_s"]})
                    shown = " ".join(f"M{m} {s * 1e3:.4f}" for m, s in c["chain_s"].items())
                    print(f"round {k} idle {idle:.1f} s, {hot:.1f} s of GEMMs: {shown} ms", flush=True)
    finally:
        be.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"profile": a.profile, "model": KIND_MODEL, "rows": rows}, f)
    print("hw_standin_chain_spread_pct: "
          + " / ".join(f"{h:g} s {100 * spread(rows, h):.2f}" for h in hots))


if __name__ == "__main__":
    main()
