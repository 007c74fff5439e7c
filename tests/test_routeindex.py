"""The cluster's views for routers (``kvsim.run.routeindex``) change no decision.

Scenarios:
- replays: each built-in router that reads the views (least-loaded, session-affinity,
  prefix-aware, with a balance threshold, with a sampling temperature) replays the same
  rows, instance for instance, with the views as with the plain probe that asks every
  instance; a checking router sees, at every request, views equal to what asking each
  instance gives;
- the pure policies, on random clusters of 40 instances with ties: the same instance as
  the plain path for every request of a sequence (round-robin rotation included), while
  asking fewer instances than there are.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from kvsim.config import load_config
from kvsim.core import routing
from kvsim.core.routing import (Load, LeastLoaded, PrefixAware, RouteRequest, Router,
                                SessionAffinity, load_blocks)
from kvsim.run import prepare_run, replay

TRACE = (Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake"
         / "conversation_trace.jsonl")
SYN = ["workload.synthetic.n_sessions=12", "model=llama-3-8b", "cache.page_bytes=2MiB",
       "cache.tiers=[{level: gpu, quota: 2GiB}, {level: host, quota: 4GiB}]"]
ROUTERS = ["least-loaded", "session-affinity", "prefix-aware",
           "prefix-aware\nrouter.balance_threshold=4",
           "prefix-aware\nrouter.temperature=0.5",
           "prefix-aware\nrouter.overlap_weight=2.5\nrouter.host_weight=0.9"]


def _rows(sets, plain, monkeypatch):
    with monkeypatch.context() as m:
        if plain:  # the built-in routers ask every instance
            m.setattr(routing, "indexed", lambda probe: None)
        res = replay(prepare_run(load_config("default", sets)))
    return [r.csv_values() for r in res.rows], res.metrics["cluster"]["requests_per_instance"]


def _sets(router):
    name, *knobs = router.split("\n")
    return [f"router.policy={name}", *knobs]


@pytest.mark.parametrize("router", ROUTERS)
def test_a_routed_replay_is_the_same_with_the_views(router, monkeypatch):
    sets = [*SYN, "node.ranks=5", *_sets(router)]
    fast, per = _rows(sets, False, monkeypatch)
    assert fast == _rows(sets, True, monkeypatch)[0]
    assert len(set(per)) > 1 or router == "least-loaded"  # (the loads differ: decisions matter)


@pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces")
@pytest.mark.parametrize("router", ["prefix-aware", "least-loaded"])
def test_the_mooncake_trace_on_8_instances_routes_the_same(router, monkeypatch):
    sets = [f"workload.path={TRACE}", "workload.limit=300", "node.ranks=4", "cluster.nodes=2",
            "tp=2", f"router.policy={router}", "output.plots=false"]
    cfg = load_config("configs/mooncake-cluster.yaml", sets)
    with monkeypatch.context() as m:
        m.setattr(routing, "indexed", lambda probe: None)
        plain = replay(prepare_run(cfg))
    fast = replay(prepare_run(cfg))
    assert [r.csv_values() for r in fast.rows] == [r.csv_values() for r in plain.rows]


class Checker(Router):
    """A user's router: checks the views against each instance, then routes as
    prefix-aware does."""

    checked = 0

    def __init__(self, instances, knobs=None, seed=0):
        super().__init__(instances, knobs, seed)
        self.inner = PrefixAware(instances, knobs, seed)

    def route(self, req, probe):
        n, bt = probe.instances, req.block_tokens
        loads = [load_blocks(probe.load(i), bt) for i in range(n)]
        assert list(probe.by_load()) == sorted((x, i) for i, x in enumerate(loads))
        assert probe.load_span() == (min(loads), max(loads))
        assert probe.mean_load() == sum(loads) / n
        cached = [sum(probe.cached(i)) for i in range(n)]
        first = min(bt, req.input_tokens)
        for blocks, held in ((1, 0), (2, first)):  # more than `held` tokens: a holder
            assert {i for i in range(n) if cached[i] > held} <= set(probe.holders(blocks))
        Checker.checked += 1
        return self.inner.route(req, probe)


def test_a_router_sees_views_equal_to_asking_each_instance(monkeypatch):
    monkeypatch.setitem(sys.modules, "routeindex_checker", sys.modules[__name__])
    Checker.checked = 0
    replay(prepare_run(load_config("default", [*SYN, "node.ranks=4",
                                               "router.policy=routeindex_checker:Checker"])))
    assert Checker.checked > 12


class Plain:
    def __init__(self, cached, loads):
        self.instances = len(cached)
        self._c, self._l = cached, loads
        self.asked = 0

    def cached(self, i):
        self.asked += 1
        return self._c[i]

    def load(self, i):
        return self._l[i]


class Viewed(Plain):
    """The views as a cluster's probe gives them (holders: a superset, as the key index)."""

    def __init__(self, cached, loads, bt, extra):
        super().__init__(cached, loads)
        self._bt, self._extra = bt, extra

    def holders(self, blocks):
        held = 0 if blocks == 1 else self._bt
        return sorted({i for i, c in enumerate(self._c) if sum(c) > held} | self._extra)

    def by_load(self):
        return iter(sorted((load_blocks(x, self._bt), i) for i, x in enumerate(self._l)))

    def load_span(self):
        xs = [load_blocks(x, self._bt) for x in self._l]
        return min(xs), max(xs)

    def mean_load(self):
        return sum(load_blocks(x, self._bt) for x in self._l) / len(self._l)


