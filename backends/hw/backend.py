"""HwBackend: kvsim.backend.Backend on real bytes (a GPU with CuPy, or numpy in CPU mode).

Tiers: GPU = one device allocation carved into slots (CPU mode: a numpy array standing
in for device memory); HOST = pinned host memory (anonymous mmap registered in 512 MiB
units; CPU mode: plain mmap); DISK = one preallocated private file (``disk.DiskStore``).
GPU <-> disk goes through pinned staging buffers, two at a time per transfer (one copying
while the other is read or written).

GPU <-> host batches take one of two paths: the copy engine (one batched
``cudaMemcpyBatchAsync`` per batch) or the SM kernel (gather/scatter CTAs reading mapped
host memory zero-copy). The default comes from ``kvsim.core.copypath.choose_copy_path``;
the kernel's CTA count from ``copy_ctas`` with a per-CTA rate measured at construction.

Invariants:
- the backend never decides which pages move: it executes Batches as given;
- a transfer's waitable succeeds with True only when every byte landed; failures (a
  CUDA error, a failed or short pread/pwrite, ENOSPC, a vanished disk file, a read of a
  disk slot whose write never completed) succeed it with False and are recorded in
  ``errors``; nothing is raised into the engine;
- ``fill`` happens-before every later transfer and ``read_tags``: transfer streams wait
  on the last fill's event;
- all CUDA calls and all generator steps run on the runtime's thread; only pread/pwrite
  (and CPU-mode copies) run on the I/O pool.
"""

from __future__ import annotations

import collections
import os
import threading
from time import perf_counter as _clock
from typing import Any

import numpy as np

from kvsim.core.copypath import CopyPath, choose_copy_path, copy_ctas
from kvsim.core.plan import Batch, Fill
from kvsim.core.spec import Level

from . import pattern
from .disk import IO_THREADS, PIECE_BYTES, DiskStore
from .memory import DeviceArena, HostRegion, StagingPool


def _load_cupy():
    try:
        import cupy as cp  # noqa: PLC0415
        if cp.cuda.runtime.getDeviceCount() > 0:
            return cp
    except Exception:
        pass
    return None


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name}: got {value!r}; expected a positive integer")
    return int(value)


