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
``steps.Steps`` (each step's compute, and the span run ahead),
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
import threading
from time import perf_counter as _clock
from typing import Any

import numpy as np

from kvsim.core.datapath.copypath import CopyPath, direction_ctas
from kvsim.core.datapath.diskio import io_class, io_threads
from kvsim.core.datapath.fill import FillMode
from kvsim.core.datapath.interference import MixTable
from kvsim.core.datapath.pathcost import other_path, path_chooser
from kvsim.core.datapath.work import StepWork
from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level
from kvsim.settings import BackendSettings

from .batchslots import batch_slots
from .checker import CHECK_SPAN_WORDS, FILL_SPAN_WORDS, Checker  # noqa: F401 (re-exported)
from .copies import Copies, choose_paths, pinned_for
from .disk import DiskStore, SharedPool
from .iopools import PriorityPool
from .gpu import BatchCopier, Kernels, load_cupy
from .logs import HOST_LOG_MIN_S, HwLogs, transfer_path_name  # noqa: F401 (re-exported)
from .hostfill import HostFill
from .hosttier import HostSlots, SharedHost, start_host_fill
from .memory import DeviceArena, StagingPool
from .order import StreamOrder
from .staged import SerialTurn, StagedDisk
from .standin import StandIn
from .steps import Steps
from .waits import Waits


class HwBackend:
    """See the module docstring. Built from ``settings`` (``kvsim.settings.BackendSettings``)
    alone; ``runtime`` must be a RealtimeRuntime (or offer its ``watch`` and
    ``external``). The profile gives what the sim backend reads too: the copy-path and
    CTA rules' inputs, the SM kernel's threads a CTA, and the disk tier's I/O threads and
    piece size (``nvme.queue_depth``, ``nvme.piece``). The disk tier's ``io_workers``: 0,
    its pieces run round robin over the transfers in flight on ``nvme.queue_depth``
    threads; N > 0, on N threads in the order of ``kvsim.core.datapath.diskio`` (restores,
    then required writes, then background writes, aging; while a restore runs at most
    ``write_cap(N, io_write_share)`` write pieces in flight), as the sim models them. A
    batch alone takes ``PathChooser.lone``'s path (forced, or the SM kernel where the
    host tier's registration units could split a page: the fill's hold whole slots,
    none does; else by rule)."""

    name = "hw"

    def __init__(self, runtime, settings: BackendSettings):
        for attr in ("watch", "external", "process", "event", "timeout"):
            if not hasattr(runtime, attr):
                raise TypeError(f"runtime: {type(runtime).__name__} has no {attr}(); "
                                "HwBackend needs a RealtimeRuntime")
        # what this backend can hold (the settings' ranges are the config model's)
        if Level.GPU not in settings.slots:
            raise ValueError("slots: the hw backend needs a GPU tier")
        if settings.page_bytes % 16:
            raise ValueError(f"page_bytes: got {settings.page_bytes}; the hw backend moves and "
                             f"checks pages in 16-byte words: expected a multiple of 16")
        for lv, n in settings.slots.items():
            if n < 1:
                raise ValueError(f"slots[{Level(lv).name}]: got {n}; expected at least one slot")
        if Level.DISK in settings.slots and (settings.disk is None or settings.disk.dir is None):
            raise ValueError("settings.disk.dir: a disk tier needs a directory")
        self.runtime = runtime
        self.settings = settings
        self.page_bytes = settings.page_bytes
        self.slots = dict(settings.slots)
        self.profile = settings.profile
        self.refcheck = settings.refcheck
        self.disk_settings = settings.disk
        hw, probes = settings.hw, settings.probes
        self.errors: collections.deque[str] = collections.deque(maxlen=100)
        self.logs = HwLogs(runtime, self.page_bytes, self.path_name, probes.timing_log,
                           probes.compute_log, probes.host_log, settings.rank)
        self._fail_next = 0
        self.cp = load_cupy() if hw.device != "cpu" else None
        if hw.device == "gpu" and self.cp is None:
            raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
        self.on_gpu = self.cp is not None
        self.threads_per_cta = self.profile.sm.threads_per_cta
        self.compute_chunk_s = settings.read_kernel_s
        self._closed = False
        self.disk: DiskStore | None = None
        self.host: HostFill | None = None
        self.info: dict[str, Any] = {"device": "gpu" if self.on_gpu else "cpu"}
        try:
            self._build()
            self._compose()
            self._choose_paths()
        except BaseException:
            self.close()
            raise

    # -- construction ---------------------------------------------------------------

    def _build(self) -> None:
        from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415
        cp = self.cp
        io_threads_q, piece = self.profile.nvme.queue_depth, self.profile.nvme.piece
        cuda_rt = cp.cuda.runtime if cp is not None else None
        self.pool = ThreadPoolExecutor(max_workers=io_threads_q, thread_name_prefix="kvsim-hw")
        # the refcheck's host-side verification (host and disk pages; numpy, which
        # releases the GIL): tiles of the pages checked on every core, where there are
        # enough of them (on 2 vCPUs a pool measured no gain)
        cores = os.cpu_count() or 1
        self.check_pool = (ThreadPoolExecutor(max_workers=min(16, cores), thread_name_prefix="kvsim-check")
                           if cores >= 4 else None)
        self.gpu = DeviceArena(cp if cp is not None else np, self.slots[Level.GPU], self.page_bytes)
        st = self.settings
        if Level.HOST in self.slots:
            turns = (self.runtime.shared("fill_turns", threading.Lock)
                     if st.host_fill.register_chunk else None)
            make = lambda: start_host_fill(  # noqa: E731
                self.page_bytes, self.slots[Level.HOST], st.host_fill, cuda_rt,
                st.probes.fail_fill_at_unit, st.probes.fill_unit_delay_s, turns)
            if st.host_shared and st.ranks > 1:  # node.host shared: the node's one pool
                self._host_box = SharedHost.join(self.runtime, make)
                self.host, self.info["host_fill"] = self._host_box.host, self._host_box.info
            else:
                self.host, self.info["host_fill"] = make()
        if Level.DISK in self.slots:
            d = st.disk
            serial = d.io_mode == "serial"
            threads = 1 if serial else io_threads(d.io_workers, io_threads_q)
            shared = None
            if st.ranks > 1:  # the node's drive: one set of I/O threads for every rank's file
                shared = self.runtime.shared("disk_pool", lambda: SharedPool(
                    threads, piece, d.io_workers > 0, d.io_write_share, serial))
            self.disk = DiskStore(d.dir, self.slots[Level.DISK], self.page_bytes, threads, piece,
                                  st.probes.io_hook, direct=d.direct_io and d.writes == "direct",
                                  preallocate=d.preallocate,
                                  priorities=d.io_workers > 0, io_write_share=d.io_write_share,
                                  pool=shared, serial=serial)
            self.info["disk_direct_io"] = self.disk.uses_direct
        staging_pages = max(1, st.hw.staging_bytes // self.page_bytes)
        self.staging = StagingPool(staging_pages, self.page_bytes, cuda_rt)
        self.streams: dict = {}
        self.kernels = self.copier = None
        self.standin: StandIn | None = None  # a step's work on the GPU (None: the busy kernel)
        if cp is None:
            return
        self.kernels = Kernels(cp)
        # Copies and checks go on streams of the highest priority, compute on the lowest:
        # when a busy kernel's CTAs retire, a waiting copy or check kernel's CTAs start
        # before the next busy kernel's (a one-page host check took a median 759 us behind
        # a busy compute, 93 us alone). CUDA clamps a priority: -1000 its highest, 0 lowest.
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
        self.kernels.use_graphs = self.info["compute_graphs"] = bool(st.hw.compute_graphs)
        self.info.update(sm_count=self.kernels.sm_count,
                         copy_ctas_per_sm=self.kernels.copy_ctas_per_sm(self.threads_per_cta))
        if st.hw.compute_standin:
            self.standin = StandIn(cp, st.model, self.kernels.read, st.read_kernel_s,
                                   self.kernels.l2_bytes, use_graphs=bool(st.hw.compute_graphs))
            self.info["standin"] = self.standin.calibrate(self.streams["compute"])

    def slots_ready(self, level: Level, slots) -> Any:
        """None if ``slots`` of the tier exist; else a waitable (``HostSlots.ready``)."""
        return self.host_slots.ready(slots) if level == Level.HOST else None

    def slot_limit(self, level: Level) -> int | None:
        return self.host_slots.limit() if level == Level.HOST else None

    def fill_layout(self, level: Level):
        """The host tier's units as its fill lays them out (with ``cumem`` on a GPU, on
        the driver's granules), where it fills after the run starts; else None."""
        if level != Level.HOST or self.host is None or self.settings.host_fill.mode is FillMode.NONE:
            return None
        return self.host.layout

    def _compose(self) -> None:
        cp, logs = self.cp, self.logs
        self.waits = Waits(self.runtime, self.pool, self.errors)
        self.host_slots = HostSlots(self.host, self.runtime, self.waits, self.errors)
        self.order = (StreamOrder(self.runtime, self.streams, self.slots[Level.GPU], logs.host_log)
                      if cp is not None else None)
        self.copies = Copies(cp, self.page_bytes, self.gpu, self.host, self.waits, paths={}, ctas={},
                             threads_per_cta=self.threads_per_cta, streams=self.streams,
                             kernels=self.kernels, copier=self.copier, order=self.order)
        turn = (None if self.disk is None or self.settings.disk.io_mode != "serial" else SerialTurn(self.runtime)
                if self.settings.ranks == 1 else self.runtime.shared("disk_turn", lambda: SerialTurn(self.runtime)))
        self.staged = (StagedDisk(self.disk, self.host, self.staging, self.copies, self.waits, self.errors,
                                  turn) if self.disk is not None else None)
        self.steps = Steps(self.runtime, logs, cp, self.streams, self.kernels, self.standin,
                           self.compute_chunk_s)
        self.checker = Checker(self.runtime, self.page_bytes, self.refcheck, self.gpu, self.host,
                               self.disk, self.waits, logs, self.errors, self.pool, self.check_pool,
                               cp=cp, streams=self.streams, kernels=self.kernels, order=self.order,
                               copies=self.copies)

    def _choose_paths(self) -> None:
        """Each direction's path alone (from ``copies.choose_paths``) and SM kernel's CTAs."""
        c = self.settings.copy
        args = (self.profile, self.page_bytes, self.host, self.slots.get(Level.HOST, 0), self.on_gpu,
                c.force, c.kernel_on_coherent_link)
        self.ctas = direction_ctas(c.sm_ctas, self.profile, self.page_bytes)
        structure = self.profile.interference_structure(page_bytes=self.page_bytes)
        m = self.settings.model
        kinds = (MixTable(structure, m.projections, m.min_rows, m.max_rows)
                 if structure is not None else None)
        self.chooser = path_chooser(self.profile, self.page_bytes, pinned_for(*args),
                                    choose_paths(*args), c.sm_ctas, kinds)
        self.copies.paths = dict(self.chooser.lone)  # (staging's, and reported)
        self._flowing = {d: [0, 0] for d in ("h2d", "d2h")}  # batches moving: [copy engine, SM kernel]
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
        chosen = [path]
        if self._fail_next > 0 and batch.pages:
            self._fail_next -= 1
            ev = self._injected_failure(batch)
        else:
            ev = self._transfer(batch, path, io, chosen)
        if self.logs.host_log is not None:
            self.logs.host_time(f"transfer {batch.src.name.lower()}->{batch.dst.name.lower()} "
                                f"{int(batch.pages)}", t0)
        if batch.pages:
            self.logs.account(batch, ev, chosen[0], t0, io)
        return ev

    def promote(self, batch: Batch) -> int:
        """A background write (a ``BatchKind.BACKGROUND`` batch to disk) that a required
        write came to depend on: its pieces still queued move to the required writes'
        queue (with ``io_workers`` > 0; else nothing to do). How many moved."""
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
        self._fail_next += int(n)

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

    def pick_path(self, d: str, pages: int) -> tuple[CopyPath, int]:
        """(path, SM CTAs) of a host-tier batch of ``pages`` in direction ``d`` now: the
        rule's (``kvsim.core.datapath.pathcost``), from the other direction's batches in
        flight and the compute running (the last compute's, until the runtime sees it
        end), as the sim backend decides."""
        computing, work = self.steps.running()
        return self.chooser.pick(d, pages, other_path(self._flowing["d2h" if d == "h2d" else "h2d"]),
                                 computing, work)

    def _transfer(self, batch: Batch, path: CopyPath | None, io: list,
                  chosen: list | None = None) -> Any:
        """``io`` gets a disk batch's jobs' (start, end) on the I/O threads; ``chosen[0]``
        the path a host-tier batch took."""
        chosen = chosen if chosen is not None else [None]
        if self._closed:
            raise RuntimeError("the backend is closed")
        src, dst = batch_slots(batch, self.page_bytes, self.slots)
        if src.size == 0:
            return self.waits.done(True)
        key = (batch.src, batch.dst)
        if key in ((Level.HOST, Level.GPU), (Level.GPU, Level.HOST)):
            d = "h2d" if batch.src == Level.HOST else "d2h"
            ctas = None
            if path is None:
                path, ctas = self.pick_path(d, int(batch.pages))
            chosen[0] = path
            ev = self.copies.gpu_host(batch.src, src, dst, path, ctas)
            flowing, i = self._flowing[d], int(path is CopyPath.SM_KERNEL)
            flowing[i] += 1

            def gone(_e, flowing=flowing, i=i):
                flowing[i] -= 1
            if ev.callbacks is None:
                gone(ev)
            else:
                ev.callbacks.append(gone)
            return ev
        if key == (Level.GPU, Level.GPU):
            return self.copies.gpu_gpu(src, dst)
        staged = self.staged  # (its process: in the disk's turn where io_mode is serial)
        if key == (Level.HOST, Level.DISK):
            return staged.process(staged.host_to_disk(src, dst, io, io_class(batch), batch))
        if key == (Level.DISK, Level.HOST):
            return staged.process(staged.disk_to_host(src, dst, io, batch))
        if key == (Level.GPU, Level.DISK):
            return staged.process(staged.gpu_to_disk(src, dst, io, io_class(batch), batch))
        if key == (Level.DISK, Level.GPU):
            return staged.process(staged.disk_to_gpu(src, dst, io, batch))
        raise ValueError(f"batch: no transfer from {batch.src.name} to {batch.dst.name}")

    def onboard_from(self, other: "HwBackend", batch: Batch) -> Any:
        """A batch from a sibling rank's host or disk tier (``node.host: shared``) into
        this rank's GPU. The host tier is the node's one allocation (slot ids the node's):
        a host page is copied as one of this rank's own; a disk page is read from the
        sibling's file through this rank's staging buffers."""
        if batch.src == Level.HOST:
            return self.transfer(batch)
        if self._closed or other.disk is None:
            raise RuntimeError("onboard_from: the backend (or the sibling's disk) is closed")
        src, dst = batch_slots(batch, self.page_bytes, self.slots)
        staged = StagedDisk(other.disk, self.host, self.staging, self.copies, self.waits,
                            self.errors, self.staged.turn)  # (the node's one drive: one turn)
        return staged.process(staged.disk_to_gpu(src, dst, [], batch))

    def compute(self, duration_s: float, work: StepWork | None = None) -> Any:
        return self.steps.compute(duration_s, work)

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool,
                      work: StepWork | None = None) -> float | None:
        return self.steps.compute_ahead(start_s, seconds, quiet, work)

    def catch_up(self, until_s: float) -> Any:
        return self.steps.catch_up(until_s)

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
        box = self.__dict__.pop("_host_box", None)
        if box is not None and box.leave():  # (a node's shared host: its last user closes it)
            self.host = None
        for name in ("disk", "host", "staging", "gpu"):
            obj = getattr(self, name, None)
            if obj is not None:
                obj.close()
                setattr(self, name, None)
        if getattr(self, "host_slots", None) is not None:
            self.host_slots.fill = None  # (closed: as if there were no host tier)
