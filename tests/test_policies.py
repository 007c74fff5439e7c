"""Eviction policies, one story each: which page a tier gives up first under each
built-in, on hand-built cases small enough to name every page; then that the manager's
invariants hold whatever order a policy asks for, and how a run picks its policy.

Each story uses one GPU tier of a few 16-byte pages (4 tokens a block). A "turn" is a
request that computes (or finds cached) its prompt, commits it and closes, leaving its
pages droppable in the prefix tree, used once more by that turn. The manager's clock
ticks once per turn.
"""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from conftest import TPB, backend_for, blocks, check, make_manager, new_active, run
from kvsim.config import ConfigFileError, load_config
from kvsim.core import Level, chain_key, scope_root
from kvsim.core.policy import (GDSF, LFU, LRU, POLICY_NAMES, Belady, EvictionPolicy, NextUses,
                               PriorityLRU, make_policy)

GPU = Level.GPU


def turn(m, be, family: int, nblocks: int = 1, priority: int = 0):
    """One turn over ``nblocks`` blocks of ``family``; returns its pages."""
    req = new_active(m, be, nblocks * TPB, family=family, priority=priority)
    pages = list(req.pages)
    m.close(req)
    check(m, be)
    return pages


def victims(m, be, n: int) -> None:
    """A new turn of ``n`` fresh blocks, left active: it pushes pages out of the full
    GPU tier."""
    fam = 900 + m.clock  # a family never seen before
    req = m.create("s", blocks(n, fam), n * TPB)
    run(m, be, m.resume(req))
    plan = m.grow(req, n * TPB)
    assert plan, plan
    run(m, be, plan)
    check(m, be)


def dropped(m, be, n: int, families):
    """Which of the named families' pages ``n`` fresh pages push out."""
    victims(m, be, n)
    live = {p.pid for p in m.pages()}
    return {f for f, ps in families.items() if any(p.pid not in live for p in ps)}


def one_tier(gpu: int, policy) -> tuple:
    m = make_manager(gpu=gpu, host=None, disk=None, policy=policy)
    return m, backend_for(m)


# -- the default ----------------------------------------------------------------------------

def test_lru_is_the_default_and_the_fast_path():
    m = make_manager()
    assert isinstance(m.policy, PriorityLRU) and m._fast
    assert make_manager(policy=LRU())._fast
    assert not make_manager(policy=LFU())._fast


def test_lru_drops_the_least_recently_used():
    m, be = one_tier(3, None)
    a = turn(m, be, 1)
    b = turn(m, be, 2)
    turn(m, be, 1)  # A is used again: now B is the least recent
    turn(m, be, 3)
    assert dropped(m, be, 1, {"a": a, "b": b}) == {"b"}


class HeapLRU(EvictionPolicy):
    """LRU's order through the generic (heap) path, as a user would write it."""

    name = "heap-lru"

    def key(self, page, clock):
        return (page.priority, page.last_use)


def test_the_generic_path_with_lrus_key_drops_what_lru_drops():
    """Recency is when a page's turn ends (or it arrives in a tier), not when its turn is
    declared: two sessions declare their turns A then B, B's turn ends first, then A's.
    A is now the more recent, so a fresh page pushes out B, through either path. (The
    generic path used to date a page by its turn's declaration and dropped A.)"""
    for policy in (LRU(), HeapLRU()):
        m, be = one_tier(2, policy)
        a = turn(m, be, 1)
        b = turn(m, be, 2)
        ra = m.create("s", blocks(1, 1), TPB)  # declared first: it holds A's page
        rb = m.create("s", blocks(1, 2), TPB)  # declared second: B's page
        for req in (rb, ra):  # B's turn runs and ends first, then A's
            run(m, be, m.resume(req))
            m.close(req)
            check(m, be)
        assert dropped(m, be, 1, {"a": a, "b": b}) == {"b"}, policy.name


