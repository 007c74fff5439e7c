"""How one of the stand-in's GEMMs slows beside SM copy CTAs, by where the CTAs land, the sim beside.

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
``--chain-ms``, alone and beside ``c`` SM copy CTAs of ``--page`` pages moving for all of it
(``kvsim_backends.hw.gpu.Kernels.copy_pages``, the backend's kernel and
``sm.threads_per_cta``): host -> GPU or GPU -> host (``--dir``), or ``both``: ``c`` GPU ->
host CTAs beside ``--h2d-ctas`` host -> GPU ones, each direction its own kernel on its own
stream, as the backend copies both ways. The stretch is the chain's GPU time with the copy
over alone, less 1, median of ``--reps`` (alternating, an idle gap before each). Beside it,
each direction's rate (its kernel's bytes over its GPU time) and the sim's stretch of the
same GEMM under that load (``kvsim.core.datapath.interference.Structure.gemm_stretch`` on
``--profile``, with the rates measured: the model of a step's copies, launched while its
GEMMs run, so the ``during`` order's); below the cells, the layer's projections together
(FLOP-weighted) at each M, count and order, hw's stretch beside the sim's. Last line: the
prefill chunk's (M = the largest row bucket at most 4096) FLOP-weighted stretch at 4 CTAs,
each order: ``hw_gemm_ctas_prefill_4: before +X% during +Y%``.

    python3 benchmarks/hw_gemm_ctas.py [--rows 256,4096] [--ctas 1,2,4,6,8,14,24,36,50]
        [--dir h2d|d2h|both] [--h2d-ctas 36] [--page 1MiB] [--reps 3] [--chain-ms 8]
        [--json OUT] [--profile h200-pcie-calibrated]

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
from kvsim.config.units import parse_size  # noqa: E402
from kvsim.core.datapath.interference import CopyLoad, hbm_exposure  # noqa: E402
from kvsim.core.datapath.work import gemm_tiles  # noqa: E402
from kvsim.tools.fitkinds import KIND_MODEL  # noqa: E402

BUFFER = 1 << 30  # each direction's pages cycle over 1 GiB (more than L2 holds)
CTA_BPS = {"h2d": 3.3e9, "d2h": 9e9}  # about what one CTA moves (sizes the copy)
LINK_BPS = 50e9


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _fail(msg: str) -> None:
    print(f"hw_gemm_ctas: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="256,4096", help="the GEMMs' M, comma-separated")
    ap.add_argument("--ctas", default="1,2,4,6,8,14,24,36,50",
                    help="copy CTAs, comma-separated (with --dir both: the GPU -> host ones)")
    ap.add_argument("--dir", choices=("h2d", "d2h", "both"), default="h2d")
    ap.add_argument("--h2d-ctas", type=int, default=36,
                    help="with --dir both: the host -> GPU CTAs beside each count of --ctas")
    ap.add_argument("--page", default="1MiB", help="the copies' page size (16KiB-4MiB)")
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
        _fail(f"--rows and --ctas take comma-separated integers, got {a.rows!r} / {a.ctas!r}")
    if not rows or not ctas or min(rows + ctas) < 1:
        _fail(f"--rows and --ctas take integers of at least 1, got {a.rows!r} / {a.ctas!r}")
    try:
        page = parse_size(a.page)
    except ValueError as e:
        _fail(f"--page: {e}")
    if not 4096 <= page <= BUFFER // 64:
        _fail(f"--page takes 4KiB to {BUFFER // 64 >> 20}MiB, got {a.page!r}")
    if a.dir == "both" and a.h2d_ctas < 1:
        _fail(f"--h2d-ctas takes an integer of at least 1, got {a.h2d_ctas}")
    try:
        profile = load_profile(a.profile)
    except ProfileError as e:
        _fail(str(e))
    cp, projections = gpu_and_layer(a.model, _fail)
    h2d = a.h2d_ctas if a.dir == "both" else 0
    cells = run(cp, projections, rows, ctas, a.dir, a.reps, a.chain_ms / 1e3,
                a.gap, profile.sm.threads_per_cta, page, h2d)
    for c in cells:
        c["sim"] = predict(profile, c)
    table(cells)
    summary(cells)
    if a.json:
        tmp = a.json + ".part"
        with open(tmp, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "dir": a.dir,
                       "page": page, "h2d_ctas": h2d, "model": a.model, "profile": a.profile,
                       "cells": cells}, f, indent=1)
        os.replace(tmp, a.json)
    m = max((r for r in rows if r <= 4096), default=max(rows))
    got = {o: weighted(cells, m, 4, o) for o in ("before", "during")}
    print("hw_gemm_ctas_prefill_4: " + " ".join(
        f"{o} {'n/a' if v is None else f'{v * 100:+.1f}%'}" for o, v in got.items()))


def predict(profile, cell: dict) -> float | None:
    """The sim's stretch of ``cell``'s GEMM (M ``m``, K ``k``, N ``n``) beside its copy CTAs
    (``h2d_ctas`` host -> GPU, ``ctas`` in ``dir``; both: ``ctas`` GPU -> host) moving at
    the rates measured (``h2d_Bps``, ``d2h_Bps``) at pages of ``page``: the structural
    model's GEMM part on ``profile`` (None: a profile without the kinds' terms)."""
    s = profile.interference_structure(page_bytes=cell["page"])
    if s is None:
        return None
    d2h = cell["ctas"] if cell["dir"] != "h2d" else 0
    h2d = cell["ctas"] if cell["dir"] == "h2d" else cell.get("h2d_ctas", 0)
    h2d_Bps, d2h_Bps = cell.get("h2d_Bps", 0.0), cell.get("d2h_Bps", 0.0)
    load = CopyLoad(ctas_h2d=h2d, ctas_d2h=d2h, hbm_Bps=h2d_Bps + d2h_Bps, h2d_Bps=h2d_Bps,
                    sm_d2h_Bps=d2h_Bps)
    m, k, n = cell["m"], cell["k"], cell["n"]
    return s.gemm_stretch(((gemm_tiles(m, n, s.tile), 1.0),), load, hbm_exposure(s, ((k, n),), m))


def table(cells: list[dict]) -> None:
    """Each cell's hw stretch beside the sim's, with the copy's measured rates."""
    print("| M | K | N | copy CTAs | order | GEMM us | hw stretch | sim stretch | h2d GB/s | d2h GB/s |")
    print("|" + " --- |" * 10)
    for c in cells:
        sim = "n/a" if c.get("sim") is None else f"{c['sim'] * 100:+.1f}%"
        both = f"{c['h2d_ctas']} + {c['ctas']}" if c["dir"] == "both" else f"{c['ctas']} {c['dir']}"
        print(f"| {c['m']} | {c['k']} | {c['n']} | {both} | {c['order']} | {c['gemm_us']:.1f} | "
              f"{c['stretch'] * 100:+.1f}% | {sim} | {c.get('h2d_Bps', 0) / 1e9:.1f} | "
              f"{c.get('d2h_Bps', 0) / 1e9:.1f} |")


