"""How two ranks' steps share one GPU on the hw backend: what each kind of step loses to
another rank's step running at once on the same GPU.

Two ranks on one GPU each launch their steps on their own compute stream from the one
runtime thread (the hw backend's ranks, ``node.ranks_per_gpu``), a step's kernels all at
once when the rank's previous step has ended. Each cell runs two such ranks for
``--window-ms``, each launching steps of its kind back to back (one step in flight a
rank, as a replay's loop without run-ahead), and takes each rank's steps that ran while
the other's ran too (its first and last dropped): their median GPU time (CUDA events on
its stream) over the same step's alone, its stretch. Kinds (the stand-in's work,
``kvsim_backends.hw.standin``, each at its nominal step time on the profile's compute
model):

- ``prefill-256`` / ``prefill-4096``: a prefill chunk of 256 / 4096 tokens (tensor-core
  GEMM chains at M = 256 / 4096, kernels of tens to hundreds of microseconds; the short
  chunk's overhead share as reads);
- ``decode``: a decode step of 4 requests at 32K context (HBM reads in kernels of
  ``--chunk-ms``, the stand-in's ``engine.read_kernel``).

Two rules the sim could take for steps that run at once, printed beside each cell:
processor sharing (each of n at 1/n: stretch 2.0) and sharing by kernel length (the
streams' kernels take turns, so a step's share is its kernel's length over the sum of
both steps' kernel lengths: stretch (k_v + k_o) / k_v), with each kind's kernel length
measured here (its GPU time alone over its kernels).

The profile's ``gpu.kernel_overlap`` from the cells: a cell's overlap is how much less
than the other rank's kernel each of its own kernels waited, k_o - (stretch - 1) x k_v;
the fit is their median per read-kernel length (``kernel_overlap_us``), and each cell's
stretch by the rule with that overlap, (k_v + k_o - overlap) / k_v, is printed beside it.
The measurement is ``kvsim_backends.hw.rankshareprobe``'s and the fit
``kvsim.tools.fitoverlap``'s: ``kvsim calibrate`` runs both on a GPU, at its read kernel.

    python3 benchmarks/hw_rank_share.py [--window-ms 400] [--chunk-ms 0.5,0.1] [--reps 5]
        [--model llama-3-8b] [--json OUT]
    python3 benchmarks/hw_rank_share.py --from OUT.json [OUT2.json ...]   (the fit only)

Needs CuPy and a CUDA GPU (not with ``--from``). Prints ``rank_share_kernel_rule_closer:
K of N`` last: the rank-steps where the kernel-length rule is closer to the measured
stretch than processor sharing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim.config.hardware import load_profile  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402
from kvsim.run.seam import settings_for  # noqa: E402
from kvsim.tools.fitkinds import share_works  # noqa: E402
from kvsim.tools.fitoverlap import fit_overlap, overlap_of, rule_stretch, within  # noqa: E402
from kvsim_backends.hw.backend import HwBackend  # noqa: E402
from kvsim_backends.hw.gpu import load_cupy  # noqa: E402
from kvsim_backends.hw.rankshareprobe import run_cells  # noqa: E402
from kvsim_backends.hw.runtime import RealtimeRuntime  # noqa: E402

PROFILE = "h200-pcie-calibrated"


def works(model: str) -> dict:
    return share_works(load_profile(PROFILE), model)


def report_overlap(rows: list[dict]) -> None:
    """Each cell's stretch beside the rule with the fitted overlap; the fit per length."""
    fit = fit_overlap(rows)
    for r in rows:
        ov = fit[r["chunk_ms"]]
        pred = rule_stretch(r, ov)
        print(f"chunk {r['chunk_ms']:.2f} ms  {r['rank']:>12} beside {r['other']:>12}: x{r['stretch']:.2f}, "
              f"rule with overlap {ov:.1f} us x{pred:.2f} ({(pred / r['stretch'] - 1) * 100:+.1f}%), "
              f"this cell's overlap {overlap_of(r):+.1f} us")
    for c, ov in fit.items():
        cells = [r for r in rows if r["chunk_ms"] == c]
        print(f"kernel_overlap_us (read kernels {c:.2f} ms): {ov:.2f}; the rule with it within 10% in "
              f"{within(cells, ov)} of {len(cells)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window-ms", type=float, default=400.0)
    ap.add_argument("--chunk-ms", default="0.5,0.1")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--json", default=None)
    ap.add_argument("--from", dest="saved", nargs="+", default=None,
                    help="the --json files of earlier runs: fit the overlap from them, measure nothing")
    a = ap.parse_args()
    if a.saved:
        rows = [r for path in a.saved for r in json.load(open(path))]
        report_overlap(rows)
        print(f"rank_share_kernel_rule_closer: "
              f"{sum(abs(r['kernel_rule'] - r['stretch']) < abs(2.0 - r['stretch']) for r in rows)} of {len(rows)}")
        return
    cp = load_cupy()
    if cp is None:
        sys.exit("hw_rank_share.py needs CuPy and a CUDA GPU")
    rows, closer = [], 0
    for chunk_ms in [float(x) for x in a.chunk_ms.split(",")]:
        rt = RealtimeRuntime()
        st = settings_for(64 << 10, {Level.GPU: 4}, load_profile(PROFILE), device="gpu", model=a.model)
        be = HwBackend(rt, dataclasses.replace(st, read_kernel_s=chunk_ms / 1e3))  # (engine.read_kernel)

        def say(me: str, other: str, r: dict | None, chunk_ms: float = chunk_ms) -> None:
            nonlocal closer
            if r is None:
                print(f"chunk {chunk_ms:.2f} ms  {me:>12} beside {other:>12}: no step ran beside the other")
                return
            x, kr = r["stretch"], r["kernel_rule"]
            closer += abs(kr - x) < abs(2.0 - x)
            print(f"chunk {chunk_ms:.2f} ms  {me:>12} beside {other:>12}: {r['steps']:3d} steps "
                  f"{r['alone_ms']:6.2f} -> {r['with_ms']:6.2f} ms  x{x:.2f}  "
                  f"(kernel rule x{kr:.2f}, kernels {r['kernel_us']:.0f} / {r['other_kernel_us']:.0f} us; "
                  f"processor sharing x2.00)", flush=True)
        try:
            rows += run_cells(cp, be.standin, works(a.model), a.window_ms / 1e3, a.reps, chunk_ms, say)
        finally:
            be.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    report_overlap(rows)
    print(f"rank_share_kernel_rule_closer: {closer} of {len(rows)}")


if __name__ == "__main__":
    main()
