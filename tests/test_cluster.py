"""A cluster behind a router (``cluster:``, ``router:``): instances decided at each arrival.

Scenarios, on a small Mooncake-format trace written here (every request's first block is
one shared system prompt; conversations share longer prefixes among their turns):
- independence: one instance behind a run-time router replays exactly as a plain run;
- each routing policy on 3 instances: every request served once, every instance busy,
  no hit beyond what the instance held (a prefix committed there by a request admitted
  before), the cluster's hit ratio hit tokens over input tokens;
- the probe: a user's router sees the cluster only through it, and what it says of the
  cached prefix is what the instance's tier manager would find;
- the pure policies: prefix-aware scores the share of the request matched (a block
  every request shares moves nothing), by Dynamo's cost;
- bad input: exit 2 naming the key.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import ConfigFileError, load_config
from kvsim.core.routing import Load, PrefixAware, RouteRequest, Router, make_router
from kvsim.run import prepare_run, replay
from kvsim.run.cluster import check_cluster

POLICIES = ("round-robin", "least-loaded", "session-affinity", "prefix-aware", "session-hash")
GROUPS, TURNS = 11, 5  # (11: round robin scatters a conversation over 3 instances)


def _trace(path) -> list[tuple[int, list[int], int]]:
    """GROUPS conversations of TURNS requests each, interleaved, one every 0.25 s: block 0
    is everyone's; a conversation's turn k reads its k + 2 first blocks (its history)."""
    reqs = []
    for k in range(TURNS):
        for g in range(GROUPS):
            ids = [0] + [1000 * (g + 1) + j for j in range(k + 2)]
            reqs.append((len(reqs) * 250, ids, 256))
    with open(path, "w") as f:
        for ts, ids, out in reqs:
            f.write(json.dumps({"timestamp": ts, "input_length": len(ids) * 512 - 100,
                                "output_length": out, "hash_ids": ids}) + "\n")
    return reqs


def _sets(tmp_path, *more):
    trace = tmp_path / "t.jsonl"
    if not trace.exists():
        _trace(trace)
    return [f"workload.path={trace}", "model=llama-3-8b", "tp=1",
            "cache.tiers=[{level: gpu, quota: 4GiB}, {level: host, quota: 8GiB}]", *more]


def _run(tmp_path, *more):
    return replay(prepare_run(load_config("configs/mooncake-conversation.yaml", _sets(tmp_path, *more))))


def _same(a, b):
    ma, mb = dict(a.metrics), dict(b.metrics)
    ma.pop("wall_time_s"), mb.pop("wall_time_s")
    return ([r.csv_values() for r in a.rows] == [r.csv_values() for r in b.rows]
            and a.timeline == b.timeline and ma == mb)


def test_one_instance_behind_a_router_replays_as_a_plain_run(tmp_path):
    plain = _run(tmp_path)
    assert _same(plain, _run(tmp_path, "cluster.nodes=1", "router.policy=session-hash"))
    for p in ("round-robin", "prefix-aware"):  # the run-time router's path, one instance
        assert _same(plain, _run(tmp_path, f"router.policy={p}")), p


def _common_tokens(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n * 512


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_serves_every_request_once_on_busy_instances(tmp_path, policy):
    res = _run(tmp_path, "cluster.nodes=3", f"router.policy={policy}")
    reqs = _trace(tmp_path / "again.jsonl")
    keys = [(r.session, r.turn) for r in res.rows]
    assert sorted(keys) == sorted((f"req-{i + 1}", 1) for i in range(len(reqs)))  # each once
    m = res.metrics
    assert m["requests_completed"] == len(reqs) and m["requests_failed"] == 0
    c = m["cluster"]
    assert c["instances"] == 3 and c["idle_instances"] == 0
    assert sum(c["requests_per_instance"]) == len(reqs) and min(c["requests_per_instance"]) > 0
    served = [sum(1 for r in res.rows if r.instance == i) for i in range(3)]
    assert served == c["requests_per_instance"]
    assert [x["node"] for x in m["instances"]] == [0, 1, 2]
    hit = sum(r.hit_gpu + r.hit_host + r.hit_disk for r in res.rows)
    assert c["hit_ratio"] == pytest.approx(hit / sum(r.input_tokens for r in res.rows))
    assert m["hit_ratio"] == pytest.approx(c["hit_ratio"])
    # hits only from what the instance held: a prefix that a request admitted there
    # earlier computed (its common blocks with this one)
    ids = {f"req-{i + 1}": r[1] for i, r in enumerate(reqs)}
    for r in res.rows:
        held = [_common_tokens(ids[r.session], ids[o.session]) for o in res.rows
                if o.instance == r.instance and o is not r and 0 <= o.admitted_ns <= r.admitted_ns]
        assert r.hit_gpu + r.hit_host + r.hit_disk <= min(max(held, default=0), r.input_tokens), r


def test_prefix_aware_keeps_conversations_together_and_hits_more(tmp_path):
    rr = _run(tmp_path, "cluster.nodes=3", "router.policy=round-robin").metrics["cluster"]
    first = _run(tmp_path, "cluster.nodes=3", "router.policy=prefix-aware")
    pa = first.metrics["cluster"]
    assert pa["hit_ratio"] > rr["hit_ratio"]
    assert _same(first, _run(tmp_path, "cluster.nodes=3", "router.policy=prefix-aware"))  # same seed


class Recorder(Router):
    """A user's router: checks what it is shown, then sends the request where the most of
    its prompt is cached on GPU (ties: round robin)."""

    seen: list = []

    def route(self, req, probe):
        names = sorted(a for a in dir(probe) if not a.startswith("_"))
        Recorder.seen.append((names, req, [probe.cached(i) for i in range(probe.instances)],
                              [probe.load(i) for i in range(probe.instances)]))
        best = [probe.cached(i)[0] for i in range(probe.instances)]
        return self._least([-b for b in best])


def test_a_users_router_sees_only_the_probe(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cluster_user_router", sys.modules[__name__])
    Recorder.seen = []
    res = _run(tmp_path, "node.ranks=3", "router.policy=cluster_user_router:Recorder")
    assert len(Recorder.seen) == GROUPS * TURNS
    for names, req, cached, loads in Recorder.seen:
        assert names == ["by_load", "cached", "holders", "instances", "load", "load_span", "mean_load"]
        assert isinstance(req, RouteRequest) and req.block_tokens == 512
        assert all(sum(c) <= req.input_tokens for c in cached)
        assert all(isinstance(x, Load) and x.queued_prefill_tokens >= 0 for x in loads)
    # turn k + 1 of a conversation finds its turn k's blocks where they were computed
    assert any(c[0] > 512 for _, _, cached, _ in Recorder.seen for c in cached)
    assert res.metrics["cluster"]["router"] == "cluster_user_router:Recorder"


class LeastLoadedInt(Router):
    """A user's router: the instance with the fewest queued prefill tokens (the first of
    equals), as a Python int."""

    def route(self, req, probe):
        loads = [probe.load(i).queued_prefill_tokens for i in range(probe.instances)]
        return loads.index(min(loads))


class LeastLoadedNumpy(LeastLoadedInt):
    """The same decision as numpy gives it: np.argmin's numpy integer (np.intp). Records
    the type of each later turn's ``previous`` (the instance it answered before)."""

    previous_types: list = []

    def route(self, req, probe):
        if req is not None and req.previous is not None:
            LeastLoadedNumpy.previous_types.append(type(req.previous))
        return np.argmin([probe.load(i).queued_prefill_tokens for i in range(probe.instances)])


