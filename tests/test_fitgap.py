"""The hw loop's gap between steps and a step's overrun (``kvsim.tools.hwloop.StepCost``):
charged by the sim side of ``kvsim compare`` (``HwLoopSim``) and fitted from hw compute
logs (``kvsim.tools.fitgap``)."""

from __future__ import annotations

import pytest

from kvsim.config.hardware import ProfileError
from kvsim.core.datapath.work import StepWork, gemm_share
from kvsim.core.spec import Level
from kvsim.tools import fitgap
from kvsim.tools.hwloop import HwLoopModel, StepCost, load_hw_loop
from test_hwloop import make
from test_sim_backend import batch, finish

# a step of 1 ms of reads and 0.25 ms of GEMMs (the roofline's two times: share 0.2)
WORK = StepWork(1.25e-3, 1.0, 0.0, 1.0, 0.0, 0, 8, 0.25e-3, 1.0e-3)


def test_a_step_starts_after_the_loops_gap_on_top_of_a_hold():
    """step.gap: every compute starts that much later, a held one after its hold and the
    gap both; the engine cannot run ahead of it."""
    rt, be, loop = make(resume="1ms", step={"gap": "80us"})
    assert be.compute_ahead(0.0, 1e-3, True) is None  # (the gap goes through compute())
    t0 = rt.now
    t, took = finish(rt, be.compute(1e-3))
    assert took == pytest.approx(1e-3, rel=1e-12)  # the gap is idle time, not the step's
    assert t - t0 == pytest.approx(80e-6 + 1e-3, rel=1e-12)
    loop.resumed(10)
    t0 = rt.now
    t, _ = finish(rt, be.compute(1e-3))
    assert t - t0 == pytest.approx(1e-3 + 80e-6 + 1e-3, rel=1e-12)


def test_a_steps_overrun_is_in_its_time_and_grows_with_its_reads_past_the_knee():
    """step.overrun_rate x (read seconds - overrun_after): in the step's time (the compute
    log's too, as hw's two events hold it); the read seconds are the nominal seconds not
    in GEMMs; a step with fewer reads than the knee runs as nominal."""
    rt, be, _ = make(step={"overrun_rate": 0.02, "overrun_after": "0.5ms"})
    be.inner.compute_log = log = []
    t0 = rt.now
    t, took = finish(rt, be.compute(5e-3))  # no work: all of it reads
    want = 5e-3 + 0.02 * (5e-3 - 0.5e-3)
    assert took == pytest.approx(want, rel=1e-12) and t - t0 == pytest.approx(want, rel=1e-12)
    assert log[-1][2] == pytest.approx(want, rel=1e-12)
    reads = WORK.seconds * (1.0 - gemm_share(WORK))
    assert reads == pytest.approx(1e-3)
    _, took = finish(rt, be.compute(WORK.seconds, WORK))
    assert took == pytest.approx(WORK.seconds + 0.02 * (1e-3 - 0.5e-3), rel=1e-9)
    _, took = finish(rt, be.compute(0.4e-3))  # under the knee
    assert took == pytest.approx(0.4e-3, rel=1e-12)


def test_a_copy_beside_the_overrun_is_not_slowed_by_it():
    """The overrun is time the stream waits, not SM work: a copy on the SM kernel that
    starts once the step's work is done, during its overrun, runs as it does alone."""
    rt, be, _ = make(step={"overrun_rate": 1.0, "overrun_after": "0s"}, copy_path="sm_kernel")
    alone_rt, alone, _ = make(copy_path="sm_kernel")
    alone_end, ok = finish(alone_rt, alone.transfer(batch(Level.HOST, Level.GPU, 4)))
    assert ok
    comp = be.compute(1e-3)  # 1 ms of work, then a 1 ms overrun
    ends = []
    comp.callbacks.append(lambda e: ends.append(rt.now))
    rt.run(until=1.1e-3)
    t0 = rt.now
    t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 4)))
    assert ok and t < 2e-3 and ends == [pytest.approx(2e-3, rel=1e-9)]  # (inside the overrun)
    assert t - t0 == pytest.approx(alone_end, rel=1e-9)


def test_no_step_terms_charge_nothing_and_the_shipped_model_has_them(tmp_path):
    assert HwLoopModel().step == StepCost() and StepCost().overrun_s(1.0) == 0.0
    rt, be, _ = make()
    assert be.compute_ahead(0.0, 1e-3, True) == pytest.approx(1e-3)  # runs ahead as before
    assert be.inner.step_tail is None
    m = load_hw_loop("h200").step
    assert m.gap > 0 and m.overrun_rate > 0 and m.overrun_after > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("step: {gap: -1us, overrun_rate: -0.1}\n")
    with pytest.raises(ProfileError) as e:
        load_hw_loop(bad)
    assert f"{bad}: step.gap" in str(e.value) and f"{bad}: step.overrun_rate" in str(e.value)


def _log(gaps, reads, overs, gemm_share_=0.02):
    """Steps (GPU start, nominal, took, nominal GEMM s) one after another with ``gaps``."""
    steps, end = [(0.0, 1e-3, 1e-3, 0.0)], 1e-3
    for gap, read, over in zip(gaps, reads, overs):
        nominal = read / (1.0 - gemm_share_)
        start = end + gap
        steps.append((start, nominal, nominal + over, nominal * gemm_share_))
        end = start + nominal + over
    return steps


def test_the_fit_recovers_a_gap_and_an_overrun_line_from_ordinary_steps():
    """Ordinary steps overrun by -40 us + 1% of their reads (knee 4 ms) after gaps of 50
    and 90 us: the fit gives the mean gap, the rate and the knee; a held check's step
    (3 ms long), one after a 2 ms hold and a GEMM-bound step are left out."""
    reads = [5e-3, 6e-3, 7e-3, 8e-3, 9e-3, 10e-3]
    gaps = [50e-6, 90e-6] * 3
    steps = _log(gaps, reads, [-40e-6 + 0.01 * r for r in reads])
    end = steps[-1][0] + steps[-1][2]
    steps += [(end + 60e-6, 7e-3, 10e-3, 1e-4),                 # a held check's step
              (end + 60e-6 + 10e-3 + 2e-3, 7e-3, 7.5e-3, 1e-4),  # after a 2 ms hold
              (end + 60e-6 + 17.5e-3 + 2e-3 + 70e-6, 20e-3, 20.5e-3, 15e-3)]  # GEMM-bound
    rows = fitgap.ordinary(steps)
    assert len(rows) == 6
    t = fitgap.fit([rows])
    assert t["gap"] == pytest.approx(70e-6, rel=1e-9)
    assert t["overrun_rate"] == pytest.approx(0.01, rel=1e-9)
    assert t["overrun_after"] == pytest.approx(4e-3, rel=1e-9)
    assert fitgap.overrun(rows, t) == pytest.approx(sum(r[2] for r in rows), rel=1e-9)
    bins = {(lo, hi): k for lo, hi, k, _, _ in fitgap.by_gap(rows)}
    assert bins == {(0.0, 60e-6): 3, (80e-6, 100e-6): 3}


def test_an_overrun_that_does_not_grow_with_reads_is_no_overrun():
    steps = _log([60e-6] * 4, [5e-3, 6e-3, 7e-3, 8e-3], [30e-6, 20e-6, 10e-6, 0.0])
    t = fitgap.fit([fitgap.ordinary(steps)])
    assert t["overrun_rate"] == 0.0 and t["overrun_after"] == 0.0
    assert t["gap"] == pytest.approx(60e-6, rel=1e-9)
    with pytest.raises(ValueError):
        fitgap.fit([[]])
