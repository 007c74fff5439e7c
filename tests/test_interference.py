"""The structural interference model (kvsim.core.datapath.interference) by hand, and the
sim's compute under it: a GEMM step loses the SMs copy CTAs take and waits for its
stragglers, an HBM-bound step loses SM slots and HBM bytes (written bytes by their own
weight), a mixed step runs its GEMMs then its reads, each at its kind's stretch, copy-engine
calls issuing host-bound pages cost their term, a compute of the SMs alone keeps the older
per-CTA terms; compute_ahead still predicts compute() exactly."""

from __future__ import annotations


import pytest

from conftest import round_profile
from kvsim.config.hardware import load_profile
from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.datapath.interference import (IDLE, CopyLoad, KindTerms, MixTable, Structure,
                                              gemm_loss, hbm_exposure, issue_share,
                                              last_wave_share, legacy_stretch)
from kvsim.core.datapath.work import StepWork
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
from kvsim.run.seam import settings_for
from kvsim.settings import ModelSettings
from kvsim_backends.sim import SimBackend, SimRuntime

import dataclasses
import numpy as np

KiB = 1 << 10


def test_a_gemm_loses_the_sms_taken_and_waits_for_its_stragglers():
    # 40 copy CTAs take 40 of 132 SMs: 23 waves on the 92 left; the 22 that queue spread over them
    assert gemm_loss([(2048, 1.0)], 132, 40.0) == pytest.approx((132 / 92 - 1) * 22 / 23)
    # a tile beside a copy CTA runs 1.5x slower: the wave that does not queue waits for it
    assert gemm_loss([(2048, 1.0)], 132, 40.0, 0.5, 40) == pytest.approx(
        ((132 / 92 - 1) * 22 + 0.5) / 23)
    # a GEMM of one wave (a small M: 100 tiles on the 112 SMs 40 CTAs of half an SM each
    # leave) whose tiles need some of the SMs with a copy CTA (92 without) waits for all of
    # it, and loses nothing to the SMs taken (each tile has an SM)
    assert gemm_loss([(100, 1.0)], 132, 0.0, 0.5, 40) == pytest.approx(0.5)
    assert gemm_loss([(100, 1.0)], 132, 20.0, 0.5, 40) == pytest.approx(0.5)
    assert gemm_loss([(100, 1.0)], 132, 20.0, 0.0, 40) == 0.0
    # 48 tiles fit on the 92 SMs without a copy CTA: no tile beside one, no straggle
    assert gemm_loss([(48, 1.0)], 132, 20.0, 0.5, 40) == 0.0
    assert gemm_loss([(48, 1.0)], 132, 20.0, 0.5, 84) == 0.0   # (48 SMs free: just fits)
    assert gemm_loss([(48, 1.0)], 132, 20.0, 0.5, 85) == pytest.approx(0.5)
    # two GEMMs: weighted by their FLOPs (3:1); the long one 19 waves on the 112 left
    assert gemm_loss([(2048, 3.0), (100, 1.0)], 132, 20.0, 0.5, 40) == pytest.approx(
        (3 * ((132 / 112 - 1) * 18 + 0.5) / 19 + 0.5) / 4)
    assert gemm_loss([(2048, 1.0)], 132, 0.0) == 0.0


def test_copy_ctas_pack_onto_the_sms_a_one_wave_gemm_leaves_free():
    # 10 copy CTAs an SM: 36 of them hold 4 SMs, so a GEMM of 128 tiles (one wave) fits on
    # the 128 left and loses nothing; the 41st takes a fifth SM and a tile waits beside it
    assert gemm_loss([(128, 1.0)], 132, 0.0, 0.5, 36, 10) == 0.0
    assert gemm_loss([(128, 1.0)], 132, 0.0, 0.5, 40, 10) == 0.0
    assert gemm_loss([(128, 1.0)], 132, 0.0, 0.5, 41, 10) == pytest.approx(0.5)
    # one CTA an SM (the default): 5 CTAs already leave too few
    assert gemm_loss([(128, 1.0)], 132, 0.0, 0.5, 5) == pytest.approx(0.5)
    # a GEMM of many waves keeps its straggle however the copy CTAs pack
    assert gemm_loss([(2048, 1.0)], 132, 0.0, 0.5, 1, 10) == pytest.approx(0.5 / 16)


