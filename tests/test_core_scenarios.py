"""Scenario tests of the policy core, one behaviour each, told step by step.

Tiers are tiny (a handful of 16-byte pages, 4 tokens a block) so every page can be named.
Plans run on the reference backend, stage by stage as the engine runs them; after every
transfer the refcheck compares the tags in the backend with the tags the manager expects,
and ``audit`` checks every invariant of the core.
"""

from __future__ import annotations

from conftest import PAGE, backend_for, blocks, check, make_manager, new_active, run
from kvsim.core import (Level, PageState, Phase, RefusalReason, ReqState, chain_key,
                        scope_root, tag_of)
from kvsim.core.plan import BatchKind
from kvsim.core.tiers import Tier

GPU, HOST, DISK = Level.GPU, Level.HOST, Level.DISK


def lru(m, level):
    """The eviction order of a tier, as page ids."""
    return [p.pid for p in m.tiers[m.tier_pos(level)].candidates()]


def where(page):
    return (page.tier, page.slot, page.phase)


def stats(m):
    return [m.tier_stats(t.level) for t in m.tiers]


# -- prefix matching ---------------------------------------------------------------------

def test_prefix_match_via_create_and_probe_is_read_only():
    m = make_manager()
    be = backend_for(m)
    # A computes a 12-token prompt (3 full blocks), commits it and leaves.
    a = new_active(m, be, 12)
    shared = list(a.pages)
    m.close(a)
    check(m, be)
    order, counters = lru(m, GPU), m.counters.snapshot()
    # Probing a 20-token prompt that starts with A's 12 tokens finds them on GPU ...
    assert m.probe_reuse("s", blocks(5), 20) == {GPU: 12, HOST: 0, DISK: 0}
    # ... and is read-only: no counter moved, the LRU order is the same, nobody holds.
    assert m.counters.snapshot() == counters
    assert lru(m, GPU) == order
    assert all(p.holds == 0 for p in shared)
    # create() does the same match for real: B now holds A's pages and counts the hit.
    b = m.create("s", blocks(5), 20)
    assert b.pages == shared and b.cached_tokens == 12 and b.hit_by_level == (12, 0, 0)
    assert all(p.holds == 1 and p.state is PageState.HELD for p in shared)
    assert m.counters.hit_tokens == [12, 0, 0]
    check(m, be)


def test_commit_inserts_pages_into_the_tree():
    m = make_manager()
    be = backend_for(m)
    # A grows to 10 tokens: blocks 0 and 1 are full, block 2 holds 2 tokens.
    a = new_active(m, be, 10, commit=False)
    assert len(m.tree) == 0
    # Committing 8 computed tokens inserts the two full blocks, keyed by the chain hash.
    k0 = chain_key(scope_root("s"), 0)
    k1 = chain_key(k0, 1)
    fill = m.commit(a, 8)
    assert fill.level is GPU and fill.tags == [tag_of(k0), tag_of(k1)]
    assert fill.slots == [a.pages[0].slot, a.pages[1].slot]
    assert m.tree.get(k0) is a.pages[0] and m.tree.get(k1) is a.pages[1]
    assert a.pages[1].parent is a.pages[0] and a.pages[0].nchildren == 1
    be.fill(fill)
    # Without final, the partial block stays out; with final it joins too.
    assert m.commit(a, 10).pages == 0
    fill = m.commit(a, 10, final=True)
    assert fill.pages == 1 and m.tree.get(chain_key(k1, 2)) is a.pages[2]
    be.fill(fill)
    check(m, be)


def test_partial_last_block_is_reused_as_a_prefix():
    m = make_manager()
    be = backend_for(m)
    # A commits 10 tokens: its last page covers 2 of block 2's 4 tokens.
    a = new_active(m, be, 10)
    assert a.pages[2].ntokens == 2
    m.close(a)
    # A prompt needing <= 2 tokens of block 2 reuses the partial page ...
    assert m.probe_reuse("s", blocks(3), 9)[GPU] == 9
    assert m.probe_reuse("s", blocks(3), 10)[GPU] == 10
    # ... one needing 3 tokens of it only reuses the two full blocks.
    assert m.probe_reuse("s", blocks(3), 11)[GPU] == 8
    b = m.create("s", blocks(3), 9)
    assert len(b.pages) == 3 and b.tokens == 9
    check(m, be)


