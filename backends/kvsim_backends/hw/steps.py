"""The hw backend's compute: each engine step on the compute stream, and the span of
steps the engine ran ahead of the clock.

A step with its ``StepWork`` runs as the compute stand-in (``standin.StandIn``: GEMMs and
HBM reads); a compute without one, or with the stand-in off, as the busy kernel (a load of
the SMs alone, ``gpu.Kernels.launch_busy``); in CPU mode a wait of the time asked for.
Each compute's waitable succeeds with its GPU time (two events on the compute stream),
in sim seconds.

Run-ahead: with nothing in flight, ``compute_ahead`` answers at once and keeps the step;
``catch_up`` computes the span as the kept steps' work merged
(``kvsim.core.datapath.work.merge``). ``running`` says whether a compute is still on the
GPU as the runtime sees it, and its work: the copy-path rule reads it.
"""

from __future__ import annotations

from time import perf_counter as _clock
from typing import Any

from kvsim.core.datapath.work import StepWork, gemm_share, merge


class Steps:
    """Compute on ``streams['compute']`` with ``kernels`` and ``standin`` (None: the busy
    kernel for every step); ``cp`` None: CPU mode."""

    def __init__(self, runtime, logs, cp, streams: dict, kernels, standin, chunk_s: float):
        self.runtime = runtime
        self.logs = logs
        self.cp = cp
        self.streams = streams
        self.kernels = kernels
        self.standin = standin
        self.chunk_s = chunk_s
        self.ahead: list[tuple[float, StepWork]] = []  # steps run ahead, not yet computed
        self._last: tuple[Any, StepWork | None] = (None, None)  # the last compute, its work

    def running(self) -> tuple[bool, StepWork | None]:
        """(whether the last compute is still running as the runtime sees it, its work)."""
        ev, work = self._last
        on = ev is not None and not ev.triggered
        return on, (work if on else None)

    def compute(self, duration_s: float, work: StepWork | None = None) -> Any:
        if duration_s < 0:
            raise ValueError(f"duration_s: got {duration_s!r}; expected >= 0")
        rt, logs = self.runtime, self.logs
        h0 = _clock()
        t0 = rt.now
        lag = rt.wall_now() - t0 if logs.compute_log is not None else 0.0
        gap = None  # (compute_log) the compute stream's idle GPU time before this compute
        if self.cp is None or duration_s == 0:
            ev = rt.timeout(duration_s, duration_s)
        else:
            cp, s = self.cp, self.streams["compute"]
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(s)
            if work is not None and self.standin is not None and work.seconds > 0:
                self.standin.launch(s, rt.sim_to_wall(duration_s), work)
            else:
                self.kernels.launch_busy(s, rt.sim_to_wall(duration_s), self.chunk_s)
            b.record(s)
            ev = rt.watch(lambda: (b.done, rt.wall_to_sim(cp.cuda.get_elapsed_time(a, b) / 1e3))
                          if b.done else (False, None))
            if logs.compute_log is not None:
                prev, logs.last_compute_end = logs.last_compute_end, b
                if prev is not None:  # read once both have passed (when this one is seen)
                    gap = lambda: rt.wall_to_sim(cp.cuda.get_elapsed_time(prev, a) / 1e3)  # noqa: E731
        gemm_s = duration_s * gemm_share(work) if work is not None else 0.0
        ev.callbacks.insert(0, lambda e: logs.count_compute(t0, duration_s, e.value, gap, lag, gemm_s))
        self._last = (ev, work)
        if logs.host_log is not None:
            logs.host_time("compute", h0)
        return ev

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool,
                      work: StepWork | None = None) -> float | None:
        # real time cannot be predicted with transfers in flight; with none, the engine
        # may run ahead and the GPU computes the whole span at catch_up
        if not quiet:
            return None
        if work is not None and work.seconds > 0:
            self.ahead.append((seconds, work))
        return start_s + seconds

    def catch_up(self, until_s: float) -> Any:
        parts, self.ahead = self.ahead, []
        return self.compute(max(0.0, until_s - self.runtime.now), merge(parts) if parts else None)
