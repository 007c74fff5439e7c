"""Copy path by what it costs (kvsim.core.datapath.pathcost): a batch alone keeps the
older rule's path; beside the other direction it takes the path that keeps their sum
highest; beside compute it pays for the progress it takes; pinned paths stay; both
backends decide alike from the same state."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import round_profile
from kvsim.config.hardware import load_profile
from kvsim.core.datapath.copypath import direction_paths, pinned_paths
from kvsim.core.datapath.interference import legacy_stretch
from kvsim.core.datapath.pathcost import CE, SM, _fair, cost_inputs, other_path, path_chooser
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
from kvsim.run.seam import settings_for
from kvsim_backends.hw import HwBackend, RealtimeRuntime
from kvsim_backends.sim import SimBackend, SimRuntime

KiB = 1 << 10
CAL = load_profile("h200-pcie-calibrated")


def _before_split(p):
    """``p`` as it was before the SM kernel's both-ways split was measured: one both-ways
    ceiling (61.08 GB/s at 36 + 14 CTAs), both directions' CTAs by Little's law on half of
    it, GPU -> host alone at twice its link (the older reasoning, kept for profiles
    without ``sm.both_ctas_d2h``)."""
    sm = p.sm.model_copy(update={"both": 61.08e9, "both_ctas_d2h": None, "both_crowded": None,
                                 "cta_headroom_d2h": None})
    return p.model_copy(update={"sm": sm})


CAL0 = _before_split(CAL)


def chooser(profile, page, force=None):
    force = force or {"h2d": None, "d2h": None}
    idle = direction_paths(profile, page, force, None, 0, False)
    return path_chooser(profile, page, pinned_paths(profile, page, force, None, 0, False), idle,
                        None, None)


def test_alone_and_idle_a_batch_keeps_the_older_rule_where_no_pair_loses():
    """16 KiB and 64 KiB: the best pair is one direction on each path (``link.mixed``)
    whichever path the first takes, so the first keeps the older rule's (the SM kernel);
    4 MiB: the older rule's copy engine is best alone and in a pair."""
    for page in (16 * KiB, 64 * KiB, 4096 * KiB):
        ch = chooser(CAL, page)
        want = direction_paths(CAL, page, {"h2d": None, "d2h": None}, None, 0, False)
        for d in ("h2d", "d2h"):
            path, ctas = ch.choose(d, 1000)
            assert path is want[d] is ch.lone[d]
            assert ctas == cost_inputs(CAL, page, None).ctas_one[d]


def test_a_lone_batch_weighs_the_pair_it_may_become():
    """256 KiB, H200 calibrated, by hand. Alone: host -> GPU on the SM kernel 49.73 GB/s,
    on the copy engine 262144 B / (0.6643 us + 262144 B / 53.89 GB/s) = 47.41 (4.9%
    less); GPU -> host 51.24 against 262144 / (0.8668 + 262144 / 54.46 GB/s) = 46.15
    (11.0% less). Joined by an equal batch the other way: both on the copy engine, a page
    each way costs both host times (one call thread) and the DMA at half of 96.28 GB/s,
    2 x 262144 / (0.6643 + 0.8668 + 5.445 us) = 75.2 GB/s. One on each path, the pair's
    total (``link.mixed`` at 256 KiB) split fairly, the copy engine's page its host time
    more: the SM kernel host -> GPU 73.27 / 2 = 36.64 + 262144 / (0.8668 us + 262144 /
    36.64 GB/s) = 32.68, 69.31 GB/s; the copy engine host -> GPU (``mixed_ce_h2d``, 55.85:
    the kernel's stores wait for its reads) 27.93 + 26.08 = 54.00; both on the SM kernel
    61.08. So host -> GPU gives up 4.9% alone for 8.5% in a pair (the copy engine), and
    GPU -> host 11.0% alone for 23.1% (75.2 / 61.08: the SM kernel's best pair): both take
    the copy engine, as the H200 measured: both ways on it 74.4-80.8 GB/s at 256 KiB, the
    mixed pairs 50.9-53.5 and 68.0-70.3 (2026-12-03 17:05-17:42)."""
    ch = chooser(CAL0, 256 * KiB)
    assert direction_paths(CAL0, 256 * KiB, {"h2d": None, "d2h": None}, None, 0, False) == \
        {"h2d": SM, "d2h": SM}
    assert ch._alone_rate("h2d", CE) == pytest.approx(47.41e9, rel=1e-3)
    assert ch._alone_rate("h2d", SM) == pytest.approx(49.73e9, rel=1e-6)
    assert ch._alone_rate("d2h", CE) == pytest.approx(46.15e9, rel=1e-3)
    assert ch._pair_rate("h2d", CE, CE) == pytest.approx(75.2e9, rel=2e-3)
    assert ch._pair_rate("h2d", SM, CE) == pytest.approx(69.31e9, rel=1e-3)
    assert ch._pair_rate("h2d", CE, SM) == pytest.approx(54.00e9, rel=1e-3)
    assert ch._pair_rate("d2h", SM, SM) == pytest.approx(61.08e9, rel=1e-6)
    assert ch.lone == {"h2d": CE, "d2h": CE}
    assert ch.choose("h2d", 4096)[0] is CE
    # the joiner then takes the copy engine too: the pair both ways on it
    assert ch.choose("d2h", 4096, other=CE)[0] is CE


