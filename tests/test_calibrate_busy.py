"""``kvsim calibrate`` fits what copies take longer under a prefill from its busy cells
(``kvsim_backends.hw.interfere.busy_grid``): the copy engine's cost a page
(``copy_engine.busy_per_page_*``) and the SM kernel's per-CTA share
(``sm.interference.busy_cta_efficiency``; its later start, ``busy_start``, is written 0 and
what the cells leave beyond the share reported). Cells the sim itself made with known
terms give those terms back, the idle cells' own error taken out; without such cells the
profile keeps its own."""

from __future__ import annotations

import pytest

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.core.datapath.pathcost import cost_inputs
from kvsim.tools.fitbusy import fit_busy_per_page, fit_busy_sm
from kvsim.tools.fitkinds import kind_works, sim_cell
from kvsim_backends.hw.interfere import FEW_CTAS, busy_grid

KiB, MiB = 1 << 10, 1 << 20
TRUE = {"h2d": {64 * KiB: 0.9e-6, 256 * KiB: 0.1e-6}, "d2h": {64 * KiB: 0.6e-6, 256 * KiB: 0.7e-6}}


def _profile(tables):
    d = load_profile("h200-pcie-calibrated").model_dump()
    # (no most beside GEMMs: these cells are about the shares; tests/test_busy_most.py)
    d["sm"]["interference"]["gemm"]["busy_rate_d2h"] = None
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


def test_the_grid_is_one_way_copies_on_each_path_inside_their_compute():
    cells = busy_grid()
    assert {(c.dir, c.path, c.kind) for c in cells} == {
        (d, p, "gemm") for d in ("h2d", "d2h") for p in ("copy_engine", "sm_kernel")}
    assert {c.page for c in cells if c.path == "sm_kernel"} == {256 * KiB, MiB}
    assert len({c.dir_bytes for c in cells if c.path == "sm_kernel" and not c.sm_ctas}) == 2
    # and one cell each way of CTAs too few to fill the link, inside the compute at a share
    # of 0.3 of the H200's idle per-CTA rates (so that the share itself shows)
    few = {c.dir: c for c in cells if c.sm_ctas}
    assert set(few) == {"h2d", "d2h"} and all(c.page == MiB for c in few.values())
    p = load_profile("h200-pcie-calibrated")
    for dr, c in few.items():
        per = p.sm.cta_rate(dr, MiB)
        assert c.sm_ctas * per < p.sm_ceiling(dr)  # (under the link when idle)
        assert c.dir_bytes / (0.3 * c.sm_ctas * per) < c.compute_s
    # each copy no longer than its compute at the slowest rate seen under a prefill (16 KiB
    # host -> GPU ~4.5 GB/s, the rest >= 25 GB/s; the SM kernel 46-52 GB/s after a start
    # of at most 2 ms)
    for c in cells:
        slow = 4.5e9 if c.page == 16 * KiB else 25e9
        assert c.dir_bytes / slow + (0.002 if c.path == "sm_kernel" else 0.0) < c.compute_s


def _plain(d: dict) -> dict:
    """``d`` without the structural model's kinds: one busy share for every compute."""
    d["sm"]["interference"].update(gemm=None, memory=None)
    return d


def _shares(d: dict, kinds: bool) -> dict:
    """Where the fit writes the busy shares: the GEMM kind's, or the one for all."""
    i = d["sm"]["interference"]
    return i["gemm"] if kinds else i


