"""Seed 001 at its own scale: R ranks fill their host tiers at once, one process a rank
(the driver's locks are shared between processes, as in the seed), each with a probe
thread timing a cheap driver call (``cudaMemGetInfo``) every ``--probe-gap``; and the sim's
prediction of the same node from the hardware profile (its ``driver`` section).

Used by ``benchmarks/host_fill.py --ranks R[,R...]``. Each rank's tier is ``min(64 GiB, 90%
of the host memory available / R)`` unless ``--rank-size`` caps it. Per (R, backing):

- ``rate``: the node's bytes over the time until the last rank's tier is full;
- ``first``: the latest time a rank's first unit was usable (serving could start);
- ``blocked``: the probes' time spent in calls slower than ``--stall``, over the fill,
  averaged over the ranks; ``worst``: the slowest probe call of any rank.

The sim side builds the node's ranks on one sim runtime (``kvsim.run.seam.settings_for``,
the sim backend's own host fill and driver lock) with a probe process a rank making the
same call every ``--probe-gap``: what ``kvsim run`` would model for that node.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import statistics
import time

from kvsim.core.datapath.fill import Backing
from kvsim.core.spec import Level

GIB = 1 << 30


def rank_size(ranks: int, avail: int | None, cap: int | None, slot: int) -> int:
    """A rank's tier: min(64 GiB, 90% of ``avail`` / ranks, ``cap``), whole slots."""
    size = 64 * GIB if avail is None else min(64 * GIB, int(0.9 * avail / ranks))
    if cap:
        size = min(size, cap)
    return max(slot, size // slot * slot)


def blocked(calls: list[tuple[float, float]], until: float, stall_s: float) -> float:
    """Seconds of [0, ``until``] spent in calls (start, seconds) slower than ``stall_s``
    (a call still blocked at ``until`` counts up to it)."""
    return sum(min(t + d, until) - t for t, d in calls if d > stall_s and t <= until)


# -- hw: one process a rank ----------------------------------------------------------

#: ``--backings paced``: register in calls of this many bytes at most, the ranks taking
#: turns call by call (``fill.register_chunk``)
PACED_CHUNK = 16 << 20


def fill_kind(name: str) -> tuple[Backing, int | None]:
    """(backing, register chunk) of a ``--backings`` name: a backing, or ``paced``."""
    return (Backing.REGISTER, PACED_CHUNK) if name == "paced" else (Backing(name), None)


def _rank_proc(nbytes, backing, unit, slot, gap_s, stall_s, barrier, out, turns=None) -> None:
    """One rank: its tier filled by the hw backend's ``HostFill``, a probe thread timing
    ``cudaMemGetInfo`` throughout; its row put on ``out``."""
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root), str(root / "backends"), str(root / "benchmarks")]
    from kvsim_backends.hw.driverprobe import Probe, probe_call  # noqa: PLC0415
    from kvsim_backends.hw.gpu import load_cupy  # noqa: PLC0415
    from kvsim_backends.hw.hostfill import HostFill  # noqa: PLC0415

    cp = load_cupy()
    rt = cp.cuda.runtime if cp is not None else None
    if rt is not None:
        rt.memGetInfo()  # (the context, before the clock starts)
    probe = Probe(probe_call(cp), gap_s)
    probe.start()
    barrier.wait()
    t0 = time.perf_counter()
    kind, chunk = fill_kind(backing)
    fill = HostFill(slot, nbytes // slot, unit, kind, rt, register_chunk=chunk,
                    turns=turns if chunk else None)
    try:
        fill.start()
        fill.wait(fill.layout.watermark(1))
        t_first = time.perf_counter()
        ok = fill.wait(fill.slots)
        t_full = time.perf_counter()
        probe.stop.set()
        probe.join()
        during = [(s - t0, d) for s, d in probe.samples if t0 <= s <= t_full]
        out.put({"ok": bool(ok), "error": fill.error, "t0": t0, "first_s": t_first - t0,
                 "full_s": t_full - t0, "bytes": fill.slots * slot,
                 "blocked_s": blocked(during, t_full - t0, stall_s),
                 "worst_s": max((d for _, d in during), default=0.0), "calls": len(during)})
    finally:
        probe.stop.set()
        fill.close()