def test_the_fair_rates_of_a_mixed_pair_by_hand():
    """H200 calibrated: host -> GPU on the SM kernel (36 CTAs x 3.117 GB/s, its own 49.73
    GB/s ceiling) beside GPU -> host on the copy engine: both rise together to half the
    link's total for that pairing (``link.mixed`` at 256 KiB: 73.27 GB/s, below the 96.28
    GB/s both ways on one path), below every other bound; the other pairing's
    (``mixed_ce_h2d``, 55.85) the same way."""
    ci = cost_inputs(CAL0, 256 * KiB, None)
    r = _fair([("h2d", SM, 36 * ci.cta_rate["h2d"]), ("d2h", CE, float("inf"))], ci)
    assert r == pytest.approx([73.27e9 / 2] * 2, rel=1e-4)
    r = _fair([("h2d", CE, float("inf")), ("d2h", SM, 14 * ci.cta_rate["d2h"])], ci)
    assert r == pytest.approx([55.85e9 / 2] * 2, rel=1e-4)
    # both on the copy engine: the link's both-ways total, halved
    r = _fair([("h2d", CE, float("inf")), ("d2h", CE, float("inf"))], ci)
    assert r == pytest.approx([96.28e9 / 2] * 2, rel=1e-4)
    # both on the SM kernel: its own both-ways ceiling, 61.08 GB/s, halved
    r = _fair([("h2d", SM, 1e12), ("d2h", SM, 1e12)], ci)
    assert r == pytest.approx([61.08e9 / 2] * 2, rel=1e-4)


def test_beside_the_other_direction_the_pair_keeps_the_higher_sum():
    """256 KiB pages, host -> GPU on the SM kernel (as the older rule has it alone: 5.27 us
    a page against 0.66 + 4.86 us); GPU -> host beside it on the SM kernel would halve both to
    30.5 GB/s under the kernel's 61 GB/s both-ways ceiling, on the copy engine both run at
    35.05 GB/s (half the measured 70.1 GB/s of a pair on different paths): the copy engine,
    by the ratio of those rates less its host time. Both SM-kernel directions get CTAs for
    half that ceiling."""
    ch = chooser(CAL0, 256 * KiB)
    ce, sm = ch.cost("d2h", 4096, CE, SM, None), ch.cost("d2h", 4096, SM, SM, None)
    assert ce < sm and ce / sm == pytest.approx(30.54 / 35.05, rel=0.05)
    assert ch.choose("d2h", 4096, other=SM)[0] is CE
    ci = cost_inputs(CAL0, 256 * KiB, None)
    assert ch.ctas("h2d", SM, SM) == ci.ctas_both["h2d"] < ci.ctas_one["h2d"]


