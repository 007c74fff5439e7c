"""How two ranks' steps share one GPU on the hw backend, measured: what
``benchmarks/hw_rank_share.py`` prints and ``kvsim calibrate`` fits
(``kvsim.tools.fitoverlap``) into the profile's ``gpu.kernel_overlap``.

Two ranks on one GPU each launch their steps on their own compute stream from the one
thread (as the hw backend's ranks, ``node.ranks_per_gpu``), a step's kernels all at once
when the rank's previous step has ended. A cell runs two such ranks for a window, each
launching steps of its kind back to back (one step in flight a rank), and takes each
rank's steps that ran while the other's ran too (its first and last dropped): their
median GPU time (CUDA events on its stream) over the same step's alone, its stretch.

- ``kernels_of``: the kernels the compute stand-in launches for a step;
- ``alone_s``: a step's median GPU time alone, warm;
- ``together``: each rank's step GPU times while both ran;
- ``run_cells``: every pair of the given step kinds (each kind beside itself once, two
  different kinds both ways) at the backend's read-kernel length: one row a rank-step;
- ``measure_for_calibrate``: the run ``kvsim calibrate`` makes on a GPU (the read kernel
  its settings give, ``engine.read_kernel``'s default), or why it made none.

Invariant: the backend a run builds is closed on every exit.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

from kvsim.core.datapath.work import StepWork
from kvsim.core.spec import Level

from .backend import HwBackend
from .gpu import load_cupy
from .runtime import RealtimeRuntime
from .standin import READ_CTA_BYTES, plan

#: calibrate's window a cell and timed steps alone a kind: the benchmark's defaults. A
#: 4096-token prefill beside itself takes ~160 ms a step on an H200: a window under ~330
#: ms can leave it no step between its first and last (a cell's window grows to four
#: times its pair's steps alone, ``run_cells``). A run is ~0.5 s a pair (6 pairs), the
#: steps alone ~0.7 s, and the backend's build (its stand-in's rates) a few seconds.
WINDOW_S = 0.4
REPS = 5

#: (rank's kind, other's kind, the row or None where no step ran beside the other)
OnCell = Callable[[str, str, "dict | None"], None]


def kernels_of(si, seconds: float, work) -> int:
    """The kernels the stand-in launches for ``seconds`` of ``work``."""
    _, gemms, read_s = plan(seconds, work, si.model, si.chain_s)
    per = max(1, int(si.chunk_s * si.read_Bps / READ_CTA_BYTES))  # (as StandIn._reads)
    ctas = int(read_s * si.read_Bps / READ_CTA_BYTES) if read_s > 0 else 0
    return len(si.model.projections) * sum(k for _, k in gemms) + -(-ctas // per)


def alone_s(cp, si, stream, work, reps: int) -> float:
    """Median GPU seconds of one step of ``work`` (its nominal time) alone, warm."""
    out = []
    for i in range(reps + 2):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        si.launch(stream, work.seconds, work)
        b.record(stream)
        b.synchronize()
        if i >= 2:
            out.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return statistics.median(out)


def together(cp, si, streams, pair, window_s: float) -> list[list[float]]:
    """Each rank's step GPU seconds while both ran: ``pair`` (work, work) launched step by
    step on ``streams`` from this thread for ``window_s``."""
    took: list[list[float]] = [[], []]
    cur: list = [None, None]
    t_end = time.perf_counter() + window_s

    def launch(i):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(streams[i])
        si.launch(streams[i], pair[i].seconds, pair[i])
        b.record(streams[i])
        cur[i] = (a, b)

    launch(0)
    launch(1)
    live = [True, True]
    while any(live):
        for i in (0, 1):
            if not live[i] or not cur[i][1].done:
                continue
            took[i].append(cp.cuda.get_elapsed_time(*cur[i]) / 1e3)
            if time.perf_counter() < t_end:
                launch(i)
            else:
                live[i] = False
    # the first step of each started before the other's, the last may have run alone
    return [t[1:-1] for t in took]


def run_cells(cp, si, works: Mapping[str, StepWork], window_s: float, reps: int,
              chunk_ms: float, on_cell: OnCell | None = None) -> list[dict]:
    """Every pair of ``works``' kinds on the stand-in ``si`` (its read kernels ``chunk_ms``
    long), each for ``window_s`` or four times the pair's steps alone, whichever is
    longer (so the slower rank has steps between its first and last): a row per
    rank-step that ran beside the other (``chunk_ms``, ``rank``, ``other``,
    ``steps``, ``alone_ms``, ``with_ms``, ``stretch``, the kernel-length and processor-
    sharing rules' stretches, both kinds' ``kernel_us``); ``on_cell`` told of each."""
    streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    alone = {k: alone_s(cp, si, streams[0], wk, reps) for k, wk in works.items()}
    klen = {k: alone[k] / max(1, kernels_of(si, wk.seconds, wk)) for k, wk in works.items()}
    kinds = list(works)
    rows = []
    for i, ka in enumerate(kinds):
        for kb in kinds[i:]:
            # long enough for >= 4 steps of the slower rank at worst (the pair run in turn)
            window = max(window_s, 4 * (alone[ka] + alone[kb]))
            got = together(cp, si, streams, (works[ka], works[kb]), window)
            for me, other, t in ((ka, kb, got[0]), (kb, ka, got[1])):
                if not t:
                    if on_cell:
                        on_cell(me, other, None)
                    continue
                x = statistics.median(t) / alone[me]
                row = {"chunk_ms": chunk_ms, "rank": me, "other": other, "steps": len(t),
                       "alone_ms": alone[me] * 1e3, "with_ms": statistics.median(t) * 1e3,
                       "stretch": x, "kernel_rule": (klen[me] + klen[other]) / klen[me], "ps_rule": 2.0,
                       "kernel_us": klen[me] * 1e6, "other_kernel_us": klen[other] * 1e6}
                rows.append(row)
                if on_cell:
                    on_cell(me, other, row)
                if ka == kb:
                    break
    return rows


def measure_for_calibrate(settings_for: Callable, device: str, works: Mapping[str, StepWork],
                          window_s: float = WINDOW_S, reps: int = REPS) -> dict:
    """``kvsim calibrate``'s rank-share cells on this GPU, at the read-kernel length its
    settings give: ``rows`` (``run_cells``'), the window, reps and seconds; or ``skipped``
    with the reason (no CuPy or GPU, no compute stand-in, a CUDA error while measuring:
    calibrate then keeps the base's value and says why)."""
    cp = load_cupy()
    if cp is None:
        return {"skipped": "needs a GPU"}
    t0 = time.perf_counter()
    st = settings_for(64 << 10, {Level.GPU: 4}, device=device)
    be = HwBackend(RealtimeRuntime(), st)
    try:
        if be.standin is None:
            return {"skipped": "needs the compute stand-in (hw.compute_standin)"}
        chunk_ms = st.read_kernel_s * 1e3
        try:
            rows = run_cells(cp, be.standin, works, window_s, reps, chunk_ms)
        except RuntimeError as e:  # (a CUDA error: the rest of the calibration still counts)
            return {"skipped": f"the measurement failed ({type(e).__name__}: {e})"}
    finally:
        be.close()
    return {"rows": rows, "read_kernel_ms": chunk_ms, "window_ms": window_s * 1e3, "reps": reps,
            "kinds": list(works), "seconds": time.perf_counter() - t0}
