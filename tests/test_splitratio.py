"""``kvsim.tools.splitratio``: the split grid's stretch with 8 GPU -> host CTAs over that
with 4, hw's (median of its runs) against the sim's."""

from __future__ import annotations

import pytest

from kvsim.tools.splitratio import split_ratios, split_text


def _row(kind, d2h, stretch, sim, page=65536, **kw):
    return {"kind": kind, "path": "sm_kernel", "dir": "both", "page": page, "dir_bytes": 1 << 30,
            "compute_s": 0.02, "sm_ctas": None, "sm_ctas_d2h": d2h, "stretch": stretch,
            "sim": sim, "device": "gpu", **kw}


def test_ratio_of_hw_medians_against_the_sims():
    rows = [_row("gemm", 4, s, 0.30) for s in (0.20, 0.25, 0.90)]        # median 0.25
    rows += [_row("gemm", 8, s, 0.36) for s in (0.50, 0.55, 0.10)]       # median 0.50
    rows += [_row("mix", 4, 0.10, 0.15), _row("mix", 8, 0.40, 0.25)]
    got = split_ratios(rows, lambda r: r["sim"])
    assert got["gemm"] == [pytest.approx((2.0, 1.2))]
    assert got["mix"] == [pytest.approx((4.0, 25 / 15))]
    text = split_text(got)
    assert "gemm hw x2.00, the sim x1.20 (1 copies)" in text and "mix hw x4.00" in text


def test_only_complete_gpu_pairs_of_the_same_copy():
    rows = [_row("gemm", 4, 0.2, 0.3), _row("gemm", 8, 0.4, 0.3, page=1 << 20),  # pages differ
            _row("memory", 4, 0.1, 0.1, device="cpu"), _row("memory", 8, 0.2, 0.2, device="cpu"),
            _row("mix", 4, 0.0, 0.1), _row("mix", 8, 0.2, 0.2),                 # no ratio at 0
            _row("gemm", 14, 0.3, 0.3), {**_row("gemm", 8, 0.4, 0.3), "dir": "d2h"}]
    assert split_ratios(rows, lambda r: r["sim"]) == {}
