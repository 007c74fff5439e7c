"""Queue policies: per-tier state of their own (queues, ghosts, a hand), as S3-FIFO, ARC
and SIEVE keep it, driven by the manager's events; ``QueueOrder`` is the tier order
(``TierOrder``) that adapts a ``TierQueue`` to the manager.

A queue policy's ``tier_queue(tier)`` gives each tier it orders a fresh ``TierQueue``.
The manager tells it, for that tier:

    insert(page)      the page joined the tier: it entered the tier's eviction index and
                      the queue does not hold it (its turn ended after it was created or
                      onboarded, it arrived from a warmer tier, or a move out of the tier
                      was rolled back). So a page joins its queues when it first becomes
                      evictable there, as LRU dates a page by its turn's end.
    hit(page)         a turn uses a page the queue holds (locked or not).
    remove(page)      a page the queue holds left the tier other than as its victim
                      (onboarded to GPU, freed).
    returned(pages)   victims (``evicted``) whose move out of the tier failed: the plan
                      rolled back and they stay. No request asked for them: a queue with
                      ghosts takes back the ghost their eviction made (no ghost hit) and
                      holds them again; by default they are ``insert``-ed as they are
                      indexed again.
    incoming(keys)    (the GPU tier, where ``wants_incoming``) the chain keys of a
                      prompt's blocks that are not on GPU, in prompt order, when the
                      prompt is declared: the pages the GPU tier will take in, so that a
                      ghost hit counts before the eviction that makes room for it, as in
                      the papers (a block's key is its content: a ghost is a key).
    walk()            the pages in the order the algorithm would evict them now, each
                      assumed gone once yielded: a DRY RUN, which changes nothing (the
                      manager may walk, take fewer, or plan nothing at all). It may yield
                      pages that are not candidates (locked, held in the last tier, or
                      a parent whose children are still cached there); the manager
                      passes over those.
    evicted(pages)    the manager chose these victims, all yielded by a walk of the
                      present state: the queue now changes as the algorithm would have
                      evicting them (promotions, reinsertions, a hand that moved, ghosts).
                      A page the walk yielded that the manager passed over is in use: the
                      built-ins put it back at its queue's head (a FIFO or LRU queue would
                      otherwise read it again at every walk).

and reads ``page in queue`` and ``len(queue)``. The manager keeps its invariants whatever
a queue says: only candidates are taken, plans stay all-or-nothing, children drop before
parents in the last tier. A queue reads its tier's capacity live (``tier.capacity``:
quotas change), never a clock; it keeps no module-level state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

from kvsim.core.policy.base import TierOrder

if TYPE_CHECKING:
    from kvsim.core.pages import Page
    from kvsim.core.tiers import Tier


class WalkRun:
    """What one walk has done so far (a queue's overlay of its state): subclasses add
    their cursors and pending changes; ``seen`` holds the pages yielded, ``last`` the last
    one."""

    __slots__ = ("seen", "last")

    def __init__(self) -> None:
        self.seen: set["Page"] = set()
        self.last: "Page | None" = None


class TierQueue:
    """Base class of a queue policy's state for one tier (see the module docstring).

    A subclass defines ``insert``, ``hit``, ``remove``, ``incoming``, ``_walk(run)`` (the
    dry run, writing what it does into ``run``, a ``new_run()``, and recording each page
    it yields with ``run.seen.add(p); run.last = p``) and ``_apply(run, gone, stray)``
    (make the state what ``run`` says for the victims ``gone``), and bumps ``version``
    whenever its state changes. ``walk`` and ``evicted`` are built on those: ``evicted``
    reuses the overlay of the last walk when that walk stopped at a victim of the present
    state (the common case: the manager takes the first pages it is offered), else runs
    the walk again up to the last victim."""

    #: told ``incoming(keys)`` for the GPU tier (computing the keys costs a hash a block)
    wants_incoming = False

    def __init__(self, tier: "Tier") -> None:
        self.tier = tier  # read-only: ``tier.capacity`` (pages), ``tier.index_pos``
        self.version = 0  # bumped by every change of state
        self._last: tuple[int, Any] | None = None  # (version, run) of the last walk

    def insert(self, page: "Page") -> None:
        raise NotImplementedError

    def admit(self, pages: list["Page"]) -> None:
        """``insert`` each page it does not hold, in order (pages entering the tier's
        index together; a queue may do it faster)."""
        for p in pages:
            if p not in self:
                self.insert(p)

    def hit(self, page: "Page") -> None:
        pass

    def remove(self, page: "Page") -> None:
        raise NotImplementedError

    def incoming(self, keys: list[bytes]) -> None:
        pass

    def returned(self, pages: list["Page"]) -> None:
        pass

    def new_run(self) -> WalkRun:
        return WalkRun()

    def _walk(self, run: Any) -> Iterator["Page"]:
        raise NotImplementedError

    def _apply(self, run: Any, gone: set["Page"], stray: set["Page"]) -> None:
        raise NotImplementedError

    def walk(self) -> Iterator["Page"]:
        run = self.new_run()
        self._last = (self.version, run)
        return self._walk(run)

    def evicted(self, pages: list["Page"]) -> None:
        if not pages:
            return
        victims = set(pages)
        last = self._last
        run = last[1] if last is not None and last[0] == self.version else None
        if run is not None and run.last in victims and victims <= run.seen:
            stray: set["Page"] = set()
        else:
            run = self.new_run()
            stray = replay_until(self._walk(run), victims)
        self._apply(run, victims - stray, stray)
        self.version += 1
        self._last = None

    def __contains__(self, page: object) -> bool:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


def replay_until(walk: Iterator["Page"], victims: Iterable["Page"]) -> set["Page"]:
    """Advance ``walk`` until it has yielded every page of ``victims``; the victims it
    never yielded (none, for a walk of the state the victims were chosen from)."""
    left = set(victims)
    if left:
        for p in walk:
            left.discard(p)
            if not left:
                break
    return left


class QueueOrder(TierOrder):
    """A tier's order kept by a ``TierQueue``: the manager's index events become the
    queue's insertions (a page it does not hold entered the index), its hits, departures
    and victims; a walk is the queue's, without the pages that are not candidates."""

    __slots__ = ("queue", "clock", "wants_incoming")

    def __init__(self, queue: TierQueue, clock: Any):
        self.queue = queue
        self.clock = clock  # the manager: its ``ticks`` date a page's last touch
        self.wants_incoming = bool(queue.wants_incoming)

    def touch(self, page: "Page") -> None:
        m = self.clock
        m.ticks += 1
        page.last_use = m.ticks  # (the page's recency, as every order keeps it)
        if page not in self.queue:
            self.queue.insert(page)

    def touch_many(self, pages: list["Page"]) -> None:
        m = self.clock
        t = m.ticks
        for p in pages:
            t += 1
            p.last_use = t
        m.ticks = t
        self.queue.admit(pages)

    def used(self, page: "Page", tier: "Tier") -> None:
        if page in self.queue:
            self.queue.hit(page)

    def incoming(self, keys: list[bytes]) -> None:
        self.queue.incoming(keys)

    def walk(self, indexed: Any, size: int, want: int = 1) -> Iterator["Page"]:
        return filter(indexed, self.queue.walk())

    def evicted(self, pages: list["Page"]) -> None:
        self.queue.evicted(pages)

    def left(self, pages: Iterable["Page"]) -> None:
        q = self.queue
        for p in pages:
            if p in q:
                q.remove(p)

    def returned(self, pages: list["Page"]) -> None:
        self.queue.returned([p for p in pages if p not in self.queue])

    def missing(self, pages: Iterable["Page"]) -> list["Page"]:
        q = self.queue
        return [p for p in pages if p not in q]