def _drive(policy, seed: int, steps: int = 400) -> list:
    """A seeded mix of the engine's calls on a GPU + host manager without a disk (held
    pages fill the tiers, preemptions suspend running turns): the pages that survive after
    each step, as (block key, tier) pairs."""
    import random

    rnd = random.Random(seed)
    m = make_manager(gpu=6, host=5, disk=None, policy=policy)
    be = backend_for(m)
    suspended: list = []
    active: list = []
    trail = []
    for _ in range(steps):
        op = rnd.random()
        if op < 0.25 or not (suspended or active):
            fam, n = rnd.randrange(4), rnd.randrange(1, 4)
            suspended.append(m.create("s", blocks(n, fam), n * TPB))
        elif op < 0.5 and suspended:
            req = suspended.pop(rnd.randrange(len(suspended)))
            plan = m.resume(req)
            if plan:
                run(m, be, plan)
                if req.tokens < len(req.blocks) * TPB:
                    g = m.grow(req, len(req.blocks) * TPB)
                    if g:
                        run(m, be, g)
                active.append(req)
            else:
                suspended.append(req)
        elif op < 0.75 and active:
            req = active.pop(rnd.randrange(len(active)))
            be.fill(m.commit(req, req.tokens, final=True))
            m.suspend(req)  # a turn ends (or is preempted): its pages become held
            suspended.append(req)
        elif suspended:
            req = suspended.pop(rnd.randrange(len(suspended)))
            if rnd.random() < 0.5:
                fam, n = rnd.randrange(4), rnd.randrange(1, 4)
                m.prepare(req, blocks(n, fam), n * TPB)  # its next turn
                suspended.append(req)
            else:
                m.close(req)
        check(m, be)
        trail.append(sorted((p.key, p.tier) for p in m.pages() if p.key))
    return trail


@pytest.mark.parametrize("seed", range(6))
def test_the_generic_path_with_lrus_key_keeps_what_lru_keeps_along_a_lifecycle(seed):
    assert _drive(HeapLRU(), seed) == _drive(LRU(), seed)


class OneHitFirst(EvictionPolicy):
    """Pages used once first, all alike (first keyed, first out), then least recent."""

    name = "one-hit-first"
    floor_key = -1

    def key(self, page, clock):
        return -1 if page.uses == 1 else page.last_use


class _NoFloor:
    floor_key = None  # the same order through the heap alone


class OneHitFirstHeap(_NoFloor, OneHitFirst):
    pass


class BeladyHeap(_NoFloor, Belady):
    pass


@pytest.mark.parametrize("seed", range(6))
def test_a_floor_key_queued_beside_the_heap_keeps_the_heaps_order(seed):
    """Entries with the policy's floor key wait in a queue beside the heap; the walk merges
    the two: the same pages survive every step as through the heap alone."""
    from test_core_properties import MadeUpFuture

    assert _drive(OneHitFirst(), seed) == _drive(OneHitFirstHeap(), seed)
    assert _drive(Belady(MadeUpFuture()), seed) == _drive(BeladyHeap(MadeUpFuture()), seed)



class BeladyTuples(Belady):
    int_keys = False  # the generic order: (key, stamp, page) tuples


@pytest.mark.parametrize("seed", range(6))
def test_belady_packed_int_entries_keep_the_tuple_orders_choices(seed):
    from test_core_properties import MadeUpFuture

    assert _drive(Belady(MadeUpFuture()), seed) == _drive(BeladyTuples(MadeUpFuture()), seed)


def _order_trail(int_keys: bool, seed: int) -> list:
    """A tier's order driven at random (pages keyed, re-keyed, used, leaving the index,
    dropped; walks that take a few candidates, many, or all; the clock running) with keys
    that fall as the clock passes them, as ``belady``'s do, so that when a compaction or a
    sorted read re-keys the entries shows in the order: what each walk yields."""
    from types import SimpleNamespace

    from kvsim.core.policy.base import HeapOrder
    from kvsim.core.policy.intheap import IntHeapOrder, order_for
    from kvsim.core.types import Phase

    class Pg:
        def __init__(self, i, rnd):
            self.i, self.score, self.last_use, self.phase = i, 0, 0, Phase.RESIDENT
            self.due = rnd.choice([0, 0, rnd.randrange(1, 80)])  # 0: never again

    class Falling(EvictionPolicy):
        floor_key = -1000

        def key(self, page, clock):
            due = page.due
            while due and due <= clock:  # passed: the next one further on
                due += 7
            return -1000 if not due else -due

    Falling.int_keys = int_keys
    rnd = random.Random(seed)
    mgr = SimpleNamespace(clock=1, ticks=0)
    order = order_for(Falling(), mgr)
    assert type(order) is (IntHeapOrder if int_keys else HeapOrder)
    pages = [Pg(i, rnd) for i in range(150)]
    index: dict = {}  # the tier's index, insertion-ordered
    trail: list = []
    for step in range(1500):
        op = rnd.random()
        if op < 0.4:  # pages enter the index (or are touched there)
            batch = rnd.sample(pages, rnd.randrange(1, 30))
            batch = [p for p in batch if p.phase is Phase.RESIDENT]
            for p in batch:
                index.pop(p, None)
                index[p] = None
            order.touch_many(batch)
        elif op < 0.5 and index:  # a page used while indexed: re-keyed in place
            p = rnd.choice(list(index))
            p.due = rnd.choice([0, mgr.clock + rnd.randrange(1, 30)])
            order.push(p)
        elif op < 0.6 and index:  # pages leave the index (locked), or die
            for p in rnd.sample(list(index), min(len(index), rnd.randrange(1, 4))):
                del index[p]
                if rnd.random() < 0.5:
                    p.phase = Phase.DROPPED
                    pages[pages.index(p)] = Pg(100 + step, rnd)
        elif op < 0.7:
            mgr.clock += rnd.randrange(1, 4)
        else:  # a walk: the victims it takes leave the index (most die)
            want = rnd.choice([1, 1, 2, 3, 5, 20, 70, len(index) if step % 9 == 0 else 4])
            took = rnd.choice([0, 1, 1, 2, want, want, want + 2, 10 ** 6])
            got = []
            for p in order.walk(index.__contains__, len(index), want):
                if len(got) == took:
                    break
                got.append(p)
            trail.append([p.i for p in got])
            for p in got[:rnd.randrange(len(got) + 1)]:
                del index[p]
                if rnd.random() < 0.8:
                    p.phase = Phase.DROPPED
                    pages[pages.index(p)] = Pg(1000 + step, rnd)
    return trail


