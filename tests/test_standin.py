"""The hw backend's compute stand-in (kvsim_backends.hw.standin): how it splits a step
into GEMM chains and reads (CPU, by hand), what it allocates, the CPU mode's wait, the
run-ahead span computed at catch-up; on a GPU (marked ``gpu``), that a step of each kind
lasts what it was asked for."""

from __future__ import annotations

import pytest

from gpuskip import have_gpu
from kvsim.core.datapath.work import StepWork
from kvsim.core.spec import Level
from kvsim.run.seam import settings_for
from kvsim.settings import ModelSettings
from kvsim_backends.hw import HwBackend, RealtimeRuntime
from kvsim_backends.hw.standin import plan, read_buffer_bytes, standin_bytes

gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")

MODEL = ModelSettings(((4096, 6144), (4096, 4096), (4096, 16384), (14336, 4096)))
# one chain of the four projections at each M (seconds): made up, about 2x per doubling
CHAIN = {128: 60e-6, 256: 110e-6, 512: 0.2e-3, 1024: 0.4e-3, 2048: 0.8e-3, 4096: 1.6e-3,
         8192: 3.2e-3}


def _work(flop_s, memory_s, prefill=0, decode=0):
    return StepWork(flop_s + 1e-3, 0.0, 0.0, 0.0, 0.0, prefill, decode, flop_s, memory_s)


def test_a_prefill_step_is_chains_at_its_rows_then_smaller_ones():
    """A 3000-token prefill, 0.1 s of FLOPs against 0.01 s of bytes, given 0.1 s: 10/11 of
    it as GEMMs at M = 2048 (113 chains of 0.8 ms = 90.4 ms), the 0.509 ms left as 2
    chains at 256 rows ... and the rest of the step as reads."""
    w = _work(0.1, 0.01, prefill=3000)
    g, gemms, read_s = plan(0.1, w, MODEL, CHAIN)
    assert g == pytest.approx(0.1 / 0.11)
    gemm_s = 0.1 * g
    assert gemms[0] == (2048, int(gemm_s / 0.8e-3))
    # every chain at most the step's M, larger first, and what is left less than the smallest
    assert [m for m, _ in gemms] == sorted({m for m, _ in gemms}, reverse=True)
    assert all(m <= 2048 for m, _ in gemms)
    planned = sum(CHAIN[m] * k for m, k in gemms)
    left = gemm_s - planned
    assert 0 <= left < CHAIN[128]
    assert read_s == pytest.approx(0.1 * (1 - g) + left)


def test_a_decode_step_of_few_tokens_is_reads():
    w = _work(0.0001, 0.02, decode=8)
    g, gemms, read_s = plan(0.0201, w, MODEL, CHAIN)
    # 0.1 / 20.1 of the step is FLOPs: 0.1 ms, one chain at 128 rows (60 us), 40 us to reads
    assert gemms == [(128, 1)]
    assert read_s == pytest.approx(0.0201 - 60e-6)


def test_what_it_allocates():
    """fp16: one 8192-row input per distinct K (4096, 14336), the four matrices, one
    8192-row output per distinct N (6144, 4096, 16384), and the read buffer: 4x a 50 MiB
    L2 is 200 MiB, less than the 256 MiB floor."""
    assert read_buffer_bytes(50 << 20) == 256 << 20
    assert read_buffer_bytes(100 << 20) == 400 << 20
    ins = 8192 * (4096 + 14336)
    mats = 4096 * 6144 + 4096 * 4096 + 4096 * 16384 + 14336 * 4096
    outs = 8192 * (6144 + 4096 + 16384)
    assert standin_bytes(MODEL, 50 << 20) == 2 * (ins + mats + outs) + (256 << 20)


def test_settings_carry_the_models_projections_capped():
    st = settings_for(1 << 16, {Level.GPU: 4}, model="llama-3-70b")
    # tp 2: QKV 8192 -> (32 + 2 x 4) x 128; gate and up 2 x 14336 capped at 16384
    assert st.model.projections == ((8192, 5120), (4096, 8192), (8192, 16384), (14336, 8192))
    assert settings_for(1 << 16, {Level.GPU: 4}, model="llama-3-8b").model.projections == \
        ((4096, 6144), (4096, 4096), (4096, 16384), (14336, 4096))


def _run(rt, gen):
    return rt.run(rt.process(gen))


