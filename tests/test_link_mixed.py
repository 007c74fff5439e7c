"""One direction on each copy path at once (``link.mixed``, ``link.mixed_ce_h2d``): the sim
caps such a pair's total at its pairing's, as the H200 measured (the copy engine GPU ->
host beside the SM kernel 58-70 GB/s at 64 KiB-4 MiB pages, host -> GPU 44-70, where the
copy engine both ways moves 92 at 1 MiB); ``kvsim calibrate`` measures both pairings and
fits them by page size."""

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
SM_H2D = (("h2d", "link", "sm_h2d", "sm_both"), 120e9, 36, False)
CAP = {"h2d": 54e9, "d2h": 54e9, "link": 96e9, "mixed": 70e9, "mixed_ce_h2d": 60e9,
       "sm_h2d": 50e9, "sm_d2h": 51e9, "sm_both": 61e9}


def test_a_pair_on_both_paths_shares_its_pairings_total():
    assert mixed((CE_H2D, SM_D2H)) == "mixed_ce_h2d" and mixed((SM_H2D, CE_D2H)) == "mixed"
    assert mixed((CE_H2D, CE_D2H)) is None and mixed((SM_D2H,)) is None
    assert sum(flow_rates(CAP, (CE_H2D, SM_D2H), None)) == pytest.approx(60e9)
    assert sum(flow_rates(CAP, (SM_H2D, CE_D2H), None)) == pytest.approx(70e9)
    assert sum(flow_rates(CAP, (CE_H2D, CE_D2H), None)) == pytest.approx(96e9)
    no = {k: v for k, v in CAP.items() if not k.startswith("mixed")}  # (none: link.both)
    assert sum(flow_rates(no, (CE_H2D, SM_D2H), None)) == pytest.approx(54e9 + 42e9)
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


def test_the_sim_moves_a_mixed_pair_at_its_pairings_total():
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["link"].update(mixed=70e9, mixed_ce_h2d={64 * KiB: 45e9, 4 * MiB: 65e9})
    p = HardwareProfile.model_validate(d)
    for paths, want in zip(PAIRS, (65e9, 70e9)):
        c = _cell(p, 4 * MiB, paths)
        assert c["bytes"] / c["seconds"] == pytest.approx(want, rel=0.02)
        assert c["bytes"] / c["seconds"] < want
    assert p.link.mixed_for("h2d", 512 * KiB) == pytest.approx(55e9)  # (log2 of the page size)


@pytest.mark.parametrize("total", [66e9, 75e9])
def test_calibrate_fits_each_pairings_total_by_page_size(total):
    """Cells the sim made with the copy engine GPU -> host at ``total`` and host -> GPU at
    40 GB/s give both back per page size where they bind, and the fitted tables
    reproduce every cell."""
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["link"].update(mixed=total, mixed_ce_h2d=40e9)
    p = HardwareProfile.model_validate(d)
    pages = (16 * KiB, 256 * KiB, 4 * MiB)
    cells = [_cell(p, pb, paths) for pb in pages for paths in PAIRS]
    d["link"].update(mixed=None, mixed_ce_h2d=None)
    why: dict[str, str] = {}
    _fit_link_mixed(cells, d, why)
    # where the total binds it comes back (40 GB/s: below either direction alone)
    assert d["link"]["mixed"][4 * MiB] == pytest.approx(total, rel=1e-3)
    for pb in (256 * KiB, 4 * MiB):
        assert d["link"]["mixed_ce_h2d"][pb] == pytest.approx(40e9, rel=1e-3)
    assert why["link.mixed"].startswith("fitted: ") and "copy engine d2h" in why["link.mixed"]
    q = HardwareProfile.model_validate(d)  # every cell as measured
    for c in cells:
        assert sim_cell(q, c)[0] == pytest.approx(c["seconds"], rel=1e-4)


def test_without_pairs_the_base_totals_stay():
    d = load_profile("h200-pcie-calibrated").model_dump()
    before = dict(d["link"])
    why: dict[str, str] = {}
    _fit_link_mixed([], d, why)
    assert d["link"] == before and not why


def test_a_bad_table_entry_names_its_key(tmp_path):
    import yaml

    from kvsim.config.hardware import CONFIG_DIR, ProfileError

    d = yaml.safe_load((CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml").read_text())
    d["link"]["mixed_ce_h2d"] = {"64KiB": "50GB/s", "1MiB": "-3GB/s"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(d))
    with pytest.raises(ProfileError, match=r"bad\.yaml: link\.mixed_ce_h2d: .*bandwidth.*-3GB/s"):
        load_profile(bad)
