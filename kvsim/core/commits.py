"""Issuing and completing plans: the TierManager's second layer, below its lifecycle.

``set_quota`` and ``evict`` plan moves that belong to no request (``cap_tier`` shrinks a
tier whose host fill failed, moving nothing); ``complete(plan, ok)``
commits or rolls back any plan, batch by batch (a batch after a failed stage rolls back
whatever its flag); ``_issue`` registers a plan in flight and ``_refuse`` counts a
refusal. Victim selection and slot reservation are one layer further down
(``kvsim.core.eviction``). A mixin of TierManager in a single-inheritance chain
(``TierManager(Planning)``, ``Planning(Eviction)``), as the compiled build requires.
"""

from __future__ import annotations

from typing import Iterable, Sequence


from kvsim.core.errors import ConfigError, CoreError
from kvsim.core.eviction import Eviction, PlanRecord
from kvsim.core.pages import Page
from kvsim.core.plan import Batch, BatchKind, Plan, PlanKind, Refusal, RefusalReason
from kvsim.core.policy.base import EvictionPolicy
from kvsim.core.spec import Level
from kvsim.core.types import Phase, ReqState


class Planning(Eviction):
    """Mixin of TierManager (uses its tiers, counters, live pages, plans in flight)."""

    # set by TierManager.__init__; declared here for the type checker (and mypyc)
    _pos: dict[Level, int]
    _plans: dict[int, PlanRecord]
    _next_plan: int
    tokens_per_block: int

    def level_of(self, tier_pos: int) -> Level:
        return self.tiers[tier_pos].level

    def tier_pos(self, level: Level) -> int:
        try:
            return self._pos[Level(level)]
        except KeyError:
            raise CoreError(f"no {Level(level).name} tier configured") from None

    # == plans without a request ======================================================
    def set_quota(self, level: Level, quota_bytes: int) -> Plan | Refusal:
        """Change a tier's quota. Growing is immediate; shrinking evicts (held pages move
        colder, never drop) and refuses, changing nothing, if it cannot make room."""
        pos = self.tier_pos(level)
        tier = self.tiers[pos]
        field = f"{tier.level.name.lower()}.quota_bytes"
        if not isinstance(quota_bytes, int) or quota_bytes < self.page_bytes:
            raise ConfigError(field, quota_bytes, f"at least one page ({self.page_bytes} bytes)")
        cap = quota_bytes // self.page_bytes
        if cap > tier.limit:  # (the reserved range, or less where its host fill failed)
            raise ConfigError(field, quota_bytes,
                              f"at most the reserved {tier.limit * self.page_bytes} bytes")
        old = tier.capacity
        excess = tier.used - cap
        tier.capacity = cap
        rec = PlanRecord(PlanKind.QUOTA, None)
        rec.quota = (pos, old)
        batches: list[Batch] = []
        if excess > 0:
            sel = self._select(pos, excess, None)
            if sel is None:
                tier.capacity = old
                return self._refuse(RefusalReason.NO_ROOM, f"{excess} evictable pages in "
                                    f"the {tier.level.name} tier")
            self._reserve(pos, excess, sel, rec, batches, incoming=False)
        return self._issue(rec, PlanKind.QUOTA, batches)

    def cap_tier(self, level: Level, limit_slots: int) -> None:
        """Slots at or above ``limit_slots`` of a tier will never exist (its host fill
        failed there, ``kvsim.core.datapath.fill``): its capacity shrinks to that prefix and
        no later plan reserves a slot beyond it; pages already beyond it leave as their
        plans roll back. Immediate, moves nothing."""
        if isinstance(limit_slots, bool) or not isinstance(limit_slots, int) or limit_slots < 0:
            raise CoreError(f"cap_tier: limit_slots must be an integer >= 0, got {limit_slots!r}")
        self.tiers[self.tier_pos(level)].cap(limit_slots)

    def evict(self, level: Level, npages: int) -> Plan | Refusal:
        """Plan moving ``npages`` evictable pages out of a tier (one tier colder; dropped from
        the last tier), e.g. to keep free slots ahead of demand. Victims are chosen as for
        any eviction; refuses, changing nothing, if that many cannot leave."""
        pos = self.tier_pos(level)
        if npages <= 0:
            raise CoreError(f"evict: npages must be positive, got {npages}")
        sel = self._select(pos, npages, None, use_free=False)
        if sel is None:
            return self._refuse(RefusalReason.NO_ROOM, f"{npages} evictable pages in the "
                                f"{self.tiers[pos].level.name} tier")
        rec = PlanRecord(PlanKind.EVICT, None)
        batches: list[Batch] = []
        self._reserve(pos, npages, sel, rec, batches, incoming=False)
        return self._issue(rec, PlanKind.EVICT, batches)

    # == completion =====================================================================
    def complete(self, plan: Plan, ok: bool | Sequence[bool] = True) -> None:
        """Commit or roll back a plan. ``ok`` is one flag for all batches or one per batch.
        A batch after a failed stage is rolled back whatever its flag (it must not have run
        on a slot still owned by a page that failed to leave)."""
        if plan.kind is PlanKind.WRITE_THROUGH and plan.pid in self._wt:
            self._finish_write_through(plan, all(_flags(ok, 1)))
            return
        rec = self._plans.pop(plan.pid, None)
        if rec is None:
            raise CoreError(f"complete: plan {plan.pid} is not in flight")
        batches = plan.batches
        oks = _flags(ok, len(batches))
        if len(oks) != len(batches):
            raise CoreError(f"complete: {len(oks)} flags for {len(batches)} batches")
        if not batches:  # nothing moved (a grow into free slots, a resume of GPU pages)
            if rec.kind is PlanKind.RESUME:
                self._finish_resume(rec, plan, oks, True)
            elif rec.kind is PlanKind.GROW:
                self._finish_grow(rec, batches, oks, True)
            return
        failed_stage = min((b.stage for b, k in zip(batches, oks) if not k), default=None)
        if failed_stage is not None:
            oks = [k and b.stage < failed_stage for b, k in zip(batches, oks)]
        all_ok = all(oks)
        c = self.counters
        tiers = self.tiers
        for bi, (b, good) in enumerate(zip(batches, oks)):
            kind = b.kind
            if kind is BatchKind.COPY or kind is BatchKind.STATE:
                continue  # handled with the grow's pending pages, or the state's plan
            pages, dsts = rec.moves[bi]
            src_pos, dst_pos = self._pos[b.src], self._pos[b.dst]
            src_tier = tiers[src_pos]
            takeback = kind is BatchKind.TAKEBACK
            if good:
                handed = rec.handed.get(src_pos)
                if handed is None or bi not in handed:  # else the slots were handed over
                    if src_pos == self._disk_pos and self.keep_copy:
                        src_tier.release_many(self._keep_copies(pages, [p.slot for p in pages]))
                    elif self._wt_reading:
                        self._release_src(src_tier, pages)
                    else:
                        src_tier.release_many([p.slot for p in pages])
                evict = kind is BatchKind.EVICT or takeback
                n = len(pages)
                c.moved_pages[b.src][b.dst] += n
                if takeback:  # no bytes moved: the copy was there
                    if self._wt_taken:
                        self._end_take_back(pages, True)
                    c.copies_reused += n
                    self._retained -= n
                    for p in pages:
                        p.copy = -1
                        p.copy_ready = False
                else:
                    c.moved_bytes[b.src][b.dst] += n * b.page_bytes
                if evict:
                    c.evicted_pages[b.src] += n
                    if dst_pos == self._disk_pos and self._retained and not takeback:
                        for p in pages:  # a copy made ready meanwhile, or still written
                            if p.copy >= 0:
                                self._drop_copy(p)
                    elif kind is BatchKind.EVICT and src_pos == 0 and dst_pos == self._host_pos:
                        self._queue_write_through(pages)
                elif src_tier.order is not None:  # onboarded: they leave the colder tier
                    src_tier.order.left(pages)
                self._arrive(tiers[dst_pos], pages, dsts, evict)  # evicted: most recent
            else:
                c.failed_batches += 1
                if src_tier.order is not None and (kind is BatchKind.EVICT or takeback):
                    src_tier.order.returned(pages)  # its victims stay: no ghost hit
                if takeback:  # the page stays, its copy with it, reclaimable again
                    if self._wt_taken:  # (a pending copy: pending again, or lost)
                        self._end_take_back(pages, False)
                    copies = tiers[dst_pos].copies
                    for p in pages:
                        p.phase = Phase.RESIDENT
                        if p.copy_ready:
                            copies[p] = None
                        self._settle(p, touch=False)
                    continue
                for p, d in zip(pages, dsts):
                    p.phase = Phase.RESIDENT
                    self._rollback_slot(rec, batches, oks, dst_pos, d)
                    self._settle(p, touch=False)
        if rec.kind is PlanKind.RESUME:
            self._finish_resume(rec, plan, oks, all_ok)
        elif rec.kind is PlanKind.GROW:
            self._finish_grow(rec, batches, oks, all_ok)
        elif rec.kind is PlanKind.STATE:
            self._finish_state(rec, plan, oks)
        elif not all_ok and rec.quota is not None:
            pos, old = rec.quota  # a shrink that could not finish: the old quota stands
            tiers[pos].capacity = old

    def _finish_state(self, rec: PlanRecord, plan: Plan, oks: list[bool]) -> None:
        raise CoreError("a STATE plan needs kvsim.core.statepages")  # (overridden there)

    def _finish_resume(self, rec: PlanRecord, plan: Plan, oks: list[bool], all_ok: bool) -> None:
        req = rec.req
        assert req is not None  # a resume/grow plan has one
        req.plan = -1
        if all_ok:
            for bi, b in enumerate(plan.batches):
                if b.kind is BatchKind.ONBOARD:
                    came = rec.moves[bi][0]
                    for p in came:
                        p.holds -= 1
                        p.locks += 1
                    self.tiers[0].index_discard_each(came)
            req.state = ReqState.ACTIVE
            return
        # Not all pages came: the request stays suspended. Pages that arrived stay on GPU,
        # held; pages that were on GPU already were locked at planning: unlock them.
        moved: set[int] = set()
        for bi, b in enumerate(plan.batches):
            if b.kind is BatchKind.ONBOARD:
                for p in rec.moves[bi][0]:
                    moved.add(p.pid)
                    self._settle(p, touch=True)
        for p in reversed(req.pages):
            if p.pid not in moved:
                p.locks -= 1
                p.holds += 1
                self._settle(p, touch=True)
        req.state = ReqState.SUSPENDED

    def _finish_grow(self, rec: PlanRecord, batches: tuple[Batch, ...], oks: list[bool],
                     all_ok: bool) -> None:
        req = rec.req
        assert req is not None  # a resume/grow plan has one
        req.plan = -1
        req.state = ReqState.ACTIVE
        ntokens = rec.target
        taken = rec.pending + ([rec.cow] if rec.cow is not None else [])
        if not all_ok:
            for p in taken:
                p.phase = Phase.FREED
                self._rollback_slot(rec, batches, oks, 0, p.slot)
            return
        pages_by_pid = self._pages
        resident = Phase.RESIDENT
        for p in taken:
            p.phase = resident
            p.locks = 1
            pages_by_pid[p.pid] = p
        first = max(0, len(req.pages) - 1)
        if rec.cow is not None:
            old = req.pages[-1]
            copy = rec.cow
            req.pages[-1] = copy
            old.locks -= 1
            self._settle(old, touch=True)
            if req.committed > copy.index:
                req.committed = copy.index
        if rec.pending:
            req.pages.extend(rec.pending)
        self.counters.created_pages[Level.GPU] += len(taken)
        if not self._fast:
            self._used(taken, fresh=True)
        if req.pages:  # new pages got their token counts at planning; the old last may
            #            grow (never shrink: it may be a shared page used only in part)
            last = req.pages[first]
            n = min(self.tokens_per_block, ntokens - first * self.tokens_per_block)
            if n > last.ntokens:
                last.ntokens = n
        req.tokens = ntokens

    # == internals ======================================================================
    def _used(self, pages: Iterable[Page], fresh: bool = False) -> None:
        """A turn uses these pages, in prompt order (a policy other than LRU reads the
        metadata; ``fresh``: pages just created, used for the first time). Their recency
        (``last_use``) is not changed here: as in LRU's index, a page becomes recent when
        it enters its tier's index or is touched there (when its turn ends, when it
        arrives in a colder tier), not when a turn is declared."""
        pages = list(pages)
        clock = self.clock
        if fresh:  # (set outright: a first use found by the exception costs more)
            t = self.ticks
            for p in pages:
                t += 1
                p.uses = 1
                p.score = 0.0
                p.last_use = t
            self.ticks = t
        else:
            for p in pages:
                try:
                    p.uses += 1
                except AttributeError:  # its first use (see Page)
                    p.uses = 1
                    p.score = 0.0
                    self.ticks += 1
                    p.last_use = self.ticks
        for policy in self._hooked:
            if type(policy).on_use is not EvictionPolicy.on_use:
                on_use = policy.on_use
                for p in pages:
                    on_use(p, clock)
        if fresh:
            return  # (new pages are locked: in no index)
        tiers = self.tiers
        for p in pages:
            tier = tiers[p.tier]
            if tier.order is not None:  # its key or its queue may change
                tier.order.used(p, tier)

    def _refuse(self, reason: RefusalReason, detail: str) -> Refusal:
        self.counters.refusals += 1
        return Refusal(reason, detail)

    def _issue(self, rec: PlanRecord, kind: PlanKind, batches: list[Batch], new_pages: int = 0) -> Plan:
        pid = self._next_plan
        self._next_plan += 1
        self._plans[pid] = rec
        if rec.req is not None:
            rec.req.plan = pid
        self.counters.plans += 1
        return Plan(pid, kind, tuple(batches), new_pages)


def _flags(ok, n: int) -> list[bool]:
    """``ok`` as one flag per batch: a sequence of flags as it is, one flag (any truth
    value: a bool, a backend's numpy bool) ``n`` times."""
    return [bool(x) for x in ok] if hasattr(ok, "__len__") else [bool(ok)] * n