def test_a_profile_packs_copy_ctas_as_it_says_and_at_least_one_an_sm():
    p = load_profile("h200-pcie-calibrated")
    assert p.interference_structure().copy_ctas_per_sm == p.sm.interference.copy_ctas_per_sm == 10
    assert load_profile("h200-pcie").interference_structure().copy_ctas_per_sm == 1
    with pytest.raises(ValueError, match="copy_ctas_per_sm"):
        p.sm.interference.model_validate({**p.sm.interference.model_dump(), "copy_ctas_per_sm": 0})


def test_the_issue_share_is_the_host_time_beyond_the_bytes():
    # 16 KiB at 53.9 GB/s: 0.30 us of bytes against 5.18 us of the driver's a page
    assert issue_share(5.178e-6, 16384, 53.89e9) == pytest.approx(1 - 16384 / 53.89e9 / 5.178e-6)
    assert issue_share(0.36e-6, 65536, 53.89e9) == 0.0  # the link the slower: none
    assert issue_share(0.0, 16384, 53.89e9) == 0.0


S = Structure(sms=132, hbm_Bps=4e12, tile=(128, 256),
              gemm=KindTerms(cta_sm_share_h2d=0.25, cta_sm_share_d2h=1.0,
                             copy_engine_slowdown=0.02, hbm_weight=0.5),
              memory=KindTerms(cta_sm_share_h2d=0.0625, cta_sm_share_d2h=0.0625,
                               copy_engine_slowdown=0.01, hbm_weight=1.0))


def test_each_kind_by_its_structure():
    """36 copy CTAs host -> GPU and 14 back moving 60 GB/s through HBM, by hand."""
    load = CopyLoad(ctas_h2d=36, ctas_d2h=14, copy_engine=False, hbm_Bps=60e9)
    lost_g = 0.25 * 36 + 1.0 * 14                               # 23 SMs
    hbm_g = 0.5 * 60e9 / 4e12
    # 2048 tiles: 19 waves on the 109 SMs left, 18 of them queueing (no straggle)
    gemm = (132 / (132 - lost_g) - 1) * 18 / 19 + hbm_g / (1 - hbm_g)
    assert S.gemm_stretch([(2048, 1.0)], load) == pytest.approx(gemm)
    lost_m = 0.0625 * 50                                        # 3.125 SMs of slots
    hbm_m = 60e9 / 4e12
    memory = 132 / (132 - lost_m) - 1 + hbm_m / (1 - hbm_m)
    assert S.memory_stretch(load) == pytest.approx(memory)
    # a step of share 0.3 under the load over all of it: its parts by their shares
    assert S.stretch(0.3, [(2048, 1.0)], load) == pytest.approx(0.3 * gemm + 0.7 * memory)
    # the copy engine alone: its constant and the HBM its bytes take
    ce = CopyLoad(copy_engine=True, hbm_Bps=50e9)
    assert S.stretch(1.0, [(2048, 1.0)], ce) == pytest.approx(0.02 + 0.00625 / (1 - 0.00625))
    assert S.stretch(0.0, [], ce) == pytest.approx(0.01 + 0.0125 / (1 - 0.0125))
    # nothing in flight: exactly nothing, whatever the work
    assert S.stretch(0.5, [(2048, 1.0)], IDLE) == 0.0 and IDLE.idle


def test_a_mix_table_takes_the_gemms_of_the_steps_rows():
    """Llama-3-8B-like projections at a step of 3000 tokens: M = 2048; the GEMMs' tiles
    and FLOP weights are the table's."""
    t = MixTable(S, ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)), 128, 8192)
    w = StepWork(0.1, 1.0, 0.0, 0.0, 0.0, 3000, 0, 0.1, 0.0)
    g = t.gemms_for(w)
    assert [tiles for tiles, _ in g] == [16 * 24, 16 * 16, 16 * 112, 16 * 16]
    assert [wt for _, wt in g] == [2048 * 4096 * 6144, 2048 * 4096 * 4096, 2048 * 4096 * 28672,
                                   2048 * 14336 * 4096]
    load = CopyLoad(ctas_h2d=36)
    assert t.stretch(w, load) == pytest.approx(S.stretch(1.0, g, load))
    assert t.stretch(w, IDLE) == 0.0


def test_the_older_model_is_the_same_float():
    assert legacy_stretch(0.17 / 32, 0.05, CopyLoad(36, 0, True)) == 0.17 / 32 * 36 + 0.05


# -- the sim's compute under the kinds -------------------------------------------------

