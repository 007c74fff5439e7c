"""The SM copy kernel both ways: how its CTAs split (``sm.both_ctas_d2h``), its total when
GPU -> host has more CTAs than that (``sm.both_crowded``), per-direction CTA settings, and
calibrate's fit of both from its measured rows."""

import pytest
from pydantic import ValidationError

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.core.datapath.copypath import direction_ctas
from kvsim.core.datapath.pathcost import cost_inputs
from kvsim.tools.fit import fit_both_split
from kvsim.tools.fitkinds import sim_cell

GB = 1e9
MiB = 1 << 20


def _profile(**sm) -> HardwareProfile:
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["sm"].update(sm)
    return HardwareProfile.model_validate(d)


def test_the_measured_split_keeps_host_to_gpu_at_its_own_ctas():
    p = _profile(both_ctas_d2h=4)
    ci = cost_inputs(p, 256 << 10, None)
    assert ci.ctas_both == {"h2d": ci.ctas_one["h2d"], "d2h": 4}
    # without it: Little's law on half the both-ways ceiling, as before
    q = _profile(both_ctas_d2h=None)
    ci = cost_inputs(q, 256 << 10, None)
    assert ci.ctas_both["d2h"] != 4 or ci.ctas_both["h2d"] != ci.ctas_one["h2d"]
    # a count set in the run config is taken both ways as it is, one or one a direction
    assert cost_inputs(p, 256 << 10, 12).ctas_both == {"h2d": 12, "d2h": 12}
    assert cost_inputs(p, 256 << 10, {"h2d": 30, "d2h": 6}).ctas_both == {"h2d": 30, "d2h": 6}
    assert direction_ctas({"h2d": 30, "d2h": 6}, p, 256 << 10) == {"h2d": 30, "d2h": 6}
    with pytest.raises(ValidationError, match="both_ctas_d2h"):
        _profile(both_ctas_d2h=500)


def _both_cell(ctas: dict) -> dict:
    n = 1024  # 1 MiB pages a direction (a fixed cost a batch: under 1% of it)
    return {"page": MiB, "path": "sm_kernel", "dir": "both", "pages": 2 * n, "bytes": 2 * n * MiB,
            "batches": [["h2d", n], ["d2h", n]], "ctas": ctas}


def test_the_sim_runs_both_ways_at_the_split_or_crowded_past_it():
    """Both ways on the SM kernel the sim moves ``sm.both`` with GPU -> host at most
    ``both_ctas_d2h`` CTAs, ``both_crowded`` with more (as the cell's recorded CTAs)."""
    both, crowded = 78.6 * GB, 65.6 * GB
    p = _profile(both=both, both_ctas_d2h=4, both_crowded=crowded, cta_offload=11 * GB)
    nbytes = 2 * 1024 * MiB
    at_split = nbytes / sim_cell(p, _both_cell({"h2d": 36, "d2h": 4}))[0]
    past = nbytes / sim_cell(p, _both_cell({"h2d": 36, "d2h": 8}))[0]
    # past the split the two share the crowded total evenly and end together; at it GPU ->
    # host moves at its 4 CTAs' 44 GB/s, host -> GPU the rest of sm.both, and ends alone
    assert past == pytest.approx(crowded, rel=0.01)
    assert at_split == pytest.approx(both, rel=0.02) and at_split > past * 1.15
    # a profile without the split: the one ceiling whatever the CTAs
    q = _profile(both=both, both_ctas_d2h=None, both_crowded=None, cta_offload=11 * GB)
    assert nbytes / sim_cell(q, _both_cell({"h2d": 36, "d2h": 8}))[0] == pytest.approx(both, rel=0.01)


def test_calibrate_fits_the_split_of_the_greatest_total():
    def row(page, c, g, lone=False):
        return {"ctas": c, "dir": "both", "page": page, "h2d_ctas": 36, "GBps": g, "lone": lone}
    # the H200's totals of 2026-12-03 21:19 (GB/s), the lone batch's count 8
    rows = [row(64 << 10, c, g, c == 8) for c, g in ((2, 39.9), (3, 60.2), (4, 78.6), (5, 68.9),
                                                       (6, 67.1), (8, 65.8))]
    rows += [row(256 << 10, c, g, c == 8) for c, g in ((2, 42.5), (3, 63.6), (4, 79.1), (5, 68.8),
                                                        (6, 67.7), (8, 65.6))]
    rows += [row(MiB, c, g, c == 8) for c, g in ((3, 65.4), (4, 78.2), (5, 79.0), (8, 65.9))]
    rows += [{"ctas": 4, "dir": "d2h", "GBps": 40.6}]  # (one direction: not the split's)
    keys, why = fit_both_split(rows)
    assert keys["both_ctas_d2h"] == 4  # (4, 4, 5: the median)
    assert keys["both_crowded"] == pytest.approx(65.8e9)
    assert "64 KiB 4: 78.6 GB/s" in why["sm.both_ctas_d2h"]
    assert fit_both_split([{"ctas": 4, "dir": "d2h", "GBps": 40.6}]) == ({}, {})


def test_the_run_config_takes_ctas_a_direction_and_refuses_bad_ones(tmp_path):
    from kvsim.config.runconfig import ConfigFileError
    from kvsim.run.seam import settings_for
    p = load_profile("h200-pcie-calibrated")
    st = settings_for(MiB, {}, p, refcheck=False, sm_ctas={"h2d": 30, "d2h": 6})
    assert st.copy.sm_ctas == {"h2d": 30, "d2h": 6}
    for bad in ({"h2d": 30}, {"h2d": 30, "d2h": 0}, {"h2d": 30, "d2h": 6, "up": 1}):
        with pytest.raises(ConfigFileError, match="engine.sm_ctas"):
            settings_for(MiB, {}, p, refcheck=False, sm_ctas=bad)


def test_under_compute_the_crowded_count_is_of_ctas_at_their_busy_share():
    """Under compute a GPU -> host CTA moves its busy share of its idle rate, so more of
    them fit before the link leaves any waiting: the pair is crowded where CTAs x share
    exceed ``both_ctas_d2h`` (6 x 0.57 = 3.4 is not past 4; 8 x 0.57 = 4.6 is), and
    on an idle GPU (no share) as before."""
    from kvsim_backends.sim.fairshare import crowded, flow_rates

    def sigs(d2h: int):
        return (("link", "sm_both", "sm_h2d"), 0.0, 36, False), (("link", "sm_both", "sm_d2h"), 0.0, d2h, False)

    assert crowded(sigs(6), 4) and crowded(sigs(8), 4)
    assert not crowded(sigs(6), 4, 0.57) and crowded(sigs(8), 4, 0.57)
    assert not crowded(sigs(4), 4)
    # the fluid: beside reads (shares 0.448 / 0.57), 6 CTAs back run at sm.both, not at
    # the crowded total; 8 at the crowded one
    cap = {"link": 96e9, "sm_both": 78.6e9, "sm_both_crowded": 65.8e9, "sm_both_ctas_d2h": 4,
           "sm_h2d": 1e12, "sm_d2h": 1e12}
    busy = (0.448, 0.57)
    assert sum(flow_rates(cap, sigs(6), busy)) == pytest.approx(78.6e9)
    assert sum(flow_rates(cap, sigs(8), busy)) == pytest.approx(65.8e9)
    assert sum(flow_rates(cap, sigs(6), None)) == pytest.approx(65.8e9)
