"""The step's work record and the stand-in's shape rule (kvsim.core.datapath.work), by
hand: the GEMM share of a step, its GEMMs' M, their tiles, and a run-ahead span merged."""

import pytest

from kvsim.core.datapath.work import EMPTY, StepWork, gemm_rows, gemm_share, gemm_tiles, merge, row_buckets


def _work(seconds, flop_s, memory_s, pt=0, dt=0):
    return StepWork(seconds, flop_s * 1e15, 0.0, memory_s * 4e12, 0.0, pt, dt, flop_s, memory_s)


def test_gemm_share_splits_a_step_by_its_two_roofline_times():
    # a prefill chunk: 0.3 s of FLOPs against 0.01 s of bytes -> almost all GEMMs
    assert gemm_share(_work(0.301, 0.3, 0.01)) == pytest.approx(0.3 / 0.31)
    # a decode step of few tokens: reads only, to the precision of its few FLOPs
    assert gemm_share(_work(0.021, 0.0002, 0.02)) == pytest.approx(0.0002 / 0.0202)
    assert gemm_share(EMPTY) == 0.0


def test_gemm_rows_rounds_tokens_down_to_a_power_of_two_within_bounds():
    assert [gemm_rows(t, 128, 8192) for t in (1, 128, 129, 255, 256, 3000, 8192, 50_000)] == \
        [128, 128, 128, 128, 256, 2048, 8192, 8192]
    assert row_buckets(128, 1024) == [128, 256, 512, 1024]


def test_gemm_tiles_counts_partial_tiles():
    # 2048 x 28672 in 128 x 256 tiles: 16 x 112; 129 rows need a second row of tiles
    assert gemm_tiles(2048, 28672, (128, 256)) == 16 * 112
    assert gemm_tiles(129, 256, (128, 256)) == 2


def test_merge_weights_each_step_by_the_time_it_was_given():
    """Two decode steps of 10 ms (the second given only 5 ms: a span ends inside it) and
    a prefill of 100 ms: FLOPs and bytes add up in proportion, the tokens are the largest
    step's, the seconds are what the span was given."""
    a = _work(0.010, 0.001, 0.009, dt=8)
    b = _work(0.010, 0.001, 0.009, dt=8)
    c = _work(0.100, 0.090, 0.010, pt=4096, dt=8)
    m = merge([(0.010, a), (0.005, b), (0.100, c)])
    assert m.seconds == pytest.approx(0.115)
    assert m.flop_s == pytest.approx(0.001 + 0.0005 + 0.090)
    assert m.memory_s == pytest.approx(0.009 + 0.0045 + 0.010)
    assert m.dense_flops == pytest.approx((0.001 + 0.0005 + 0.090) * 1e15)
    assert (m.prefill_tokens, m.decode_tokens) == (4096, 8)
    assert merge([]) == EMPTY