def weighted(cells: list[dict], m: int, c: int, order: str, key: str = "stretch") -> float | None:
    """The FLOP-weighted ``key`` (hw's stretch, or the sim's: ``sim``) of the projections at
    ``m`` beside ``c`` CTAs (None: not run, or a cell without it)."""
    got = [r for r in cells if r["m"] == m and r["ctas"] == c and r["order"] == order]
    if not got or any(r.get(key) is None for r in got):
        return None
    w = [r["k"] * r["n"] for r in got]
    return sum(r[key] * x for r, x in zip(got, w)) / sum(w)


def summary(cells: list[dict]) -> None:
    """The layer's projections together (FLOP-weighted) at each M, CTA count and order:
    hw's stretch beside the sim's."""
    print("\n| M | copy CTAs | order | hw stretch | sim stretch |")
    print("|" + " --- |" * 5)
    seen = []
    for c in cells:
        key = (c["m"], c["ctas"], c["order"])
        if key in seen:
            continue
        seen.append(key)
        hw, sim = weighted(cells, *key), weighted(cells, *key, key="sim")
        both = f"{c['h2d_ctas']} + {c['ctas']}" if c["dir"] == "both" else f"{c['ctas']} {c['dir']}"
        print(f"| {c['m']} | {both} | {c['order']} | {hw * 100:+.1f}% | "
              f"{'n/a' if sim is None else f'{sim * 100:+.1f}%'} |")


def gpu_and_layer(model: str, fail) -> tuple:
    """(CuPy, ``model``'s layer projections (K, N) on one GPU, as the stand-in's), or
    ``fail`` with why where there is no CUDA GPU with CuPy."""
    try:
        import cupy as cp  # noqa: PLC0415
        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # no CuPy, no driver or no GPU
        fail(f"needs a CUDA GPU with CuPy ({type(e).__name__}: {e})")
    from kvsim.config.hfmodel import load_model  # noqa: PLC0415
    from kvsim.settings import ModelSettings  # noqa: PLC0415
    return cp, ModelSettings.capped(load_model(model).projections_per_gpu()).projections


def gemm_call(cp, handle, rng, m: int, k: int, n: int):
    """A call of no arguments that runs one fp16 GEMM of M x K by K x N (random operands of
    ``rng``) through cuBLAS's ``gemmEx`` as the stand-in calls it (``c^T = b^T a^T``, fp32
    accumulate) on CuPy's current stream (CuPy's ``gemmEx`` sets ``handle``'s stream to it
    at every call: run it inside ``with stream:``); ``handle`` takes its scalars from the
    host (``CUBLAS_POINTER_MODE_HOST``)."""
    import numpy as np  # noqa: PLC0415
    from cupy_backends.cuda.api import runtime as rt  # noqa: PLC0415
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    coef = np.array([1.0, 0.0], dtype=np.float32)  # alpha, beta (kept alive by the call)
    one, zero = coef.ctypes.data, coef.ctypes.data + 4
    A = (rng.random_sample((m, k), dtype=cp.float32) - 0.5).astype(cp.float16)
    B = (rng.random_sample((k, n), dtype=cp.float32) - 0.5).astype(cp.float16)
    C = cp.empty((m, n), dtype=cp.float16)

    def call(_keep=(A, B, C, coef)):
        cublas.gemmEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k, one, B.data.ptr,
                      rt.CUDA_R_16F, n, A.data.ptr, rt.CUDA_R_16F, k, zero, C.data.ptr,
                      rt.CUDA_R_16F, n, rt.CUDA_R_32F, cublas.CUBLAS_GEMM_DEFAULT)
    return call


