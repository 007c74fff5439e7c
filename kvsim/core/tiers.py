"""One tier: a quota in slots, a slot allocator and an eviction index.

Slot ids: recycled slots are reused first (last freed, first reused), then fresh ids in
ascending order from 0, so the Nth fresh allocation touches only the Nth slot of the
reserved range (progressive host fill relies on this). Invariant: every id below
``next_fresh`` is either in ``recycled`` or owned by exactly one page or reservation;
``used == next_fresh - len(recycled) - lost``; ids never reach ``limit`` (``max_slots``,
the reserved range, unless a host fill failed: ``cap``). Progressive host fill
(``kvsim.core.datapath.fill``) relies on the order: every slot ever handed out lies below
``next_fresh``, so a batch waits only for the unit holding its highest slot.

The eviction index holds the pages an eviction may pick: resident (not moving, not
pending), unlocked, and, in the last tier, also not held (held pages cannot be dropped).
It is one insertion-ordered dict per priority; insertion order is recency (oldest first),
driven by the manager's logical clock, never by a wall clock. With a policy other than
LRU, ``order`` also keeps the candidates in that policy's order (``policy.base.TierOrder``:
a heap of its keys, or a queue policy's own state).
A slot may also be owned by a retained copy (the disk tier's ``copies``, or a
write-through's slot while it is written): used, neither free nor a page's.
"""

from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Iterator

from kvsim.core.spec import Level

if TYPE_CHECKING:
    from kvsim.core.pages import Page
    from kvsim.core.policy.base import TierOrder


def take_recycled(r: list[int], k: int) -> list[int]:
    """Up to ``k`` ids off the end of ``r`` (the last freed first), taken out of it."""
    if k <= len(r):
        out = r[len(r) - k:]
        del r[len(r) - k:]
        out.reverse()
        return out
    out = r[::-1]
    r.clear()
    return out


class SlotPool:
    """A node's pool of slots of one tier that several ranks' tiers draw from
    (``node.host: shared``): ``capacity`` slots in all, their ids unique across the
    ranks (one allocation of the node's memory holds them: slot ``s`` is the same bytes
    whichever rank reads it); ``used``, those the ranks hold; ``peak``, the most they held
    at once. Ids are handed out as a tier's are (recycled first, last freed first reused,
    then fresh ascending from 0), so they stay below ``capacity``. A tier with a pool
    counts its own slots and has free only what the pool has left (``Tier.free``): a
    rank that needs room when the pool is full evicts its own least recent pages, as
    from a full tier of its own (no rank evicts another's: each manager moves only its
    own pages)."""

    __slots__ = ("capacity", "used", "peak", "recycled", "next_fresh")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.used = 0
        self.peak = 0
        self.recycled: list[int] = []
        self.next_fresh = 0

    def take(self, k: int) -> list[int]:
        """``k`` slot ids."""
        used = self.used + k
        if used > self.capacity:  # a caller skipped the free-count check
            raise RuntimeError(f"node pool: {k} slots with {self.capacity - self.used} left")
        self.used = used
        if used > self.peak:
            self.peak = used
        out = take_recycled(self.recycled, k)
        if len(out) < k:
            start = self.next_fresh
            self.next_fresh = start + (k - len(out))
            out.extend(range(start, self.next_fresh))
        return out

    def give(self, slots: list[int]) -> None:
        """``slots`` are free again."""
        self.used -= len(slots)
        self.recycled.extend(slots)


