"""An invariant checker for a TierManager: ``audit(manager)`` raises AssertionError, with a
message naming what broke, if the manager's bookkeeping is inconsistent. Pure and
read-only (it changes nothing), so tests call it after every step and runs may call it
behind a flag.

What it checks:
- slots: every resident or moving page (a request's fixed state's included) owns a distinct (tier, slot); in-flight
  destination slots are distinct and owned by nobody but a page leaving that slot in the
  same plan; per tier, every id below ``next_fresh`` is exactly one of recycled, owned,
  reserved, or forgotten above a capped tier's limit (and ``used`` agrees);
- pages: every live page is in exactly one PageState and its lock/hold counts equal the
  requests listing it (locks: ACTIVE/GROWING requests, and RESUMING ones for pages already
  on GPU; holds: SUSPENDED requests, and RESUMING ones for pages being onboarded); locked
  pages are resident on GPU; the eviction index holds exactly the pages it should;
- counters: per tier, resident + moving-from pages == created + moved in - moved out -
  dropped - freed;
- the prefix tree: keys map to live pages marked in_tree, parents are live tree pages,
  ``nchildren`` counts them, non-tree pages have no parent and no children;
- retained disk copies (``kvsim.core.retained``): a copy belongs to a live page that is not
  on disk; its slot is owned by nothing else; a ready copy is fully committed and is in the
  disk tier's ``copies`` exactly when no in-flight TAKEBACK batch has it as destination;
  a copy not ready is a write-through's in flight; a write's slot whose page gave it up,
  and a host slot whose release waits for a write, are owned by that write; the count of
  retained slots agrees;
- content (with ``backend_tags``, a ``read_tags(level, slots)`` callable): every committed
  page whose slot no in-flight batch writes holds the tag ``tag_of(page.key)``, and every
  ready retained copy holds its page's tag. Call it after the engine wrote the Fill of
  every commit.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from kvsim.core.keys import tag_of
from kvsim.core.plan import BatchKind, PlanKind
from kvsim.core.types import PageState, Phase, ReqState

_LIVE = (Phase.RESIDENT, Phase.MOVING)


def _fresh(tier) -> int:
    """Slot ids a tier has handed out lie below this (its pool's, where it has one)."""
    return tier.pool.next_fresh if tier.pool is not None else tier.next_fresh


def _fail(msg: str) -> None:
    raise AssertionError(f"audit: {msg}")


def audit(manager, backend_tags: Optional[Callable[..., np.ndarray]] = None) -> None:
    """Check every invariant of ``manager`` (see the module docstring). Changes nothing."""
    m = manager
    tiers = m.tiers
    pages = m._pages

    # -- live pages and the slots they own ---------------------------------------------
    owner: dict[tuple[int, int], object] = {}
    for pid, p in pages.items():
        if p.pid != pid:
            _fail(f"page {p!r} filed under pid {pid}")
        if p.phase not in _LIVE:
            _fail(f"live page {p!r} has phase {p.phase.name}")
        if not 0 <= p.tier < len(tiers) or not 0 <= p.slot < _fresh(tiers[p.tier]):
            _fail(f"page {p!r} is outside its tier's allocated slots")
        where = (p.tier, p.slot)
        if where in owner:
            _fail(f"slot T{p.tier}:{p.slot} owned by both {owner[where]!r} and {p!r}")
        owner[where] = p
    for req in _state_owners(m):  # a request's fixed state (kvsim.core.statepages)
        for p in req.fixed:
            where = (p.tier, p.slot)
            if p.phase not in _LIVE or not 0 <= p.slot < tiers[p.tier].next_fresh:
                _fail(f"state page {p!r} of {req!r} is not live in its tier's slots")
            if where in owner:
                _fail(f"slot T{p.tier}:{p.slot} owned by both {owner[where]!r} and {p!r}")
            owner[where] = p
    taking = _audit_copies(m, owner)

    # -- plans in flight: reservations -------------------------------------------------
    reserved: dict[tuple[int, int], int] = {}   # (tier, slot) -> plan id
    leaving: dict[tuple[int, int], int] = {}    # source slots of in-flight moves -> plan id
    onboarding: dict[int, set[int]] = {}        # plan id -> pids being onboarded
    moving_pids: set[int] = set()
    for plan_id, rec in m._plans.items():
        for (pgs, _), kind, _ in _batches(m, rec):
            if kind is not BatchKind.COPY:
                for p in pgs:
                    leaving[(p.tier, p.slot)] = plan_id
    for plan_id, rec in m._plans.items():
        dst_slots: list[tuple[int, int]] = []
        for (pgs, dsts), kind, dst_pos in _batches(m, rec):
            if kind is BatchKind.COPY:
                for p in pgs:
                    if p.phase is not Phase.RESIDENT or not p.locks:
                        _fail(f"plan {plan_id}: copy source {p!r} is not a locked resident page")
                continue  # its destination is the pending copy's slot, reserved below
            for p in pgs:
                if p.phase is not Phase.MOVING:
                    _fail(f"plan {plan_id}: source {p!r} is not MOVING")
                if p.pid in moving_pids:
                    _fail(f"page {p!r} is the source of two in-flight moves")
                moving_pids.add(p.pid)
                if kind is BatchKind.ONBOARD:
                    onboarding.setdefault(plan_id, set()).add(p.pid)
            if kind is BatchKind.TAKEBACK:  # onto the copies' own slots (owned by them)
                for p, d in zip(pgs, dsts):
                    if p.copy != d or p.pid not in taking or not (
                            p.copy_ready or p.pid in m._wt_taken):
                        _fail(f"plan {plan_id}: takes back slot {d} for {p!r}, not its ready "
                              f"copy (nor a pending one taken back)")
                    taking.discard(p.pid)
                continue
            dst_slots.extend((dst_pos, d) for d in dsts)
        for p in rec.pending + ([rec.cow] if rec.cow is not None else []):
            if p.phase is not Phase.PENDING or p.tier != 0:
                _fail(f"plan {plan_id}: pending page {p!r} is not PENDING on GPU")
            dst_slots.append((0, p.slot))
        for where in dst_slots:
            if where in reserved:
                _fail(f"slot T{where[0]}:{where[1]} reserved twice (plans {reserved[where]} "
                      f"and {plan_id})")
            reserved[where] = plan_id
            o = owner.get(where)
            if o is not None and leaving.get(where) != plan_id:
                _fail(f"plan {plan_id} reserves T{where[0]}:{where[1]}, owned by {o!r} "
                      "which is not leaving it in that plan")
    if taking:
        _fail(f"pages {sorted(taking)[:10]} have a ready copy in no copy index nor takeback")
    for p in pages.values():
        if p.phase is Phase.MOVING and p.pid not in moving_pids:
            _fail(f"page {p!r} is MOVING but no plan in flight moves it")

    # -- slot conservation per tier ----------------------------------------------------
    for pos, tier in enumerate(tiers):
        if tier.pool is not None:  # a node's pool: the other ranks own the rest of it
            mine = {s for (t, s) in owner if t == pos} | {s for (t, s) in reserved if t == pos}
            if mine & set(tier.pool.recycled):
                _fail(f"tier {tier.level.name}: slots {sorted(mine & set(tier.pool.recycled))[:10]} "
                      f"are owned here and free in the node's pool")
            if tier.used != len(mine):
                _fail(f"tier {tier.level.name}: used {tier.used} != {len(mine)} owned or reserved")
            if tier.pool.next_fresh > min(tier.max_slots, tier.pool.capacity):
                _fail(f"tier {tier.level.name}: the pool's ids reached {tier.pool.next_fresh}")
            continue
        rec_set = set(tier.recycled)
        if len(rec_set) != len(tier.recycled):
            _fail(f"tier {tier.level.name}: a slot is recycled twice: {sorted(tier.recycled)}")
        for s in rec_set:
            if not 0 <= s < tier.next_fresh:
                _fail(f"tier {tier.level.name}: recycled slot {s} was never allocated")
            if (pos, s) in owner or (pos, s) in reserved:
                _fail(f"tier {tier.level.name}: slot {s} is recycled but owned or reserved")
            if s >= tier.limit:
                _fail(f"tier {tier.level.name}: recycled slot {s} is at or above the limit {tier.limit}")
        taken = {s for (t, s) in owner if t == pos} | {s for (t, s) in reserved if t == pos}
        # a capped tier (a failed host fill) forgets released slots at or above its limit
        if len(taken) + len(rec_set) + tier.lost != tier.next_fresh:
            lost = sorted(set(range(tier.next_fresh)) - taken - rec_set)
            _fail(f"tier {tier.level.name}: slots {lost[:10]} are neither recycled, owned nor "
                  f"reserved ({tier.lost} forgotten above the limit {tier.limit})")
        if tier.used != len(taken):
            _fail(f"tier {tier.level.name}: used {tier.used} != {len(taken)} owned or reserved")
        if tier.next_fresh > tier.max_slots:
            _fail(f"tier {tier.level.name}: slot ids reached {tier.next_fresh} > {tier.max_slots}")

    # -- owners: requests' page lists vs lock/hold counts ------------------------------
    locks: dict[int, int] = {}
    holds: dict[int, int] = {}
    for rid, req in m._requests.items():
        if req.rid != rid:
            _fail(f"request {req!r} filed under rid {rid}")
        st = req.state
        if st is ReqState.CLOSED:
            _fail(f"closed request {req!r} is still registered")
        if st in (ReqState.RESUMING, ReqState.GROWING):
            if req.plan not in m._plans or m._plans[req.plan].req is not req:
                _fail(f"request {req!r} is {st.name} but its plan {req.plan} is not in flight")
        elif req.plan != -1:
            _fail(f"request {req!r} is {st.name} but names plan {req.plan}")
        if len(set(id(p) for p in req.pages)) != len(req.pages):
            _fail(f"request {req!r} lists a page twice")
        if not 0 <= req.committed <= len(req.pages):
            _fail(f"request {req!r}: committed {req.committed} outside its {len(req.pages)} pages")
        if len(req.pages) != m._nblocks(req.tokens):
            _fail(f"request {req!r}: {len(req.pages)} pages for {req.tokens} tokens")
        if len(req.blocks) < len(req.pages):
            _fail(f"request {req!r}: fewer blocks ({len(req.blocks)}) than pages")
        arriving = onboarding.get(req.plan, set()) if st is ReqState.RESUMING else set()
        for i, p in enumerate(req.pages):
            if pages.get(p.pid) is not p:
                _fail(f"request {req!r} lists dead page {p!r}")
            if p.index != i:
                _fail(f"request {req!r} lists {p!r} at position {i}")
            if i < req.committed and not p.key:
                _fail(f"request {req!r}: page {i} counted committed but has no key")
            if st in (ReqState.ACTIVE, ReqState.GROWING) or (
                    st is ReqState.RESUMING and p.pid not in arriving):
                locks[p.pid] = locks.get(p.pid, 0) + 1
            else:
                holds[p.pid] = holds.get(p.pid, 0) + 1

    for pid, n in m.lent().items():  # pages lent to a sibling (kvsim.core.lending): locked
        locks[pid] = locks.get(pid, 0) + n
    lent_out = m.lent()

    # -- page states and the eviction index --------------------------------------------
    indexed: dict[int, int] = {}  # pid -> tier pos
    for pos, tier in enumerate(tiers):
        for prio, bucket in tier.lru.items():
            for p in bucket:
                if p.priority != prio:
                    _fail(f"{p!r} indexed under priority {prio}, has {p.priority}")
                if p.pid in indexed:
                    _fail(f"{p!r} indexed twice")
                indexed[p.pid] = pos
    for p in pages.values():
        if p.locks != locks.get(p.pid, 0) or p.holds != holds.get(p.pid, 0):
            _fail(f"{p!r}: requests say locks={locks.get(p.pid, 0)}, holds={holds.get(p.pid, 0)}")
        state = p.state
        if state is PageState.LOCKED and p.pid in lent_out:
            if p.tier == 0 or p.phase is not Phase.RESIDENT:
                _fail(f"lent page {p!r} is not resident below the GPU")
        elif state is PageState.LOCKED and (p.tier != 0 or p.phase is not Phase.RESIDENT):
            _fail(f"locked page {p!r} is not resident on GPU")
        if state is PageState.DROPPABLE and not p.in_tree and p.phase is Phase.RESIDENT:
            _fail(f"{p!r} has no owner and is not in the tree: it should have been freed")
        tier = tiers[p.tier]
        want = (p.phase is Phase.RESIDENT and state is not PageState.LOCKED
                and not (state is PageState.HELD and tier.is_last))
        got = indexed.get(p.pid)
        if want and got != p.tier:
            _fail(f"{p!r} ({state.name}) should be in tier {p.tier}'s eviction index")
        if not want and got is not None:
            _fail(f"{p!r} ({state.name}) must not be in an eviction index")
    for pid in indexed:
        if pid not in pages:
            _fail(f"dead page {pid} is in an eviction index")
    for pos, tier in enumerate(tiers):  # a policy's order sees every candidate
        order = getattr(tier, "order", None)
        if order is None:
            continue
        for p in order.missing([p for bucket in tier.lru.values() for p in bucket]):
            _fail(f"{p!r} is in tier {pos}'s eviction index but not in its policy's order")
        queue = getattr(order, "queue", None)
        if queue is not None:  # a queue holds the tier's resident pages only
            held = [p for p in pages.values() if p in queue]
            for p in held:
                if p.tier != pos or p.phase not in _LIVE:
                    _fail(f"{p!r} is in tier {pos}'s policy queues but not resident there")
            if len(held) != len(queue):
                _fail(f"tier {pos}'s policy queues hold {len(queue)} pages, "
                      f"{len(held)} of them live")

    # -- counters balance --------------------------------------------------------------
    c = m.counters
    for pos, tier in enumerate(tiers):
        lv = int(tier.level)
        here = sum(1 for p in pages.values() if p.tier == pos)
        expect = (c.created_pages[lv] + sum(c.moved_pages[s][lv] for s in range(3))
                  - sum(c.moved_pages[lv][d] for d in range(3))
                  - c.dropped_pages[lv] - c.freed_pages[lv])
        if here != expect:
            _fail(f"tier {tier.level.name}: {here} pages but counters say {expect} "
                  f"({c.snapshot()})")
        s = m.tier_stats(tier.level)
        if (s.used != s.locked + s.held + s.droppable + s.reserved + s.retained + s.state
                or s.reserved < 0):
            _fail(f"tier {tier.level.name}: stats do not balance: {s}")
        pool = tier.pool  # (a node's pool: the other ranks hold the rest)
        others = 0 if pool is None else pool.used - s.used
        if s.used <= s.total and s.total != s.used + s.free + others:
            _fail(f"tier {tier.level.name}: total != used + free: {s}")
        if pool is not None and not s.used <= pool.used <= pool.capacity:
            _fail(f"tier {tier.level.name}: its pool holds {pool.used} of {pool.capacity}, "
                  f"it {s.used}")

    # -- prefix tree -------------------------------------------------------------------
    children: dict[int, int] = {}
    for key, p in m.tree.items():
        if pages.get(p.pid) is not p:
            _fail(f"tree key {key.hex()[:12]} maps to dead page {p!r}")
        if p.key != key or not p.in_tree:
            _fail(f"tree key {key.hex()[:12]} maps to {p!r} whose key/in_tree disagree")
        if p.parent is not None:
            if not p.parent.in_tree or m.tree.get(p.parent.key) is not p.parent:
                _fail(f"{p!r} outlives its parent {p.parent!r}")
            children[p.parent.pid] = children.get(p.parent.pid, 0) + 1
        elif p.index != 0:
            _fail(f"tree page {p!r} at block {p.index} has no parent")
    for p in pages.values():
        if p.nchildren != children.get(p.pid, 0):
            _fail(f"{p!r}: nchildren {p.nchildren} but {children.get(p.pid, 0)} tree children")
        if not p.in_tree and p.parent is not None:
            _fail(f"{p!r} is not in the tree but has a parent")
        if p.key and p.tag != tag_of(p.key):
            _fail(f"{p!r}: tag {p.tag} != tag_of(key) {tag_of(p.key)}")

    # -- content (the refcheck) --------------------------------------------------------
    if backend_tags is not None:
        by_tier: dict[int, list] = {}
        for p in pages.values():
            if not p.tag or (p.tier, p.slot) in reserved:
                continue  # uncommitted, or a later stage of a plan may overwrite the slot
            by_tier.setdefault(p.tier, []).append(p)
        disk_pos = m._disk_pos
        copies = list(m.tiers[disk_pos].copies) if disk_pos >= 0 else []
        if copies:
            got = backend_tags(m.tiers[disk_pos].level,
                               np.fromiter((p.copy for p in copies), np.int64, len(copies)))
            bad = [p for p, t in zip(copies, np.asarray(got, dtype=np.uint64)) if int(t) != p.tag]
            if bad:
                _fail(f"refcheck: the retained copy of {bad[0]!r} in disk slot {bad[0].copy} "
                      f"does not hold its tag {bad[0].tag} ({len(bad)} copies differ)")
        for pos, ps in by_tier.items():
            got = backend_tags(tiers[pos].level, np.fromiter((p.slot for p in ps), np.int64, len(ps)))
            want = np.fromiter((p.tag for p in ps), np.uint64, len(ps))
            bad = np.nonzero(np.asarray(got, dtype=np.uint64) != want)[0]
            if bad.size:
                p = ps[int(bad[0])]
                _fail(f"refcheck: {p!r} expects tag {p.tag}, the backend has {int(got[bad[0]])} "
                      f"({bad.size} pages differ in tier {tiers[pos].level.name})")


def _state_owners(m) -> list:
    """Requests that keep a fixed state: the registered ones, and closed ones whose state
    a plan in flight still moves (freed when it completes)."""
    closed = [rec.req for rec in m._plans.values()
              if rec.kind is PlanKind.STATE and rec.req.state is ReqState.CLOSED]
    return [r for r in m._requests.values() if r.fixed] + [r for r in closed if r.fixed]


def _batches(m, rec):
    """(moves, kind, destination tier position) of each batch a plan record remembers."""
    return [(mv, kind, dst) for mv, (kind, dst) in zip(rec.moves, rec.batch_info)]


def _audit_copies(m, owner: dict) -> set[int]:
    """Check the retained copies and write-throughs; add the slots they own to ``owner``.
    Returns the pids of ready copies out of the copy index (being taken back)."""
    disk_pos = m._disk_pos
    pages = m._pages
    count = 0
    taking: set[int] = set()
    writing: dict[int, int] = {}  # pid -> disk slot a write-through writes for it
    for w in m._wt.values():
        for p, d in zip(w.pages, w.disk_slots):
            if p.copy == d and pages.get(p.pid) is p:
                writing[p.pid] = d
            else:
                where = (disk_pos, d)
                if where in owner:
                    _fail(f"write-through slot {d} (given up) is also owned by {owner[where]!r}")
                owner[where] = ("write-through", d)
                count += 1
    reading = {h for w in m._wt.values() for h in w.host_slots}
    if reading != m._wt_reading:
        _fail(f"host slots read by write-throughs {sorted(reading)[:10]} != "
              f"{sorted(m._wt_reading)[:10]}")
    for h in m._wt_deferred:
        if h not in reading:
            _fail(f"host slot {h} waits for a write-through that does not read it")
        where = (m._host_pos, h)
        if where in owner:
            _fail(f"host slot {h} waits for a write-through but is owned by {owner[where]!r}")
        owner[where] = ("write-through source", h)
    index = m.tiers[disk_pos].copies if disk_pos >= 0 else {}
    for p in list(pages.values()):
        if p.copy < 0:
            if p.copy_ready:
                _fail(f"{p!r} has a ready copy but no copy slot")
            continue
        if disk_pos < 0 or p.tier == disk_pos:
            _fail(f"{p!r} is on disk (or there is none) but has a retained copy")
        if not 0 <= p.copy < m.tiers[disk_pos].next_fresh:
            _fail(f"{p!r}: copy slot {p.copy} outside the disk's allocated slots")
        where = (disk_pos, p.copy)
        if where in owner:
            _fail(f"copy slot {p.copy} of {p!r} is also owned by {owner[where]!r}")
        owner[where] = ("copy", p)
        count += 1
        if p.copy_ready:
            if not p.tag or p.ntokens != m.tokens_per_block:
                _fail(f"{p!r} has a ready copy but is not fully committed")
            if p not in index:
                taking.add(p.pid)
        elif p.pid in m._wt_taken:  # a pending copy an eviction takes back (or lost)
            taking.add(p.pid)
        elif writing.get(p.pid) != p.copy:
            _fail(f"{p!r}: copy {p.copy} is not ready and no write-through writes it")
    for p in index:
        if pages.get(p.pid) is not p or p.copy < 0 or not p.copy_ready:
            _fail(f"{p!r} is in the disk's copy index without a ready copy")
    if count != m._retained:
        _fail(f"{count} disk slots held by copies, the manager counts {m._retained}")
    return taking
