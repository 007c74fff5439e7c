"""Property test: random lifecycles against the reference backend, audited after every step.

A hypothesis state machine creates, prepares, resumes, grows, commits, suspends and
closes requests and changes quotas on a small three-tier manager. Plans are either run at
once (stage by stage, sometimes with failed batches) or held in flight across other
operations and completed later (their transfers run when they complete, as a slow link
would). After every step ``kvsim.core.audit.audit`` checks slot ownership and
conservation, page states against the requests' page lists, counter balance, the prefix
tree, and the refcheck (every committed page's tag in the backend).

The machine runs once per built-in eviction policy: a policy only orders candidates, so
every invariant must hold whichever it is (``belady`` with a made-up future). It runs
once per built-in placement policy too (alone, with an eviction policy that keeps page
metadata, and with retained copies): a placement may drop victims or send them past the
host, and the manager must still keep every invariant (``recompute`` with a depth that
drops the first two blocks of every prompt), and with ``Scatter``, a hostile placement;
and with tiers that keep their own eviction orders.
"""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conftest import PAGE, TPB, backend_for, make_manager
from kvsim.core import CoreError, Level, ReqState
from kvsim.core.audit import audit
from kvsim.core.policy import (DROP, PLACEMENT_NAMES, POLICY_NAMES, PlacementPolicy,
                               make_placement, make_policy)

FAMILIES = st.integers(0, 2)  # few prompt families, so prefixes are shared often
SCOPES = st.sampled_from(["a", "b"])


def _ids(family: int, start: int, n: int) -> list[int]:
    return [family * 1000 + i for i in range(start, start + n)]


def _fingerprint(m) -> tuple:
    """Everything a manager's later decisions can depend on, as plain values."""
    def pid(p):
        return None if p is None else p.pid

    pages = tuple((p.pid, p.index, p.key, p.tag, p.ntokens, p.tier, p.slot, int(p.phase),
                   p.locks, p.holds, p.in_tree, pid(p.parent), p.nchildren, p.priority,
                   getattr(p, "last_use", None), getattr(p, "uses", None),
                   getattr(p, "score", None))
                  for p in m.pages())
    tiers = tuple((t.capacity, t.next_fresh, tuple(t.recycled),
                   tuple((prio, tuple(pid(p) for p in b)) for prio, b in sorted(t.lru.items())))
                  for t in m.tiers)
    reqs = tuple((r.rid, int(r.state), r.tokens, r.committed, r.plan, tuple(r.blocks),
                  tuple(pid(p) for p in r.pages)) for r in m.requests())
    tree = tuple(sorted((k, pid(p)) for k, p in m.tree.items()))
    return (pages, tiers, reqs, tree, repr(m.counters.snapshot()), m._next_pid, m._next_plan,
            m._next_rid, m.clock)


class MadeUpFuture:
    """A future for ``belady``: each chain key's next uses, fixed by the key's bytes."""

    def get(self, key, default=None):
        return sorted({(b * 7 + i * 13) % 40 + 1 for i, b in enumerate(key[:4])})


def _policy(name: str):
    return make_policy(name, future=MadeUpFuture()) if name == "belady" else make_policy(name)


class Scatter(PlacementPolicy):
    """A hostile placement for the machine: by the page's id, a victim is dropped, sent
    to the last tier or cascades, and a restored page keeps its copy or not (drops it asks
    for that would break an invariant must be refused by the manager)."""

    name = "scatter"

    def place(self, page, src, levels, clock):
        r = (page.pid * 7 + clock) % 3
        return DROP if r == 0 else (len(levels) - 1 if r == 1 else src + 1)

    def keep_copy(self, page, clock):
        return page.pid % 2 == 0

    keeps_every_copy = False


def _placement(name: str):
    if name == "scatter":
        return Scatter()
    return make_placement(name, max_depth=2) if name == "recompute" else make_placement(name)


