"""The tier manager: request lifecycle, eviction cascades and two-phase migration plans.

Lifecycle of a request (one core Request may live across the turns of a session):

    create(scope, blocks, ntokens)   match the prefix; matched pages become HELD   -> SUSPENDED
    prepare(req, blocks, ntokens)    next turn: keep the common prefix, match more  (SUSPENDED)
    resume(req) -> Plan | Refusal    bring held pages to GPU and lock them          -> ACTIVE
    grow(req, ntokens) -> Plan | ..  allocate GPU pages, evicting others            (ACTIVE)
    extend(req, ntokens) -> bool     grow + complete at once when nothing must move  (ACTIVE)
    commit(req, ntokens) -> Fill     computed pages join the prefix tree            (ACTIVE)
    suspend(req)                     locked pages become held                       -> SUSPENDED
    close(req)                       pages become droppable or are freed            -> CLOSED

A request's fixed state (a sliding window, a recurrent state) is kept apart from its
pages of blocks: ``take_state``, ``stash_state``, ``drop_state`` (``kvsim.core.statepages``).

Every state change that moves bytes is two-phase: planning picks victims, reserves
destination slots and pins sources, and returns a frozen Plan; ``complete(plan, ok)``
commits it or rolls it back, batch by batch. A plan that cannot be made changes nothing.

Eviction per tier: lowest priority first, then least recently used, or an eviction
policy's order (one for all tiers, or a tier's own). The cascade is GPU -> host -> disk ->
dropped: a victim moves one tier colder; only the last tier drops, only droppable leaves;
a placement policy may drop a victim earlier or send it past the next tier
(``kvsim.core.destinations``). Held pages never drop; children drop before parents. With
retained disk copies (``kvsim.core.retained``) an eviction to disk may take a page's copy
back instead of writing it, and ``write_through()`` plans background copies to disk.
"""

from __future__ import annotations

from typing import Hashable, Sequence

from kvsim.core.errors import CoreError
from kvsim.core.eviction import PlanRecord
from kvsim.core.keys import BlockIds, chain_key, tag_of
from kvsim.core.pages import Page
from kvsim.core.lending import Lending
from kvsim.core.policy import EvictionPolicy, PriorityLRU, distinct, per_tier
from kvsim.core.policy.intheap import order_for
from kvsim.core.policy.placement import Cascade, PlacementPolicy
from kvsim.core.plan import Batch, BatchKind, Fill, Plan, PlanKind, Refusal, RefusalReason
from kvsim.core.request import Request
from kvsim.core.spec import Level, ManagerSpec
from kvsim.core.stats import Counters
from kvsim.core.tiers import Tier
from kvsim.core.tree import PrefixTree
from kvsim.core.types import Phase, ReqState


