"""The fit of the structural interference terms (kvsim.tools.fitkinds) on synthetic cells
made by the sim itself with known terms: the fit's fast predictor is the sim's own figure,
the fit gives back terms that predict every cell, and nothing where a kind has too few
cells."""

from __future__ import annotations

import pytest

from kvsim.config.hardware import load_profile
from kvsim.core.datapath.work import StepWork
from kvsim.core.spec import Level
from kvsim.engine.compute import ComputeModel, load_model
from kvsim.run.seam import settings_for
from kvsim.tools.fit import predict_cell
from kvsim.tools.fitkinds import (Cell, _structure, check_kind_terms, fit_cells, fit_interference,
                                  loss, part_rows, sim_cell)
from kvsim.tools.fitparts import fill_leads, hw_parts, report_parts

MiB = 1 << 20
BASE = load_profile("h200-pcie-calibrated")
TRUE = {"gemm": {"cta_sm_share_h2d": 0.5, "cta_sm_share_d2h": 1.5, "copy_engine_slowdown": 0.0,
                 "hbm_weight": 0.0, "hbm_write_weight": 1.0, "straggle_d2h": 1.0,
                 "straggle_h2d": 0.1, "issue_slowdown": 0.1, "backlog_d2h": 0.1},
        "memory": {"cta_sm_share_h2d": 0.05, "cta_sm_share_d2h": 1.0, "copy_engine_slowdown": 0.0,
                   "hbm_weight": 1.0, "hbm_write_weight": 4.0, "backlog_d2h": 0.05,
                   "page_d2h": 1e-7}}  # (every fitted term set: the base's do not leak in)
PROJ = [list(p) for p in settings_for(MiB, {Level.GPU: 1}, model="llama-3-8b").model.projections]


def _profile(kinds):
    d = BASE.model_dump()
    for kind, terms in kinds.items():  # (the base's busy shares kept: the copies' timing)
        d["sm"]["interference"][kind] = {**d["sm"]["interference"][kind], **terms}
    return type(BASE).model_validate(d)


TRUE_P = _profile(TRUE)


def _works():
    m = ComputeModel(load_model("llama-3-8b"), BASE)
    return {"gemm": m.step_work([(4096, 0)], 0, 0), "memory": m.decode_work(4, 4 * 32768),
            "mix": m.decode_work(256, 256 * 512)}


def _cells():
    """Cells of each kind on each path and direction, shorter and longer than the copies
    (16 KiB pages: copy-engine calls issuing host-bound); hw's stretch the sim's on TRUE."""
    rows = []
    for kind, w in _works().items():
        for path, d, page, n, compute_s in (
                ("sm_kernel", "both", MiB, 256, 0.02), ("sm_kernel", "h2d", MiB, 1024, 0.01),
                ("sm_kernel", "d2h", 4 * MiB, 64, 0.02), ("copy_engine", "both", 4 * MiB, 256, 0.01),
                ("copy_engine", "h2d", 16 << 10, 2048, 0.002), ("copy_engine", "d2h", MiB, 512, 0.01),
                ("sm_kernel", "d2h", 64 << 10, 4096, 0.005)):
            batches = [["h2d", n], ["d2h", n]] if d == "both" else [[d, n]]
            row = {"kind": kind, "compute_s": compute_s, "path": path, "dir": d, "page": page,
                   "batches": batches, "pages": n * len(batches), "bytes": n * len(batches) * page,
                   "alone_s": compute_s, "ctas": {"h2d": 36, "d2h": 14}, "work": list(w),
                   "projections": PROJ, "device": "gpu", "spread": 0.0}
            row["stretch"] = predict_cell(TRUE_P, row)[0]
            rows.append(row)
    return rows


def test_the_fits_predictor_is_the_sims_own_figure():
    s = TRUE_P.interference_structure()
    for row in _cells():
        assert Cell(BASE, row).stretch(s) == pytest.approx(row["stretch"], rel=1e-6, abs=1e-9)
    assert any(row["stretch"] > 0.05 for row in _cells() if row["path"] == "copy_engine"
               and row["page"] == 16 << 10)  # (the issue term is in the cells)
    # (and the reads' page term: 100 ns a page GPU -> host of 64 KiB, about 0.6 M a second)
    no_pages = _profile({"memory": {**TRUE["memory"], "page_d2h": 0.0}})
    row = next(r for r in _cells() if r["kind"] == "memory" and r["page"] == 64 << 10)
    assert row["stretch"] - predict_cell(no_pages, row)[0] > 0.03