class CoreMachine(RuleBasedStateMachine):
    policy = "lru"
    placement = "cascade"
    tiers: dict = {}  # tier position -> its own eviction policy's name
    copies: dict = {}  # ManagerSpec's retained-copy options

    def __init__(self) -> None:
        super().__init__()
        self.m = make_manager(gpu=6, host=5, disk=4, max_gpu=8, max_host=7, max_disk=6,
                              policy=_policy(self.policy), placement=_placement(self.placement),
                              tier_policies={i: _policy(n) for i, n in self.tiers.items()},
                              **self.copies)
        self.be = backend_for(self.m)
        self.held: list = []  # plans in flight, not yet run

    # -- helpers -----------------------------------------------------------------------
    def _reqs(self, *states):
        return [r for r in self.m.requests() if r.state in states]

    def _finish(self, plan, hold: bool, fails: set[int], all_fail: bool) -> None:
        if hold:
            self.held.append((plan, fails, all_fail))
            return
        self._run(plan, fails, all_fail)

    def _run(self, plan, fails, all_fail) -> None:
        if all_fail:  # the engine gave up before submitting anything
            self.m.complete(plan, False)
            return
        fails = {i for i in fails if i < len(plan.batches)}
        oks = self.be.run_plan(plan, fail_batches=frozenset(fails))
        self.m.complete(plan, oks)

    # -- rules -------------------------------------------------------------------------
    @precondition(lambda self: len(self.m._requests) < 6)
    @rule(scope=SCOPES, family=FAMILIES, ntokens=st.integers(0, 6 * TPB),
          priority=st.integers(0, 1))
    def create(self, scope, family, ntokens, priority):
        nb = -(-ntokens // TPB)
        probe = self.m.probe_reuse(scope, _ids(family, 0, nb), ntokens)
        req = self.m.create(scope, _ids(family, 0, nb), ntokens, priority=priority)
        assert sum(probe.values()) == req.cached_tokens

    @precondition(lambda self: len(self.m._requests) < 6)
    @rule(scope=SCOPES, family=FAMILIES, ntokens=st.integers(1, 6 * TPB),
          final=st.booleans(), suspend=st.integers(0, 3))
    def serve(self, scope, family, ntokens, final, suspend):
        """A whole turn at once: create, resume, grow, commit (and maybe suspend)."""
        nb = -(-ntokens // TPB)
        req = self.m.create(scope, _ids(family, 0, nb), ntokens)
        plan = self.m.resume(req)
        if not plan:
            return
        self._run(plan, set(), False)
        if req.state is not ReqState.ACTIVE:
            return
        if ntokens > req.tokens:
            plan = self.m.grow(req, ntokens)
            if not plan:
                return
            self._run(plan, set(), False)
        self.be.fill(self.m.commit(req, ntokens, final=final))
        if suspend:  # mostly: the turn ends, its pages become evictable
            self.m.suspend(req)

    @precondition(lambda self: any(r.state in (ReqState.SUSPENDED,) for r in self.m.requests()))
    @rule(data=st.data(), family=FAMILIES, keep=st.integers(0, 6), extra=st.integers(0, 3),
          tail=st.integers(0, TPB - 1))
    def prepare(self, data, family, keep, extra, tail):
        reqs = self._reqs(ReqState.SUSPENDED)
        if not reqs:
            return
        req = data.draw(st.sampled_from(reqs))
        old = req.blocks[:keep]
        blocks = old + _ids(family, len(old), extra + 1)
        ntokens = max(0, len(blocks) * TPB - tail)
        self.m.prepare(req, blocks, ntokens)

    @precondition(lambda self: any(r.state in (ReqState.SUSPENDED,) for r in self.m.requests()))
    @rule(data=st.data(), hold=st.booleans(), fails=st.sets(st.integers(0, 3), max_size=2),
          all_fail=st.booleans())
    def resume(self, data, hold, fails, all_fail):
        reqs = self._reqs(ReqState.SUSPENDED)
        if not reqs:
            return
        req = data.draw(st.sampled_from(reqs))
        before = [self.m.tier_stats(t.level) for t in self.m.tiers]
        plan = self.m.resume(req)
        if not plan:
            assert req.state is ReqState.SUSPENDED
            assert before == [self.m.tier_stats(t.level) for t in self.m.tiers]
            return
        self._finish(plan, hold, fails if data.draw(st.integers(0, 3)) == 0 else set(),
                     all_fail and data.draw(st.integers(0, 5)) == 0)

    def _draw_growth(self, data, more, family):
        """An active request, its token count after ``more`` tokens and the new blocks' ids
        (None if no request is active)."""
        reqs = self._reqs(ReqState.ACTIVE)
        if not reqs:
            return None
        req = data.draw(st.sampled_from(reqs))
        ntokens = req.tokens + more
        nb = -(-ntokens // TPB)
        return req, ntokens, _ids(family, len(req.blocks), max(0, nb - len(req.blocks)))

    @precondition(lambda self: any(r.state in (ReqState.ACTIVE,) for r in self.m.requests()))
    @rule(data=st.data(), more=st.integers(1, 3 * TPB), family=FAMILIES, hold=st.booleans(),
          fails=st.sets(st.integers(0, 3), max_size=2))
    def grow(self, data, more, family, hold, fails):
        drawn = self._draw_growth(data, more, family)
        if drawn is None:
            return
        req, ntokens, new = drawn
        nblocks = len(req.blocks)
        plan = self.m.grow(req, ntokens, new)
        if not plan:
            assert len(req.blocks) == nblocks, "a refused grow must not append its blocks"
            assert req.state is ReqState.ACTIVE
            return
        self._finish(plan, hold, fails if data.draw(st.integers(0, 3)) == 0 else set(), False)

    @precondition(lambda self: any(r.state in (ReqState.ACTIVE,) for r in self.m.requests()))
    @rule(data=st.data(), more=st.integers(0, 3 * TPB), family=FAMILIES)
    def extend(self, data, more, family):
        """``extend`` (grow + complete at once when nothing moves) leaves exactly the state a
        twin manager reaches with ``grow`` and ``complete``, or changes nothing."""
        drawn = self._draw_growth(data, more, family)
        if drawn is None:
            return
        req, ntokens, new = drawn
        before = _fingerprint(self.m)
        twin = copy.deepcopy(self.m)
        if self.m.extend(req, ntokens, list(new)):
            plan = twin.grow(twin._requests[req.rid], ntokens, list(new))
            assert plan and not plan.batches
            twin.complete(plan)
            assert _fingerprint(self.m) == _fingerprint(twin)
        else:
            assert _fingerprint(self.m) == before

    @precondition(lambda self: any(r.state in (ReqState.ACTIVE,) for r in self.m.requests()))
    @rule(data=st.data(), final=st.booleans())
    def commit(self, data, final):
        reqs = self._reqs(ReqState.ACTIVE)
        if not reqs:
            return
        req = data.draw(st.sampled_from(reqs))
        upto = data.draw(st.integers(0, req.tokens))
        fill = self.m.commit(req, upto, final=final)
        self.be.fill(fill)  # the engine writes what it computed

    @precondition(lambda self: any(r.state in (ReqState.ACTIVE,) for r in self.m.requests()))
    @rule(data=st.data())
    def suspend(self, data):
        reqs = self._reqs(ReqState.ACTIVE)
        if reqs:
            self.m.suspend(data.draw(st.sampled_from(reqs)))

    @precondition(lambda self: any(r.state in (ReqState.ACTIVE, ReqState.SUSPENDED,) for r in self.m.requests()))
    @rule(data=st.data())
    def close(self, data):
        reqs = self._reqs(ReqState.ACTIVE, ReqState.SUSPENDED)
        if reqs:
            self.m.close(data.draw(st.sampled_from(reqs)))

    @rule(level=st.sampled_from([Level.GPU, Level.HOST, Level.DISK]), pages=st.integers(1, 8),
          hold=st.booleans(), fails=st.sets(st.integers(0, 2), max_size=1))
    def set_quota(self, level, pages, hold, fails):
        tier = self.m.tiers[self.m.tier_pos(level)]
        pages = min(pages, tier.max_slots)
        plan = self.m.set_quota(level, pages * PAGE)
        if plan:
            self._finish(plan, hold, fails, False)

    @rule(level=st.sampled_from([Level.GPU, Level.HOST, Level.DISK]), pages=st.integers(1, 4),
          hold=st.booleans(), fails=st.sets(st.integers(0, 2), max_size=1))
    def evict(self, level, pages, hold, fails):
        before = self.m.counters.snapshot()
        plan = self.m.evict(level, pages)
        if plan:
            self._finish(plan, hold, fails, False)
        else:  # a refusal changes nothing but the refusal count
            after = self.m.counters.snapshot()
            assert after["refusals"] == before["refusals"] + 1
            after["refusals"] = before["refusals"]
            assert after == before

    @precondition(lambda self: self.m.write_through_on)
    @rule(hold=st.booleans(), fail=st.integers(0, 4))
    def write_through(self, hold, fail):
        """The background copies of pages evicted GPU -> host, held or run (failed
        now and then: their copies must never become ready)."""
        plan = self.m.write_through()
        if plan:
            self._finish(plan, hold, {0} if fail == 0 else set(), False)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete_held(self, data):
        i = data.draw(st.integers(0, len(self.held) - 1))
        plan, fails, all_fail = self.held.pop(i)
        self._run(plan, fails, all_fail)

    @precondition(lambda self: any(r.state in (ReqState.RESUMING, ReqState.GROWING,) for r in self.m.requests()))
    @rule(data=st.data())
    def misuse_is_refused(self, data):
        """Contract breaches raise CoreError and change nothing."""
        reqs = self._reqs(ReqState.RESUMING, ReqState.GROWING)
        if reqs:
            req = data.draw(st.sampled_from(reqs))
            for op in (lambda: self.m.close(req), lambda: self.m.suspend(req),
                       lambda: self.m.commit(req, 0)):
                try:
                    op()
                except CoreError:
                    pass
                else:
                    raise AssertionError("an operation on a request with a plan in flight passed")

    # -- the invariant -----------------------------------------------------------------
    @invariant()
    def audited(self):
        audit(self.m, self.be.read_tags)
        for req in self._reqs(ReqState.ACTIVE):
            exp = self.m.expected(req)
            assert np.array_equal(self.be.read_tags(exp.level, exp.slots), exp.tags)

    def teardown(self):
        # everything in flight can still finish cleanly
        while self.held:
            plan, fails, all_fail = self.held.pop()
            self._run(plan, fails, all_fail)
        audit(self.m, self.be.read_tags)
        assert self.m.plans_in_flight() == 0


CoreMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestCoreMachine = CoreMachine.TestCase  # lru, the default


def _machine_for(name: str):
    machine = type(f"CoreMachine_{name}", (CoreMachine,), {"policy": name})
    machine.TestCase.settings = settings(
        max_examples=100, stateful_step_count=50, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    return machine.TestCase


# every other built-in (lru, which ignores priorities, is CoreMachine's own)
for _name in POLICY_NAMES:
    if _name != "lru":
        globals()[f"TestCoreMachine_{_name.replace('-', '_')}"] = _machine_for(_name)


def _machine_with_copies(name: str, copies: dict, examples: int):
    machine = type(f"CoreMachine_{name}", (CoreMachine,), {"copies": copies})
    machine.TestCase.settings = settings(
        max_examples=examples, stateful_step_count=50, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    return machine.TestCase


# retained disk copies: keep-copy and write-through, with the whole disk protected or
# a quarter of it (copies beyond the share go first)
TestCoreMachine_copies = _machine_with_copies(
    "copies", {"keep_copy": True, "write_through": True, "write_through_inflight_bytes": 3 * PAGE},
    200)
TestCoreMachine_copies_quarter = _machine_with_copies(
    "copies_quarter", {"keep_copy": True, "write_through": True,
                       "protected_copy_fraction": 0.25}, 100)
TestCoreMachine_keep_copy = _machine_with_copies("keep_copy", {"keep_copy": True}, 100)


def _machine_with(name: str, examples: int, **attrs):
    """CoreMachine's test case with ``attrs`` (placement, policy, copies, tiers) set."""
    machine = type(f"CoreMachine_{name}", (CoreMachine,), attrs)
    machine.TestCase.settings = settings(
        max_examples=examples, stateful_step_count=50, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    return machine.TestCase


def _machine_placed(placement: str, policy: str, copies: dict, examples: int):
    return _machine_with(f"{placement}_{policy}", examples, placement=placement, policy=policy,
                         copies=copies)


# every built-in placement but the default (CoreMachine's own): with lru, with lfu (the
# generic path, page metadata kept), and with retained copies (keep-copy, write-through)
for _name in PLACEMENT_NAMES + ("scatter",):
    if _name != "cascade":
        _n = _name.replace("-", "_")
        globals()[f"TestCoreMachine_place_{_n}"] = _machine_placed(_name, "lru", {}, 150)
        globals()[f"TestCoreMachine_place_{_n}_lfu"] = _machine_placed(_name, "lfu", {}, 60)
        globals()[f"TestCoreMachine_place_{_n}_copies"] = _machine_placed(
            _name, "lru", {"keep_copy": True, "write_through": True,
                           "protected_copy_fraction": 0.5}, 150)


def _machine_per_tier(name: str, policy: str, tiers: dict, placement: str, examples: int):
    return _machine_with(name, examples, policy=policy, tiers=tiers, placement=placement)


# each tier its own eviction order: LRU (the recency index) beside the generic path's
# heaps; gdsf (which keeps scores and hears evictions) on one tier only
TestCoreMachine_tiers_lru_lfu_s3fifo = _machine_per_tier(
    "tiers_lru_lfu_s3fifo", "lru", {1: "lfu", 2: "s3-fifo"}, "cascade", 100)
TestCoreMachine_tiers_gdsf_lru_host = _machine_per_tier(
    "tiers_gdsf_lru_host", "gdsf", {1: "lru"}, "skip-host", 100)
