"""A request's fixed state in the tiers: its pages, and the plans that move them.

A model with sliding-window or recurrent layers keeps, beside the pages of its blocks, a
fixed amount per request: the sliding layers' window and the recurrent layers' state
(``docs/models.md``). The engine gives it a number of slots (``npages``); the core keeps
them as the request's ``fixed`` pages: pages of no block, never in the prefix tree nor in
an eviction index (no eviction picks them, no other request finds them), so the pages of
blocks, their slots and the refcheck's identity are unchanged.

    take_state(req, n) -> Plan | Refusal   on GPU for a turn: fresh slots (nothing moves),
                                           or its stashed state host -> GPU (a STATE batch)
    state_fill(req) -> Fill                the state as a turn leaves it: a new version's
                                           content tags, for the engine to write
    stash_state(req) -> Plan | Refusal     GPU -> host as it suspends: host slots reserved,
                                           host pages evicted colder as for any incoming page
    drop_state(req)                        lost (no host room, a failed move): slots freed

Invariants: a request's state pages are all in one tier (or all moving in one plan), each
owns its slot; plans are two-phase as every plan (``complete`` commits or rolls back the
STATE batch: a failed stash leaves the state on GPU, a failed restore on host). Content:
the tag of version v's page j is a function of the request's scope, its id, v and j, so a
state restored into the wrong slot, or a stale one, fails the refcheck. ``close`` frees
the state (a plan moving it frees it when it completes).
"""

from __future__ import annotations

from kvsim.core.commits import Planning
from kvsim.core.errors import CoreError
from kvsim.core.eviction import PlanRecord
from kvsim.core.keys import chain_key, tag_of
from kvsim.core.pages import Page
from kvsim.core.plan import Batch, BatchKind, Fill, Plan, PlanKind, Refusal, RefusalReason
from kvsim.core.request import Request
from kvsim.core.spec import Level
from kvsim.core.types import Phase, ReqState