class Tier:
    __slots__ = ("level", "index_pos", "is_last", "slot_bytes", "capacity", "max_slots",
                 "recycled", "next_fresh", "lru", "_prios", "_churn", "order", "limit", "lost",
                 "copies", "pool", "own")

    def __init__(self, level: Level, index_pos: int, is_last: bool, slot_bytes: int,
                 capacity: int, max_slots: int):
        self.level = level
        self.index_pos = index_pos
        self.is_last = is_last
        self.slot_bytes = slot_bytes
        self.capacity = capacity
        self.max_slots = max_slots
        self.recycled: list[int] = []
        self.next_fresh = 0
        self.limit = max_slots  # slot ids that can exist (a failed host fill lowers it)
        self.lost = 0  # handed-out slots at or above ``limit`` since released: gone for good
        self.lru: dict[int, dict[Page, None]] = {}
        self._prios: list[int] = []  # sorted keys of lru
        self._churn = 0  # pages removed in bulk since the buckets were last compacted
        # a policy other than LRU: its order of this tier's candidates, told of every page
        # that enters the index or is touched in it (None: LRU, the index's own order):
        # a heap of the policy's keys, or a queue policy's own state (policy.queues)
        self.order: TierOrder | None = None
        # the disk tier: the retained copies it may reclaim (complete, not being taken
        # back), oldest first; each owns a slot of this tier (kvsim.core.retained)
        self.copies: dict[Page, None] = {}
        # a node-wide pool this tier draws from (``node.host: shared``; None: its own quota)
        self.pool: SlotPool | None = None
        self.own = 0  # with a pool: the slots this tier holds of it

    # -- slots ---------------------------------------------------------------------------
    @property
    def used(self) -> int:
        if self.pool is not None:
            return self.own
        return self.next_fresh - len(self.recycled) - self.lost

    @property
    def free(self) -> int:
        free = self.capacity - self.used
        pool = self.pool
        if pool is not None and pool.capacity - pool.used < free:
            free = pool.capacity - pool.used
        return free if free > 0 else 0

    def cap(self, limit: int) -> None:
        """Slot ids at or above ``limit`` will never exist (a host fill stopped there):
        the capacity shrinks to it, free slots above it are forgotten, and slots above it
        still owned are forgotten when released. Slots below stay usable."""
        if limit < 0:
            raise ValueError(f"limit: got {limit}; expected >= 0")
        if limit >= self.limit:
            return
        self.limit = limit
        if self.capacity > limit:
            self.capacity = limit
        keep = [s for s in self.recycled if s < limit]
        self.lost += len(self.recycled) - len(keep)
        self.recycled[:] = keep

    def alloc(self) -> int:
        if self.pool is not None:
            self.own += 1
            return self.pool.take(1)[0]
        if self.recycled:
            return self.recycled.pop()
        slot = self.next_fresh
        if slot >= self.limit:  # a caller skipped the free-count check
            raise RuntimeError(f"{self.level.name} tier: no slot left below {self.limit}")
        self.next_fresh = slot + 1
        return slot

    def alloc_many(self, k: int) -> list[int]:
        """``k`` slots, in the order ``alloc`` would give them."""
        if self.pool is not None:
            self.own += k
            return self.pool.take(k)
        out = take_recycled(self.recycled, k)
        if len(out) == k:
            return out
        start = self.next_fresh
        stop = start + (k - len(out))
        if stop > self.limit:
            raise RuntimeError(f"{self.level.name} tier: no slot left below {self.limit}")
        self.next_fresh = stop
        out.extend(range(start, stop))
        return out

    def release(self, slot: int) -> None:
        if self.pool is not None:
            self.own -= 1
            self.pool.give([slot])
            return
        if slot >= self.limit:  # (only after ``cap``)
            self.lost += 1
            return
        self.recycled.append(slot)

    def release_many(self, slots: list[int]) -> None:
        """Release ``slots`` in order (as ``release`` one by one would)."""
        if self.pool is not None:
            self.own -= len(slots)
            self.pool.give(slots)
            return
        if self.next_fresh > self.limit:  # (only after ``cap``)
            for s in slots:
                self.release(s)
            return
        self.recycled.extend(slots)

    # -- eviction index ------------------------------------------------------------------
    def new_bucket(self, priority: int) -> dict[Page, None]:
        """The (empty) index bucket of a priority that has none yet."""
        bucket: dict[Page, None] = {}
        self.lru[priority] = bucket
        self._prios = sorted(self.lru)
        return bucket

    def index_add(self, page: Page) -> None:
        bucket = self.lru.get(page.priority)
        if bucket is None:
            bucket = self.new_bucket(page.priority)
        bucket[page] = None
        if self.order is not None:
            self.order.touch(page)

    def index_discard(self, page: Page) -> None:
        bucket = self.lru.get(page.priority)
        if bucket is not None:
            bucket.pop(page, None)

    def index_discard_each(self, pages: list[Page]) -> None:
        """``index_discard`` for each page (indexed or not)."""
        self._churn += len(pages)
        lru = self.lru
        if len(lru) == 1:  # one priority in use: a page of another is in no bucket
            pop = next(iter(lru.values())).pop
            for p in pages:
                pop(p, None)
            return
        for p in pages:
            bucket = lru.get(p.priority)
            if bucket is not None:
                bucket.pop(p, None)

    def index_touch(self, page: Page) -> None:
        """Make ``page`` the most recently used of its priority (adding it if absent)."""
        bucket = self.lru.get(page.priority)
        if bucket is None:
            self.index_add(page)
            return
        bucket.pop(page, None)
        bucket[page] = None
        if self.order is not None:
            self.order.touch(page)

    def index_contains(self, page: Page) -> bool:
        bucket = self.lru.get(page.priority)
        return bucket is not None and page in bucket

    def index_size(self) -> int:
        return sum(len(b) for b in self.lru.values())

    def candidates(self) -> Iterator[Page]:
        """Eviction candidates: lowest priority first, then least recently used. (An
        iterator in C over the buckets: victim selection walks it page by page.)

        A dict keeps a deleted entry's place until it is resized, and iterating from the
        front steps over every such hole: victims leave from the front, so without care
        each selection would walk past thousands of them. The buckets are rebuilt
        (``dict(b)`` keeps the order, without holes) once the pages removed since the
        last rebuild reach half the index."""
        lru = self.lru
        if self._churn > 64 and self._churn * 2 > self.index_size():
            self._churn = 0
            for prio, bucket in lru.items():
                lru[prio] = dict(bucket)
        if len(lru) == 1:
            return iter(next(iter(lru.values())))
        return chain.from_iterable([lru[p] for p in self._prios])
