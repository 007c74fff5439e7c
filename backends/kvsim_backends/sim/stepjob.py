"""A compute job of the fluid (``kvsim_backends.sim.fluid``): seconds of work left, the
slowdown it runs at, and, for a step's work under the structural interference model, its
two parts in the stand-in's order (``kvsim_backends.hw.standin``): its GEMMs first, then
its reads, each at its own kind's slowdown; on a GPU several ranks share, each part's
kernel length (``k_g``, ``k_m``: ``kvsim_backends.sim.smshare``) and whether its wake-up
is at its GEMM part's end (``turn``: the other jobs' shares change there).

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
                 "held", "k_g", "k_m", "turn")

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
        self.k_g = self.k_m = 1.0  # its parts' kernel lengths (a GPU shared: smshare)
        self.turn = False  # its wake-up is at its GEMM part's end, not its own end

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

    def kernel_at(self, now: float) -> float:
        """Its current kernel's length at ``now`` (no later than its wake-up): its GEMM
        part's while some of that is left, else its reads'."""
        if not self.mem_s or self.k_g == self.k_m:  # (one part, or one length)
            return self.k_g
        ran = 0.0 if self.held else now - self.since  # (no progress while held)
        gemm_left = self.remaining - self.mem_s - ran / (1.0 + self.slow)
        return self.k_g if gemm_left > 0.0 else self.k_m

    def to_turn(self) -> float:
        """Seconds to the end of its GEMM part at its current slowdown (0: in its reads)."""
        gemm_left = self.remaining - self.mem_s
        return gemm_left * (1.0 + self.slow) if gemm_left > 0.0 else 0.0

    def left(self) -> float:
        """Seconds to finish at the current slowdowns."""
        if not self.mem_s:
            return self.remaining * (1.0 + self.slow)
        gemm_left = self.remaining - self.mem_s
        if gemm_left <= 0.0:
            return self.remaining * (1.0 + self.slow_m)
        return gemm_left * (1.0 + self.slow) + self.mem_s * (1.0 + self.slow_m)