@pytest.mark.parametrize("seed", range(8))
def test_the_int_order_yields_what_the_tuple_order_yields(seed):
    """``IntHeapOrder`` (packed int entries, the fifo read in place) against the generic
    ``HeapOrder`` under keys that fall with the clock: the same candidates, walk after
    walk, whether a walk stops early, reads a long way (sorted) or compacts (when is
    part of the order: a compaction re-keys what it keeps)."""
    assert _order_trail(True, seed) == _order_trail(False, seed)


def test_compacting_an_order_keeps_its_candidates_and_their_order():
    """A compaction forgets superseded and departed entries only: the walk after it yields
    the same pages in the same order, the floor-keyed ones (kept in the fifo) included."""
    from types import SimpleNamespace

    from kvsim.core.policy.base import HeapOrder
    from kvsim.core.types import Phase

    class Pg:
        def __init__(self, i):
            self.i, self.score, self.last_use, self.phase = i, 0, 0, Phase.RESIDENT

    class ByScore(EvictionPolicy):  # score 0: never wanted again (the floor)
        floor_key = -1

        def key(self, page, clock):
            return -1 if page.score == 0 else page.score

    rnd = random.Random(7)
    pages = [Pg(i) for i in range(40)]
    for p in pages:
        p.score = rnd.choice([0, 0, 3, 5, 9])
    mgr = SimpleNamespace(clock=1, ticks=0)
    order = HeapOrder(ByScore(), mgr)
    indexed = set(pages)
    order.touch_many(pages)
    for _ in range(3):  # re-keyed pages leave superseded entries behind
        again = rnd.sample(pages, 15)
        for p in again:
            p.score = rnd.choice([0, 2, 7])
        order.touch_many(again)
    for p in rnd.sample(pages, 10):  # pages that left the index
        indexed.discard(p)
    held = len(order.heap) + len(order.fifo)
    # lowest key first, equal keys in the order they were keyed (their latest stamp)
    expect = [p.i for p in sorted(indexed, key=lambda p: (-1 if p.score == 0 else p.score,
                                                          order.stamps[p]))]
    order.compact(indexed.__contains__)
    assert len(order.heap) + len(order.fifo) == len(indexed) < held
    assert len(order.fifo) == sum(p.score == 0 for p in indexed) > 0
    assert [p.i for p in order.walk(indexed.__contains__, len(indexed))] == expect
    assert [p.i for p in order.walk(indexed.__contains__, len(indexed))] == expect  # again


# -- lfu ------------------------------------------------------------------------------------

def test_lfu_keeps_the_page_used_most_even_when_older():
    for policy, expect in ((LRU(), {"a"}), (LFU(), {"b"})):
        m, be = one_tier(3, policy)
        a = turn(m, be, 1)
        turn(m, be, 1)
        turn(m, be, 1)     # A: three uses, the last at turn 3
        b = turn(m, be, 2)  # B: one use, at turn 4
        c = turn(m, be, 3)  # C: one use, at turn 5
        if not m._fast:  # (LRU keeps no use counts)
            assert [p.uses for p in a + b + c] == [3, 1, 1]
        # one fresh page: LRU gives up A (least recent); LFU gives up B (fewest uses, then
        # least recent)
        assert dropped(m, be, 1, {"a": a, "b": b, "c": c}) == expect, policy.name


# -- gdsf -----------------------------------------------------------------------------------

