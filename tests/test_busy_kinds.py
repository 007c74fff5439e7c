"""A copy CTA's share of its idle rate under compute by the kind of the step's work
(``sm.interference.gemm`` / ``memory``'s ``busy_cta_efficiency`` / ``_d2h``): under a
prefill's GEMMs 8 GPU -> host CTAs moved 0.37-0.49 of their idle rate on an H200, beside
reads 1-4 of them 0.85. A step's share is the kinds' weighted by its time in each; the
sim's fluid and the copy-path rule both take it, and a profile without kind shares keeps
the one share for every compute."""

from __future__ import annotations

import pytest
import simpy

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.datapath.interference import busy_share, least_share
from kvsim.core.datapath.pathcost import path_chooser
from kvsim.core.datapath.work import StepWork
from kvsim_backends.sim.fluid import Fluid

GB = 1e9
GEMMS = StepWork(0.004, 1.0, 0.0, 1.0, 0.0, 4096, 0, 0.003, 0.001)  # 3 ms GEMMs, 1 ms reads
READS = StepWork(0.004, 1.0, 0.0, 1.0, 0.0, 0, 4, 0.0, 0.004)
KINDS = ((0.4, 0.5), (0.8, 0.9))  # (GEMMs', reads'), each (host -> GPU, GPU -> host)


def test_a_steps_share_is_its_kinds_by_its_time_in_each():
    # 3 of 4 ms GEMMs: 0.8 + 0.75 x (0.4 - 0.8) = 0.5 to the GPU, 0.9 + 0.75 x (0.5 - 0.9) = 0.6
    assert busy_share((1.0, 1.0), KINDS, GEMMS) == pytest.approx((0.5, 0.6), rel=1e-12)
    assert busy_share((1.0, 1.0), KINDS, READS) == (0.8, 0.9)
    assert busy_share((0.3, 0.2), KINDS, None) == (0.3, 0.2)  # (the SMs alone)
    assert busy_share((0.3, 0.2), None, GEMMS) == (0.3, 0.2)  # (no kind shares)
    assert least_share([(0.5, 0.6), (0.8, 0.3)]) == (0.5, 0.3)


def _profile(gemm: dict | None, memory: dict | None = None) -> HardwareProfile:
    d = load_profile("h200-pcie-calibrated").model_dump()
    i = d["sm"]["interference"]
    i.update(busy_cta_efficiency=0.45, busy_cta_efficiency_d2h=0.85)
    for kind, keys in (("gemm", gemm), ("memory", memory)):
        i[kind] = {**i[kind], "busy_cta_efficiency": None, "busy_cta_efficiency_d2h": None,
                   "busy_rate_d2h": None, **(keys or {})}
    return HardwareProfile.model_validate(d)


def test_the_profile_gives_kind_shares_falling_back_to_its_own():
    assert _profile(None).sm.interference.kind_busy() is None
    assert _profile({"busy_cta_efficiency_d2h": 0.5}).sm.interference.kind_busy() == ((0.45, 0.5), (0.45, 0.85))
    assert _profile(None, {"busy_cta_efficiency": 0.7}).sm.interference.kind_busy() == ((0.45, 0.85), (0.7, 0.85))


def _rate_beside(works: list[StepWork | None], kinds=KINDS) -> float:
    """The rate of 4 GPU -> host CTAs (1 GB/s each, no other limit) while ``works`` run."""
    env = simpy.Environment()
    f = Fluid(env, {"d2h": 100 * GB}, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
              busy_cta_efficiency=0.3, busy_cta_efficiency_d2h=0.2, busy_kinds=kinds)
    for w in works:
        f.add_job(1.0, w)
    f.add_flow(1e12, ("d2h",), cap=4 * GB, ctas=4)
    env.run(until=0.5)
    return f.flows[0].rate


def test_the_sims_copy_ctas_move_at_the_share_of_what_runs():
    assert _rate_beside([]) == pytest.approx(4 * GB)
    assert _rate_beside([GEMMS]) == pytest.approx(4 * GB * 0.6)
    assert _rate_beside([READS]) == pytest.approx(4 * GB * 0.9)
    assert _rate_beside([None]) == pytest.approx(4 * GB * 0.2)  # (a compute of the SMs alone)
    assert _rate_beside([READS, GEMMS]) == pytest.approx(4 * GB * 0.6)  # (the least of two)
    assert _rate_beside([GEMMS], None) == pytest.approx(4 * GB * 0.2)  # (one share for all)


