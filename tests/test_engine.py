"""The serving engine on the SimPy backend: exact timelines on tiny cases, fast-forward
equivalence, determinism, and the Mooncake reuse checks.

Timelines are computed by hand from the hardware profile and the compute model, then
compared with what the engine measured (integer nanoseconds, so to within rounding).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.run.seam import settings_for
from kvsim.engine.compute import ComputeModel, load_model
from kvsim.config import validate_config
from kvsim.core import Level, ManagerSpec, TierManager, TierSpec
from kvsim.engine import Engine, EngineParams
from kvsim.engine.stages import run_plan
from kvsim.config.hardware import load_profile
from kvsim.run import prepare_run, replay
from kvsim.workload import Session, Turn, Workload, ideal_reuse_ratio, load_mooncake
from kvsim_backends.sim import SimBackend, SimRuntime

NS = 1_000_000_000
MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
B = 32


def _setup(gpu_pages=64, host_pages=256, disk_pages=0, model="llama-3-8b", params=None,
           profile="h200-pcie"):
    shape = load_model(model)
    profile = load_profile(profile)
    page = shape.kv_bytes_per_token * B
    tiers = [TierSpec(Level.GPU, gpu_pages * page), TierSpec(Level.HOST, host_pages * page)]
    if disk_pages:
        tiers.append(TierSpec(Level.DISK, disk_pages * page))
    mgr = TierManager(ManagerSpec(page_bytes=page, tokens_per_block=B, tiers=tuple(tiers)))
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(page, {t.level: t.max_slots for t in mgr.tiers}, profile))
    cm = ComputeModel(shape, profile)
    eng = Engine(rt, be, mgr, cm, params or EngineParams())
    return mgr, rt, be, cm, eng, profile


def _open(turns: list[Turn], block_tokens=B) -> Workload:
    sessions = tuple(Session(f"r{i}", "global", (t,), start_s=t.arrival_s) for i, t in enumerate(turns))
    return Workload("test", block_tokens, False, sessions)


def _cache_then_push_to_host(mgr, rt, be, prefix: list[int]) -> None:
    """Compute and cache a 4-block prompt, then shrink the GPU tier to one page (its 3
    least recently used pages go to host) and grow it back to 8 pages."""
    def prelude():
        req = mgr.create("global", prefix, 128)
        mgr.complete(mgr.resume(req))
        mgr.complete(mgr.grow(req, 128))
        be.fill(mgr.commit(req, 128))
        mgr.close(req)
        yield from run_plan(rt, be, mgr, mgr.set_quota(Level.GPU, mgr.page_bytes), refcheck=True)
        mgr.complete(mgr.set_quota(Level.GPU, 8 * mgr.page_bytes))

    rt.run(until=rt.process(prelude()))


def test_one_cold_request_ttft_is_its_prefill_time():
    """A lone request with nothing cached: it is admitted on arrival, its whole prompt is
    one prefill chunk, so TTFT is exactly the compute model's prefill time; each further
    token is one decode step."""
    mgr, rt, be, cm, eng, _ = _setup()
    eng.load(_open([Turn(input_tokens=100, output_tokens=3, hash_ids=(1, 2, 3, 4), arrival_s=1.0)]))
    rt.run(until=rt.process(eng.serve()))
    row = eng.metrics.rows[0]
    prefill_ns = round(cm.step_time([(100, 0)], []) * NS)
    assert row.first_token_ns - row.arrival_ns == prefill_ns
    d1 = round(cm.step_time([], [100]) * NS)
    d2 = round(cm.step_time([], [101]) * NS)
    assert row.done_ns - row.first_token_ns == d1 + d2
    assert row.computed_tokens == 100
    assert (row.hit_gpu, row.hit_host, row.hit_disk) == (0, 0, 0)


def test_prefix_on_host_ttft_is_onboard_plus_prefill():
    """Story: a 128-token prefix (4 pages) was computed earlier, then a quota shrink to one
    page pushed its 3 least recently used pages (the tail: a request's pages are ranked
    tail-first) to the host tier. A request arrives whose prompt is that prefix plus 40
    new tokens. The engine onboards the 3 pages host->GPU (one copy-engine batch: call
    overhead + 3 x per-page host time + bytes over the link), then runs one prefill chunk
    of the 40 new tokens over a 128-token context. TTFT = onboard + prefill."""
    mgr, rt, be, cm, eng, profile = _setup(gpu_pages=8, host_pages=64)
    prefix = [10, 11, 12, 13]
    _cache_then_push_to_host(mgr, rt, be, prefix)
    probe = mgr.probe_reuse("global", prefix + [14, 15], 168)
    assert (probe[Level.GPU], probe[Level.HOST]) == (32, 96)
    t_arrive = 10.0
    eng.load(_open([Turn(input_tokens=168, output_tokens=1, hash_ids=tuple(prefix + [14, 15]),
                         arrival_s=t_arrive)]))
    eng.t = round(rt.now * NS)
    rt.run(until=rt.process(eng.serve()))
    row = eng.metrics.rows[0]
    ce, link = profile.copy_engine, profile.link
    assert be.paths["h2d"].name == "COPY_ENGINE"
    nbytes = 3 * mgr.page_bytes
    onboard_s = ce.per_call + 3 * ce.per_page + nbytes / min(link.h2d, link.both)
    prefill_s = cm.step_time([(40, 128)], [])
    assert (row.hit_gpu, row.hit_host, row.computed_tokens) == (32, 96, 40)
    assert row.onboard_bytes == nbytes
    assert abs((row.first_token_ns - row.arrival_ns) - round((onboard_s + prefill_s) * NS)) <= 2


def _mini_mooncake(n=60, seed=3):
    """A small Mooncake-format workload with shared prefixes (built, not read)."""
    import random

    rnd = random.Random(seed)
    turns, t = [], 0.0
    next_id = 1000
    prefixes = [list(range(k * 10, k * 10 + 6)) for k in range(4)]
    for _ in range(n):
        t += rnd.expovariate(4.0)
        pre = rnd.choice(prefixes)[: rnd.randint(1, 6)]
        extra = rnd.randint(0, 6)
        ids = pre + list(range(next_id, next_id + extra))
        next_id += extra
        ntok = (len(ids) - 1) * 512 + rnd.randint(1, 512)
        turns.append(Turn(input_tokens=ntok, output_tokens=rnd.randint(1, 400), hash_ids=tuple(ids),
                          arrival_s=round(t, 3)))
    return _open(turns, block_tokens=512)


def _run(workload, fast: bool, gpu_pages=600, host_pages=900, disk_pages=2000, model="llama-3-8b",
         profile="h200-pcie", watermark=0.0):
    mgr, rt, be, cm, eng, _ = _setup(gpu_pages, host_pages, disk_pages, model,
                                     EngineParams(max_batch_tokens=4096, max_running=16, fast_forward=fast,
                                                  gpu_free_watermark=watermark),
                                     profile)
    eng.load(workload)
    rt.run(until=rt.process(eng.serve()))
    rows = [(r.rid, r.arrival_ns, r.first_token_ns, r.done_ns, r.hit_gpu, r.hit_host, r.hit_disk,
             r.computed_tokens, r.preemptions) for r in eng.metrics.rows]
    return rows, eng.metrics, mgr.counters.snapshot()


@pytest.mark.parametrize("profile, watermark", [("h200-pcie", 0.0), ("h200-pcie-calibrated", 0.0),
                                                ("h200-pcie", 0.05)])
def test_fast_forward_equals_step_by_step(profile, watermark):
    """Fast-forwarding identical decode steps changes nothing a user can observe: every
    request's timestamps (to the nanosecond), hits and counters equal a step-by-step
    replay's, with pressure on all three tiers; also with a profile whose compute calls
    have a fixed cost and run over their nominal time (compute.latency, compute.scale),
    and with background eviction (it starts at the first boundary where free GPU slots
    are below the watermark: a run ahead must not step over that boundary)."""
    w = _mini_mooncake()
    slow_rows, slow_m, slow_c = _run(w, fast=False, gpu_pages=300, host_pages=300, profile=profile,
                                     watermark=watermark)
    fast_rows, fast_m, fast_c = _run(w, fast=True, gpu_pages=300, host_pages=300, profile=profile,
                                     watermark=watermark)
    assert fast_m.fast_forwarded_steps > 0 and slow_m.fast_forwarded_steps == 0
    # some steps ran ahead of the clock while transfers were in flight
    assert fast_m.ahead_inflight_steps > 0 and slow_m.ahead_inflight_steps == 0
    assert slow_c["dropped_pages"][2] > 0 or slow_c["evicted_pages"][1] > 0
    assert fast_rows == slow_rows
    assert fast_c == slow_c
    assert fast_m.steps == slow_m.steps


def test_same_seed_and_config_give_identical_metrics(tmp_path):
    """Two runs of the default config: summary.json metrics identical but for wall time."""
    from kvsim.config import load_config
    from kvsim.run import write_results

    outs = []
    for i in range(2):
        cfg = load_config("configs/default.yaml", ["workload.synthetic.n_sessions=8"])
        res = replay(prepare_run(cfg))
        path = write_results(res, tmp_path / f"r{i}", plots=False)
        m = json.loads((path / "summary.json").read_text())["metrics"]
        m.pop("wall_time_s")
        outs.append(json.dumps(m, sort_keys=True))
        assert (path / "requests.csv").exists() and (path / "timeline.csv").exists()
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["requests_completed"] > 0


def _mooncake_cfg(tiers, limit=None, tpb=512):
    data = {
        "name": "t", "model": "llama-3-70b", "hardware": "h200-pcie",
        "cache": {"tokens_per_block": tpb, "tiers": tiers},
        "engine": {"max_running": 128, "refcheck": False},
        "workload": {"kind": "mooncake", "path": str(MOONCAKE), "limit": limit},
        "output": {"plots": False},
    }
    return validate_config(data)


@pytest.mark.skipif(not MOONCAKE.exists(), reason="../shared/traces not present")
@pytest.mark.slow
def test_mooncake_hit_ratio_matches_ideal_reuse_with_unbounded_tiers():
    """With tiers so large nothing is ever evicted, the replay's hit ratio equals the
    ideal reuse computed straight from the trace's hash_ids (within 0.02)."""
    ideal = ideal_reuse_ratio(load_mooncake(MOONCAKE))
    cfg = _mooncake_cfg([{"level": "gpu", "quota": "100TiB"}])
    res = replay(prepare_run(cfg))
    m = res.metrics
    assert m["requests_completed"] == 12031
    assert sum(m["evicted_pages"].values()) == 0 and sum(m["dropped_pages"].values()) == 0
    ratio = m["hit_tokens"]["total"] / m["input_tokens"]
    assert abs(ratio - ideal) < 0.02, (ratio, ideal)