def test_a_users_router_may_answer_a_numpy_integer(tmp_path, monkeypatch):
    """np.argmin picks the first of equal minima, as list.index(min) does: the two routers
    decide alike, so the runs are the same; the answer is kept as an int (what a later
    turn's request says it was routed to before)."""
    monkeypatch.setitem(sys.modules, "cluster_user_router", sys.modules[__name__])
    idle = FakeProbe([(0, 0, 0)] * 3, [Load(0, 0, 0, 0)] * 3)
    assert isinstance(LeastLoadedNumpy(3, {}, 0).route(None, idle), np.integer)
    LeastLoadedNumpy.previous_types = []
    py = _run(tmp_path, "node.ranks=3", "router.policy=cluster_user_router:LeastLoadedInt")
    npy = _run(tmp_path, "node.ranks=3", "router.policy=cluster_user_router:LeastLoadedNumpy")
    assert sum(py.metrics["cluster"]["requests_per_instance"]) == GROUPS * TURNS
    py.metrics["cluster"].pop("router"), npy.metrics["cluster"].pop("router")
    assert _same(py, npy)
    # sessions of several turns (the default config's agentic ones): a turn after the
    # first is told, as an int, where the one before it was routed
    cfg = load_config("configs/default.yaml", ["workload.synthetic.n_sessions=4", "node.ranks=2",
                                               "router.policy=cluster_user_router:LeastLoadedNumpy"])
    replay(prepare_run(cfg))
    assert LeastLoadedNumpy.previous_types and set(LeastLoadedNumpy.previous_types) == {int}


