"""A request's fixed state (a sliding window, a recurrent state) moves with it.

Core scenarios (``kvsim.core.statepages``) on the reference backend, with the refcheck and
``audit`` after every step; then the engine on the sim backend: a hybrid model's session
stashes its state to host between turns and brings it back before the next turn's first
token, a state with no host room is dropped and the prefix recomputed; then the hw
backend, moving real bytes (numpy here, CuPy on a GPU: marker ``gpu``).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import PAGE, backend_for, check, make_manager, new_active, run
from gpuskip import have_gpu
from kvsim.core import Level, RefusalReason, ReqState
from kvsim.core.plan import BatchKind, PlanKind

GPU, HOST, DISK = Level.GPU, Level.HOST, Level.DISK


def _gpu_state(m, be, req, n):
    """``req`` takes ``n`` fresh state slots on GPU and writes its state (as a turn does)."""
    plan = m.take_state(req, n)
    assert plan and not plan.batches
    m.complete(plan)
    fill = m.state_fill(req)
    be.fill(fill)
    return fill


# -- core --------------------------------------------------------------------------------

def test_a_state_goes_to_host_on_suspend_and_back_to_gpu_with_its_tags():
    m = make_manager(gpu=6, host=4, disk=4)
    be = backend_for(m)
    req = new_active(m, be, 8)                      # 2 pages of blocks on GPU
    fill = _gpu_state(m, be, req, 2)                # + 2 state slots
    assert m.tiers[0].used == 4 and m.state_level(req) is GPU
    check(m, be)
    m.suspend(req)
    # step 1: the stash plan: one STATE batch GPU -> host of the state's 2 pages
    plan = m.stash_state(req)
    assert plan.kind is PlanKind.STATE and [b.kind for b in plan.batches] == [BatchKind.STATE]
    b = plan.batches[0]
    assert (b.src, b.dst, b.nbytes) == (GPU, HOST, 2 * PAGE)
    assert list(b.src_slots) == list(fill.slots) and list(b.tags) == list(fill.tags)
    assert m.state_moving(req)
    check(m, be)                                    # in flight: sources and slots owned
    assert run(m, be, plan) == [True]
    # step 2: on host, the GPU slots free, the tags arrived
    assert m.state_level(req) is HOST and m.tiers[0].used == 2 and m.tiers[1].used == 2
    assert list(be.read_tags(HOST, b.dst_slots)) == list(fill.tags)
    assert m.counters.state_out_pages == 2
    assert (m.tier_stats(HOST).state, m.tier_stats(HOST).reserved, m.tier_stats(GPU).state) == (2, 0, 0)
    check(m, be)
    # step 3: its next turn takes it back: a STATE batch host -> GPU with the same tags
    back = m.take_state(req, 2)
    assert [(x.kind, x.src, x.dst) for x in back.batches] == [(BatchKind.STATE, HOST, GPU)]
    assert list(back.batches[0].tags) == list(fill.tags)
    assert run(m, be, back) == [True]
    assert m.state_level(req) is GPU and m.tiers[1].used == 0
    assert list(be.read_tags(GPU, back.batches[0].dst_slots)) == list(fill.tags)
    assert m.counters.state_in_pages == 2
    check(m, be)
    # each write is a new version: new tags
    assert list(m.state_fill(req).tags) != list(fill.tags)
    m.close(req)
    assert m.tiers[0].used == 2 and m.state_level(req) is None  # (its block pages stay cached)
    check(m, be)


def test_a_stash_evicts_host_pages_to_disk_first():
    m = make_manager(gpu=8, host=2, disk=4)
    be = backend_for(m)
    a = new_active(m, be, 8)
    m.close(a)
    run(m, be, m.evict(GPU, 2))                     # A's 2 cached pages now fill the host
    assert m.tiers[1].used == 2
    req = new_active(m, be, 4, family=1)
    _gpu_state(m, be, req, 2)
    m.suspend(req)
    plan = m.stash_state(req)
    kinds = sorted((x.stage, x.kind, x.src, x.dst) for x in plan.batches)
    assert kinds == [(0, BatchKind.EVICT, HOST, DISK), (2, BatchKind.STATE, GPU, HOST)]
    check(m, be)
    assert run(m, be, plan) == [True, True]
    assert m.tiers[2].used == 2 and m.state_level(req) is HOST
    check(m, be)


def test_no_host_room_refuses_the_stash_and_the_state_is_dropped():
    m = make_manager(gpu=8, host=2, disk=None)
    be = backend_for(m)
    held = new_active(m, be, 8)
    m.suspend(held)
    run(m, be, m.evict(GPU, 2))                     # held pages fill the host: none may drop
    req = new_active(m, be, 4, family=1)
    _gpu_state(m, be, req, 2)
    m.suspend(req)
    used = [t.used for t in m.tiers]
    refusal = m.stash_state(req)
    assert not refusal and refusal.reason is RefusalReason.NO_ROOM
    assert [t.used for t in m.tiers] == used        # nothing changed
    m.drop_state(req)
    assert m.state_level(req) is None and m.tiers[0].used == used[0] - 2
    check(m, be)


def test_a_failed_stash_leaves_the_state_on_gpu_and_closing_during_one_frees_it():
    m = make_manager(gpu=6, host=4, disk=None)
    be = backend_for(m)
    req = new_active(m, be, 4)
    _gpu_state(m, be, req, 2)
    m.suspend(req)
    assert run(m, be, m.stash_state(req), fail_batches={0}) == [False]
    assert m.state_level(req) is GPU and m.tiers[1].used == 0
    check(m, be)
    plan = m.stash_state(req)
    m.close(req)                                    # closed while its state moves
    assert m.state_level(req) is HOST or m.state_moving(req)
    check(m, be)
    run(m, be, plan)
    assert m.state_level(req) is None and m.tiers[1].used == 0 and m.tiers[0].used == 1
    check(m, be)


def test_taking_a_state_that_moves_is_busy_and_needs_free_gpu_slots():
    m = make_manager(gpu=4, host=4, disk=None)
    be = backend_for(m)
    req = new_active(m, be, 8)
    _gpu_state(m, be, req, 2)
    m.suspend(req)
    plan = m.stash_state(req)
    assert m.take_state(req, 2).reason is RefusalReason.BUSY
    run(m, be, plan)
    other = new_active(m, be, 8, family=1)         # 2 more pages: the GPU is full
    assert m.take_state(req, 2).reason is RefusalReason.NO_ROOM
    assert other.state is ReqState.ACTIVE
    check(m, be)


# -- the engine (sim) ---------------------------------------------------------------------

def _engine(state_pages=0, host_pages=256, disk=False, **params):
    from kvsim.core import ManagerSpec, TierManager, TierSpec
    from kvsim.config.hardware import load_profile
    from kvsim.config.hfmodel import load_model
    from kvsim.engine import Engine, EngineParams
    from kvsim.engine.compute import ComputeModel
    from kvsim.run.seam import settings_for
    from kvsim_backends.sim import SimBackend, SimRuntime

    shape, profile = load_model("llama-3-8b"), load_profile("h200-pcie")
    page = shape.page_bytes_per_token * 32
    tiers = [TierSpec(GPU, 128 * page), TierSpec(HOST, host_pages * page)]
    if disk:
        tiers.append(TierSpec(DISK, 256 * page))
    mgr = TierManager(ManagerSpec(page_bytes=page, tokens_per_block=32, tiers=tuple(tiers)))
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(page, {t.level: t.max_slots for t in mgr.tiers}, profile))
    moves: list = []  # (kind, src, dst, bytes, start s, end s) of every transfer
    transfer = be.transfer

    def spy(b):
        ev = transfer(b)
        rec = [b.kind, b.src, b.dst, b.nbytes, rt.now, None]
        moves.append(rec)
        ev.callbacks.append(lambda _e: rec.__setitem__(5, rt.now))
        return ev

    be.transfer = spy
    eng = Engine(rt, be, mgr, ComputeModel(shape, profile),
                 EngineParams(state_pages=state_pages, **params))
    return rt, eng, mgr, moves


def _session(turns=2, blocks=10):
    """One session: each turn's prompt is the previous turn's whole context + 2 blocks."""
    from kvsim.workload import Session, Turn, Workload

    ts, ids = [], []
    for i in range(turns):
        ids = ids + [100 * i + j for j in range(blocks if i == 0 else 2)]
        ts.append(Turn(input_tokens=32 * len(ids), output_tokens=32, hash_ids=tuple(ids),
                       arrival_s=1.0 + 10.0 * i))
        ids = ids + [100 * i + 50]                 # its output block
    return Workload("t", 32, False, (Session("s", "global", tuple(ts), start_s=1.0),))


def _serve(rt, eng, wl):
    eng.load(wl)
    rt.run(until=rt.process(eng.serve()))
    rows = sorted(eng.metrics.rows, key=lambda r: r.turn)
    assert all(r.done_ns > 0 and not r.failed for r in rows)
    return rows


def test_a_hybrid_session_moves_its_state_to_host_and_back_before_its_next_token():
    sp = 5
    rt, eng, mgr, moves = _engine(state_pages=sp, state_recurrent=True)
    rows = _serve(rt, eng, _session())
    state = [m for m in moves if m[0] is BatchKind.STATE]
    # turn 1 ends: its state goes GPU -> host (sp pages); turn 2: host -> GPU; the session
    # then ends (its request closed: nothing moves)
    assert [(m[1], m[2], m[3]) for m in state] == [(GPU, HOST, sp * mgr.page_bytes),
                                                  (HOST, GPU, sp * mgr.page_bytes)]
    out, back = state
    assert out[4] == pytest.approx(rows[0].done_ns / 1e9)
    assert rows[1].arrival_ns / 1e9 <= back[4] < back[5] <= rows[1].first_token_ns / 1e9
    # the bytes are the run's traffic and the turn's onboarding
    assert eng.backend.stats()["gpu_to_host"] == sp * mgr.page_bytes
    assert eng.backend.stats()["host_to_gpu"] == sp * mgr.page_bytes
    assert rows[1].onboard_bytes == sp * mgr.page_bytes
    # it kept its state: turn 2 computed only what it did not find
    hit = rows[1].hit_gpu + rows[1].hit_host + rows[1].hit_disk
    assert hit > 0 and rows[1].computed_tokens == rows[1].input_tokens - hit
    m = eng.metrics
    assert (m.state_stashed, m.state_restored, m.state_dropped) == (1, 1, 0)
    assert m.state_recomputed_tokens == 0
    assert mgr.tiers[1].used == 0 and all(not r.fixed for r in mgr.requests())


def test_a_model_without_state_moves_nothing_for_it():
    rt, eng, mgr, moves = _engine(state_pages=0)
    rows = _serve(rt, eng, _session())
    assert moves == [] and not eng.metrics.state_on
    assert eng.backend.stats()["gpu_to_host"] == 0 and rows[1].onboard_bytes == 0
    hit = rows[1].hit_gpu
    assert rows[1].computed_tokens == rows[1].input_tokens - hit


@pytest.mark.parametrize("recurrent, window", [(True, 0), (False, 100)])
def test_no_host_room_drops_the_state_and_the_next_turn_recomputes(recurrent, window):
    """A host tier of 2 pages cannot take a state of 5: it is dropped at suspend; the next
    turn finds its prefix cached but recomputes it for the stateful layers: all of it
    (recurrent), or its last ``window`` tokens (sliding)."""
    rt, eng, mgr, moves = _engine(state_pages=5, host_pages=2, state_recurrent=recurrent,
                                  state_window=window)
    rows = _serve(rt, eng, _session())
    assert not [m for m in moves if m[0] is BatchKind.STATE]
    hit = rows[1].hit_gpu + rows[1].hit_host + rows[1].hit_disk
    redo = hit if recurrent else min(hit, window)
    assert hit > 0 and rows[1].computed_tokens == rows[1].input_tokens - hit + redo
    m = eng.metrics
    assert (m.state_stashed, m.state_dropped, m.state_recomputed_tokens) == (0, 1, redo)


def test_a_state_of_no_use_to_the_next_prompt_stays_behind():
    """Turn 2's prompt keeps only the first 4 of turn 1's 10 blocks (a context compacted):
    the stashed state stands for the end of turn 1's prompt, not for where turn 2 resumes,
    so it is not brought back; a recurrent model recomputes the 4 blocks found."""
    from kvsim.workload import Session, Turn, Workload

    t1 = Turn(input_tokens=320, output_tokens=32, hash_ids=tuple(range(10)), arrival_s=1.0)
    t2 = Turn(input_tokens=320, output_tokens=32, hash_ids=(0, 1, 2, 3, *range(20, 26)),
              arrival_s=11.0)
    rt, eng, mgr, moves = _engine(state_pages=5, state_recurrent=True)
    rows = _serve(rt, eng, Workload("t", 32, False, (Session("s", "global", (t1, t2), start_s=1.0),)))
    assert [(m[1], m[2]) for m in moves if m[0] is BatchKind.STATE] == [(GPU, HOST)]
    assert rows[1].hit_gpu == 4 * 32 and rows[1].computed_tokens == 320
    m = eng.metrics
    assert (m.state_stashed, m.state_restored, m.state_stale) == (1, 0, 1)
    assert m.state_recomputed_tokens == 4 * 32 and mgr.tiers[1].used == 0


def test_a_decoder_preempted_without_host_room_recomputes_its_context_and_goes_on():
    """A request is preempted while it decodes (the engine's own ``_preempt``, called at a
    step boundary); its state finds no host room and is dropped; re-admitted, it computes
    its whole context again (prompt and the tokens generated so far) before its next
    token, keeps its first token's time, and finishes its output."""
    from kvsim.workload import Session, Turn, Workload

    rt, eng, mgr, moves = _engine(state_pages=5, host_pages=2, state_recurrent=True)
    turn = Turn(input_tokens=320, output_tokens=64, hash_ids=tuple(range(10)), arrival_s=1.0)
    seen: dict = {}

    def preempt_once(t):
        for lv in list(eng.dec.members):
            if "kv" not in seen and lv.gen >= 5:
                first = lv.row.first_token_ns
                eng._preempt(lv)
                seen.update(kv=lv.kv, first=first, t=t)

    eng.on_progress = preempt_once
    rows = _serve(rt, eng, Workload("t", 32, False, (Session("s", "global", (turn,), start_s=1.0),)))
    row = rows[0]
    assert row.preemptions == 1 and seen["kv"] > 320
    assert eng.metrics.state_dropped == 1 and eng.metrics.state_recomputed_tokens == seen["kv"]
    assert row.computed_tokens == 320 + seen["kv"]
    assert row.first_token_ns == seen["first"] < seen["t"] < row.done_ns


