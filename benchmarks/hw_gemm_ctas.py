"""How one of the stand-in's GEMMs slows beside SM copy CTAs, by where the CTAs land.

The hw backend's stand-in runs a step's GEMMs as cuBLAS calls (``kvsim_backends.hw.standin``).
On Hopper these are persistent kernels of one CTA per SM (measured with Nsight Compute on an
H200, 2026-12-04: ``nvjet_sm90`` kernels of 384 threads at 168 registers, 64,512 of an SM's
65,536, and 188-229 KB of shared memory, in clusters of two, a grid of 128 or 132 CTAs), so
a copy CTA, which needs registers of its own, cannot share an SM with one: each resident
copy CTA takes a whole SM from the GEMM. What that costs depends on where the copy CTAs sit,
so each cell is measured two ways:

- ``before``: the copy kernel launched on an idle GPU, its CTAs resident before the GEMMs
  start (the block scheduler spreads them over the GPU);
- ``during``: the copy kernel launched while GEMMs run, as a step's copies are (its CTAs take
  SMs as a GEMM's CTAs retire).

Each cell: one projection of ``--model``'s layer at M rows, a chain of calls for about
``--chain-ms``, alone and beside ``c`` SM copy CTAs host -> GPU (``--dir``) of 1 MiB pages
moving for all of it (``kvsim_backends.hw.gpu.Kernels.copy_pages``, the backend's kernel and
``sm.threads_per_cta``); the stretch is the chain's GPU time with the copy over alone, less
1, median of ``--reps`` (alternating, an idle gap before each). Last line: the prefill
chunk's (M = the largest row bucket at most 4096) FLOP-weighted stretch at 4 CTAs, each
order: ``hw_gemm_ctas_prefill_4: before +X% during +Y%``.

    python3 benchmarks/hw_gemm_ctas.py [--rows 256,4096] [--ctas 1,2,4,6,8,14,24,36,50]
        [--dir h2d|d2h] [--reps 3] [--chain-ms 8] [--json OUT] [--profile h200-pcie-calibrated]

Needs a CUDA GPU with CuPy (exit 2 without one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim.config.hardware import ProfileError, load_profile  # noqa: E402
from kvsim.tools.fitkinds import KIND_MODEL  # noqa: E402

PAGE = 1 << 20
SLOTS = 1024
CTA_BPS = {"h2d": 3.3e9, "d2h": 9e9}  # about what one CTA moves (sizes the copy)
LINK_BPS = 50e9


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="256,4096", help="the GEMMs' M, comma-separated")
    ap.add_argument("--ctas", default="1,2,4,6,8,14,24,36,50", help="copy CTAs, comma-separated")
    ap.add_argument("--dir", choices=("h2d", "d2h"), default="h2d")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chain-ms", type=float, default=8.0)
    ap.add_argument("--gap", type=float, default=0.03, help="idle seconds before each timed chain")
    ap.add_argument("--model", default=KIND_MODEL)
    ap.add_argument("--profile", default="h200-pcie-calibrated")
    ap.add_argument("--json", help="write every cell here")
    a = ap.parse_args(argv)
    try:
        rows, ctas = _ints(a.rows), _ints(a.ctas)
    except ValueError:
        print(f"hw_gemm_ctas: --rows and --ctas take comma-separated integers, got {a.rows!r} / {a.ctas!r}",
              file=sys.stderr)
        raise SystemExit(2) from None
    try:
        profile = load_profile(a.profile)
    except ProfileError as e:
        print(f"hw_gemm_ctas: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        import cupy as cp  # noqa: PLC0415
        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # no CuPy, no driver or no GPU
        print(f"hw_gemm_ctas: needs a CUDA GPU with CuPy ({type(e).__name__}: {e})", file=sys.stderr)
        raise SystemExit(2) from None
    from kvsim.config.hfmodel import load_model  # noqa: PLC0415
    from kvsim.settings import ModelSettings  # noqa: PLC0415
    projections = ModelSettings.capped(load_model(a.model).projections_per_gpu()).projections
    cells = run(cp, projections, rows, ctas, a.dir, a.reps, a.chain_ms / 1e3,
                a.gap, profile.sm.threads_per_cta)
    if a.json:
        tmp = a.json + ".part"
        with open(tmp, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dir": a.dir,
                       "model": a.model, "cells": cells}, f, indent=1)
        os.replace(tmp, a.json)
    m = max((r for r in rows if r <= 4096), default=max(rows))
    got = {o: weighted(cells, m, 4, o) for o in ("before", "during")}
    print("hw_gemm_ctas_prefill_4: " + " ".join(
        f"{o} {'n/a' if v is None else f'{v * 100:+.1f}%'}" for o, v in got.items()))


def weighted(cells: list[dict], m: int, c: int, order: str) -> float | None:
    """The FLOP-weighted stretch of the projections at ``m`` beside ``c`` CTAs (None: not run)."""
    got = [r for r in cells if r["m"] == m and r["ctas"] == c and r["order"] == order]
    if not got:
        return None
    w = [r["k"] * r["n"] for r in got]
    return sum(r["stretch"] * x for r, x in zip(got, w)) / sum(w)


def run(cp, projections, rows, ctas, direction, reps, chain_s, gap, threads) -> list[dict]:
    import numpy as np  # noqa: PLC0415
    from cupy_backends.cuda.api import runtime as rt  # noqa: PLC0415
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    from kvsim_backends.hw.gpu import Kernels  # noqa: PLC0415

    kernels = Kernels(cp)
    hi = cp.cuda.Stream(non_blocking=True, priority=-5)  # as the backend's copy streams
    lo = cp.cuda.Stream(non_blocking=True, priority=0)   # and its compute stream
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    coef = np.array([1.0, 0.0], dtype=np.float32)
    one, zero = coef.ctypes.data, coef.ctypes.data + 4
    host = cp.cuda.alloc_pinned_memory(SLOTS * PAGE)
    dev = cp.zeros(SLOTS * PAGE // 4, dtype=cp.uint32)
    src, dst = (host.ptr, dev.data.ptr) if direction == "h2d" else (dev.data.ptr, host.ptr)
    rng = cp.random.RandomState(1)

    def gemm_of(m, k, n):
        A = (rng.random_sample((m, k), dtype=cp.float32) - 0.5).astype(cp.float16)
        B = (rng.random_sample((k, n), dtype=cp.float32) - 0.5).astype(cp.float16)
        C = cp.empty((m, n), dtype=cp.float16)

        def call(_keep=(A, B, C, coef)):  # as the stand-in calls it (c^T = b^T a^T)
            cublas.gemmEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k, one, B.data.ptr,
                          rt.CUDA_R_16F, n, A.data.ptr, rt.CUDA_R_16F, k, zero, C.data.ptr,
                          rt.CUDA_R_16F, n, rt.CUDA_R_32F, cublas.CUBLAS_GEMM_DEFAULT)
        return call

    def chain(call, calls, lead=0):
        """``lead`` untimed calls, then ``calls`` timed ones on the compute stream: events."""
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        with lo:
            for _ in range(lead):
                call()
            e0.record(lo)
            for _ in range(calls):
                call()
            e1.record(lo)
        return e0, e1

    def secs(ev):
        ev[1].synchronize()
        return cp.cuda.get_elapsed_time(*ev) / 1e3

    def copy(c, seconds):
        pages = max(8, int(min(c * CTA_BPS[direction], LINK_BPS) * seconds / PAGE))
        idx = cp.arange(pages, dtype=cp.int64) % SLOTS
        kernels.copy_pages(hi, src, dst, idx, idx, PAGE, c, threads)

    cells = []
    for m in rows:
        for k, n in projections:
            call = gemm_of(m, k, n)
            secs(chain(call, 20))  # cuBLAS picks its kernel on a first call
            one_s = secs(chain(call, 20)) / 20
            calls = max(5, int(chain_s / one_s))
            lead = max(2, int(0.002 / one_s))  # ~2 ms of GEMMs before the copy's launch
            for c in ctas:
                for order in ("before", "during"):
                    alone, beside = [], []
                    for _ in range(reps):
                        time.sleep(gap)
                        alone.append(secs(chain(call, calls, lead)))
                        time.sleep(gap)
                        if order == "before":
                            copy(c, (lead + 3 * calls) * one_s + 0.01)
                            time.sleep(0.002)
                            ev = chain(call, calls, lead)
                        else:
                            ev = chain(call, calls, lead)
                            time.sleep(0.0005)  # the lead-in runs
                            copy(c, (lead + 3 * calls) * one_s + 0.01)
                        beside.append(secs(ev))
                        hi.synchronize()
                    a, b = statistics.median(alone), statistics.median(beside)
                    cells.append({"m": m, "k": k, "n": n, "ctas": c, "order": order,
                                  "gemm_us": a / calls * 1e6, "stretch": b / a - 1.0,
                                  "reps": [x / a - 1.0 for x in beside]})
                    print(f"M {m:5d} K {k:5d} N {n:5d} {c:3d} CTAs {order:6s} "
                          f"{a / calls * 1e6:7.1f} us  {(b / a - 1) * 100:+6.1f}%", flush=True)
    return cells


if __name__ == "__main__":
    main()
