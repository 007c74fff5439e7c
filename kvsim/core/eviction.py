"""Eviction mechanics shared by every plan: victim selection, slot reservation, rollback.

``_select`` is a dry run: the victims each tier must give up so that ``n`` slots are
available in a tier (lowest priority, then least recently used, first; in the last tier
only droppable leaves, children before parents), and the tier each tier's victims go to
(the nearest colder one that can take them), or None, changing nothing. ``_reserve``
applies a selection, deepest tier first: last-tier victims drop; others are pinned
(MOVING) and get a destination slot in their colder tier; the slots they vacate are handed over
to the pages coming in (``PlanRecord.handed`` remembers which evict batch each tier's incoming
pages depend on). ``_settle`` puts a page where its owners say it belongs. With a placement policy other
than the default, victims may drop or go further than the next colder tier
(``kvsim.core.placing``).
"""

from __future__ import annotations

from itertools import filterfalse, islice
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from kvsim.core.copies import take_back_split
from kvsim.core.pages import Page
from kvsim.core.placing import Placing
from kvsim.core.plan import Batch, BatchKind, PlanKind
from kvsim.core.types import Phase

if TYPE_CHECKING:
    from kvsim.core.policy.base import EvictionPolicy
    from kvsim.core.request import Request
    from kvsim.core.stats import Counters
    from kvsim.core.tiers import Tier
    from kvsim.core.tree import PrefixTree


class PlanRecord:
    """What the manager remembers about a plan in flight, from planning to ``complete``
    (internal to the core: the engine sees only the Plan)."""

    __slots__ = ("kind", "req", "moves", "batch_info", "handed", "handed_sets", "pending",
                 "cow", "quota", "target")

    def __init__(self, kind: PlanKind, req: "Request | None"):
        self.kind = kind
        self.req = req
        self.moves: list[tuple[list[Page], list[int]]] = []  # per batch: pages, dst slots
        self.batch_info: list[tuple[BatchKind, int]] = []     # per batch: kind, dst tier pos
        self.handed: dict[int, list[int]] = {}  # tier pos -> evict batches whose sources it reuses
        self.pending: list[Page] = []     # grow: new pages, phase PENDING
        self.cow: Page | None = None      # grow: the private copy of a shared last page
        self.quota: tuple[int, int] | None = None  # (tier pos, old capacity)
        self.target = 0                   # grow: tokens the request covers once committed
        self.handed_sets: dict[int, dict[int, int]] = {}  # tier pos -> handed slot -> batch


class Selection:
    """A dry run's result: ``victims[t]`` leave tier t for tier ``dest[t]`` (dropped from
    the last tier)."""

    __slots__ = ("victims", "dest", "reclaim", "taking", "drops", "far")

    def __init__(self, ntiers: int, placing: bool = False):
        self.victims: list[list[Page]] = [[] for _ in range(ntiers)]
        self.dest: list[int] = [0] * ntiers
        self.reclaim: list[Page] = []  # the disk tier's retained copies to free
        self.taking: set[Page] = set()  # victims that take their disk copy back
        # with a placement policy (kvsim.core.placing): per tier, its victims dropped
        # where they are, and those that go to the last tier rather than to ``dest``
        self.drops: list[list[Page]] | None = [[] for _ in range(ntiers)] if placing else None
        self.far: list[list[Page]] | None = [[] for _ in range(ntiers)] if placing else None


