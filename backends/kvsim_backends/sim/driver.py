"""The CUDA driver's lock in the sim: one a node (``Runtime.shared``), taken by every
rank's host fill and executor.

The lock is first come, first served: ``hold(now, seconds)`` reserves the next ``seconds``
it is free from ``now`` and says when that hold starts; the lock is then free at
``free_at``. A host fill holds it for the driver's part of each unit (per backing: the
``cudaHostRegister`` of a ``register`` unit, most of a ``cumem`` unit's allocation and
mapping, the whole ``cudaHostAlloc`` of a ``pinned`` tier: ``DriverSpec``); while any
fill is under way on the node (``fills`` > 0) each executor call (a compute launch, a
copy call) takes the lock for ``call`` seconds, and waits first for the holds reserved
before it. With no fill under way an executor call costs nothing here (no event, no
wait), so a node that fills nothing replays as it would without the lock.

Invariants: holds never overlap; ``free_at`` never goes back; a call's wait is the time
from its request to the start of its hold. O(1) a call, no SimPy event of its own.
"""

from __future__ import annotations


class DriverLock:
    """``call_s``: an executor call's hold."""

    __slots__ = ("call_s", "free_at", "fills", "held_s")

    def __init__(self, call_s: float):
        self.call_s = call_s
        self.free_at = 0.0   # when the last hold reserved ends
        self.fills = 0       # host fills under way on the node
        self.held_s = 0.0    # seconds held by fills, in all

    def hold(self, now: float, seconds: float) -> float:
        """Reserve the lock for ``seconds`` from when it is next free (at or after
        ``now``); the start of that hold."""
        start = now if now > self.free_at else self.free_at
        self.free_at = start + seconds
        return start

    def fill_hold(self, now: float, seconds: float) -> float:
        """A fill's hold (counted in ``held_s``); the time it ends."""
        start = self.hold(now, seconds)
        self.held_s += seconds
        return start + seconds

    def call_delay(self, now: float) -> float:
        """An executor call at ``now``: how long it waits for the lock and holds it
        (0 when no fill is under way)."""
        if not self.fills:
            return 0.0
        start = self.hold(now, self.call_s)
        return start + self.call_s - now