def test_reuse_scopes_are_isolated():
    m = make_manager()
    be = backend_for(m)
    # Tenant "a" caches a prompt; tenant "b" sends the very same block ids.
    m.close(new_active(m, be, 8, scope="a"))
    assert m.probe_reuse("a", blocks(2), 8)[GPU] == 8
    assert m.probe_reuse("b", blocks(2), 8) == {GPU: 0, HOST: 0, DISK: 0}
    b = m.create("b", blocks(2), 8)
    assert b.pages == [] and b.cached_tokens == 0
    check(m, be)


# -- the tree and dropping ---------------------------------------------------------------

def _chain_under_a_low_priority_root():
    """GPU is the only (so the last) tier: eviction there drops. A (priority 0) caches
    block 0; B (priority 1) extends it with blocks 1 and 2; both leave. The root has the
    lowest priority, so it is the first eviction candidate, though it has a child."""
    m = make_manager(gpu=3, host=None, disk=None)
    be = backend_for(m)
    a = new_active(m, be, 4, priority=0)
    b = m.create("s", blocks(3), 12, priority=1)
    run(m, be, m.resume(b))
    run(m, be, m.grow(b, 12))
    be.fill(m.commit(b, 12))
    m.close(b)
    m.close(a)
    root = m.tree.get(chain_key(scope_root("s"), 0))
    assert lru(m, GPU)[0] == root.pid and root.nchildren == 1
    return m, be, root


def test_a_child_never_outlives_its_parent():
    m, be, root = _chain_under_a_low_priority_root()
    # C needs two GPU pages: the leaf (block 2), then its parent (block 1, now a leaf)
    # drop; the root stays although it was the first candidate.
    c = new_active(m, be, 8, family=7, commit=False)
    assert m.counters.dropped_pages[GPU] == 2
    assert m.tree.get(root.key) is root and root.nchildren == 0 and len(m.tree) == 1
    assert [p.index for p in m.tree.pages()] == [0]
    check(m, be)
    del c


def test_a_whole_chain_drops_leaves_first_even_when_its_root_is_oldest():
    m, be, root = _chain_under_a_low_priority_root()
    # D needs all three GPU pages. The root, skipped at first for its child, becomes a
    # leaf once blocks 2 and 1 are picked, and drops after them (no false refusal).
    d = new_active(m, be, 12, family=8, commit=False)
    assert m.counters.dropped_pages[GPU] == 3 and len(m.tree) == 0
    assert root.phase is Phase.DROPPED
    check(m, be)
    del d


# -- slots and eviction order ------------------------------------------------------------

def test_slot_allocator_recycled_first_then_fresh_ascending():
    t = Tier(GPU, 0, False, PAGE, capacity=8, max_slots=8)
    assert [t.alloc() for _ in range(3)] == [0, 1, 2]
    t.release(1)
    t.release(0)
    # last freed, first reused; then fresh ids continue ascending
    assert [t.alloc(), t.alloc(), t.alloc()] == [0, 1, 3]
    # alloc_many hands out exactly what repeated alloc would
    t.release(2)
    t.release(0)
    assert t.alloc_many(4) == [0, 2, 4, 5]
    assert t.used == 6 and t.next_fresh == 6
    # through the manager: a private page freed by close gives its slot back first
    m = make_manager(gpu=4)
    be = backend_for(m)
    a = new_active(m, be, 8, commit=False)
    assert [p.slot for p in a.pages] == [0, 1]
    m.close(a)  # never committed: both pages are freed, slot 0 last
    b = new_active(m, be, 12, family=1)
    assert [p.slot for p in b.pages] == [0, 1, 2]
    check(m, be)