def test_packed_int_keys_order_as_the_tuples_they_pack():
    """lfu packs (priority, uses, last_use) into one int, gdsf and lfu-da (priority,
    value): the same order as the tuples, negative priorities included."""
    from types import SimpleNamespace

    rnd = random.Random(5)
    pages = [SimpleNamespace(priority=rnd.randint(-3, 3), uses=rnd.randint(1, 40),
                             last_use=rnd.randint(1, 10**9), score=float(rnd.randint(0, 10**12)))
             for _ in range(3000)]
    lfu, gdsf = LFU(), GDSF()
    assert sorted(pages, key=lambda p: (p.priority, p.uses, p.last_use)) == \
        sorted(pages, key=lambda p: lfu.key(p, 0))
    assert sorted(pages, key=lambda p: (p.priority, p.score)) == \
        sorted(pages, key=lambda p: gdsf.key(p, 0)) == sorted(pages, key=lambda p: gdsf.keys([p], 0)[0])


def test_gdsf_keeps_a_deep_page_of_a_long_prefix_over_a_recent_shallow_leaf():
    for policy, expect in ((LRU(), {"long"}), (GDSF(), {"short"})):
        m, be = one_tier(5, policy)
        long = turn(m, be, 1, nblocks=4)   # depths 0-3: its leaf saves 4 blocks' compute
        short = turn(m, be, 2, nblocks=1)  # depth 0, more recent
        # one fresh page: LRU drops the long prompt's leaf (least recent); GDSF drops the
        # shallow page, worth the least recompute
        assert dropped(m, be, 1, {"long": long[-1:], "short": short}) == expect, policy.name


def test_gdsf_values_a_page_by_the_recompute_its_loss_brings():
    m, be = one_tier(5, GDSF())
    long = turn(m, be, 1, nblocks=4)
    # losing block i means recomputing blocks i..3, block j costing j + 1 (L = 0, one use)
    assert [p.score for p in long] == [10, 9, 7, 4]


def test_gdsf_scores_a_turn_computed_in_chunks_as_one():
    """A prompt prefilled in two chunks: the first chunk's pages are not scored as if the
    turn ended with them, so along the chain a parent is worth at least its child (the
    last tier drops children first: a parent ordered first would be skipped, walk after
    walk)."""
    m, be = one_tier(8, GDSF())
    req = m.create("s", blocks(6, 1), 6 * TPB)
    run(m, be, m.resume(req))
    assert m.extend(req, 3 * TPB)  # chunk 1: blocks 0-2
    assert m.extend(req, 6 * TPB)  # chunk 2: blocks 3-5
    be.fill(m.commit(req, 6 * TPB, final=True))
    m.close(req)
    chain = sorted((p for p in m.pages()), key=lambda p: p.index)
    scores = [p.score for p in chain]
    assert scores == [21, 20, 18, 15, 11, 6]  # sum of (j + 1) for j = i .. 5
    assert scores == sorted(scores, reverse=True)


def test_gdsf_a_use_never_lowers_a_pages_value():
    """A shared first block valued by a long prompt keeps that value when a short prompt
    uses it next: so it stays worth at least as much as the long prompt's second block,
    its child (which the last tier must drop first anyway)."""
    m, be = one_tier(8, GDSF())
    long = turn(m, be, 1, nblocks=4)  # block 0: cost 1 + 2 + 3 + 4 = 10, one use
    assert [p.score for p in long] == [10, 9, 7, 4]
    short = m.create("s", blocks(1, 1), TPB)  # block 0 again, alone: cost 1, two uses
    run(m, be, m.resume(short))
    m.close(short)
    assert long[0].uses == 2 and long[0].score == 10  # not 0 + 2 x 1 = 2
    assert long[0].score >= long[1].score


def test_gdsf_ages_out_pages_not_used_again():
    m, be = one_tier(5, GDSF())
    long = turn(m, be, 1, nblocks=4)
    for fam in range(2, 40):  # shallow one-block turns evict one page each
        turn(m, be, fam)
    # each victim raised the inflation L, so later one-block pages score above the long
    # prompt's old pages (its root is worth 10): the long prompt has aged out entirely
    assert m.policy.inflation[0] >= 10
    live = {p.pid for p in m.pages()}
    assert not any(p.pid in live for p in long)


# -- belady ---------------------------------------------------------------------------------

def key_of(family: int, nblocks: int = 1) -> bytes:
    key = scope_root("s")
    for b in blocks(nblocks, family):
        key = chain_key(key, b)
    return key