class Eviction(Placing):
    """Mixin of TierManager (uses its tiers, tree, counters, live pages and page size)."""

    # set by TierManager.__init__; declared here for the type checker (and mypyc)
    tiers: list[Tier]
    tree: PrefixTree
    counters: Counters
    _pages: dict[int, Page]
    page_bytes: int
    policy: EvictionPolicy
    policies: list[EvictionPolicy]
    _hooked: list[EvictionPolicy]
    _fast: bool
    clock: int
    ticks: int

    def _add_batch(self, rec: PlanRecord, batches: list[Batch], kind: BatchKind, src: int, dst: int,
                   pages: list[Page], dsts: list[int], stage: int) -> int:
        # (list comprehensions over slotted attributes are the fastest way to gather them)
        # (the fields by position: keywords bind more slowly; ``dsts`` is shared with
        # rec.moves: neither changes it after)
        tiers = self.tiers
        batches.append(Batch(kind, tiers[src].level, tiers[dst].level,
                             [p.slot for p in pages], dsts, [p.tag for p in pages],
                             self.page_bytes, stage))
        rec.moves.append((pages, dsts))
        rec.batch_info.append((kind, dst))
        return len(batches) - 1

    def _select(self, pos: int, n: int, exclude: set | None, use_free: bool = True
                ) -> "Selection | None":
        """Dry run of making ``n`` slots available in tier ``pos`` (with ``use_free`` False:
        of moving ``n`` pages out of it): the victims per tier and where each tier's
        victims go, or None if impossible. Changes nothing.

        Victims go to the nearest colder tier that can take them (free slots, or room it
        makes the same way), so a full tier is skipped rather than blocking: e.g. GPU pages
        go straight to disk while the host tier is full of pages a resume is bringing up."""
        sel = Selection(len(self.tiers), self._placing)
        return sel if self._select_at(pos, n, exclude, use_free, sel) else None

    def _select_at(self, t: int, n: int, exclude: set | None, use_free: bool,
                   sel: "Selection") -> bool:
        tier = self.tiers[t]
        k = n - min(n, tier.free) if use_free else n
        if k == 0:
            return True
        if tier.is_last:
            if tier.copies:  # (the disk tier with retained copies)
                got = self._pick_disk(tier, k, exclude, sel.taking)
                if got is None:
                    return False
                sel.victims[t], sel.reclaim = got
                return True
            victims = self._pick_leaves(tier, k, exclude)
            if victims is None:
                return False
            sel.victims[t] = victims
            return True
        victims = self._pick(tier, k, exclude)
        if victims is None:
            return False
        start = t + 1
        if self._placing:  # a placement policy: some victims drop or go further
            victims, start, placed = self._place_victims(t, victims, exclude, sel)
            if placed is not None:
                return placed
        disk = self._disk_pos
        for d in range(start, len(self.tiers)):
            need = len(victims)
            take: list[Page] = []
            if d == disk and self._retained:  # ready copies are taken back, not written
                take = take_back_split(victims)[0]
                need = len(victims) - len(take)
                sel.taking.update(take)
            if self._select_at(d, need, exclude, True, sel):
                sel.victims[t] = victims
                sel.dest[t] = d
                return True
            sel.taking.difference_update(take)
            if self._placing:
                self._forget(sel, d)
                continue
            for j in range(d, len(self.tiers)):  # forget the branch that failed
                sel.victims[j] = []
            if d == disk:
                sel.reclaim = []
        return False

    def _candidates(self, tier: "Tier", want: int) -> Iterator[Page]:
        """The tier's eviction candidates in the policy's order (``want``: how many the
        caller expects to take): LRU walks the tier's recency index; another policy's
        order is kept by ``tier.order``."""
        order = tier.order
        if order is None:
            return tier.candidates()
        return order.walk(tier.index_contains, tier.index_size(), want)

    def _pick(self, tier: "Tier", k: int, exclude: set | None) -> list[Page] | None:
        """The ``k`` first eviction candidates of a tier (not in ``exclude``), or None."""
        cands: Iterator[Page] = tier.candidates() if self._fast else self._candidates(tier, k)
        if exclude:
            cands = filterfalse(exclude.__contains__, cands)
        if self._wt_reading:
            reading = self._host_reading(tier)
            if reading is not None:
                cands = filterfalse(reading, cands)
        victims = list(islice(cands, k))
        return victims if len(victims) == k else None

    def _pick_leaves(self, tier: "Tier", k: int, exclude: set | None, partial: bool = False
                     ) -> list[Page] | None:
        """``k`` droppable pages of the last tier, leaves only (with ``partial``, as many
        as there are up to ``k``, rather than None when fewer). A candidate skipped for its
        children becomes a leaf once they are picked: it is picked right after its last
        child (it came earlier in the order than the candidate being looked at), so
        children always drop before parents, whatever the policy's order."""
        victims: list[Page] = []
        # (pages, not pids, as keys: a page hashes by identity, a pid would be boxed anew)
        gone: dict[Page, int] = {}  # page -> its children picked so far
        skipped: set[Page] = set()
        cands: Iterator[Page] = tier.candidates() if self._fast else self._candidates(tier, k)
        if exclude:
            cands = filterfalse(exclude.__contains__, cands)
        for p in cands:
            if p.nchildren and p.nchildren - gone.get(p, 0) > 0:
                skipped.add(p)
                continue
            while True:
                victims.append(p)
                if len(victims) == k:
                    return victims
                q = p.parent
                if q is None:
                    break
                n = gone[q] = gone.get(q, 0) + 1
                if q not in skipped or q.nchildren != n:
                    break
                skipped.discard(q)
                p = q
        return victims if partial else None

    def _reserve(self, pos: int, n: int, sel: "Selection", rec: PlanRecord,
                 batches: list[Batch], incoming: bool = True) -> list[int]:
        """Apply a selection: ``n`` slots of tier ``pos`` for incoming pages (victims' slots
        handed over after free ones). Evictions are added to ``batches``, deepest first."""
        if sel.drops is not None:
            return self._reserve_placed(pos, n, sel, rec, batches, incoming)
        tier = self.tiers[pos]
        victims = sel.victims[pos]
        reclaim = sel.reclaim if tier.is_last else []
        freed = len(victims) + len(reclaim)
        slots = tier.alloc_many(n - freed) if incoming else []
        if not freed:
            return slots
        if victims and not self._fast:
            self.policies[pos].on_evict(victims, self.clock)
        if tier.is_last:
            if victims:
                self._drop_each(tier, victims)
            if reclaim:
                self._reclaim(reclaim)
                sel.reclaim = []
            if incoming:
                slots.extend(tier.alloc_many(freed))
            return slots
        d = sel.dest[pos]
        take, write = take_back_split(victims) if d == self._disk_pos and sel.taking else ([], victims)
        tier.index_discard_each(victims)
        moving = Phase.MOVING
        for v in victims:
            v.phase = moving
        stage = len(self.tiers) - 2 - pos  # deeper sources first: their slots are reused above
        handed = []
        if write:
            dst = self._reserve(d, len(write), sel, rec, batches)
            handed.append(self._add_batch(rec, batches, BatchKind.EVICT, pos, d, write, dst, stage))
        if take:  # onto their retained copies: no longer reclaimable
            copies = self.tiers[d].copies
            for v in take:
                del copies[v]
            handed.append(self._add_batch(rec, batches, BatchKind.TAKEBACK, pos, d, take,
                                          [v.copy for v in take], stage))
        if incoming:
            rec.handed[pos] = handed
            slots.extend([v.slot for v in write])
            slots.extend([v.slot for v in take])
        return slots

    def _rollback_slot(self, rec: PlanRecord, batches: Sequence[Batch], oks: list[bool], pos: int,
                       slot: int) -> None:
        """Give back a destination slot of a batch that did not commit."""
        bis = rec.handed.get(pos)
        if bis is not None:
            hs = rec.handed_sets.get(pos)
            if hs is None:
                hs = rec.handed_sets[pos] = {s: bi for bi in bis for s in batches[bi].src_slots}
            bi = hs.get(slot)
            if bi is not None:
                if oks[bi]:
                    self.tiers[pos].release(slot)  # its old owner left: the slot is free
                return  # its old owner failed to leave and still owns it
        self.tiers[pos].release(slot)

    def _drop_each(self, tier: "Tier", pages: list[Page]) -> None:
        """Drop each page of ``tier`` in order (children before parents): out of the index
        and the tree, its slot released, dead."""
        tier.index_discard_each(pages)
        self.tree.remove_each(pages)
        tier.release_many([p.slot for p in pages])
        live = self._pages
        dropped = Phase.DROPPED
        for p in pages:
            p.phase = dropped
            del live[p.pid]
        self.counters.dropped_pages[tier.level] += len(pages)

    def _arrive(self, tier: "Tier", pages: list[Page], dsts: list[int], settle: bool) -> None:
        """The pages of a committed batch are now resident in ``tier`` at ``dsts``. With
        ``settle`` (an eviction) each then settles as ``_settle(p, touch=True)`` would, in
        order, the common case inline: it becomes the tier's most recently used. (A page
        that was moving is in no index, so none is already in this tier's.)"""
        pos = tier.index_pos
        resident = Phase.RESIDENT
        for p, d in zip(pages, dsts):
            p.tier = pos
            p.slot = d
            p.phase = resident
        if not settle:
            return
        # (settling a page reads and changes only that page and the tier's index and slots,
        # so it may follow the pass above; in the index a page appends at the recent end:
        # it was in none, so there is no entry of it to move. The other cases enter no
        # index, so another policy's order hears of the pages that did, in order, at once)
        lru = tier.lru
        last = tier.is_last
        order = tier.order
        added: list[Page] = []
        for p in pages:
            if p.locks or not (p.holds or p.in_tree) or (last and p.holds):
                self._settle(p, touch=True)
                continue
            bucket = lru.get(p.priority)
            if bucket is None:
                bucket = tier.new_bucket(p.priority)
            bucket[p] = None
            if order is not None:
                added.append(p)
        if order is not None and added:
            order.touch_many(added)

    def _settle_touched(self, pages: Iterable[Page]) -> None:
        """``_settle(p, touch=True)`` for each page in order, the common case (resident,
        unlocked, still referred to, and not a held page of the last tier: it becomes its
        tier's most recently used) inline. (The other cases enter no index: another
        policy's orders hear of the touched pages, in order, per tier at the end.)"""
        tiers = self.tiers
        resident = Phase.RESIDENT
        touched: list[list[Page]] | None = None if self._fast else [[] for _ in tiers]
        for p in pages:
            if p.phase is resident and not p.locks and (p.holds or p.in_tree):
                tier = tiers[p.tier]
                if not (p.holds and tier.is_last):
                    bucket = tier.lru.get(p.priority)
                    if bucket is None:
                        bucket = tier.new_bucket(p.priority)
                    else:
                        bucket.pop(p, None)
                    bucket[p] = None
                    if touched is not None:
                        touched[p.tier].append(p)
                    continue
            self._settle(p, touch=True)
        if touched is not None:
            for tier, ps in zip(tiers, touched):
                if ps and tier.order is not None:
                    tier.order.touch_many(ps)

    def _settle(self, page: Page, touch: bool) -> None:
        """Put a resident page where its owners say it belongs: out of the index if locked,
        freed if nobody refers to it, else in its tier's index (moved to the most recent
        end when ``touch``). Pages in flight are settled when their plan completes."""
        if page.phase is not Phase.RESIDENT:
            return
        tier = self.tiers[page.tier]
        if page.locks:
            tier.index_discard(page)
        elif not page.holds and not page.in_tree:
            tier.index_discard(page)
            if page.copy >= 0:
                self._drop_copy(page)
            if self._wt_reading:
                self._release_src(tier, [page])
            else:
                tier.release(page.slot)
            page.phase = Phase.FREED
            del self._pages[page.pid]
            self.counters.freed_pages[tier.level] += 1
        elif page.holds and tier.is_last:
            tier.index_discard(page)
        elif touch:
            tier.index_touch(page)
        elif not tier.index_contains(page):
            tier.index_add(page)
