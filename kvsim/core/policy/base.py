"""The eviction policy interface, and the defaults: ``PriorityLRU`` (per tier, lowest
priority, then least recently used: the manager's default) and ``LRU`` (the same order,
every page at priority 0: a run's default, ``lru``).

A policy orders a tier's eviction candidates. The manager asks it only which candidates
go first; everything else stays the manager's job: which pages are candidates at all
(resident, unlocked, not held in the last tier), all-or-nothing plans, where victims go,
and dropping children before parents in the last tier. So no policy can break those.

A policy sees each candidate page's metadata, read-only:

    page.tier        position of its tier (0: GPU)        page.ntokens   tokens it holds
    page.index       block position = depth in the tree   page.priority  its priority
    page.last_use    its recency: larger is more recent. The manager's recency counter,
                     read when the page last entered its tier's eviction index or was
                     touched there: when a request that used it ends its turn or is
                     suspended, when it arrives in a colder tier. That is the order LRU
                     keeps, so ``(priority, last_use)`` orders a tier exactly as LRU does.
    page.uses        turns that used it                   page.key       its chain key
    page.score       a number the policy may keep per page (its own; 0.0 at first)

and the manager's logical clock (one tick per turn, ``prepare``; not comparable with
``last_use``). It does no I/O and reads no wall clock.

A tier's order is a ``TierOrder`` (``tier.order``), one of three kinds:

- ``LRU`` (and ``PriorityLRU``) is special-cased: the manager walks the tier's recency
  index itself (one insertion-ordered dict per priority), the fast path (``order`` None).
- A policy of keys (``key``, optional ``keys``) goes through ``HeapOrder``: a page's
  ``key(page, clock)`` is computed when it enters a tier's eviction index or is used
  there, and candidates come lowest key first (equal keys: the one keyed first). So a key
  may change only when its page is used (or, as ``belady``'s, grow with the clock:
  ``HeapOrder`` re-keys such a page when it surfaces).
- A queue policy (S3-FIFO, ARC, SIEVE, or your own) returns a per-tier ``TierQueue`` from
  ``tier_queue(tier)`` (``kvsim.core.policy.queues``): state of its own per tier (queues,
  ghosts, a hand), told of insertions, hits, departures and the keys a prompt will bring
  in, asked for its victims as a dry run, and told which it lost.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from itertools import compress, repeat
from operator import eq, ne
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from kvsim.core.types import Phase

if TYPE_CHECKING:
    from kvsim.core.pages import Page


class EvictionPolicy:
    """Base class of eviction policies (subclass it, or provide the same attributes).

    ``key(page, clock)``: a sortable value; lowest is evicted first.
    ``on_use(page, clock)``: a page was used (a turn included it, or created it);
    ``page.uses`` is already updated.
    ``on_turn(pages, clock)``: a turn ended (or was suspended part way): its pages, in
    prompt order (the prompt's, then those it computed), before they enter the index.
    ``on_evict(pages, clock)``: these pages were chosen as victims and leave their tier.
    ``tier_queue(tier)``: a queue policy's state for one tier (``TierQueue``), or None:
    the tier is ordered by ``key``.
    """

    name = "base"
    #: needs the future of the trace (offline, not a policy a server could run; MIN one
    #: request at a time in one tier, not a bound with requests running together or
    #: several tiers: docs/policies.md)
    is_bound = False
    #: the manager keeps its own recency order only: ``key`` is never called
    fast_lru = False
    #: pages get the priority their request asks for (False: every page gets 0, so the
    #: workload's priorities change nothing)
    honours_priority = True
    #: a page's key changes only when the manager re-keys it (it enters or is touched in
    #: an index, or is used): the order need not check it again before yielding the page
    static_keys = False
    #: a key no page's key sorts below, that many pages get (``belady``: never used
    #: again), or None. Pages keyed so come first, in the order they were keyed: the
    #: generic path queues them first-in-first-out beside its heap (same order, cheaper).
    #: A page keeps this key until the manager re-keys it (never used again stays so): the
    #: order does not check it again before yielding the page, even without static_keys
    floor_key: Any = None
    #: a page's key may change when a turn uses it (``uses``, or a next use that passed):
    #: the order re-keys a used page at once. False: the key changes only in ``on_turn``
    #: (then the page is keyed again as its turn ends), so a use need not re-key it
    rekey_on_use = True
    #: every key is an int (and ``floor_key`` one, or None): the generic path packs an
    #: entry, key and stamp, into one int (``intheap.IntHeapOrder``), an object the garbage
    #: collector never tracks; the order is the same
    int_keys = False

    def key(self, page: "Page", clock: int) -> Any:
        raise NotImplementedError

    def keys(self, pages: list["Page"], clock: int) -> list[Any]:
        """``key`` of each page (a policy may compute a batch faster)."""
        key = self.key
        return [key(p, clock) for p in pages]

    def on_use(self, page: "Page", clock: int) -> None:
        pass

    def on_turn(self, pages: list["Page"], clock: int) -> None:
        """A turn ended, or was suspended part way (after ``on_use`` of each page): all
        its pages, in prompt order, before they enter their tier's index (so a key that
        depends on what this hook sets is right when they do)."""

    def on_evict(self, pages: Iterable["Page"], clock: int) -> None:
        pass

    def order(self, candidates: Iterable["Page"], clock: int) -> list["Page"]:
        """The candidates (given least recently used first) in eviction order."""
        key = self.key
        return sorted(candidates, key=lambda p: key(p, clock))

    def tier_queue(self, tier: Any) -> Any:
        """A queue policy's own state for ``tier`` (a fresh ``kvsim.core.policy.queues.
        TierQueue`` per tier it orders), or None: the tier is ordered by ``key``
        (``HeapOrder``)."""
        return None

    def check_tier(self, capacity: int) -> str | None:
        """Why this policy cannot order a tier of ``capacity`` pages (None: it can). A run
        refuses such a configuration before it starts."""
        return None


class LRU(EvictionPolicy):
    """Per tier: least recently used first. Priorities are ignored (every page gets 0)."""

    name = "lru"
    fast_lru = True
    honours_priority = False

    def key(self, page: "Page", clock: int) -> Any:  # what the fast path's order means
        return (page.priority, page.last_use)


class PriorityLRU(LRU):
    """Per tier: lowest priority first, then least recently used (kvsim's historic order,
    the manager's default; with all priorities equal, ``lru``'s)."""

    name = "priority-lru"
    honours_priority = True


class TierOrder:
    """What the manager tells and asks a tier's candidate order (``tier.order``). The
    manager calls, for pages of that tier:

    ``touch(page)``, ``touch_many(pages)``: the page entered the tier's eviction index or
    was touched there (its turn ended, it arrived from a warmer tier);
    ``used(page, tier)``: a turn uses the page (``prepare``), indexed or not;
    ``incoming(keys)`` (GPU tier, only where ``wants_incoming``): the chain keys of a
    prompt's blocks not on GPU, in prompt order, which the GPU tier will take in;
    ``walk(indexed, size, want)``: the candidates in eviction order, a dry run;
    ``evicted(pages)``: these pages, from the last walk, were chosen as victims;
    ``left(pages)``: these pages left the tier other than as victims (onboarded to GPU,
    freed);
    ``returned(pages)``: victims whose move out of the tier failed (the plan rolled back):
    they stay, and the manager indexes them again next (``touch``);
    ``missing(pages)``: those of ``pages`` (the tier's index) it does not hold (the audit).
    """

    __slots__ = ()
    wants_incoming = False

    def touch(self, page: "Page") -> None:
        raise NotImplementedError

    def touch_many(self, pages: list["Page"]) -> None:
        raise NotImplementedError

    def used(self, page: "Page", tier: Any) -> None:
        raise NotImplementedError

    def incoming(self, keys: list[bytes]) -> None:
        pass

    def walk(self, indexed: Any, size: int, want: int = 1) -> Iterator["Page"]:
        raise NotImplementedError

    def evicted(self, pages: list["Page"]) -> None:
        pass

    def left(self, pages: Iterable["Page"]) -> None:
        pass

    def returned(self, pages: list["Page"]) -> None:
        pass

    def missing(self, pages: Iterable["Page"]) -> list["Page"]:
        raise NotImplementedError


class HeapOrder(TierOrder):
    """One tier's eviction candidates in a policy's order, kept incrementally (the generic
    path): a heap of (key, stamp, page) entries, one pushed whenever a page enters the
    tier's eviction index or is used while in it, its key computed then. An entry counts
    only while it is its page's latest and the page is still in the index; the others are
    dropped as they surface, and the heap is rebuilt when they outnumber the live ones
    twice.

    ``walk`` yields candidates lowest key first without consuming them (a selection is a
    dry run): what it popped goes back at the next walk, those entries that still count
    (most were victims, gone from the index by then). Before yielding a page it
    recomputes its key: a key that grew since (``belady``: the next use it expected went
    by) is pushed again in its place; a page keyed with the policy's ``floor_key`` keeps it
    (nothing to recompute).

    Entries keyed with the policy's ``floor_key`` (no key sorts below it) are appended to
    ``fifo`` instead: their stamps ascend, so it stays in (key, stamp) order, and a walk
    takes whichever of its front and the heap's top comes first. The order is the one a
    single heap gives, without each such entry sifting through the whole heap."""

    __slots__ = ("policy", "clock", "heap", "fifo", "floor", "stamps", "n", "taken", "rekey")

    def __init__(self, policy: EvictionPolicy, clock: Any):
        self.policy = policy
        self.clock = clock  # the manager: its ``clock`` read at each push, ``ticks`` at a touch
        self.heap: list[tuple[Any, int, "Page"]] = []
        self.fifo: deque[tuple[Any, int, "Page"]] = deque()
        self.floor = getattr(policy, "floor_key", None)
        self.rekey = getattr(policy, "rekey_on_use", True)
        self.stamps: dict["Page", int] = {}
        self.n = 0
        # entries the last walk popped and yielded: they go back at the next walk, those
        # that still count (most were victims that since left the index)
        self.taken: list[tuple[Any, int, "Page"]] = []

    def touch(self, page: "Page") -> None:
        """``page`` entered the tier's index or was touched there: it becomes the most
        recent (``last_use``), then takes its place in the order."""
        m = self.clock
        m.ticks += 1
        page.last_use = m.ticks
        self.push(page)

    def _stamp(self, pages: list["Page"]) -> tuple[list, range]:
        """Mark ``pages`` used, in order, and give each the next stamp: (their keys now,
        their stamps)."""
        m = self.clock
        t = m.ticks
        for p in pages:
            t += 1
            p.last_use = t
        m.ticks = t
        n = self.n
        ns = range(n + 1, n + 1 + len(pages))
        self.n = n + len(pages)
        self.stamps.update(zip(pages, ns))
        return self.policy.keys(pages, m.clock), ns

    def touch_many(self, pages: list["Page"]) -> None:
        """``touch`` each page, in order (a batch in one go: a large one is heapified
        with the rest rather than pushed entry by entry)."""
        keys, ns = self._stamp(pages)
        entries = list(zip(keys, ns, pages))
        floor = self.floor
        if floor is not None:  # (split in C: the floor's to the fifo, in order)
            self.fifo.extend(compress(entries, map(eq, keys, repeat(floor))))
            entries = list(compress(entries, map(ne, keys, repeat(floor))))
        self._add(entries)

    def _add(self, entries: list) -> None:
        """Put ``entries`` in the heap: a large batch heapified with the rest, a small one
        pushed entry by entry."""
        heap = self.heap
        if len(entries) * 8 > len(heap):
            heap.extend(entries)
            heapify(heap)
        else:
            for e in entries:
                heappush(heap, e)

    def used(self, page: "Page", tier: Any) -> None:
        """A turn uses ``page``: while it is in the index, its key may change."""
        if self.rekey and tier.index_contains(page):
            self.push(page)

    def missing(self, pages: Iterable["Page"]) -> list["Page"]:
        entries = {(id(e[2]), e[1]) for e in self.entries()}
        stamps = self.stamps
        return [p for p in pages if (id(p), stamps.get(p)) not in entries]

    def push(self, page: "Page") -> None:
        """(Re)place ``page`` in the order by its key now (its recency unchanged)."""
        self.n += 1
        self.stamps[page] = self.n
        e = (self.policy.key(page, self.clock.clock), self.n, page)
        if self.floor is not None and e[0] == self.floor:
            self.fifo.append(e)
        else:
            heappush(self.heap, e)

    def entries(self) -> list[tuple[Any, int, "Page"]]:
        """Every entry held, counting or not (for the audit)."""
        return [*self.heap, *self.fifo, *self.taken]

    def _put_back(self, indexed: Any) -> None:
        """The last walk's entries that still count go back into the heap."""
        stamps, heap, dropped = self.stamps, self.heap, Phase.DROPPED
        for e in self.taken:
            page = e[2]
            if page.phase is dropped:  # dead (most victims): none of its entries counts
                stamps.pop(page, None)
            elif stamps.get(page) == e[1]:
                if indexed(page):
                    heappush(heap, e)
                else:
                    del stamps[page]
        self.taken = []

    def _live(self, indexed: Any) -> list[tuple[Any, int, "Page"]]:
        """The entries that count (``indexed(page)``: still in the index), their keys
        recomputed unless the policy's keys are static; the fifo's among them (the caller
        makes the list its heap)."""
        stamps = self.stamps
        if self.taken:
            self._put_back(indexed)
        live = [e for e in self.heap if stamps.get(e[2]) == e[1] and indexed(e[2])]
        if self.fifo:
            live += [e for e in self.fifo if stamps.get(e[2]) == e[1] and indexed(e[2])]
            self.fifo.clear()
        if not self.policy.static_keys:
            key, clock, floor = self.policy.key, self.clock.clock, self.floor
            live = [e if e[0] == floor else (key(e[2], clock), e[1], e[2]) for e in live]
        return live

    def compact(self, indexed: Any) -> None:
        """Forget entries that no longer count (the fifo's stay in it, in order)."""
        stamps = self.stamps
        if self.taken:
            self._put_back(indexed)
        fifo = deque([e for e in self.fifo if stamps.get(e[2]) == e[1] and indexed(e[2])])
        self.fifo = deque()
        live = self._live(indexed)
        heapify(live)
        self.heap, self.fifo = live, fifo
        self.stamps = {e[2]: e[1] for e in live}
        self.stamps.update([(e[2], e[1]) for e in fifo])

    def walk(self, indexed: Any, size: int, want: int = 1) -> Iterator["Page"]:
        """The candidates in order (``indexed``: the tier's index test; ``size``: its
        size, to decide on compaction; ``want``: how many the caller expects to take).
        When that is a good part of the tier, the live entries are sorted once (a sorted
        list is a heap) and read in place: nothing is popped, nothing goes back."""
        if want >= 64 and want * 4 >= size:
            live = self._live(indexed)
            live.sort()
            self.heap = live
            for e in live:
                yield e[2]
            return
        if self.taken:
            self._put_back(indexed)
        if len(self.heap) + len(self.fifo) > 3 * size + 64:
            self.compact(indexed)
        heap, stamps, fifo = self.heap, self.stamps, self.fifo
        key = None if self.policy.static_keys else self.policy.key
        clock = self.clock.clock
        taken: list[tuple[Any, int, "Page"]] = []
        switch = max(64, size // 4)  # a walk this long reads the rest sorted in place
        floor = self.floor
        stamp_of, pop, take, popleft = stamps.get, heappop, taken.append, fifo.popleft  # (hot)
        try:
            while heap or fifo:
                if len(taken) == switch:
                    # what was taken sorts before all the rest: together, sorted, a heap
                    rest = self._live(indexed)
                    rest.sort()
                    self.heap = taken + rest
                    taken = []
                    for e in rest:
                        yield e[2]
                    return
                # the fifo's front or the heap's top, whichever comes first (stamps differ)
                if fifo and (not heap or fifo[0] < heap[0]):
                    e = popleft()
                    page = e[2]
                    if stamp_of(page) != e[1]:
                        continue  # superseded by a later entry
                    if not indexed(page):
                        del stamps[page]
                        continue  # left the index
                    take(e)  # (the floor key: it keeps it, nothing to check)
                    yield page
                    continue
                e = pop(heap)
                page = e[2]
                if stamp_of(page) != e[1]:
                    continue  # superseded by a later entry
                if not indexed(page):
                    del stamps[page]
                    continue  # left the index (a later entry comes if it returns)
                if key is not None and e[0] != floor:
                    now = key(page, clock)
                    if now != e[0] and e[0] < now:
                        self.n += 1
                        stamps[page] = self.n
                        heappush(heap, (now, self.n, page))
                        continue
                take(e)
                yield page
        finally:
            self.taken = taken  # back at the next walk: the victims will have left by then
