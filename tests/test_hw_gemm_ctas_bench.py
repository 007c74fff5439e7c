"""benchmarks/hw_gemm_ctas.py: the figure it prints last (FLOP-weighted stretch of the
prefill's projections at 4 CTAs, each order) and its refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hw_gemm_ctas  # noqa: E402


def _cell(m, k, n, c, order, stretch):
    return {"m": m, "k": k, "n": n, "ctas": c, "order": order, "stretch": stretch}


def test_the_figure_weights_each_projection_by_its_flops():
    cells = [_cell(4096, 4096, 4096, 4, "during", 0.2), _cell(4096, 4096, 12288, 4, "during", 0.1),
             _cell(4096, 4096, 4096, 4, "before", 0.4), _cell(256, 4096, 4096, 4, "during", 0.9),
             _cell(4096, 4096, 4096, 8, "during", 0.7)]
    assert hw_gemm_ctas.weighted(cells, 4096, 4, "during") == pytest.approx((0.2 * 1 + 0.1 * 3) / 4)
    assert hw_gemm_ctas.weighted(cells, 4096, 4, "before") == pytest.approx(0.4)
    assert hw_gemm_ctas.weighted(cells, 4096, 2, "during") is None


def test_bad_arguments_exit_2_naming_them(capsys):
    with pytest.raises(SystemExit) as e:
        hw_gemm_ctas.main(["--rows", "256,x"])
    assert e.value.code == 2
    assert "--rows and --ctas take comma-separated integers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        hw_gemm_ctas.main(["--profile", "no-such-profile"])
    assert e.value.code == 2


def test_without_a_gpu_it_says_so_and_exits_2(capsys):
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        pytest.skip("a GPU is here")
    except Exception:
        pass
    with pytest.raises(SystemExit) as e:
        hw_gemm_ctas.main(["--rows", "256", "--ctas", "1"])
    assert e.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def _profile():
    from kvsim.config.hardware import load_profile
    return load_profile("h200-pcie-calibrated")


def test_the_sim_beside_a_cell_is_the_structural_models_gemm_part():
    from kvsim.core.datapath.interference import CopyLoad, hbm_exposure
    from kvsim.core.datapath.work import gemm_tiles
    p = _profile()
    cell = {"m": 256, "k": 4096, "n": 6144, "dir": "both", "ctas": 8, "h2d_ctas": 36,
            "page": 16384, "h2d_Bps": 30e9, "d2h_Bps": 35e9}
    s = p.interference_structure(page_bytes=16384)
    load = CopyLoad(ctas_h2d=36, ctas_d2h=8, hbm_Bps=65e9, h2d_Bps=30e9, sm_d2h_Bps=35e9)
    want = s.gemm_stretch(((gemm_tiles(256, 6144, s.tile), 1.0),), load,
                          hbm_exposure(s, ((4096, 6144),), 256))
    assert want > 0.0
    assert hw_gemm_ctas.predict(p, cell) == pytest.approx(want)
    # one way: the CTAs are that direction's, none the other's
    one = dict(cell, dir="d2h", h2d_Bps=0.0)
    load = CopyLoad(ctas_d2h=8, hbm_Bps=35e9, sm_d2h_Bps=35e9)
    assert hw_gemm_ctas.predict(p, one) == pytest.approx(
        s.gemm_stretch(((gemm_tiles(256, 6144, s.tile), 1.0),), load, hbm_exposure(s, ((4096, 6144),), 256)))
    # no CTAs, nothing moving: no stretch
    assert hw_gemm_ctas.predict(p, dict(cell, dir="h2d", ctas=0, h2d_Bps=0.0, d2h_Bps=0.0)) == 0.0


def test_the_table_puts_hw_beside_the_sim(capsys):
    hw_gemm_ctas.table([{"m": 256, "k": 4096, "n": 6144, "dir": "both", "ctas": 8, "h2d_ctas": 36,
                         "order": "during", "gemm_us": 41.5, "stretch": 1.5, "sim": 0.115,
                         "h2d_Bps": 30e9, "d2h_Bps": 35e9}])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == "| 256 | 4096 | 6144 | 36 + 8 | during | 41.5 | +150.0% | +11.5% | 30.0 | 35.0 |"


@pytest.mark.parametrize("args, says", [
    (["--page", "3x"], "--page"),
    (["--page", "64MiB"], "--page takes 4KiB to 16MiB"),
    (["--ctas", "0,4"], "at least 1"),
    (["--dir", "both", "--h2d-ctas", "0"], "--h2d-ctas"),
])
def test_bad_page_and_ctas_exit_2_naming_them(capsys, args, says):
    with pytest.raises(SystemExit) as e:
        hw_gemm_ctas.main(args)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_the_summary_weights_hw_and_the_sim_alike(capsys):
    base = {"dir": "both", "h2d_ctas": 36, "order": "during", "m": 256, "ctas": 8}
    cells = [dict(base, k=4096, n=4096, stretch=1.0, sim=0.1),
             dict(base, k=4096, n=12288, stretch=2.0, sim=0.3)]
    hw_gemm_ctas.summary(cells)
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == "| 256 | 36 + 8 | during | +175.0% | +25.0% |"   # (1 + 2 x 3) / 4, (0.1 + 0.9) / 4
    assert hw_gemm_ctas.weighted([dict(cells[0], sim=None)], 256, 8, "during", key="sim") is None
