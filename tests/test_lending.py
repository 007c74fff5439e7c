"""Lending a rank's pages to a sibling (``kvsim.core.lending``, ``node.host: shared``).

Scenario: rank 0 computes a 12-token prompt (3 full blocks of 4 tokens), ends it, and
a burst of other work evicts its pages to host. A sibling asks, by chain key, how much
of that prefix rank 0 could lend: all 3 blocks, from host; the same token ids in another
reuse scope: none. Lent, the pages are pinned: eviction pressure on rank 0's host tier
takes every other page but never them, and a request of rank 0 that holds them cannot
resume (BUSY) until they are given back; then all moves again. A lease is all or
nothing: asking for a block rank 0 does not hold changes nothing. After every step the
core's audit checks its invariants (a lent page is locked, resident below the GPU, out
of every eviction index).
"""

from __future__ import annotations

import pytest

from conftest import blocks, check, make_manager, backend_for, new_active, run
from kvsim.core import CoreError, Level, Phase, RefusalReason, chain_key, scope_root
from kvsim.core.tiers import SlotPool

GPU, HOST, DISK = Level.GPU, Level.HOST, Level.DISK


def chain(scope, ids):
    key, out = scope_root(scope), []
    for i in ids:
        key = chain_key(key, i)
        out.append(key)
    return out


def test_a_prefix_in_host_is_lendable_pinned_while_lent_and_free_after():
    m = make_manager(gpu=4, host=4, disk=4)
    be = backend_for(m)
    a = new_active(m, be, 12)          # blocks 0 1 2 of family 0, committed
    m.close(a)
    run(m, be, m.evict(GPU, 3))        # its 3 pages go to host
    keys = chain("s", blocks(3))
    pages = [m.tree.get(k) for k in keys]
    assert [p.tier for p in pages] == [1, 1, 1]
    # what a sibling finds: all 3 from host; another scope, the same ids: nothing
    assert m.lendable(keys) == [HOST, HOST, HOST]
    assert m.lendable(chain("other", blocks(3))) == []
    assert m.lendable(keys + chain("s", [99])) == [HOST] * 3  # stops at the first miss
    counters = m.counters.snapshot()
    lease = m.lend(keys)
    assert lease.slots == [p.slot for p in pages] and lease.levels == [HOST] * 3
    assert lease.tags == [p.tag for p in pages] and all(p.tag for p in pages)
    assert m.counters.snapshot() == counters  # the lender counts no hit
    check(m, be)
    # eviction pressure on host: a 4th page arrives there, then every evictable page of
    # host is asked to leave; the lent ones are not evictable
    b = new_active(m, be, 4, family=1)
    m.close(b)
    run(m, be, m.evict(GPU, 1))
    assert m.tier_stats(HOST).used == 4
    refused = m.evict(HOST, 2)
    assert not refused and refused.reason is RefusalReason.NO_ROOM
    run(m, be, m.evict(HOST, 1))       # only family 1's page may leave
    assert [(p.tier, p.phase) for p in pages] == [(1, Phase.RESIDENT)] * 3
    assert [p.slot for p in pages] == lease.slots
    assert be.read_tags(HOST, lease.slots).tolist() == lease.tags  # bytes intact
    check(m, be)
    # rank 0's own next turn holds them: its resume waits while they are lent
    c = m.create("s", blocks(4), 16)
    assert c.pages == pages
    busy = m.resume(c)
    assert not busy and busy.reason is RefusalReason.BUSY
    check(m, be)
    m.give_back(lease)
    check(m, be)
    with pytest.raises(CoreError):
        m.give_back(lease)             # once
    plan = m.resume(c)
    assert plan
    run(m, be, plan)
    assert [p.tier for p in pages] == [0, 0, 0]
    check(m, be)