class FakeProbe:
    def __init__(self, cached, loads):
        self.instances = len(cached)
        self._c, self._l = cached, loads

    def cached(self, i):
        return self._c[i]

    def load(self, i):
        return self._l[i]


def _req(blocks, prev=None):
    return RouteRequest("s", 1, blocks * 512, blocks, 512, prev)


def test_prefix_aware_is_dynamos_cost_on_the_share_matched():
    idle = Load(0, 0, 0, 0)
    pa = PrefixAware(3)
    # everyone holds block 0: equal scores, so ties rotate over the instances
    every = FakeProbe([(512, 0, 0)] * 3, [idle] * 3)
    assert sorted(pa.route(_req(10), every) for _ in range(3)) == [0, 1, 2]
    # instance 2 holds 6 of 10 blocks on GPU, instance 1 the same on host: cost = prefill
    # blocks (10 - matched x weight) + decode blocks; 2 wins, then 1 at host weight 0.8
    probe = FakeProbe([(512, 0, 0), (512, 5 * 512, 0), (6 * 512, 0, 0)], [idle] * 3)
    costs, _ = pa.costs(_req(10), probe)
    assert costs == pytest.approx([9.0, 10 - 1 - 4.0, 4.0])
    assert pa.route(_req(10), probe) == 2
    # load traded against overlap: instance 2 with 8 blocks of decode costs 12 > 6
    busy = FakeProbe(probe._c, [idle, idle, Load(0, 8, 1, 0)])
    assert pa.route(_req(10), busy) == 1


def test_least_loaded_and_affinity():
    loads = [Load(512 * 4, 1, 1, 1), Load(0, 2, 1, 0), Load(0, 9, 2, 0)]
    probe = FakeProbe([(0, 0, 0)] * 3, loads)
    assert make_router("least-loaded", 3).route(_req(1), probe) == 1
    sa = make_router("session-affinity", 3, {"threshold": 1.5})
    assert sa.route(_req(1, prev=0), probe) == 0      # 5 blocks <= 1.5 x mean 5.33
    assert sa.route(_req(1, prev=2), probe) == 1      # 9 > 8: overloaded, goes least loaded


def test_bad_cluster_settings_exit_2_naming_the_key(tmp_path):
    runner = CliRunner()
    base = ["run", "configs/mooncake-conversation.yaml", "--out", str(tmp_path / "o")]
    for s, key in [("router.policy=collections:OrderedDict", "router.policy"),
                   ("router.policy=nowhere", "router.policy"),
                   ("router.host_weight=1.5", "router.host_weight"),
                   ("router.overlap_weight=-1", "router.overlap_weight"),
                   ("cluster.nodes=0", "cluster.nodes")]:
        r = runner.invoke(app, [*base, *sum((["--set", x] for x in _sets(tmp_path, s)), [])])
        assert r.exit_code == 2, (s, r.output)
        assert key in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "o").exists()
    cfg = load_config("configs/mooncake-conversation.yaml", _sets(tmp_path, "cluster.nodes=64"))
    with pytest.raises(ConfigFileError, match=r"cluster.nodes: 64 nodes .* need about .* GiB"):
        check_cluster(cfg, "sim", 1000, available=64 << 20)
    with pytest.raises(ConfigFileError, match="cluster.nodes"):
        check_cluster(cfg, "hw", 1000, available=None)


class RaisesInRoute(Router):
    def route(self, req, probe):
        return {}["no such key"]          # a user's bug inside its decision


class ProbesPastTheEnd(Router):
    def route(self, req, probe):
        return probe.cached(probe.instances)[0]   # an instance the cluster does not have


class ReturnsABool(Router):
    def route(self, req, probe):
        return True                       # a truth value, not an instance index


class FailsToBuild(Router):
    def __init__(self, instances, knobs, seed):
        raise RuntimeError("cannot start")


def test_a_users_router_that_fails_exits_2_naming_the_key(tmp_path, monkeypatch):
    """A user's router that cannot be imported or built, raises inside its decision or
    answers something that is not an instance index: one error line naming
    router.policy, exit 2, no traceback, nothing written."""
    monkeypatch.setitem(sys.modules, "cluster_bad_routers", sys.modules[__name__])
    broken = tmp_path / "mods"
    broken.mkdir()
    (broken / "router_syntax.py").write_text("def route(:\n")
    (broken / "router_raises.py").write_text("raise RuntimeError('at import')\n")
    monkeypatch.syspath_prepend(str(broken))
    runner = CliRunner()
    for cls, said in [("cluster_bad_routers:RaisesInRoute", "KeyError"),
                      ("cluster_bad_routers:ProbesPastTheEnd", "IndexError"),
                      ("cluster_bad_routers:ReturnsABool", "returned True"),
                      ("cluster_bad_routers:FailsToBuild", "RuntimeError: cannot start"),
                      ("router_syntax:Any", "SyntaxError"),
                      ("router_raises:Any", "RuntimeError: at import")]:
        out = tmp_path / "o"
        sets = _sets(tmp_path, "node.ranks=2", f"router.policy={cls}")
        r = runner.invoke(app, ["run", "configs/mooncake-conversation.yaml", "--out", str(out),
                                *sum((["--set", x] for x in sets), [])])
        assert r.exit_code == 2, (cls, r.output)
        assert r.output.startswith("error: --set router.policy="), (cls, r.output)
        assert said in r.output and "Traceback" not in r.output, (cls, r.output)
        assert not out.exists()