@pytest.mark.parametrize("compact", [False, True])
def test_belady_drops_the_page_used_furthest_in_the_future(compact):
    # turns 1-3 use A, B, C; the future says A comes back at turn 10, B never, C at turn 6
    future = {key_of(1): [1, 10], key_of(2): [2], key_of(3): [3, 6]}
    m, be = one_tier(3, Belady(NextUses.from_lists(future) if compact else future))
    a, b, c = turn(m, be, 1), turn(m, be, 2), turn(m, be, 3)
    assert dropped(m, be, 1, {"a": a, "b": b, "c": c}) == {"b"}  # never again
    assert dropped(m, be, 1, {"a": a, "c": c}) == {"a"}  # turn 10 is later than turn 6
    # (LRU would have dropped A, then B)


def test_belady_ignores_priorities_and_is_a_bound():
    assert Belady({}).is_bound and not any(make_policy(n).is_bound
                                           for n in POLICY_NAMES if n != "belady")
    future = {key_of(1): [1, 5], key_of(2): [2]}
    m, be = one_tier(2, Belady(future))
    a = turn(m, be, 1, priority=0)
    b = turn(m, be, 2, priority=1)  # a higher priority, but never used again
    assert dropped(m, be, 1, {"a": a, "b": b}) == {"b"}


class _Page:
    def __init__(self, key: bytes):
        self.key, self.score = key, 0.0


def test_belady_compact_future_gives_the_next_uses_a_mapping_gives():
    import random

    rng = random.Random(7)
    future = {key_of(f): sorted(rng.sample(range(1, 60), rng.randint(1, 6))) for f in range(1, 40)}
    compact = NextUses.from_lists(future)
    assert len(compact) == len(future) and key_of(1) in compact and key_of(99) not in compact
    assert all(list(compact.get(k)) == v for k, v in future.items())
    plain, fast = Belady(future), Belady(compact)
    keys = [*future, key_of(99), b""]  # a key without a future, a page without a key
    for clock in range(0, 64, 3):
        pages = [_Page(k) for k in keys]
        expect = [plain.next_use(p, clock) for p in pages]
        assert [fast.next_use(p, clock) for p in pages] == expect
        assert fast.keys(pages, clock) == [-s for s in expect] == plain.keys(
            [_Page(k) for k in keys], clock)
        assert [p.score for p in pages[:-1]] == expect[:-1]  # kept for the next keying


@pytest.mark.parametrize("tpb", [None, 2])  # the trace's block size; two trace blocks a page
def test_future_uses_counts_each_blocks_turns(tpb):
    """The next-use table is the direct count: every turn (in the engine's order) hashes
    its prompt's chain keys afresh and lists itself under each."""
    from kvsim.core.keys import chain_key as ck
    from kvsim.run.policies import future_uses, turn_order
    from kvsim.run import prepare_run
    from kvsim.workload.blocks import cache_blocks

    prep = prepare_run(load_config("configs/default.yaml", ["workload.synthetic.n_sessions=6"]))
    wl = prep.workload
    tokens = wl.block_tokens * (tpb or 1)
    expect: dict[bytes, list[int]] = {}
    for n, (scope, t) in enumerate(turn_order(wl, prep.starts), start=1):
        key = scope_root(scope)
        for ids in cache_blocks(t.hash_ids, wl.block_tokens, tokens, t.input_tokens):
            key = ck(key, ids)
            if n not in expect.setdefault(key, []):
                expect[key].append(n)
    got = future_uses(wl, tokens, prep.starts)
    assert len(expect) > 50 and any(len(v) > 1 for v in expect.values())  # shared prefixes
    assert set(got.index) == set(expect)
    assert {k: list(got.get(k)) for k in expect} == expect


def test_future_uses_by_occurrence_gives_each_blocks_next_turn():
    """The occurrence arrays: block i of turn n's prompt is ``occ_keys[starts[n] + i]``,
    and ``occ_next`` there is the next turn using it (NEVER: none), as the direct count
    says."""
    from kvsim.core.keys import chain_key as ck
    from kvsim.core.policy.builtin import NEVER
    from kvsim.run.policies import future_uses, turn_order
    from kvsim.run import prepare_run
    from kvsim.workload.blocks import cache_blocks

    prep = prepare_run(load_config("configs/default.yaml", ["workload.synthetic.n_sessions=6"]))
    wl = prep.workload
    got = future_uses(wl, wl.block_tokens, prep.starts)
    prompts = []
    for scope, t in turn_order(wl, prep.starts):
        key, chain = scope_root(scope), []
        for ids in cache_blocks(t.hash_ids, wl.block_tokens, wl.block_tokens, t.input_tokens):
            key = ck(key, ids)
            chain.append(key)
        prompts.append(chain)
    assert len(got.starts) == len(prompts) + 1 and len(got.occ_keys) == sum(map(len, prompts))
    later = 0
    for n, chain in enumerate(prompts, start=1):
        for i, key in enumerate(chain):
            nxt = next((m for m in range(n + 1, len(prompts) + 1) if key in prompts[m - 1]), NEVER)
            assert got.occ_keys[got.starts[n] + i] == key
            assert got.occ_next[got.starts[n] + i] == nxt
            later += nxt != NEVER
    assert later > 50  # shared prefixes: next uses to find