def _lru_reference(workload, n_blocks: int) -> float:
    """An LRU cache of ``n_blocks`` trace blocks, replayed in arrival order, independent of
    kvsim: a request hits the longest cached prefix of its blocks, then all its blocks
    become the most recently used; the least recently used leave beyond capacity."""
    from collections import OrderedDict

    cache: OrderedDict = OrderedDict()
    hit = total = 0
    for _, t in workload.iter_turns():
        ids = t.hash_ids
        total += t.input_tokens
        keys = [tuple(ids[: i + 1]) for i in range(len(ids))]  # a block is its whole prefix
        for i, k in enumerate(keys):
            if k not in cache:
                break
            hit += min(512, t.input_tokens - i * 512)
        for k in keys:
            cache[k] = None
            cache.move_to_end(k)
        while len(cache) > n_blocks:
            cache.popitem(last=False)
    return hit / total


@pytest.mark.skipif(not MOONCAKE.exists(), reason="../shared/traces not present")
@pytest.mark.slow
def test_mooncake_hit_ratio_falls_with_gpu_blocks_like_lru():
    """With only a GPU tier of N blocks, the hit ratio falls as N shrinks, and tracks an
    independent LRU cache of N blocks replayed over the same requests (within 0.02; the
    engine differs only in timing: concurrent requests, admission, pages in use)."""
    page = load_model("llama-3-70b").kv_bytes_per_token * 512
    w = load_mooncake(MOONCAKE, limit=3000)
    ratios = []
    for n in (20000, 4000, 1000, 300):
        cfg = _mooncake_cfg([{"level": "gpu", "quota": n * page}], limit=3000)
        m = replay(prepare_run(cfg)).metrics
        ratio = m["hit_tokens"]["gpu"] / m["input_tokens"]
        assert abs(ratio - _lru_reference(w, n)) < 0.02, (n, ratio, _lru_reference(w, n))
        ratios.append(ratio)
    assert all(a >= b for a, b in zip(ratios, ratios[1:])), ratios
    assert ratios[0] > ratios[-1] + 0.05, ratios