KINDS = {"gemm": {"cta_sm_share_h2d": 1.0, "cta_sm_share_d2h": 1.0, "copy_engine_slowdown": 0.0,
                  "hbm_weight": 0.0},
         "memory": {"cta_sm_share_h2d": 0.25, "cta_sm_share_d2h": 0.25,
                    "copy_engine_slowdown": 0.05, "hbm_weight": 1.0}}


def _profile(kinds=True):
    p = round_profile()
    d = p.model_dump()
    if kinds:
        d["sm"]["interference"].update(KINDS)
    return type(p).model_validate(d)


def _backend(kinds=True, path=CopyPath.SM_KERNEL):
    rt = SimRuntime()
    st = settings_for(256 * KiB, {Level.GPU: 2048, Level.HOST: 2048}, _profile(kinds),
                      copy_path=path.value, sm_ctas=4)
    # one GEMM a layer, 256 x 1024: at 512 tokens 4 x 4 = 16 tiles, 2 waves on 8 SMs
    st = dataclasses.replace(st, model=ModelSettings(((256, 1024),)))
    return rt, SimBackend(rt, st)


def _h2d(n):
    idx = np.arange(n)
    return Batch(BatchKind.ONBOARD, Level.HOST, Level.GPU, idx, idx, np.zeros(n, np.uint64), 256 * KiB, 0)


def _took(be, rt, work, at=0.001, path_batch=True):
    """A long host -> GPU batch from 0, a compute of 1 ms of ``work`` at ``at``: its GPU time."""
    if path_batch:
        be.transfer(_h2d(1000))  # 262 MB: far longer than the compute
    out = {}

    def proc():
        yield rt.timeout(at)
        out["took"] = yield be.compute(0.001, work)
    rt.process(proc())
    rt.run()
    return out["took"]


GEMM = StepWork(0.001, 1.0, 0.0, 0.0, 0.0, 512, 0, 0.001, 0.0)     # all GEMMs, M = 512
READS = StepWork(0.001, 0.0, 0.0, 1.0, 0.0, 0, 4, 0.0, 0.001)      # all reads
MIXED = StepWork(0.001, 1.0, 0.0, 1.0, 0.0, 512, 0, 0.0005, 0.0005)  # half and half


# the GEMM's share of its time its bytes take (``hbm_exposure``): 256 x 1024 at M = 512,
# 2 bytes an element over the 2 TB/s the reads read at, against its FLOPs at the round
# profile's compute rate (100 TFLOP/s x 0.5: it has no gpu.gemm_flops)
EXPOSED = (2 * (256 * 1024 + 512 * 256 + 512 * 1024) / 2e12) / (2 * 512 * 256 * 1024 / 50e12)


def test_a_gemm_step_loses_the_sms_the_copy_kernels_ctas_take():
    """4 copy CTAs hold 4 of the 8 SMs: the GEMM's 16 tiles run 4 waves on the other 4,
    the 3 that queue at half the rate, the last (no straggle here) unslowed; the share of
    its time its bytes take loses what the reads lose to the copy's 20 GB/s (4 CTAs x 10
    GB/s, halved under compute) of HBM."""
    rt, be = _backend()
    x = 20e9 / 2e12
    s = 1.0 * 3 / 4 + EXPOSED * x / (1 - x)
    assert _took(be, rt, GEMM) == pytest.approx(0.001 * (1 + s), rel=1e-12)


def test_a_read_step_loses_sm_slots_and_hbm_bytes():
    """The reads lose 0.25 x 4 = 1 of 8 SMs' slots, and the copy's 20 GB/s (4 CTAs x 10
    GB/s, halved under compute) of the 2 TB/s they read at."""
    rt, be = _backend()
    x = 20e9 / 2e12
    s = 8 / 7 - 1 + x / (1 - x)
    assert _took(be, rt, READS) == pytest.approx(0.001 * (1 + s), rel=1e-12)


def test_a_mixed_step_under_a_load_over_all_of_it_is_stretched_by_both_in_proportion():
    rt, be = _backend()
    x = 20e9 / 2e12
    s = 0.5 * (0.75 + EXPOSED * x / (1 - x)) + 0.5 * (8 / 7 - 1 + x / (1 - x))
    assert _took(be, rt, MIXED) == pytest.approx(0.001 * (1 + s), rel=1e-12)