def test_belady_keys_by_occurrence_match_the_dict():
    """``Belady.keys`` through the occurrence arrays (a page's expected turn, or the turn
    its batch's last lookup found, checked by key) gives the next uses the dict gives,
    whatever the pages' scores, depths and batch order (a wrong guess falls back)."""
    from kvsim.run.policies import future_uses
    from kvsim.run import prepare_run

    prep = prepare_run(load_config("configs/default.yaml", ["workload.synthetic.n_sessions=8"]))
    wl = prep.workload
    full = future_uses(wl, wl.block_tokens, prep.starts)
    plain = NextUses(full.index, full.turns)  # no occurrence arrays: the dict only
    depth = {}  # chain key -> its depth
    for n in range(1, len(full.starts)):
        end = full.starts[n + 1] if n + 1 < len(full.starts) else len(full.occ_keys)
        for i in range(full.starts[n], end):
            depth[full.occ_keys[i]] = i - full.starts[n]

    class Pg:
        def __init__(self, key, score):
            self.key, self.score, self.index = key, score, depth.get(key, 0)

    rnd = random.Random(3)
    keys = list(depth)
    fast, slow = Belady(full), Belady(plain)
    hits = 0
    n_turns = len(full.starts) - 1
    for clock in sorted(rnd.sample(range(1, n_turns + 3), 40)):
        batch = rnd.sample(keys, 30) + [b"", key_of(77)]  # keyless; a key without a future
        scores = [rnd.choice([0.0, 0.0, float(rnd.randrange(1, n_turns + 3)),
                              float(slow.next_use(Pg(k, 0.0), max(0, clock - rnd.randrange(9))))])
                  for k in batch]
        a = [Pg(k, s) for k, s in zip(batch, scores)]
        b = [Pg(k, s) for k, s in zip(batch, scores)]
        assert fast.keys(a, clock) == slow.keys(b, clock)
        assert [p.score for p in a] == [p.score for p in b]
        hits += sum(1 for p, s in zip(a, scores) if 1 <= s <= clock)
    assert hits > 100


# -- priorities -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["priority-lru", "lfu", "lfu-da", "gdsf"])
def test_every_online_policy_drops_lower_priority_first(name):
    m, be = one_tier(2, make_policy(name))
    hi = turn(m, be, 1, priority=1)              # used once, long ago, deep-less
    lo = turn(m, be, 2, nblocks=1, priority=0)
    turn(m, be, 2)
    turn(m, be, 2)                               # used three times, most recently
    assert dropped(m, be, 1, {"hi": hi, "lo": lo}) == {"lo"}


def test_lru_ignores_priorities_priority_lru_honours_them():
    for name, expect in (("lru", {"hi"}), ("priority-lru", {"lo"})):
        m, be = one_tier(2, make_policy(name))
        hi = turn(m, be, 1, priority=1)  # the least recent, but of a higher priority
        lo = turn(m, be, 2, priority=0)
        assert {p.priority for p in hi} == ({0} if name == "lru" else {1})
        assert dropped(m, be, 1, {"hi": hi, "lo": lo}) == expect, name


def test_a_requests_prefix_pages_get_the_prefix_priority():
    m, be = one_tier(8, make_policy("priority-lru"))
    req = m.create("s", blocks(5, 1), 5 * TPB, priority=1, prefix_blocks=2, prefix_priority=3)
    run(m, be, m.resume(req))
    assert m.extend(req, 3 * TPB)  # a prefill chunk, then the rest through a grow's plan
    run(m, be, m.grow(req, 5 * TPB))
    assert [p.priority for p in req.pages] == [3, 3, 1, 1, 1]
    be.fill(m.commit(req, 5 * TPB, final=True))
    m.close(req)
    check(m, be)
    # a later request finds the prefix cached: its pages keep the priority they were made with
    again = m.create("s", blocks(6, 1), 6 * TPB, priority=0)
    assert [p.priority for p in again.pages] == [3, 3, 1, 1, 1]


# -- invariants stay the manager's ---------------------------------------------------------

class ParentsFirst(EvictionPolicy):
    """A hostile order: the shallowest pages first (parents before their children)."""

    name = "parents-first"

    def key(self, page, clock):
        return page.index