def _sm_cells(start: float, eff: float, idle_err: float, eff_d2h: float | None = None,
              kinds: bool = True, few: bool = False, most: float | None = None):
    """SM-kernel rows as calibrate writes them, made by the sim on a profile with the busy
    ``start`` and per-CTA shares ``eff`` (``eff_d2h``: GPU -> host's, None: the same), the
    GEMM kind's (``kinds``) or the one for all; idle and busy cells ``idle_err`` slower a
    byte; ``few``: also ``busy_grid``'s cells of CTAs too few to fill the link."""
    d, _ = _profile(None)
    if not kinds:
        _plain(d)
    d["sm"]["interference"]["busy_start"] = start
    _shares(d, kinds).update(busy_cta_efficiency=eff, busy_cta_efficiency_d2h=eff_d2h)
    if most is not None:  # (the most GPU -> host CTAs move together beside GEMMs)
        d["sm"]["interference"]["gemm"]["busy_rate_d2h"] = most
    p = HardwareProfile.model_validate(d)
    work = kind_works(p)["gemm"]
    rows, copies = [], []
    cells = [(page, nbytes, dr, None) for page, nbytes in
             ((256 * KiB, 256 * MiB), (MiB, 64 * MiB), (MiB, 256 * MiB)) for dr in ("h2d", "d2h")]
    if few:
        cells += [(MiB, nbytes, dr, n) for dr, (n, nbytes) in FEW_CTAS.items()]
    for page, nbytes, dr, n_ctas in cells:
        ctas = dict(cost_inputs(p, page, None).ctas_one)
        k = nbytes // page
        row = {"kind": "gemm", "compute_s": 0.03, "path": "sm_kernel", "dir": dr, "page": page,
               "pages": k, "bytes": k * page, "batches": [[dr, k]], "work": list(work),
               "ctas": ctas, "device": "gpu", "sm_ctas": n_ctas}
        row["copy_s"] = sim_cell(p, row, 0.03, work)[0] + k * page * idle_err
        rows.append(row)
        if n_ctas is None:  # (the idle cells: the backend's own CTAs, 1 GiB)
            n = (1 << 30) // page
            c = {"page": page, "path": "sm_kernel", "dir": dr, "pages": n, "bytes": n * page,
                 "batches": [[dr, n]], "ctas": ctas}
            c["seconds"] = sim_cell(p, c)[0] + n * page * idle_err
            copies.append(c)
    return rows, copies


@pytest.mark.parametrize("kinds", [True, False])
@pytest.mark.parametrize("idle_err", [0.0, 2e-12])
def test_the_sm_kernel_fit_gives_back_its_shares_and_reports_a_fixed_cost(idle_err, kinds):
    """Shares low enough to bind (0.35 host -> GPU, 0.25 back: below the link) come back
    from cells with a fixed cost of 1.2 ms a batch, the GEMM kind's on a profile with the
    kinds (the reads' left as they were: the cells run a prefill), else the one for all;
    the cost is reported, not written as a later start (the start probe finds none that
    long); with a share that does not bind, a lower bound."""
    rows, copies = _sm_cells(1.2e-3, 0.35, idle_err, eff_d2h=0.25, kinds=kinds)
    d, _ = _profile(None)
    if not kinds:
        _plain(d)
    d["sm"]["interference"]["busy_start"] = 0.0
    _shares(d, kinds)["busy_cta_efficiency"] = 0.9  # (the base's, to be fitted again)
    before = dict(d["sm"]["interference"])
    why: dict[str, str] = {}
    fit_busy_sm(rows, copies, d, why)
    got = _shares(d, kinds)
    assert d["sm"]["interference"]["busy_start"] == 0.0
    assert "median 1.200 ms a batch" in why["sm.interference.busy_start"]
    assert got["busy_cta_efficiency"] == pytest.approx(0.35, rel=0.01)
    assert got["busy_cta_efficiency_d2h"] == pytest.approx(0.25, rel=0.01)
    spec = HardwareProfile.model_validate(d).sm.interference
    if kinds:
        reads = (before["busy_cta_efficiency"], before["busy_cta_efficiency_d2h"])
        gemm, mem = spec.kind_busy() or ((0.0, 0.0), (0.0, 0.0))
        assert gemm == pytest.approx((0.35, 0.25), rel=0.01) and mem == reads
        for key in ("busy_cta_efficiency", "busy_cta_efficiency_d2h"):
            assert d["sm"]["interference"][key] == before[key]
            assert why[f"sm.interference.gemm.{key}"].startswith("fitted: ")
    else:
        assert spec.busy_eff() == pytest.approx((0.35, 0.25), rel=0.01) and spec.kind_busy() is None
        assert why["sm.interference.busy_cta_efficiency_d2h"].startswith("fitted: ")
    assert why["sm.interference.busy_start"].startswith("measured elsewhere ")
    rows, copies = _sm_cells(0.5e-3, 1.0, idle_err, kinds=kinds)  # (at the link: the share cannot show)
    d, _ = _profile(None)
    if not kinds:
        _plain(d)
    fit_busy_sm(rows, copies, d, why)
    assert d["sm"]["interference"]["busy_start"] == 0.0
    assert "median 0.500 ms a batch" in why["sm.interference.busy_start"]
    assert _shares(d, kinds)["busy_cta_efficiency"] <= 1.0