def test_a_compute_of_the_sms_alone_keeps_the_older_terms():
    """No StepWork: 0.2 per 4 CTAs (round profile), the same with or without the kinds."""
    for kinds in (True, False):
        rt, be = _backend(kinds)
        assert _took(be, rt, None) == pytest.approx(0.001 * 1.2, rel=1e-12)


def test_without_the_kinds_every_step_keeps_the_older_terms():
    rt, be = _backend(kinds=False)
    assert _took(be, rt, GEMM) == pytest.approx(0.001 * 1.2, rel=1e-12)


def test_a_step_computes_unstretched_with_nothing_in_flight():
    rt, be = _backend()
    assert _took(be, rt, GEMM, path_batch=False) == 0.001


def test_compute_ahead_predicts_a_read_step_beside_a_copy_engine_flow():
    """A copy-engine flow (50 GB/s) beside a read step: 0.05 + the HBM it takes; the
    prediction at the compute's start is the very float compute() ends at."""
    rt, be = _backend(path=CopyPath.COPY_ENGINE)
    be.transfer(_h2d(1000))  # host time 10 us + 1000 x 2 us, then ~5 ms of bytes
    out = {}

    def proc():
        yield rt.timeout(0.0025)
        out["ahead"] = be.compute_ahead(rt.now, 0.001, False, READS)
        yield be.compute(0.001, READS)
        out["end"] = rt.now
    rt.process(proc())
    rt.run()
    x = 50e9 / 2e12
    assert out["ahead"] == out["end"]
    assert out["end"] == pytest.approx(0.0025 + 0.001 * (1 + 0.05 + x / (1 - x)), rel=1e-12)


def test_a_profile_gives_both_kinds_or_neither():
    from kvsim.config.hardware import HardwareProfile

    d = round_profile().model_dump()
    d["sm"]["interference"]["gemm"] = KINDS["gemm"]
    with pytest.raises(ValueError, match="gemm and memory"):
        HardwareProfile.model_validate(d)
    assert round_profile().interference_structure() is None
    s = _profile().interference_structure()
    assert (s.sms, s.hbm_Bps, s.tile) == (8, 4e12 * 0.5, (128, 256))


def test_the_mix_tables_kept_parts_give_the_structures_floats():
    """The table keeps each kind's stretch for the last load: the same floats as the
    structure computed afresh, across loads and steps of every share and M."""
    t = MixTable(S, ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)), 128, 8192)
    loads = [CopyLoad(36, 14, False, 6e10), CopyLoad(0, 0, True, 5e10), CopyLoad(36, 0, False, 5e10)]
    for load in loads + loads[::-1]:
        for tokens, fs, ms in ((4096, 0.1, 0.004), (8, 1e-4, 0.02), (256, 0.005, 0.008), (3000, 0.0, 0.0)):
            w = StepWork(0.1, 1.0, 0.0, 0.0, 0.0, tokens, 0, fs, ms)
            from kvsim.core.datapath.work import gemm_share
            want = S.stretch(gemm_share(w), t.gemms_for(w), load)
            assert t.stretch(w, load).hex() == want.hex()


def test_a_gemms_exposure_is_the_share_of_its_time_its_bytes_take():
    """By hand: M = 256 against K x N = 4096 x 4096 at 500 TFLOP/s (the rate of the
    largest M <= 256 in the table) beside 4 TB/s; a GEMM whose bytes outlast its FLOPs
    counts 1; FLOP-weighted; none without rates."""
    s = dataclasses.replace(S, gemm_rates=((128, 2e14), (256, 5e14), (4096, 6e14)))
    one = 2 * (4096 * 4096 + 2 * 256 * 4096) / 4e12 / (2 * 256 * 4096 * 4096 / 5e14)
    assert hbm_exposure(s, ((4096, 4096),), 256) == pytest.approx(one)
    assert hbm_exposure(s, ((4096, 4096),), 300) == pytest.approx(      # (256's rate)
        2 * (4096 * 4096 + 2 * 300 * 4096) / 4e12 / (2 * 300 * 4096 * 4096 / 5e14))
    assert hbm_exposure(s, ((4096, 4096),), 64) == pytest.approx(         # (below: 128's)
        2 * (4096 * 4096 + 2 * 64 * 4096) / 4e12 / (2 * 64 * 4096 * 4096 / 2e14))
    tiny = dataclasses.replace(S, gemm_rates=((1, 1e18),))               # bytes-bound
    assert hbm_exposure(tiny, ((4096, 4096),), 256) == 1.0
    two = hbm_exposure(s, ((4096, 4096), (4096, 12288)), 256)
    big = 2 * (4096 * 12288 + 256 * 4096 + 256 * 12288) / 4e12 / (2 * 256 * 4096 * 12288 / 5e14)
    assert two == pytest.approx((one * 1 + big * 3) / 4)
    assert hbm_exposure(S, ((4096, 4096),), 256) == 0.0