def test_a_lease_is_all_or_nothing():
    m = make_manager(gpu=4, host=4, disk=4)
    be = backend_for(m)
    a = new_active(m, be, 8)
    m.close(a)
    run(m, be, m.evict(GPU, 2))
    keys = chain("s", blocks(3))       # block 2 was never computed
    with pytest.raises(CoreError):
        m.lend(keys)
    assert all(m.tree.get(k).locks == 0 for k in keys[:2])
    assert m.lent() == {}
    check(m, be)
    # a page on GPU is not lendable (a sibling cannot read this GPU)
    d = new_active(m, be, 4, family=2)
    m.close(d)
    assert m.lendable(chain("s", blocks(1, family=2))) == []


def test_two_ranks_draw_host_slots_from_one_node_pool():
    """A node pool of 4 host slots under two ranks whose host tiers could each hold 4.
    Rank 0 fills it; rank 1's GPU victims then find no host slot and no host page of its
    own to evict: they skip to its disk. Rank 0, needing host room, evicts its own least
    recent host page to disk. The pool counts every rank's slots, never more than 4."""
    pool = SlotPool(4)
    m0, m1 = make_manager(gpu=4, host=4, disk=8), make_manager(gpu=4, host=4, disk=8)
    be0, be1 = backend_for(m0), backend_for(m1)
    for m in (m0, m1):
        m.share_tier(HOST, pool)
    a = new_active(m0, be0, 16)        # 4 pages on rank 0's GPU
    m0.close(a)
    run(m0, be0, m0.evict(GPU, 4))     # ... all to host: the pool is full
    assert (pool.used, m0.tiers[1].used, m0.tiers[1].free, m1.tiers[1].free) == (4, 4, 0, 0)
    b = new_active(m1, be1, 8, family=1)
    bp = list(b.pages)
    m1.close(b)
    run(m1, be1, m1.evict(GPU, 2))     # no host room, none of its own there: to disk
    assert [p.tier for p in bp] == [2, 2] and m1.tiers[1].used == 0
    assert pool.used == 4
    c = new_active(m0, be0, 4, family=2)
    cp = c.pages[0]
    m0.close(c)
    oldest = m0.tree.get(chain("s", blocks(4))[3])  # a's last page: the least recent
    run(m0, be0, m0.evict(GPU, 1))     # rank 0 makes room in the pool from its own pages
    assert cp.tier == 1 and oldest.tier == 2
    assert pool.used == m0.tiers[1].used + m1.tiers[1].used == 4 and pool.peak == 4
    check(m0, be0)
    check(m1, be1)
    with pytest.raises(CoreError):
        m0.share_tier(HOST, SlotPool(4))  # a tier already in use keeps its slots


def test_a_pools_slot_ids_are_unique_across_ranks():
    """Two ranks put 2 pages each into a pool of 4: the ids are the node's, 0..3, each
    held by one rank (one allocation of the node's memory holds them); a freed id is
    the next one handed out, whichever rank asks."""
    pool = SlotPool(4)
    ms = [make_manager(gpu=4, host=4, disk=None) for _ in range(2)]
    bes = [backend_for(m) for m in ms]
    for m in ms:
        m.share_tier(HOST, pool)
    held = []
    for r, (m, be) in enumerate(zip(ms, bes)):
        a = new_active(m, be, 8, family=r)
        ps = list(a.pages)
        m.close(a)
        run(m, be, m.evict(GPU, 2))
        held.append({p.slot for p in ps if p.tier == 1})
    assert held[0] | held[1] == {0, 1, 2, 3} and not held[0] & held[1]
    run(ms[0], bes[0], ms[0].evict(HOST, 1))   # rank 0's last tier: its LRU page drops
    assert pool.used == 3 and len(pool.recycled) == 1
    freed = pool.recycled[0]
    b = new_active(ms[1], bes[1], 4, family=5)
    bp = b.pages[0]
    ms[1].close(b)
    run(ms[1], bes[1], ms[1].evict(GPU, 1))
    assert (bp.tier, bp.slot) == (1, freed)    # rank 1 reuses the id rank 0 freed
    for m, be in zip(ms, bes):
        check(m, be)