class TierManager(Lending):
    def __init__(self, spec: ManagerSpec, policy: EvictionPolicy | None = None,
                 placement: PlacementPolicy | None = None,
                 tier_policies: dict[int, EvictionPolicy] | None = None):
        """``policy``: the eviction order within a tier (default: ``PriorityLRU``, the fast
        path); ``placement``: where victims go and which restored pages keep their disk
        copy (default: ``Cascade``, one tier colder, every copy kept); ``tier_policies``:
        tier position -> that tier's own eviction order, instead of ``policy``'s. Every
        policy hears every use and turn; each hears its own tiers' evictions. Whether
        pages get their request's priority is ``policy``'s choice."""
        self.spec = spec
        self.policy: EvictionPolicy = policy if policy is not None else PriorityLRU()
        self.placement: PlacementPolicy = placement if placement is not None else Cascade()
        self._placing = not self.placement.is_default  # kvsim.core.destinations decides
        n = len(spec.tiers)
        self.policies: list[EvictionPolicy] = per_tier(self.policy, tier_policies, n)
        self._hooked = distinct([self.policy, *self.policies])  # each distinct policy once
        # walk the recency index; no page metadata (unless a policy or the placement reads it)
        self._fast = all(p.fast_lru for p in self.policies) and not self.placement.reads_use
        self.clock = 0  # logical: one tick per prepared turn
        self.ticks = 0  # recency: one tick per page entering or touched in an eviction index
        self.dropped: list[Page] | None = None  # a list: collect the pages dropped
        self.page_bytes = spec.page_bytes
        self.tokens_per_block = spec.tokens_per_block
        self.tiers: list[Tier] = [
            Tier(t.level, i, i == n - 1, spec.page_bytes, t.quota_bytes // spec.page_bytes,
                 t.reserve_bytes // spec.page_bytes)
            for i, t in enumerate(spec.tiers)
        ]
        if not self._fast:  # (an LRU tier walks its recency index, as on the fast path)
            for t, pol in zip(self.tiers, self.policies):
                t.order = None if pol.fast_lru else order_for(pol, self, t)
        # the GPU tier's order learns the keys each prompt will bring in (a queue policy
        # that counts ghost hits before it evicts for them)
        order0 = self.tiers[0].order
        self._incoming = order0 is not None and order0.wants_incoming
        self._pos = {t.level: i for i, t in enumerate(self.tiers)}
        self._levels = [t.level for t in self.tiers]  # tier position -> Level
        self.tree = PrefixTree()
        self.counters = Counters()
        self._init_copies()
        self._pages: dict[int, Page] = {}   # every live page, by pid
        self._requests: dict[int, Request] = {}
        self._plans: dict[int, PlanRecord] = {}
        self._next_pid = self._next_rid = self._next_plan = 0
        self._leases = {}  # pages lent to a sibling rank (kvsim.core.lending)
        self._next_lease = self.lent_pages = 0

    # == lifecycle ======================================================================
    def create(self, scope: Hashable, blocks: Sequence[BlockIds], ntokens: int,
               priority: int = 0, prefix_blocks: int = 0, prefix_priority: int = 0) -> Request:
        """A new SUSPENDED request whose cached prefix pages are now held by it. The pages
        it computes get ``priority``, those of its first ``prefix_blocks`` blocks
        ``prefix_priority`` (a policy that ignores priorities gets 0 for all)."""
        if not self.policy.honours_priority:
            priority = prefix_priority = 0
        req = Request(self._next_rid, scope, priority)
        if prefix_blocks > 0 and prefix_priority != priority:
            req.prefix_blocks = prefix_blocks
            req.prefix_priority = prefix_priority
        self._next_rid += 1
        self._requests[req.rid] = req
        self.prepare(req, blocks, ntokens)
        return req

    def prepare(self, req: Request, blocks: Sequence[BlockIds], ntokens: int) -> int:
        """Declare the request's next prompt (``ntokens`` tokens over ``blocks``).

        Keeps the request's own pages that match the new blocks, releases the rest, then
        extends the match from the prefix tree. Counts hit tokens by tier. Returns the
        tokens found cached."""
        self._expect(req, ReqState.SUSPENDED, "prepare")
        if ntokens < 0:
            raise CoreError(f"prepare: ntokens must be >= 0, got {ntokens}")
        nb = self._nblocks(ntokens)
        if len(blocks) < nb:
            raise CoreError(f"prepare: {ntokens} tokens need {nb} blocks, got {len(blocks)}")
        self.clock += 1
        need = self._needs(ntokens, nb)
        keep = 0
        own = req.pages
        while (keep < len(own) and keep < nb and own[keep].tag
               and req.blocks[keep] == blocks[keep] and own[keep].ntokens >= need[keep]):
            keep += 1
        for p in reversed(own[keep:]):
            p.holds -= 1
            self._settle(p, touch=False)
        del own[keep:]
        req.committed = min(req.committed, keep)
        if keep < nb and (keep == 0 or need[keep - 1] == self.tokens_per_block):
            parent = own[keep - 1].key if keep else req.root
            found, _ = self.tree.match(parent, blocks[keep:nb], need[keep:])
            for p in found:
                p.holds += 1
                if self.tiers[p.tier].is_last:
                    self.tiers[p.tier].index_discard(p)
            own.extend(found)
            req.committed = len(own)
        if req.ahead:
            req.ahead = []
        if not self._fast:
            self._used(own)
            if self._incoming:
                self._announce(req, own, blocks, nb)
        hits = [0, 0, 0]
        level = self._levels
        for p, n in zip(own, need):
            hits[level[p.tier]] += n
        for lv in range(3):
            self.counters.hit_tokens[lv] += hits[lv]
        req.hit_by_level = tuple(hits)
        req.blocks = list(blocks)
        req.tokens = sum(need[:len(own)])
        return req.tokens

    def resume(self, req: Request) -> Plan | Refusal:
        """Plan to bring the request's pages to GPU and lock them. On refusal nothing changed."""
        self._expect(req, ReqState.SUSPENDED, "resume")
        pages = req.pages
        resident = Phase.RESIDENT
        if any(p.phase is not resident or (p.tier and p.locks) for p in pages):
            return self._refuse(RefusalReason.BUSY, "a page is moving for another plan or lent")
        away = [p for p in pages if p.tier != 0]
        sel = self._select(0, len(away), set(pages)) if away else None
        if away and sel is None:
            return self._refuse(RefusalReason.NO_ROOM, f"{len(away)} GPU slots for a resume")
        gpu = self.tiers[0]
        here = []
        for p in pages:
            if p.tier == 0:
                p.holds -= 1
                p.locks += 1
                here.append(p)
        gpu.index_discard_each(here)
        rec = PlanRecord(PlanKind.RESUME, req)
        batches: list[Batch] = []
        if sel is not None:  # (there are pages away)
            slots = self._reserve(0, len(away), sel, rec, batches)
            by_src: dict[int, tuple[list[Page], list[int]]] = {}
            moving = Phase.MOVING
            for p, s in zip(away, slots):
                p.phase = moving
                grp = by_src.get(p.tier)
                if grp is None:
                    grp = by_src[p.tier] = ([], [])
                grp[0].append(p)
                grp[1].append(s)
            for src in sorted(by_src):
                ps, ds = by_src[src]
                self.tiers[src].index_discard_each(ps)
                self._add_batch(rec, batches, BatchKind.ONBOARD, src, 0, ps, ds,
                                self._taker_stage)
        req.state = ReqState.RESUMING
        return self._issue(rec, PlanKind.RESUME, batches)

    def grow(self, req: Request, ntokens: int, blocks: Sequence[BlockIds] = ()) -> Plan | Refusal:
        """Plan GPU pages so the request covers ``ntokens`` tokens (appending ``blocks``)."""
        self._expect(req, ReqState.ACTIVE, "grow")
        if ntokens < req.tokens:
            raise CoreError(f"grow: {ntokens} tokens is fewer than the {req.tokens} it has")
        nb = self._nblocks(ntokens)
        if nb > len(req.blocks) + len(blocks):
            raise CoreError(f"grow: {ntokens} tokens need {nb} blocks, the request has "
                            f"{len(req.blocks) + len(blocks)}")
        new = nb - len(req.pages)
        last = req.pages[-1] if req.pages else None
        cow = self._needs_copy(req, ntokens)
        n = new + cow
        gpu = self.tiers[0]
        evict = n > gpu.free  # free slots do not suffice: plan an eviction
        sel = self._select(0, n, None) if evict else None
        if evict and sel is None:  # refused: the blocks are not appended, so a retry may pass them again
            return self._refuse(RefusalReason.NO_ROOM, f"{n} GPU pages for a grow")
        if blocks:
            req.blocks.extend(blocks)
        rec = PlanRecord(PlanKind.GROW, req)
        batches: list[Batch] = []
        if n:
            slots = gpu.alloc_many(n) if sel is None else self._reserve(0, n, sel, rec, batches)
            base = len(req.pages)
            b = self.tokens_per_block
            pid = self._next_pid
            pend = []
            prio = req.priority
            pending = Phase.PENDING
            for j in range(new):  # every new page is full but maybe the last
                pend.append(Page(pid + j, base + j, 0, slots[cow + j], b, prio, pending))
            if base < req.prefix_blocks:  # pages of the request's prefix: its priority
                for q in pend[:req.prefix_blocks - base]:
                    q.priority = req.prefix_priority
            if pend:
                pend[-1].ntokens = min(b, ntokens - (base + new - 1) * b)
            self._next_pid = pid + new
            rec.pending = pend
            if cow:
                assert last is not None  # a copy-on-write copies the request's last page
                copy = Page(self._next_pid, last.index, 0, slots[0], last.ntokens,
                            last.priority, Phase.PENDING)
                self._next_pid += 1
                rec.cow = copy
                self._add_batch(rec, batches, BatchKind.COPY, 0, 0, [last], [slots[0]],
                                self._taker_stage)
        rec.target = ntokens
        req.state = ReqState.GROWING
        return self._issue(rec, PlanKind.GROW, batches, new)

    def extend(self, req: Request, ntokens: int, blocks: Sequence[BlockIds] = ()) -> bool:
        """``grow`` and ``complete`` in one call, for a grow that moves nothing: the new
        pages fit in free GPU slots and the last page needs no copy-on-write (a prefill
        chunk or a decode's next block, step after step, mostly). The state after it, the
        plan counted included, is the one grow + complete leave. False, changing nothing,
        when the grow needs a plan (or is not valid): call ``grow``."""
        if req.state is not ReqState.ACTIVE or ntokens < req.tokens:
            return False
        b = self.tokens_per_block
        nb = -(-ntokens // b)
        pages = req.pages
        base = len(pages)
        if nb > len(req.blocks) + len(blocks):
            return False
        if self._needs_copy(req, ntokens):
            return False  # copy-on-write of the shared last page
        new = nb - base
        gpu = self.tiers[0]
        if not 0 <= new <= gpu.free:
            return False  # evictions first
        if blocks:
            req.blocks.extend(blocks)
        self._next_plan += 1  # as grow's plan would have taken a plan id
        self.counters.plans += 1
        if new:
            slots = gpu.alloc_many(new)
            pid = self._next_pid
            prio = req.priority
            live = self._pages
            resident = Phase.RESIDENT
            for j in range(new):  # every new page is full but maybe the last
                p = Page(pid + j, base + j, 0, slots[j], b, prio, resident)
                p.locks = 1
                live[pid + j] = p
                pages.append(p)
            if base < req.prefix_blocks:  # pages of the request's prefix: its priority
                for q in pages[base:req.prefix_blocks]:
                    q.priority = req.prefix_priority
            p.ntokens = min(b, ntokens - (base + new - 1) * b)
            self._next_pid = pid + new
            self.counters.created_pages[Level.GPU] += new
            if not self._fast:
                self._used(pages[base:], fresh=True)
        if pages:  # the old last page may grow (never shrink: it may be a shared tree
            #        page the request uses only part of)
            first = base - 1 if base else 0
            last = pages[first]
            n = min(b, ntokens - first * b)
            if n > last.ntokens:
                last.ntokens = n
        req.tokens = ntokens
        return True

    def commit(self, req: Request, ntokens: int, final: bool = False) -> Fill:
        """Pages fully covered by the first ``ntokens`` computed tokens join the prefix tree
        (and, with ``final``, the partial last page too). Returns the pages whose content the
        engine must now write."""
        self._expect(req, ReqState.ACTIVE, "commit")
        if ntokens > req.tokens:
            raise CoreError(f"commit: {ntokens} tokens but the request covers {req.tokens}")
        b = self.tokens_per_block
        upto = ntokens // b + (1 if final and ntokens % b else 0)
        pages, blocks, tree = req.pages, req.blocks, self.tree
        slots: list[int] = []
        tags: list[int] = []
        parent_key = b""  # the key (and tree page) of block i - 1 once known in the loop
        parent = None
        ahead = req.ahead  # keys hashed at prepare (a chain key depends on the blocks only)
        a0 = req.ahead_from
        a1 = a0 + len(ahead)
        for i in range(req.committed, upto):
            page = pages[i]
            if page.key:
                parent_key = b""
                continue
            if not parent_key:
                parent_key = pages[i - 1].key if i else req.root
                parent = tree.get(parent_key) if i else None
                if i and parent is None:
                    parent = self._reinsert_chain(req, i - 1)
            key = ahead[i - a0] if a0 <= i < a1 else chain_key(parent_key, blocks[i])
            if tree.insert(page, key, parent):
                parent = page
            else:
                page.key = key  # a twin computed it first: ours stays private
                parent = tree.get(key)
            parent_key = key
            page.tag = tag = tag_of(key)
            slots.append(page.slot)
            tags.append(tag)
        req.committed = max(req.committed, upto)
        return Fill(Level.GPU, slots, tags)

    def suspend(self, req: Request) -> None:
        """Locked pages become held: evictable to colder tiers, never dropped."""
        self._expect(req, ReqState.ACTIVE, "suspend")
        for p in req.pages:
            p.locks -= 1
            p.holds += 1
        if not self._fast:
            for pol in self._hooked:
                pol.on_turn(req.pages, self.clock)
        self._settle_touched(reversed(req.pages))  # tail first into the LRU: evicted first
        req.state = ReqState.SUSPENDED

    def close(self, req: Request) -> None:
        """Release the request: its tree pages become droppable, private pages are freed."""
        if req.state not in (ReqState.ACTIVE, ReqState.SUSPENDED):
            raise CoreError(f"close: request {req.rid} is {req.state.name}")
        if req.state is ReqState.ACTIVE:
            for p in req.pages:
                p.locks -= 1
            if not self._fast:
                for pol in self._hooked:
                    pol.on_turn(req.pages, self.clock)
            self._settle_touched(reversed(req.pages))
        else:
            for p in reversed(req.pages):
                p.holds -= 1
                self._settle(p, touch=False)
        req.pages = []
        self._close_state(req)
        req.state = ReqState.CLOSED
        del self._requests[req.rid]

    # == internals ======================================================================
    def _announce(self, req: Request, own: list[Page], blocks: Sequence[BlockIds],
                  nb: int) -> None:
        """Tell the GPU tier's order the chain keys of the prompt's blocks not on GPU, in
        prompt order: those found in a colder tier, then those found nowhere (their keys
        as commit will give them)."""
        keys = [p.key for p in own if p.tier != 0]
        parent = own[-1].key if own else req.root
        ahead: list[bytes] = []
        for i in range(len(own), nb):
            parent = chain_key(parent, blocks[i])
            ahead.append(parent)
        req.ahead = ahead  # (commit takes them: a block is hashed once)
        req.ahead_from = len(own)
        keys.extend(ahead)
        if keys:
            order = self.tiers[0].order
            assert order is not None
            order.incoming(keys)

    @property
    def _taker_stage(self) -> int:
        return len(self.tiers) - 1

    def _needs_copy(self, req: Request, ntokens: int) -> bool:
        """Whether growing ``req`` to ``ntokens`` tokens first copies its last page (copy
        on write): the page is partial, gains tokens, and is shared (in the tree, locked
        or held by another request) or already written."""
        pages = req.pages
        if not pages or ntokens <= req.tokens or req.tokens >= len(pages) * self.tokens_per_block:
            return False
        last = pages[-1]
        return last.in_tree or last.locks > 1 or last.holds > 0 or last.tag != 0

    def _expect(self, req: Request, state: ReqState, op: str) -> None:
        if req.state is not state:
            raise CoreError(f"{op}: request {req.rid} is {req.state.name}, expected {state.name}")

    def _reinsert_chain(self, req: Request, i: int) -> Page | None:
        """The tree lost the page for the request's block ``i`` (a twin was dropped): put the
        request's own copies of the missing blocks back, oldest first. Returns the tree page
        for block ``i``."""
        j = i
        while j >= 0 and self.tree.get(req.pages[j].key) is None:
            j -= 1
        parent = self.tree.get(req.pages[j].key) if j >= 0 else None
        for k in range(j + 1, i + 1):
            page = req.pages[k]
            self.tree.insert(page, page.key, parent)
            parent = page
        return parent