def test_the_exposed_share_of_a_gemm_loses_what_reads_lose_to_hbm_bytes():
    s = dataclasses.replace(S, gemm_rates=((256, 5e14),))
    t = MixTable(s, ((4096, 4096),), 128, 8192)
    e = t.exposure[256]
    assert 0.0 < e < 1.0
    w = StepWork(0.1, 1.0, 0.0, 0.0, 0.0, 256, 0, 0.1, 0.0)
    load = CopyLoad(copy_engine=True, hbm_Bps=50e9)
    reads = 50e9 / 4e12
    want = 0.02 + 0.00625 / (1 - 0.00625) + e * reads / (1 - reads)
    assert t.stretch(w, load) == pytest.approx(want)
    assert t.stretch(w, load) == pytest.approx(s.stretch(1.0, t.gemms_for(w), load, e))
    # no HBM bytes in flight (SM CTAs only): nothing through it
    ctas = CopyLoad(ctas_h2d=36)
    assert s.gemm_stretch(t.gemms_for(w), ctas, e) == s.gemm_stretch(t.gemms_for(w), ctas)


def test_each_page_the_sm_kernel_moves_to_the_host_costs_its_seconds():
    """40 GB/s GPU -> host by the SM kernel in 64 KiB pages, 50 ns of the reads' a page;
    none without the page size (a structure not of one run), for the copy engine's bytes
    or without the term."""
    mem = dataclasses.replace(S.memory, page_d2h=50e-9)
    s = dataclasses.replace(S, memory=mem, page_bytes=64 * KiB)
    load = CopyLoad(ctas_d2h=14, hbm_Bps=40e9, sm_d2h_Bps=40e9)
    pages = 50e-9 * 40e9 / (64 * KiB)
    assert s.pages_d2h(mem, load) == pytest.approx(pages)
    assert s.memory_stretch(load) == pytest.approx(
        dataclasses.replace(s, memory=S.memory).memory_stretch(load) + pages)
    assert s.gemm_stretch([(2048, 1.0)], load) == S.gemm_stretch([(2048, 1.0)], load)  # (its own: 0)
    assert dataclasses.replace(s, page_bytes=0).pages_d2h(mem, load) == 0.0
    assert s.pages_d2h(mem, CopyLoad(copy_engine=True, hbm_Bps=40e9)) == 0.0
    assert s.pages_d2h(S.memory, load) == 0.0


def test_a_profiles_page_term_is_a_duration_and_its_structure_counts_pages_at_the_runs_size():
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["sm"]["interference"]["memory"]["page_d2h"] = "43ns"
    p = type(load_profile("h200-pcie-calibrated")).model_validate(d)
    assert p.sm.interference.memory.terms().page_d2h == pytest.approx(43e-9)
    assert p.interference_structure(page_bytes=64 * KiB).page_bytes == 64 * KiB
    assert p.interference_structure().page_bytes == 0
    d["sm"]["interference"]["memory"]["page_d2h"] = "-1ns"
    with pytest.raises(ValueError, match="page_d2h"):
        type(p).model_validate(d)


def test_written_bytes_stragglers_and_issuing_by_their_own_terms():
    s = Structure(132, 4e12, (128, 256),
                  gemm=KindTerms(0.0, 0.0, 0.0, 0.0, straggle_h2d=0.1, straggle_d2h=1.0,
                                 hbm_write_weight=2.0, issue_slowdown=0.2),
                  memory=KindTerms(0.0, 1.0, 0.0, 1.0, hbm_write_weight=5.0, issue_slowdown=0.05))
    load = CopyLoad(0, 14, False, 60e9, 20e9)  # 14 CTAs GPU -> host; 20 of 60 GB/s written
    x = 2.0 * 20e9 / 4e12                      # the GEMMs' HBM share: written bytes only
    # (120 tiles of one wave need SMs the 14 copy CTAs are on: the straggle)
    assert s.gemm_stretch([(120, 1.0)], load) == pytest.approx(1.0 + x / (1 - x))
    assert s.gemm_stretch([(118, 1.0)], load) == pytest.approx(x / (1 - x))  # (they fit beside)
    x = (40e9 + 5.0 * 20e9) / 4e12
    assert s.memory_stretch(load) == pytest.approx(132 / 118 - 1 + x / (1 - x))
    # calls issuing host-bound pages: their share, at most a whole one
    assert s.gemm_stretch([(48, 1.0)], CopyLoad(issue=0.5)) == pytest.approx(0.1)
    assert s.memory_stretch(CopyLoad(issue=2.0)) == pytest.approx(0.05)
    assert not CopyLoad(issue=0.5).idle


