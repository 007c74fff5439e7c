"""When an SM copy kernel launched while compute runs gets its SMs: the start the sim gives it.

The sim starts an SM copy kernel launched while a step computes ``sm.interference.busy_start``
later than on an idle GPU, one figure for every compute. ``kvsim calibrate`` fitted it as
what was left of its busy cells' copy time once the per-CTA share was fitted (0.7 ms on
the H200 profile until 2026-12-05), but the interference grids' copies beside 1-5 ms of
GEMMs end as if they started at once. A copy's time cannot tell a later start from a
slower rate; this measures the start itself. What it can settle: the stand-in's GEMMs are persistent
kernels of one CTA an SM, grids of 128 CTAs at M = 128-256 and 132 at M = 4096 on an H200
(docs/validation.md, 2026-12-04 03:35), so beside M = 256 a copy may start at once on the
four SMs left, and beside M = 4096 wait for the running kernel's end (0.2-0.9 ms a
projection).

Each rep stamps the GPU clock (``%globaltimer``) from a one-thread kernel on the compute
stream, launches the compute (a chain of cuBLAS GEMMs of ``--model``'s layer projections at
M rows, as the stand-in runs a prefill, or HBM reads as the stand-in's ``kv_read``, for
``--compute-ms``), waits ``--lead-ms`` on the host, and launches the backend's copy kernel
(``kvsim_backends.hw.gpu.COPY_SOURCE``, each CTA stamping the clock and its SM as it
starts) on a copy stream of the backend's priority. A CTA's start less the compute's
stamp, less the host time between the two launches, is its start after its launch; the
same with no compute (``idle``) is the launch's own latency, taken off. Per cell (median
of ``--reps``): the first CTA's start after its launch beyond idle's, when the last CTA
started after the first, and how many SMs its CTAs took (an idle GPU spreads them one an
SM; beside persistent GEMM kernels they pack onto the SMs the GEMMs leave). Beside each,
the sim's later start (``busy_start`` beside compute, 0 idle). Last line: the first CTA's
start beside the prefill's GEMMs (the largest M) and beside reads, at the shortest lead,
with the sim's: ``hw_copy_start_ms: gemm X reads Y sim Z``.

    python3 benchmarks/hw_copy_start.py [--rows 256,1024,4096] [--lead-ms 0.3,1.5]
        [--h2d-ctas 36] [--d2h-ctas 8] [--page 1MiB] [--compute-ms 20] [--reps 7]
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
from kvsim.tools.fitkinds import KIND_MODEL  # noqa: E402

BUFFER = 1 << 30   # each direction's pages cycle over 1 GiB (more than L2 holds)
COPY_BYTES = 64 << 20  # each copy: long enough that every CTA starts while it runs
GAP_S = 0.03       # idle before each rep (the same power duty cycle for every cell)

STAMP = """
    if (threadIdx.x == 0) {  // this CTA's start on the GPU clock, and its SM
        unsigned long long t_;
        unsigned int sm_;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));
        stamps[2 * blockIdx.x] = t_;
        stamps[2 * blockIdx.x + 1] = sm_;
    }