def test_cells_of_few_ctas_show_a_share_the_link_hides():
    """Shares above what the backend's own CTAs need to fill the link (0.9 host -> GPU,
    0.88 back, as 4 GPU -> host CTAs moved beside GEMMs on H200s): its cells fit any share
    above a lower bound alike, so from them alone the fit writes that bound, or keeps the
    base's own share where it fits as well; the cells of few CTAs show the share itself."""
    rows, copies = _sm_cells(0.7e-3, 0.9, 0.0, eff_d2h=0.88)
    d, _ = _profile(None)
    _shares(d, True).update(busy_cta_efficiency=0.3, busy_cta_efficiency_d2h=0.3)  # (a base's)
    why: dict[str, str] = {}
    fit_busy_sm(rows, copies, d, why)
    lo = (_shares(d, True)["busy_cta_efficiency"], _shares(d, True)["busy_cta_efficiency_d2h"])
    assert lo[0] < 0.85 and lo[1] < 0.86   # a lower bound, not the share
    assert why["sm.interference.gemm.busy_cta_efficiency_d2h"].startswith("fitted: ")
    # the base's own share (measured where the link does not bind), above the bound: kept
    d, _ = _profile(None)
    _shares(d, True).update(busy_cta_efficiency=0.9, busy_cta_efficiency_d2h=0.88)
    fit_busy_sm(rows, copies, d, why)
    assert (_shares(d, True)["busy_cta_efficiency"], _shares(d, True)["busy_cta_efficiency_d2h"]) \
        == (0.9, 0.88)
    assert why["sm.interference.gemm.busy_cta_efficiency_d2h"].startswith("kept: the base's")
    # ... and a base below the bound is not (the cells rule it out)
    d, _ = _profile(None)
    _shares(d, True).update(busy_cta_efficiency=0.1, busy_cta_efficiency_d2h=0.1)
    fit_busy_sm(rows, copies, d, why)
    assert _shares(d, True)["busy_cta_efficiency_d2h"] == pytest.approx(lo[1])
    # with the grid's cells of few CTAs the shares come back whatever the base's
    rows, copies = _sm_cells(0.7e-3, 0.9, 0.0, eff_d2h=0.88, few=True)
    d, _ = _profile(None)
    _shares(d, True).update(busy_cta_efficiency=0.3, busy_cta_efficiency_d2h=0.3)
    fit_busy_sm(rows, copies, d, why)
    assert _shares(d, True)["busy_cta_efficiency"] == pytest.approx(0.9, abs=0.006)
    assert _shares(d, True)["busy_cta_efficiency_d2h"] == pytest.approx(0.88, abs=0.006)
    assert d["sm"]["interference"]["busy_start"] == 0.0
    assert "median 0.700 ms a batch" in why["sm.interference.busy_start"]


def test_the_sm_kernel_fit_needs_its_cells():
    rows, copies = _sm_cells(1.2e-3, 0.3, 0.0)
    d, _ = _profile(None)
    before = dict(d["sm"]["interference"])
    why: dict[str, str] = {}
    fit_busy_sm([dict(r, device="cpu") for r in rows], copies, d, why)
    fit_busy_sm(rows, [], d, why)
    assert d["sm"]["interference"] == before and not why


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


def test_the_busy_cells_keep_the_median_round_of_each():
    """Three rounds of two cells: each cell's row is the round of its median copy time,
    with every round's time beside it (one backend's copies may move 27 GB/s under a
    prefill, the next one's 38)."""
    from kvsim_backends.hw.interfere import median_rounds

    def row(name, copy_s, stretch):
        return {"name": name, "copy_s": copy_s, "stretch": stretch}

    rounds = [[row("a", 3.0, 0.1), row("b", 1.0, 0.4)],
              [row("a", 1.0, 0.2), row("b", 2.0, 0.5)],
              [row("a", 2.0, 0.3), row("b", 9.0, 0.6)]]
    a, b = median_rounds(rounds)
    assert (a["copy_s"], a["stretch"], a["copy_rounds"]) == (2.0, 0.3, [3.0, 1.0, 2.0])
    assert (b["copy_s"], b["stretch"], b["copy_rounds"]) == (2.0, 0.5, [1.0, 2.0, 9.0])
    two = median_rounds(rounds[:2])  # (an even count: the lower middle)
    assert [r["copy_s"] for r in two] == [1.0, 1.0]


