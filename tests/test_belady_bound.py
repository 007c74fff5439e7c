"""``belady`` as a bound, on small Mooncake-format workloads replayed through the engine
(one GPU tier of 512-token pages, unless a case says otherwise):

- one request at a time (``engine.max_running=1``), with one tier, it is MIN in kvsim's
  model: request by
  request it finds what an independent MIN over the prefix tree finds
  (benchmarks/policy_bound.py's ``min_hits``), and no online policy finds more;
- with requests running together, greedy MIN is not the optimum: a five-request case where
  ``gdsf`` finds more, because a page no one needs again can still be pinned later (a
  running request's pages attach below it in the prefix tree, and a parent never goes
  before its children), so which dead page leaves first matters, and furthest-next-use
  cannot tell them apart;
- with a colder tier below the GPU, not even one request at a time: each tier gives up
  its own page used again furthest, so the last tier may drop a page used soon while a
  warmer one sends it pages never used again (a six-request case where lru finds more);
- whatever the concurrency, no policy finds more than ``reuse_bound``: the prompt blocks a
  turn prepared earlier computed (a property test over random workloads).
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import policy_bound as pb  # noqa: E402

from conftest import TPB, backend_for, blocks, make_manager, new_active  # noqa: E402
from kvsim.config import load_config  # noqa: E402
from kvsim.core import chain_key, scope_root  # noqa: E402
from kvsim.core.policy import POLICY_NAMES, make_policy  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402

ONLINE = [p for p in POLICY_NAMES if p != "belady"]


def workload(seed: int, n: int) -> list[dict]:
    """``n`` requests over three prompt families (a shared prefix of 0-6 blocks, then 1-3
    blocks of its own, the last one sometimes partial), outputs of 1-600 tokens, arrivals
    bunched (0-5 ms apart) or spread (50 ms, 2 s)."""
    rnd = random.Random(seed)
    ids = itertools.count(10**6)  # every id new: prefix-unique, as Mooncake's
    families = [[next(ids) for _ in range(8)] for _ in range(3)]
    t, out = 0, []
    for _ in range(n):
        blocks = rnd.choice(families)[:rnd.randint(0, 6)] + [next(ids) for _ in range(rnd.randint(1, 3))]
        t += rnd.choice([0, 0, 1, 5, 50, 2000])
        out.append({"timestamp": t, "input_length": len(blocks) * 512 - rnd.choice([0, 0, 100]),
                    "output_length": rnd.choice([1, 1, 50, 600]), "hash_ids": blocks})
    return out


def replay_rows(requests: list[dict], policy: str, pages: int, max_running: int, tmp: Path,
                host: int = 0):
    """The rows of a replay with one GPU tier of ``pages`` pages (and, with ``host``, a
    host tier of that many below it)."""
    path = tmp / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    tiers = f"{{level: gpu, quota: {pages * pb.PAGE_BYTES}}}"
    if host:
        tiers += f", {{level: host, quota: {host * pb.PAGE_BYTES}}}"
    cfg = load_config(ROOT / "configs" / "mooncake-conversation.yaml", [
        f"cache.policy.eviction={policy}", "tp=1", "cache.tokens_per_block=512",
        f"cache.tiers=[{tiers}]",
        f"workload.path={path}", f"engine.max_running={max_running}",
        "engine.gpu_free_watermark=0", "output.plots=false"])
    res = replay(prepare_run(cfg))
    return sorted(res.rows, key=lambda r: (r.arrival_ns, r.rid)), cfg


def hit_tokens(rows) -> int:
    return sum(r.hit_gpu for r in rows)


def found_tokens(rows) -> int:
    """Hit tokens from any tier."""
    return sum(r.hit_gpu + r.hit_host + r.hit_disk for r in rows)


# -- one request at a time --------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_belady_is_min_one_request_at_a_time(seed, tmp_path):
    rnd = random.Random(100 + seed)
    requests = workload(100 + seed, 40)
    pages = rnd.randint(14, 30)
    rows, _ = replay_rows(requests, "belady", pages, 1, tmp_path)
    expect = pb.min_hits(requests, pages)
    assert sum(expect) > 0
    assert [r.hit_gpu for r in rows] == expect


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), n=st.integers(8, 30), pages=st.integers(14, 30))
def test_no_online_policy_beats_belady_one_request_at_a_time(seed, n, pages, tmp_path):
    requests = workload(seed, n)
    best = hit_tokens(replay_rows(requests, "belady", pages, 1, tmp_path)[0])
    for p in ONLINE:
        assert hit_tokens(replay_rows(requests, p, pages, 1, tmp_path)[0]) <= best, p


def _prefix_hits(turns: list[tuple[int, int]], policy, pages: int) -> int:
    """Blocks found cached over ``turns`` (family, blocks: family f's prompts share their
    prefix), one at a time, by the manager alone with one GPU tier of ``pages`` pages."""
    m = make_manager(gpu=pages, host=None, disk=None, policy=policy)
    be = backend_for(m)
    found = 0
    for f, k in turns:
        req = new_active(m, be, k * TPB, family=f)
        found += req.cached_tokens // TPB
        m.close(req)
    return found


@settings(max_examples=60, deadline=None, derandomize=True)
@given(pages=st.integers(2, 16), data=st.data())
def test_no_online_policy_beats_belady_on_random_prefix_streams(pages, data):
    """The manager alone (fast enough for many cases): random streams of prompts over a
    few families that share prefixes, any tier size from 2 pages, one request at a time:
    no online policy finds more blocks than belady."""
    turns = data.draw(st.lists(st.tuples(st.integers(0, 5), st.integers(1, min(pages, 6))),
                               min_size=1, max_size=40))
    future: dict[bytes, list[int]] = {}
    for t, (f, k) in enumerate(turns, start=1):  # the manager's clock counts turns from 1
        key = scope_root("s")
        for b in blocks(k, f):
            key = chain_key(key, b)
            future.setdefault(key, []).append(t)
    best = _prefix_hits(turns, make_policy("belady", future=future), pages)
    for p in ONLINE:
        policy = make_policy(p)
        if policy.check_tier(pages) is None:  # (s3-fifo needs 10 pages)
            assert _prefix_hits(turns, policy, pages) <= best, (p, turns)


def test_on_closed_loop_sessions_belady_reads_a_predicted_order(monkeypatch):
    """configs/default.yaml: closed-loop sessions, a turn released a think time after its
    session's previous turn ends. belady's future numbers the turns by their nominal
    arrival (start and think times, not the time turns take): the replay prepares them in
    another order, most turns at a clock other than the number the future gave them, so
    belady reads next uses that are not the replay's. Given the future in the order the
    replay prepared the turns, it finds more on GPU: it is no MIN here."""
    from kvsim.run import policies as rp

    def replay_with(order):
        cfg = load_config(ROOT / "configs" / "default.yaml", [
            "output.plots=false", "cache.policy.eviction=belady"])
        prep = prepare_run(cfg)
        nominal = rp.turn_order(prep.workload, prep.starts)
        where = {id(t): i for i, (_, t) in enumerate(nominal)}
        future = nominal if order is None else [nominal[i] for i in order]
        with monkeypatch.context() as mp:
            mp.setattr(rp, "turn_order", lambda wl, starts=None: future)
            rows = replay(prep).rows
        place = {(sid, n): where[id(t)] for s in prep.workload.sessions
                 for n, (sid, t) in enumerate(pb._turns(s), start=1)}
        prepared = [place[r.session, r.turn] for r in sorted(rows, key=lambda r: (r.arrival_ns, r.rid))]
        return sum(r.hit_gpu for r in rows), prepared

    gpu, prepared = replay_with(None)
    assert sum(i != n for n, i in enumerate(prepared)) > len(prepared) // 2
    assert replay_with(prepared)[0] > gpu * 1.05


# -- requests running together ----------------------------------------------------------------

#: found by a random search (tests/test_belady_bound.py's ``workload``, seed 299, GPU tier
#: of 15 pages, max_running 3) and cut to the requests it needs
FIVE = [
    {"timestamp": 8052, "input_length": 3072, "output_length": 50,
     "hash_ids": [653755, 710420, 51159, 1724094, 1952356, 1361985]},
    {"timestamp": 8057, "input_length": 2972, "output_length": 50,
     "hash_ids": [835747, 713359, 869385, 620985, 323812, 1323565]},
    {"timestamp": 8057, "input_length": 3584, "output_length": 600,
     "hash_ids": [835747, 713359, 869385, 620985, 1020959, 1132270, 1688294]},
    {"timestamp": 12067, "input_length": 1536, "output_length": 1,
     "hash_ids": [620081, 754941, 1313636]},
    {"timestamp": 14067, "input_length": 2460, "output_length": 1,
     "hash_ids": [653755, 710420, 51159, 1823245, 1724947]},
]


def test_with_requests_running_together_greedy_belady_is_not_the_optimum(tmp_path):
    """Fifteen pages, three requests at a time. R1 (A1-A3 and three of its own) and R2
    (B1-B4 and two of its own) run together; R3, the next turn after R2 (B1-B4 again),
    arrives while R2 still computes B1-B4, so it finds nothing cached and computes its own
    copies; its later pages join the prefix tree below R2's B4 (the tree's copy of that
    block), so R2's B1-B4 cannot leave while R3 runs. R5 will reuse A1-A3.

    When R3 needs room, R1 and R2 have ended: belady gives up the pages no one uses again,
    all alike to it (next use: never), in the order they were ordered: R1's own pages, then
    R2's, so B4 is still there when R3 commits below it and B1-B4 stay pinned. When R4
    needs room, only A1-A3 can go (used again by R5): R5 finds nothing. gdsf, which ranks
    B4 (one use, depth 3) below R1's pages, gives it up before R3 commits; R3 attaches its
    pages to its own copy instead, R2's copies of B1-B3 are all that stay pinned, and A1
    survives for R5: 512 tokens to 0. One request at a time each finds R2's B1-B4 for R3
    and A1-A3 for R5 (3,584 tokens): belady is MIN again, and no worse than gdsf."""
    rows, _ = replay_rows(FIVE, "belady", 15, 3, tmp_path)
    gdsf, _ = replay_rows(FIVE, "gdsf", 15, 3, tmp_path)
    assert [r.hit_gpu for r in rows] == [0, 0, 0, 0, 0]
    assert [r.hit_gpu for r in gdsf] == [0, 0, 0, 0, 512]
    assert sum(r.preemptions for r in rows + gdsf) == 0
    # one at a time, belady is MIN again and beats gdsf
    seq = [r.hit_gpu for r in replay_rows(FIVE, "belady", 15, 1, tmp_path)[0]]
    assert seq == pb.min_hits(FIVE, 15)
    assert sum(seq) == 2048 + 1536 == hit_tokens(replay_rows(FIVE, "gdsf", 15, 1, tmp_path)[0])


# -- several tiers ----------------------------------------------------------------------------

def _prompt(first: int, n: int, at: int) -> dict:
    return {"timestamp": at, "input_length": n * 512, "output_length": 1,
            "hash_ids": list(range(first, first + n))}


#: A (4 blocks), C (3), B (2), then C with a fourth block, A again, B again
SIX = [_prompt(100, 4, 0), _prompt(300, 3, 100), _prompt(200, 2, 200), _prompt(300, 4, 400),
       _prompt(100, 4, 500), _prompt(200, 2, 700)]


def test_with_a_colder_tier_belady_is_not_the_optimum_even_one_request_at_a_time(tmp_path):
    """A GPU tier of 7 pages and a host tier of 4 below it, one request at a time. Each
    tier gives up the pages it holds used again furthest, and the host, the last tier,
    drops its own, not the cache's: when A comes back (A1 A2 on GPU, A3 A4 in host), GPU
    gives up C3 and C4 (never used again) to host, and host, to take them, drops B2, used
    by the next turn. The last turn finds B1 only, and belady finds 512 tokens less than
    lru, lfu, arc, sieve or lfu-da. With the same 11 pages as one GPU tier belady finds
    everything that was computed before and fits: it is MIN again."""
    rows, _ = replay_rows(SIX, "belady", 7, 1, tmp_path, host=4)
    assert [r.hit_gpu + r.hit_host for r in rows] == [0, 0, 0, 1536, 2048, 512]
    for p in ("lru", "lfu", "arc", "sieve", "lfu-da"):
        assert found_tokens(replay_rows(SIX, p, 7, 1, tmp_path, host=4)[0]) == 4608, p
    one = [r.hit_gpu for r in replay_rows(SIX, "belady", 11, 1, tmp_path)[0]]
    assert one == pb.min_hits(SIX, 11) and sum(one) == 4608
    for p in ONLINE:
        assert hit_tokens(replay_rows(SIX, p, 11, 1, tmp_path)[0]) <= sum(one), p


@settings(max_examples=5, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), n=st.integers(8, 30), pages=st.integers(14, 30),
       max_running=st.sampled_from([2, 3, 4, 8]))
def test_no_policy_finds_more_than_the_reuse_bound_with_requests_running_together(
        seed, n, pages, max_running, tmp_path):
    requests = workload(seed, n)
    for p in POLICY_NAMES:
        rows, cfg = replay_rows(requests, p, pages, max_running, tmp_path)
        if p == POLICY_NAMES[0]:
            bound = pb.reuse_bound(prepare_run(cfg).workload, 512)
        for r in rows:  # turn by turn
            assert r.hit_gpu <= (r.input_tokens if r.preemptions else bound[r.session, r.turn]), p


def test_the_reuse_bound_counts_what_earlier_turns_computed():
    """Worked by hand: R1 (ids 1, 2) finds nothing; R2 (1, 2, 3) arrives later: blocks 1
    and 2 were computed by R1, block 3 by nobody earlier: 1024 tokens; R3 (1, 9) arrives
    at R2's time: block 1 (R1's) counts, 9 does not: 512. A turn never counts itself."""
    from kvsim.workload.mooncake import load_mooncake

    trace = [{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
             {"timestamp": 5, "input_length": 1500, "output_length": 1, "hash_ids": [1, 2, 3]},
             {"timestamp": 5, "input_length": 1000, "output_length": 1, "hash_ids": [1, 9]}]
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in trace))
        wl = load_mooncake(path)
    assert pb.reuse_bound(wl, 512) == {("req-1", 1): 0, ("req-2", 1): 1024, ("req-3", 1): 512}


@pytest.mark.parametrize("policy", ["lru", "arc", "belady"])
def test_the_reuse_bound_holds_turn_by_turn_on_closed_loop_sessions(policy):
    """configs/default.yaml (synthetic agentic sessions, closed loop, three tiers): no
    turn finds more than an earlier turn of its session or another session computed."""
    cfg = load_config(ROOT / "configs" / "default.yaml", [
        "workload.synthetic.n_sessions=6", "output.plots=false",
        f"cache.policy.eviction={policy}"])
    prep = prepare_run(cfg)
    bound = pb.reuse_bound(prep.workload, cfg.cache.tokens_per_block)
    rows = replay(prep).rows
    assert len(rows) == len(bound) and sum(bound.values()) > 0
    for r in rows:
        found = r.hit_gpu + r.hit_host + r.hit_disk
        assert found <= (r.input_tokens if r.preemptions else bound[r.session, r.turn])


def test_the_concurrency_part_notes_the_pinned_share_at_each_eviction(tmp_path):
    """benchmarks/policy_bound.py --parts concurrency: its manager, swapped in where the
    replay builds its managers, notes a share at each GPU eviction, changes no hit, and is
    swapped back out."""
    import kvsim.run.pipeline
    from kvsim.core import TierManager

    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in workload(3, 40)))
    cfg = pb.mooncake_config("lru", 2, path, None, ["engine.max_running=8"])
    res, shares = pb.replay_noting_pins(cfg)
    assert shares and all(0 <= s <= 1 for s in shares)
    assert kvsim.run.pipeline.TierManager is TierManager
    plain = replay(prepare_run(cfg))
    assert [r.hit_gpu for r in res.rows] == [r.hit_gpu for r in plain.rows]