@pytest.mark.parametrize("sets, key", [
    (["router.policy=round-robin", "router.threshold=3"], "router.threshold"),
    (["router.policy=session-affinity", "router.temperature=0.5"], "router.temperature"),
    (["router.policy=least-loaded", "router.balance_threshold=4"], "router.balance_threshold"),
    (["router.overlap_weight=2"], "router.overlap_weight"),            # session-hash
    (["router.policy=cluster_user_router:Recorder", "router.host_weight=0.5"], "router.host_weight"),
    (["router.policy=prefix-aware", "router.knobs={temperature: 0.5}"], "router.knobs")])
def test_a_router_knob_the_policy_does_not_read_is_refused(tmp_path, sets, key):
    """Each built-in router reads its own knobs only (round-robin none, session-affinity
    threshold, prefix-aware the weights, balance threshold and temperature), and a user's
    router only router.knobs: any other knob set away from its default would change
    nothing, so the config is refused naming it (its default is no change, and passes)."""
    runner = CliRunner()
    r = runner.invoke(app, ["run", "configs/mooncake-conversation.yaml", "--out", str(tmp_path / "o"),
                            *sum((["--set", x] for x in _sets(tmp_path, "node.ranks=2", *sets)), [])])
    assert r.exit_code == 2, r.output
    assert f"{key} " in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "o").exists()
    load_config("configs/mooncake-conversation.yaml",
                _sets(tmp_path, "router.policy=round-robin", "router.threshold=2.0",
                      "router.temperature=0", "router.balance_threshold=null", "router.knobs={}"))


SYN = ["workload.synthetic.n_sessions=8", "model=llama-3-8b", "cache.page_bytes=2MiB",
       "cache.tiers=[{level: gpu, quota: 4GiB}, {level: host, quota: 4GiB}]"]


@pytest.mark.parametrize("policy", ["round-robin", "session-affinity"])
def test_sessions_turns_move_between_instances_and_each_is_served_once(policy):
    """Closed-loop sessions of many turns: round robin moves a session at every turn (its
    held pages on the old instance released), session affinity keeps it; either way each
    turn is served once, and no instance ends holding a request."""
    prep = prepare_run(load_config("default", [*SYN, "node.ranks=3", f"router.policy={policy}"]))
    res = replay(prep)
    keys = [(r.session, r.turn) for r in res.rows]
    assert len(keys) == prep.workload.request_count() == len(set(keys))
    assert res.metrics["requests_failed"] == 0
    where: dict = {}
    for r in sorted(res.rows, key=lambda r: (r.session, r.turn)):
        where.setdefault(r.session, []).append(r.instance)
    moved = sum(a != b for xs in where.values() for a, b in zip(xs, xs[1:]))
    if policy == "round-robin":
        assert moved > 0
    else:  # affinity: a move only where the old instance was past the threshold
        assert moved < sum(len(xs) - 1 for xs in where.values())


def test_a_sampling_router_is_seeded():
    probe = FakeProbe([(0, 0, 0), (512, 0, 0), (1024, 0, 0)], [Load(0, 0, 0, 0)] * 3)
    picks = [[PrefixAware(3, {"temperature": 1.0}, seed=s).route(_req(4), probe)
              for _ in range(1)] for s in range(40)]
    again = [[PrefixAware(3, {"temperature": 1.0}, seed=s).route(_req(4), probe)
              for _ in range(1)] for s in range(40)]
    assert picks == again and len({p[0] for p in picks}) > 1  # seeded, yet it samples


def test_a_clusters_plots_draw_each_instances_queue(tmp_path):
    from kvsim.run.plots import write_plots

    res = _run(tmp_path, "cluster.nodes=3", "router.policy=least-loaded")
    names = [p.name for p in write_plots(res, tmp_path)]
    assert names == ["timeline.png", "cluster_load.png", "ttft_cdf.png"]
    assert (tmp_path / "cluster_load.png").stat().st_size > 0
