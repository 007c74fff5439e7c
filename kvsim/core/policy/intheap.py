"""``IntHeapOrder``: ``HeapOrder`` for a policy whose keys are all ints (``int_keys``:
``belady``'s), kept with fewer and cheaper objects; ``order_for`` picks the order a
policy gets for a tier.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush
from itertools import compress, islice, repeat
from operator import eq, lshift, not_, or_
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from kvsim.core.policy.base import EvictionPolicy, HeapOrder, TierOrder
from kvsim.core.policy.queues import QueueOrder
from kvsim.core.types import Phase

if TYPE_CHECKING:
    from kvsim.core.pages import Page
    from kvsim.core.tiers import Tier


def order_for(policy: EvictionPolicy, clock: Any, tier: "Tier | None" = None) -> TierOrder:
    """The candidate order of ``tier`` under ``policy``: the policy's own queue state for
    it where it keeps one (``tier_queue``), else a heap of its keys: packed int entries
    where its keys are all ints (``int_keys``), else the generic one (the same order)."""
    if tier is not None:
        queue = getattr(policy, "tier_queue", None)
        q = queue(tier) if queue is not None else None
        if q is not None:
            return QueueOrder(q, clock)
    return IntHeapOrder(policy, clock) if getattr(policy, "int_keys", False) else HeapOrder(policy, clock)


#: ``IntHeapOrder``: an entry is ``key << STAMP_BITS | stamp``
STAMP_BITS = 40
_STAMP = (1 << STAMP_BITS) - 1


class IntHeapOrder(HeapOrder):
    """``HeapOrder`` for a policy whose keys are ints (``int_keys``: ``belady``'s): the
    same order, kept with fewer and cheaper objects.

    A heap entry is one int, ``key << STAMP_BITS | stamp``, which sorts as the (key,
    stamp) pair does (a stamp is below 2 ** STAMP_BITS); ``pages`` resolves the stamp of
    a heap entry (and of a taken one) to its page. An int is no container: the cyclic
    garbage collector neither counts it towards its next collection nor walks it in one,
    as it does a tuple entry holding its page for as long as that waits in the heap (tens
    of thousands at a time in a large tier), and ints compare faster as the heap sifts.

    The floor key's entries are two deques, ``fifo`` (their stamps) and ``fifo_pages``.
    When the heap's top sorts after the floor key as a walk starts (the common case: the
    heap holds a floor entry only after a compaction or a sorted read), the fifo comes
    first whole, and the walk reads it in place, its entries checked in C, rather than
    popping them: the next walk (or whatever reads the order first) settles what it
    passed, ``mark`` the stamp of the last, as ``HeapOrder`` would have, the entries that
    no longer count dropped and those it yielded put back (left at the fifo's front,
    where they sort). The candidates, and what the order holds between walks, are
    ``HeapOrder``'s."""

    __slots__ = ("pages", "fifo_pages", "mark")

    def __init__(self, policy: EvictionPolicy, clock: Any):
        super().__init__(policy, clock)
        self.heap: list[int] = []  # type: ignore[assignment]
        self.fifo: deque[int] = deque()  # type: ignore[assignment]
        self.fifo_pages: deque["Page"] = deque()  # the pages of ``fifo``'s stamps
        self.taken: list[int] = []  # type: ignore[assignment]
        self.pages: dict[int, "Page"] = {}  # stamp -> page, of every heap or taken entry
        self.mark = 0  # the fifo's front up to this stamp was read by the last walk

    def _stamps_left(self) -> None:
        if self.n > _STAMP:  # (a trillion: far beyond any replay)
            raise OverflowError(f"eviction order: more than {_STAMP} entries pushed")

    def touch_many(self, pages: list["Page"]) -> None:
        keys, ns = self._stamp(pages)
        self._stamps_left()
        floor = self.floor
        floored = 0 if floor is None else keys.count(floor)
        if floored == len(keys):  # all to the fifo (the common case: never used again)
            self.fifo.extend(ns)
            self.fifo_pages.extend(pages)
            return
        if floored:  # (split in C: the floor's to the fifo, in order)
            at_floor = list(map(eq, keys, repeat(floor)))
            self.fifo.extend(compress(ns, at_floor))
            self.fifo_pages.extend(compress(pages, at_floor))
            rest = list(map(not_, at_floor))
            ns_rest: Iterable[int] = list(compress(ns, rest))
            self.pages.update(zip(ns_rest, compress(pages, rest)))
            entries = list(map(or_, map(lshift, compress(keys, rest), repeat(STAMP_BITS)),
                               ns_rest))
        else:
            self.pages.update(zip(ns, pages))
            entries = list(map(or_, map(lshift, keys, repeat(STAMP_BITS)), ns))
        self._add(entries)

    def push(self, page: "Page") -> None:
        self.n += 1
        n = self.n
        self._stamps_left()
        self.stamps[page] = n
        k = self.policy.key(page, self.clock.clock)
        if self.floor is not None and k == self.floor:
            self.fifo.append(n)
            self.fifo_pages.append(page)
        else:
            self.pages[n] = page
            heappush(self.heap, k << STAMP_BITS | n)

    def entries(self) -> list[tuple[Any, int, "Page"]]:
        """Every entry held, counting or not, as (key, stamp, page) (for the audit)."""
        pages, floor = self.pages, self.floor
        return [*((e >> STAMP_BITS, e & _STAMP, pages[e & _STAMP]) for e in self.heap),
                *((floor, s, p) for s, p in zip(self.fifo, self.fifo_pages)),
                *((e >> STAMP_BITS, e & _STAMP, pages[e & _STAMP]) for e in self.taken)]

    def _put_back(self, indexed: Any) -> None:
        """The last walk's entries that still count go back: those it popped into the
        heap, those it read in place stay at the fifo's front; the others are dropped."""
        stamps, heap, pages, dropped = self.stamps, self.heap, self.pages, Phase.DROPPED
        if self.mark:
            fifo, fifo_pages, mark = self.fifo, self.fifo_pages, self.mark
            self.mark = 0
            keep: list[int] = []
            keep_pages: list["Page"] = []
            while fifo and fifo[0] <= mark:
                s = fifo.popleft()
                page = fifo_pages.popleft()
                if stamps.get(page) != s:
                    continue  # superseded by a later entry
                if page.phase is dropped:
                    del stamps[page]
                elif indexed(page):
                    keep.append(s)
                    keep_pages.append(page)
                else:
                    del stamps[page]
            fifo.extendleft(reversed(keep))
            fifo_pages.extendleft(reversed(keep_pages))
        for e in self.taken:
            s = e & _STAMP
            page = pages[s]
            if page.phase is dropped:  # dead (most victims): none of its entries counts
                stamps.pop(page, None)
            elif stamps.get(page) == s:
                if indexed(page):
                    heappush(heap, e)
                    continue
                del stamps[page]
            del pages[s]  # (an entry that no longer counts)
        self.taken = []

    def _live(self, indexed: Any) -> list[int]:  # type: ignore[override]
        """The entries that count, as ``HeapOrder._live``, and ``pages`` of the fifo's
        among them (the caller makes the list its heap, and keeps ``pages`` of what it
        holds: ``_keep``)."""
        stamps, pages = self.stamps, self.pages
        if self.taken or self.mark:
            self._put_back(indexed)
        live = [e for e in self.heap
                if stamps.get(p := pages[(s := e & _STAMP)]) == s and indexed(p)]
        floor = self.floor
        if self.fifo:  # (a fifo only with a floor key)
            base = floor << STAMP_BITS  # type: ignore[operator]
            for s, p in zip(self.fifo, self.fifo_pages):
                if stamps.get(p) == s and indexed(p):
                    live.append(base | s)
                    pages[s] = p
            self.fifo.clear()
            self.fifo_pages.clear()
        if not self.policy.static_keys:
            key, clock = self.policy.key, self.clock.clock
            live = [e if e >> STAMP_BITS == floor
                    else key(pages[e & _STAMP], clock) << STAMP_BITS | (e & _STAMP) for e in live]
        return live

    def _keep(self, entries: list[int], pages: dict[int, "Page"]) -> None:
        """``pages`` of these entries only: the rest were dropped."""
        self.pages = {s: pages[s] for s in [e & _STAMP for e in entries]}

    def compact(self, indexed: Any) -> None:
        stamps = self.stamps
        if self.taken or self.mark:
            self._put_back(indexed)
        fifo, fifo_pages = self.fifo, self.fifo_pages
        # the fifo's entries that count, in order (checked in C, no object per entry)
        kept = list(filter(indexed, compress(fifo_pages, map(eq, map(stamps.get, fifo_pages),
                                                             fifo))))
        kept_stamps = list(map(stamps.__getitem__, kept))
        fifo.clear()
        fifo_pages.clear()
        live = self._live(indexed)
        heapify(live)
        self.heap = live
        fifo.extend(kept_stamps)
        fifo_pages.extend(kept)
        pages = self.pages
        held = [e & _STAMP for e in live]
        self.pages = dict(zip(held, map(pages.__getitem__, held)))
        self.stamps = dict(zip(self.pages.values(), held))
        self.stamps.update(zip(kept, kept_stamps))

    def _pop_read(self, upto: int, indexed: Any, taken: list[int], base: int) -> None:
        """Pop the fifo's front up to stamp ``upto``, read in place by the walk under way,
        as ``HeapOrder.walk`` pops it: the entries it yielded are taken, the others
        dropped."""
        fifo, fifo_pages, stamps, pages = self.fifo, self.fifo_pages, self.stamps, self.pages
        while fifo and fifo[0] <= upto:
            s = fifo.popleft()
            page = fifo_pages.popleft()
            if stamps.get(page) != s:
                continue  # superseded by a later entry
            if not indexed(page):
                del stamps[page]
                continue  # left the index
            pages[s] = page
            taken.append(base | s)

    def walk(self, indexed: Any, size: int, want: int = 1) -> Iterator["Page"]:
        if want >= 64 and want * 4 >= size:
            live = self._live(indexed)
            live.sort()
            self.heap = live
            self._keep(live, self.pages)
            pages = self.pages
            for e in live:
                yield pages[e & _STAMP]
            return
        if self.taken or self.mark:
            self._put_back(indexed)
        if len(self.heap) + len(self.fifo) > 3 * size + 64:
            self.compact(indexed)
        heap, stamps, fifo, fifo_pages, pages = (self.heap, self.stamps, self.fifo,
                                                 self.fifo_pages, self.pages)
        key = None if self.policy.static_keys else self.policy.key
        clock = self.clock.clock
        taken: list[int] = []
        switch = max(64, size // 4)  # a walk this long reads the rest sorted in place
        floor = self.floor
        base = 0 if floor is None else floor << STAMP_BITS  # a floor entry: base | stamp
        above = 0 if floor is None else (floor + 1) << STAMP_BITS  # other keys' entries
        stamp_of, pop, take = stamps.get, heappop, taken.append  # (hot)
        last = None  # the last candidate read in place from the fifo, not yet popped
        try:
            if fifo and (not heap or heap[0] >= above):
                # the whole fifo sorts first: its entries that count (still their page's
                # latest, the page indexed; checked in C), read in place
                ahead = filter(indexed, compress(fifo_pages,
                                                 map(eq, map(stamp_of, fifo_pages), fifo)))
                n = 0
                for page in islice(ahead, switch):
                    n += 1
                    last = page
                    yield page
                # more wanted: pop what was read (to its end, unless the walk is this long)
                upto = stamp_of(last) if n == switch else fifo[-1]  # type: ignore[arg-type]
                last = None
                self._pop_read(upto, indexed, taken, base)  # type: ignore[arg-type]
            while heap or fifo:
                if len(taken) == switch:
                    # what was taken sorts before all the rest: together, sorted, a heap
                    rest = self._live(indexed)
                    rest.sort()
                    self.heap = taken + rest
                    self._keep(self.heap, self.pages)
                    taken = []
                    pages = self.pages
                    for e in rest:
                        yield pages[e & _STAMP]
                    return
                # the fifo's front or the heap's top, whichever comes first (stamps differ)
                if fifo and (not heap or heap[0] >= above or base | fifo[0] < heap[0]):
                    s = fifo.popleft()
                    page = fifo_pages.popleft()
                    if stamp_of(page) != s:
                        continue  # superseded by a later entry
                    if not indexed(page):
                        del stamps[page]
                        continue  # left the index
                    pages[s] = page
                    take(base | s)  # (the floor key: it keeps it, nothing to check)
                    yield page
                    continue
                e = pop(heap)
                s = e & _STAMP
                page = pages[s]
                if stamp_of(page) != s:
                    del pages[s]
                    continue  # superseded by a later entry
                if not indexed(page):
                    del stamps[page], pages[s]
                    continue  # left the index (a later entry comes if it returns)
                if key is not None and (k := e >> STAMP_BITS) != floor:
                    now = key(page, clock)
                    if now != k and k < now:
                        self.n += 1
                        m = self.n
                        self._stamps_left()
                        stamps[page] = m
                        pages[m] = page
                        del pages[s]
                        heappush(heap, now << STAMP_BITS | m)
                        continue
                take(e)
                yield page
        finally:
            self.taken = taken  # back at the next walk: the victims will have left by then
            if last is not None:  # the walk stopped in the fifo read in place: the next
                self.mark = stamps[last]  # settles it up to its last candidate