def test_the_fit_gives_back_terms_that_predict_every_cell():
    rows = _cells()
    got, why = fit_interference(rows, BASE)
    assert set(got) == {"gemm", "memory"} and set(why) == {"sm.interference.gemm", "sm.interference.memory"}
    assert "21 cells (7 gemm, 7 memory, 7 mix" in why["sm.interference.gemm"]
    # written in seconds a page, about the true 100 ns (the cells cannot tell it from the
    # GPU -> host CTAs' SM share exactly)
    assert 2e-8 < got["memory"]["page_d2h"] < 5e-7
    fitted = _profile(got)
    for row in rows:
        # within the benchmark's rule (10% of the stretch), and close in absolute terms
        sim = predict_cell(fitted, row)[0]
        assert sim == pytest.approx(row["stretch"], rel=0.1, abs=5e-3), (row["kind"], row["path"], row["dir"])


def test_a_fit_starts_from_the_profiles_own_terms_too(monkeypatch):
    # the loss has many local minima: besides two flat starts, a search from the base's
    # own terms (fitted to many cells of the same GPU); the least loss wins
    import kvsim.tools.fitkinds as fk
    seen = []
    real = fk._nelder_mead

    def spy(f, x0, step, iters):
        seen.append(tuple(round(float(v), 6) for v in x0))
        return real(f, x0, step, 20)
    monkeypatch.setattr(fk, "_nelder_mead", spy)
    cells = [Cell(BASE, r) for r in _cells()]
    g, m, got = fit_cells(cells, TRUE_P)
    own = TRUE_P.interference_structure()
    want = tuple(round(getattr(t, k) / fk.SCALE.get(k, 1.0), 6)
                 for kind, t in (("gemm", own.gemm), ("memory", own.memory)) for k in fk.FITTED[kind])
    assert want in seen and tuple([0.3] * len(want)) in seen and tuple([1.0] * len(want)) in seen
    assert got <= loss(cells, own) + 1e-9   # (the truth's loss, 0: the search from it keeps it)


def test_a_cells_copy_starts_its_lead_after_the_compute():
    row = next(r for r in _cells() if r["kind"] == "mix" and r["path"] == "sm_kernel" and r["dir"] == "both")
    late = {**row, "copy_lead_s": 0.004}
    log0: list = []
    log1: list = []
    c0, _ = sim_cell(TRUE_P, row, 0.05, None, load_log=log0)
    c1, _ = sim_cell(TRUE_P, late, 0.05, None, load_log=log1)
    first0 = min(t for t, ld in log0 if not ld.idle)
    first1 = min(t for t, ld in log1 if not ld.idle)
    assert first1 - first0 == pytest.approx(0.004, abs=1e-6)   # the loads begin 4 ms later
    assert c1 == pytest.approx(c0, rel=0.02)   # the copy's own time counts from its start
    # a copy alone has no lead to wait for
    assert sim_cell(TRUE_P, late)[0] == pytest.approx(sim_cell(TRUE_P, row)[0])
    # and a compute over less of the copy loses less: the decode-like step's GEMMs come
    # first (the 8 ms copy started 8 ms in misses them)
    later = {**row, "copy_lead_s": 0.008}
    assert predict_cell(TRUE_P, later)[0] < predict_cell(TRUE_P, row)[0]


def test_cells_without_a_lead_take_the_reference_runs_by_kind_and_length():
    ref = [{"kind": "mix", "compute_s": t, "copy_lead_s": x}
           for t, x in ((0.01, 0.001), (0.01, 0.003), (0.02, 0.004), (0.05, 0.010))]
    rows = [{"kind": "mix", "compute_s": 0.01}, {"kind": "mix", "compute_s": 0.03},
            {"kind": "mix", "compute_s": 0.08}, {"kind": "mix", "compute_s": 0.002},
            {"kind": "mix", "compute_s": 0.02, "copy_lead_s": 0.5}, {"kind": "gemm", "compute_s": 0.02}]
    assert fill_leads(rows, ref) == 4
    assert rows[0]["copy_lead_s"] == pytest.approx(0.002)   # the median at its length
    assert rows[1]["copy_lead_s"] == pytest.approx(0.006)   # linear between lengths
    assert rows[2]["copy_lead_s"] == pytest.approx(0.010)   # the nearest beyond them
    assert rows[3]["copy_lead_s"] == pytest.approx(0.002)
    assert rows[4]["copy_lead_s"] == 0.5 and "copy_lead_s" not in rows[5]  # its own; no reference


