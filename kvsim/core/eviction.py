"""Eviction mechanics shared by every plan: victim selection, slot reservation, rollback.

``_select`` is a dry run: the victims each tier must give up so that ``n`` slots are
available in a tier (by the tier's eviction order; in the last tier only droppable
leaves, children before parents), and the tier each tier's victims go to (the nearest
colder one that can take them), or None, changing nothing; a placement policy may also
drop a victim or send it further (``kvsim.core.destinations``). ``_reserve`` applies a
selection, deepest tier first: dropped pages leave at once; the others are pinned
(MOVING) with a destination slot in their colder tier (or take their retained disk copy
back); the slots they vacate go to the pages coming in (``PlanRecord.handed``).
``_settle`` puts a page where its owners say it belongs.
"""
from __future__ import annotations

from itertools import filterfalse, islice
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from kvsim.core.retained import Copies, take_back_split
from kvsim.core.pages import Page
from kvsim.core.destinations import place_victims
from kvsim.core.plan import Batch, BatchKind, PlanKind
from kvsim.core.types import Phase

if TYPE_CHECKING:
    from kvsim.core.policy.base import EvictionPolicy
    from kvsim.core.policy.placement import PlacementPolicy
    from kvsim.core.request import Request
    from kvsim.core.spec import Level
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
    """A dry run's result, per tier t: ``victims[t]`` leave tier t for tier ``dest[t]``
    (dropped from the last tier). With a placement policy (``kvsim.core.destinations``), also
    ``drops[t]``, dropped where they are, and ``far[t]``, sent to the last tier rather
    than to ``dest[t]`` (tiers absent: none)."""

    __slots__ = ("victims", "dest", "reclaim", "taking", "drops", "far")

    def __init__(self, ntiers: int):
        self.victims: list[list[Page]] = [[] for _ in range(ntiers)]
        self.dest: list[int] = [0] * ntiers
        self.reclaim: list[Page] = []  # the disk tier's retained copies to free
        self.taking: set[Page] = set()  # victims that take their disk copy back
        self.drops: dict[int, list[Page]] = {}
        self.far: dict[int, list[Page]] = {}

    def forget(self, start: int, disk: int) -> None:
        """Forget the selection of tiers ``start`` on (a branch that failed; ``disk``: the
        disk tier's position, -1 if none)."""
        for j in range(start, len(self.victims)):
            self.victims[j] = []
            self.dest[j] = 0
            self.drops.pop(j, None)
            self.far.pop(j, None)
        if start <= disk:
            self.reclaim = []


