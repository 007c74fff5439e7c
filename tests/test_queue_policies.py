"""Queue policies (S3-FIFO, ARC, SIEVE) and LFU-DA, one story each: which page a tier
gives up, step by step, on cases small enough to name every page, each step's expectation
worked out by hand from the paper's rules (the comments); then the queue contract: a walk
is a dry run, ``evicted`` gives the same state whether it reuses the last walk or runs it
again, and a user's own queue policy runs through ``module:Class``.

As in test_policies.py: one GPU tier of a few one-block pages; a "turn" of family f is a
request over f's one block that closes at once (a hit if f's page is cached, else a new
page, evicting one when the tier is full).
"""

from __future__ import annotations

import random

import pytest

from conftest import TPB, backend_for, blocks, check, make_manager, run
from kvsim.core.policy import ARC, LFU, LFUDA, S3FIFO, EvictionPolicy, Sieve, TierQueue
from test_policies import _drive, key_of, one_tier, turn


def live(m) -> set[int]:
    return {p.pid for p in m.pages()}


def cached(m, pages_by_name: dict) -> set[str]:
    """The names whose pages are still cached."""
    alive = live(m)
    return {n for n, ps in pages_by_name.items() if all(p.pid in alive for p in ps)}


# -- S3-FIFO --------------------------------------------------------------------------------

def test_s3_fifo_small_queue_filters_one_hit_pages_and_main_is_a_clock():
    """Four pages, small_ratio 0.25: the small queue S holds one page, the main queue M
    three, the ghost G int(4 * 0.9) = 3 keys."""
    m, be = one_tier(4, S3FIFO(small_ratio=0.25))
    pages = {}
    pages["a"] = turn(m, be, 1)  # A joins S (empty)
    pages["b"] = turn(m, be, 2)  # S is full and nothing was evicted yet: B joins M
    pages["c"] = turn(m, be, 3)  # M: B C
    pages["d"] = turn(m, be, 4)  # M: B C D; the tier is full
    turn(m, be, 2)  # B hit: freq 1
    # E needs a page: M holds 3, not more than its 3, and S is not empty: from S, A (hit
    # 0 times, fewer than move_to_main = 2) is evicted and its key enters G. E joins S.
    pages["e"] = turn(m, be, 5)
    assert cached(m, pages) == {"b", "c", "d", "e"}
    # F: from S again: E, the newest page but one, goes (LRU would evict C, the least
    # recent); E's key enters G
    pages["f"] = turn(m, be, 6)
    assert cached(m, pages) == {"b", "c", "d", "f"}
    # A again: a ghost hit, so A will join M. Room first: from S, F goes
    pages["a"] = turn(m, be, 1)
    assert cached(m, pages) == {"a", "b", "c", "d"}
    # G: M now holds 4, more than its 3: from M, a 2-bit clock: B (freq 1) is reinserted
    # at M's head with freq 0, C (freq 0) is evicted, though B is older
    pages["g"] = turn(m, be, 7)
    assert cached(m, pages) == {"a", "b", "d", "g"}
    check(m, be)


def test_s3_fifo_moves_a_page_hit_twice_in_the_small_queue_to_main():
    m, be = one_tier(4, S3FIFO(small_ratio=0.25))
    pages = {n: turn(m, be, f) for n, f in (("a", 1), ("b", 2), ("c", 3), ("d", 4))}
    pages["e"] = turn(m, be, 5)  # from S: A out; E joins S
    turn(m, be, 5)
    turn(m, be, 5)  # E hit twice: freq 2
    # F: from S, E (freq 2 >= move_to_main) moves to M (freq 0), S is empty, so from M:
    # B, the oldest with freq 0, is evicted. E survives although it came last but one
    pages["f"] = turn(m, be, 6)
    assert cached(m, pages) == {"c", "d", "e", "f"}
    # with move_to_main = 3 the same two hits are not enough: E goes
    m, be = one_tier(4, S3FIFO(small_ratio=0.25, move_to_main=3))
    pages = {n: turn(m, be, f) for n, f in (("a", 1), ("b", 2), ("c", 3), ("d", 4))}
    pages["e"] = turn(m, be, 5)
    turn(m, be, 5)
    turn(m, be, 5)
    pages["f"] = turn(m, be, 6)
    assert cached(m, pages) == {"b", "c", "d", "f"}