@pytest.mark.parametrize("bt", [512, 48])
@pytest.mark.parametrize("make", [
    lambda n: LeastLoaded(n), lambda n: SessionAffinity(n, {"threshold": 1.2}),
    lambda n: PrefixAware(n), lambda n: PrefixAware(n, {"balance_threshold": 30}),
    lambda n: PrefixAware(n, {"overlap_weight": 0.5, "disk_weight": 0.9}),
    lambda n: PrefixAware(n, {"overlap_weight": 3.0, "gpu_weight": 1.5})])
def test_the_views_pick_as_every_instance_would(make, bt):
    rnd, n = random.Random(7), 40
    fast, plain = make(n), make(n)
    asked = 0
    for k in range(300):
        blocks = rnd.randint(1, 12)
        ntok = blocks * bt - rnd.randint(0, bt - 1)
        # loads with ties (idle ones, equal queues); a few deep holders, many with block 0
        loads = [Load(rnd.choice([0, bt, 2 * bt, 7 * bt + 5]) if k % 5 else 0,
                      rnd.choice([0, 3, 40]), 0, 0) for _ in range(n)]
        cached = []
        for i in range(n):
            depth = rnd.choice([0, 1, 1, 1, 2, blocks]) if rnd.random() < 0.3 else rnd.choice([0, 1])
            toks = min(ntok, depth * bt)
            tier = rnd.randrange(3)
            cached.append(tuple(toks if t == tier else 0 for t in range(3)))
        req = RouteRequest("s", 1, ntok, blocks, bt, rnd.choice([None, rnd.randrange(n)]))
        extra = set(rnd.sample(range(n), 3))  # the index may name more than hold
        view = Viewed(cached, loads, bt, extra)
        assert fast.route(req, view) == plain.route(req, Plain(cached, loads)), k
        asked += view.asked
    if isinstance(fast, PrefixAware):
        assert asked < 300 * n / 2  # (asked far fewer than every instance)


@pytest.mark.parametrize("extra", [
    # a remote tier: a fetched prefix takes tokens off the instance's queue
    ["cache.remote={capacity: 8GiB, network: {bandwidth: 25GB/s, latency: 50us}, write_through: true}"],
    # a hybrid model: a turn without its state recomputes, queueing tokens again
    ["model=jamba-v0.1", "cache.page_bytes=null"],
])
def test_the_views_hold_with_a_remote_tier_and_a_hybrid_model(extra, monkeypatch):
    """Beside a remote tier (fetches move queued tokens) and a hybrid model (a turn without
    its state queues tokens again): the checking router sees views equal to asking each
    instance at every request, and the replay is the same as the plain path's."""
    monkeypatch.setitem(sys.modules, "routeindex_checker", sys.modules[__name__])
    Checker.checked = 0
    sets = [*SYN, "node.ranks=4", *extra]
    res = replay(prepare_run(load_config("default", [*sets, "router.policy=routeindex_checker:Checker"])))
    assert Checker.checked > 12
    if "remote" in extra[0]:
        assert res.metrics["hit_tokens"]["remote"] > 0
    fast, _ = _rows([*sets, "router.policy=prefix-aware"], False, monkeypatch)
    assert fast == _rows([*sets, "router.policy=prefix-aware"], True, monkeypatch)[0]
