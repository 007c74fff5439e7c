"""GPU <-> host and GPU -> GPU copies of the hw backend, and the copy path each takes.

GPU <-> host batches (the host tier, or a staging buffer of a disk transfer) take one of
two paths: the copy engine (one batched ``cudaMemcpyBatchAsync`` per batch) or the SM
kernel (gather/scatter CTAs reading mapped host memory zero-copy, ``ctas[direction]`` of
them, or the batch's own count). The host tier's batches come with the path and CTAs the
backend's rule chose for them; a staging buffer's take ``paths[direction]``. In CPU mode
every copy is a numpy row copy on the I/O pool.

Invariants: a copy never decides which pages move (it executes the slots it is given);
a GPU copy waits for the last fill (``StreamOrder.wait_fill``), and a write into GPU slots
waits for an unseen check of them (``StreamOrder.wait_checks``); the arrays a copy reads
live until its stream has passed it.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kvsim.core.datapath.copypath import DIRECTIONS, CopyPath, direction_paths, pinned_paths
from kvsim.core.datapath.fill import registration_unit
from kvsim.core.spec import Level

from .memory import HostRegion

SM_FIRST_PAGES = 1024  # the SM kernel's first piece of a batch (then doubling)


def copy_rows(src_view: np.ndarray, src: np.ndarray, dst_view: np.ndarray, dst: np.ndarray) -> None:
    dst_view[dst] = src_view[src]


def pinned_for(profile, page_bytes: int, host, host_slots: int, on_gpu: bool,
               force: Mapping[str, CopyPath | None],
               kernel_on_coherent_link: bool = False) -> dict[str, CopyPath | None]:
    """Each direction's pinned path (``kvsim.core.datapath.copypath.pinned_paths``), as
    ``choose_paths`` sees the host tier: without a mapped device address on a GPU, the
    copy engine both ways."""
    if on_gpu and host is not None and host.dev_ptr is None:
        return {d: CopyPath.COPY_ENGINE for d in DIRECTIONS}
    unit = registration_unit(host.backing, host.layout) if (host is not None and on_gpu) else None
    return pinned_paths(profile, page_bytes, force, unit, host_slots, kernel_on_coherent_link)


def choose_paths(profile, page_bytes: int, host, host_slots: int, on_gpu: bool,
                 force: Mapping[str, CopyPath | None],
                 kernel_on_coherent_link: bool = False) -> dict[str, CopyPath]:
    """The copy path of each direction, by the rule the sim backend applies
    (``kvsim.core.datapath.copypath.direction_paths``; ``force``: a path or None per
    direction). ``host``: the host tier (a HostFill or None) of ``host_slots`` slots, its
    registration units those of its fill (``registration_unit``), registered on a GPU
    only. On a GPU, host memory without a mapped device address takes the copy engine:
    forcing the SM kernel there, or pages that straddle its registration units, is a
    ValueError."""
    if on_gpu and host is not None and host.dev_ptr is None:
        # host memory without a mapped device address: the SM kernel cannot reach it
        for d in DIRECTIONS:
            if force.get(d) is CopyPath.SM_KERNEL:
                raise ValueError(f"copy_path.{d}: the SM kernel needs mapped host memory, "
                                 "not available here")
        force = {d: CopyPath.COPY_ENGINE for d in DIRECTIONS}
    unit = registration_unit(host.backing, host.layout) if (host is not None and on_gpu) else None
    try:
        return direction_paths(profile, page_bytes, force, unit, host_slots, kernel_on_coherent_link)
    except ValueError:
        if host is not None and host.dev_ptr is None:
            raise ValueError("host registration: pages straddle registration units, which needs "
                             "the SM kernel, but the host memory has no mapped device address") from None
        raise


class Copies:
    """Copies between the GPU arena ``gpu`` and ``host`` (HostRegion or None), on
    ``streams`` with ``kernels`` and ``copier`` (GPU mode) or on the I/O pool (``cp`` None).
    ``paths`` and ``ctas``: per direction ('h2d', 'd2h')."""

    def __init__(self, cp, page_bytes: int, gpu, host: HostRegion | None, waits, *,
                 paths: dict[str, CopyPath], ctas: dict[str, int], threads_per_cta: int,
                 streams: dict | None = None, kernels=None, copier=None, order=None):
        self.cp = cp
        self.page_bytes = page_bytes
        self.gpu = gpu
        self.host = host
        self.waits = waits
        self.paths = paths
        self.ctas = ctas
        self.threads_per_cta = threads_per_cta
        self.streams = streams
        self.kernels = kernels
        self.copier = copier
        self.order = order
        self._size_arr: np.ndarray | None = None

    def gpu_host(self, src_level: Level, src, dst, path: CopyPath, ctas: int | None = None) -> Any:
        """Host tier <-> GPU; a waitable. ``ctas``: the SM kernel's (None: ``ctas``'s)."""
        if self.cp is None:
            sv, dv = (self.host.view, self.gpu.view) if src_level == Level.HOST else (self.gpu.view, self.host.view)
            return self.waits.on_pool(copy_rows, sv, src, dv, dst)
        try:
            s, keep = self.enqueue_gpu_host(src_level, src, dst, path, self.host, ctas)
        except Exception as e:
            return self.waits.fail("gpu<->host copy", e)
        return self.waits.cuda_done(self.cp, s, keep)

    def gpu_gpu(self, src, dst) -> Any:
        if self.cp is None:
            return self.waits.on_pool(copy_rows, self.gpu.view, src, self.gpu.view, dst)
        cp, s = self.cp, self.streams["d2d"]
        self.order.wait_fill(s)
        self.order.wait_checks(s, dst)
        try:
            with s:
                ds, dd = cp.asarray(src), cp.asarray(dst)
                self.gpu.view[dd] = self.gpu.view[ds]
        except Exception as e:
            return self.waits.fail("gpu->gpu copy", e)
        return self.waits.cuda_done(cp, s, (ds, dd))

    def to_staging(self, buf: HostRegion, g_slots) -> Any:
        """Copy GPU slots into staging rows 0..k-1; a waitable."""
        rows = np.arange(len(g_slots), dtype=np.int64)
        if self.cp is None:
            return self.waits.on_pool(copy_rows, self.gpu.view, g_slots, buf.view, rows)
        s, keep = self.enqueue_gpu_host(Level.GPU, g_slots, rows, self.paths["d2h"], buf)
        return self.waits.cuda_done(self.cp, s, keep)

    def from_staging(self, buf: HostRegion, g_slots) -> Any:
        """Copy staging rows 0..k-1 into GPU slots; a waitable."""
        rows = np.arange(len(g_slots), dtype=np.int64)
        if self.cp is None:
            return self.waits.on_pool(copy_rows, buf.view, rows, self.gpu.view, g_slots)
        s, keep = self.enqueue_gpu_host(Level.HOST, rows, g_slots, self.paths["h2d"], buf)
        return self.waits.cuda_done(self.cp, s, keep)

    def enqueue_gpu_host(self, src_level: Level, src, dst, path: CopyPath, host: HostRegion,
                         ctas: int | None = None):
        """Enqueue a GPU <-> host copy (``host`` is the host tier or a staging buffer;
        ``ctas``: the SM kernel's, None: ``ctas``'s); returns (stream, arrays to keep alive)."""
        pb = self.page_bytes
        d = "h2d" if src_level == Level.HOST else "d2h"
        s = self.streams[d]
        self.order.wait_fill(s)
        if d == "h2d":
            self.order.wait_checks(s, dst)
        g_ptr = self.gpu.ptr
        if path == CopyPath.SM_KERNEL and host.dev_ptr is not None:
            # Pieces of growing size (SM_FIRST_PAGES, then doubling; the last takes the rest
            # when it is at most twice the step): the host prepares and uploads piece k+1
            # while the kernel of piece k runs, so only the first piece's preparation is
            # outside the copy (65536 slots cost ~0.5 ms of host time before one launch,
            # 2.3% of a 1 GiB batch of 16 KiB pages).
            sp, dp = (host.dev_ptr, g_ptr) if d == "h2d" else (g_ptr, host.dev_ptr)
            ctas = ctas or self.ctas[d]
            keep, n, a, step = [], len(src), 0, SM_FIRST_PAGES
            while a < n:
                b = n if n - a <= 2 * step else a + step
                ds, dd, k = self.upload_slots(s, src[a:b], dst[a:b])
                self.kernels.copy_pages(s, sp, dp, ds, dd, pb, ctas, self.threads_per_cta)
                keep.append(k)
                a, step = b, 2 * step
            return s, keep
        sb, db = (host.ptr, g_ptr) if d == "h2d" else (g_ptr, host.ptr)
        pbu = np.uint64(pb)
        srcs = src.astype(np.uint64)
        srcs *= pbu
        srcs += np.uint64(sb)
        dsts = dst.astype(np.uint64)
        dsts *= pbu
        dsts += np.uint64(db)
        sizes = self._sizes(len(src))
        self.copier.copy(s, dsts, srcs, sizes, attrs=d)
        return s, (srcs, dsts, sizes)

    def _sizes(self, n: int) -> np.ndarray:
        """``n`` page sizes (uint64) for a batched copy-engine call: a slice of one array
        kept for the backend's life (never written after it is made)."""
        z = self._size_arr
        if z is None or len(z) < n:
            z = self._size_arr = np.full(max(n, 1024), self.page_bytes, dtype=np.uint64)
        return z[:n]

    def upload_slots(self, stream, src, dst):
        """Two int64 slot arrays on the device: one array [src..., dst...] written into
        pinned memory from CuPy's pinned pool and copied with one async memcpy on
        ``stream`` (no pageable staging, no synchronous upload); returns (src view, dst
        view, what to keep alive until the stream passes the kernel that reads them)."""
        cp = self.cp
        n = len(src)
        mem = cp.cuda.alloc_pinned_memory(16 * n)
        h = np.ndarray((2 * n,), dtype=np.int64, buffer=mem)
        h[:n] = src
        h[n:] = dst
        dev = cp.empty(2 * n, dtype=cp.int64)
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, h.ctypes.data, 16 * n, 1, stream.ptr)
        return dev[:n], dev[n:], (mem, h, dev)
