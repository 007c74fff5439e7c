"""The GPU's power state: GEMM-bound work after light work or idle runs faster than the
calibrated rate, and slower once GEMMs have run on for a while.

Pure (standard library only). A GPU under its power limit clocks up while it draws
little (decode's HBM reads, idle) and down as GEMMs draw at the limit: a GEMM-bound step
after light steps runs short of its calibrated time, one after a long run of GEMMs a
little long. One first-order state, ``h`` in [0, 1] (the headroom: 1 after a long light
spell, 0 after a long run of GEMMs), and the profile's ``compute.boost`` terms
(``kvsim.config.boostspec``: ``gain``, ``spend``, ``recover``, ``calibrated``):

- GEMM work runs at ``(1 + gain x h) / (1 + gain x calibrated)`` times the calibrated
  rate (the calibrated rate was timed at headroom ``calibrated``, after a warm-up);
- GEMM work spends the headroom: ``h`` falls as ``exp(-w / spend)`` over ``w`` seconds
  of GEMM work (at the calibrated rate: the energy goes with the work done);
- everything else (a step's reads, a memory-bound step, idle) gives it back:
  ``1 - h`` falls as ``exp(-t / recover)`` over ``t`` seconds of wall time.

So ``g`` calibrated seconds of GEMM work from headroom ``h0`` take (``c = gain x h0``)

    (1 + gain x calibrated) x (g + spend x ln((1 + c exp(-g / spend)) / (1 + c)))

(the integral of the inverse speed over the work), and leave headroom
``h0 exp(-g / spend)``. From full headroom a short GEMM runs ``(1 + gain x calibrated) /
(1 + gain)`` of its time; GEMMs without end converge to ``1 + gain x calibrated`` of it
(the hot rate); ``gain`` 0: the calibrated rate always.

Which work is GEMM work: the GEMM share of a compute-bound step (``StepWork.flop_s >=
memory_s``, the roofline's FLOP side); a memory-bound step (decode) neither spends nor
gains (its small GEMMs are not power-bound) and counts as light time.

Invariants: ``h`` stays in [0, 1]; the state moves only forward in time (a step that
starts before the last GEMM part's predicted end recovers nothing); the same steps at the
same times give the same floats.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .work import StepWork, gemm_share


class Boost(NamedTuple):
    """``gain``: the GEMM speed at full headroom over the hot rate, minus 1; ``spend``: the
    GEMM seconds that spend the headroom by 1/e; ``recover``: the light seconds that give
    back the missing headroom by 1/e; ``calibrated``: the headroom the calibrated rate was
    timed at."""

    gain: float
    spend: float
    recover: float
    calibrated: float


def recovered(h: float, light_s: float, b: Boost) -> float:
    """The headroom after ``light_s`` seconds of light work or idle from ``h``."""
    if light_s <= 0.0:
        return h
    return 1.0 - (1.0 - h) * math.exp(-light_s / b.recover)


def gemm_time(h: float, gemm_s: float, b: Boost) -> tuple[float, float]:
    """(wall seconds, headroom after) of ``gemm_s`` calibrated seconds of GEMM work started
    at headroom ``h``."""
    if gemm_s <= 0.0:
        return 0.0, h
    decay = math.exp(-gemm_s / b.spend)
    c = b.gain * h
    t = (1.0 + b.gain * b.calibrated) * (gemm_s + b.spend * math.log((1.0 + c * decay) / (1.0 + c)))
    return t, h * decay


def power_gemm_s(work: StepWork, work_s: float) -> float:
    """The seconds of ``work_s`` (a step of ``work``) that are power-bound GEMMs: its GEMM
    share for a compute-bound step, 0 for a memory-bound one."""
    if work.flop_s <= 0.0 or work.flop_s < work.memory_s:
        return 0.0
    return work_s * gemm_share(work)


class PowerState:
    """One GPU's headroom over time. ``step`` gives a step's work in calibrated seconds
    as it runs from the current state and what the state becomes; ``commit`` keeps it."""

    __slots__ = ("boost", "h", "free_at")

    def __init__(self, boost: Boost):
        self.boost = boost
        self.h = 1.0           # the headroom when the last GEMM part ended
        self.free_at = -math.inf  # when the last GEMM part was predicted to end

    def step(self, now: float, work_s: float, work: StepWork) -> tuple[float, float, float]:
        """(the step's work, the headroom after its GEMM part, when that part ends) for
        ``work_s`` calibrated seconds of ``work`` started at ``now``: its GEMM part at the
        state's rate, the rest as it was. Changes nothing (``commit`` does)."""
        g = power_gemm_s(work, work_s)
        if g <= 0.0:
            return work_s, self.h, self.free_at
        b = self.boost
        h0 = recovered(self.h, now - self.free_at, b) if self.free_at > -math.inf else 1.0
        t, h1 = gemm_time(h0, g, b)
        return work_s - g + t, h1, now + t

    def commit(self, h: float, free_at: float) -> None:
        self.h = h
        self.free_at = free_at
