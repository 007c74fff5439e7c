"""``kvsim calibrate`` fits the copy engine's busy cost a page (``copy_engine.busy_per_page_*``)
from its copy-engine cells under a prefill (``kvsim_backends.hw.interfere.busy_grid``):
cells the sim itself made with a known cost give that cost back, the idle cells' own error
taken out; without such cells the profile keeps its own."""

from __future__ import annotations

import pytest

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.tools.fit import fit_busy_per_page
from kvsim.tools.fitkinds import kind_works, sim_cell
from kvsim_backends.hw.interfere import busy_grid

KiB, MiB = 1 << 10, 1 << 20
TRUE = {"h2d": {64 * KiB: 0.9e-6, 256 * KiB: 0.1e-6}, "d2h": {64 * KiB: 0.6e-6, 256 * KiB: 0.7e-6}}


def _profile(tables):
    d = load_profile("h200-pcie-calibrated").model_dump()
    d["copy_engine"].update(busy_per_page_h2d=tables and tables["h2d"], busy_per_page_d2h=tables and tables["d2h"])
    return d, HardwareProfile.model_validate(d)


def _cells(idle_err: float):
    """Rows as calibrate writes them, made by the sim on a profile with ``TRUE``; the idle
    cells ``idle_err`` slower a page than the sim throughout, the busy ones too."""
    _, p = _profile(TRUE)
    work = kind_works(p)["gemm"]
    rows, copies = [], []
    for page in (64 * KiB, 256 * KiB):
        for dr in ("h2d", "d2h"):
            k = (128 * MiB) // page
            row = {"kind": "gemm", "compute_s": 0.03, "path": "copy_engine", "dir": dr, "page": page,
                   "pages": k, "bytes": k * page, "batches": [[dr, k]], "work": list(work), "device": "gpu"}
            row["copy_s"] = sim_cell(p, row, 0.03, work)[0] + k * idle_err
            rows.append(row)
            n = (1 << 30) // page
            c = {"page": page, "path": "copy_engine", "dir": dr, "pages": n, "bytes": n * page,
                 "batches": [[dr, n]]}
            c["seconds"] = sim_cell(p, c)[0] + n * idle_err
            copies.append(c)
    return rows, copies


@pytest.mark.parametrize("idle_err", [0.0, 0.3e-6])
def test_the_fit_gives_back_the_cost_a_page(idle_err):
    rows, copies = _cells(idle_err)
    d, _ = _profile(None)
    why: dict[str, str] = {}
    fit_busy_per_page(rows, copies, d, why)
    for dr, want in TRUE.items():
        got = d["copy_engine"][f"busy_per_page_{dr}"]
        assert set(got) == set(want)
        for page, v in want.items():
            assert got[page] == pytest.approx(v, abs=2e-9)
        assert why[f"copy_engine.busy_per_page_{dr}"].startswith("measured: ")
    HardwareProfile.model_validate(d)  # (a profile again)


def test_without_cells_or_on_the_cpu_the_profile_keeps_its_own():
    rows, copies = _cells(0.0)
    for r in rows:
        r["device"] = "cpu"
    d, _ = _profile(TRUE)
    why: dict[str, str] = {}
    fit_busy_per_page(rows, copies, d, why)
    fit_busy_per_page([], copies, d, why)
    assert d["copy_engine"]["busy_per_page_h2d"] == TRUE["h2d"] and not why


def test_the_grid_is_one_way_copy_engine_copies_inside_their_compute():
    cells = busy_grid()
    assert {(c.dir, c.path, c.kind) for c in cells} == {("h2d", "copy_engine", "gemm"), ("d2h", "copy_engine", "gemm")}
    # each copy no longer than its compute at the slowest rate seen under a prefill (16 KiB
    # host -> GPU ~4.5 GB/s, the rest >= 25 GB/s)
    for c in cells:
        slow = 4.5e9 if c.page == 16 * KiB else 25e9
        assert c.dir_bytes / slow < c.compute_s


def test_a_refit_writes_the_fitted_cost_into_the_profile(tmp_path):
    """The shipped H200 calibration's report with busy rows put in for its copy-engine
    cells of 64 KiB and 1 MiB (each page 1 us slower under compute than the sim has it,
    beyond the idle cell's own error): the refitted profile carries ``busy_per_page``
    with its source; the report keeps the rows."""
    import json

    from kvsim.config.hardware import CONFIG_DIR
    from kvsim.tools.calibrate import refit

    shipped = CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml.report.json"
    report = json.loads(shipped.read_text())
    assert not report.get("busy_copies")  # (measured before calibrate's busy cells)
    refit(shipped, tmp_path / "p1.yaml")
    d = load_profile(tmp_path / "p1.yaml").model_dump()  # what the fit has before the busy
    d["copy_engine"].update(busy_per_page_h2d=None, busy_per_page_d2h=None)  # cost (the base's)
    base = HardwareProfile.model_validate(d)
    work = kind_works(base)["gemm"]
    rows = []
    for c in report["copies"]:
        if c["path"] != "copy_engine" or c["dir"] == "both" or c["page"] not in (64 * KiB, MiB):
            continue
        k = 256
        row = {"kind": "gemm", "compute_s": 0.03, "path": "copy_engine", "dir": c["dir"], "page": c["page"],
               "pages": k, "bytes": k * c["page"], "batches": [[c["dir"], k]], "work": list(work), "device": "gpu"}
        err = (c["seconds"] - sim_cell(base, c)[0]) / c["pages"]
        row["copy_s"] = sim_cell(base, row, 0.03, work)[0] + k * (err + 1e-6)
        rows.append(row)
    assert len(rows) == 4
    report["busy_copies"] = rows
    src = tmp_path / "with-busy.report.json"
    src.write_text(json.dumps(report))
    new = refit(src, tmp_path / "fitted.yaml")
    p = load_profile(tmp_path / "fitted.yaml")
    for r in rows:
        assert p.copy_engine.busy_per_page_for(r["dir"], r["page"]) == pytest.approx(1e-6, rel=0.01)
    assert new["why"]["copy_engine.busy_per_page_h2d"].startswith("measured: ")
    assert "#   copy_engine.busy_per_page_d2h: measured: " in (tmp_path / "fitted.yaml").read_text()
    assert new["busy_copies"] == rows
