"""Host time of the hw backend's compute() launch (run on a GPU): the busy kernel's chunks
launched one by one against captured CUDA graphs (``HwBackend(compute_graphs=True)``),
side by side in one run, for step-sized durations; and how long each compute took on the
GPU (it must stay the duration asked, either way).

The launch holds the real-time runtime's loop thread: while it runs no completion is seen
(docs/hw-notes.md: a 9 ms step's 18 chunk launches took ~128 us, one-page evictions under
replay load took 168+ us against ~100 us idle).

    python3 benchmarks/hw_compute_launch.py [--reps 20]

Last line: ``compute_launch_speedup_9ms: <host time one by one / with graphs>``.
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends.hw import HwBackend, RealtimeRuntime  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    be = HwBackend(RealtimeRuntime(), 2 << 20, {Level.GPU: 8}, device="gpu", refcheck=False)
    cp, k, s = be.cp, be.kernels, be.streams["compute"]
    out = {}
    try:
        for d in (0.002, 0.009, 0.02):
            for graphs in (False, True):
                k.use_graphs = graphs
                k.launch_busy(s, d, be.compute_chunk_s)  # warm-up (captures the graphs)
                s.synchronize()
                host, gpu = [], []
                for _ in range(a.reps):
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record(s)
                    t0 = time.perf_counter()
                    k.launch_busy(s, d, be.compute_chunk_s)
                    host.append(time.perf_counter() - t0)
                    e1.record(s)
                    e1.synchronize()
                    gpu.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
                out[d, graphs] = st.median(host)
                print(f"compute {d * 1e3:4.0f} ms, {'graphs' if graphs else 'one by one':>10}: host "
                      f"{st.median(host) * 1e6:6.1f} us (min {min(host) * 1e6:.1f}, max {max(host) * 1e6:.1f}); "
                      f"GPU {st.median(gpu) * 1e3:.3f} ms", flush=True)
    finally:
        be.close()
    print(f"compute_launch_speedup_9ms: {out[0.009, False] / out[0.009, True]:.2f}")


if __name__ == "__main__":
    main()