def test_cpu_mode_waits_the_time_asked_for_whatever_the_work():
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(1 << 16, {Level.GPU: 4}, device="cpu"))
    try:
        assert be.standin is None

        def proc():
            t0 = rt.now
            took = yield be.compute(0.02, _work(0.01, 0.01, prefill=512))
            return took, rt.now - t0
        took, waited = _run(rt, proc())
        assert took == 0.02 and waited >= 0.02
    finally:
        be.close()


def test_a_run_ahead_span_is_computed_at_catch_up_as_the_steps_work_merged():
    """Three steps run ahead (quiet): each answered at once; catch_up then computes their
    span with the merged work (the CPU mode waits it); nothing is left owed after."""
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(1 << 16, {Level.GPU: 4}, device="cpu"))
    seen = []
    st = be.steps
    st.compute = lambda d, work=None, _c=st.compute: (seen.append((d, work)), _c(d, work))[1]
    try:
        w = _work(0.001, 0.009, decode=8)
        assert be.compute_ahead(0.0, 0.01, True, w) == 0.01
        assert be.compute_ahead(0.01, 0.01, True, w) == 0.02
        assert be.compute_ahead(0.02, 0.01, False, w) is None  # in flight: cannot tell

        def proc():
            yield be.catch_up(0.02)
        _run(rt, proc())
        (d, merged), = seen
        assert d == pytest.approx(0.02, abs=5e-3)
        assert merged.seconds == pytest.approx(0.02)
        assert merged.flop_s == pytest.approx(0.001 * 0.02 / w.seconds)
        assert be.steps.ahead == []
    finally:
        be.close()


@gpu
@needs_gpu
@pytest.mark.parametrize("kind", ["gemm", "reads", "mix"])
def test_gpu_a_step_lasts_what_it_was_asked_for(kind):
    """Each kind of step at 5, 20 and 50 ms, run as a replay runs them (back to back): its GPU
    time (the compute's events) within 10% of the time asked for (+ 0.3 ms); the stand-in
    ran GEMMs for GEMM steps."""
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(1 << 16, {Level.GPU: 4}, device="gpu", model="llama-3-8b"))
    try:
        info = be.info["standin"]
        print(f"stand-in: {info}")
        assert info["gemm_call"] in ("cublas", "matmul")
        assert info["read_Bps"] > 1e12 and min(info["gemm_flops"].values()) > 1e12
        work = {"gemm": _work(0.1, 0.002, prefill=4096), "reads": _work(0.0001, 0.02, decode=4),
                "mix": _work(0.01, 0.01, decode=256)}[kind]
        calls0 = be.standin.gemm_calls
        for d in (0.005, 0.02, 0.05):
            # a replay runs its steps back to back, and calibrate times a warm chain: a GEMM
            # chain is power-bound and runs 12-14% faster after idle (H200, 2026-12-03), so
            # each size is measured warm: steps back to back for 0.3 s, then the median of 5
            for _ in range(max(2, round(0.3 / d))):
                _run(rt, (lambda: (yield be.compute(d, work)))())
            took = sorted(_run(rt, (lambda: (yield be.compute(d, work)))()) for _ in range(5))[2]
            assert abs(took - d) < 0.10 * d + 3e-4, (kind, d, took)
            if kind == "mix":  # the last step's GEMM part, timed apart: half of it here
                part = be.standin.gemm_part_s()
                assert part is not None and 0.8 * d / 2 < part < 1.2 * d / 2, (d, part)
        # GEMM steps launch GEMMs; a reads step's 0.1 ms of FLOPs at most one chain a step
        # (``plan``: one chain at 128 rows, as the CPU test above splits it)
        steps = sum(max(2, round(0.3 / d)) + 5 for d in (0.005, 0.02, 0.05))
        calls = be.standin.gemm_calls - calls0
        if kind == "reads":
            assert calls <= steps * len(be.standin.model.projections), calls
        else:
            assert calls > steps * len(be.standin.model.projections), calls
    finally:
        be.close()


@gpu
@needs_gpu
def test_gpu_a_compute_without_work_is_the_busy_kernel():
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(1 << 16, {Level.GPU: 4}, device="gpu"))
    try:
        calls0 = be.standin.gemm_calls
        took = _run(rt, (lambda: (yield be.compute(0.02)))())
        assert 0.016 < took < 0.05 and be.standin.gemm_calls == calls0
    finally:
        be.close()