def test_closed_loop_session_think_time_and_held_prefix():
    """Story: one agentic session, closed loop. Turn 1 (64 tokens) runs at t=0. Turn 2 is
    released exactly think_s = 5 s after turn 1's last token; its prompt extends turn 1's
    two full blocks, which the suspended session held on GPU, so they are GPU hits. A
    sub-agent between turn 2 and turn 3 shares the session's scope: it runs to completion
    (finding the session's prefix cached) before turn 3 is released, 1 s after it."""
    mgr, rt, be, cm, eng, _ = _setup()
    t1 = Turn(input_tokens=64, output_tokens=2, hash_ids=(1, 2))
    t2 = Turn(input_tokens=100, output_tokens=2, hash_ids=(1, 2, 3, 4), think_s=5.0)
    sub = Session("sess/sub", "sess", (Turn(input_tokens=70, output_tokens=1, hash_ids=(1, 2, 9),
                                            think_s=0.5),))
    t3 = Turn(input_tokens=130, output_tokens=1, hash_ids=(1, 2, 3, 4, 5), think_s=1.0)
    w = Workload("closed", B, True, (Session("sess", "sess", (t1, t2, sub, t3)),))
    eng.load(w, start_times_s=[0.0])
    rt.run(until=rt.process(eng.serve()))
    r1, r2, rs, r3 = eng.metrics.rows
    assert r1.arrival_ns == 0
    assert r2.arrival_ns == r1.done_ns + 5 * NS
    assert (r2.hit_gpu, r2.computed_tokens) == (64, 36)
    assert rs.arrival_ns == r2.done_ns + NS // 2 and rs.hit_gpu == 64
    assert r3.arrival_ns == rs.done_ns + NS
    assert r3.hit_gpu == 96  # turn 2 left blocks 1-3 full; its 4-token block 4 is too short
    assert all(r.done_ns > 0 and not r.failed for r in (r1, r2, rs, r3))
    assert len(list(mgr.requests())) == 0  # every request closed once the session ended