def test_the_share_follows_the_jobs_as_they_come_and_go():
    """Reads from 0 to 1.5 s, GEMMs from 0.2 to 0.4 s: 4 CTAs at 1 GB/s move 0.9 x 4 GB/s,
    then 0.6 x while the GEMMs run, then 0.9 x again, then all of it once the reads end:
    1.2 GB by 0.4 s, 1.2 + 1.1 x 3.6 by 1.5 s, 6 GB 1.2 / 4 s later."""
    env = simpy.Environment()
    f = Fluid(env, {"d2h": 100 * GB}, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
              busy_cta_efficiency=0.3, busy_kinds=KINDS)
    f.add_job(1.5, READS)
    done = f.add_flow(6e9, ("d2h",), cap=4 * GB, ctas=4)

    def gemms():
        yield env.timeout(0.2)
        yield f.add_job(0.2, StepWork(0.2, 1.0, 0.0, 1.0, 0.0, 4096, 0, 0.15, 0.05))
    env.process(gemms())
    env.run(until=done)
    assert env.now == pytest.approx(1.5 + (6 - 1.2 - 1.1 * 3.6) / 4, rel=1e-9)


def test_the_rule_prices_a_step_at_its_kinds_share():
    """Under a prefill, the rule with kind shares decides and prices as it does on a profile
    whose one share is the step's (a second, plain form of the same weighting); with the
    reads' share for every step (no kind shares) it decides otherwise somewhere."""
    from kvsim.run.seam import settings_for
    from kvsim.core.spec import Level
    from kvsim_backends.sim.backend import mix_table

    model = settings_for(1 << 20, {Level.GPU: 1}, model="llama-3-8b").model
    p = _profile({"busy_cta_efficiency": 0.37, "busy_cta_efficiency_d2h": 0.3})
    w = busy_share(p.sm.interference.busy_eff(), p.sm.interference.kind_busy(), GEMMS)
    d = _profile(None).model_dump()
    d["sm"]["interference"].update(busy_cta_efficiency=w[0], busy_cta_efficiency_d2h=w[1])
    plain, none = HardwareProfile.model_validate(d), _profile(None)
    idle = {"h2d": CopyPath.SM_KERNEL, "d2h": CopyPath.COPY_ENGINE}
    differs = 0
    for page in (16 << 10, 64 << 10, 256 << 10, 1 << 20):
        a, b, c = (path_chooser(q, page, {}, idle, None, mix_table(q, model, page)) for q in (p, plain, none))
        for dr in ("h2d", "d2h"):
            for n in (4, 64, 1024):
                for other in (None, CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL):
                    got = a.pick(dr, n, other, True, GEMMS)
                    assert got == b.pick(dr, n, other, True, GEMMS)
                    differs += got != c.pick(dr, n, other, True, GEMMS)
    assert differs


def test_a_node_bus_gives_each_member_its_steps_share():
    """A fluid on its node's bus (host DRAM shared by the node's GPUs) takes its rates from
    the bus: 4 GPU -> host CTAs at the GEMMs' share while a prefill runs, then the reads'
    while a decode runs, the same flows both times (the bus's remembered rates are by the
    share, not by whether compute runs)."""
    from kvsim_backends.sim.nodebus import NodeBus

    env = simpy.Environment()
    bus = NodeBus({"dram": 1000 * GB})
    f = Fluid(env, {"d2h": 100 * GB}, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
              busy_cta_efficiency=0.3, busy_kinds=KINDS)
    bus.join(f)
    f.add_flow(1e12, ("d2h", "dram"), cap=4 * GB, ctas=4)
    got = []

    def steps():
        yield f.add_job(0.1, GEMMS)
        yield env.timeout(0.1)
        yield f.add_job(0.1, READS)
        yield env.timeout(0.1)

    def probe():
        for at in (0.05, 0.15, 0.25, 0.35):
            yield env.timeout(at - env.now)
            got.append(f.flows[0].rate)
    env.process(steps())
    env.process(probe())
    env.run(until=0.4)
    assert got == pytest.approx([4 * GB * 0.6, 4 * GB, 4 * GB * 0.9, 4 * GB])
