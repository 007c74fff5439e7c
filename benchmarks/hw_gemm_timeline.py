"""How a chain of the stand-in's GEMMs slows over time beside an SM copy kernel, call by
call, and how much of that is left at the GPU's power cap; the sim beside.

The interference grids (``hw_interference.py``) time a whole compute beside a copy, after
100 ms of idle each. On the H200 their GEMM cells beside GPU -> host SM copies slowed about
3% per ms of overlap at 2 ms of compute and 14-15% at 10-20 ms, where the sim takes about
19% throughout (docs/validation.md, 2026-12-05 16:38): an onset, or the power state? This
times every call. Each repetition (after ``--gap`` of idle): a chain of one GEMM (M
``--rows``, K x N ``--kn``, fp16 on cuBLAS as the stand-in calls it) with an event after
every call, alone, then again with the backend's copy kernel (``Kernels.copy_pages``,
``--ctas`` CTAs of ``--page`` pages, ``--mib`` MiB, ``--dir``) launched ``--lead-ms`` after
the chain (``--order during``) or that long before it (``before``). Each call's time beside
over the same call's alone (median over the repetitions), binned by its midpoint's time
since the copy's start. Beside the table, the sim's stretch of that GEMM under that copy at
the rate it moved (``hw_gemm_ctas.predict``: the structural model's GEMM part, which has no
onset and no power state).

Then, unless ``--cap-s 0``, ``--cap-s`` seconds of the same GEMM back to back, alone, beside
copies queued one after another all along (enough each chain of 200 calls to outlast it),
alone again: calls a second, the share of the loop's GPU time a copy ran, and where
``nvidia-smi`` is on the path the SM clock and power it samples every 50 ms (median over
the second half). On an H100 (2026-12-05 17:25) the calls slowed +22.5 to +24.4% from the
copy's first 0.5 ms to its end (8 GPU -> host CTAs of 64 KiB); a first loop at the 700 W
cap, with copies running about 15% of it, lost 5.4%: about +35% a call while one ran.

Last line: ``hw_gemm_timeline: first +A% then +B% sim +C% cap +D%`` (the first 0.5 ms of
the copy; the median of the later bins while it runs; the sim's; at the cap, the loop's
loss over the share of it the copies ran, or n/a).

    python3 benchmarks/hw_gemm_timeline.py [--rows 4096] [--kn 4096,4096] [--dir d2h]
        [--ctas 8] [--page 64KiB] [--mib 256] [--order during] [--lead-ms 2] [--reps 8]
        [--chain-ms 13] [--gap 0.1] [--cap-s 2.5] [--json OUT] [--profile h200-pcie-calibrated]

Needs a CUDA GPU with CuPy (exit 2 without one). Not yet run on a GPU: its scratch
predecessor gave the H100 figures above.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends"), os.path.dirname(os.path.abspath(__file__))]

from kvsim.config.hardware import ProfileError, load_profile  # noqa: E402
from kvsim.config.units import parse_size  # noqa: E402
from kvsim.tools.fitkinds import KIND_MODEL  # noqa: E402

import hw_gemm_ctas  # noqa: E402

BUFFER = 1 << 30  # each direction's pages cycle over 1 GiB (more than L2 holds)
EDGES_MS = (-9.0, -2.0, -1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 11.0, 20.0, 40.0)


def _fail(msg: str) -> None:
    print(f"hw_gemm_timeline: {msg}", file=sys.stderr)
    raise SystemExit(2)


def by_time(alone: list[list[float]], beside: list[list[float]], since_ms: list[list[float]],
            edges=EDGES_MS) -> list[tuple[float, float, float, int]]:
    """(from ms, to ms, median stretch, calls) of the calls whose midpoint lies that long
    after the copy's start (``since_ms``, per repetition and call), each call's time beside
    over the median of its times alone; bins without a call are left out."""
    med = [statistics.median(a[i] for a in alone) for i in range(len(alone[0]))]
    out = []
    for lo, hi in zip(edges, edges[1:]):
        xs = [b[i] / med[i] - 1.0 for b, s in zip(beside, since_ms) for i in range(len(b)) if lo <= s[i] < hi]
        if xs:
            out.append((lo, hi, statistics.median(xs), len(xs)))
    return out


def summary(bins: list[tuple[float, float, float, int]], copy_ms: float) -> tuple[float | None, float | None]:
    """(the first 0.5 ms of the copy's median stretch, the median of the later bins' that
    end within the copy), None where no call fell there."""
    first = [b[2] for b in bins if b[0] == 0.0 and b[1] == 0.5]
    later = [b[2] for b in bins if b[0] >= 0.5 and b[1] <= copy_ms]
    return (first[0] if first else None), (statistics.median(later) if later else None)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--kn", default="4096,4096", help="the GEMM's K and N")
    ap.add_argument("--dir", choices=("h2d", "d2h"), default="d2h")
    ap.add_argument("--ctas", type=int, default=8)
    ap.add_argument("--page", default="64KiB")
    ap.add_argument("--mib", type=int, default=256, help="the copy's MiB")
    ap.add_argument("--order", choices=("during", "before"), default="during")
    ap.add_argument("--lead-ms", type=float, default=2.0)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--chain-ms", type=float, default=13.0)
    ap.add_argument("--gap", type=float, default=0.1, help="idle seconds before each chain")
    ap.add_argument("--cap-s", type=float, default=2.5, help="seconds of each loop at the cap (0: none)")
    ap.add_argument("--profile", default="h200-pcie-calibrated")
    ap.add_argument("--json", help="write the bins and the cap loops here")
    a = ap.parse_args(argv)
    try:
        k, n = (int(x) for x in a.kn.split(","))
        page = parse_size(a.page)
    except ValueError as e:
        _fail(f"--kn takes K,N and --page a size: {e}")
    if min(a.rows, k, n, a.ctas, a.mib, a.reps) < 1 or not 4096 <= page <= BUFFER // 64:
        _fail("--rows, --kn, --ctas, --mib and --reps take positive integers, --page 4KiB-16MiB")
    try:
        profile = load_profile(a.profile)
    except ProfileError as e:
        _fail(str(e))
    cp, _ = hw_gemm_ctas.gpu_and_layer(KIND_MODEL, _fail)
    r = run(cp, a, k, n, page, profile.sm.threads_per_cta)
    cell = {"m": a.rows, "k": k, "n": n, "ctas": a.ctas, "dir": a.dir, "page": page,
            f"{a.dir}_Bps": a.mib * (1 << 20) / (r["copy_ms"] / 1e3)}
    sim = hw_gemm_ctas.predict(profile, cell)
    print(f"GEMM M {a.rows} K {k} N {n}: {r['call_us']:.1f} us a call, {r['calls']} calls; copy "
          f"{a.mib} MiB {a.dir} of {a.page}, {a.ctas} CTAs, {r['copy_ms']:.2f} ms ({a.order}); "
          f"whole chain {_pct(r['stretch'])}")
    print("| from ms | to ms | hw stretch a call | calls |")
    print("| --- | --- | --- | --- |")
    for lo, hi, s, c in r["bins"]:
        print(f"| {lo:g} | {hi:g} | {_pct(s)} | {c} |")
    first, then = summary(r["bins"], r["copy_ms"])
    cap = None
    if r.get("cap"):
        c = r["cap"]
        loss = 1.0 - c["beside"]["calls_per_s"] / statistics.mean(x["calls_per_s"] for x in c["alone"])
        cap = loss / c["beside"]["copy_share"] if c["beside"]["copy_share"] > 0 else None
        for name, x in (("alone", c["alone"][0]), ("beside copies", c["beside"]), ("alone", c["alone"][1])):
            share = f", copies {x['copy_share']:.0%} of it" if "copy_share" in x else ""
            print(f"cap loop {name}: {x['calls_per_s']:.0f} calls/s{share}, SM clock "
                  f"{x.get('clock_mhz', 'n/a')} MHz, power {x.get('power_w', 'n/a')} W")
        print(f"cap loop: {_pct(-loss)} calls/s beside the copies")
    if a.json:
        tmp = a.json + ".part"
        with open(tmp, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(a),
                       **r, "sim": sim}, f, indent=1)
        os.replace(tmp, a.json)
    print(f"hw_gemm_timeline: first {_pct(first)} then {_pct(then)} sim {_pct(sim)} cap {_pct(cap)}")


def run(cp, a, k: int, n: int, page: int, threads: int) -> dict:
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

    from kvsim_backends.hw.gpu import Kernels  # noqa: PLC0415

    kernels = Kernels(cp)
    copy_stream = cp.cuda.Stream(non_blocking=True, priority=-5)  # as the backend's copy streams
    lo = cp.cuda.Stream(non_blocking=True, priority=0)            # and its compute stream
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    host = cp.cuda.alloc_pinned_memory(BUFFER)
    dev = cp.zeros(BUFFER // 4, dtype=cp.uint32)
    src, dst = (host.ptr, dev.data.ptr) if a.dir == "h2d" else (dev.data.ptr, host.ptr)
    pages = a.mib * (1 << 20) // page
    slots = cp.arange(pages, dtype=cp.int64) % (BUFFER // page)
    call = hw_gemm_ctas.gemm_call(cp, handle, cp.random.RandomState(1), a.rows, k, n)
    ms = lambda e0, e1: cp.cuda.get_elapsed_time(e0, e1)  # noqa: E731

    def chain(calls):
        evs = [cp.cuda.Event()]
        with lo:
            evs[0].record(lo)
            for _ in range(calls):
                call()
                e = cp.cuda.Event()
                e.record(lo)
                evs.append(e)
        return evs

    def copy():
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(copy_stream)
        kernels.copy_pages(copy_stream, src, dst, slots, slots, page, a.ctas, threads)
        e1.record(copy_stream)
        return e0, e1

    for _ in range(2):  # cuBLAS picks its kernel on a first call
        chain(20)[-1].synchronize()
    cp.cuda.Device().synchronize()
    ev = chain(20)
    ev[-1].synchronize()
    one_ms = ms(ev[0], ev[-1]) / 20
    calls = max(5, int(a.chain_ms / one_ms))
    alone, beside, since, copies = [], [], [], []
    for _ in range(a.reps):
        time.sleep(a.gap)
        ev = chain(calls)
        ev[-1].synchronize()
        alone.append([ms(ev[i], ev[i + 1]) for i in range(calls)])
        time.sleep(a.gap)
        if a.order == "during":
            ev = chain(calls)
            time.sleep(a.lead_ms / 1e3)
            c = copy()
        else:
            c = copy()
            time.sleep(a.lead_ms / 1e3)
            ev = chain(calls)
        ev[-1].synchronize()
        c[1].synchronize()
        beside.append([ms(ev[i], ev[i + 1]) for i in range(calls)])
        since.append([ms(c[0], ev[i + 1]) - 0.5 * ms(ev[i], ev[i + 1]) for i in range(calls)])
        copies.append(ms(*c))
    whole = statistics.median(sum(b) for b in beside) / statistics.median(sum(x) for x in alone)
    out = {"calls": calls, "call_us": one_ms * 1e3, "copy_ms": statistics.median(copies),
           "stretch": whole - 1.0, "bins": by_time(alone, beside, since)}
    if a.cap_s > 0:
        out["cap"] = {"alone": [], "beside": None}
        per_chain = int(200 * one_ms / out["copy_ms"]) + 2  # (copies that outlast a chain, at the cap too)
        for looped in (False, True, False):
            got = _cap_loop(cp, chain, copy, a.cap_s, per_chain if looped else 0)
            if looped:
                out["cap"]["beside"] = got
            else:
                out["cap"]["alone"].append(got)
    return out


def _cap_loop(cp, chain, copy, seconds: float, copies: int) -> dict:
    """``seconds`` of the GEMM back to back, ``copies`` queued beside each chain of 200
    calls (one after another on the copy stream): calls a second by GPU time, with copies
    the share of that time one ran, and ``nvidia-smi``'s SM clock and power over the
    second half (medians; absent without ``nvidia-smi``)."""
    smi = shutil.which("nvidia-smi")
    proc = None
    if smi:
        proc = subprocess.Popen([smi, "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                 "-lms", "50"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    t0, n = time.perf_counter(), 0
    first = None
    ran = []
    while time.perf_counter() - t0 < seconds:
        ev = chain(200)
        first = first or ev[0]
        n += 200
        ran += [copy() for _ in range(copies)]
        ev[-1].synchronize()
    cp.cuda.Device().synchronize()
    end = ev[-1]
    gpu_s = cp.cuda.get_elapsed_time(first, end) / 1e3
    got = {"calls_per_s": n / gpu_s}
    if copies:  # (the part of each copy inside the loop's span)
        inside = sum(max(0.0, min(cp.cuda.get_elapsed_time(first, e1), gpu_s * 1e3)
                          - max(cp.cuda.get_elapsed_time(first, e0), 0.0)) for e0, e1 in ran)
        got["copy_share"] = inside / 1e3 / gpu_s
    if proc is not None:
        proc.terminate()
        text = proc.communicate()[0]
        rows = []
        for line in text.strip().splitlines():
            try:
                rows.append(tuple(float(x) for x in line.split(",")))
            except ValueError:
                continue
        late = rows[len(rows) // 2:]
        if late:
            got["clock_mhz"] = statistics.median(r[0] for r in late)
            got["power_w"] = statistics.median(r[1] for r in late)
    time.sleep(0.5)
    return got


if __name__ == "__main__":
    main()