"""

CLOCK_SOURCE = r"""
extern "C" __global__ void kv_clock(unsigned long long* out) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[0] = t;
}
"""


def stamped_source(copy_source: str) -> str:
    """The backend's copy kernel (``copy_source``: ``COPY_SOURCE``) as ``kv_copy_stamped``:
    the same loop, with a last argument ``stamps`` where each CTA writes its start (ns) and
    its SM before it copies. Raises ValueError where the source is not the one expected."""
    head = "extern \"C\" __global__ void kv_copy_pages("
    tail = "long long pages, long long page_bytes) {"
    i = copy_source.find(head)
    j = copy_source.find(tail, i)
    if i < 0 or j < 0:
        raise ValueError("the copy kernel's signature is not the one this benchmark stamps")
    j += len(tail)
    sig = copy_source[i:j].replace("kv_copy_pages(", "kv_copy_stamped(").replace(
        tail, "long long pages, long long page_bytes,\n    unsigned long long* __restrict__ stamps) {")
    return copy_source[:i] + sig + STAMP + copy_source[j:] + CLOCK_SOURCE


def starts(compute_ns: int, stamps: list[int], host_s: float) -> dict:
    """One rep's CTAs (``stamps``: start ns and SM, two a CTA) against the compute's stamp
    (``compute_ns``) and the host seconds between the two launches: the first CTA's start
    after its launch (s; the launch's latency still in), the last CTA's start after the
    first (s), the SMs its CTAs took, and ``host_s`` (the copy's actual lead: launching a
    long chain of GEMMs can take longer than the lead asked for)."""
    t = stamps[0::2]
    sms = stamps[1::2]
    first = min(t)
    return {"first_s": (first - compute_ns) / 1e9 - host_s, "spread_s": (max(t) - first) / 1e9,
            "sms": len(set(sms)), "host_s": host_s}


def summarise(reps: list[dict], idle_first_s: float) -> dict:
    """A cell's reps (``starts``' each): medians, the first start beyond idle's, the lead
    the host gave (``host_lead_s``)."""
    return {"delay_s": statistics.median(r["first_s"] for r in reps) - idle_first_s,
            "spread_s": statistics.median(r["spread_s"] for r in reps),
            "sms": statistics.median(r["sms"] for r in reps),
            "host_lead_s": statistics.median(r["host_s"] for r in reps),
            "delays_s": [r["first_s"] - idle_first_s for r in reps]}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _fail(msg: str) -> None:
    print(f"hw_copy_start: {msg}", file=sys.stderr)
    raise SystemExit(2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="256,1024,4096", help="the GEMMs' M, comma-separated")
    ap.add_argument("--lead-ms", default="0.3,1.5",
                    help="host ms from the compute's launch to the copy's, comma-separated")
    ap.add_argument("--h2d-ctas", type=int, default=36)
    ap.add_argument("--d2h-ctas", type=int, default=8)
    ap.add_argument("--page", default="1MiB", help="the copies' page size (16KiB-4MiB)")
    ap.add_argument("--compute-ms", type=float, default=20.0)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--model", default=KIND_MODEL)
    ap.add_argument("--profile", default="h200-pcie-calibrated")
    ap.add_argument("--json", help="write every cell here")
    a = ap.parse_args(argv)
    try:
        rows = [int(x) for x in a.rows.split(",") if x.strip()]
        leads = [x / 1e3 for x in _floats(a.lead_ms)]
    except ValueError:
        _fail(f"--rows and --lead-ms take comma-separated numbers, got {a.rows!r} / {a.lead_ms!r}")
    if not rows or min(rows) < 1 or not leads or min(leads) < 0:
        _fail(f"--rows takes integers of at least 1 and --lead-ms numbers of at least 0, "
              f"got {a.rows!r} / {a.lead_ms!r}")
    if a.h2d_ctas < 1 or a.d2h_ctas < 1 or a.reps < 1 or not 1.0 <= a.compute_ms <= 1000.0:
        _fail("--h2d-ctas, --d2h-ctas and --reps take integers of at least 1, --compute-ms "
              f"1-1000, got {a.h2d_ctas} / {a.d2h_ctas} / {a.reps} / {a.compute_ms}")
    try:
        page = parse_size(a.page)
    except ValueError as e:
        _fail(f"--page: {e}")
    if not 16 << 10 <= page <= 4 << 20:
        _fail(f"--page takes 16KiB to 4MiB, got {a.page!r}")
    try:
        profile = load_profile(a.profile)
    except ProfileError as e:
        _fail(str(e))
    from hw_gemm_ctas import gpu_and_layer  # noqa: PLC0415 (benchmarks/: this script's folder)
    cp, projections = gpu_and_layer(a.model, _fail)
    cells = run(cp, projections, rows, leads, {"h2d": a.h2d_ctas, "d2h": a.d2h_ctas}, page,
                a.compute_ms / 1e3, a.reps, profile.sm.threads_per_cta)
    sim = profile.sm.interference.busy_start if profile.sm.interference else 0.0
    print("| compute | lead ms (asked / given) | copy | first CTA ms after launch, beyond idle | "
          "last CTA ms after first | SMs | sim ms |")
    print("|" + " --- |" * 7)
    for c in cells:
        s = 0.0 if c["kind"] == "idle" else sim
        print(f"| {c['label']} | {c['lead_s'] * 1e3:g} / {c['host_lead_s'] * 1e3:.2f} | "
              f"{c['dir']} {c['ctas']} CTAs | "
              f"{c['delay_s'] * 1e3:+.3f} | {c['spread_s'] * 1e3:.3f} | {c['sms']:g} | {s * 1e3:.3f} |")
    if a.json:
        tmp = a.json + ".part"
        with open(tmp, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "page": page,
                       "model": a.model, "profile": a.profile, "busy_start": sim,
                       "cells": cells}, f, indent=1)
        os.replace(tmp, a.json)
    lead = min(leads)

    def fig(kind: str, m: int | None = None) -> str:
        got = [c["delay_s"] for c in cells if c["kind"] == kind and c["lead_s"] == lead
               and (m is None or c.get("m") == m)]
        return f"{statistics.median(got) * 1e3:.3f}" if got else "n/a"
    print(f"hw_copy_start_ms: gemm {fig('gemm', max(rows))} reads {fig('reads')} sim {sim * 1e3:.3f}")


def run(cp, projections, rows, leads, ctas, page, compute_s, reps, threads) -> list[dict]:
    """Every cell: idle, the GEMMs at each M and the reads, at each lead, each direction."""
    import numpy as np  # noqa: PLC0415
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415
    from hw_gemm_ctas import gemm_call  # noqa: PLC0415 (benchmarks/: this script's folder)

    from kvsim_backends.hw.gpu import COPY_SOURCE  # noqa: PLC0415
    from kvsim_backends.hw.standin import (READ_CTA_BYTES, READ_SOURCE,  # noqa: PLC0415
                                           READ_THREADS, read_buffer_bytes)

    mod = cp.RawModule(code=stamped_source(COPY_SOURCE) + READ_SOURCE, options=("-std=c++14",))
    copy_k, clock_k, read_k = (mod.get_function(n) for n in ("kv_copy_stamped", "kv_clock", "kv_read"))
    compute = cp.cuda.Stream(non_blocking=True, priority=0)
    copy_s = cp.cuda.Stream(non_blocking=True, priority=-5)  # as the backend's copy streams
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    # CuPy's gemmEx sets the handle's stream to CuPy's current stream at every call: the
    # GEMMs run on ``compute`` only inside ``with compute:`` (outside it, on the null stream)
    host = cp.cuda.alloc_pinned_memory(BUFFER)
    dev = cp.zeros(BUFFER // 4, dtype=cp.uint32)
    ends = {"h2d": (host.ptr, dev.data.ptr), "d2h": (dev.data.ptr, host.ptr)}
    pages = COPY_BYTES // page
    slots = cp.arange(pages, dtype=cp.int64) % (BUFFER // page)
    l2 = int(cp.cuda.Device().attributes.get("L2CacheSize", 0))
    rbuf = cp.zeros(read_buffer_bytes(l2) // 4, dtype=cp.uint32)
    sink = cp.zeros(1, dtype=cp.uint32)
    rng = cp.random.RandomState(1)

    def timed(fn) -> float:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        with compute:
            e0.record(compute)
            fn()
            e1.record(compute)
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / 1e3

    def gemms(m):
        calls = [gemm_call(cp, handle, rng, m, k, n) for k, n in projections]
        layer = lambda: [c() for c in calls]  # noqa: E731
        timed(layer)  # cuBLAS picks its kernels on a first call
        n = max(1, round(compute_s / timed(layer)))

        def chain():
            with compute:
                for _ in range(n):
                    layer()
        return chain

    def reads():
        vecs = rbuf.size // 4
        per = READ_CTA_BYTES // 16

        def launch(k):
            read_k((k,), (READ_THREADS,), (rbuf, np.int64(vecs), np.int64(per), np.uint32(1), sink),
                   stream=compute)
        probe = 1 << 16  # 4 GiB of reads: about a millisecond
        launch(probe)
        k = max(1, int(probe * compute_s / timed(lambda: launch(probe))))
        return lambda: launch(k)

    clock = cp.zeros(1, dtype=cp.uint64)

    def rep(fn, lead, d) -> dict:
        stamps = cp.zeros(2 * ctas[d], dtype=cp.uint64)
        cp.cuda.Device().synchronize()
        time.sleep(GAP_S)
        clock_k((1,), (1,), (clock,), stream=compute)
        t0 = time.perf_counter()
        if fn is not None:
            fn()
        while time.perf_counter() < t0 + lead:
            pass
        t1 = time.perf_counter()
        copy_k((ctas[d],), (threads,), (np.uint64(ends[d][0]), np.uint64(ends[d][1]), slots, slots,
                                        np.int64(pages), np.int64(page), stamps), stream=copy_s)
        cp.cuda.Device().synchronize()
        return starts(int(clock.get()[0]), [int(x) for x in stamps.get()], t1 - t0)

    computes = [("idle", "idle", None, None)]
    computes += [("gemm", f"GEMMs M={m}", m, gemms(m)) for m in rows]
    computes += [("reads", "HBM reads", None, reads())]
    cells, idle = [], {}
    for kind, label, m, fn in computes:
        for lead in leads:
            for d in ("h2d", "d2h"):
                got = [rep(fn, lead, d) for _ in range(reps)]
                if kind == "idle":
                    idle[lead, d] = statistics.median(r["first_s"] for r in got)
                cell = {"kind": kind, "label": label, "m": m, "lead_s": lead, "dir": d,
                        "ctas": ctas[d], "page": page, **summarise(got, idle[lead, d]),
                        "reps": got}
                cells.append(cell)
                print(f"{label:14s} lead {lead * 1e3:4.1f} ms {d} {ctas[d]:2d} CTAs: first "
                      f"{cell['delay_s'] * 1e3:+.3f} ms, all by +{cell['spread_s'] * 1e3:.3f} ms, "
                      f"{cell['sms']:g} SMs", flush=True)
    return cells


if __name__ == "__main__":
    main()
