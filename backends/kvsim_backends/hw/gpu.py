"""The GPU side of the hw backend: kernels (page copy, refcheck fill/check, busy compute,
the compute stand-in's reads) and the copy engine's batched call.

- ``Kernels``: one CuPy RawModule. ``kv_copy_pages`` gathers/scatters whole pages with
  16-byte accesses (uint4), ``UNROLL`` loads in flight per thread; page-index arrays live
  on the device; host memory is read/written zero-copy through its mapped device address.
  ``kv_busy`` is an FMA chain calibrated once to iterations per second: a load of the SMs
  alone, for a compute without a step's work (tests, benchmarks); a step's work runs as
  ``standin.StandIn`` (GEMMs, and ``kv_read``'s HBM reads).
- ``BatchCopier``: one ``cudaMemcpyBatchAsync`` per batch through ctypes with numpy pointer
  arrays (no per-page Python work); else through cuda-bindings (Python lists); else a
  per-page ``cudaMemcpyAsync`` loop. ``self_test`` picks the first mode that copies
  correctly on this machine; ``mode`` says which one runs. On the H200 the batched call
  itself is the copy's whole host cost (0.4 ms of pointer
  arrays against 250 ms inside the call for 65536 pages of 16 KiB host -> GPU); its source
  access order and the prefer-overlap flag made no difference there.

Nothing here decides which pages move or by which path: callers pass pointers and slots.
"""

from __future__ import annotations

import ctypes
import math
from time import perf_counter as _clock
from typing import Any

import numpy as np

from .pattern import CUDA_SOURCE as PATTERN_SOURCE
from .standin import READ_SOURCE

COPY_SOURCE = r"""
#ifndef UNROLL
#define UNROLL 8
#endif
// Copy whole pages: work item w = (page p, chunk c); a chunk is blockDim.x * UNROLL uint4.
extern "C" __global__ void kv_copy_pages(const char* __restrict__ src_base, char* __restrict__ dst_base,
                                         const long long* __restrict__ src_slots,
                                         const long long* __restrict__ dst_slots,
                                         long long pages, long long page_bytes) {
    const long long vecs = page_bytes >> 4;
    const long long chunk = (long long)blockDim.x * UNROLL;
    const long long chunks = (vecs + chunk - 1) / chunk;
    const long long items = pages * chunks;
    for (long long w = blockIdx.x; w < items; w += gridDim.x) {
        const long long p = w / chunks;
        const long long v0 = (w - p * chunks) * chunk + threadIdx.x;
        const uint4* s = reinterpret_cast<const uint4*>(src_base + src_slots[p] * page_bytes);
        uint4* d = reinterpret_cast<uint4*>(dst_base + dst_slots[p] * page_bytes);
        uint4 r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long v = v0 + (long long)u * blockDim.x;
            if (v < vecs) r[u] = s[v];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const long long v = v0 + (long long)u * blockDim.x;
            if (v < vecs) d[v] = r[u];
        }
    }
}

extern "C" __global__ void kv_busy(float* sink, long long iters) {
    float a = threadIdx.x * 1e-3f, b = 0.999999f;
    for (long long i = 0; i < iters; ++i) a = fmaf(a, b, 1e-7f);
    if (a == 1234.5f) sink[0] = a;  // never true; keeps the loop alive
}
"""

CUDA_MEMCPY_DEFAULT = 4
CUDA_MEMCPY_HOST_TO_DEVICE = 1
SRC_ACCESS_ORDER_STREAM = 1           # read the source in stream order (the default)
SRC_ACCESS_ORDER_DURING_API_CALL = 2  # the source may be read during the call itself
SRC_ACCESS_ORDER_ANY = 3              # the source may be read at any time
MEMCPY_FLAG_PREFER_OVERLAP = 1        # cudaMemcpyFlagPreferOverlapWithCompute


def load_cupy():
    """The ``cupy`` module where CuPy imports and finds a CUDA GPU; else None (CPU mode)."""
    try:
        import cupy as cp  # noqa: PLC0415
        if cp.cuda.runtime.getDeviceCount() > 0:
            return cp
    except Exception:
        pass
    return None


