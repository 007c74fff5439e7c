"""One-page disk-tier writes through the hw backend's I/O pool, by Python's GIL switch
interval: alone, and beside a thread that runs pure Python as a replay's engine loop does.

Each write (one page, default 2 MiB, to a slot written before) is timed from
``DiskStore.submit_writes`` to its futures' results, ``--n`` writes 3 ms apart (the first
five dropped), median and p10/p90 per row, all rows in one run. The intervals: CPython's
default 5 ms, 0.5 ms, and ``RealtimeRuntime``'s (what a hw replay runs with). Needs no GPU
(CPU mode pins nothing). Last line: ``disk_1page_write_beside_python_speedup: <p50 at 5 ms
/ p50 at the runtime's interval, beside the busy thread>``.

    python3 benchmarks/disk_write_gil.py [--dir /tmp] [--page-bytes 2097152] [--n 80]
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.hw.disk import DiskStore  # noqa: E402
from backends.hw.memory import HostRegion  # noqa: E402
from backends.hw.runtime import RealtimeRuntime  # noqa: E402


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the disk tier's file goes")
    ap.add_argument("--page-bytes", type=int, default=2 << 20)
    ap.add_argument("--n", type=int, default=80)
    a = ap.parse_args(argv)
    if a.n < 10:
        ap.error(f"--n: got {a.n}; expected at least 10")
    runtime_si = inspect.signature(RealtimeRuntime).parameters["switch_interval_s"].default
    slots = 64
    buf = HostRegion(1, a.page_bytes)
    buf.flat[:] = 7
    before = sys.getswitchinterval()
    with tempfile.TemporaryDirectory(prefix="kvsim-gil-", dir=a.dir) as d:
        ds = DiskStore(d, slots, a.page_bytes)
        stop = threading.Event()

        def busy() -> None:  # the engine loop's kind of work: Python, no I/O
            x = 0
            while not stop.is_set():
                for i in range(1000):
                    x += i * i

        def bench(label: str) -> float:
            ts = []
            for i in range(a.n):
                slot = np.array([i % slots])
                t0 = time.perf_counter()
                for f in ds.submit_writes(slot, buf.view):
                    f.result()
                ts.append(time.perf_counter() - t0)
                time.sleep(0.003)
            ms = np.array(ts[5:]) * 1e3
            p50 = float(np.median(ms))
            print(f"| {label} | {np.percentile(ms, 10):.2f} | {p50:.2f} | {np.percentile(ms, 90):.2f} |",
                  flush=True)
            return p50

        try:
            for i in range(slots):  # every slot written once: the rows below time rewrites
                for f in ds.submit_writes(np.array([i]), buf.view):
                    f.result()
            print(f"one-page ({a.page_bytes} B) disk writes, ms; direct I/O: {ds.uses_direct}")
            print("| switch interval, beside | p10 | p50 | p90 |")
            print("| --- | --- | --- | --- |")
            p50 = {}
            for si in (5e-3, 5e-4, runtime_si):
                sys.setswitchinterval(si)
                name = f"{si * 1e3:g} ms" + (" (RealtimeRuntime's)" if si == runtime_si else "")
                bench(f"{name}, alone")
                stop.clear()
                th = threading.Thread(target=busy)
                th.start()
                try:
                    p50[si] = bench(f"{name}, a thread running Python")
                finally:
                    stop.set()
                    th.join()
        finally:
            sys.setswitchinterval(before)
            ds.close()
            buf.close()
    print(f"disk_1page_write_beside_python_speedup: {p50[5e-3] / p50[runtime_si]:.2f}")


if __name__ == "__main__":
    main()
