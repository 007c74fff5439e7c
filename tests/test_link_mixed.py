"""One direction on each copy path at once (``link.mixed``): the sim caps such a pair's
total at it, as the H200 measured (68.8-70.3 GB/s at 64 KiB-1 MiB where the copy engine
both ways moves 92 at 1 MiB); ``kvsim calibrate`` measures the pairs and fits it."""

from __future__ import annotations

import pytest

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.tools.fit import _fit_link_mixed
from kvsim.tools.fitkinds import sim_cell
from kvsim_backends.sim.fairshare import flow_rates, link_caps, mixed

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
CE_H2D = (("h2d", "link"), 0.0, 0, True)
SM_D2H = (("d2h", "link", "sm_d2h", "sm_both"), 120e9, 14, False)
CE_D2H = (("d2h", "link"), 0.0, 0, True)
CAP = {"h2d": 54e9, "d2h": 54e9, "link": 96e9, "mixed": 70e9, "sm_h2d": 50e9, "sm_d2h": 51e9,
       "sm_both": 61e9}


def test_a_pair_on_both_paths_shares_the_mixed_total():
    assert mixed((CE_H2D, SM_D2H)) and not mixed((CE_H2D, CE_D2H)) and not mixed((SM_D2H,))
    assert sum(flow_rates(CAP, (CE_H2D, SM_D2H), 1.0, False)) == pytest.approx(70e9)
    assert sum(flow_rates(CAP, (CE_H2D, CE_D2H), 1.0, False)) == pytest.approx(96e9)
    no = {k: v for k, v in CAP.items() if k != "mixed"}  # (a profile without it: link.both)
    assert sum(flow_rates(no, (CE_H2D, SM_D2H), 1.0, False)) == pytest.approx(54e9 + 42e9)
    assert link_caps(no, (CE_H2D, SM_D2H)) is no
    # a disk write beside them shares no link: not a pair on the link
    assert not mixed((SM_D2H, (("disk_write",), 0.0, 0, True)))


def _cell(p, pb, paths):
    n = GiB // pb
    c = {"page": pb, "path": "mixed", "dir": "both", "pages": 2 * n, "bytes": 2 * n * pb,
         "batches": [["h2d", n], ["d2h", n]], "paths": paths}
    c["seconds"] = sim_cell(p, c)[0]
    return c


PAIRS = ({"h2d": "copy_engine", "d2h": "sm_kernel"}, {"h2d": "sm_kernel", "d2h": "copy_engine"})


def test_the_sim_moves_a_mixed_pair_at_the_profiles_total():
    p = load_profile("h200-pcie-calibrated")
    for paths in PAIRS:
        c = _cell(p, 4 * MiB, paths)
        assert c["bytes"] / c["seconds"] == pytest.approx(p.link.mixed, rel=0.02)
        assert c["bytes"] / c["seconds"] < p.link.mixed


@pytest.mark.parametrize("total", [66e9, 75e9])
def test_calibrate_fits_the_total_the_pairs_moved(total):
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["link"]["mixed"] = total
    p = HardwareProfile.model_validate(d)
    cells = [_cell(p, pb, paths) for pb in (16 * KiB, 256 * KiB, 4 * MiB) for paths in PAIRS]
    d["link"]["mixed"] = None
    why: dict[str, str] = {}
    _fit_link_mixed(cells, d, why)
    assert d["link"]["mixed"] == pytest.approx(total, rel=1e-3)
    assert why["link.mixed"].startswith("fitted: ") and "256 KiB-4096 KiB" in why["link.mixed"]
    HardwareProfile.model_validate(d)


def test_without_pairs_the_base_total_stays():
    d = load_profile("h200-pcie-calibrated").model_dump()
    why: dict[str, str] = {}
    _fit_link_mixed([], d, why)
    assert d["link"]["mixed"] == pytest.approx(70.1e9) and not why