class Kernels:
    def __init__(self, cp, unroll: int = 8, busy_waves: int = 10):
        self.cp = cp
        self.module = cp.RawModule(code=COPY_SOURCE + PATTERN_SOURCE + READ_SOURCE,
                                   options=("-std=c++14", f"-DUNROLL={int(unroll)}"))
        self.copy = self.module.get_function("kv_copy_pages")
        self.fill = self.module.get_function("kv_fill")
        self.check = self.module.get_function("kv_check")
        self.busy = self.module.get_function("kv_busy")
        self.read = self.module.get_function("kv_read")
        dev = cp.cuda.Device()
        self.sm_count = int(dev.attributes["MultiProcessorCount"])
        self.l2_bytes = int(dev.attributes.get("L2CacheSize", 0))
        self._sink = cp.zeros(1, dtype=cp.float32)
        self.busy_threads = 256
        self.busy_blocks = self.sm_count * 8  # all resident threads of every SM: one wave
        # a busy kernel runs as this many waves of CTAs, so CTAs retire every ~50 us of a
        # 0.5 ms chunk and another stream's kernel (a check, an SM copy) gets SMs within
        # one wave, as between the short CTAs of an inference step's GEMMs
        self.busy_waves = busy_waves
        self.busy_iters_per_s = 0.0
        # launch_busy through captured CUDA graphs (one launch for many chunks); HwBackend sets it
        self.use_graphs = False
        self._graphs: dict[tuple[int, int, int], Any] = {}
        self._capture_stream = None

    def copy_ctas_per_sm(self, threads: int) -> int:
        """How many ``kv_copy_pages`` CTAs of ``threads`` one SM holds at once: the least of
        its register file (a warp's registers in units of 256), its threads and its CTA
        slots (the profile's ``sm.interference.copy_ctas_per_sm``: where the GEMMs of a
        step leave an SM free, this many copy CTAs pack onto it)."""
        a = self.cp.cuda.Device().attributes
        regs = int(self.copy.attributes.get("num_regs", 0)) or 1
        warps = -(-int(threads) // 32)
        per_warp = -(-regs * 32 // 256) * 256
        by_regs = int(a.get("MaxRegistersPerMultiprocessor", 65536)) // per_warp // warps
        by_threads = int(a.get("MaxThreadsPerMultiProcessor", 2048)) // int(threads)
        by_slots = int(a.get("MaxBlocksPerMultiprocessor", 32))
        return max(1, min(by_regs, by_threads, by_slots))

    def copy_pages(self, stream, src_ptr: int, dst_ptr: int, src_slots, dst_slots,
                   page_bytes: int, ctas: int, threads: int) -> None:
        n = int(src_slots.shape[0])
        if n == 0:
            return
        self.copy((int(ctas),), (int(threads),),
                  (np.uint64(src_ptr), np.uint64(dst_ptr), src_slots, dst_slots,
                   np.int64(n), np.int64(page_bytes)), stream=stream)

    def calibrate_busy(self, target_s: float = 0.02) -> float:
        """Iterations per second of ``kv_busy`` on all SMs (measured, median of 3)."""
        cp = self.cp
        iters = 4096
        rates = []
        s = cp.cuda.Stream(non_blocking=True)
        for _ in range(6):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(s)
            self._busy(s, iters)
            b.record(s)
            b.synchronize()
            dt = cp.cuda.get_elapsed_time(a, b) / 1e3
            rates.append(iters / dt)
            if dt < target_s:
                iters = int(iters * min(16.0, target_s / max(dt, 1e-6)))
        self.busy_iters_per_s = float(np.median(rates[-3:]))
        return self.busy_iters_per_s

    def launch_busy(self, stream, duration_s: float, chunk_s: float) -> None:
        """Occupy all SMs for about ``duration_s``, as kernels of about ``chunk_s`` each
        (so other kernels' CTAs can interleave, as between inference kernels).

        Each launch costs host time on the caller's thread (a RawKernel launch ~5.7 us on
        the H200 machine; a 9 ms step's 18 chunks held the runtime's loop ~128 us). With ``use_graphs`` the chunks are all ``chunk_s`` long and go
        as captured CUDA graphs of 2^k chunks (cached; one launch each, the binary digits
        of the count) plus one shorter kernel for the rest: the same kernels in the same
        stream order, a few launches a step."""
        if not self.use_graphs:
            n = max(1, math.ceil(duration_s / chunk_s))
            iters = max(1, int(self.busy_iters_per_s * duration_s / n))
            for _ in range(n):
                self._busy(stream, iters)
            return
        per = max(1, int(self.busy_iters_per_s * chunk_s))
        full, rest = divmod(max(1, int(self.busy_iters_per_s * duration_s)), per)
        k = 0
        while full:
            if full & 1:
                self._busy_graph(per, 1 << k).launch(stream)
            full >>= 1
            k += 1
        if rest:
            self._busy(stream, rest)

    def _busy(self, stream, iters: int) -> None:
        """One busy kernel of ``iters`` iterations a thread of one wave on every SM, run as
        ``busy_waves`` waves (each CTA a share of the iterations)."""
        w = self.busy_waves
        self.busy((self.busy_blocks * w,), (self.busy_threads,), (self._sink, np.int64(max(1, iters // w))),
                  stream=stream)

    def _busy_graph(self, iters: int, count: int):
        """A captured graph of ``count`` busy chunks of ``iters`` iterations, in order."""
        key = (iters, count, self.busy_waves)
        g = self._graphs.get(key)
        if g is None:
            cp = self.cp
            if self._capture_stream is None:
                self._capture_stream = cp.cuda.Stream(non_blocking=True)
            s = self._capture_stream
            s.begin_capture(mode=cp.cuda.runtime.streamCaptureModeRelaxed)
            try:
                for _ in range(count):
                    self._busy(s, iters)
            finally:
                g = s.end_capture()
            self._graphs[key] = g
        return g


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemcpyAttributes(ctypes.Structure):
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _MemLocation),
                ("dstLocHint", _MemLocation), ("flags", ctypes.c_uint)]


def _load_cudart():
    names = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # noqa: PLC0415
        names.append(load_nvidia_dynamic_lib("cudart").abs_path)
    except Exception:
        pass
    names += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    for n in names:
        try:
            lib = ctypes.CDLL(n)
            fn = lib.cudaMemcpyBatchAsync
        except (OSError, AttributeError, TypeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        return n, fn
    return None, None


class BatchCopier:
    """Copy-engine copies of many (dst, src, size) triples with one call per batch."""

    MODES = ("ctypes", "bindings", "loop")

    def __init__(self, cp):
        self.cp = cp
        self.mode: str | None = None
        self.lib_name, self._fn = _load_cudart()
        self._attrs = _MemcpyAttributes(SRC_ACCESS_ORDER_STREAM)
        # per-direction attributes (one for the whole batch); callers pass attrs="h2d"/"d2h".
        # Stream order both ways by default: a GPU source may still be written by a fill
        # kernel the stream waits for, so only a host source could take another order.
        self.attrs = {"h2d": _MemcpyAttributes(SRC_ACCESS_ORDER_STREAM),
                      "d2h": _MemcpyAttributes(SRC_ACCESS_ORDER_STREAM)}
        self._idx = (ctypes.c_size_t * 1)(0)
        self._rt = None
        try:
            from cuda.bindings import runtime as rt  # noqa: PLC0415
            self._rt = rt
        except Exception:
            pass
        self.errors: dict[str, str] = {}
        self.last_call_s: float | None = None  # the last ctypes call's own host time (calibrate)

    def copy(self, stream, dsts: np.ndarray, srcs: np.ndarray, sizes: np.ndarray, mode: str | None = None,
             attrs: str | None = None) -> None:
        """Enqueue the copies on ``stream``; raises RuntimeError on a CUDA error.
        ``attrs``: 'h2d' / 'd2h' picks that direction's attributes (ctypes mode)."""
        mode = mode or self.mode or "loop"
        n = int(dsts.shape[0])
        if n == 0:
            return
        if mode == "ctypes":
            d = np.ascontiguousarray(dsts, dtype=np.uint64)
            s = np.ascontiguousarray(srcs, dtype=np.uint64)
            z = np.ascontiguousarray(sizes, dtype=np.uint64)
            a = self._attrs if attrs is None else self.attrs[attrs]
            t0 = _clock()
            rc = self._fn(d.ctypes.data, s.ctypes.data, z.ctypes.data, n, ctypes.addressof(a),
                          ctypes.addressof(self._idx), 1, stream.ptr)
            self.last_call_s = _clock() - t0  # host time of the batched call itself
            if rc != 0:
                raise RuntimeError(f"cudaMemcpyBatchAsync (ctypes) returned error {rc}")
        elif mode == "bindings":
            rt = self._rt
            attrs = rt.cudaMemcpyAttributes()
            attrs.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
            res = rt.cudaMemcpyBatchAsync(dsts.tolist(), srcs.tolist(), sizes.tolist(), n,
                                          [attrs], [0], 1, stream.ptr)
            err = res[0] if isinstance(res, tuple) else res
            if int(err) != 0:
                raise RuntimeError(f"cudaMemcpyBatchAsync (cuda-bindings) returned {err}")
        elif mode == "loop":
            memcpy = self.cp.cuda.runtime.memcpyAsync
            for dd, ss, zz in zip(dsts.tolist(), srcs.tolist(), sizes.tolist()):
                memcpy(dd, ss, zz, CUDA_MEMCPY_DEFAULT, stream.ptr)
        else:
            raise ValueError(f"copy engine mode: got {mode!r}; expected one of {self.MODES}")

    def self_test(self, host_ptr: int, host_view: np.ndarray) -> str:
        """Pick the first mode that copies two scattered pieces correctly (host_view: a
        pinned uint8 array of >= 8 KiB at host_ptr)."""
        cp = self.cp
        dev = cp.zeros(8192, dtype=cp.uint8)
        s = cp.cuda.Stream(non_blocking=True)
        for mode in self.MODES:
            if mode == "ctypes" and self._fn is None:
                self.errors[mode] = "no libcudart with cudaMemcpyBatchAsync found"
                continue
            if mode == "bindings" and self._rt is None:
                self.errors[mode] = "cuda-bindings not importable"
                continue
            try:
                pattern = np.random.default_rng(len(mode)).integers(0, 255, 8192, dtype=np.uint8)
                host_view[:8192] = pattern
                dev.fill(0)
                dp = int(dev.data.ptr)
                self.copy(s, np.array([dp + 4096, dp], np.uint64), np.array([host_ptr, host_ptr + 4096], np.uint64),
                          np.array([4096, 4096], np.uint64), mode)
                s.synchronize()
                got = cp.asnumpy(dev)
                if np.array_equal(got[4096:], pattern[:4096]) and np.array_equal(got[:4096], pattern[4096:]):
                    self.mode = mode
                    return mode
                self.errors[mode] = "copied the wrong bytes"
            except Exception as e:  # an API mismatch: try the next mode
                self.errors[mode] = f"{type(e).__name__}: {e}"
        raise RuntimeError(f"no copy-engine mode works: {self.errors}")