def test_children_drop_before_parents_whatever_the_order():
    m, be = one_tier(4, ParentsFirst())
    chain = turn(m, be, 1, nblocks=3)  # pages at depths 0, 1, 2
    assert [p.pid for p in m.policy.order(m.tiers[0].candidates(), m.clock)] == \
        [p.pid for p in chain]  # the policy asks for the root first
    # a fresh 3-block turn needs three of the four slots: two of the chain must go, and
    # they are its two deepest, not the root the policy asked for first. (Dropping a
    # parent before its child would also trip the prefix tree's assertion and the audit.)
    victims(m, be, 3)
    assert m.counters.dropped_pages[GPU] == 2
    assert [p.in_tree for p in chain] == [True, False, False]


def test_held_pages_are_never_dropped_whatever_the_order():
    m, be = one_tier(3, ParentsFirst())
    a = turn(m, be, 1)
    held = m.create("s", blocks(1, 1), TPB)  # suspended: it holds A's page
    assert held.pages == a
    turn(m, be, 2)
    turn(m, be, 3)
    # the held page sorts first in the policy's order, yet only B or C can leave
    assert dropped(m, be, 1, {"a": a}) == set()
    check(m, be)


# -- choosing the policy in a run ------------------------------------------------------------

def test_config_selects_the_policy_and_refuses_unknown_names():
    assert load_config("configs/default.yaml").cache.policy.eviction == "lru"
    cfg = load_config("configs/default.yaml", ["cache.policy.eviction=lfu"])
    assert cfg.cache.policy.eviction == "lfu"
    with pytest.raises(ConfigFileError) as e:
        load_config("configs/default.yaml", ["cache.policy.eviction=mru"])
    msg = str(e.value)
    assert "cache.policy.eviction" in msg and "'mru'" in msg
    assert all(n in msg for n in POLICY_NAMES)


def test_policy_knobs_are_checked_against_the_policy_naming_the_key():
    cfg = load_config("configs/default.yaml", ["cache.policy.eviction=s3-fifo",
                                               "cache.policy.knobs.small_ratio=0.2",
                                               "cache.policy.knobs.move_to_main=3"])
    assert cfg.cache.policy.knobs == {"small_ratio": 0.2, "move_to_main": 3}
    bad = {  # knob=value -> what the message says
        "small_ratio=1.5": "expected a ratio in (0, 1)",
        "ghost_ratio=0": "expected a ratio in (0, 1)",
        "small_ratio=true": "expected a ratio in (0, 1)",
        "move_to_main=0": "expected an integer >= 1",
        "move_to_main=2.5": "expected an integer >= 1",
        "smal_ratio=0.2": "s3-fifo takes no knob 'smal_ratio'; its knobs: small_ratio",
    }
    for arg, says in bad.items():
        with pytest.raises(ConfigFileError) as e:
            load_config("configs/default.yaml", ["cache.policy.eviction=s3-fifo",
                                                 f"cache.policy.knobs.{arg}"])
        key = "cache.policy.knobs." + arg.split("=")[0]
        assert f"{key}: {says}" in str(e.value), str(e.value)
    with pytest.raises(ConfigFileError, match="cache.policy.knobs.small_ratio: lru takes no knob"):
        load_config("configs/default.yaml", ["cache.policy.knobs.small_ratio=0.2"])


def test_workload_priorities_are_for_agentic_traces():
    cfg = load_config("configs/agentic-coding.yaml", ["workload.priorities.prefix=3",
                                                      "workload.priorities.subagent=-1"])
    assert cfg.workload.priorities.model_dump() == {"prefix": 3, "context": 0, "subagent": -1}
    with pytest.raises(ConfigFileError, match="agentic traces only"):
        load_config("configs/mooncake-conversation.yaml", ["workload.priorities.prefix=3"])
    with pytest.raises(ConfigFileError, match="workload.priorities.context"):
        load_config("configs/agentic-coding.yaml", ["workload.priorities.context=high"])


def test_a_user_policy_loads_from_module_and_class():
    from kvsim.run.policies import PolicyError, load_user_policy

    assert isinstance(load_user_policy("test_policies:ParentsFirst"), ParentsFirst)
    with pytest.raises(PolicyError, match="cannot load"):
        load_user_policy("test_policies:Nope")
    with pytest.raises(PolicyError, match="not an eviction policy"):
        load_user_policy("json:JSONDecoder")


runner = CliRunner()
SMALL = ["--set", "workload.synthetic.n_sessions=4", "--set", "output.plots=false",
         "--no-progress"]