def test_the_engine_tells_its_listener_of_resumes_and_a_modelled_loop_holds_the_step():
    """The story above with the hw loop's host time modelled (``kvsim.tools.hwloop``, what
    ``kvsim compare`` does): the engine tells ``on_resume`` of each resumed request's GPU
    pages, turn 1 (cold, no pages to walk) as 0 and is as before; turn 2 resumes the
    session's 2 GPU pages, so its first step starts resume + 2 x resume_per_page later,
    and its TTFT grows by exactly that."""
    from kvsim.tools.hwloop import HwLoop, HwLoopModel
    from kvsim_backends.sim.loopcosts import HwLoopSim

    def story(model: bool):
        shape = load_model("llama-3-8b")
        profile = load_profile("h200-pcie")
        page = shape.kv_bytes_per_token * B
        mgr = TierManager(ManagerSpec(page_bytes=page, tokens_per_block=B,
                                      tiers=(TierSpec(Level.GPU, 64 * page), TierSpec(Level.HOST, 64 * page))))
        rt = SimRuntime()
        be = SimBackend(rt, settings_for(page, {t.level: t.max_slots for t in mgr.tiers}, profile))
        loop = HwLoop(HwLoopModel(resume=1e-3, resume_per_page=1e-4))
        told: list[int] = []
        eng = Engine(rt, HwLoopSim(be, loop) if model else be, mgr, ComputeModel(shape, profile),
                     EngineParams(refcheck=False),  # (no check to model: the hold alone)
                     on_resume=lambda n: (told.append(n), loop.resumed(n)))
        t1 = Turn(input_tokens=64, output_tokens=2, hash_ids=(1, 2))
        t2 = Turn(input_tokens=100, output_tokens=2, hash_ids=(1, 2, 3, 4), think_s=5.0)
        eng.load(Workload("closed", B, True, (Session("sess", "sess", (t1, t2)),)), start_times_s=[0.0])
        rt.run(until=rt.process(eng.serve()))
        return eng.metrics.rows, told

    ((a1, a2), told_a), ((b1, b2), told_b) = story(False), story(True)
    assert told_a == told_b == [0, 2]
    assert (b2.hit_gpu, b2.computed_tokens) == (64, 36)
    assert (b1.first_token_ns, b1.done_ns) == (a1.first_token_ns, a1.done_ns)
    ttft = lambda r: r.first_token_ns - r.arrival_ns  # noqa: E731
    assert ttft(b2) - ttft(a2) == round((1e-3 + 2 * 1e-4) * NS)