class Eviction(Copies):
    """Mixin of TierManager (uses its tiers, tree, counters, live pages, page size and
    placement policy)."""

    # set by TierManager.__init__; declared here for the type checker (and mypyc)
    tiers: list[Tier]
    tree: PrefixTree
    counters: Counters
    _pages: dict[int, Page]
    page_bytes: int
    policy: EvictionPolicy
    policies: list[EvictionPolicy]
    _hooked: list[EvictionPolicy]
    placement: PlacementPolicy
    _placing: bool
    _levels: list[Level]
    _fast: bool
    clock: int
    ticks: int
    dropped: list[Page] | None  # the pages dropped (cache.remote collects them), or None

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
        sel = Selection(len(self.tiers))
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
            drops, near, far = place_victims(self.placement, t, victims, self._levels,
                                             self.clock)
            sel.drops[t] = drops
            if not near and not far:
                sel.victims[t] = []
                return True
            if far and self._select_far(t, near, far, exclude, sel):
                return True
            if far:  # the next tier cannot take them, or the last the far ones: all go further
                victims = near + far
                start = t + 2
            else:
                victims = near
        disk = self._disk_pos
        for d in range(start, len(self.tiers)):
            need = len(victims)
            take: list[Page] = []
            if d == disk and self._retained:  # ready copies are taken back, not written
                take = take_back_split(victims, self.wt_take_back)[0]
                need = len(victims) - len(take)
                sel.taking.update(take)
            if self._select_at(d, need, exclude, True, sel):
                sel.victims[t] = victims
                sel.dest[t] = d
                return True
            sel.taking.difference_update(take)
            sel.forget(d, disk)  # the branch that failed
        return False

    def _select_far(self, t: int, near: list[Page], far: list[Page], exclude: set | None,
                    sel: Selection) -> bool:
        """Select ``near`` going to tier t + 1 and ``far`` to the last tier (the disk),
        which also takes the victims tier t + 1 sends it. False, the branch forgotten,
        when either cannot take them."""
        h = t + 1
        last = len(self.tiers) - 1
        disk = self._disk_pos
        if near and not self._select_at(h, len(near), exclude, True, sel):
            sel.forget(h, disk)
            return False
        need = 0
        if sel.dest[h] == last:  # the host's own victims that the disk must take in
            need = sum(1 for v in sel.victims[h] if v not in sel.taking)
        take = take_back_split(far, self.wt_take_back)[0] if last == disk and self._retained else []
        sel.taking.update(take)
        if not self._select_at(last, need + len(far) - len(take), exclude, True, sel):
            sel.taking.difference_update(take)
            sel.forget(h, disk)
            return False
        sel.victims[t] = near
        sel.dest[t] = h
        sel.far[t] = far
        return True

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

    def _reserve(self, pos: int, n: int, sel: Selection, rec: PlanRecord,
                 batches: list[Batch], incoming: bool = True) -> list[int]:
        """Apply a selection to tier ``pos``, whatever the placement decided: ``n`` of its
        slots for incoming pages (unless not ``incoming``), free ones first, then those
        the leaving pages vacate, in this order:
        - dropped: the last tier's victims (and reclaimed copies), or the pages a placement
          dropped; freed at once. The last tier's are applied by its first reservation in
          a plan (a placement may reserve it twice: for the host's victims and for pages
          placed past the host);
        - moved: the victims to ``sel.dest[pos]``, the pages placed far to the last tier;
          pinned (MOVING), with a destination slot reserved there (recursively: evict
          batches are added deepest first), or onto their ready disk copies (TAKEBACK)."""
        tier = self.tiers[pos]
        last = len(self.tiers) - 1
        if pos == last:  # its victims drop
            drops = sel.victims[pos]
            reclaim = sel.reclaim
            near: list[Page] = []
            far: list[Page] = []
        else:
            drops = sel.drops.get(pos, [])
            reclaim = []
            near = sel.victims[pos]
            far = sel.far.get(pos, [])
        gone = len(drops) + len(reclaim)  # slots freed where they are
        moved = len(near) + len(far)
        freed = gone + moved
        slots = tier.alloc_many(n - freed) if incoming and n > freed else []
        if not freed:
            return slots
        if not self._fast:
            leaving = drops + near + far if drops or far else near
            if leaving:
                self.policies[pos].on_evict(leaving, self.clock)
                if tier.order is not None:
                    tier.order.evicted(leaving)
        if gone:
            if drops:
                self._drop_each(tier, drops)
            if reclaim:
                self._reclaim(reclaim)
            if pos == last:  # applied: a second reservation of it only allocates
                sel.victims[pos] = []
                sel.reclaim = []
            rest = n - len(slots) - moved  # the rest but the movers' slots, from the pool
            if incoming and rest > 0:
                slots.extend(tier.alloc_many(rest))
        if not near and not far:
            return slots
        stage = len(self.tiers) - 2 - pos  # deeper sources first: their slots are reused above
        moving = Phase.MOVING
        handed: list[int] = []
        for d, group in ((sel.dest[pos], near), (last, far)):
            if not group:
                continue
            take, write = (take_back_split(group, self.wt_take_back)
                           if d == self._disk_pos and sel.taking else ([], group))
            tier.index_discard_each(group)
            for v in group:
                v.phase = moving
            if write:
                dst = self._reserve(d, len(write), sel, rec, batches)
                handed.append(self._add_batch(rec, batches, BatchKind.EVICT, pos, d, write,
                                              dst, stage))
            if take:  # onto their retained copies: no longer reclaimable
                self._take_copies(take)
                handed.append(self._add_batch(rec, batches, BatchKind.TAKEBACK, pos, d, take,
                                              [v.copy for v in take], stage))
            if incoming:
                slots.extend([v.slot for v in write])
                slots.extend([v.slot for v in take])
        if incoming:
            rec.handed[pos] = handed
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
        """Drop each page of ``tier`` in order (children first): out of index and tree, freed."""
        tier.index_discard_each(pages)
        self.tree.remove_each(pages)
        tier.release_many([p.slot for p in pages])
        live = self._pages
        dropped = Phase.DROPPED
        for p in pages:
            p.phase = dropped
            del live[p.pid]
        self.counters.dropped_pages[tier.level] += len(pages)
        if self.dropped is not None:  # (a remote tier: the engine offers them to it)
            self.dropped.extend(pages)

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
            if tier.order is not None:
                tier.order.left((page,))
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
