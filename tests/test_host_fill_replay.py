"""Progressive host fill end to end: the sim's fill timing, replays that wait on the
watermark (sim and hw in CPU mode), and a fill that fails midway.

Scenarios:
- the sim's fill commits unit k at (k + 1) x unit / rate (the profile's rate for the
  backing): a batch into slot s waits exactly until the unit holding s is in;
- a replay with ``progressive`` starts serving after the first unit, ``before_serve``
  after the whole tier; requests complete alike; ``none`` is the old model (no wait);
- a fill that fails after a few units: the replay completes with every request, the
  host tier is capped at the committed prefix, the error is reported;
- hw CPU mode: the engine serves (first tokens come) while the worker is still filling;
  a failing worker is survived the same way.
"""

from __future__ import annotations

import pytest

from kvsim.run.seam import settings_for
from kvsim.config import load_config
from kvsim.core.datapath.fill import FillLayout
from kvsim.core.spec import Level
from kvsim.config.hardware import load_profile
from kvsim.run import prepare_run, replay
from kvsim_backends.sim import SimBackend, SimRuntime

MiB = 1 << 20
FILL = "cache.tiers[1].fill={mode: %s, backing: %s}"
SMALL = ["workload.synthetic.n_sessions=8", "output.plots=false"]


def _wait(rt, w):
    """Run until ``w`` fires; (time, value)."""
    out = {}

    def proc():
        out["v"] = yield w
        out["t"] = rt.now

    rt.run(until=rt.process(proc()))
    return out["t"], out["v"]


@pytest.mark.parametrize("backing", ["register", "pinned", "cumem"])
def test_sim_fill_of_n_units_at_rate_r_takes_n_units_over_r(backing):
    prof = load_profile("gh200-c2c")  # cumem has a rate of its own there
    rate = prof.host.fill_rate_for(backing)
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(MiB, {Level.GPU: 8, Level.HOST: 64}, prof, host_fill={"mode": "progressive", "backing": backing, "unit": 8 * MiB}))
    unit = 64 * MiB if backing == "pinned" else 8 * MiB  # pinned: the range in one piece
    assert be.slots_ready(Level.GPU, [7]) is None  # only the host tier fills
    w = be.slots_ready(Level.HOST, [0, 3])  # unit 0
    assert w is not None
    t, ok = _wait(rt, w)
    assert ok is True and t == pytest.approx(unit / rate, rel=1e-12)
    assert be.slots_ready(Level.HOST, [7]) is None  # unit 0 is in: no wait
    t, ok = _wait(rt, be.slots_ready(Level.HOST, [63]) or rt.timeout(0, True))
    assert ok is True and t == pytest.approx(64 * MiB / rate, rel=1e-12)  # all 8 units
    assert be.slot_limit(Level.HOST) is None


def test_sim_waits_only_for_the_unit_holding_the_highest_slot():
    prof = load_profile("h200-pcie")
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(MiB, {Level.GPU: 8, Level.HOST: 64}, prof, host_fill={"mode": "progressive", "unit": 8 * MiB}))
    t, _ = _wait(rt, be.slots_ready(Level.HOST, [2, 17, 9]))  # slot 17: unit 2, the third
    assert t == pytest.approx(3 * 8 * MiB / prof.host.fill_rate, rel=1e-12)


def test_sim_failed_fill_keeps_the_prefix_and_says_no_beyond_it():
    prof = load_profile("h200-pcie")
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(MiB, {Level.GPU: 8, Level.HOST: 64}, prof, host_fill={"mode": "progressive", "unit": 8 * MiB}, fail_fill_at_unit=2))
    t, ok = _wait(rt, be.slots_ready(Level.HOST, [15]))
    assert ok is True
    t, ok = _wait(rt, be.slots_ready(Level.HOST, [16]))
    assert ok is False and t == pytest.approx(16 * MiB / prof.host.fill_rate, rel=1e-12)
    assert be.slot_limit(Level.HOST) == 16
    assert any("host fill stopped after 2 of 8 units (16 of 64 slots usable)" in e for e in be.errors)


def _run(mode, backing="register", backend="sim", options=None, extra=()):
    cfg = load_config("configs/default.yaml", [*SMALL, FILL % (mode, backing), *extra])
    return replay(prepare_run(cfg), backend, backend_options=options)


