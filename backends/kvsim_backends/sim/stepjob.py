"""A compute job of the fluid (``kvsim_backends.sim.fluid``): seconds of work left, the
slowdown it runs at, and, for a step's work under the structural interference model, its
two parts in the stand-in's order (``kvsim_backends.hw.standin``): its GEMMs first, then
its reads, each at its own kind's slowdown.

Invariants: ``remaining`` only falls, as ``advance`` brings it up to a time at the
slowdowns it ran at since ``since``; the last ``mem_s`` seconds of the work are its
reads (0: one part, at ``slow``); ``left`` is the seconds it takes to finish at its
current slowdowns; while ``held`` (a kernel that takes every SM runs ahead of it) it makes
no progress and has no wake-up.
"""

from __future__ import annotations

import simpy

from kvsim.core.datapath.work import StepWork

from .runtime import Wake


class Job:
    __slots__ = ("remaining", "since", "start", "done", "wake", "work", "slow", "mem_s", "slow_m",
                 "held")

    def __init__(self, work_s: float, start: float, done: simpy.Event, work: StepWork | None,
                 slow: float, parts: bool = False):
        self.remaining = work_s  # seconds of work left at time ``since``
        self.since = start
        self.start = start
        self.done = done
        self.wake: Wake | None = None  # the live wake-up at its predicted end
        self.work = work  # the step it computes (None: the SMs alone)
        self.slow = slow  # its slowdown since ``since`` (its GEMM part's, with ``mem_s``)
        # ``parts``: a step's work under the structural model, its last ``mem_s`` seconds
        # its reads, slowed by ``slow_m`` (a step of one kind: one part)
        self.mem_s = 0.0
        if parts and work is not None:
            total = work.flop_s + work.memory_s
            if 0.0 < work.flop_s < total:
                self.mem_s = work_s * (work.memory_s / total)
        self.slow_m = slow
        self.held = False

    def advance(self, now: float, slow: float, slow_m: float) -> None:
        """Bring the work left up to ``now``, at ``slow`` (``slow_m`` its reads) since
        ``since``."""
        e = now - self.since
        if self.held:  # (no progress while held)
            self.since = now
            return
        rem = self.remaining
        gemm_left = rem - self.mem_s
        self.since = now
        if gemm_left > 0.0:
            t = gemm_left * (1.0 + slow)
            if e <= t or not self.mem_s:
                self.remaining = rem - e / (1.0 + slow)
                return
            e -= t
            rem = self.mem_s
        self.remaining = rem - e / (1.0 + slow_m)

    def left(self) -> float:
        """Seconds to finish at the current slowdowns."""
        if not self.mem_s:
            return self.remaining * (1.0 + self.slow)
        gemm_left = self.remaining - self.mem_s
        if gemm_left <= 0.0:
            return self.remaining * (1.0 + self.slow_m)
        return gemm_left * (1.0 + self.slow) + self.mem_s * (1.0 + self.slow_m)