# -- ARC ------------------------------------------------------------------------------------

def test_arc_adapts_to_a_ghost_hit_and_replaces_from_t1_or_t2():
    """Four pages (c = 4), p from 0."""
    m, be = one_tier(4, ARC())
    pages = {n: turn(m, be, f) for n, f in (("a", 1), ("b", 2), ("c", 3), ("d", 4))}
    turn(m, be, 1)
    turn(m, be, 2)  # A, B hit: T2 = A B; T1 = C D
    # E (no ghost hit), case IV: |T1| + |B1| + 1 = 3 <= 4 and the lists hold 4 < 8:
    # REPLACE: |T1| = 2 > p = 0, so T1's least recent, C, goes to B1. T1 = D E
    pages["e"] = turn(m, be, 5)
    assert cached(m, pages) == {"a", "b", "d", "e"}
    # F: the same: D to B1 (B1 = C D). T1 = E F
    pages["f"] = turn(m, be, 6)
    assert cached(m, pages) == {"a", "b", "e", "f"}
    # C again: a B1 ghost hit: p = min(0 + max(|B2| / |B1|, 1), 4) = 1; C leaves B1.
    # REPLACE: |T1| = 2 > p = 1: E (T1's least recent) to B1; C joins T2 = A B C.
    # (LRU would evict A, the least recent.)
    pages["c"] = turn(m, be, 3)
    assert cached(m, pages) == {"a", "b", "c", "f"}
    assert m.tiers[0].order.queue.p == 1
    # G: case IV: |T1| + |B1| + 1 = 1 + 2 + 1 = 4, not above 4; 7 < 8 listed. REPLACE:
    # |T1| = 1 is not above p = 1 (and G was no B2 hit): T2's least recent, A, goes to B2
    pages["g"] = turn(m, be, 7)
    assert cached(m, pages) == {"b", "c", "f", "g"}
    # A again: a B2 ghost hit: p = max(1 - max(|B1| / |B2|, 1), 0) = max(1 - 2, 0) = 0.
    # REPLACE: |T1| = 2 (F G) > 0: F to B1; A joins T2
    pages["a"] = turn(m, be, 1)
    assert cached(m, pages) == {"a", "b", "c", "g"}
    assert m.tiers[0].order.queue.p == 0
    check(m, be)


def test_arc_keeps_its_target_within_a_tier_that_shrinks():
    """ARC's p, the target size of T1, lies in 0..c. Four pages: a stream drives p to 4,
    with 2 and 0 among B2's keys. The quota shrinks to 2 pages (1 in T1, 3 in T2): p is 2
    at most now. 2 comes back, a B2 ghost hit: p = max(2 - max(|B1| / |B2|, 1), 0) = 1,
    and REPLACE takes T1's page (|T1| = 1 = p, for a B2 hit): 1 goes, 3 stays. A p kept
    at 4 would fall to 3 only, above |T1|, and T2's 3 would go instead."""
    from kvsim.core import Level

    m, be = one_tier(4, ARC())
    pages = {}
    for f in (5, 6, 2, 5, 2, 0, 3, 6, 7, 1, 0, 6, 3):
        pages[f] = turn(m, be, f)
    q = m.tiers[0].order.queue
    assert q.p == 4 and {key_of(2), key_of(0)} <= set(q.b2)
    run(m, be, m.set_quota(Level.GPU, 2 * 16))
    assert list(q.t1) == pages[1] and list(q.t2) == pages[3] and q.p == 4
    pages[2] = turn(m, be, 2)
    assert q.p == 1
    assert {f for f in (1, 2, 3) if all(p.pid in live(m) for p in pages[f])} == {2, 3}
    check(m, be)


# -- SIEVE ----------------------------------------------------------------------------------