def test_too_few_cells_of_a_kind_fit_nothing():
    rows = [r for r in _cells() if r["kind"] != "memory"]
    assert fit_interference(rows, BASE) == ({}, {})
    assert _structure(BASE, TRUE_P.interference_structure().gemm,
                      TRUE_P.interference_structure().memory).sms == BASE.sm.count


def test_calibrate_writes_the_kinds_and_the_standins_rates(tmp_path):
    """A CPU calibration's report with GPU interference cells and the stand-in's rates put
    in (as a GPU's would hold them), refitted offline: the profile gets the structural
    terms and the efficiencies of the stand-in's GEMMs (largest M) and reads, each line
    saying where it came from; the sim then stretches a step by them."""
    import json

    from kvsim.tools.calibrate import calibrate, refit

    out = tmp_path / "cpu.yaml"
    calibrate(out, device="cpu")
    rep = json.loads((tmp_path / "cpu.yaml.report.json").read_text())
    rep["interference"] = _cells()
    rep["compute"]["standin"] = {"gemm_flops": {"128": 3e14, "8192": 7.9e14}, "read_Bps": 4.0e12,
                                 "chain_s": {}, "read_buffer_bytes": 256 * MiB}
    src = tmp_path / "gpu-like.yaml.report.json"
    src.write_text(json.dumps(rep))
    refit(src, tmp_path / "again.yaml")
    prof = load_profile(tmp_path / "again.yaml")
    text = (tmp_path / "again.yaml").read_text()
    i = prof.sm.interference
    assert i.gemm is not None and i.memory is not None
    assert "sm.interference.memory: fitted: 21 cells (7 gemm, 7 memory, 7 mix" in text
    assert prof.gpu.prefill_efficiency == pytest.approx(7.9e14 / prof.gpu.flops_bf16)
    assert prof.gpu.decode_efficiency == pytest.approx(4.0e12 / prof.gpu.hbm)
    assert prof.gpu.gemm_flops == {128: 3e14, 8192: 7.9e14}
    assert "gpu.gemm_flops: measured" in text
    assert "compute stand-in's fp16 GEMM chains at M = 8192" in text
    # --kind-terms keep: the base's terms as they were, the comment with both counts
    refit(src, tmp_path / "kept.yaml", base="h200-pcie-calibrated", kind_terms="keep")
    kept = load_profile(tmp_path / "kept.yaml").sm.interference
    assert kept.gemm.terms() == BASE.sm.interference.gemm.terms()
    assert kept.memory.terms() == BASE.sm.interference.memory.terms()
    assert ("sm.interference.gemm: base: h200-pcie-calibrated's, kept (--kind-terms keep); on this "
            "machine's 21 cells") in (tmp_path / "kept.yaml").read_text()


def test_keep_leaves_the_bases_terms_and_counts_both_sets():
    """``keep``: no keys set; the comment counts the cells the base's terms put within
    (here the very terms that made them: all) beside a fit's. Fitting, the comment counts
    the base's too. A base without kind terms cannot be kept."""
    rows = _cells()
    got, why = fit_interference(rows, TRUE_P, keep=True)
    assert got == {}
    w = why["sm.interference.gemm"]
    assert w.startswith(f"base: {TRUE_P.name}'s, kept (--kind-terms keep)")
    assert f"{TRUE_P.name}'s terms: gemm 7 of 7, memory 7 of 7, mix 7 of 7; a fit of" in w
    _, why = fit_interference(rows, BASE)
    assert why["sm.interference.memory"].startswith("fitted: 21 cells")
    assert f"; {BASE.name}'s terms: gemm " in why["sm.interference.memory"]
    d = BASE.model_dump()
    d["sm"]["interference"]["gemm"] = d["sm"]["interference"]["memory"] = None
    bare = type(BASE).model_validate(d)
    with pytest.raises(ValueError, match="has no sm.interference.gemm and .memory terms to keep"):
        fit_interference(rows, bare, keep=True)
    with pytest.raises(ValueError, match="has no sm.interference.gemm and .memory terms to keep"):
        check_kind_terms("keep", bare)
    with pytest.raises(ValueError, match="--kind-terms both: expected fit or keep"):
        check_kind_terms("both", BASE)
    check_kind_terms("fit", bare)  # (fitting needs no base terms)