def _fluid(issue=0.0):
    import simpy

    from kvsim_backends.sim.fluid import Fluid

    st = Structure(8, 2e12, (128, 256), gemm=KindTerms(1.0, 1.0, 0.0, 0.0, issue_slowdown=issue),
                   memory=KindTerms(0.5, 0.5, 0.0, 0.0))
    env = simpy.Environment()
    f = Fluid(env, {"h2d": 1e9}, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
              busy_cta_efficiency=1.0, kinds=MixTable(st, ((256, 1024),), 128, 8192))
    return env, f


HALF = StepWork(0.002, 1.0, 0.0, 1.0, 0.0, 512, 0, 0.001, 0.001)  # 1 ms GEMMs, then 1 ms reads


def _run(env, f, work, flow_at, flow_bytes):
    out = {}

    def job():
        out["took"] = yield f.add_job(0.002, work)

    def flow():
        yield env.timeout(flow_at)
        yield f.add_flow(flow_bytes, ("h2d",), ctas=4)
    env.process(job())
    env.process(flow())
    env.run()
    return out["took"]


def test_a_step_runs_its_gemms_then_its_reads_each_at_its_kinds_stretch():
    """4 copy CTAs: GEMMs lose 4 of 8 SMs (1.0 in 3 of their 4 waves: 0.75), reads 2 of
    8 slots (1/3). A 1 ms copy from the start slows only the GEMMs (1 / 1.75 ms of them
    done); one from 1.5 ms, only the reads left (0.5 ms at 4/3)."""
    env, f = _fluid()
    assert _run(env, f, HALF, 0.0, 1e6) == pytest.approx(
        0.001 + (0.001 - 0.001 / 1.75) + 0.001, rel=1e-12)
    env, f = _fluid()
    assert _run(env, f, HALF, 0.0015, 1e6) == pytest.approx(0.0015 + 0.0005 * 4 / 3, rel=1e-12)


def test_copy_engine_calls_issuing_stretch_a_step_while_they_issue():
    env, f = _fluid(issue=0.2)
    out = {}
    gemm_only = StepWork(0.001, 1.0, 0.0, 0.0, 0.0, 512, 0, 0.001, 0.0)

    def job():
        out["took"] = yield f.add_job(0.001, gemm_only)

    def issue():
        f.issue(0.5, True)
        yield env.timeout(0.00055)  # 0.5 ms of work at 1.1
        f.issue(0.5, False)
    env.process(issue())
    env.process(job())
    env.run()
    assert out["took"] == pytest.approx(0.00105, rel=1e-12)
    assert f.load is IDLE


def test_the_sim_backends_copy_engine_calls_issue_by_their_host_bound_share():
    """20 us a page of 256 KiB (5.2 us of bytes at 50 GB/s): a GEMM step beside the
    call's host time pays the issue term times that share."""
    d = _profile().model_dump()
    d["copy_engine"]["per_page"] = 20e-6
    d["sm"]["interference"]["gemm"]["issue_slowdown"] = 0.3
    prof = type(_profile()).model_validate(d)
    rt = SimRuntime()
    st = settings_for(256 * KiB, {Level.GPU: 2048, Level.HOST: 2048}, prof,
                      copy_path=CopyPath.COPY_ENGINE.value, sm_ctas=4)
    st = dataclasses.replace(st, model=ModelSettings(((256, 1024),)))
    be = SimBackend(rt, st)
    share = 1 - 256 * KiB / prof.link.h2d / 20e-6
    assert be.issue_share["h2d"] == pytest.approx(share)
    assert _took(be, rt, GEMM) == pytest.approx(0.001 * (1 + 0.3 * share), rel=1e-12)