class FixedState(Planning):
    """Mixin of TierManager (``Queries(FixedState)``, ``FixedState(Planning)``)."""

    _next_pid: int
    _host_pos: int

    def take_state(self, req: Request, npages: int) -> Plan | Refusal:
        """Put the request's state on GPU for its turn, in ``npages`` free GPU slots: its
        stashed state comes back (a plan with one STATE batch), or, where it has none, the
        slots are taken now (a plan without batches: complete it). Refuses, changing
        nothing, while its state moves (BUSY) or when fewer GPU slots are free (NO_ROOM:
        the engine evicts first)."""
        if req.state is ReqState.CLOSED:
            raise CoreError(f"take_state: request {req.rid} is CLOSED")
        if npages <= 0:
            raise CoreError(f"take_state: npages must be positive, got {npages}")
        pages = req.fixed
        if any(p.phase is not Phase.RESIDENT for p in pages):
            return self._refuse(RefusalReason.BUSY, "its state is moving")
        if pages and pages[0].tier == 0:
            raise CoreError(f"take_state: request {req.rid}'s state is on GPU already")
        if pages and len(pages) != npages:
            raise CoreError(f"take_state: request {req.rid} keeps {len(pages)} state pages, "
                            f"not {npages}")
        gpu = self.tiers[0]
        if npages > gpu.free:
            return self._refuse(RefusalReason.NO_ROOM, f"{npages} free GPU slots for a state")
        rec = PlanRecord(PlanKind.STATE, req)
        batches: list[Batch] = []
        slots = gpu.alloc_many(npages)
        if pages:
            for p in pages:
                p.phase = Phase.MOVING
            self._add_batch(rec, batches, BatchKind.STATE, pages[0].tier, 0, pages, slots, 0)
        else:
            pid = self._next_pid
            self._next_pid = pid + npages
            req.fixed = [Page(pid + j, j, 0, s, 0, 0, Phase.RESIDENT) for j, s in enumerate(slots)]
        return self._issue_state(rec, batches)

    def state_fill(self, req: Request) -> Fill:
        """The request's state on GPU as its turn leaves it: each page's new content tag
        (the next version), for the engine to write (``Backend.fill``) before a stash."""
        pages = req.fixed
        if not pages or pages[0].tier != 0 or any(p.phase is not Phase.RESIDENT for p in pages):
            raise CoreError(f"state_fill: request {req.rid} has no state at rest on GPU")
        req.fixed_version += 1
        base = chain_key(req.root, [-2, req.rid, req.fixed_version])
        tags = [tag_of(chain_key(base, j)) for j in range(len(pages))]
        for p, t in zip(pages, tags):
            p.tag = t
        return Fill(Level.GPU, [p.slot for p in pages], tags)

    def stash_state(self, req: Request) -> Plan | Refusal:
        """Plan the request's state GPU -> host: as many host slots, free ones first, then
        those host pages give up (moved colder, or dropped from the last tier, as any
        eviction); the STATE batch runs in the plan's last stage. Refuses, changing nothing,
        without a host tier or when it cannot make the room (NO_ROOM)."""
        pages = req.fixed
        if not pages or pages[0].tier != 0 or any(p.phase is not Phase.RESIDENT for p in pages):
            raise CoreError(f"stash_state: request {req.rid} has no state at rest on GPU")
        host = self._host_pos
        if host < 0:
            return self._refuse(RefusalReason.NO_ROOM, "no host tier for a state")
        n = len(pages)
        sel = self._select(host, n, None)
        if sel is None:
            return self._refuse(RefusalReason.NO_ROOM, f"{n} host slots for a state")
        rec = PlanRecord(PlanKind.STATE, req)
        batches: list[Batch] = []
        dst = self._reserve(host, n, sel, rec, batches)
        for p in pages:
            p.phase = Phase.MOVING
        self._add_batch(rec, batches, BatchKind.STATE, 0, host, pages, dst, len(self.tiers) - 1)
        return self._issue_state(rec, batches)

    def drop_state(self, req: Request) -> None:
        """The request's state is lost: its slots are freed (its next turn recomputes what
        it needs: the engine's decision)."""
        if any(p.phase is not Phase.RESIDENT for p in req.fixed):
            raise CoreError(f"drop_state: request {req.rid}'s state is moving")
        self._free_state(req)

    def state_level(self, req: Request) -> Level | None:
        """Where the request's state is (None: it has none), while at rest or moving."""
        pages = req.fixed
        return self.tiers[pages[0].tier].level if pages else None

    def state_moving(self, req: Request) -> bool:
        return any(p.phase is Phase.MOVING for p in req.fixed)

    # == internals ======================================================================
    def _issue_state(self, rec: PlanRecord, batches: list[Batch]) -> Plan:
        """Register a STATE plan (as ``_issue``, but the request does not name it: it may
        be suspended, and resumed or grown meanwhile)."""
        pid = self._next_plan
        self._next_plan += 1
        self._plans[pid] = rec
        self.counters.plans += 1
        return Plan(pid, PlanKind.STATE, tuple(batches))

    def _close_state(self, req: Request) -> None:
        """``close``: the state's slots are freed now, or when the plan moving it completes."""
        if req.fixed and not self.state_moving(req):
            self._free_state(req)

    def _free_state(self, req: Request) -> None:
        for p in req.fixed:
            self.tiers[p.tier].release(p.slot)
            p.phase = Phase.FREED
        req.fixed = []

    def _finish_state(self, rec: PlanRecord, plan: Plan, oks: list[bool]) -> None:
        """Commit or roll back a STATE plan's STATE batch (its eviction batches are
        committed as any): moved, the pages are at rest at their destination and their
        source slots free; failed, they stay where they were and the destination slots are
        given back."""
        req = rec.req
        assert req is not None  # a STATE plan has one
        batches = plan.batches
        for bi, b in enumerate(batches):
            if b.kind is not BatchKind.STATE:
                continue
            pages, dsts = rec.moves[bi]
            src, dst = self._pos[b.src], self._pos[b.dst]
            if oks[bi]:
                self.tiers[src].release_many([p.slot for p in pages])
                for p, d in zip(pages, dsts):
                    p.tier = dst
                    p.slot = d
                    p.phase = Phase.RESIDENT
                if dst == 0:
                    self.counters.state_in_pages += len(pages)
                else:
                    self.counters.state_out_pages += len(pages)
            else:
                self.counters.failed_batches += 1
                for p, d in zip(pages, dsts):
                    p.phase = Phase.RESIDENT
                    self._rollback_slot(rec, batches, oks, dst, d)
        if req.state is ReqState.CLOSED:
            self._free_state(req)
