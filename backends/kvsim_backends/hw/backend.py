"""HwBackend: kvsim.backend.Backend on real bytes (a GPU with CuPy, or numpy in CPU mode).

Tiers: GPU = one device allocation carved into slots (CPU mode: a numpy array standing
in for device memory); HOST = pinned host memory filled unit by unit by a worker thread
(``hostfill.HostFill``: an anonymous mmap faulted in and registered in 512 MiB units, or
one cudaHostAlloc; CPU mode: plain mmap), whose watermark ``slots_ready`` waits on; DISK = one preallocated private file (``disk.DiskStore``).

``HwBackend`` builds the memory and composes collaborators of one job each:
``copies.Copies`` (GPU <-> host and GPU -> GPU copies, on the copy path chosen by
``kvsim.core.datapath.copypath``), ``staged.StagedDisk`` (host <-> disk, and GPU <-> disk through
pinned staging buffers), ``checker.Checker`` (fills and the refcheck's tag reads),
``order.StreamOrder`` (what a GPU stream waits for), ``waits.Waits`` (the waitables),
``hosttier.HostSlots`` (which host slots the fill has made) and ``logs.HwLogs`` (counters
and the optional timing, compute and host logs); ``batchslots`` checks a batch's slots.

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
from time import perf_counter as _clock
from typing import Any

import numpy as np

from kvsim.config import RunConfig
from kvsim.core.datapath.copypath import DIRECTIONS, CopyPath, force_per_direction
from kvsim.core.datapath.copypath import sm_ctas as cta_count
from kvsim.core.datapath.diskio import WRITE_SHARE, io_class
from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level
from kvsim.config.hardware import HardwareProfile, load_profile

from .batchslots import batch_slots
from .checker import CHECK_SPAN_WORDS, FILL_SPAN_WORDS, Checker  # noqa: F401 (re-exported)
from .copies import Copies, choose_paths
from .disk import DiskStore, PriorityPool
from .gpu import BatchCopier, Kernels, load_cupy
from .logs import HOST_LOG_MIN_S, HwLogs, transfer_path_name  # noqa: F401 (re-exported)
from .hostfill import HostFill
from .hosttier import HostSlots, start_host_fill
from .memory import DeviceArena, StagingPool
from .order import StreamOrder
from .staged import StagedDisk
from .waits import Waits


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name}: got {value!r}; expected a positive integer")
    return int(value)


class HwBackend:
    """See the module docstring. ``runtime`` must be a RealtimeRuntime (or offer its
    ``watch`` and ``external``). ``profile`` (a HardwareProfile or a preset name; default
    the default config's) gives what the sim backend reads too: the copy-path and CTA
    rules' inputs, the SM kernel's threads a CTA, and the disk tier's I/O threads and
    piece size (``nvme.queue_depth``, ``nvme.piece``). ``disk_io_workers`` (the disk
    tier's ``io_workers``): 0, the disk's pieces run round robin over the transfers in
    flight on ``nvme.queue_depth`` threads; N > 0, on N threads in the order of
    ``kvsim.core.datapath.diskio`` (restores, then required writes, then background writes, aging;
    while a restore runs at most ``write_cap(N, disk_io_write_share)`` write pieces in
    flight), as the sim models them. ``copy_path``: ``auto``, one path,
    or one a direction (``kvsim.core.datapath.copypath.force_per_direction``); ``sm_ctas``: ``auto``
    or a CTA count (``kvsim.core.datapath.copypath.sm_ctas``); ``kernel_on_coherent_link``: the SM
    kernel on a c2c link (the rule's opt-in). The host tier's registration units (the
    fill's, with the ``register`` backing) force the SM kernel where a page could straddle
    two (``registration_forces_kernel``; the fill's units hold whole slots, so none does)."""

    name = "hw"

    def __init__(self, runtime, page_bytes: int, slots: dict[Level, int], disk_dir=None,
                 device: str = "auto", copy_path=None, refcheck: bool = True, *,
                 profile: HardwareProfile | str | None = None, sm_ctas="auto",
                 staging_bytes: int = 64 << 20, compute_chunk_s: float = 0.5e-3, io_hook=None,
                 direct_io: bool = True, disk_preallocate: bool = True, compute_graphs: bool = True,
                 timing_log: list | None = None, compute_log: list | None = None,
                 host_log: list | None = None, host_fill: dict | None = None,
                 fail_fill_at_unit: int | None = None, fill_unit_delay_s: float = 0.0,
                 disk_io_workers: int = 0, kernel_on_coherent_link: bool = False,
                 disk_io_write_share: float = WRITE_SHARE):
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
        if device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device: got {device!r}; expected 'auto', 'cpu' or 'gpu'")
        if Level.DISK in self.slots and disk_dir is None:
            raise ValueError("disk_dir: a disk tier (slots[DISK]) needs a directory")
        if profile is None:
            profile = RunConfig.model_fields["hardware"].default
        self.profile = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
        # bad settings fail here, before any allocation
        force = force_per_direction(copy_path)
        ctas = {d: cta_count(sm_ctas, **self.profile.cta_args(d)) for d in DIRECTIONS}
        if isinstance(disk_io_workers, bool) or not isinstance(disk_io_workers, (int, np.integer)) \
                or disk_io_workers < 0:
            raise ValueError(f"disk_io_workers: got {disk_io_workers!r}; expected a whole number >= 0")
        self.disk_io_workers = int(disk_io_workers)
        if isinstance(disk_io_write_share, bool) or not isinstance(disk_io_write_share, (int, float)) \
                or not 0 <= disk_io_write_share <= 1:
            raise ValueError(f"disk_io_write_share: got {disk_io_write_share!r}; expected a number in [0, 1]")
        self.disk_io_write_share = disk_io_write_share
        self.refcheck = bool(refcheck)
        self._kernel_on_c2c = bool(kernel_on_coherent_link)
        self.errors: collections.deque[str] = collections.deque(maxlen=100)
        self.logs = HwLogs(runtime, self.page_bytes, self.path_name, timing_log, compute_log, host_log)
        self._fail_next = 0
        self.cp = load_cupy() if device != "cpu" else None
        if device == "gpu" and self.cp is None:
            raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
        self.on_gpu = self.cp is not None
        self.threads_per_cta = self.profile.sm.threads_per_cta
        self.compute_chunk_s = compute_chunk_s
        self._compute_graphs = compute_graphs  # launch_busy through CUDA graphs (gpu.Kernels)
        self._closed = False
        self.disk: DiskStore | None = None
        self.host: HostFill | None = None
        self._host_fill = dict(host_fill or {})
        self._fill_hooks = (fail_fill_at_unit, fill_unit_delay_s)
        self.info: dict[str, Any] = {"device": "gpu" if self.on_gpu else "cpu"}
        try:
            self._build(disk_dir, io_hook, direct_io, staging_bytes, disk_preallocate)
            self._compose()
            self._choose_paths(force, ctas)
        except BaseException:
            self.close()
            raise

    # -- construction ---------------------------------------------------------------

    def _build(self, disk_dir, io_hook, direct_io, staging_bytes, disk_preallocate=True) -> None:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415
        cp = self.cp
        io_threads, piece = self.profile.nvme.queue_depth, self.profile.nvme.piece
        cuda_rt = cp.cuda.runtime if cp is not None else None
        self.pool = ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="kvsim-hw")
        # the refcheck's host-side verification (host and disk pages; numpy, which
        # releases the GIL): tiles of the pages checked on every core, where there are
        # enough of them (on 2 vCPUs a pool measured no gain)
        cores = os.cpu_count() or 1
        self.check_pool = (ThreadPoolExecutor(max_workers=min(16, cores), thread_name_prefix="kvsim-check")
                           if cores >= 4 else None)
        self.gpu = DeviceArena(cp if cp is not None else np, self.slots[Level.GPU], self.page_bytes)
        if Level.HOST in self.slots:
            self.host, self.info["host_fill"] = start_host_fill(
                self.page_bytes, self.slots[Level.HOST], self._host_fill, cuda_rt, *self._fill_hooks)
        if Level.DISK in self.slots:
            workers = self.disk_io_workers
            self.disk = DiskStore(disk_dir, self.slots[Level.DISK], self.page_bytes,
                                  workers or io_threads, piece, io_hook, direct=direct_io,
                                  preallocate=disk_preallocate, priorities=workers > 0,
                                  write_share=self.disk_io_write_share)
            self.info["disk_direct_io"] = self.disk.uses_direct
        staging_pages = max(1, staging_bytes // self.page_bytes)
        self.staging = StagingPool(staging_pages, self.page_bytes, cuda_rt)
        self.streams: dict = {}
        self.kernels = self.copier = None
        if cp is None:
            return
        self.kernels = Kernels(cp)
        # Copies and checks go on streams of the highest priority, compute on the lowest:
        # when a busy kernel's CTAs retire, a waiting copy or check kernel's CTAs start
        # before the next busy kernel's (a one-page host check took a median 759 us behind
        # a busy compute, 93 us alone). CUDA clamps a priority to the device's range:
        # -1000 is its highest, 0 its lowest.
        S = lambda prio: cp.cuda.Stream(non_blocking=True, priority=prio)  # noqa: E731
        self.streams = {"h2d": S(-1000), "d2h": S(-1000), "d2d": S(-1000), "misc": S(-1000),
                        "compute": S(0)}
        self.info["stream_priorities"] = {k: s.priority for k, s in self.streams.items()}
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

    def slots_ready(self, level: Level, slots) -> Any:
        """None if ``slots`` of the tier exist; else a waitable (``HostSlots.ready``)."""
        return self.host_slots.ready(slots) if level == Level.HOST else None

    def slot_limit(self, level: Level) -> int | None:
        return self.host_slots.limit() if level == Level.HOST else None

    def _compose(self) -> None:
        cp, logs = self.cp, self.logs
        self.waits = Waits(self.runtime, self.pool, self.errors)
        self.host_slots = HostSlots(self.host, self.runtime, self.waits, self.errors)
        self.order = (StreamOrder(self.runtime, self.streams, self.slots[Level.GPU], logs.host_log)
                      if cp is not None else None)
        self.copies = Copies(cp, self.page_bytes, self.gpu, self.host, self.waits, paths={}, ctas={},
                             threads_per_cta=self.threads_per_cta, streams=self.streams,
                             kernels=self.kernels, copier=self.copier, order=self.order)
        self.staged = (StagedDisk(self.disk, self.host, self.staging, self.copies, self.waits, self.errors)
                       if self.disk is not None else None)
        self.checker = Checker(self.runtime, self.page_bytes, self.refcheck, self.gpu, self.host,
                               self.disk, self.waits, logs, self.errors, self.pool, self.check_pool,
                               cp=cp, streams=self.streams, kernels=self.kernels, order=self.order,
                               copies=self.copies)

    def _choose_paths(self, force: dict, ctas: dict[str, int]) -> None:
        """The copy path of each direction (``copies.choose_paths``) and the SM kernel's CTAs."""
        self.copies.paths = choose_paths(self.profile, self.page_bytes, self.host,
                                         self.slots.get(Level.HOST, 0), self.on_gpu, force,
                                         self._kernel_on_c2c)
        self.ctas = ctas
        self.info["copy_path"] = self.copy_path.value
        self.info["copy_paths"] = {d: p.value for d, p in self.copy_paths.items()}
        self.info["sm_ctas"] = dict(self.ctas)

    @property
    def copy_paths(self) -> dict[str, CopyPath]:
        """The copy path of GPU <-> host batches, per direction ('h2d', 'd2h')."""
        return self.copies.paths

    @property
    def copy_path(self) -> CopyPath:
        """The host -> GPU copy path (``copy_paths`` has both)."""
        return self.copies.paths["h2d"]

    @property
    def ctas(self) -> dict[str, int]:
        """The SM copy kernel's CTAs, per direction (benchmarks may set them)."""
        return self.copies.ctas

    @ctas.setter
    def ctas(self, value: dict[str, int]) -> None:
        self.copies.ctas = dict(value)

    # -- the Backend protocol ---------------------------------------------------------

    def transfer(self, batch: Batch, path: CopyPath | None = None) -> Any:
        """Move one batch. ``path`` overrides the copy path for GPU <-> host (benchmarks)."""
        t0 = _clock()  # the timing log counts this call's own host time too
        io: list = []  # a disk batch's jobs: (start, end) of each on its I/O thread
        if batch.kind is BatchKind.TAKEBACK:  # onto the pages' retained disk copies
            return self._take_back(batch)
        if self._fail_next > 0 and batch.pages:
            self._fail_next -= 1
            ev = self._injected_failure(batch)
        else:
            ev = self._transfer(batch, path, io)
        if self.logs.host_log is not None:
            self.logs.host_time(f"transfer {batch.src.name.lower()}->{batch.dst.name.lower()} "
                                f"{int(batch.pages)}", t0)
        if batch.pages:
            self.logs.account(batch, ev, path, t0, io)
        return ev

    def promote(self, batch: Batch) -> int:
        """A background write (a ``BatchKind.BACKGROUND`` batch to disk) that a required
        write came to depend on: its pieces still queued move to the required writes'
        queue (with ``disk_io_workers`` > 0; else nothing to do). How many moved."""
        return self.disk.pool.promote(batch) if self.disk is not None and self.disk.pool else 0

    def _take_back(self, batch: Batch) -> Any:
        """An eviction onto the pages' retained disk copies: nothing is written (the slots
        hold the bytes of an earlier complete write: the core takes back only those), done
        at once. Counted as ``takeback_pages`` in ``info``."""
        self.info["takeback_pages"] = self.info.get("takeback_pages", 0) + int(batch.pages)
        return self.waits.done(True)

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
            self.checker.view(lv)[dst] = 0xAD
        self.errors.append(f"injected failure of a {batch.src.name}->{batch.dst.name} batch")
        return self.waits.done(False)

    def path_name(self, src: Level, dst: Level, path: CopyPath | None = None) -> str:
        """The data path a batch from ``src`` to ``dst`` takes (for logs and comparisons)."""
        d = "h2d" if src == Level.DISK or dst == Level.GPU else "d2h"
        return transfer_path_name(src, dst, (path or self.copy_paths[d]).value)

    def stats(self) -> dict:
        """Bytes moved by completed transfers (the names the engine's summary reads)."""
        out = self.logs.stats()
        out["copy_path"] = self.copy_path.value
        out["copy_path_h2d"] = self.copy_paths["h2d"].value
        out["copy_path_d2h"] = self.copy_paths["d2h"].value
        pool = self.disk.pool if self.disk is not None else None
        if isinstance(pool, PriorityPool):  # the sim's names for its disk pool
            out["disk_pieces"] = pool.pieces_run
            out["disk_pieces_dropped"] = pool.pieces_dropped
            out["disk_jumps"] = pool.queues.jumps
        return out

    def _transfer(self, batch: Batch, path: CopyPath | None, io: list) -> Any:
        """``io`` gets a disk batch's jobs' (start, end) on the I/O threads."""
        if self._closed:
            raise RuntimeError("the backend is closed")
        src, dst = batch_slots(batch, self.page_bytes, self.slots)
        if src.size == 0:
            return self.waits.done(True)
        key = (batch.src, batch.dst)
        if key in ((Level.HOST, Level.GPU), (Level.GPU, Level.HOST)):
            d = "h2d" if batch.src == Level.HOST else "d2h"
            return self.copies.gpu_host(batch.src, src, dst, path or self.copy_paths[d])
        if key == (Level.GPU, Level.GPU):
            return self.copies.gpu_gpu(src, dst)
        staged = self.staged
        if key == (Level.HOST, Level.DISK):
            return self.runtime.process(staged.host_to_disk(src, dst, io, io_class(batch), batch))
        if key == (Level.DISK, Level.HOST):
            return self.runtime.process(staged.disk_to_host(src, dst, io, batch))
        if key == (Level.GPU, Level.DISK):
            return self.runtime.process(staged.gpu_to_disk(src, dst, io, io_class(batch), batch))
        if key == (Level.DISK, Level.GPU):
            return self.runtime.process(staged.disk_to_gpu(src, dst, io, batch))
        raise ValueError(f"batch: no transfer from {batch.src.name} to {batch.dst.name}")

    def compute(self, duration_s: float) -> Any:
        if duration_s < 0:
            raise ValueError(f"duration_s: got {duration_s!r}; expected >= 0")
        rt, logs = self.runtime, self.logs
        h0 = _clock()
        t0 = rt.now
        lag = rt.wall_now() - t0 if logs.compute_log is not None else 0.0
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
            if logs.compute_log is not None:
                prev, logs.last_compute_end = logs.last_compute_end, b
                if prev is not None:  # read once both have passed (when this one is seen)
                    gap = lambda: rt.wall_to_sim(cp.cuda.get_elapsed_time(prev, a) / 1e3)  # noqa: E731
        ev.callbacks.insert(0, lambda e: logs.count_compute(t0, duration_s, e.value, gap, lag))
        if logs.host_log is not None:
            logs.host_time("compute", h0)
        return ev

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool) -> float | None:
        # real time cannot be predicted with transfers in flight; with none, the engine
        # may run ahead and the GPU computes the whole span at catch_up
        return start_s + seconds if quiet else None

    def catch_up(self, until_s: float) -> Any:
        return self.compute(max(0.0, until_s - self.runtime.now))

    def fill(self, fill: Fill) -> None:
        t0 = _clock()
        self.checker.fill(fill)
        if self.logs.host_log is not None:
            self.logs.host_time(f"fill {Level(fill.level).name.lower()} {len(fill.slots)}", t0)

    def read_tags(self, level: Level, slots: np.ndarray) -> np.ndarray:
        return self.checker.read_tags(level, slots)

    def read_tags_later(self, level: Level, slots: np.ndarray) -> Any:
        """The refcheck's read of tags while the runtime's loop runs on
        (``Checker.read_tags_later``)."""
        return self.checker.read_tags_later(level, slots)

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        if self.on_gpu and getattr(self, "streams", None):
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
        if getattr(self, "host_slots", None) is not None:
            self.host_slots.fill = None  # (closed: as if there were no host tier)