def test_sieve_hand_passes_visited_pages_and_evicts_new_ones_first():
    m, be = one_tier(3, Sieve())
    pages = {n: turn(m, be, f) for n, f in (("a", 1), ("b", 2), ("c", 3))}  # queue A B C
    turn(m, be, 1)  # A visited
    # D: the hand starts at the tail: A is visited (bit cleared, passed), B is not:
    # evicted; the hand stops at C. Queue A C D
    pages["d"] = turn(m, be, 4)
    assert cached(m, pages) == {"a", "c", "d"}
    turn(m, be, 1)  # A visited again
    # E: the hand at C: not visited: evicted; the hand stops at D. Queue A D E
    pages["e"] = turn(m, be, 5)
    assert cached(m, pages) == {"a", "d", "e"}
    turn(m, be, 4)  # D visited
    # F: the hand at D: visited, passed (cleared); E not visited: evicted, the newest
    # page but one (LRU would evict A, the least recent); past the head, the hand unsets
    pages["f"] = turn(m, be, 6)
    assert cached(m, pages) == {"a", "d", "f"}
    # G: the hand starts at the tail again: A (visited at its last hit) is passed; D,
    # cleared at the last eviction, is evicted
    pages["g"] = turn(m, be, 7)
    assert cached(m, pages) == {"a", "f", "g"}
    check(m, be)


# -- LFU-DA ---------------------------------------------------------------------------------

def test_lfu_da_ages_out_a_page_once_popular_where_lfu_keeps_it():
    for policy, expect in ((LFU(), {"a", "e"}), (LFUDA(), {"d", "e"})):
        m, be = one_tier(2, policy)
        pages = {"a": turn(m, be, 1)}
        turn(m, be, 1)
        turn(m, be, 1)                # A: 3 uses: H = L + 3 = 3
        pages["b"] = turn(m, be, 2)   # H = 1
        pages["c"] = turn(m, be, 3)   # B (H 1) out, L = 1; C: H = 2
        pages["d"] = turn(m, be, 4)   # C (H 2) out, L = 2; D: H = 3
        # E: A (H 3, valued at turn 3) and D (H 3, valued later) tie: A, valued first,
        # goes. LFU keeps A (3 uses) and evicts D (1 use)
        pages["e"] = turn(m, be, 5)
        assert cached(m, pages) == expect, policy.name


def test_queue_policies_ignore_priorities():
    for policy in (S3FIFO(small_ratio=0.5), ARC(), Sieve()):
        m, be = one_tier(2, policy)
        hi = turn(m, be, 1, priority=5)
        assert {p.priority for p in hi} == {0}


# -- a failed eviction ----------------------------------------------------------------------

def _fail_then_retry(policy, families):
    """GPU tier of 2 pages over a host tier: a turn over each of ``families``, then a new
    page whose eviction (GPU -> host) fails and is rolled back, then the same grow again,
    which succeeds. The queue after the failure, and which page the retry evicts."""
    from kvsim.core.plan import BatchKind

    m = make_manager(gpu=2, host=4, disk=None, policy=policy)
    be = backend_for(m)
    pages = {f: turn(m, be, f)[0] for f in families}
    req = m.create("s", blocks(1, 9), TPB)
    run(m, be, m.resume(req))
    plan = m.grow(req, TPB)
    run(m, be, plan, fail_batches={i for i, b in enumerate(plan.batches)
                                   if b.kind is BatchKind.EVICT})
    assert {p.tier for p in pages.values()} == {0}  # nothing left the GPU
    q = m.tiers[0].order.queue
    after = {k: v.copy() if hasattr(v, "copy") else v for k, v in vars(q).items()}
    run(m, be, m.grow(req, TPB))
    check(m, be)
    return after, {f for f, p in pages.items() if p.tier != 0}


def test_a_failed_eviction_is_no_ghost_hit_in_arc():
    """A, B, A: T1 = B, T2 = A. C needs room: REPLACE takes B (T1, |T1| = 1 > p = 0) to
    B1, but the copy to host fails and B stays. No request asked for B again: no ghost
    hit, p stays 0, B stays in T1 and B1 forgets it. The retry evicts B again, not A."""
    after, out = _fail_then_retry(ARC(), [1, 2, 1])
    assert after["p"] == 0 and not after["b1"] and not after["b2"]
    assert [p.index for p in after["t1"]] == [0] and len(after["t2"]) == 1
    assert out == {2}


def test_a_failed_eviction_is_no_ghost_hit_in_s3_fifo():
    """small_ratio 0.5 of 2 pages: S holds 1. A joins S, B (S full before any eviction)
    joins M. C needs room: from S, A (not hit) goes to the ghost, but the copy to host
    fails and A stays: no ghost hit, so A stays in S rather than joining M, and the ghost
    forgets it. The retry evicts A again (from S), not B (from M)."""
    after, out = _fail_then_retry(S3FIFO(small_ratio=0.5), [1, 2])
    assert len(after["small"]) == 1 and len(after["main"]) == 1 and not after["ghost"]
    assert out == {1}