def _mix_both(lead: float = 0.0) -> dict:
    """The mix under 1 GiB each way of 1 MiB pages on the SM kernel (longer than its 20 ms:
    both parts under the copy), hw's stretch the sim's on TRUE."""
    row = next(r for r in _cells() if r["kind"] == "mix" and r["path"] == "sm_kernel" and r["dir"] == "both")
    row = {**row, "copy_lead_s": lead, "batches": [["h2d", 1024], ["d2h", 1024]], "pages": 2048,
           "bytes": 2048 * MiB}
    row["stretch"] = predict_cell(TRUE_P, row)[0]
    return row


def test_a_steps_parts_stretch_by_the_time_each_takes():
    """The decode-like mix (GEMMs, then reads) under a copy both ways on the SM kernel:
    each part's stretch, weighted by its nominal share, is the whole step's; a copy that
    starts after the GEMM part slows the reads alone."""
    s = TRUE_P.interference_structure(page_bytes=MiB)
    c = Cell(BASE, _mix_both())
    g, r = c.parts(s)
    assert g > 0.05 and r > 0.0
    assert c.share * (1 + g) + (1 - c.share) * (1 + r) - 1 == pytest.approx(c.stretch(s), rel=1e-9)
    late = Cell(BASE, _mix_both(lead=c.seconds * c.share + 1e-4))  # (after the GEMM part)
    g2, r2 = late.parts(s)
    assert g2 == pytest.approx(0.0, abs=1e-12) and r2 > 0.0
    # a step of GEMMs alone has no reads part
    gemm = next(x for x in _cells() if x["kind"] == "gemm" and x["path"] == "sm_kernel")
    whole = Cell(BASE, {**gemm, "work": list(StepWork(*gemm["work"])._replace(memory_s=0.0))})
    assert whole.parts(s)[1] is None


def test_a_cell_timed_in_parts_is_fitted_by_its_parts():
    """Two parts that err in opposite ways can sum to the whole step's stretch: judged as a
    whole the cell fits, judged by the parts hw timed apart it does not."""
    s = TRUE_P.interference_structure(page_bytes=MiB)
    row = _mix_both()
    c0 = Cell(BASE, row)
    g, r = c0.parts(s)
    assert loss([c0], s) == pytest.approx(0.0, abs=1e-9)  # (hw's stretch: the sim's own)
    right = {**row, "gemm_part_stretch": g, "reads_part_stretch": r,
             "gemm_part_spread": 0.0, "reads_part_spread": 0.0}
    assert hw_parts(right) == {"gemm": (g, 0.0), "reads": (r, 0.0)}
    assert loss([Cell(BASE, right)], s) == pytest.approx(0.0, abs=1e-9)
    # the GEMM part 0.05 slower, the reads as much faster as keeps the whole step's time
    dg = 0.05
    wrong = {**right, "gemm_part_stretch": g + dg,
             "reads_part_stretch": r - dg * c0.share / (1 - c0.share)}
    cw = Cell(BASE, wrong)
    assert cw.share * (1 + g + dg) + (1 - cw.share) * (1 + wrong["reads_part_stretch"]) - 1 \
        == pytest.approx(row["stretch"], rel=1e-9)
    def rho(z):  # (the fit's robust loss of an error in tolerances)
        return z * z if z < 1 else 2 * z - 1
    dr = dg * c0.share / (1 - c0.share)
    want = 0.5 * rho(dg / max(0.1 * abs(g + dg), 0.003)) + 0.5 * rho(dr / max(0.1 * abs(r - dr), 0.003))
    assert want > 0.2 and loss([cw], s) == pytest.approx(want, rel=1e-6)
    # one part alone is not a cell timed in parts
    assert hw_parts({**row, "gemm_part_stretch": g}) == {}


def test_the_parts_table_counts_each_part_within(capsys):
    row = _mix_both()
    s = BASE.interference_structure(page_bytes=MiB)
    g, r = Cell(BASE, row).parts(s)
    rows = [{**row, "gemm_part_stretch": g, "reads_part_stretch": r * 2 + 0.05,
             "gemm_part_spread": 0.0, "reads_part_spread": 0.0},
            {**row, "device": "cpu", "gemm_part_stretch": g, "reads_part_stretch": r},
            {k: v for k, v in row.items()}]  # (no parts: not in the table)
    got = part_rows(rows, BASE)
    assert len(got) == 1 and got[0][1]["gemm"] == pytest.approx((g, 0.0, g))
    assert report_parts(got) == {"gemm": (1, 1), "reads": (0, 1)}
    out = capsys.readouterr().out
    assert f"gemm {g * 100:+.1f}% / {g * 100:+.1f}%" in out
    assert "each part within 10% of hw's or its spread: gemm part: 1 of 1; reads part: 0 of 1" in out
    assert report_parts([]) == {}
