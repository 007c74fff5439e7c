"""The fit of the structural interference terms (kvsim.tools.fitkinds) on synthetic cells
made by the model itself with known terms: the fit gives back terms that predict every
cell, the memory kind's terms themselves, and nothing where a kind has too few cells."""

from __future__ import annotations

import pytest

from kvsim.config.hardware import load_profile
from kvsim.core.datapath.interference import KindTerms, Structure
from kvsim.core.spec import Level
from kvsim.engine.compute import ComputeModel, load_model
from kvsim.run.seam import settings_for
from kvsim.tools.fitkinds import _mix, cell_load, fit_interference, observed_slowdown

MiB = 1 << 20
BASE = load_profile("h200-pcie-calibrated")
TRUE = Structure(132, BASE.gpu.hbm * BASE.gpu.decode_efficiency, (128, 256),
                 gemm=KindTerms(0.25, 1.0, 0.02, 1.0),
                 memory=KindTerms(0.1, 0.1, 0.01, 1.0))
PROJ = [list(p) for p in settings_for(MiB, {Level.GPU: 1}, model="llama-3-8b").model.projections]


def _works():
    m = ComputeModel(load_model("llama-3-8b"), BASE)
    return {"gemm": m.step_work([(4096, 0)], 0, 0), "memory": m.decode_work(4, 4 * 32768),
            "mix": m.decode_work(256, 256 * 512)}


def _row(kind, work, path, d, copy_s, nbytes, alone=0.02, ctas=None):
    batches = [["h2d", 1], ["d2h", 1]] if d == "both" else [[d, 1]]
    row = {"kind": kind, "compute_s": alone, "path": path, "dir": d, "page": MiB,
           "batches": batches, "bytes": nbytes, "copy_s": copy_s, "alone_s": alone,
           "ctas": ctas or {"h2d": 36, "d2h": 14}, "work": list(work), "projections": PROJ,
           "device": "gpu"}
    s = TRUE.stretch(*_mix(row, TRUE), cell_load(row))
    full = alone * (1 + s)
    row["with_s"] = full if copy_s >= full else alone + copy_s * s / (1 + s)
    row["stretch"] = row["with_s"] / alone - 1
    return row, s


def _cells():
    rows = []
    for kind, w in _works().items():
        for path, d, copy_s, gbps in (("sm_kernel", "both", 0.040, 61), ("sm_kernel", "h2d", 0.040, 50),
                                      ("sm_kernel", "d2h", 0.030, 51), ("sm_kernel", "both", 0.008, 61),
                                      ("copy_engine", "both", 0.045, 90), ("copy_engine", "h2d", 0.050, 5),
                                      ("copy_engine", "d2h", 0.010, 50)):
            rows.append(_row(kind, w, path, d, copy_s, int(gbps * 1e9 * copy_s)))
    return rows


def test_the_observed_slowdown_inverts_the_fluid():
    for row, s in _cells():
        assert observed_slowdown(row) == pytest.approx(s, rel=1e-9, abs=1e-12)


def test_the_fit_gives_back_terms_that_predict_every_cell():
    rows = [r for r, _ in _cells()]
    got, why = fit_interference(rows, BASE)
    assert set(got) == {"gemm", "memory"} and set(why) == {"sm.interference.gemm", "sm.interference.memory"}
    fitted = Structure(TRUE.sms, TRUE.hbm_Bps, TRUE.tile, KindTerms(**got["gemm"]), KindTerms(**got["memory"]))
    for row, s in _cells():
        assert fitted.stretch(*_mix(row, fitted), cell_load(row)) == pytest.approx(s, abs=2e-3), row["kind"]
    # the memory kind is continuous in its shares: they come back themselves
    assert got["memory"]["cta_sm_share_h2d"] == pytest.approx(0.1, abs=0.025)
    assert got["memory"]["cta_sm_share_d2h"] == pytest.approx(0.1, abs=0.025)
    assert got["memory"]["copy_engine_slowdown"] == pytest.approx(0.01, abs=2e-3)


def test_too_few_cells_of_a_kind_fit_nothing():
    rows = [r for r, _ in _cells() if r["kind"] != "memory"]
    assert fit_interference(rows, BASE) == ({}, {})


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
    rep["interference"] = [r for r, _ in _cells()]
    rep["compute"]["standin"] = {"gemm_flops": {"128": 3e14, "8192": 7.9e14}, "read_Bps": 4.0e12,
                                 "chain_s": {}, "read_buffer_bytes": 256 * MiB}
    src = tmp_path / "gpu-like.yaml.report.json"
    src.write_text(json.dumps(rep))
    refit(src, tmp_path / "again.yaml")
    prof = load_profile(tmp_path / "again.yaml")
    text = (tmp_path / "again.yaml").read_text()
    i = prof.sm.interference
    assert i.gemm is not None and i.memory is not None
    assert i.memory.cta_sm_share_h2d == pytest.approx(0.1, abs=0.025)
    assert "sm.interference.memory: fitted: 7 memory cells" in text
    assert prof.gpu.prefill_efficiency == pytest.approx(7.9e14 / prof.gpu.flops_bf16)
    assert prof.gpu.decode_efficiency == pytest.approx(4.0e12 / prof.gpu.hbm)
    assert "compute stand-in's fp16 GEMM chains at M = 8192" in text