def test_sim_replay_serves_after_the_first_unit_or_the_whole_tier():
    prof = load_profile("h200-pcie")
    page = 5 * MiB  # the default config's pages
    host = FillLayout.of(page, (48 << 30) // page)
    none, prog, before = (_run(m).metrics for m in ("none", "progressive", "before_serve"))
    assert none["host_fill"]["serve_start_s"] == 0.0
    assert prog["host_fill"]["serve_start_s"] == pytest.approx(
        host.unit_bytes / prof.host.fill_rate, abs=1e-9)
    assert before["host_fill"]["serve_start_s"] == pytest.approx(
        host.nbytes / prof.host.fill_rate, abs=1e-9)
    assert none["requests_completed"] == prog["requests_completed"] == before["requests_completed"] > 0
    first = [m["host_fill"]["first_token_s"] for m in (none, prog, before)]
    assert first[0] < first[1] < first[2] and first[2] > before["host_fill"]["serve_start_s"]
    assert before["host_fill"]["ttft_first_mean_s"] > prog["host_fill"]["ttft_first_mean_s"]


def test_sim_pinned_backing_serves_only_when_the_whole_tier_is_in():
    prof = load_profile("h200-pcie")
    m = _run("progressive", "pinned").metrics
    assert m["host_fill"]["serve_start_s"] == pytest.approx(
        (48 << 30) // (5 * MiB) * 5 * MiB / prof.host.pinned_fill_rate, abs=1e-9)


def test_sim_replay_survives_a_fill_that_fails_after_two_units():
    more = ["workload.synthetic.n_sessions=20"]  # enough to use the host tier
    ok = _run("progressive", extra=more).metrics
    res = _run("progressive", options={"fail_fill_at_unit": 2}, extra=more)
    m = res.metrics
    limit = FillLayout.of(5 * MiB, (48 << 30) // (5 * MiB)).watermark(2)
    assert m["host_fill"]["usable_slots"] == limit
    assert m["tiers_slots"]["host"] == limit  # capped at the committed prefix
    assert m["failed_batches"] >= 1  # a batch into a slot that never came was refused
    assert m["requests_completed"] == ok["requests_completed"] and m["requests_failed"] == 0
    assert m["hit_tokens"]["host"] < ok["hit_tokens"]["host"]  # it had less host tier to use


HW_TIERS = ("cache.tiers=[{level: gpu, quota: 8MiB}, {level: host, quota: 64MiB, "
            "fill: {mode: %s, unit: %s}}, {level: disk, quota: 16MiB}]")
HW = ["workload.synthetic.n_sessions=2", "model=llama-3-8b", "cache.page_bytes=4KiB",
      "output.plots=false"]


def _hw(mode, unit="4MiB", **opts):
    cfg = load_config("default", [*HW, HW_TIERS % (mode, unit)])
    return replay(prepare_run(cfg), "hw", backend_options={"device": "cpu", "time_scale": 20.0, **opts})


def test_hw_cpu_mode_serves_before_the_fill_completes():
    # 16 units of 4 MiB, each held back 0.1 s: the fill takes >= 1.6 s of wall time,
    # 32 s of the runtime's (time scale 20); the first unit is in after ~0.1 s
    res = _hw("progressive", fill_unit_delay_s=0.1)
    m = res.metrics["host_fill"]
    assert res.metrics["requests_completed"] > 0 and res.metrics["requests_failed"] == 0
    assert m["serve_start_s"] < 16 * 0.1 * 20 / 2  # well before the fill is done
    assert m["first_token_s"] < 16 * 0.1 * 20  # a token served while the worker still fills
    assert m["usable_slots"] is None


def test_hw_cpu_mode_survives_a_failing_fill_worker():
    # units of 1 MiB (256 pages); the worker fails at the second: 256 host slots exist,
    # fewer than the replay evicts into the host tier (443 pages with it whole)
    whole = _hw("none").metrics
    res = _hw("progressive", unit="1MiB", fail_fill_at_unit=1)
    m = res.metrics
    assert whole["evicted_pages"]["gpu"] > 256
    assert m["requests_completed"] == whole["requests_completed"] > 0 and m["requests_failed"] == 0
    assert m["host_fill"]["usable_slots"] == 256 and m["tiers_slots"]["host"] == 256
    assert m["failed_batches"] >= 1  # a batch into a slot that never came was refused


def test_hw_fill_that_fails_before_its_first_unit_refuses_the_backend():
    with pytest.raises(RuntimeError, match="host tier: host fill stopped after 0 of 16 units"):
        _hw("progressive", fail_fill_at_unit=0)


from gpuskip import have_gpu as _have_gpu  # noqa: E402


@pytest.mark.gpu
@pytest.mark.skipif(not _have_gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("backing", ["register", "pinned", "cumem"])
def test_gpu_replay_on_a_filling_host_tier(backing):
    cfg = load_config("default", [*HW, HW_TIERS % ("progressive", "4MiB"),
                                  f"cache.tiers[1].fill.backing={backing}"])
    opts = {"device": "gpu", "time_scale": 20.0, "fill_unit_delay_s": 0.05}
    m = replay(prepare_run(cfg), "hw", backend_options=opts).metrics
    assert m["requests_completed"] > 0 and m["requests_failed"] == 0