def test_dropped_or_kept_the_turn_pays_for_its_state():
    """The same session three ways: kept (its state restored: TTFT pays the copy), dropped
    (no host room: TTFT pays the recompute of a recurrent model's whole prefix)."""
    kept = _serve(*_engine(state_pages=5, state_recurrent=True)[:2], _session())
    none = _serve(*_engine(state_pages=0)[:2], _session())
    lost = _serve(*_engine(state_pages=5, host_pages=2, state_recurrent=True)[:2], _session())
    assert none[1].ttft_s < kept[1].ttft_s < lost[1].ttft_s


# -- the hw backend: real bytes -----------------------------------------------------------

def _hw_round_trip(device, tmp_path):
    from kvsim.engine.stages import run_plan
    from kvsim.run.seam import settings_for
    from kvsim_backends.hw import HwBackend, RealtimeRuntime

    pb = 64 << 10
    m = make_manager(gpu=8, host=8, disk=None, page=pb)
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(pb, {t.level: t.max_slots for t in m.tiers},
                                    device=device, refcheck=True))
    try:
        req = m.create("s", [1], 4)
        m.complete(m.resume(req))
        plan = m.take_state(req, 3)
        m.complete(plan)
        fill = m.state_fill(req)
        be.fill(fill)
        m.suspend(req)
        oks = []

        def proc():
            oks.append((yield from run_plan(rt, be, m, m.stash_state(req), refcheck=True)))
            oks.append((yield from run_plan(rt, be, m, m.take_state(req, 3), refcheck=True)))

        rt.run(rt.process(proc()))
        assert oks == [True, True]                  # each move read back and checked
        slots = [p.slot for p in req.fixed]
        assert m.state_level(req) is GPU
        assert np.array_equal(be.read_tags(GPU, slots), np.asarray(fill.tags, np.uint64))
        st = be.stats()
        assert st["gpu_to_host"] == st["host_to_gpu"] == 3 * pb
    finally:
        be.close()


