"""SimRuntime: the engine's Runtime protocol over a SimPy environment (simulated time).

Each runtime owns its own ``simpy.Environment``; two runtimes in one process never share
state. Waitables are SimPy events: a process yields them and resumes with their value.
"""

from __future__ import annotations

from heapq import heappush
from typing import Any, Iterable

import simpy
from simpy.events import NORMAL


class SimRuntime:
    """Simulated time. ``env`` is exposed for backends built on the same clock."""

    __slots__ = ("env", "_passed")

    def __init__(self, env: simpy.Environment | None = None, initial_time: float = 0.0):
        self.env = env if env is not None else simpy.Environment(initial_time=initial_time)
        # an event already processed: a process that yields it goes on at once (SimPy
        # resumes a process at once for an event whose callbacks are gone)
        self._passed = simpy.Event(self.env)
        self._passed._ok = True
        self._passed._value = None
        self._passed.callbacks = None  # type: ignore[assignment]

    @property
    def now(self) -> float:
        return self.env.now

    def timeout(self, delay_s: float, value: Any = None) -> simpy.Event:
        return self.env.timeout(delay_s, value)

    def timeout_at(self, at_s: float, value: Any = None) -> simpy.Event:
        """A timeout that fires at the absolute time ``at_s`` (now if that has passed).
        ``timeout(at_s - now)`` would land at ``now + (at_s - now)``, which can differ from
        ``at_s`` in the last bit; a run-ahead must land on exactly the float the steps it
        skipped would have reached. (SimPy schedules only relative delays; this pushes
        onto its queue the way ``Environment.schedule`` does.)"""
        env = self.env
        if at_s <= env.now:
            return env.timeout(0, value)
        ev = simpy.Event(env)
        ev._ok = True
        ev._value = value
        heappush(env._queue, (at_s, NORMAL, next(env._eid), ev))
        return ev

    def advance_to(self, at_s: float) -> simpy.Event:
        """``timeout_at(at_s)`` for the process that runs now, without an event when none
        is due up to ``at_s``: the clock then moves to ``at_s`` at once and the returned
        event is one already processed (the process yielding it goes on). Nothing can tell
        the two apart: no event fires in between, and nothing is due at ``at_s`` that the
        timeout would have let run first. (The clock is SimPy's own ``_now``, which its
        ``step`` sets the same way from the next event's time.) For a process whose resume
        is the last callback of the event it resumed on (the engine's serve loop: it alone
        waits on its events), else a later callback of that event would see the new time."""
        env = self.env
        queue = env._queue
        if at_s > env._now and (not queue or queue[0][0] > at_s):
            env._now = at_s
            return self._passed
        return self.timeout_at(at_s)

    def event(self) -> simpy.Event:
        return self.env.event()

    def all_of(self, waitables: Iterable[simpy.Event]) -> simpy.Event:
        return self.env.all_of(list(waitables))

    def any_of(self, waitables: Iterable[simpy.Event]) -> simpy.Event:
        return self.env.any_of(list(waitables))

    def process(self, gen) -> simpy.Process:
        return self.env.process(gen)

    def run(self, until: simpy.Event | float | None = None) -> None:
        self.env.run(until=until)