def hw_node(ranks: int, nbytes: int, backing: str, unit: int, slot: int, gap_s: float,
            stall_s: float) -> dict:
    """Fill ``ranks`` tiers of ``nbytes`` at once, one process each (``backing``: a backing
    or ``paced``); the node's row."""
    ctx = mp.get_context("spawn")  # (CUDA in each child, none in the parent's fork)
    barrier, out, turns = ctx.Barrier(ranks), ctx.Queue(), ctx.Lock()
    procs = [ctx.Process(target=_rank_proc, args=(nbytes, backing, unit, slot, gap_s,
                                                  stall_s, barrier, out, turns)) for _ in range(ranks)]
    for p in procs:
        p.start()
    rows = [out.get() for _ in procs]
    for p in procs:
        p.join()
    t0 = min(r["t0"] for r in rows)
    end = max(r["t0"] - t0 + r["full_s"] for r in rows)
    return {"ranks": ranks, "backing": backing, "rank_bytes": nbytes,
            "ok": all(r["ok"] for r in rows), "error": next((r["error"] for r in rows if r["error"]), None),
            "rate_Bps": sum(r["bytes"] for r in rows) / end, "first_s": max(r["first_s"] for r in rows),
            "full_s": end, "blocked_share": statistics.mean(r["blocked_s"] / r["full_s"] for r in rows),
            "worst_s": max(r["worst_s"] for r in rows), "calls": sum(r["calls"] for r in rows)}


# -- the sim's prediction --------------------------------------------------------------

def sim_node(profile, ranks: int, nbytes: int, backing: str, unit: int, slot: int,
             gap_s: float, stall_s: float) -> dict:
    """The same node in the sim: ``ranks`` sim backends on one runtime, each filling its
    host tier progressively from time 0 (the node's driver lock shared), and a probe
    process a rank making an executor call every ``gap_s``."""
    from kvsim.run.seam import settings_for  # noqa: PLC0415
    from kvsim_backends.sim import SimBackend, SimRuntime  # noqa: PLC0415

    kind, chunk = fill_kind(backing)
    base = settings_for(slot, {Level.GPU: 1, Level.HOST: nbytes // slot}, profile,
                        host_fill={"mode": "progressive", "backing": kind.value, "unit": unit,
                                   "register_chunk": chunk})
    rt = SimRuntime()
    bes = [SimBackend(rt, dataclasses.replace(base, rank=r, ranks=ranks)) for r in range(ranks)]
    calls: list[list[tuple[float, float]]] = [[] for _ in range(ranks)]  # (start, seconds)

    def probe(r: int, be):
        while be.driver is not None and be.driver.fills:
            t = rt.now
            wait = be.driver_call()
            calls[r].append((t, wait if wait else be.driver.call_s))
            yield rt.timeout(wait + gap_s)

    for r, be in enumerate(bes):
        rt.process(probe(r, be))
    rt.run()
    fulls = [be.host_fill.done_at(be.host_fill.layout.units) for be in bes]
    firsts = [be.host_fill.done_at(1) for be in bes]
    end = max(fulls)
    return {"ranks": ranks, "backing": backing, "rank_bytes": nbytes,
            "rate_Bps": ranks * (nbytes // slot * slot) / end, "first_s": max(firsts), "full_s": end,
            "blocked_share": statistics.mean(blocked(c, f, stall_s) / f for c, f in zip(calls, fulls)),
            "worst_s": max((d for c, f in zip(calls, fulls) for t, d in c if t <= f), default=0.0)}


def order_agrees(hw: list[dict], sim: list[dict], key: str) -> bool:
    """Whether the backings come in the same order by ``key`` on both sides (ties in the
    sim count as agreeing)."""
    h = {r["backing"]: r[key] for r in hw}
    s = {r["backing"]: r[key] for r in sim}
    names = sorted(h)
    return all((h[a] < h[b]) == (s[a] < s[b]) or s[a] == s[b]
               for i, a in enumerate(names) for b in names[i + 1:])
