"""benchmarks/hw_gemm_timeline.py: the per-call bins by time since the copy's start, the
figures of its last line, and its refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuskip import have_gpu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hw_gemm_timeline  # noqa: E402


def test_calls_are_binned_by_their_time_since_the_copys_start():
    # two repetitions of four calls of 1 ms alone; beside, the calls from the copy's start
    # on run 20% long; each call's midpoint since the copy's start as given
    alone = [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.1]]
    beside = [[1.0, 1.2, 1.2, 1.2], [1.0, 1.0, 1.2, 1.26]]
    since = [[-0.5, 0.6, 1.8, 3.0], [-1.5, -0.5, 0.7, 1.9]]
    bins = hw_gemm_timeline.by_time(alone, beside, since)
    got = {(lo, hi): (round(s, 4), n) for lo, hi, s, n in bins}
    assert got[(-2.0, -1.0)] == (0.0, 1) and got[(-1.0, 0.0)] == (0.0, 2)
    assert got[(0.5, 1.0)] == (0.2, 2)  # (calls 2 and 3 of the two repetitions)
    assert got[(1.5, 2.0)] == (0.2, 2)  # (the last call's median alone is 1.05: 1.26 / 1.05)
    assert got[(3.0, 4.0)] == (round(1.2 / 1.05 - 1, 4), 1)
    assert (0.0, 0.5) not in got  # (no call there: left out)
    first, then = hw_gemm_timeline.summary(bins, copy_ms=2.0)
    assert first is None and then == pytest.approx(0.2)  # (bins ending within the copy)
    first, then = hw_gemm_timeline.summary([(0.0, 0.5, 0.1, 3), *bins], copy_ms=5.0)
    assert first == 0.1 and then == pytest.approx(0.2)


def test_bad_arguments_exit_2_naming_them(capsys):
    with pytest.raises(SystemExit) as e:
        hw_gemm_timeline.main(["--kn", "4096"])
    assert e.value.code == 2 and "--kn takes K,N" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        hw_gemm_timeline.main(["--ctas", "0"])
    assert e.value.code == 2 and "positive integers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        hw_gemm_timeline.main(["--profile", "no-such-profile"])
    assert e.value.code == 2


@pytest.mark.skipif(have_gpu(), reason="a GPU is here")
def test_without_a_gpu_it_says_so_and_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        hw_gemm_timeline.main(["--reps", "1", "--cap-s", "0"])
    assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
