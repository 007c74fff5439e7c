"""The SM copy kernel's per-CTA rate by page size (``sm.cta_offload`` / ``cta_onboard`` a
rate or a table ``{page size: rate}``, ``SMSpec.cta_rate``): read log-linear between the
table's points, flat beyond its ends; every user takes it at the run's page size (the sim's
CTA cap, the cost rule, Little's-law CTA sizing, the waiting CTAs' drain rate, the fit of
the interference terms); calibrate's rows by page size and their fit. A scalar profile
reads as before."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import ValidationError

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.core.datapath.copypath import direction_ctas
from kvsim.core.datapath.interference import Structure
from kvsim.core.datapath.pathcost import cost_inputs
from kvsim.core.spec import Level
from kvsim.run import sim_backend
from kvsim.run.seam import settings_for
from kvsim.tools.calibrate import load_profile_text, profile_text
from kvsim.tools.fit import fit_cta_rate
from kvsim.tools.fitkinds import sim_cell

GB = 1e9
KiB, MiB = 1 << 10, 1 << 20
# GPU -> host 8 / 11 / 12 GB/s a CTA at 64 KiB / 256 KiB / 1 MiB; host -> GPU 3 / 5 at 64 KiB / 1 MiB
OFFLOAD = {"64KiB": "8GB/s", "256KiB": "11GB/s", "1MiB": "12GB/s"}
ONBOARD = {"64KiB": "3GB/s", "1MiB": "5GB/s"}


def _table_profile(**sm) -> HardwareProfile:
    """h200-pcie-calibrated (link h2d 53.89, d2h 54.46 GB/s; sm.d2h 51.24; CTA headroom 2
    host -> GPU, 1 GPU -> host) with the tables above."""
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["sm"].update({"cta_offload": OFFLOAD, "cta_onboard": ONBOARD, **sm})
    return HardwareProfile.model_validate(d)


def _scalar() -> HardwareProfile:
    """h200-pcie-calibrated with one rate a direction (its 64 KiB cell's, as before tables)."""
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["sm"].update(cta_offload="9.048GB/s", cta_onboard="3.117GB/s")
    return HardwareProfile.model_validate(d)


def _structure(p: HardwareProfile, page: int | None = None) -> Structure:
    s = p.interference_structure(page_bytes=page)
    assert s is not None  # (the profile has the kinds' terms)
    return s


def test_a_table_reads_log_linear_between_its_points_and_flat_beyond():
    sm = _table_profile().sm
    assert sm.cta_offload == {64 * KiB: 8 * GB, 256 * KiB: 11 * GB, MiB: 12 * GB}
    assert sm.cta_rate("d2h", 64 * KiB) == 8 * GB
    assert sm.cta_rate("d2h", 256 * KiB) == 11 * GB
    # 128 KiB: halfway in log2 between 64 and 256 KiB; 512 KiB halfway between 256 KiB and 1 MiB
    assert sm.cta_rate("d2h", 128 * KiB) == pytest.approx(9.5 * GB)
    assert sm.cta_rate("d2h", 512 * KiB) == pytest.approx(11.5 * GB)
    assert sm.cta_rate("d2h", 16 * KiB) == 8 * GB and sm.cta_rate("d2h", 4 * MiB) == 12 * GB
    # host -> GPU: 256 KiB is 2 of the 4 doublings from 64 KiB to 1 MiB
    assert sm.cta_rate("h2d", 256 * KiB) == pytest.approx(4 * GB)
    # no page size: the largest page's (the rate of large pages)
    assert sm.cta_rate("d2h") == 12 * GB and sm.cta_rate("h2d") == 5 * GB
    with pytest.raises(ValueError, match="direction"):
        sm.cta_rate("both", 64 * KiB)
    # a scalar as it is, whatever the page
    old = _scalar().sm
    assert old.cta_offload == 9.048 * GB
    assert old.cta_rate("d2h", 256 * KiB) == old.cta_rate("d2h") == 9.048 * GB
    with pytest.raises(ValidationError, match="cta_offload"):
        _table_profile(cta_offload={"64KiB": "0GB/s"})
    with pytest.raises(ValidationError, match="cta_onboard"):
        _table_profile(cta_onboard=None)


def test_a_table_is_written_and_read_back_by_page_size():
    p = _table_profile()
    text = profile_text(p.model_dump(), {}, "h200-pcie-calibrated", "a test")
    sm = yaml.safe_load(text)["sm"]
    assert sm["cta_offload"] == {"64KiB": "8GB/s", "256KiB": "11GB/s", "1MiB": "12GB/s"}
    assert sm["cta_onboard"] == {"64KiB": "3GB/s", "1MiB": "5GB/s"}
    assert load_profile_text(text, Path("x.yaml")).sm == p.sm  # (the path only names a bad file)
    old = _scalar()
    assert yaml.safe_load(profile_text(old.model_dump(), {}, "x", "a test"))["sm"]["cta_offload"] == "9.048GB/s"


def _d2h_cell(page: int, ctas: int) -> dict:
    n = GB // page  # 1 GiB-ish one way: the fixed costs a batch under 0.1% of it
    return {"page": page, "path": "sm_kernel", "dir": "d2h", "pages": n, "bytes": n * page,
            "batches": [["d2h", n]], "ctas": {"h2d": 36, "d2h": ctas}}


def test_the_sim_caps_an_sm_kernel_flow_at_its_ctas_times_the_page_sizes_rate():
    p = _table_profile()
    # 4 CTAs GPU -> host: 4 x 11 = 44 GB/s at 256 KiB, 4 x 8 = 32 at 64 KiB, 4 x 9.5 = 38 at
    # 128 KiB (each below sm.d2h 51.24 and the link's 54.46)
    for page, per in ((256 * KiB, 11 * GB), (64 * KiB, 8 * GB), (128 * KiB, 9.5 * GB)):
        c = _d2h_cell(page, 4)
        assert c["bytes"] / sim_cell(p, c)[0] == pytest.approx(4 * per, rel=0.005)
    # the scalar profile: 4 x 9.048 = 36.19 GB/s at any page
    c = _d2h_cell(256 * KiB, 4)
    assert c["bytes"] / sim_cell(_scalar(), c)[0] == \
        pytest.approx(4 * 9.048 * GB, rel=0.005)


def test_the_cost_rule_and_littles_law_take_the_page_sizes_rate():
    p = _table_profile()
    ci = cost_inputs(p, 256 * KiB, None)
    assert ci.cta_rate == {"h2d": pytest.approx(4 * GB), "d2h": 11 * GB}
    assert cost_inputs(p, 128 * KiB, None).cta_rate["d2h"] == pytest.approx(9.5 * GB)
    # Little's law: GPU -> host 54.46 / 11 = 4.95 -> 5 -> 6 (even) at 256 KiB, 54.46 / 8 =
    # 6.8 -> 8 at 64 KiB; host -> GPU twice the link, 107.78 / 4 = 26.9 -> 28 at 256 KiB,
    # 107.78 / 3 = 35.9 -> 36 at 64 KiB
    assert direction_ctas(None, p, 256 * KiB) == {"h2d": 28, "d2h": 6}
    assert direction_ctas(None, p, 64 * KiB) == {"h2d": 36, "d2h": 8}
    assert ci.ctas_one == {"h2d": 28, "d2h": 6}
    # the sim backend sizes and caps alike at its page size
    _, be = sim_backend(settings_for(256 * KiB, {Level.GPU: 4, Level.HOST: 4}, p, refcheck=False))
    assert be.ctas == {"h2d": 28, "d2h": 6}
    assert be._cta_rate == {"h2d": pytest.approx(4 * GB), "d2h": 11 * GB}


def test_the_waiting_ctas_drain_at_the_page_sizes_rate():
    d = _table_profile().model_dump()
    d["sm"]["interference"]["drain_cta_efficiency_d2h"] = 0.5
    p = HardwareProfile.model_validate(d)
    assert _structure(p, 256 * KiB).cta_d2h_Bps == pytest.approx(5.5 * GB)
    assert _structure(p, 64 * KiB).cta_d2h_Bps == pytest.approx(4 * GB)
    assert _structure(p).cta_d2h_Bps == pytest.approx(6 * GB)  # (no page: 1 MiB's)


def test_the_interference_fit_drains_each_cells_waiting_ctas_at_its_page_sizes_rate():
    """The fit's fast predictor (``fitkinds.Cell``) stays the sim's own figure where the
    rate is a table: a cell's waiting GPU -> host CTAs (``backlog_d2h``) drain at its page
    size's rate, whatever structure the fit hands it."""
    from kvsim.tools.fit import predict_cell
    from kvsim.tools.fitkinds import Cell, kind_works

    d = _table_profile().model_dump()
    d["sm"]["interference"]["memory"]["backlog_d2h"] = 0.05
    p = HardwareProfile.model_validate(d)
    proj = [list(x) for x in settings_for(MiB, {Level.GPU: 1}, model="llama-3-8b").model.projections]
    work = kind_works(p)["memory"]
    for page in (64 * KiB, 256 * KiB):
        n = 256 * MiB // page
        row = {"kind": "memory", "compute_s": 0.02, "path": "sm_kernel", "dir": "d2h", "page": page,
               "batches": [["d2h", n]], "pages": n, "bytes": n * page, "alone_s": 0.02,
               "ctas": {"h2d": 36, "d2h": 14}, "work": list(work), "projections": proj,
               "device": "gpu", "spread": 0.0, "stretch": 0.0}
        sim = predict_cell(p, row)[0]
        # (the structure a fit hands every cell: no page size, 1 MiB's rate)
        assert Cell(p, row).stretch(_structure(p)) == pytest.approx(sim, rel=1e-6)
        # (14 CTAs at the kernel's ~51 GB/s: 14 - 51 / (8 x 0.85) = 6.5 wait at 64 KiB's
        # rate, 14 - 51 / (12 x 0.85) = 9 at 1 MiB's, while the copy runs)


def test_calibrate_measures_the_fewest_ctas_at_each_page_and_the_sweep_at_64_kib():
    from kvsim_backends.hw.ctarows import one_way
    from kvsim.tools.measured import Measured

    m = Measured(device="gpu")
    be = SimpleNamespace(ctas={"h2d": 36, "d2h": 8})
    seen = []

    def timed(batches, path):  # 0.1 s a batch, whatever it is
        seen.append(dict(be.ctas))
        return 0.1
    cells = {d: [SimpleNamespace(pages=1000)] for d in ("h2d", "d2h")}
    one_way((4, 8, 16), 3, be, timed, cells, m, 64 * KiB)
    one_way((4, 8, 16), 3, be, timed, cells, m, MiB)
    # 1000 pages in 0.1 s: 1000 x 64 KiB / 0.1 = 0.655 GB/s, 1000 x 1 MiB / 0.1 = 10.49
    assert [(r["ctas"], r["dir"], r["page"]) for r in m.ctas] == \
        [(c, d, 64 * KiB) for c in (4, 8, 16) for d in ("h2d", "d2h")] + [(4, "h2d", MiB), (4, "d2h", MiB)]
    assert m.ctas[0]["GBps"] == pytest.approx(1000 * 64 * KiB / 0.1 / GB)
    assert m.ctas[-1]["GBps"] == pytest.approx(1000 * MiB / 0.1 / GB)
    assert len(seen) == 3 * (6 + 2) and be.ctas == {"h2d": 36, "d2h": 8}  # (its own again)


def test_calibrate_fits_a_table_from_rows_of_several_page_sizes_a_rate_from_one():
    # an older report: the 64 KiB sweep without ``page`` (4 CTAs 34.52 GB/s GPU -> host)
    old = [{"ctas": c, "dir": "d2h", "GBps": g} for c, g in ((8, 50.53), (4, 34.52), (16, 50.97))]
    old += [{"ctas": 4, "dir": "both", "page": 256 * KiB, "h2d_ctas": 36, "GBps": 81.0, "lone": False}]
    rate, why = fit_cta_rate(old, "d2h")
    assert rate == pytest.approx(34.52e9 / 4)
    assert why == "measured: one SM copy CTA's rate GPU -> host: the SM kernel with 4 CTAs, 64 KiB pages, rate / CTAs"
    assert fit_cta_rate(old, "h2d") == (None, "")
    # rows by page size: each page's fewest CTAs, rate / CTAs (64 KiB's from the sweep)
    rows = old + [{"ctas": 4, "dir": "d2h", "page": 256 * KiB, "GBps": 43.2},
                  {"ctas": 4, "dir": "d2h", "page": MiB, "GBps": 44.0},
                  {"ctas": 4, "dir": "h2d", "page": MiB, "GBps": 12.0}]
    rate, why = fit_cta_rate(rows, "d2h")
    assert rate == {64 * KiB: pytest.approx(8.63e9), 256 * KiB: pytest.approx(10.8e9), MiB: pytest.approx(11e9)}
    assert list(rate) == [64 * KiB, 256 * KiB, MiB]
    assert why.startswith("measured: one SM copy CTA's rate GPU -> host by page size")
    assert "256 KiB 4 CTAs: 10.80 GB/s" in why
    assert fit_cta_rate(rows, "h2d")[0] == pytest.approx(3e9)  # (one page size: a rate)