def test_transfers_that_keep_failing_fail_the_request_not_the_run():
    """Story: a prefix sits on host, but every transfer fails (a broken link or a full
    disk). The engine retries the resume, then gives up after max_plan_failures attempts:
    the request is reported failed with the reason, the run ends, no page was served."""
    mgr, rt, be, cm, eng, _ = _setup(gpu_pages=8, host_pages=64,
                                     params=EngineParams(max_plan_failures=3))
    prefix = [10, 11, 12, 13]
    _cache_then_push_to_host(mgr, rt, be, prefix)
    be.fail_next_transfer(1000)
    eng.load(_open([Turn(input_tokens=168, output_tokens=4, hash_ids=tuple(prefix + [14, 15]),
                         arrival_s=10.0),
                    Turn(input_tokens=40, output_tokens=2, hash_ids=(7, 8), arrival_s=10.0)]))
    eng.t = round(rt.now * NS)
    rt.run(until=rt.process(eng.serve()))
    bad, good = eng.metrics.rows
    assert bad.failed.startswith("transfers failed 3 times in a row")
    assert bad.first_token_ns < 0
    assert not good.failed and good.done_ns > 0      # the rest of the run went on
    assert mgr.counters.failed_batches == 3
    assert eng.metrics.requests_failed == 1