def test_with_a_measured_split_a_lone_batch_weighs_the_pair_it_would_hold():
    """256 KiB, H200 calibrated with its measured split (``sm.both_ctas_d2h`` 4, ``both``
    78.6, ``both_crowded`` 65.8 GB/s; per-CTA rates at 256 KiB 3.274 / 10.41 GB/s), by
    hand. Host -> GPU first on the SM kernel (34 CTAs: 2 x 53.89 / 3.274 = 32.9, even),
    GPU -> host joining it there at 4 CTAs x 10.41 = 41.64 GB/s: the two share the 78.6
    fairly, 39.3 each (the CTAs' cap does not bind). GPU -> host first on the SM kernel keeps its lone 6 CTAs (54.46 /
    10.41 = 5.2, even), so a
    host -> GPU batch joining it there holds the crowded 65.8, below the copy engine's pair
    (75.2): GPU -> host alone takes the copy engine (11% less alone, as before), host ->
    GPU the SM kernel (its best pair 78.6: no regret). As the H200 measured (2026-12-03
    21:19): 36 + 4 CTAs 79.1 GB/s (40.3 / 43.2 each way), 36 + 6-8 65.6-67.7, the copy
    engine both ways 76.0."""
    ch = chooser(CAL, 256 * KiB)
    ci = cost_inputs(CAL, 256 * KiB, None)
    assert ci.ctas_one == {"h2d": 34, "d2h": 6} and ci.ctas_both == {"h2d": 34, "d2h": 4}
    assert ch._pair_rate("h2d", SM, SM) == pytest.approx(78.6e9, rel=1e-9)
    assert _fair([("h2d", SM, 34 * ci.cta_rate["h2d"]), ("d2h", SM, 4 * ci.cta_rate["d2h"])], ci, 4) == \
        pytest.approx([78.6e9 / 2, 78.6e9 / 2], rel=1e-6)
    assert ch._pair_rate("d2h", SM, SM) == pytest.approx(65.8e9, rel=1e-9)
    assert ch.lone == {"h2d": SM, "d2h": CE}
    assert ch.choose("d2h", 4096, other=SM) == (SM, 4)
    assert ch.choose("h2d", 4096, other=CE)[0] is CE
    # beside a GPU -> host batch on the SM kernel (its 6 CTAs) host -> GPU is priced at
    # half the crowded total, times 1 + the share of GPU -> host's rate alone it takes
    half = 65.8e9 / 2
    t = CAL.sm.launch + CAL.transfer.latency_for(True) + 4096 * 256 * KiB / half
    assert ch.cost("h2d", 4096, SM, SM, None) == pytest.approx(t * (2 - half / CAL.sm.d2h), rel=1e-6)
    # under compute the load it prices counts that batch's 6 CTAs, the joiner's own 34
    loads = []
    ch.cost("h2d", 4096, SM, SM, lambda load: loads.append(load) or 0.0)
    assert [(x.ctas_h2d, x.ctas_d2h) for x in loads] == [(0, 6), (34, 6)]
    loads.clear()
    ch.cost("d2h", 4096, SM, SM, lambda load: loads.append(load) or 0.0)
    assert [(x.ctas_h2d, x.ctas_d2h) for x in loads] == [(34, 0), (34, 4)]


def test_beside_compute_a_batch_pays_for_the_progress_it_takes():
    """Round profile, 256 KiB pages GPU -> host, the older interference terms (0.05 a CTA,
    0.1 for the copy engine): the copy engine 10 us + 64 x max(2 us, 6.55 us), taking
    0.1 / 1.1 of the compute's progress; the SM kernel at half its 4 CTAs' 40 GB/s under
    compute, 5 us + 64 x 13.1 us, taking 0.2 / 1.2: the copy engine, and by the sums."""
    prof = round_profile()
    ch = chooser(prof, 256 * KiB)
    stretch = lambda load: legacy_stretch(0.05, 0.1, load)  # noqa: E731
    page = 256 * KiB
    ce = (10e-6 + 64 * max(2e-6, page / 40e9)) * (1 + 0.1 / 1.1)
    sm = (5e-6 + 64 * page / 20e9) * (1 + 0.2 / 1.2)
    assert ch.cost("d2h", 64, CE, None, stretch) == pytest.approx(ce, rel=1e-9)
    assert ch.cost("d2h", 64, SM, None, stretch) == pytest.approx(sm, rel=1e-9)
    assert ch.choose("d2h", 64, None, stretch, "legacy")[0] is CE


def test_pinned_paths_stay_whatever_runs():
    ch = chooser(CAL, 256 * KiB, {"h2d": SM, "d2h": None})
    stretch = lambda load: legacy_stretch(0.05, 0.1, load)  # noqa: E731
    assert ch.choose("h2d", 4096, CE, stretch, "legacy")[0] is SM
    # on a coherent link every direction is pinned to the older rule's path (the seed's)
    c2c = load_profile("gh200-c2c")
    free = {"h2d": None, "d2h": None}
    for page in (256 * KiB, 4096 * KiB):
        assert pinned_paths(c2c, page, free, None, 0, False) == \
            direction_paths(c2c, page, free, None, 0, False)


def test_other_path_prefers_the_sm_kernel():
    assert other_path([0, 0]) is None
    assert other_path([2, 0]) is CE
    assert other_path([2, 1]) is SM


def _batch(src, dst, n, page, base):
    idx = np.arange(base, base + n)
    return Batch(BatchKind.EVICT, src, dst, idx, idx, np.zeros(n, np.uint64), page, 0)


