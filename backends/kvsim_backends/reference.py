"""A reference backend for tests: bytes are content tags in numpy arrays, and a transfer
completes only when the test steps it, so a test can hold a transfer in flight.

``transfer`` queues a batch and returns a Ticket; ``step()`` performs the oldest queued
transfer (copying tags, or failing it if the test asked with ``fail_next``) and resolves
its ticket. No clock, no threads. A ``TAKEBACK`` batch moves nothing: the page's
retained disk copy is its destination already (a failed one leaves the copy as it was).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level


@dataclass
class Ticket:
    batch: Batch
    done: bool = False
    ok: bool = False


@dataclass
class ReferenceBackend:
    """``slots[level]``: how many slots each tier's tag array has (its reserved range)."""

    slots: dict[Level, int]
    name: str = "reference"
    runtime: object = None
    tags: dict[Level, np.ndarray] = field(init=False)
    queue: deque = field(default_factory=deque, init=False)
    errors: list = field(default_factory=list, init=False)
    _fail: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.tags = {lv: np.zeros(n, dtype=np.uint64) for lv, n in self.slots.items()}

    def transfer(self, batch: Batch) -> Ticket:
        t = Ticket(batch)
        self.queue.append(t)
        return t

    def slots_ready(self, level: Level, slots) -> None:
        return None  # every tier exists whole

    def slot_limit(self, level: Level) -> None:
        return None

    def fill_layout(self, level: Level) -> None:
        return None  # every tier exists whole

    def fail_next(self, n: int = 1) -> None:
        self._fail += n

    def step(self) -> Ticket:
        """Perform the oldest queued transfer."""
        t = self.queue.popleft()
        b = t.batch
        if b.kind is BatchKind.TAKEBACK:  # onto the page's retained disk copy: no bytes
            t.ok = not self._fail
            self._fail -= bool(self._fail)
        elif self._fail:
            self._fail -= 1
            # a failed write leaves garbage behind it, as a real one may
            self.tags[b.dst][b.dst_slots] = np.uint64(0xDEAD)
            t.ok = False
            self.errors.append(f"injected failure of a {b.src.name}->{b.dst.name} batch")
        else:
            self.tags[b.dst][b.dst_slots] = self.tags[b.src][b.src_slots]
            t.ok = True
        t.done = True
        return t

    def run_plan(self, plan, fail_batches: frozenset[int] = frozenset()) -> list[bool]:
        """Convenience for tests: run a plan's batches stage by stage, as the engine does,
        stopping after a failed stage. Returns one flag per batch."""
        oks = [False] * len(plan.batches)
        order = sorted(range(len(plan.batches)), key=lambda i: plan.batches[i].stage)
        failed_stage = None
        for i in order:
            b = plan.batches[i]
            if failed_stage is not None and b.stage > failed_stage:
                continue
            if i in fail_batches:
                self.fail_next()
            self.transfer(b)
            oks[i] = self.step().ok
            if not oks[i]:
                failed_stage = b.stage
        return oks

    def compute(self, duration_s: float) -> float:
        return duration_s

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool) -> float | None:
        return None  # no clock: the caller always computes step by step

    def catch_up(self, until_s: float) -> float:
        return until_s

    def fill(self, fill: Fill) -> None:
        self.tags[fill.level][fill.slots] = fill.tags

    def read_tags(self, level: Level, slots: np.ndarray) -> np.ndarray:
        return self.tags[level][slots]

    def read_tags_later(self, level: Level, slots: np.ndarray) -> None:
        return None

    def promote(self, batch: Batch) -> int:
        return 0  # (no I/O queues: batches run in order)

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        self.queue.clear()
