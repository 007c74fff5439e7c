"""The CUDA driver's lock as a process on the machine feels it while a host tier fills:
a probe thread times a cheap driver call every ``gap_s`` throughout one fill of the hw
backend's own host tier (``HostFill``), and ``fill_probed`` reports the fill (first unit
usable, time to full, rate), the probe (calls, median idle and during, worst stall, the
share of the fill spent blocked in calls slower than ``stall_s``) and the seconds spent
inside ``cudaHostRegister``. In CPU mode, where there is no driver, the probe times a
tiny numpy copy, so it sees only the interpreter.

``call_cost`` times the call an executor makes for every batch (recording an event on a
stream): the median host time, which the sim charges an executor call while a fill holds
the lock (``driver.call``).

Used by ``kvsim calibrate`` (``microbench.measure_host_fill``) and by
``benchmarks/host_fill.py`` / ``host_fill_ranks.py``.
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from kvsim.core.datapath.fill import Backing

from .hostfill import HostFill

SLOT = 5 << 20  # 5 MiB pages: the default config's (Llama 3 70B, tp 2, 32 tokens a page)


class Probe(threading.Thread):
    """Times ``call`` every ``gap_s`` until stopped; ``samples``: (start, seconds)."""

    def __init__(self, call, gap_s: float):
        super().__init__(name="probe", daemon=True)
        self.call, self.gap_s = call, gap_s
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        clock, call, out = time.perf_counter, self.call, self.samples
        while not self.stop.is_set():
            t0 = clock()
            call()
            out.append((t0, clock() - t0))
            if self.gap_s:
                time.sleep(self.gap_s)


def probe_call(cp):
    """The probe's call: ``cudaMemGetInfo`` on a GPU, a 16-byte numpy copy without one."""
    if cp is not None:
        rt = cp.cuda.runtime
        return lambda: rt.memGetInfo()
    a, b = np.zeros(16, np.uint8), np.empty(16, np.uint8)
    return lambda: np.copyto(b, a)


def fill_probed(nbytes: int, backing: Backing, cp, unit: int, huge: bool = False, numa="auto",
                gap_s: float = 1e-3, stall_s: float = 1e-3, slot: int = SLOT) -> dict:
    """One fill of ``nbytes`` (whole slots of ``slot`` bytes) with ``backing``, a probe
    running throughout (0.2 s of it before the fill: the idle baseline)."""
    slots = max(1, nbytes // slot)
    probe = Probe(probe_call(cp), gap_s)
    probe.start()
    time.sleep(0.2)
    idle = [d for _, d in probe.samples]
    t0 = time.perf_counter()
    fill = HostFill(slot, slots, unit, backing, cp.cuda.runtime if cp is not None else None,
                    huge_pages=huge, numa=numa)
    try:
        fill.start()
        ok_first = fill.wait(fill.layout.watermark(1))
        t_first = time.perf_counter()
        ok = fill.wait(slots)
        t_full = time.perf_counter()
        probe.stop.set()
        probe.join()
        during = [d for s, d in probe.samples if t0 <= s <= t_full]
        blocked = sum(d for d in during if d > stall_s)
        full = t_full - t0
        return {"backing": backing.value, "bytes": slots * slot, "ok": bool(ok and ok_first),
                "error": fill.error, "first_serve_s": t_first - t0, "full_s": full,
                "rate_Bps": slots * slot / full if full > 0 else None,
                "register_s": fill.register_s,
                "probe_calls": len(during), "probe_idle_p50_s": statistics.median(idle) if idle else None,
                "probe_p50_s": statistics.median(during) if during else None,
                "probe_worst_s": max(during) if during else None,
                "probe_blocked_share": blocked / full if full > 0 else None, "info": fill.info}
    finally:
        probe.stop.set()
        fill.close()


def call_cost(cp, calls: int = 2000) -> float:
    """The median host seconds of recording an event on a non-blocking stream, the call an
    executor makes for each batch it issues (the first 10% dropped as warm-up)."""
    stream = cp.cuda.Stream(non_blocking=True)
    ev = cp.cuda.Event(disable_timing=True)
    clock = time.perf_counter
    out = []
    for _ in range(calls):
        t0 = clock()
        ev.record(stream)
        out.append(clock() - t0)
    stream.synchronize()
    return statistics.median(out[calls // 10:])