def test_hw_cpu_moves_a_states_bytes_to_host_and_back(tmp_path):
    _hw_round_trip("cpu", tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_hw_moves_a_states_bytes_to_host_and_back(tmp_path):
    _hw_round_trip("gpu", tmp_path)


# -- a replay, both backends ----------------------------------------------------------------

HYBRID = ["--set", "model=jamba-v0.1", "--set", "workload.synthetic.n_sessions=2",
          "--set", "workload.synthetic.turns=[3, 3]", "--set", "workload.synthetic.subagent_prob=0",
          "--set", "workload.synthetic.max_context_tokens=8000",
          "--set", "workload.synthetic.step_input_tokens=300",
          "--set", "workload.synthetic.prefix_tokens=1000", "--set", "cache.page_bytes=4KiB",
          "--set", "cache.tiers=[{level: gpu, quota: 64MiB}, {level: host, quota: 64MiB}, "
                   "{level: disk, quota: 128MiB}]", "--set", "output.plots=false", "--no-progress"]


def _replay(tmp_path, *backend):
    import csv
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app
    from kvsim.config.hfmodel import load_model

    out = tmp_path / "res"
    r = CliRunner().invoke(app, ["run", "configs/default.yaml", "--out", str(out), *HYBRID,
                                 *backend])
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    m, page = s["metrics"], s["metrics"]["page_bytes"]
    sp = -(-load_model("jamba-v0.1").state_bytes(32) // page)
    st = m["fixed_state"]
    rows = list(csv.DictReader((out / "requests.csv").open()))
    sessions = {r["session"] for r in rows}
    assert s["config"]["engine"]["refcheck"] and len(rows) > len(sessions) == 2
    # every turn but each session's last stashed its state, every later turn restored it
    assert st["stashed"] == st["restored"] == len(rows) - len(sessions)
    assert st["out_pages"] == st["in_pages"] == sp * st["stashed"] and st["dropped"] == 0
    assert m["bytes"]["gpu_to_host"] >= sp * page * st["stashed"]
    assert m["bytes"]["host_to_gpu"] >= sp * page * st["restored"]


def test_a_hybrid_replay_moves_its_states_on_the_sim(tmp_path):
    _replay(tmp_path)


def test_a_hybrid_replay_moves_its_states_on_the_hw_backend_in_cpu_mode(tmp_path):
    _replay(tmp_path, "--backend", "hw", "--device", "cpu", "--time-scale", "50")


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_a_hybrid_replay_moves_its_states_on_the_gpu(tmp_path):
    _replay(tmp_path, "--backend", "hw", "--device", "gpu")