def test_pinned_arrivals_replace_think_times():
    """``Engine.pin_arrivals``: a closed-loop turn is released at its pinned time, or when
    its session's previous item completes if that is later; pinned to its own arrivals a
    replay is unchanged (the same rows to the nanosecond)."""
    def story(pins=None):
        mgr, rt, be, cm, eng, _ = _setup()
        t1 = Turn(input_tokens=64, output_tokens=2, hash_ids=(1, 2))
        t2 = Turn(input_tokens=100, output_tokens=2, hash_ids=(1, 2, 3, 4), think_s=5.0)
        t3 = Turn(input_tokens=130, output_tokens=1, hash_ids=(1, 2, 3, 4, 5), think_s=1.0)
        if pins is not None:
            eng.pin_arrivals(pins)
        eng.load(Workload("closed", B, True, (Session("sess", "sess", (t1, t2, t3)),)), start_times_s=[0.0])
        rt.run(until=rt.process(eng.serve()))
        return eng.metrics.rows

    free = story()
    assert [r.turn for r in free] == [1, 2, 3]
    same = story({(r.session, r.turn): r.arrival_ns / NS for r in free})
    assert [vars(r) for r in same] == [vars(r) for r in free]
    # turn 2 pinned 2 s later than its think time gives; turn 3 pinned before turn 2 ends
    late = free[1].arrival_ns / NS + 2.0
    r1, r2, r3 = story({("sess", 2): late, ("sess", 3): 0.5})
    assert r2.arrival_ns == round(late * NS)
    assert r3.arrival_ns == r2.done_ns  # released when its session's previous item completed


def test_the_engine_gives_the_manager_the_workloads_priorities():
    """Story: one session (priority 2, its first 64 tokens a shared prefix of priority 5)
    calls a sub-agent (priority 1, no prefix of its own). The engine creates each request
    with the turn's priorities; the pages they compute keep them in the prefix tree."""
    mgr, rt, be, cm, eng, _ = _setup()
    t1 = Turn(input_tokens=128, output_tokens=1, hash_ids=(1, 2, 3, 4), priority=2,
              prefix_tokens=64, prefix_priority=5)
    sub = Session("s/sub", "s", (Turn(input_tokens=96, output_tokens=1, hash_ids=(7, 8, 9),
                                      priority=1),))
    w = Workload("prio", B, True, (Session("s", "s", (t1, sub)),))
    eng.load(w, start_times_s=[0.0])
    rt.run(until=rt.process(eng.serve()))
    assert all(not r.failed for r in eng.metrics.rows)
    tree = sorted((p.priority, p.index) for p in mgr.pages() if p.in_tree)
    # the sub-agent's 3 blocks at 1; the session's blocks 2-3 at 2, 0-1 (the prefix) at 5
    assert tree == [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (5, 0), (5, 1)]


class _Recording:
    """A backend that records the work each step hands it, else the sim backend's."""

    def __init__(self, inner):
        self.inner = inner
        self.works = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def compute(self, duration_s, work=None):
        self.works.append(("compute", duration_s, work))
        return self.inner.compute(duration_s, work)

    def compute_ahead(self, start_s, seconds, quiet, work=None):
        end = self.inner.compute_ahead(start_s, seconds, quiet, work)
        if end is not None:
            self.works.append(("ahead", seconds, work))
        return end


@pytest.mark.parametrize("fast", [False, True])
def test_every_step_reaches_the_backend_with_its_work(fast):
    """Stepped or run ahead, each engine step hands the backend the compute model's record
    of it: a prefill step's work holds its chunk's tokens, a decode step's its decoders;
    its seconds are the step's nominal time, so over the run they add up to the steps'."""
    mgr, rt, be, cm, eng, _ = _setup(params=EngineParams(fast_forward=fast))
    rec = _Recording(be)
    eng.backend = rec
    eng.load(_open([Turn(input_tokens=100, output_tokens=20, hash_ids=(1, 2, 3, 4), arrival_s=1.0)]))
    rt.run(until=rt.process(eng.serve()))
    works = [w for _, _, w in rec.works]
    assert len(works) == eng.metrics.steps
    assert works[0] == cm.step_work([(100, 0)], 0, 0)
    assert (works[0].prefill_tokens, works[0].decode_tokens) == (100, 0)
    assert works[1] == cm.decode_work(1, 100)
    assert all(w.decode_tokens == 1 and w.prefill_tokens == 0 for w in works[1:])
    row = eng.metrics.rows[0]
    assert sum(round(w.seconds * NS) for w in works) == row.done_ns - row.arrival_ns
    assert any(kind == "ahead" for kind, _, _ in rec.works) == fast