def test_summary_names_the_policy_and_labels_belady_a_bound(tmp_path):
    from kvsim.cli import app

    for name, bound in (("lfu", False), ("belady", True)):
        out = tmp_path / name
        r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                                "--set", f"cache.policy.eviction={name}"])
        assert r.exit_code == 0, r.output
        run_info = json.loads((out / "summary.json").read_text())["run"]
        assert run_info["policy"] == name and run_info["policy_is_bound"] is bound
        assert "policy" in r.output and name in r.output


def test_belady_is_refused_on_the_hw_backend(tmp_path):
    from kvsim.cli import app

    out = tmp_path / "hw"
    r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                            "--backend", "hw", "--set", "cache.policy.eviction=belady"])
    assert r.exit_code == 2, r.output
    assert "sim backend only" in r.output and not out.exists()


class Tunable(EvictionPolicy):
    """A user's policy with one declared knob."""

    name = "tunable"
    KNOBS = {"share": "ratio"}

    def __init__(self, share=0.5):
        self.share = share

    def key(self, page, clock):
        return page.last_use


def test_a_user_policy_gets_its_knobs_checked_and_passed():
    from kvsim.run.policies import PolicyError, load_user_policy

    assert load_user_policy("test_policies:Tunable", knobs={"share": 0.25}).share == 0.25
    with pytest.raises(PolicyError, match=r"cache.policy.knobs.share: expected a ratio in \(0, 1\)"):
        load_user_policy("test_policies:Tunable", knobs={"share": 2})
    with pytest.raises(PolicyError, match="cache.policy.knobs: 'test_policies:Tunable' does not "
                                          "take depth"):
        load_user_policy("test_policies:Tunable", knobs={"depth": 3})


def test_a_queue_policy_on_a_tier_too_small_for_its_queues_exits_2(tmp_path):
    """S3-FIFO's small queue is small_ratio of the tier: a tier of 8 pages at 0.1 has no
    room for one, and the run is refused before it starts, naming the tier's quota."""
    from kvsim.cli import app

    out = tmp_path / "small"
    r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                            "--set", "cache.policy.eviction=s3-fifo",
                            "--set", "cache.tiers=[{level: gpu, quota: 40MiB}]"])  # 8 pages
    assert r.exit_code == 2, r.output
    assert "cache.tiers[0].quota: s3-fifo cannot order a tier of 8 pages" in r.output
    assert "needs at least 10 pages" in r.output and not out.exists()
    r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                            "--set", "cache.policy.eviction=s3-fifo",
                            "--set", "cache.policy.knobs.small_ratio=0.25",
                            "--set", "cache.tiers=[{level: gpu, quota: 40MiB}]"])
    assert r.exit_code == 0, r.output


def test_the_documented_example_policy_runs(tmp_path):
    """docs/policies.md's example: loads as module:Class and orders deepest first."""
    import re
    import sys as _sys
    from pathlib import Path

    from kvsim.run.policies import load_user_policy

    doc = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    (tmp_path / "doc_policies.py").write_text(code)
    _sys.path.insert(0, str(tmp_path))
    try:
        policy = load_user_policy("doc_policies:DeepestFirst")
        m, be = one_tier(4, policy)
        chain = turn(m, be, 1, nblocks=2)
        other = turn(m, be, 2)  # more recent, but shallow
        assert [p.pid for p in m.policy.order(m.tiers[0].candidates(), m.clock)][0] == \
            chain[1].pid
        assert dropped(m, be, 2, {"chain": chain, "other": other}) == {"chain"}
        assert isinstance(load_user_policy("doc_policies:RecomputePerToken"), EvictionPolicy)
    finally:
        _sys.path.remove(str(tmp_path))
        _sys.modules.pop("doc_policies", None)


def test_the_documented_queue_policy_runs_first_in_first_out(tmp_path):
    """docs/policies.md's queue example: pages leave in the order they joined, a hit or a
    later use changes nothing, a held page is passed over."""
    import re
    import sys as _sys
    from pathlib import Path

    from kvsim.run.policies import load_user_policy

    doc = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    code = re.findall(r"```python\n(.*?)```", doc, re.S)[1]
    (tmp_path / "doc_queue.py").write_text(code)
    _sys.path.insert(0, str(tmp_path))
    try:
        m, be = one_tier(3, load_user_policy("doc_queue:Fifo"))
        a, b, c = turn(m, be, 1), turn(m, be, 2), turn(m, be, 3)
        turn(m, be, 1)  # A used again: still first in line
        held = m.create("s", blocks(1, 1), TPB)  # ... but held now: passed over
        assert dropped(m, be, 1, {"a": a, "b": b, "c": c}) == {"b"}
        m.close(held)
        check(m, be)
    finally:
        _sys.path.remove(str(tmp_path))
        _sys.modules.pop("doc_queue", None)