def test_a_hold_stops_every_job_until_the_last_one_ends():
    """A kernel that takes every SM (``Fluid.hold``): the 2 ms step (1 ms GEMMs, 1 ms reads)
    started at 0 is stopped from 0.5 ms to 1.2 ms (two holds, the inner one ending first at
    1.0 ms), so it ends at 2.7 ms; a 1 ms compute added at 0.8 ms, inside the hold, starts
    progressing at 1.2 ms and ends at 2.2 ms; meanwhile nothing runs ahead."""
    env, f = _fluid()
    out = {}

    def step():
        out["step"] = yield f.add_job(0.002, HALF)

    def later():
        yield env.timeout(0.0008)
        assert f.ahead(env.now, 0.001, 1.0) is None  # (held)
        out["later"] = yield f.add_job(0.001)

    def holds():
        yield env.timeout(0.0005)
        f.hold(True)
        yield env.timeout(0.0002)
        f.hold(True)
        yield env.timeout(0.0003)
        f.hold(False)  # (one still holds)
        yield env.timeout(0.0002)
        f.hold(False)
    for p in (step, later, holds):
        env.process(p())
    env.run()
    assert out["step"] == pytest.approx(0.002 + 0.0007, rel=1e-12)
    assert out["later"] == pytest.approx(0.0012 + 0.001 - 0.0008, rel=1e-12)
    assert f.held == 0 and f.ahead(env.now, 0.001, 1.0) == pytest.approx(env.now + 0.001)


def test_while_held_an_sm_copy_kernel_runs_at_its_idle_rate():
    """Under compute an SM copy kernel's flow gets ``busy_cta_efficiency`` (0.5) of its
    cap; while a hold stops the compute the SMs are not the step's, and 1 MB at 1 GB/s
    takes 1 ms, not 2."""
    import simpy

    from kvsim_backends.sim.fluid import Fluid

    def run(hold):
        env = simpy.Environment()
        f = Fluid(env, {"h2d": 1e9}, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
                  busy_cta_efficiency=0.5)
        out = {}

        def job():
            out["job"] = yield f.add_job(0.005)

        def flow():
            if hold:
                f.hold(True)
            yield f.add_flow(1e6, ("h2d",), cap=1e9, ctas=4)
            out["flow"] = env.now
            if hold:
                f.hold(False)
        env.process(job())
        env.process(flow())
        env.run()
        return out

    assert run(False) == pytest.approx({"flow": 0.002, "job": 0.005})
    assert run(True) == pytest.approx({"flow": 0.001, "job": 0.006}, rel=1e-12)


def test_gpu_to_host_ctas_the_link_leaves_waiting_cost_their_backlog_term():
    """``backlog_d2h`` per GPU -> host CTA beyond those the kernel's rate needs at
    ``cta_d2h_Bps`` each; none where the CTAs, not the link, bind, and none for host -> GPU
    CTAs (an H200's step of reads: 1-8 CTAs 0-2% longer, 14 23-31%, 36 145%)."""
    s = Structure(132, 4e12, (128, 256), KindTerms(0.0, 0.0, 0.0, 0.0, backlog_d2h=0.1),
                  KindTerms(0.0, 0.0, 0.0, 0.0, backlog_d2h=0.05), cta_d2h_Bps=8e9)
    waiting = CopyLoad(ctas_d2h=14, sm_d2h_Bps=48e9)     # 6 CTAs move 48 GB/s: 8 wait
    assert s.stalled_d2h(waiting) == pytest.approx(8.0)
    assert s.memory_stretch(waiting) == pytest.approx(0.05 * 8)
    # a GEMM's term weighs by the share of its time in the wave that does not queue: a
    # GEMM of 2048 tiles runs 16 waves on 132 SMs, one of 100 tiles one wave; FLOP-weighted
    assert s.gemm_stretch([(2048, 1.0)], waiting) == pytest.approx(0.1 * 8 / 16)
    assert s.gemm_stretch([(100, 1.0)], waiting) == pytest.approx(0.1 * 8)
    assert s.gemm_stretch([(2048, 3.0), (100, 1.0)], waiting) == pytest.approx(
        0.1 * 8 * (3 / 16 + 1) / 4)
    assert last_wave_share([], 132) == 1.0
    bound = CopyLoad(ctas_d2h=4, sm_d2h_Bps=32e9)        # the CTAs bind: none waits
    assert s.stalled_d2h(bound) == 0.0 and s.memory_stretch(bound) == 0.0
    assert s.stalled_d2h(CopyLoad(ctas_h2d=36, hbm_Bps=50e9, h2d_Bps=50e9)) == 0.0
    # without a CTA's rate (a profile of the older terms) nothing waits
    assert dataclasses.replace(s, cta_d2h_Bps=0.0).stalled_d2h(waiting) == 0.0