def run(cp, projections, rows, ctas, direction, reps, chain_s, gap, threads, page,
        h2d_ctas=0) -> list[dict]:
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    from kvsim_backends.hw.gpu import Kernels  # noqa: PLC0415

    kernels = Kernels(cp)
    # as the backend's copy streams (one a direction) and its compute stream
    hi = {d: cp.cuda.Stream(non_blocking=True, priority=-5) for d in ("h2d", "d2h")}
    lo = cp.cuda.Stream(non_blocking=True, priority=0)
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    slots = BUFFER // page
    dirs = ("h2d", "d2h") if direction == "both" else (direction,)
    ends = {}  # direction -> (src, dst)
    keep = []
    for d in dirs:
        host = cp.cuda.alloc_pinned_memory(BUFFER)
        dev = cp.zeros(BUFFER // 4, dtype=cp.uint32)
        keep += [host, dev]
        ends[d] = (host.ptr, dev.data.ptr) if d == "h2d" else (dev.data.ptr, host.ptr)
    index: dict[int, object] = {}  # pages -> their slots, made before any timing

    def slots_of(pages):
        if pages not in index:
            index[pages] = cp.arange(pages, dtype=cp.int64) % slots
            cp.cuda.Device().synchronize()  # (made on another stream than the copy's)
        return index[pages]

    rng = cp.random.RandomState(1)

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

    def sized(counts, seconds):
        """Each direction's pages for about ``seconds`` of ``counts[d]`` CTAs, their slots
        made now (not while a chain runs)."""
        out = {d: max(8, int(min(c * CTA_BPS[d], LINK_BPS) * seconds / page)) for d, c in counts.items()}
        for pages in out.values():
            slots_of(pages)
        return out

    def copy(counts, sizes):
        """Each direction's kernel of ``counts[d]`` CTAs on its stream moving ``sizes[d]``
        pages: {direction: (events, bytes)}."""
        out = {}
        for d, c in counts.items():
            pages = sizes[d]
            sl = slots_of(pages)
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(hi[d])
            kernels.copy_pages(hi[d], *ends[d], sl, sl, page, c, threads)
            e1.record(hi[d])
            out[d] = ((e0, e1), pages * page)
        return out

    cells = []
    for m in rows:
        for k, n in projections:
            call = gemm_call(cp, handle, rng, m, k, n)
            secs(chain(call, 20))  # cuBLAS picks its kernel on a first call
            one_s = secs(chain(call, 20)) / 20
            calls = max(5, int(chain_s / one_s))
            lead = max(2, int(0.002 / one_s))  # ~2 ms of GEMMs before the copy's launch
            for c in ctas:
                counts = {"h2d": h2d_ctas, "d2h": c} if direction == "both" else {direction: c}
                sizes = sized(counts, (lead + 3 * calls) * one_s + 0.01)
                for order in ("before", "during"):
                    alone, beside, rates = [], [], {d: [] for d in counts}
                    for _ in range(reps):
                        time.sleep(gap)
                        alone.append(secs(chain(call, calls, lead)))
                        time.sleep(gap)
                        if order == "before":
                            cps = copy(counts, sizes)
                            time.sleep(0.002)
                            ev = chain(call, calls, lead)
                        else:
                            ev = chain(call, calls, lead)
                            time.sleep(0.0005)  # the lead-in runs
                            cps = copy(counts, sizes)
                        beside.append(secs(ev))
                        for d, (cev, nbytes) in cps.items():
                            rates[d].append(nbytes / secs(cev))
                    a, b = statistics.median(alone), statistics.median(beside)
                    cell = {"m": m, "k": k, "n": n, "ctas": c, "order": order, "dir": direction,
                            "page": page, "gemm_us": a / calls * 1e6, "stretch": b / a - 1.0,
                            "reps": [x / a - 1.0 for x in beside]}
                    if direction == "both":
                        cell["h2d_ctas"] = h2d_ctas
                    for d, r in rates.items():
                        cell[f"{d}_Bps"] = statistics.median(r)
                    cells.append(cell)
                    print(f"M {m:5d} K {k:5d} N {n:5d} {c:3d} CTAs {order:6s} "
                          f"{a / calls * 1e6:7.1f} us  {(b / a - 1) * 100:+6.1f}%", flush=True)
    return cells


if __name__ == "__main__":
    main()
