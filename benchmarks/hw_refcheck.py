"""How long the hw backend's GPU refcheck (``kv_check``) takes: host-tier pages read through
their mapped device address and GPU pages, batches of 1 / 16 / 128 pages, with a CTA per
page against a CTA per 64 KiB part of a page (the backend's choice), side by side in one
run; the same for the fill kernel that writes new GPU pages (``kv_fill``, on the compute
stream, which GPU -> host copies wait for); and one host page checked while a busy
compute holds every SM, with the check's stream at the compute's priority and above it,
the busy kernel in one wave of CTAs a chunk and in several.

    python benchmarks/hw_refcheck.py [--page-bytes 2097152] [--reps 20]

Times run from the kernel's enqueue to its event (median of ``--reps``). The fill's
speed-up for one page is printed as ``fill_gpu_1page_speedup``. Last line:
``refcheck_host_1page_speedup: <one CTA a page / CTA a part, host, one page>``.
Needs CuPy and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import statistics as st
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.hw import HwBackend, RealtimeRuntime  # noqa: E402
from backends.hw import pattern  # noqa: E402
from backends.hw.backend import CHECK_SPAN_WORDS, FILL_SPAN_WORDS  # noqa: E402
from kvsim.core.plan import Fill  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page-bytes", type=int, default=2 << 20)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    pb, n = a.page_bytes, 128
    be = HwBackend(RealtimeRuntime(), pb, {Level.GPU: n, Level.HOST: n}, device="gpu")
    try:
        tags = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        for lv in (Level.GPU, Level.HOST):
            be.fill(Fill(lv, np.arange(n), tags))
        be.streams["compute"].synchronize()
        words = pb // 8
        print(f"pages of {pb} B; a part = {min(words, CHECK_SPAN_WORDS) * 8} B")
        print("| pages | level | CTA a page: us | GB/s | CTA a part: us | GB/s | speed-up |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        base = {Level.GPU: be.gpu.ptr, Level.HOST: be.host.dev_ptr}
        res = {}

        def timed(lv, k, span):
            slots = np.arange(k)
            got, ev, _ = be._enqueue_check(base[lv], slots, span)  # warm-up, and correct?
            ev.synchronize()
            assert (got() == tags[:k]).all(), (lv, k, span)
            ts = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                _, ev, _ = be._enqueue_check(base[lv], slots, span)
                ev.synchronize()
                ts.append(time.perf_counter() - t0)
            return st.median(ts)

        for k in (1, 16, 128):
            for lv in (Level.HOST, Level.GPU):
                one, part = timed(lv, k, words), timed(lv, k, 0)
                res[(lv, k)] = one / part
                print(f"| {k} | {lv.name.lower()} | {one * 1e6:.1f} | {k * pb / one / 1e9:.1f} | "
                      f"{part * 1e6:.1f} | {k * pb / part / 1e9:.1f} | {one / part:.2f} |")
        # the fill of new GPU pages, a CTA a page against a CTA a part; each variant's
        # first fill (a warm-up) checked byte for byte against numpy's pattern
        print(f"fill of GPU pages (a part = {min(words, FILL_SPAN_WORDS) * 8} B):")
        print("| pages | CTA a page: us | GB/s | CTA a part: us | GB/s | speed-up |")
        print("| --- | --- | --- | --- | --- | --- |")
        fill_res = {}

        def fill_timed(k, span):
            slots = np.arange(k)
            ftags = tags[:k] ^ np.uint64(span)
            be._enqueue_fill(slots, ftags, span)
            be._fill_event.synchronize()
            want = np.zeros((1, pb), np.uint8)
            pattern.write_pages(want, [0], ftags[k - 1:])
            assert (be.cp.asnumpy(be.gpu.view[k - 1]) == want[0]).all(), (k, span)
            ts = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                be._enqueue_fill(slots, ftags, span)
                be._fill_event.synchronize()
                ts.append(time.perf_counter() - t0)
            return st.median(ts)

        for k in (1, 16, 128):
            one, part = fill_timed(k, words), fill_timed(k, 0)
            fill_res[k] = one / part
            print(f"| {k} | {one * 1e6:.1f} | {k * pb / one / 1e9:.1f} | {part * 1e6:.1f} | "
                  f"{k * pb / part / 1e9:.1f} | {one / part:.2f} |")
        be.fill(Fill(Level.GPU, np.arange(n), tags))  # the pages the checks below expect
        # one host page checked while a 20 ms busy compute occupies every SM (0.5 ms
        # chunks): the check's stream at the compute's priority or above it, the busy
        # kernel in one wave of CTAs a chunk or in several
        k, s, misc = be.kernels, be.streams["compute"], be.streams["misc"]
        low = be.cp.cuda.Stream(non_blocking=True, priority=s.priority)
        waves = k.busy_waves
        print(f"one host page checked during a busy compute (0.5 ms chunks, graphs={k.use_graphs}), us:")
        print("| CTA waves a chunk | check stream priority | median | min | max |")
        print("| --- | --- | --- | --- | --- |")
        for w in (1, waves):
            for stream, prio in ((low, "= compute"), (misc, "higher")):
                k.busy_waves, be.streams["misc"] = w, stream
                ts = []
                for _ in range(7):
                    k.launch_busy(s, 0.02, be.compute_chunk_s)
                    time.sleep(0.005)
                    t0 = time.perf_counter()
                    _, ev, _ = be._enqueue_check(base[Level.HOST], np.arange(1), 0)
                    ev.synchronize()
                    ts.append(time.perf_counter() - t0)
                    s.synchronize()
                print(f"| {k.busy_waves} | {prio} | {st.median(ts) * 1e6:.1f} | {min(ts) * 1e6:.1f} | "
                      f"{max(ts) * 1e6:.1f} |")
        be.streams["misc"], k.busy_waves = misc, waves
        print(f"fill_gpu_1page_speedup: {fill_res[1]:.2f}")
        print(f"refcheck_host_1page_speedup: {res[(Level.HOST, 1)]:.2f}")
    finally:
        be.close()


if __name__ == "__main__":
    main()