def _paths_taken(make, first=Level.HOST):
    """A batch one way (``first``: its source, host -> GPU by default), then one the other
    way while it is in flight: the paths the backend's timing log records for them, the
    first's first."""
    log: list = []
    rt, be = make(log)
    other = Level.GPU if first == Level.HOST else Level.HOST
    try:
        evs = [be.transfer(_batch(first, other, 64, 64 * KiB, 0)),
               be.transfer(_batch(other, first, 64, 64 * KiB, 64))]
        rt.run(rt.all_of(evs))
    finally:
        be.close()
    return [r["path"] for r in sorted(log, key=lambda r: r["src"] != first.name.lower())]


def test_both_backends_pick_alike_from_the_same_state():
    """64 KiB, batches of 64 pages: each direction first keeps the SM kernel; GPU -> host beside host -> GPU
    takes the copy engine (that pair, 82.46 GB/s at 64 KiB, above both on the SM kernel),
    but host -> GPU beside GPU -> host keeps the SM kernel (the copy engine host -> GPU
    would starve the kernel's stores: ``link.mixed_ce_h2d``, 50.32)."""
    slots = {Level.GPU: 128, Level.HOST: 128}

    def sim(log):
        rt = SimRuntime()
        return rt, SimBackend(rt, settings_for(64 * KiB, slots, CAL, timing_log=log))

    def hw(log):
        rt = RealtimeRuntime()
        return rt, HwBackend(rt, settings_for(64 * KiB, slots, CAL, device="cpu", timing_log=log))

    assert _paths_taken(sim) == _paths_taken(hw) == ["sm_kernel", "copy_engine"]
    assert _paths_taken(sim, Level.GPU) == _paths_taken(hw, Level.GPU) == ["sm_kernel", "sm_kernel"]


def test_under_compute_the_copy_engine_pays_its_busy_cost_a_page():
    """Round profile, 16 KiB pages GPU -> host, ``busy_per_page_d2h`` 3 us: under compute a
    copy-engine batch of 64 pages takes 10 us + 64 x (16384 B / 40 GB/s + 3 us) of DMA
    (its host time, 64 x 2 us, overlaps: the older model), against 10 + 64 x 2 idle; the
    compute's share it takes is the same (the older terms: the copy engine's 0.1), so the
    costs part by that ratio."""
    prof = round_profile()
    d = prof.model_dump()
    d["copy_engine"]["busy_per_page_d2h"] = "3us"
    busy = type(prof).model_validate(d)
    stretch = lambda load: legacy_stretch(0.05, 0.1, load)  # noqa: E731
    page = 16 * KiB
    a = chooser(prof, page).cost("d2h", 64, CE, None, stretch)
    b = chooser(busy, page).cost("d2h", 64, CE, None, stretch)
    assert b / a == pytest.approx((10 + 64 * (16384 / 40e3 + 3)) / (10 + 64 * 2), rel=1e-9)
    # idle, and host -> GPU, the term costs nothing
    assert chooser(busy, page).cost("d2h", 64, CE, None, None) == chooser(prof, page).cost("d2h", 64, CE, None, None)
    assert chooser(busy, page).cost("h2d", 64, CE, None, stretch) == chooser(prof, page).cost("h2d", 64, CE, None, stretch)


def test_the_rule_weighs_the_stretch_the_sim_runs_a_step_by():
    """The chooser's stretch for a running step is the sim's own (``MixTable.stretch``) at
    the step's rounded GEMM share: a decode batch's GEMMs with their byte-bound share."""
    from kvsim.core.datapath.interference import CopyLoad, MixTable
    from kvsim.core.datapath.work import StepWork

    m = settings_for(64 << 10, {Level.GPU: 1}, CAL, model="llama-3-8b").model
    kinds = MixTable(CAL.interference_structure(page_bytes=64 << 10), m.projections, m.min_rows,
                     m.max_rows)
    assert kinds.exposure[256] > 0.3
    ch = path_chooser(CAL, 64 << 10, {"h2d": None, "d2h": None}, {"h2d": CE, "d2h": CE}, None, kinds)
    got = {}
    ch.choose = lambda d, pages, other, stretch=None, key=None, busy=None: got.setdefault("f", stretch)
    work = StepWork(0.01, 1.0, 0.0, 1.0, 0.0, 0, 256, 0.005, 0.005)  # half GEMMs at M = 256
    ch.pick("h2d", 64, None, True, work)
    load = CopyLoad(copy_engine=True, hbm_Bps=50e9, h2d_Bps=50e9)
    assert got["f"](load) == pytest.approx(kinds.stretch(work, load), rel=1e-12)