def test_candidates_keep_lru_order_across_bucket_rebuilds():
    # victims leave an index from the front in bulk; the tier rebuilds its buckets now and
    # then (a dict iterated from the front steps over every deleted entry until resized):
    # the order seen by eviction must be the plain LRU order throughout
    from kvsim.core.pages import Page

    t = Tier(GPU, 0, False, PAGE, capacity=10_000, max_slots=10_000)
    pages = [Page(i, 0, 0, i, 1, i % 2, Phase.RESIDENT) for i in range(3000)]
    order = {0: [], 1: []}  # expected LRU order per priority
    for p in pages[:1000]:
        t.index_add(p)
        order[p.priority].append(p)
    nxt = 1000
    for step in range(200):
        front = list(t.candidates())[:7]  # the 7 oldest: lowest priority first
        assert front == (order[0] + order[1])[:7]
        t.index_discard_each(front)  # bulk removal, as for victims
        for p in front:
            order[p.priority].remove(p)
        touched = order[1][len(order[1]) // 2]  # touch one from the middle
        t.index_touch(touched)
        order[1].remove(touched)
        order[1].append(touched)
        for p in pages[nxt:nxt + 5]:  # newcomers
            t.index_add(p)
            order[p.priority].append(p)
        nxt += 5
    assert list(t.candidates()) == order[0] + order[1]
    assert t.index_size() == len(order[0]) + len(order[1])


def test_eviction_by_priority_then_lru():
    m = make_manager(gpu=4, host=4, disk=None)
    be = backend_for(m)
    # Four one-block prompts, cached in this order: x (prio 1), y (prio 0), z (prio 1), w (prio 0)
    pages = {}
    for name, fam, prio in [("x", 1, 1), ("y", 2, 0), ("z", 3, 1), ("w", 4, 0)]:
        r = new_active(m, be, 4, family=fam, priority=prio)
        pages[name] = r.pages[0]
        m.close(r)
    # Lowest priority first (y, w), oldest first within a priority; then x, z.
    assert lru(m, GPU) == [pages[n].pid for n in "ywxz"]
    # A new request needs three GPU pages: y, w and x move to host, z stays.
    r = m.create("s", blocks(3, family=9), 12)
    run(m, be, m.resume(r))
    plan = m.grow(r, 12)
    (b,) = plan.batches
    assert b.kind is BatchKind.EVICT and (b.src, b.dst) == (GPU, HOST)
    assert b.src_slots == [pages[n].slot for n in "ywx"]
    run(m, be, plan)
    assert [pages[n].tier for n in "ywxz"] == [1, 1, 1, 0]
    check(m, be)


def test_cascade_gpu_host_disk_dropped():
    m = make_manager(gpu=1, host=1, disk=1)
    be = backend_for(m)
    seen = []
    for fam in range(4):
        # each one-block prompt is computed, cached and left; the next one pushes it colder
        r = m.create("s", blocks(1, family=fam), 4)
        run(m, be, m.resume(r))
        plan = m.grow(r, 4)
        seen.append([(b.src, b.dst, b.stage) for b in plan.batches])
        run(m, be, plan)
        be.fill(m.commit(r, 4))
        m.close(r)
        check(m, be)
    assert seen[0] == []
    assert seen[1] == [(GPU, HOST, 1)]
    # colder moves run first (stage 0) so the slot they vacate can take the warmer page
    assert seen[2] == [(HOST, DISK, 0), (GPU, HOST, 1)]
    assert seen[3] == [(HOST, DISK, 0), (GPU, HOST, 1)]  # the disk page was dropped at planning
    c = m.counters
    assert c.dropped_pages == [0, 0, 1] and c.evicted_pages == [3, 2, 0]
    assert [m.probe_reuse("s", blocks(1, family=f), 4) for f in (0, 1, 2, 3)] == [
        {GPU: 0, HOST: 0, DISK: 0}, {GPU: 0, HOST: 0, DISK: 4},
        {GPU: 0, HOST: 4, DISK: 0}, {GPU: 4, HOST: 0, DISK: 0}]


def test_background_evict_frees_gpu_slots_ahead_of_demand():
    """Story: the GPU is full of cached pages (one locked by an active request). The engine
    asks the core to move two pages out ahead of demand: the two least recently used
    unlocked pages go to host in one batch; the locked page never moves. When the plan
    completes the GPU has two free slots, and a grow that needs two pages moves nothing.
    Asking for more than can leave is refused and changes nothing."""
    m = make_manager(gpu=4, host=4, disk=None)
    be = backend_for(m)
    old = [new_active(m, be, 4, family=f) for f in (1, 2, 3)]
    cached = [r.pages[0] for r in old]
    for r in old:
        m.close(r)                                  # closed in order: page 1 is the LRU
    busy = new_active(m, be, 4, family=4)          # locked: active
    assert m.tiers[0].free == 0
    before = m.counters.snapshot()
    refused = m.evict(GPU, 4)                       # only 3 pages are evictable
    assert not refused and m.counters.snapshot()["moved_pages"] == before["moved_pages"]
    plan = m.evict(GPU, 2)
    (b,) = plan.batches
    assert (b.kind, b.src, b.dst, b.pages) == (BatchKind.EVICT, GPU, HOST, 2)
    assert b.src_slots == [cached[0].slot, cached[1].slot]
    run(m, be, plan)
    assert m.tiers[0].free == 2
    assert [p.tier for p in cached] == [1, 1, 0]
    check(m, be)
    grow = m.grow(busy, 12, blocks(3, family=4)[1:])
    assert grow and grow.batches == ()
    m.complete(grow)
    check(m, be)


def test_a_full_host_tier_is_skipped_gpu_victims_go_straight_to_disk():
    """Story: request A's two pages were pushed to the host tier, which they fill. The GPU
    is full of B's held pages. Resuming A needs two GPU slots; B's pages cannot go to host
    (its only pages are A's, which are leaving), so they go straight to disk (staged through
    host by the backend), and A's pages come up. Nothing is dropped: B's pages are held."""
    m = make_manager(gpu=2, host=2, disk=4)
    be = backend_for(m)
    a = new_active(m, be, 8, family=1)
    m.suspend(a)
    b = new_active(m, be, 8, family=2)            # evicts A's pages to host
    m.suspend(b)
    assert [p.tier for p in a.pages] == [1, 1] and [p.tier for p in b.pages] == [0, 0]
    assert m.tiers[1].free == 0
    plan = m.resume(a)
    assert plan, plan
    kinds = [(x.kind, x.src, x.dst, x.stage) for x in plan.batches]
    assert kinds == [(BatchKind.EVICT, GPU, DISK, 1), (BatchKind.ONBOARD, HOST, GPU, 2)]
    run(m, be, plan)
    assert [p.tier for p in a.pages] == [0, 0] and [p.tier for p in b.pages] == [2, 2]
    assert m.counters.moved_pages[0][2] == 2 and m.counters.dropped_pages == [0, 0, 0]
    check(m, be)


# -- resume ------------------------------------------------------------------------------

def test_resume_onboards_held_pages_and_refcheck_passes():
    m = make_manager(gpu=2, host=4, disk=None)
    be = backend_for(m)
    # A computes two blocks and is suspended between turns; B's work pushes A to host.
    a = new_active(m, be, 8)
    m.suspend(a)
    b = new_active(m, be, 8, family=1)
    assert [p.tier for p in a.pages] == [1, 1] and all(p.holds == 1 for p in a.pages)
    m.suspend(b)
    # A's next turn: resume brings both pages back (B's pages go to host, a swap).
    plan = m.resume(a)
    kinds = sorted((b_.kind.name, b_.src.name, b_.dst.name) for b_ in plan.batches)
    assert kinds == [("EVICT", "GPU", "HOST"), ("ONBOARD", "HOST", "GPU")]
    assert a.state is ReqState.RESUMING
    run(m, be, plan)
    assert a.state is ReqState.ACTIVE and all(p.locks == 1 and p.tier == 0 for p in a.pages)
    assert m.counters.onboarded_pages == 2
    check(m, be)


def test_resume_that_cannot_fit_changes_nothing():
    m = make_manager(gpu=2, host=4, disk=None)
    be = backend_for(m)
    # A is suspended and pushed to host by B, which stays active (its pages are locked).
    a = new_active(m, be, 8)
    m.suspend(a)
    b = new_active(m, be, 8, family=1)
    before, counters = stats(m), m.counters.snapshot()
    places = [where(p) for p in m.pages()]
    # Resuming A needs two GPU slots; none is free or evictable.
    plan = m.resume(a)
    assert not plan and plan.reason is RefusalReason.NO_ROOM
    assert a.state is ReqState.SUSPENDED
    assert stats(m) == before and [where(p) for p in m.pages()] == places
    counters["refusals"] += 1  # the only counter that moves: refusals are counted
    assert m.counters.snapshot() == counters
    check(m, be)
    # Once B's turn ends, A fits.
    m.suspend(b)
    run(m, be, m.resume(a))
    assert a.state is ReqState.ACTIVE
    check(m, be)


# -- quotas ------------------------------------------------------------------------------

def test_shrinking_quota_evicts_and_keeps_held_pages():
    m = make_manager(gpu=4, host=4, disk=None, max_gpu=8)
    be = backend_for(m)
    # A is suspended (two held pages), C's one page is droppable; all on GPU.
    a = new_active(m, be, 8)
    m.suspend(a)
    c = new_active(m, be, 4, family=1)
    m.close(c)
    assert m.tier_stats(GPU).used == 3
    # Shrinking GPU to one page evicts two (oldest first), held pages move, never drop.
    plan = m.set_quota(GPU, 1 * PAGE)
    assert plan and [(b.src, b.dst, b.pages) for b in plan.batches] == [(GPU, HOST, 2)]
    run(m, be, plan)
    s = m.tier_stats(GPU)
    assert s.total == 1 and s.used == 1 and s.free == 0
    assert m.counters.dropped_pages == [0, 0, 0]
    assert all(p.holds == 1 for p in a.pages)
    check(m, be)


def test_shrinking_below_held_pages_is_refused():
    # GPU only: held pages have nowhere colder to go, and held pages never drop.
    m = make_manager(gpu=4, host=None, disk=None)
    be = backend_for(m)
    a = new_active(m, be, 12)
    m.suspend(a)
    before = stats(m)
    plan = m.set_quota(GPU, 2 * PAGE)
    assert not plan and plan.reason is RefusalReason.NO_ROOM
    assert stats(m) == before and m.tiers[0].capacity == 4
    check(m, be)


def test_growing_quota_is_immediate():
    m = make_manager(gpu=2, host=None, disk=None, max_gpu=4)
    be = backend_for(m)
    a = new_active(m, be, 8)
    more = blocks(2, start=2)
    assert not m.grow(a, 16, more)  # GPU full of A's locked pages
    assert len(a.blocks) == 2       # a refused grow appends nothing
    plan = m.set_quota(GPU, 4 * PAGE)
    assert plan and plan.batches == ()
    assert m.tier_stats(GPU).total == 4  # before completion, already
    m.complete(plan)
    run(m, be, m.grow(a, 16, more))
    assert m.tier_stats(GPU).used == 4
    check(m, be)


# -- transfers in flight and failures ----------------------------------------------------

def test_transfer_in_flight_pins_its_pages():
    m = make_manager(gpu=2, host=4, disk=None)
    be = backend_for(m)
    # A is suspended on GPU: both its pages are evictable.
    a = new_active(m, be, 8)
    m.suspend(a)
    oldest = m.tiers[0].candidates().__next__()
    # B needs one GPU page: the plan moves A's oldest page to host. Submitted, not done.
    b = new_active(m, be, 0, family=1, commit=False)
    plan_b = m.grow(b, 4, blocks(1, family=1))
    (eb,) = plan_b.batches
    ticket_b = be.transfer(eb)
    assert oldest.phase is Phase.MOVING and eb.src_slots == [oldest.slot]
    check(m, be)
    # C needs one GPU page too: it must pick A's other page, never the moving one.
    c = new_active(m, be, 0, family=2, commit=False)
    plan_c = m.grow(c, 4, blocks(1, family=2))
    (ec,) = plan_c.batches
    assert ec.src_slots != eb.src_slots
    assert set(ec.dst_slots).isdisjoint(eb.dst_slots)
    ticket_c = be.transfer(ec)
    # D finds nothing evictable: both of A's pages are pinned by transfers in flight.
    d = new_active(m, be, 0, family=3, commit=False)
    assert not m.grow(d, 4, blocks(1, family=3))
    # Resuming A while its pages move is refused as BUSY... after suspending nothing; A
    # is suspended and its pages are in flight.
    assert m.resume(a).reason is RefusalReason.BUSY
    check(m, be)
    # The link delivers; the plans complete; everything checks out.
    be.step()
    be.step()
    m.complete(plan_b, [ticket_b.ok])
    m.complete(plan_c, [ticket_c.ok])
    assert [p.tier for p in a.pages] == [1, 1]
    for r in (b, c):
        be.fill(m.commit(r, 4))
    check(m, be)


def test_failed_batch_rolls_back():
    m = make_manager(gpu=1, host=1, disk=1)
    be = backend_for(m)
    # X is on host, Y on GPU, both droppable; the disk is empty.
    x = new_active(m, be, 4, family=1)
    m.close(x)
    y = new_active(m, be, 4, family=2)
    m.close(y)
    px = m.tree.get(chain_key(scope_root("s"), 1000))
    py = m.tree.get(chain_key(scope_root("s"), 2000))
    assert (px.tier, py.tier) == (1, 0)
    before, used = stats(m), [t.used for t in m.tiers]
    moved = m.counters.snapshot()["moved_pages"]
    # Z needs a GPU page: host->disk (stage 0), then GPU->host (stage 1).
    z = new_active(m, be, 0, family=3, commit=False)
    plan = m.grow(z, 4, blocks(1, family=3))
    assert [(b.src, b.dst, b.stage) for b in plan.batches] == [(HOST, DISK, 0), (GPU, HOST, 1)]
    # The first stage fails: the later stage never runs and is rolled back with it.
    oks = run(m, be, plan, fail_batches={0})
    assert oks == [False, False]
    assert where(px)[:2] == (1, px.slot) and where(py)[:2] == (0, py.slot)
    assert z.pages == [] and z.state is ReqState.ACTIVE
    assert [t.used for t in m.tiers] == used and stats(m) == before  # slots released
    assert m.counters.failed_batches == 2 and m.counters.moved_pages == moved
    check(m, be)
    # Now the second stage fails: X reached disk (kept), Y stays on GPU, Z gets nothing.
    plan = m.grow(z, 4)
    oks = run(m, be, plan, fail_batches={1})
    assert oks == [True, False]
    assert px.tier == 2 and py.tier == 0 and z.pages == []
    assert m.tier_stats(HOST).used == 0 and m.tier_stats(GPU).used == 1
    check(m, be)
    # A retry succeeds.
    run(m, be, m.grow(z, 4))
    be.fill(m.commit(z, 4))
    assert py.tier == 1 and len(z.pages) == 1
    check(m, be)


def test_failed_resume_keeps_the_request_suspended():
    m = make_manager(gpu=2, host=4, disk=None)
    be = backend_for(m)
    # A is suspended and pushed to host by B, which then leaves its pages droppable on GPU.
    a = new_active(m, be, 8)
    m.suspend(a)
    b = new_active(m, be, 8, family=1)
    m.close(b)
    # Resuming A moves B's pages to host (stage 0) and A's to GPU (stage 1); the
    # onboard fails. A stays suspended where it was; its pages are held, not locked.
    a_tiers = [p.tier for p in a.pages]
    plan = m.resume(a)
    onboard = [i for i, b_ in enumerate(plan.batches) if b_.kind is BatchKind.ONBOARD]
    assert [plan.batches[i].stage for i in onboard] == [1]
    oks = run(m, be, plan, fail_batches=onboard)
    assert oks == [True, False]
    assert m.tier_stats(GPU).used == 0  # B's pages left; A's did not arrive
    assert a.state is ReqState.SUSPENDED and [p.tier for p in a.pages] == a_tiers
    assert all(p.holds == 1 and p.locks == 0 for p in a.pages)
    check(m, be)


# -- copy-on-write -----------------------------------------------------------------------

def test_copy_on_write_when_growing_into_a_shared_partial_page():
    m = make_manager(gpu=4, host=None, disk=None)
    be = backend_for(m)
    # A commits 10 tokens: its last page (block 2) covers 2 tokens and is in the tree.
    a = new_active(m, be, 10)
    m.close(a)
    shared = m.tree.get(chain_key(chain_key(chain_key(scope_root("s"), 0), 1), 2))
    # B's prompt is the same 10 tokens: it reuses all three pages, the partial one too.
    b = m.create("s", blocks(3), 10)
    assert b.pages[2] is shared
    run(m, be, m.resume(b))
    # B now decodes 2 more tokens into block 2: it may not write the shared page.
    plan = m.grow(b, 12)
    (cp,) = plan.batches
    assert cp.kind is BatchKind.COPY and (cp.src, cp.dst) == (GPU, GPU)
    assert cp.src_slots == [shared.slot] and plan.new_pages == 0
    run(m, be, plan)
    mine = b.pages[2]
    assert mine is not shared and mine.slot == cp.dst_slots[0] and mine.locks == 1
    assert be.read_tags(GPU, cp.dst_slots)[0] == shared.tag  # the bytes were copied
    assert shared.locks == 0 and shared.ntokens == 2 and m.tree.get(shared.key) is shared
    be.fill(m.commit(b, 12, final=True))
    check(m, be)


# -- statistics and counters -------------------------------------------------------------

def test_statistics_balance():
    m = make_manager(gpu=4, host=4, disk=4)
    be = backend_for(m)
    a = new_active(m, be, 4, family=1)            # locked
    h = new_active(m, be, 4, family=2)
    m.suspend(h)                                  # held
    d = new_active(m, be, 4, family=3)
    m.close(d)                                    # droppable
    s = m.tier_stats(GPU)
    assert (s.total, s.used, s.free, s.locked, s.held, s.droppable, s.reserved) == (
        4, 3, 1, 1, 1, 1, 0)
    assert s.evictable == 2 and s.moving == 0
    # A grow held in flight: one page moves out, one slot is reserved for the new page.
    plan = m.grow(a, 12, blocks(2, family=1, start=1))
    s = m.tier_stats(GPU)
    # (the victim's slot, handed to the second new page, is still counted as its owner's)
    assert s.reserved == 1 and s.moving == 1 and s.evictable == 1
    for st_ in stats(m):
        assert st_.total == st_.used + st_.free
        assert st_.used == st_.locked + st_.held + st_.droppable + st_.reserved
    check(m, be)
    run(m, be, plan)
    for st_ in stats(m):
        assert st_.total == st_.used + st_.free
        assert st_.used == st_.locked + st_.held + st_.droppable + st_.reserved
    assert m.tier_stats(GPU).locked == 3
    check(m, be)


def test_counters():
    m = make_manager(gpu=2, host=2, disk=4)
    be = backend_for(m)
    # A caches two blocks and is suspended; B's pages push A's to host.
    a = new_active(m, be, 8)
    m.suspend(a)
    b = new_active(m, be, 8, family=1)
    m.close(b)
    # C's pages push B's (droppable) to host and A's (held) on to disk.
    c_ = new_active(m, be, 8, family=2)
    m.close(c_)
    c = m.counters
    assert [p.tier for p in a.pages] == [2, 2]
    assert c.created_pages == [6, 0, 0]
    assert c.offloaded_pages == 4 and c.offloaded_bytes == 4 * PAGE
    assert c.evicted_pages == [4, 2, 0] and c.moved_pages[1][2] == 2
    # New requests with A's and B's prompts find their tokens on disk and on host.
    a2 = m.create("s", blocks(2), 8)
    b2 = m.create("s", blocks(2, family=1), 7)
    assert a2.hit_by_level == (0, 0, 8) and b2.hit_by_level == (0, 7, 0)
    assert c.hit_tokens == [0, 7, 8]
    m.close(a2)
    m.close(b2)
    # Resuming A onboards both pages: C's pages cascade to host, B's to disk.
    plan = m.resume(a)
    assert sorted((b_.src.name, b_.dst.name, b_.stage) for b_ in plan.batches) == [
        ("DISK", "GPU", 2), ("GPU", "HOST", 1), ("HOST", "DISK", 0)]
    run(m, be, plan)
    assert c.onboarded_pages == 2 and c.onboarded_bytes == 2 * PAGE
    assert c.moved_bytes[2][0] == 2 * PAGE and c.evicted_pages == [6, 4, 0]
    assert c.dropped_pages == [0, 0, 0] and c.freed_pages == [0, 0, 0]
    assert c.refusals == 0 and c.failed_batches == 0
    check(m, be)
    snap = c.snapshot()
    assert snap["onboarded_pages"] == 2 and snap["offloaded_pages"] == 6
    # Dropping: a request that needs every GPU page with all tiers full of droppable pages
    # pushes the oldest disk pages out of the cache.
    m.close(a)
    for fam in (3, 4):
        m.close(new_active(m, be, 8, family=fam))
    assert c.dropped_pages[DISK] > 0 and c.dropped_pages[:2] == [0, 0]
    check(m, be)


def test_a_grow_to_the_same_tokens_leaves_a_shared_full_page_full():
    """A request that uses one token of another's full tree page and 'grows' to the tokens it
    has (no new token) must not shrink that shared page's token count (it once did, and
    with keep_copy a retained copy then belonged to a page that looked partial)."""
    m = make_manager()
    be = backend_for(m)
    a = new_active(m, be, 4)          # one full block, committed to the tree
    page = a.pages[0]
    m.close(a)
    b = m.create("s", blocks(1), 1)   # matches 1 token of it
    plan = m.resume(b)
    run(m, be, plan)
    assert b.pages == [page] and page.ntokens == 4
    assert m.extend(b, b.tokens)      # nothing to add: done at once
    assert page.ntokens == 4
    plan = m.grow(b, b.tokens)
    run(m, be, plan)
    assert page.ntokens == 4
    check(m, be)