def test_beside_gemms_the_waiting_ctas_are_told_at_a_ctas_idle_rate():
    """With ``cta_d2h_idle_Bps`` the GEMM kind counts the CTAs beyond those the rate
    needs at a CTA's idle rate (8 of 8 GB/s at 40 GB/s: 3 wait), the reads at the drain
    rate (5 GB/s: none); the profile gives a CTA's ``sm.cta_offload`` at the page size."""
    s = Structure(132, 4e12, (128, 256), KindTerms(0.0, 0.0, 0.0, 0.0, backlog_d2h=0.1),
                  KindTerms(0.0, 0.0, 0.0, 0.0, backlog_d2h=0.05), cta_d2h_Bps=5e9,
                  cta_d2h_idle_Bps=8e9)
    load = CopyLoad(ctas_d2h=8, sm_d2h_Bps=40e9)
    assert s.stalled_d2h(load) == 0.0 and s.memory_stretch(load) == 0.0
    assert s.stalled_d2h(load, s.cta_d2h_idle_Bps) == pytest.approx(3.0)
    assert s.gemm_stretch([(100, 1.0)], load) == pytest.approx(0.1 * 3)
    p = load_profile("h200-pcie-calibrated")
    st = p.interference_structure(page_bytes=64 * KiB)
    assert st.cta_d2h_idle_Bps == p.sm.cta_rate("d2h", 64 * KiB)
    assert st.cta_d2h_Bps == pytest.approx(st.cta_d2h_idle_Bps * p.sm.interference.drain_eff())


def test_the_sim_counts_the_gpu_to_host_ctas_its_link_leaves_waiting():
    """8 CTAs GPU -> host at 10 GB/s each under compute (busy share 1.0) on a 40 GB/s
    link: 4 move the bytes, 4 wait; a read step pays its backlog term for 4, its SM slots
    (0.25 x 8 of 8 SMs) and the 40 GB/s its reads lose (of 2 TB/s)."""
    p = _profile()
    d = p.model_dump()
    d["sm"]["interference"]["busy_cta_efficiency_d2h"] = 1.0
    d["sm"]["interference"]["memory"]["backlog_d2h"] = 0.05
    p = type(p).model_validate(d)
    rt = SimRuntime()
    st = settings_for(256 * KiB, {Level.GPU: 2048, Level.HOST: 2048}, p,
                      copy_path=CopyPath.SM_KERNEL.value, sm_ctas=8)
    be = SimBackend(rt, dataclasses.replace(st, model=ModelSettings(((256, 1024),))))
    idx = np.arange(1000)
    be.transfer(Batch(BatchKind.EVICT, Level.GPU, Level.HOST, idx, idx,
                      np.zeros(1000, np.uint64), 256 * KiB, 0))
    x = 40e9 / 2e12
    s = 0.05 * 4 + 8 / 6 - 1 + x / (1 - x)
    assert _took(be, rt, READS, path_batch=False) == pytest.approx(0.001 * (1 + s), rel=1e-12)


def test_the_drain_share_sets_the_waiting_ctas_apart_from_the_busy_share():
    """``drain_cta_efficiency_d2h`` sets the rate a GPU -> host CTA drains at in the
    structural model (how many wait); the busy share GPU -> host, which calibrate fits
    under a prefill, caps the copy only. Without it the busy share does both."""
    from kvsim.config.hardware import HardwareProfile, load_profile
    d = load_profile("h200-pcie-calibrated").model_dump()
    i = d["sm"]["interference"]
    i.update(busy_cta_efficiency_d2h=0.5, drain_cta_efficiency_d2h=0.85)
    p = HardwareProfile.model_validate(d)
    assert p.interference_structure().cta_d2h_Bps == pytest.approx(p.sm.cta_rate("d2h") * 0.85)
    assert p.sm.interference.busy_eff()[1] == 0.5
    i["drain_cta_efficiency_d2h"] = None
    q = HardwareProfile.model_validate(d)
    assert q.interference_structure().cta_d2h_Bps == pytest.approx(q.sm.cta_rate("d2h") * 0.5)
