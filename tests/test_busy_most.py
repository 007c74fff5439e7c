"""The most GPU -> host SM copy CTAs move together beside a kind of work
(``sm.interference.gemm`` / ``memory``'s ``busy_rate_d2h``): beside an H200's GEMMs 4 of
them (16 KiB pages) moved 0.88 of their idle rate each and 8 of them 0.54, 27-34 GB/s in
all (2026-12-04). CTAs of idle rate ``r`` in all then move ``min(r x share, most)``: in
the sim's fluid (the CTAs in flight together) and in the copy-path rule alike."""

from __future__ import annotations

import pytest
import simpy

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.datapath.interference import busy_share, kind_share
from kvsim.core.datapath.pathcost import path_chooser
from kvsim.core.datapath.work import StepWork
from kvsim_backends.sim.fluid import Fluid

GB = 1e9
GEMMS = StepWork(0.004, 1.0, 0.0, 1.0, 0.0, 4096, 0, 0.003, 0.001)  # 3 ms GEMMs, 1 ms reads
KINDS = ((0.4, 0.88), (0.8, 0.6))  # (GEMMs', reads'), each (host -> GPU, GPU -> host)


def test_a_kinds_share_is_capped_by_its_most_over_the_ctas_idle_rate():
    most = (4.3 * GB, None)
    assert kind_share(KINDS, 1.0, most, 4 * GB) == (0.4, 0.88)  # 4 x 0.88 = 3.52 < 4.3
    assert kind_share(KINDS, 1.0, most, 8 * GB) == (0.4, 4.3 / 8)
    assert kind_share(KINDS, 1.0, most, 0.0) == (0.4, 0.88)  # (none in flight)
    assert kind_share(KINDS, 0.0, most, 8 * GB) == (0.8, 0.6)  # (the reads set none)
    assert kind_share(KINDS, 0.0, (None, 2.4 * GB), 8 * GB) == (0.8, 0.3)
    # 3 of 4 ms GEMMs: 0.6 + 0.75 x (4.3 / 8 - 0.6)
    got = busy_share((1.0, 1.0), KINDS, GEMMS, most, 8 * GB)[1]
    assert got == pytest.approx(0.6 + 0.75 * (4.3 / 8 - 0.6))
    assert kind_share(KINDS, 1.0, None, 8 * GB) == kind_share(KINDS, 1.0)


def _profile(most: float | str | None, share: float = 0.88) -> HardwareProfile:
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["sm"]["interference"]["gemm"].update(busy_cta_efficiency_d2h=share, busy_rate_d2h=most)
    return HardwareProfile.model_validate(d)


def test_the_profile_gives_the_kinds_most():
    assert _profile(None).sm.interference.kind_most() is None
    assert _profile("30GB/s").sm.interference.kind_most() == (30 * GB, None)
    with pytest.raises(ValueError):
        _profile(0.0)


def _rates(ctas: list[int], most=(4.3 * GB, None)) -> list[float]:
    """The rates of GPU -> host SM-kernel flows of ``ctas`` CTAs (1 GB/s each) beside GEMMs."""
    env = simpy.Environment()
    f = Fluid(env, {"sm_d2h": 100 * GB}, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
              busy_cta_efficiency=0.3, busy_kinds=KINDS, busy_most=most)
    f.add_job(1.0, StepWork(1.0, 1.0, 0.0, 1.0, 0.0, 4096, 0, 1.0, 0.0))  # GEMMs only
    for n in ctas:
        f.add_flow(1e12, ("sm_d2h",), cap=n * GB, ctas=n)
    env.run(until=0.5)
    return [fl.rate for fl in f.flows]


def test_the_sims_ctas_in_flight_move_at_most_that_together():
    assert _rates([4]) == pytest.approx([4 * GB * 0.88])
    assert _rates([8]) == pytest.approx([4.3 * GB])
    assert _rates([4, 4]) == pytest.approx([4.3 / 2 * GB] * 2)  # (the 8 in flight together)
    assert _rates([8], None) == pytest.approx([8 * GB * 0.88])


def test_the_rule_prices_a_batch_at_the_share_at_its_ctas():
    """A GPU -> host SM-kernel batch under GEMMs costs what it costs on a profile without
    the limit whose share is the limited one at the batch's CTAs."""
    from kvsim.run.seam import settings_for
    from kvsim.core.spec import Level
    from kvsim_backends.sim.backend import mix_table

    model = settings_for(1 << 20, {Level.GPU: 1}, model="llama-3-8b").model
    page = 64 << 10
    idle = {"h2d": CopyPath.SM_KERNEL, "d2h": CopyPath.COPY_ENGINE}
    capped = _profile(20 * GB)
    rule = path_chooser(capped, page, {}, idle, None, mix_table(capped, model, page))
    idle_rate = rule.ctas("d2h", CopyPath.SM_KERNEL, None) * capped.sm.cta_rate("d2h", page)
    assert idle_rate * 0.88 > 20 * GB
    plain = _profile(None, 20 * GB / idle_rate)
    other = path_chooser(plain, page, {}, idle, None, mix_table(plain, model, page))
    zero = lambda load: 0.0  # noqa: E731
    busy = {"h2d": 0.37, "d2h": 0.88, "gemm_share": 1.0}
    got = rule.cost("d2h", 1024, CopyPath.SM_KERNEL, None, zero, busy)
    want = other.cost("d2h", 1024, CopyPath.SM_KERNEL, None, zero, {"h2d": 0.37, "d2h": 20 * GB / idle_rate})
    assert got == pytest.approx(want, rel=1e-12)
    assert got > rule.cost("d2h", 1024, CopyPath.SM_KERNEL, None, zero,
                           {"h2d": 0.37, "d2h": 0.88})  # (without the limit: faster)