def test_the_reads_share_comes_back_from_the_reads_cells():
    """Calibrate's reads cells GPU -> host on the SM kernel (a grid cell at the backend's
    CTAs, a sweep's 4 and 36), made by the sim at a known share, give that share back,
    as both the busy and the drain share; a cell of another kind, path or direction
    plays no part; a profile without the kinds keeps its own."""
    from kvsim.tools.fitbusy import fit_reads_share

    d = load_profile("h200-pcie-calibrated").model_dump()
    d["sm"]["interference"].update(busy_cta_efficiency_d2h=0.6, drain_cta_efficiency_d2h=0.6)
    p = HardwareProfile.model_validate(d)
    work = kind_works(p)["memory"]
    rows = []
    for compute_s, n_bytes, ctas in ((0.02, 1 << 30, {"h2d": 34, "d2h": 6}), (0.04, 2 << 30, 4), (0.04, 3 << 30, 36)):
        k = n_bytes // MiB
        row = {"kind": "memory", "compute_s": compute_s, "path": "sm_kernel", "dir": "d2h", "page": MiB,
               "pages": k, "bytes": n_bytes, "batches": [["d2h", k]], "work": list(work), "device": "gpu"}
        row.update({"ctas": ctas} if isinstance(ctas, dict) else {"sm_ctas": ctas, "ctas": {"h2d": ctas, "d2h": ctas}})
        row["copy_s"] = sim_cell(p, row, compute_s, work)[0]
        rows.append(row)
    others = [dict(rows[0], kind="gemm", copy_s=1.0), dict(rows[0], dir="h2d", batches=[["h2d", 1024]], copy_s=1.0)]
    start = load_profile("h200-pcie-calibrated").model_dump()
    why: dict[str, str] = {}
    fit_reads_share(rows + others, start, why)
    i = start["sm"]["interference"]
    assert i["busy_cta_efficiency_d2h"] == pytest.approx(0.6, abs=0.006)
    assert i["drain_cta_efficiency_d2h"] == i["busy_cta_efficiency_d2h"]
    assert "3 cells at 4, 6, 36 CTAs" in why["sm.interference.busy_cta_efficiency_d2h"]
    # no kinds: the one share is every compute's, fitted under a prefill; left alone
    plain = load_profile("h200-pcie-calibrated").model_dump()
    plain["sm"]["interference"].update(gemm=None, memory=None)
    before = dict(plain["sm"]["interference"])
    fit_reads_share(rows, plain, {})
    assert plain["sm"]["interference"] == before


def test_the_most_beside_gemms_comes_back_at_the_bases_share():
    """Cells of one CTA count cannot tell a lower share from a most: made at a share of
    0.88 and a most of 28 GB/s, they fit a share of their own (about 28 GB/s over the
    CTAs' idle rate) and no most alike; from a base of 0.88 (measured where the most does
    not bind) and another most, the fit keeps 0.88 and gives the most back. A base
    without a most gets none."""
    from kvsim.tools.fitbusy import fit_busy_most

    rows, copies = _sm_cells(0.7e-3, 0.37, 0.0, eff_d2h=0.88, most=28e9)
    d, _ = _profile(None)
    _shares(d, True).update(busy_cta_efficiency=0.37, busy_cta_efficiency_d2h=0.88)
    d["sm"]["interference"]["gemm"]["busy_rate_d2h"] = 40e9
    why: dict[str, str] = {}
    fit_busy_sm(rows, copies, d, why)
    alone = _shares(d, True)["busy_cta_efficiency_d2h"]
    assert alone < 0.7  # (the cells alone: a lower share, the most at 40 GB/s not binding)
    fit_busy_most(rows, copies, d, why, 0.88)
    assert _shares(d, True)["busy_cta_efficiency_d2h"] == 0.88
    assert _shares(d, True)["busy_rate_d2h"] == pytest.approx(28e9, abs=0.15e9)
    assert why["sm.interference.gemm.busy_rate_d2h"].startswith("fitted: ")
    assert why["sm.interference.gemm.busy_cta_efficiency_d2h"].startswith("kept: the base's")
    d, _ = _profile(None)  # (no most)
    why = {}
    fit_busy_most(rows, copies, d, why, 0.88)
    assert _shares(d, True)["busy_rate_d2h"] is None and not why
