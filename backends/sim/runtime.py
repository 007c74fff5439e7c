"""SimRuntime: the engine's Runtime protocol over a SimPy environment (simulated time).

Each runtime owns its own ``simpy.Environment``; two runtimes in one process never share
state. Waitables are SimPy events: a process yields them and resumes with their value.
"""

from __future__ import annotations

from typing import Any, Iterable

import simpy


class SimRuntime:
    """Simulated time. ``env`` is exposed for backends built on the same clock."""

    __slots__ = ("env",)

    def __init__(self, env: simpy.Environment | None = None, initial_time: float = 0.0):
        self.env = env if env is not None else simpy.Environment(initial_time=initial_time)

    @property
    def now(self) -> float:
        return self.env.now

    def timeout(self, delay_s: float, value: Any = None) -> simpy.Event:
        return self.env.timeout(delay_s, value)

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
