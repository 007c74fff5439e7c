"""The hw backend's stand-in for a step's compute: what the GPU runs for a ``StepWork``.

A step's nominal time (the compute model's) is split by its ``gemm_share``
(``kvsim.core.datapath.work``): that share runs as tensor-core GEMMs, the rest as HBM
reads, one after the other on the compute stream, so the step lasts what the compute
model says and occupies the GPU the way its kind of work would:

- **GEMMs**: one layer's projections (QKV, attention output, gate and up, down; shapes
  from the model, ``ModelSettings``), fp16 on cuBLAS into preallocated outputs (its
  ``gemmEx`` called as CuPy's matmul calls it, checked against ``cupy.matmul`` at start,
  which it falls back to), at M = the step's tokens rounded down to a power of two (``gemm_rows``). A
  span of GEMM time is filled with whole chains of the four at that M, then chains at
  smaller M for the rest, by each chain's calibrated time; what no chain fits (less than
  the smallest chain) goes to the reads;
- **reads**: ``kv_read`` streams a buffer of at least 4x the GPU's L2 (so the reads come
  from HBM, not L2), each CTA 64 KiB, wrapping around the buffer, in kernels of
  ``chunk_s`` each (CUDA graphs of 2^k chunks, as the busy kernel's), bytes = time x
  the calibrated read rate.

Calibrated once at start (``calibrate``): each M's chain time (after a warm-up of GEMMs:
the chain is power-bound and runs faster from idle) and the read rate, medians of a few
timed runs with CUDA events.

What it captures: the SMs a step's GEMMs fill in waves of large CTAs, and the HBM its
reads stream, for as long as the compute model says, so that copies meet compute of the
right kind (SM copy CTAs take SMs from GEMM waves; copies take HBM from reads). What it
does not: no model weights are loaded (the GEMMs' operands are one layer's projection
matrices, each dimension capped at ``ModelSettings.max_dim``, reused for every layer, so
their reads of weights mostly hit L2); no attention kernels (attention's FLOPs run as
projection GEMMs, its KV reads as plain reads); no activations, KV writes, norms or
collectives; the GEMM and read parts do not overlap within a step as a real step's
kernels partly do; the step's fixed overhead is spent as work of the step's mix.

Nothing here decides anything: the split and the shapes are the pure rule's.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from kvsim.core.datapath.work import StepWork, gemm_rows, gemm_share, row_buckets
from kvsim.settings import ModelSettings

READ_SOURCE = r"""
// Read vecs_per_cta uint4 a CTA from HBM: CTA b starts at (b * vecs_per_cta) mod buf_vecs
// and wraps around the buffer. The buffer holds zeros, so the XOR is 0 and never the
// magic value: the loads stay, nothing is written.
extern "C" __global__ void kv_read(const uint4* __restrict__ buf, long long buf_vecs,
                                   long long vecs_per_cta, unsigned int magic,
                                   unsigned int* __restrict__ sink) {
    long long v = ((long long)blockIdx.x * vecs_per_cta) % buf_vecs + threadIdx.x;
    unsigned int acc = 0;
#pragma unroll 8
    for (long long i = threadIdx.x; i < vecs_per_cta; i += blockDim.x) {
        if (v >= buf_vecs) v -= buf_vecs;
        uint4 x = buf[v];
        acc ^= x.x ^ x.y ^ x.z ^ x.w;
        v += blockDim.x;
    }
    if (acc == magic) sink[0] = acc;
}
"""

READ_THREADS = 256
READ_CTA_BYTES = 64 << 10   # each CTA reads 64 KiB, then retires
READ_MIN_BYTES = 256 << 20  # the read buffer: at least this, and at least 4x L2
L2_MULTIPLE = 4


def read_buffer_bytes(l2_bytes: int) -> int:
    """The read buffer's size for a GPU with ``l2_bytes`` of L2: at least 4x it and 256 MiB,
    a whole number of CTAs' reads."""
    n = max(READ_MIN_BYTES, L2_MULTIPLE * int(l2_bytes))
    return -(-n // READ_CTA_BYTES) * READ_CTA_BYTES


def standin_bytes(model: ModelSettings, l2_bytes: int, dtype_bytes: int = 2) -> int:
    """Device bytes the stand-in allocates: an input of ``max_rows`` rows for each distinct
    K, every projection's matrix, an output of ``max_rows`` rows for each distinct N, and
    the read buffer."""
    rows = model.max_rows
    ks = {k for k, _ in model.projections}
    ns = {n for _, n in model.projections}
    mats = sum(k * n for k, n in model.projections)
    return dtype_bytes * (rows * (sum(ks) + sum(ns)) + mats) + read_buffer_bytes(l2_bytes)


def plan(seconds: float, work: StepWork, model: ModelSettings, chain_s: dict[int, float]
         ) -> tuple[float, list[tuple[int, int]], float]:
    """(GEMM share, [(M, chains)], read seconds) for ``seconds`` of ``work``: the share's
    seconds as whole chains at the step's M first, then at each smaller M (``chain_s``: M
    -> one chain's seconds); what no chain fits, and the rest of the step, as reads."""
    g = gemm_share(work)
    m0 = gemm_rows(work.tokens, model.min_rows, model.max_rows)
    out, left = [], seconds * g
    for m in sorted(chain_s, reverse=True):
        per = chain_s[m]
        if m > m0 or per <= 0 or left < per:
            continue
        k = int(left / per)
        out.append((m, k))
        left -= k * per
    return g, out, seconds * (1.0 - g) + left


class StandIn:
    """GEMMs and reads for steps' work on ``stream`` (see the module docstring).
    ``read_kernel``: ``kv_read`` compiled (``Kernels.read``); ``chunk_s``: a read kernel's
    length."""

    def __init__(self, cp, model: ModelSettings, read_kernel, chunk_s: float, l2_bytes: int,
                 use_graphs: bool = True):
        self.cp = cp
        self.model = model
        self.read_kernel = read_kernel
        self.chunk_s = chunk_s
        self.use_graphs = use_graphs
        self.rows = row_buckets(model.min_rows, model.max_rows)
        rng = cp.random.RandomState(1)
        f16 = cp.float16

        def rand(shape):  # values in [-0.5, 0.5): real toggling bits, no fp16 overflow
            return (rng.random_sample(shape, dtype=cp.float32) - 0.5).astype(f16)

        r = model.max_rows
        self._a = {k: rand((r, k)) for k in sorted({k for k, _ in model.projections})}
        self._b = [rand((k, n)) for k, n in model.projections]
        self._c = {n: cp.empty((r, n), dtype=f16) for n in sorted({n for _, n in model.projections})}
        nbytes = read_buffer_bytes(l2_bytes)
        self.read_bytes = nbytes
        self._buf = cp.zeros(nbytes // 4, dtype=cp.uint32)  # (read as uint4 words)
        self._sink = cp.zeros(1, dtype=cp.uint32)
        cp.cuda.Device().synchronize()
        self._gemm, self.gemm_call = self._direct_gemm(rand), "matmul"
        if self._gemm is not None:
            self.gemm_call = "cublas"
        self.chain_s: dict[int, float] = {}   # M -> seconds of one chain of the projections
        self.read_Bps = 0.0
        self._graphs: dict[tuple[int, int], Any] = {}
        self._capture_stream = None
        self.gemm_calls = 0  # cuBLAS calls launched (each costs host time on the caller's thread)
        self.launched_at = 0.0  # host perf_counter() as the last step's first kernel was enqueued
        # (events on the stream around the last step's GEMM part, where it also read:
        # ``gemm_part_s``; None otherwise)
        self._marks: tuple[Any, Any] | None = None

    def _direct_gemm(self, rand):
        """``gemm(a, b, c, m, k, n)``: ``c[:m] = a[:m] @ b`` (row-major, contiguous fp16)
        through cuBLAS's ``gemmEx`` as CuPy's own matmul calls it (the product as the
        column-major ``c^T = b^T a^T``, fp32 accumulate), a few microseconds of host time
        where ``cupy.matmul`` takes tens; None where it is not there or does not give
        ``cupy.matmul``'s result on a small product (then ``cupy.matmul`` is used)."""
        cp = self.cp
        try:
            from cupy_backends.cuda.api import runtime as rt  # noqa: PLC0415
            from cupy_backends.cuda.libs import cublas  # noqa: PLC0415

            handle = cp.cuda.device.get_cublas_handle()
            cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
            coef = np.array([1.0, 0.0], dtype=np.float32)  # alpha, beta (kept alive here)
            one, zero = coef.ctypes.data, coef.ctypes.data + 4
            f16, f32, op_n, algo = rt.CUDA_R_16F, rt.CUDA_R_32F, cublas.CUBLAS_OP_N, cublas.CUBLAS_GEMM_DEFAULT

            def gemm(a, b, c, m, k, n, _keep=coef):
                cublas.gemmEx(handle, op_n, op_n, n, m, k, one, b.data.ptr, f16, n, a.data.ptr, f16, k,
                              zero, c.data.ptr, f16, n, f32, algo)

            a, b = rand((256, 512)), rand((512, 384))
            c = cp.empty((256, 384), dtype=cp.float16)
            gemm(a, b, c, 256, 512, 384)
            if not bool(cp.allclose(c, cp.matmul(a, b), rtol=1e-2, atol=1e-2)):
                return None
            return gemm
        except Exception:  # an older or newer CuPy without these names: cupy.matmul
            return None

    # -- calibration ------------------------------------------------------------------

    def _time(self, stream, fn, reps: int, pad: int = 0) -> float:
        """Median GPU seconds of ``fn()`` on ``stream`` (``pad`` chains at the largest M
        queued before each run, so that the host launches ``fn``'s work while the GPU is
        busy: its GPU time, not the host's launch time, is measured)."""
        cp = self.cp
        secs = []
        with stream:
            for _ in range(reps):
                for _ in range(pad):
                    self._chain(self.rows[-1])
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                fn()
                b.record(stream)
                b.synchronize()
                secs.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
        return statistics.median(secs)

    def calibrate(self, stream, warm_s: float = 0.2, reps: int = 3, host_s: float = 50e-6,
                  hot_s: float | None = None) -> dict:
        """Each M's chain time and the read rate, on ``stream``; what it measured.
        ``host_s``: a bound on one cuBLAS call's host time (the padding before a timed run
        covers the launches of the chains it times); ``warm_s``: seconds of reads before
        the reads are timed, and of GEMMs before the chains are unless ``hot_s`` is given
        (``benchmarks/hw_standin.py`` measures how the chain times move with it)."""
        top = self.rows[-1]
        for m in self.rows:  # (cuBLAS picks its kernels on a first call)
            self._time(stream, lambda: self._chain(m), 1)
        one = self._time(stream, lambda: self._chain(top), 1)
        n_warm = max(1, int((warm_s if hot_s is None else hot_s) / max(one, 1e-6)))
        self._time(stream, lambda: [self._chain(top) for _ in range(n_warm)], 1)
        calls = len(self.model.projections)
        for m in reversed(self.rows):
            k = max(1, int(0.005 / max(self._time(stream, lambda: self._chain(m), 1), 1e-7)))
            pad = max(1, int(2 * k * calls * host_s / max(one, 1e-6)) + 1)
            self.chain_s[m] = self._time(stream, lambda: [self._chain(m) for _ in range(k)], reps,
                                         pad) / k
        ctas = (1 << 30) // READ_CTA_BYTES  # 1 GiB a run
        secs = self._time(stream, lambda: self._read(stream, ctas), reps + 2)
        self.read_Bps = ctas * READ_CTA_BYTES / secs
        # then as steps run them: 20 ms of reads in kernels of ``chunk_s`` (a run of short
        # kernels reads at another rate than one long one: 12% faster on the H200)
        ctas = max(1, int(0.02 * self.read_Bps / READ_CTA_BYTES))
        self._reads(stream, ctas)  # (its graphs captured first, outside the timing)
        stream.synchronize()
        # warm as reads run: after the GEMM warm-up the GPU's clock is power-bound and reads
        # timed straight after it ran 12% slower than the same reads back to back (H200,
        # 2026-12-03: a 20 ms reads step lasted 17.7 ms)
        self._time(stream, lambda: [self._reads(stream, ctas) for _ in range(max(1, int(warm_s / 0.02)))], 1)
        secs = self._time(stream, lambda: self._reads(stream, ctas), reps + 2)
        self.read_Bps = ctas * READ_CTA_BYTES / secs
        flops = {m: 2.0 * m * sum(k * n for k, n in self.model.projections) / s
                 for m, s in self.chain_s.items()}
        return {"gemm_call": self.gemm_call, "chain_s": {str(m): s for m, s in self.chain_s.items()},
                "gemm_flops": {str(m): f for m, f in flops.items()},
                "read_Bps": self.read_Bps, "read_buffer_bytes": self.read_bytes}

    # -- launching --------------------------------------------------------------------

    def _chain(self, m: int) -> None:
        """One chain of the layer's projections at M = ``m`` on the current stream."""
        gemm = self._gemm
        if gemm is not None:
            for (k, n), b in zip(self.model.projections, self._b):
                gemm(self._a[k], b, self._c[n], m, k, n)
        else:
            cp = self.cp
            for (k, n), b in zip(self.model.projections, self._b):
                cp.matmul(self._a[k][:m], b, out=self._c[n][:m])
        self.gemm_calls += len(self._b)

    def _read(self, stream, ctas: int) -> None:
        self.read_kernel((int(ctas),), (READ_THREADS,),
                         (self._buf, np.int64(self.read_bytes // 16), np.int64(READ_CTA_BYTES // 16),
                          np.uint32(0x9E3779B9), self._sink), stream=stream)

    def launch(self, stream, seconds: float, work: StepWork) -> dict:
        """Enqueue ``seconds`` (wall) of ``work``'s stand-in on ``stream``: its GEMM share
        as GEMMs, the rest as reads (``plan``). Returns the plan (for logs and tests)."""
        g, gemms, read_s = plan(seconds, work, self.model, self.chain_s)
        self.launched_at = time.perf_counter()
        ctas = int(read_s * self.read_Bps / READ_CTA_BYTES) if read_s > 0 else 0
        self._marks = None
        if gemms:
            start = self.cp.cuda.Event() if ctas else None
            with stream:
                if start is not None:
                    start.record(stream)
                for m, k in gemms:
                    for _ in range(k):
                        self._chain(m)
            if start is not None:
                mid = self.cp.cuda.Event()
                mid.record(stream)
                self._marks = (start, mid)
        if ctas:
            self._reads(stream, ctas)
        return {"gemm_share": g, "gemms": gemms, "read_s": read_s, "read_ctas": ctas}

    def gemm_part_s(self) -> float | None:
        """GPU seconds the last step's GEMM part took, for a step of both parts once it has
        run (its reads follow on the stream: the rest of the step's time is theirs); None
        for a step of one part."""
        if self._marks is None:
            return None
        start, mid = self._marks
        mid.synchronize()
        return self.cp.cuda.get_elapsed_time(start, mid) / 1e3

    def _reads(self, stream, ctas: int) -> None:
        """``ctas`` CTAs of reads as kernels of about ``chunk_s`` each: whole chunks through
        captured graphs of 2^k kernels (``use_graphs``), then one kernel for the rest."""
        per = max(1, int(self.chunk_s * self.read_Bps / READ_CTA_BYTES))
        full, rest = divmod(ctas, per)
        if not self.use_graphs:
            for _ in range(full):
                self._read(stream, per)
        else:
            k = 0
            while full:
                if full & 1:
                    self._read_graph(per, 1 << k).launch(stream)
                full >>= 1
                k += 1
        if rest:
            self._read(stream, rest)

    def _read_graph(self, ctas: int, count: int):
        key = (ctas, count)
        g = self._graphs.get(key)
        if g is None:
            cp = self.cp
            if self._capture_stream is None:
                self._capture_stream = cp.cuda.Stream(non_blocking=True)
            s = self._capture_stream
            s.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
            try:
                for _ in range(count):
                    self._read(s, ctas)
            finally:
                g = s.end_capture()
            self._graphs[key] = g
        return g
