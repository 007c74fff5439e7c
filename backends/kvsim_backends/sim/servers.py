"""``Units``: a pool of identical units (copy engines, host threads) without SimPy events."""

from __future__ import annotations

from collections import deque
from typing import Callable


class Units:
    """``n`` identical units (copy engines, host threads), taken first come, first served:
    a ``simpy.Resource`` without its request and release events (a taker goes on at once
    when one is free, else when one is given back)."""

    __slots__ = ("free", "waiting")

    def __init__(self, n: int):
        self.free = n
        self.waiting: deque[Callable[[], None]] = deque()

    def take(self, then: Callable[[], None]) -> None:
        if self.free:
            self.free -= 1
            then()
        else:
            self.waiting.append(then)

    def give(self) -> None:
        if self.waiting:
            self.waiting.popleft()()  # (the unit goes straight to the next taker)
        else:
            self.free += 1