# -- the queue contract ----------------------------------------------------------------------

def _state(queue: TierQueue) -> tuple:
    """A queue's state as plain values (pages by pid), version and last walk left out."""
    def plain(v):
        if hasattr(v, "pid"):
            return ("page", v.pid)
        if isinstance(v, dict):
            return tuple((plain(k), plain(x)) for k, x in v.items())
        if isinstance(v, (set, frozenset)):
            return tuple(sorted(map(plain, v), key=repr))
        if isinstance(v, (list, tuple)):
            return tuple(map(plain, v))
        return v
    return tuple((k, plain(v)) for k, v in sorted(vars(queue).items())
                 if k not in ("tier", "version", "_last"))


QUEUES = [lambda: S3FIFO(small_ratio=0.3), ARC, Sieve]


@pytest.mark.parametrize("make", QUEUES, ids=["s3-fifo", "arc", "sieve"])
@pytest.mark.parametrize("seed", range(4))
def test_a_walk_changes_nothing_and_evicted_reuses_it_or_replays_alike(make, seed):
    """The seeded lifecycle mix of test_policies._drive (a GPU + host manager, held and
    preempted turns): walking a tier's queue, whole or in part, leaves its state as it
    was; and a run whose queues never reuse a walk's overlay (``evicted`` replays the
    walk) keeps the same pages in the same tiers, step after step."""
    def fresh():
        pol = make()
        orig = pol.tier_queue

        def tier_queue(tier):
            q = orig(tier)
            real_evicted = type(q).evicted

            def evicted(pages, q=q):
                q._last = None  # forget the walk: replay it
                real_evicted(q, pages)
            q.evicted = evicted
            return q
        pol.tier_queue = tier_queue
        return pol

    assert _drive(make(), seed, steps=300) == _drive(fresh(), seed, steps=300)
    rnd = random.Random(seed)
    m = make_manager(gpu=6, host=5, disk=None, policy=make())
    be = backend_for(m)
    for i in range(60):
        fam, n = rnd.randrange(8), rnd.randrange(1, 3)
        req = m.create("s", blocks(n, fam), n * TPB)
        plan = m.resume(req)
        if not plan:
            m.close(req)
            continue
        run(m, be, plan)
        g = m.grow(req, n * TPB)
        if g:
            run(m, be, g)
            be.fill(m.commit(req, n * TPB, final=True))
        m.close(req)
        for t in m.tiers:
            q = t.order.queue
            before = _state(q)
            list(q.walk())
            w = q.walk()
            next(w, None)  # a walk left part way
            assert _state(q) == before, i
    check(m, be)


# -- your own queue policy -------------------------------------------------------------------

class Fifo(TierQueue):
    """First in, first out: the plainest queue (an example of the interface)."""

    def __init__(self, tier):
        super().__init__(tier)
        self.q: dict = {}  # insertion-ordered

    def insert(self, page):
        self.version += 1
        self.q[page] = None

    def remove(self, page):
        self.version += 1
        del self.q[page]

    def _walk(self, run):
        for p in self.q:
            run.seen.add(p)
            run.last = p
            yield p

    def _apply(self, run, gone, stray):
        for p in gone | stray:
            self.q.pop(p, None)

    def __contains__(self, page):
        return page in self.q

    def __len__(self):
        return len(self.q)


class FifoPolicy(EvictionPolicy):
    name = "fifo"

    def tier_queue(self, tier):
        return Fifo(tier)


def test_a_user_queue_policy_orders_first_in_first_out_and_keeps_the_invariants():
    from kvsim.run.policies import load_user_policy

    policy = load_user_policy("test_queue_policies:FifoPolicy")
    m, be = one_tier(3, policy)
    pages = {n: turn(m, be, f) for n, f in (("a", 1), ("b", 2), ("c", 3))}
    turn(m, be, 1)  # a hit changes nothing in FIFO order
    pages["d"] = turn(m, be, 4)
    assert cached(m, pages) == {"b", "c", "d"}
    # a held page is never a victim, whatever the queue says: B is first in line
    held = m.create("s", blocks(1, 2), TPB)
    pages["e"] = turn(m, be, 5)
    assert cached(m, pages) == {"b", "d", "e"}
    m.close(held)
    check(m, be)
