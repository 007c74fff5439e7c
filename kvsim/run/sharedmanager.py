"""A tier manager shared between threads: one reader-writer lock around a TierManager.

``SharedManager`` wraps a ``TierManager`` for callers on several threads (e.g. a
scheduler thread answering prefix-match probes while another thread resizes a request
to a very long context). Every mutation (create, prepare, resume, grow, extend, commit,
suspend, close, set_quota, cap_tier, evict, complete, write_through, the state and lending
calls) takes the lock exclusively; the
read-only queries (``probe_reuse``, ``tier_stats``, ``expected``, ...) take it shared, so probes
run alongside each other and never see a half-made plan: a probe answered while a resize
is in flight sees the manager as it was before the plan or after it (a plan is made, and
completed, under the exclusive lock; between the two the state is the planned one, with
the moving pages still counted where they were). Transfers run outside the lock: a
caller plans, moves the bytes with no lock held, then completes.

The lock (``RWLock``) prefers writers: once a writer waits, new readers queue behind it,
so a stream of probes cannot starve a resize. It is not re-entrant: a thread must not
call the facade from inside a ``reading()``/``writing()`` block (that raises rather
than deadlocks).

The engine's own single-threaded loop keeps using the ``TierManager`` directly: the lock
costs a few microseconds a call, which that loop does not need to pay. This module lives
outside ``kvsim.core`` because the core imports no threading (tests/test_layering.py);
the manager it wraps stays pure.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Hashable, Iterator, Sequence

from kvsim.core import Batch, Fill, Level, Plan, Refusal, Request, TierManager, TierStats
from kvsim.core.keys import BlockIds
from kvsim.core.lending import Lease
from kvsim.core.pages import Page
from kvsim.core.tiers import SlotPool

__all__ = ["RWLock", "SharedManager"]


class RWLock:
    """A writer-preferring reader-writer lock on ``threading.Condition``.

    Many readers or one writer. A reader waits while a writer holds the lock or waits for
    it; a writer waits until no reader and no writer holds it. A thread that holds the
    lock for writing and asks for it again (either way) gets a RuntimeError, not a hang.
    """

    __slots__ = ("_cond", "_readers", "_writer", "_waiting")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0        # threads holding it shared
        self._writer = 0         # ident of the thread holding it exclusively (0: none)
        self._waiting = 0        # writers waiting

    def acquire_read(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                raise RuntimeError("RWLock: this thread holds it for writing")
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            if self._readers <= 0:
                raise RuntimeError("RWLock: release_read without a reader")
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                raise RuntimeError("RWLock: this thread holds it for writing")
            self._waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._writer = me

    def release_write(self) -> None:
        with self._cond:
            if self._writer != threading.get_ident():
                raise RuntimeError("RWLock: release_write by a thread that does not hold it")
            self._writer = 0
            self._cond.notify_all()

    @contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()

    def state(self) -> tuple[int, bool, int]:
        """(readers holding it, a writer holds it, writers waiting): for tests."""
        with self._cond:
            return self._readers, bool(self._writer), self._waiting


class SharedManager:
    """A TierManager behind one reader-writer lock (see the module docstring).

    ``lock``: any object with ``acquire_read``/``release_read``/``acquire_write``/
    ``release_write`` (default: a new ``RWLock``)."""

    __slots__ = ("_m", "_lock", "spec", "page_bytes", "tokens_per_block", "wt_take_back")

    def __init__(self, manager: TierManager, lock: RWLock | None = None):
        if not isinstance(manager, TierManager):
            raise TypeError(f"manager: got {type(manager).__name__}; expected a TierManager")
        self._m = manager
        self._lock = lock if lock is not None else RWLock()
        self.spec = manager.spec  # immutable: read without the lock
        self.page_bytes = manager.page_bytes
        self.tokens_per_block = manager.tokens_per_block
        self.wt_take_back = manager.wt_take_back  # (fixed at construction)

    @property
    def lock(self) -> RWLock:
        return self._lock

    @property
    def unlocked(self) -> TierManager:
        """The wrapped manager itself, with no lock: only where no other thread uses it."""
        return self._m

    @contextmanager
    def reading(self) -> Iterator[TierManager]:
        """The manager under the shared lock, for several reads that must agree."""
        self._lock.acquire_read()
        try:
            yield self._m
        finally:
            self._lock.release_read()

    @contextmanager
    def writing(self) -> Iterator[TierManager]:
        """The manager under the exclusive lock, for several calls in one step."""
        self._lock.acquire_write()
        try:
            yield self._m
        finally:
            self._lock.release_write()

    # == shared: read-only queries ======================================================
    def probe_reuse(self, scope: Hashable, blocks: Sequence[BlockIds], ntokens: int
                    ) -> dict[Level, int]:
        lock = self._lock
        lock.acquire_read()
        try:
            return self._m.probe_reuse(scope, blocks, ntokens)
        finally:
            lock.release_read()

    def probe_chain(self, chain: Sequence[tuple[bytes, int]]) -> list[int]:
        with self.reading() as m:
            return m.probe_chain(chain)

    def tier_stats(self, level: Level) -> TierStats:
        with self.reading() as m:
            return m.tier_stats(level)

    def expected(self, req: Request) -> Fill:
        with self.reading() as m:
            return m.expected(req)

    def plans_in_flight(self) -> int:
        with self.reading() as m:
            return m.plans_in_flight()

    def requests(self) -> list[Request]:
        """A snapshot of the live requests."""
        with self.reading() as m:
            return list(m.requests())

    def pages(self) -> list[Page]:
        """A snapshot of the live pages."""
        with self.reading() as m:
            return list(m.pages())

    def level_of(self, tier_pos: int) -> Level:
        return self._m.level_of(tier_pos)  # the tiers' order never changes

    def tier_pos(self, level: Level) -> int:
        return self._m.tier_pos(level)

    # == exclusive: mutations ===========================================================
    def create(self, scope: Hashable, blocks: Sequence[BlockIds], ntokens: int,
               priority: int = 0) -> Request:
        with self.writing() as m:
            return m.create(scope, blocks, ntokens, priority)

    def prepare(self, req: Request, blocks: Sequence[BlockIds], ntokens: int) -> int:
        with self.writing() as m:
            return m.prepare(req, blocks, ntokens)

    def resume(self, req: Request) -> Plan | Refusal:
        with self.writing() as m:
            return m.resume(req)

    def grow(self, req: Request, ntokens: int, blocks: Sequence[BlockIds] = ()) -> Plan | Refusal:
        with self.writing() as m:
            return m.grow(req, ntokens, blocks)

    def extend(self, req: Request, ntokens: int, blocks: Sequence[BlockIds] = ()) -> bool:
        with self.writing() as m:
            return m.extend(req, ntokens, blocks)

    def commit(self, req: Request, ntokens: int, final: bool = False) -> Fill:
        with self.writing() as m:
            return m.commit(req, ntokens, final)

    def suspend(self, req: Request) -> None:
        with self.writing() as m:
            m.suspend(req)

    def close(self, req: Request) -> None:
        with self.writing() as m:
            m.close(req)

    def set_quota(self, level: Level, quota_bytes: int) -> Plan | Refusal:
        with self.writing() as m:
            return m.set_quota(level, quota_bytes)

    def cap_tier(self, level: Level, limit_slots: int) -> None:
        with self.writing() as m:
            m.cap_tier(level, limit_slots)

    def evict(self, level: Level, npages: int) -> Plan | Refusal:
        with self.writing() as m:
            return m.evict(level, npages)

    def complete(self, plan: Plan, ok: bool | Sequence[bool] = True) -> None:
        with self.writing() as m:
            m.complete(plan, ok)

    def take_state(self, req: Request, npages: int) -> Plan | Refusal:
        with self.writing() as m:
            return m.take_state(req, npages)

    def state_fill(self, req: Request) -> Fill:
        with self.writing() as m:
            return m.state_fill(req)

    def stash_state(self, req: Request) -> Plan | Refusal:
        with self.writing() as m:
            return m.stash_state(req)

    def drop_state(self, req: Request) -> None:
        with self.writing() as m:
            m.drop_state(req)

    def state_level(self, req: Request) -> Level | None:
        with self.reading() as m:
            return m.state_level(req)

    def state_moving(self, req: Request) -> bool:
        with self.reading() as m:
            return m.state_moving(req)

    def write_through(self) -> Plan | None:
        with self.writing() as m:
            return m.write_through()

    def retained_slots(self) -> int:
        with self.reading() as m:
            return m.retained_slots()

    def protected_copies(self) -> int:
        with self.reading() as m:
            return m.protected_copies()

    def takeback_waits(self, batch: Batch) -> list[int]:
        with self.reading() as m:
            return m.takeback_waits(batch)


    # == lending (node.host: shared: a sibling rank reads these pages) ================
    def lendable(self, keys: Sequence[bytes]) -> list[Level]:
        with self.reading() as m:
            return m.lendable(keys)

    def lent(self) -> dict[int, int]:
        with self.reading() as m:
            return m.lent()

    def lend(self, keys: Sequence[bytes]) -> Lease:
        with self.writing() as m:
            return m.lend(keys)

    def give_back(self, lease: Lease) -> None:
        with self.writing() as m:
            m.give_back(lease)

    def share_tier(self, level: Level, pool: SlotPool) -> None:
        with self.writing() as m:
            m.share_tier(level, pool)

#: TierManager's public methods, by how the facade takes the lock for them (a test checks
#: that every public method of TierManager is in one of these)
SHARED_METHODS = ("probe_reuse", "probe_chain", "tier_stats", "expected", "plans_in_flight", "requests",
                  "pages", "level_of", "tier_pos", "retained_slots", "protected_copies",
                  "takeback_waits", "state_level", "state_moving", "lendable", "lent")
EXCLUSIVE_METHODS = ("create", "prepare", "resume", "grow", "extend", "commit", "suspend",
                     "close", "set_quota", "cap_tier", "evict", "complete", "write_through",
                     "take_state", "state_fill", "stash_state", "drop_state", "lend", "give_back",
                     "share_tier")
