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