class HwBackend:
    """See the module docstring. ``runtime`` must be a RealtimeRuntime (or offer its
    ``watch`` and ``external``)."""

    name = "hw"

    def __init__(self, runtime, page_bytes: int, slots: dict[Level, int], disk_dir=None,
                 device: str = "auto", io_threads: int = IO_THREADS, piece_bytes: int = PIECE_BYTES,
                 copy_path: CopyPath | str | None = None, refcheck: bool = True, *,
                 profile=None, link_kind: str = "pcie", link_bytes_per_s: float = 55.5e9,
                 per_copy_host_s: float = 5e-6, per_cta_bytes_per_s: float | None = None,
                 threads_per_cta: int = 128, sm_ctas: int | None = None,
                 staging_bytes: int = 64 << 20, compute_chunk_s: float = 0.5e-3,
                 cta_headroom: float = 2.0, io_hook=None, direct_io: bool = True,
                 disk_preallocate: bool = True, timing_log: list | None = None,
                 compute_graphs: bool = True, compute_log: list | None = None,
                 host_log: list | None = None):
        for attr in ("watch", "external", "process", "event", "timeout"):
            if not hasattr(runtime, attr):
                raise TypeError(f"runtime: {type(runtime).__name__} has no {attr}(); "
                                "HwBackend needs a RealtimeRuntime")
        self.runtime = runtime
        self.page_bytes = _positive_int("page_bytes", page_bytes)
        if self.page_bytes % 16:
            raise ValueError(f"page_bytes: got {page_bytes!r}; expected a multiple of 16 bytes")
        if not isinstance(slots, dict) or Level.GPU not in slots:
            raise ValueError(f"slots: got {slots!r}; expected a dict with at least Level.GPU")
        self.slots = {Level(k): _positive_int(f"slots[{Level(k).name}]", v) for k, v in slots.items()}
        io_threads = _positive_int("io_threads", io_threads)
        self.piece_bytes = _positive_int("piece_bytes", piece_bytes)
        if device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device: got {device!r}; expected 'auto', 'cpu' or 'gpu'")
        if Level.DISK in self.slots and disk_dir is None:
            raise ValueError("disk_dir: a disk tier (slots[DISK]) needs a directory")
        if profile is not None:
            link_kind = profile.link.kind
            link_bytes_per_s = min(profile.link.h2d, profile.link.d2h)
            per_copy_host_s = profile.copy_engine.per_page
            threads_per_cta = profile.sm.threads_per_cta
        self.refcheck = bool(refcheck)
        self.errors: collections.deque[str] = collections.deque(maxlen=100)
        # optional per-batch timing log: dicts (t_s, src, dst, pages, bytes, path, seconds),
        # seconds of wall time from the start of transfer() (its own host time counts: the
        # batched copy call, the slot upload) to the runtime seeing the completion
        self.timing_log = timing_log
        # optional per-compute log, a row a call: [start s, nominal s, seconds it took,
        # seconds until the loop saw it done, gpu gap s, host lag s]. took: on a GPU its
        # time between two events on the compute stream, in sim seconds; in CPU mode the
        # nominal time. seen - took is the time the stream waited before it started, plus
        # the loop's lateness in seeing it end. gpu gap: the compute stream's GPU time from
        # the previous compute's end to this one's start (None for the first call and in
        # CPU mode). host lag: how far the wall clock was past the loop's ``now`` when
        # compute() was called, i.e. the loop's own time since the event that woke it (the
        # engine's host work between two steps, and any lateness in seeing that event)
        self.compute_log = compute_log
        # optional log of the loop thread's own slow calls: [t s, what, seconds] for each
        # of transfer() (its enqueue), fill(), compute() (its launch) and the reading of a
        # GPU check's tags that held the loop HOST_LOG_MIN_S or more
        self.host_log = host_log
        self._last_b = None  # (compute_log) the last compute's end event
        self._compute = {"compute_calls": 0, "compute_s": 0.0, "compute_nominal_s": 0.0}
        self._bytes = {"host_to_gpu": 0, "gpu_to_host": 0, "disk_read": 0, "disk_write": 0}
        self._counts = {"transfers": 0, "failed_transfers": 0}
        self._fail_next = 0
        self.cp = _load_cupy() if device != "cpu" else None
        self.pinned_index = True  # SM kernel slot arrays through pinned memory (_upload_slots)
        self.sm_first_pages = 1024  # the SM kernel's first piece of a batch (then doubling)
        self._size_arr: np.ndarray | None = None
        if device == "gpu" and self.cp is None:
            raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
        self.on_gpu = self.cp is not None
        self.threads_per_cta = _positive_int("threads_per_cta", threads_per_cta)
        self.compute_chunk_s = compute_chunk_s
        self._compute_graphs = compute_graphs  # launch_busy through CUDA graphs (gpu.Kernels)
        if not cta_headroom >= 1:
            raise ValueError(f"cta_headroom: got {cta_headroom!r}; expected >= 1")
        self.cta_headroom = float(cta_headroom)
        self._closed = False
        self._lock = threading.Lock()
        self.disk: DiskStore | None = None
        self.host: HostRegion | None = None
        self.info: dict[str, Any] = {"device": "gpu" if self.on_gpu else "cpu"}
        try:
            self._build(io_threads, disk_dir, io_hook, direct_io, staging_bytes, disk_preallocate)
            self._choose_paths(copy_path, link_kind, link_bytes_per_s, per_copy_host_s,
                               per_cta_bytes_per_s, sm_ctas, profile)
        except BaseException:
            self.close()
            raise

    # -- construction ---------------------------------------------------------------

    def _build(self, io_threads, disk_dir, io_hook, direct_io, staging_bytes, disk_preallocate=True) -> None:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415
        cp = self.cp
        cuda_rt = cp.cuda.runtime if cp is not None else None
        self.pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="kvsim-hw")
        # the refcheck's host-side verification (host and disk pages; numpy, which
        # releases the GIL): tiles of the pages checked on every core, where there are
        # enough of them (on 2 vCPUs the pool measured no gain: benchmarks/refcheck_verify.py)
        cores = os.cpu_count() or 1
        self.check_pool = (ThreadPoolExecutor(max_workers=min(16, cores), thread_name_prefix="kvsim-check")
                           if cores >= 4 else None)
        self.gpu = DeviceArena(cp if cp is not None else np, self.slots[Level.GPU], self.page_bytes)
        if Level.HOST in self.slots:
            self.host = HostRegion(self.slots[Level.HOST], self.page_bytes, cuda_rt)
        if Level.DISK in self.slots:
            self.disk = DiskStore(disk_dir, self.slots[Level.DISK], self.page_bytes, io_threads,
                                  self.piece_bytes, io_hook, direct=direct_io,
                                  preallocate=disk_preallocate)
            self.info["disk_direct_io"] = self.disk.uses_direct
        staging_pages = max(1, staging_bytes // self.page_bytes)
        self.staging = StagingPool(staging_pages, self.page_bytes, cuda_rt)
        if cp is None:
            return
        from .gpu import BatchCopier, Kernels  # noqa: PLC0415
        self.kernels = Kernels(cp)
        # Copies and checks go on streams of the highest priority, compute on the lowest:
        # when a busy kernel's CTAs retire, a waiting copy or check kernel's CTAs start
        # before the next busy kernel's (docs/hw-notes.md, 21:46 UTC: a one-page host check
        # took a median 759 us behind a busy compute, 93 us alone).
        # (CUDA clamps a priority to the device's range: -1000 is its highest, 0 its lowest.)
        S = lambda prio: cp.cuda.Stream(non_blocking=True, priority=prio)  # noqa: E731
        self.streams = {"h2d": S(-1000), "d2h": S(-1000), "d2d": S(-1000), "misc": S(-1000),
                        "compute": S(0)}
        self.info["stream_priorities"] = {k: s.priority for k, s in self.streams.items()}
        self._fill_event = None
        self._fill_keep: collections.deque = collections.deque()  # (event, upload buffers) of fills the GPU may not have run
        self._fill_waited: dict[int, Any] = {}  # stream ptr -> the fill event it last waited on
        self._check_event = None  # the last GPU-page check enqueued (all on the misc stream)
        self._check_waited: dict[int, Any] = {}
        # GPU slots under a check the loop has not yet seen finish (a count a slot: checks
        # of a shared prefix overlap). Only a write into one of these waits for the checks.
        self._checking = np.zeros(self.slots.get(Level.GPU, 0), dtype=np.int32)
        self.copier = BatchCopier(cp)
        probe = self.staging.get()
        try:
            self.info["copy_engine_mode"] = self.copier.self_test(probe.ptr, probe.flat) \
                if probe.nbytes >= 8192 else None
        finally:
            self.staging.put(probe)
        self.info["busy_iters_per_s"] = self.kernels.calibrate_busy()
        self.kernels.use_graphs = self.info["compute_graphs"] = bool(self._compute_graphs)
        self.info["sm_count"] = self.kernels.sm_count

    def _choose_paths(self, force, link_kind, link_bps, per_copy_s, per_cta_bps, sm_ctas, profile) -> None:
        force = CopyPath(force) if force is not None else None
        if self.on_gpu and self.host is not None and self.host.dev_ptr is None:
            if force is CopyPath.SM_KERNEL:
                raise ValueError("copy_path: the SM kernel needs mapped host memory, not available here")
            force = CopyPath.COPY_ENGINE
        # per direction, as the sim backend chooses: with a profile, the direction's own
        # link rate, per-page host cost and SM ceiling (HardwareProfile.copy_path_args)
        if profile is not None:
            self.copy_paths = {d: choose_copy_path(**profile.copy_path_args(d, self.page_bytes), force=force)
                               for d in ("h2d", "d2h")}
        else:
            path = choose_copy_path(link_kind, self.page_bytes, per_copy_s, link_bps, force=force)
            self.copy_paths = {"h2d": path, "d2h": path}
        self.copy_path = self.copy_paths["h2d"]  # host -> GPU's; copy_paths has both
        self.info["copy_path"] = self.copy_path.value
        self.info["copy_paths"] = {d: p.value for d, p in self.copy_paths.items()}
        max_ctas = self.kernels.sm_count if self.on_gpu else 132
        if sm_ctas is not None:
            self.ctas = {"h2d": _positive_int("sm_ctas", sm_ctas), "d2h": int(sm_ctas)}
            return
        if per_cta_bps is None and self.on_gpu and self.host is not None and self.host.dev_ptr is not None:
            per = self.measure_cta_rates()
        elif per_cta_bps is None and profile is not None:
            per = {"h2d": profile.sm.cta_onboard, "d2h": profile.sm.cta_offload}
        else:
            per = {"h2d": per_cta_bps or 2.3e9, "d2h": per_cta_bps or 2.3e9}
        # Little's law with headroom: per-CTA rates measured with few CTAs sag as the link fills
        self.ctas = {k: copy_ctas(link_bps * self.cta_headroom, per[k], max_ctas) for k in ("h2d", "d2h")}
        self.info["per_cta_bytes_per_s"] = per
        self.info["sm_ctas"] = dict(self.ctas)

    def measure_cta_rates(self, ctas: int = 4, nbytes: int = 64 << 20) -> dict[str, float]:
        """Bytes per second one copy CTA moves each way (SM kernel, ``ctas`` CTAs, pages in
        random order between the host tier and the GPU tier, median of 3)."""
        cp = self.cp
        n = max(1, min(nbytes // self.page_bytes, self.host.slots, self.gpu.slots))
        rng = np.random.default_rng(0)
        hs = cp.asarray(rng.permutation(self.host.slots)[:n].astype(np.int64))
        gs = cp.asarray(rng.permutation(self.gpu.slots)[:n].astype(np.int64))
        out = {}
        for d, (sp, dp, ss, ds) in {"h2d": (self.host.dev_ptr, self.gpu.ptr, hs, gs),
                                    "d2h": (self.gpu.ptr, self.host.dev_ptr, gs, hs)}.items():
            s = self.streams[d]
            rates = []
            for _ in range(4):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(s)
                self.kernels.copy_pages(s, sp, dp, ss, ds, self.page_bytes, ctas, self.threads_per_cta)
                b.record(s)
                b.synchronize()
                rates.append(n * self.page_bytes / (cp.cuda.get_elapsed_time(a, b) / 1e3) / ctas)
            out[d] = float(np.median(rates[1:]))
        return out

    # -- the Backend protocol ---------------------------------------------------------

    def transfer(self, batch: Batch, path: CopyPath | None = None) -> Any:
        """Move one batch. ``path`` overrides the copy path for GPU <-> host (benchmarks)."""
        t0 = _clock()  # the timing log counts this call's own host time too
        io: list = []  # a disk batch's jobs: (start, end) of each on its I/O thread
        if self._fail_next > 0 and batch.pages:
            self._fail_next -= 1
            ev = self._injected_failure(batch)
        else:
            ev = self._transfer(batch, path, io)
        if self.host_log is not None:
            self._host_time(f"transfer {batch.src.name.lower()}->{batch.dst.name.lower()} "
                            f"{int(batch.pages)}", t0)
        if batch.pages:
            self._account(batch, ev, path, t0, io)
        return ev

    def fail_next_transfer(self, n: int = 1) -> None:
        """Test hook: the next ``n`` transfers fail: their destination slots get garbage (a
        disk slot is marked as holding no completed write) and they succeed with False."""
        self._fail_next += _positive_int("n", n)

    def _injected_failure(self, batch: Batch) -> Any:
        dst = np.asarray(batch.dst_slots, dtype=np.int64)
        lv = Level(batch.dst)
        if lv == Level.DISK:
            self.disk.valid[dst] = False
        elif lv == Level.GPU and self.on_gpu:
            self.gpu.view[self.cp.asarray(dst)] = 0xAD
            self.cp.cuda.Device().synchronize()
        else:
            self._view(lv)[dst] = 0xAD
        self.errors.append(f"injected failure of a {batch.src.name}->{batch.dst.name} batch")
        return self._done(False)

    def path_name(self, src: Level, dst: Level, path: CopyPath | None = None) -> str:
        """The data path a batch from ``src`` to ``dst`` takes (for logs and comparisons)."""
        d = "h2d" if src == Level.DISK or dst == Level.GPU else "d2h"
        return transfer_path_name(src, dst, (path or self.copy_paths[d]).value)

    def _account(self, batch: Batch, ev, path, t0: float, io: list) -> None:
        sim0 = self.runtime.now
        log = self.timing_log
        nbytes = int(batch.pages) * self.page_bytes

        def done(e):
            ok = bool(e.value) if e.ok else False
            self._counts["transfers"] += 1
            if not ok:
                self._counts["failed_transfers"] += 1
            else:
                for k in _TRAFFIC.get((batch.src, batch.dst), ()):
                    self._bytes[k] += nbytes
            if log is not None:
                row = {"t_s": sim0, "src": batch.src.name.lower(), "dst": batch.dst.name.lower(),
                       "pages": int(batch.pages), "bytes": nbytes,
                       "path": self.path_name(batch.src, batch.dst, path),
                       "seconds": _clock() - t0, "ok": ok}
                if io:  # a disk batch: when its first piece started and its last ended
                    row["io_start_s"] = min(a for a, _ in io) - t0
                    row["io_end_s"] = max(b for _, b in io) - t0
                log.append(row)

        if ev.callbacks is None:
            done(ev)
        else:
            ev.callbacks.append(done)

    def stats(self) -> dict:
        """Bytes moved by completed transfers (the names the engine's summary reads)."""
        out: dict = dict(self._bytes)
        out.update(self._counts)
        c = self._compute
        out["compute_calls"] = c["compute_calls"]
        out["compute_s"] = c["compute_s"]
        out["compute_stretch_s"] = c["compute_s"] - c["compute_nominal_s"]
        out["copy_path"] = self.copy_path.value
        out["copy_path_h2d"] = self.copy_paths["h2d"].value
        out["copy_path_d2h"] = self.copy_paths["d2h"].value
        return out

    def _transfer(self, batch: Batch, path: CopyPath | None, io: list) -> Any:
        """``io`` gets a disk batch's jobs' (start, end) on the I/O threads."""
        if self._closed:
            raise RuntimeError("the backend is closed")
        if batch.page_bytes != self.page_bytes:
            raise ValueError(f"batch.page_bytes: got {batch.page_bytes}; this backend's pages "
                             f"are {self.page_bytes} bytes")
        src = np.asarray(batch.src_slots, dtype=np.int64)
        dst = np.asarray(batch.dst_slots, dtype=np.int64)
        if src.shape != dst.shape:
            raise ValueError(f"batch: {src.shape[0]} source slots but {dst.shape[0]} destination slots")
        small = src.size <= _SMALL
        for lv, s in ((batch.src, src), (batch.dst, dst)):
            n = self.slots.get(lv)
            if n is None:
                raise ValueError(f"batch: this backend has no {lv.name} tier")
            if not s.size:
                continue
            if small:
                v = s.tolist()
                bad = min(v) < 0 or max(v) >= n
            else:  # one pass: a negative slot seen as uint64 is >= 2**63 > n
                bad = int(s.view(np.uint64).max()) >= n
            if bad:
                raise IndexError(f"batch: a {lv.name} slot is outside 0..{n - 1}")
        if src.size == 0:
            return self._done(True)
        key = (batch.src, batch.dst)
        if key in ((Level.HOST, Level.GPU), (Level.GPU, Level.HOST)):
            d = "h2d" if batch.src == Level.HOST else "d2h"
            return self._gpu_host(batch.src, src, dst, path or self.copy_paths[d])
        if key == (Level.GPU, Level.GPU):
            return self._gpu_gpu(src, dst)
        if key == (Level.HOST, Level.DISK):
            return self.runtime.process(self._host_to_disk(src, dst, io))
        if key == (Level.DISK, Level.HOST):
            return self.runtime.process(self._disk_to_host(src, dst, io))
        if key == (Level.GPU, Level.DISK):
            return self.runtime.process(self._gpu_to_disk(src, dst, io))
        if key == (Level.DISK, Level.GPU):
            return self.runtime.process(self._disk_to_gpu(src, dst, io))
        raise ValueError(f"batch: no transfer from {batch.src.name} to {batch.dst.name}")

    def compute(self, duration_s: float) -> Any:
        if duration_s < 0:
            raise ValueError(f"duration_s: got {duration_s!r}; expected >= 0")
        rt = self.runtime
        h0 = _clock()
        t0 = rt.now
        lag = rt.wall_now() - t0 if self.compute_log is not None else 0.0
        gap = None  # (compute_log) the compute stream's idle GPU time before this compute
        if not self.on_gpu or duration_s == 0:
            ev = rt.timeout(duration_s, duration_s)
        else:
            cp, s = self.cp, self.streams["compute"]
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(s)
            self.kernels.launch_busy(s, rt.sim_to_wall(duration_s), self.compute_chunk_s)
            b.record(s)
            ev = rt.watch(lambda: (b.done, rt.wall_to_sim(cp.cuda.get_elapsed_time(a, b) / 1e3))
                          if b.done else (False, None))
            if self.compute_log is not None:
                prev, self._last_b = self._last_b, b
                if prev is not None:  # read once both have passed (when this one is seen)
                    gap = lambda: rt.wall_to_sim(cp.cuda.get_elapsed_time(prev, a) / 1e3)  # noqa: E731
        ev.callbacks.insert(0, lambda e: self._count_compute(t0, duration_s, e.value, gap, lag))
        if self.host_log is not None:
            self._host_time("compute", h0)
        return ev

    def _count_compute(self, t0: float, nominal_s: float, took_s: float, gap=None, lag: float = 0.0) -> None:
        c = self._compute
        c["compute_calls"] += 1
        c["compute_s"] += took_s
        c["compute_nominal_s"] += nominal_s
        if self.compute_log is not None:
            self.compute_log.append([t0, nominal_s, took_s, self.runtime.now - t0,
                                     gap() if gap is not None else None, lag])

    def _timed(self, fn, what: str):
        """``fn`` whose calls log their host time in ``host_log`` (as ``_host_time``)."""
        def timed():
            t0 = _clock()
            out = fn()
            self._host_time(what, t0)
            return out
        return timed

    def _host_time(self, what: str, t0: float) -> None:
        dt = _clock() - t0
        if dt >= HOST_LOG_MIN_S:
            self.host_log.append([self.runtime.now, what, dt])  # type: ignore[union-attr]

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool) -> float | None:
        # real time cannot be predicted with transfers in flight; with none, the engine
        # may run ahead and the GPU computes the whole span at catch_up
        return start_s + seconds if quiet else None

    def catch_up(self, until_s: float) -> Any:
        return self.compute(max(0.0, until_s - self.runtime.now))

    def fill(self, fill: Fill) -> None:
        t0 = _clock()
        self._fill(fill)
        if self.host_log is not None:
            self._host_time(f"fill {Level(fill.level).name.lower()} {len(fill.slots)}", t0)

    def _fill(self, fill: Fill) -> None:
        slots = np.asarray(fill.slots, dtype=np.int64)
        tags = np.asarray(fill.tags, dtype=np.uint64)
        if slots.size == 0:
            return
        lv = Level(fill.level)
        if lv == Level.GPU and self.on_gpu:
            # on the compute stream: the step that produced these pages wrote them, so they
            # are written in stream order right after it, before the next step's kernels.
            # (On the misc stream the fill waited for a free SM behind the next step's busy
            # chunks, and every GPU -> host copy waits for the last fill: one-page evictions
            # took a median 247 us under replay load against ~100 us idle; docs/hw-notes.md.)
            self._enqueue_fill(slots, tags)
        elif lv == Level.DISK:
            rows = np.empty((len(slots), self.page_bytes), dtype=np.uint8)
            pattern.write_pages(rows, np.arange(len(slots)), tags, self.refcheck)
            for f in self.disk.submit_writes(slots, rows):
                f.result()
            self.disk.mark_written(slots)
        else:
            pattern.write_pages(self._view(lv), slots, tags, self.refcheck)

    def read_tags(self, level: Level, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.int64)
        lv = Level(level)
        if slots.size == 0:
            return np.zeros(0, dtype=np.uint64)
        if lv == Level.GPU and self.on_gpu:
            tags, ev, _ = self._enqueue_check(self.gpu.ptr, slots)
            ev.synchronize()
            return tags()
        if lv == Level.DISK:
            return pattern.verify_rows(self.disk.read_rows(slots), self.refcheck, self.check_pool)
        return pattern.verify_pages(self._view(lv), slots, self.refcheck, self.check_pool)

    def read_tags_later(self, level: Level, slots: np.ndarray) -> Any:
        """``read_tags`` while the runtime's loop runs on (the refcheck of a replay): GPU
        pages, and host pages through the host tier's mapped device address, by the
        ``kv_check`` kernel on the GPU (a CUDA event completes it; host pages cross the
        link at its speed instead of numpy's ~1.4-1.9 GB/s on one core, which a pool of
        16 did not speed up on the H200: docs/hw-notes.md); disk pages (and everything
        in CPU mode) read back and checked on an I/O thread. The waitable succeeds with
        the tags found; if reading fails, with no tags at all (so the check fails loudly)
        and the error in ``errors``."""
        h0 = _clock()
        slots = np.asarray(slots, dtype=np.int64)
        lv = Level(level)
        if slots.size == 0:
            return self._done(np.zeros(0, dtype=np.uint64))
        base = None
        if self.on_gpu and lv == Level.GPU:
            base = self.gpu.ptr
        elif self.on_gpu and lv == Level.HOST and self.host is not None and self.host.dev_ptr is not None:
            base = self.host.dev_ptr
        if base is not None:
            tags, done_ev, keep = self._enqueue_check(base, slots)
            if self.host_log is not None:
                where = f"{lv.name.lower()} {len(slots)}"
                self._host_time(f"check enqueue {where}", h0)
                tags = self._timed(tags, f"check tags {where}")
            if lv != Level.GPU:
                return self.runtime.watch(lambda: (True, tags())
                                          if done_ev.done and keep is not None else (False, None))
            # A write into these slots before the loop sees the check finish waits for it
            # (a resumed request's check runs on while the request may end and its slots be
            # reused); writes into other slots do not wait.
            self._check_event = done_ev
            checking = self._checking
            checking[slots] += 1

            def poll():
                if not done_ev.done or keep is None:  # (keep: alive until the kernel is done)
                    return False, None
                checking[slots] -= 1
                return True, tags()
            return self.runtime.watch(poll)
        ev, trigger = self.runtime.external()
        n = len(slots)

        def done(f):
            exc = f.exception()
            if exc is not None:
                self.errors.append(f"refcheck read of {n} {lv.name} page(s): {type(exc).__name__}: {exc}")
            trigger(np.zeros(n, dtype=np.uint64) if exc is not None else f.result())

        self.pool.submit(self.read_tags, lv, slots).add_done_callback(done)
        return ev

    def resumed(self, pages: int) -> None:
        pass  # the loop's host work for a resume was real time: the compute log's host lag

    def _enqueue_fill(self, slots: np.ndarray, tags: np.ndarray, span_words: int = 0) -> None:
        """``kv_fill`` of GPU ``slots`` on the compute stream, a CTA a part of ``span_words``
        words of a page (0: FILL_SPAN_WORDS; without the refcheck only word 0 is written, a
        CTA a page); later GPU -> host copies wait for it (``_wait_fill``)."""
        cp, s = self.cp, self.streams["compute"]
        self._wait_checks(s, slots)
        # slots and tags in one async upload from pinned memory (two ``cupy.asarray``
        # uploads held the stream ~50 us before a one-page fill's kernel; 04:18 UTC)
        ds, dt, keep = self._upload_slots(s, slots, tags.view(np.int64))
        words = self.page_bytes // 8
        span = min(words, span_words or FILL_SPAN_WORDS) if self.refcheck else words
        parts = -(-words // span)
        self.kernels.fill((min(len(slots) * parts, 65535),), (256,),
                          (self.gpu.flat, ds, dt, np.int64(len(slots)), np.int64(words),
                           np.int32(self.refcheck), np.int64(span)), stream=s)
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(s)
        self._fill_event = ev
        # the pinned upload buffer lives until the stream has passed the kernel
        kept = self._fill_keep
        while kept and kept[0][0].done:
            kept.popleft()
        kept.append((ev, keep))

    def _enqueue_check(self, base_ptr: int, slots: np.ndarray, span_words: int = 0):
        """``kv_check`` over pages at ``base_ptr`` (device memory, or host memory through
        its mapped address) on the misc stream, a CTA a part of ``span_words`` words of a
        page (0: CHECK_SPAN_WORDS): (a function giving the tags found once the event has
        passed, the event after the kernel, the arrays to keep alive until then)."""
        cp, s = self.cp, self.streams["misc"]
        n = len(slots)
        words = self.page_bytes // 8
        span = min(words, span_words or CHECK_SPAN_WORDS)
        with s:
            ds = cp.asarray(slots)
            out = cp.zeros(n, dtype=cp.uint64)
            bad = cp.zeros(n, dtype=cp.int32)
        parts = -(-words // span)
        self.kernels.check((min(n * parts, 65535),), (256,),
                           (np.uint64(base_ptr), ds, out, bad, np.int64(n), np.int64(words),
                            np.int32(self.refcheck), np.int64(span)), stream=s)
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(s)

        def tags() -> np.ndarray:
            found = cp.asnumpy(out)
            found[cp.asnumpy(bad) != 0] = 0
            return found
        return tags, ev, (ds, out, bad)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self.on_gpu and hasattr(self, "streams"):
            for s in self.streams.values():
                s.synchronize()
        for name in ("pool", "check_pool"):
            pool = self.__dict__.pop(name, None)
            if pool is not None:
                pool.shutdown(wait=True)
        for name in ("disk", "host", "staging", "gpu"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)

    # -- helpers ------------------------------------------------------------------------

    def _view(self, lv: Level) -> np.ndarray:
        if lv == Level.GPU:
            return self.gpu.view
        if lv == Level.HOST and self.host is not None:
            return self.host.view
        raise ValueError(f"level: this backend has no {lv.name} tier in memory")

    def _done(self, value: Any) -> Any:
        ev = self.runtime.event()
        ev.succeed(value)
        return ev

    def _fail(self, what: str, exc: BaseException) -> Any:
        self.errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return self._done(False)

    def _on_pool(self, fn, *args) -> Any:
        """Run ``fn`` on the I/O pool; the waitable succeeds with True, or False if it raised."""
        ev, trigger = self.runtime.external()

        def done(f):
            exc = f.exception()
            if exc is not None:
                self.errors.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
            trigger(exc is None)

        self.pool.submit(fn, *args).add_done_callback(done)
        return ev

    def _futures(self, futures, io: list | None = None) -> Any:
        """A waitable for a list of futures: succeeds with None, or the first exception.
        ``io``: gets the futures' jobs' (start, end) (``FairPool``'s ``kv_span``) when the
        last is done."""
        ev, trigger = self.runtime.external()
        if not futures:
            trigger(None)
            return ev
        left = [len(futures)]
        first: list[BaseException] = []

        def done(f):
            exc = f.exception()
            with self._lock:
                if exc is not None and not first:
                    first.append(exc)
                left[0] -= 1
                last = left[0] == 0
            if last:
                if io is not None:
                    io.extend(sp for sp in (getattr(g, "kv_span", None) for g in futures) if sp)
                trigger(first[0] if first else None)

        for f in futures:
            f.add_done_callback(done)
        return ev

    def _cuda_done(self, stream, keep: tuple) -> Any:
        """A waitable for the work enqueued on ``stream`` so far (``keep`` holds the
        arrays it reads until then)."""
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return self.runtime.watch(lambda: (True, True) if ev.done and keep is not None else (False, None))

    def _wait_fill(self, stream) -> None:
        ev = self._fill_event
        if ev is not None and self._fill_waited.get(stream.ptr) is not ev:
            stream.wait_event(ev)  # once per stream and fill: stream order keeps it after
            self._fill_waited[stream.ptr] = ev

    def _wait_checks(self, stream, slots) -> None:
        """Before ``stream`` writes into GPU ``slots``: if a check the loop has not seen
        finish covers one of them (a resumed request's pages, which the engine does not
        wait for), wait for the last check enqueued, so it reads them first."""
        ev = self._check_event
        if ev is not None and self._check_waited.get(stream.ptr) is not ev and self._checking[slots].any():
            stream.wait_event(ev)
            self._check_waited[stream.ptr] = ev
            if self.host_log is not None:
                name = next((k for k, v in self.streams.items() if v is stream), "other")
                self.host_log.append([self.runtime.now, f"{name} stream waits for a check", 0.0])

    # -- GPU <-> host, GPU <-> GPU --------------------------------------------------------

    def _enqueue_gpu_host(self, src_level: Level, src, dst, path: CopyPath, host: HostRegion):
        """Enqueue a GPU <-> host copy (``host`` is the host tier or a staging buffer);
        returns (stream, arrays to keep alive)."""
        cp, pb = self.cp, self.page_bytes
        d = "h2d" if src_level == Level.HOST else "d2h"
        s = self.streams[d]
        self._wait_fill(s)
        if d == "h2d":
            self._wait_checks(s, dst)
        g_ptr = self.gpu.ptr
        if path == CopyPath.SM_KERNEL and host.dev_ptr is not None:
            # Pieces of growing size (sm_first_pages, then doubling; the last takes the rest
            # when it is at most twice the step): the host prepares and uploads piece k+1
            # while the kernel of piece k runs, so only the first piece's preparation is
            # outside the copy (65536 slots cost ~0.5 ms of host time before one launch,
            # 2.3% of a 1 GiB batch of 16 KiB pages; docs/hw-notes.md).
            sp, dp = (host.dev_ptr, g_ptr) if d == "h2d" else (g_ptr, host.dev_ptr)
            keep, n, a, step = [], len(src), 0, self.sm_first_pages
            while a < n:
                b = n if n - a <= 2 * step else a + step
                ds, dd, k = self._upload_slots(s, src[a:b], dst[a:b])
                self.kernels.copy_pages(s, sp, dp, ds, dd, pb, self.ctas[d], self.threads_per_cta)
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

    def _upload_slots(self, stream, src, dst):
        """The SM kernel's slot arrays on the device: one int64 array [src..., dst...]
        written into pinned memory from CuPy's pinned pool and copied with one async
        memcpy on ``stream`` (no pageable staging, no synchronous upload); returns
        (src view, dst view, what to keep alive until the stream passes the kernel).
        ``pinned_index = False``: the older path, two ``cupy.asarray`` uploads."""
        cp = self.cp
        if not self.pinned_index:
            with stream:
                ds, dd = cp.asarray(src), cp.asarray(dst)
            return ds, dd, (ds, dd)
        n = len(src)
        mem = cp.cuda.alloc_pinned_memory(16 * n)
        h = np.ndarray((2 * n,), dtype=np.int64, buffer=mem)
        h[:n] = src
        h[n:] = dst
        dev = cp.empty(2 * n, dtype=cp.int64)
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, h.ctypes.data, 16 * n, 1, stream.ptr)
        return dev[:n], dev[n:], (mem, h, dev)

    def _gpu_host(self, src_level: Level, src, dst, path: CopyPath) -> Any:
        if not self.on_gpu:
            sv, dv = (self.host.view, self.gpu.view) if src_level == Level.HOST else (self.gpu.view, self.host.view)
            return self._on_pool(_copy_rows, sv, src, dv, dst)
        try:
            s, keep = self._enqueue_gpu_host(src_level, src, dst, path, self.host)
        except Exception as e:
            return self._fail("gpu<->host copy", e)
        return self._cuda_done(s, keep)

    def _gpu_gpu(self, src, dst) -> Any:
        if not self.on_gpu:
            return self._on_pool(_copy_rows, self.gpu.view, src, self.gpu.view, dst)
        cp, s = self.cp, self.streams["d2d"]
        self._wait_fill(s)
        self._wait_checks(s, dst)
        try:
            with s:
                ds, dd = cp.asarray(src), cp.asarray(dst)
                self.gpu.view[dd] = self.gpu.view[ds]
        except Exception as e:
            return self._fail("gpu->gpu copy", e)
        return self._cuda_done(s, (ds, dd))

    # -- disk (generator processes on the runtime) -----------------------------------------

    def _host_to_disk(self, src, dst, io: list):
        try:
            futs = self.disk.submit_writes(dst, _rows(self.host.view, src))
        except OSError as e:
            self.errors.append(f"host->disk: {e}")
            return False
        err = yield self._futures(futs, io)
        return self._finish_write(dst, err, "host->disk")

    def _disk_to_host(self, src, dst, io: list):
        try:
            futs = self.disk.submit_reads(src, _rows(self.host.view, dst))
        except OSError as e:
            self.errors.append(f"disk->host: {e}")
            return False
        err = yield self._futures(futs, io)
        if err is not None:
            self.errors.append(f"disk->host: {type(err).__name__}: {err}")
        return err is None

    def _finish_write(self, slots, err, what: str) -> bool:
        if err is not None:
            self.errors.append(f"{what}: {type(err).__name__}: {err}")
            return False
        self.disk.mark_written(slots)
        return True

    def _stage_chunks(self, n: int):
        step = self.staging.slots
        return [(i, min(n, i + step)) for i in range(0, n, step)]

    def _to_staging(self, buf: HostRegion, g_slots):
        """Copy GPU slots into staging rows 0..k-1; a waitable."""
        rows = np.arange(len(g_slots), dtype=np.int64)
        if not self.on_gpu:
            return self._on_pool(_copy_rows, self.gpu.view, g_slots, buf.view, rows)
        s, keep = self._enqueue_gpu_host(Level.GPU, g_slots, rows, self.copy_paths["d2h"], buf)
        return self._cuda_done(s, keep)

    def _from_staging(self, buf: HostRegion, g_slots):
        rows = np.arange(len(g_slots), dtype=np.int64)
        if not self.on_gpu:
            return self._on_pool(_copy_rows, buf.view, rows, self.gpu.view, g_slots)
        s, keep = self._enqueue_gpu_host(Level.HOST, rows, g_slots, self.copy_paths["h2d"], buf)
        return self._cuda_done(s, keep)

    def _gpu_to_disk(self, src, dst, io: list):
        """GPU -> staging (copy) then staging -> disk (pwrite), two buffers in flight."""
        try:
            self.disk.check_writable()
        except OSError as e:
            self.errors.append(f"gpu->disk: {e}")
            return False
        self.disk.valid[dst] = False
        ok, inflight = True, collections.deque()
        for a, b in self._stage_chunks(len(src)):
            if len(inflight) >= 2:
                ok &= yield from self._retire_write(inflight)
            if not ok:
                break
            buf = self.staging.get()
            copied = yield self._to_staging(buf, src[a:b])
            if not copied:
                self.staging.put(buf)
                ok = False
                break
            try:
                futs = self.disk.submit_writes(dst[a:b], buf.view[: b - a])
            except OSError as e:
                self.errors.append(f"gpu->disk: {e}")
                self.staging.put(buf)
                ok = False
                break
            inflight.append((buf, dst[a:b], self._futures(futs, io)))
        while inflight:  # wait for every write before the staging buffers are reused
            ok &= yield from self._retire_write(inflight)
        return bool(ok)

    def _retire_write(self, inflight):
        buf, slots, ev = inflight.popleft()
        err = yield ev
        self.staging.put(buf)
        return self._finish_write(slots, err, "gpu->disk")

    def _disk_to_gpu(self, src, dst, io: list):
        """disk -> staging (pread) then staging -> GPU (copy), two buffers in flight."""
        try:
            self.disk.check_readable(src)
        except OSError as e:
            self.errors.append(f"disk->gpu: {e}")
            return False
        ok, inflight = True, collections.deque()
        for a, b in self._stage_chunks(len(src)):
            buf = self.staging.get()
            futs = self.disk.submit_reads(src[a:b], buf.view[: b - a])
            inflight.append((buf, a, b, self._futures(futs, io)))
            if len(inflight) >= 2:
                ok &= yield from self._retire_read(inflight, dst)
            if not ok:
                break
        while inflight:  # let every read finish before the staging buffers are reused
            ok &= yield from self._retire_read(inflight, dst)
        return bool(ok)

    def _retire_read(self, inflight, dst):
        buf, a, b, ev = inflight.popleft()
        err = yield ev
        if err is not None:
            self.errors.append(f"disk->gpu: {type(err).__name__}: {err}")
            self.staging.put(buf)
            return False
        copied = yield self._from_staging(buf, dst[a:b])
        self.staging.put(buf)
        return bool(copied)


HOST_LOG_MIN_S = 0.5e-3  # host_log: the loop thread's calls that held it this long or more
CHECK_SPAN_WORDS = 8192  # kv_check: a CTA checks 64 KiB of a page (a 2 MiB page: 32 CTAs)
FILL_SPAN_WORDS = 8192   # kv_fill: a CTA writes 64 KiB of a page (a 2 MiB page: 32 CTAs)
_SMALL = 32  # batches of at most this many pages: per-page checks in Python, not numpy

_TRAFFIC = {
    (Level.HOST, Level.GPU): ("host_to_gpu",), (Level.GPU, Level.HOST): ("gpu_to_host",),
    (Level.DISK, Level.HOST): ("disk_read",), (Level.HOST, Level.DISK): ("disk_write",),
    (Level.DISK, Level.GPU): ("disk_read", "host_to_gpu"),
    (Level.GPU, Level.DISK): ("gpu_to_host", "disk_write"),
}


def transfer_path_name(src: Level, dst: Level, copy_path: str) -> str:
    """A batch's data path as both backends name it: ``copy_engine`` / ``sm_kernel`` for
    GPU <-> host, ``disk`` for host <-> disk, ``disk+<copy path>`` for GPU <-> disk (staged),
    ``gpu_copy`` for GPU -> GPU."""
    pair = {Level(src), Level(dst)}
    if pair == {Level.GPU}:
        return "gpu_copy"
    if pair == {Level.GPU, Level.HOST}:
        return copy_path
    if pair == {Level.HOST, Level.DISK}:
        return "disk"
    return f"disk+{copy_path}"


def _rows(view: np.ndarray, slots: np.ndarray) -> list[np.ndarray]:
    """Row views (no copies) of ``view`` at ``slots``."""
    return [view[int(s)] for s in slots]


def _copy_rows(src_view: np.ndarray, src: np.ndarray, dst_view: np.ndarray, dst: np.ndarray) -> None:
    dst_view[dst] = src_view[src]
