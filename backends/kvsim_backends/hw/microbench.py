"""Calibration measurements on this machine, with the hw backend (real bytes; on a GPU with
CuPy, else CPU mode with tiny sizes). ``kvsim calibrate`` reaches ``measure`` through the
backend registry (``kvsim.run.measure_hardware``) and fits the result (``kvsim.tools.fit``; what it measures is ``kvsim.tools.measured``).

Measured:
- GPU <-> host batches per page size (16 KiB .. 4 MiB on a GPU), per copy path (copy
  engine, SM kernel), host -> GPU, GPU -> host and both at once, and on a GPU one
  direction on each path (both pairings: ``link.mixed``); the SM kernel by CTAs
  (``ctarows``: a sweep at 64 KiB, the fewest CTAs at each other page size, both ways);
- disk reads, writes and rewrites (the same slots again) per I/O thread count and piece
  size (the disk tier's file), including the profile's ``nvme.queue_depth`` and ``piece``,
  which the hw backend runs at;
- the page cache in front of the disk folder (``pagecacheprobe``): one buffered writer of
  at most ``Plan.page_cache_cap`` bytes (8 GiB on a GPU, 64 MiB in CPU mode; less where the
  kernel's dirty limit x 1.25 or half the free space is less), where the kernel throttles it;
- host-tier fill: on a GPU the hw backend's own tier per backing (register, pinned,
  cumem) with a probe of the driver's lock (``driverprobe``), and an executor call's host
  time; in CPU mode the rate of mapping and touching;
- compute: fp16 matmul FLOP/s, device copy bandwidth, the compute stand-in's own rates
  (its GEMM chains' FLOP/s per M, its read rate: ``standin``), and of a ``compute()``
  call of a step's work (each kind the caller gives) the fixed cost and the overrun in
  proportion to its time; the refcheck of one GPU page as a replay waits for it
  (``read_tags_later``; in the report only: ``kvsim.tools.hwloop``'s ``refcheck.latency``);
  the power state: trains of a prefill chunk's steps back to back after idle spells
  (``measure_power``; ``kvsim.tools.fitboost`` fits ``compute.boost`` to them);
- interference: compute of each kind with copies on each path (``interfere``'s
  ``calibrate_grid``), for the structural model's terms per kind; both paths one way
  under a prefill (``busy_grid``, three rounds), for ``copy_engine.busy_per_page_*`` and
  the SM kernel's ``busy_start`` / ``busy_cta_efficiency``;
- ranks sharing a GPU (``rankshareprobe``, on a GPU): two ranks' steps of each pair of
  kinds (the caller's ``share_works``) on one GPU, at the settings' read-kernel length,
  for ``gpu.kernel_overlap``;
- small batches (1, 2, 4, 16 pages of 2 MiB on a GPU), each path and direction, timed as a
  replay's are (from ``transfer()`` to the runtime seeing the completion), and the batched
  copy-engine call's own host time.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Mapping

import numpy as np

from kvsim import scratch
from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.datapath.fill import UNIT_BYTES, Backing
from kvsim.core.datapath.work import StepWork
from kvsim.core.plan import Fill
from kvsim.core.spec import Level
from kvsim.settings import BackendSettings
from kvsim.tools.measured import Measured, batch as _batch

from .backend import HwBackend
from .ctarows import both_split, one_way
from .disk import DiskStore
from .driverprobe import call_cost, fill_probed
from .gpu import load_cupy
from .interfere import busy_grid, calibrate_grid, measure_cells, median_rounds
from .memory import HostRegion
from .pagecacheprobe import measure_for_calibrate
from .rankshareprobe import measure_for_calibrate as measure_rank_share
from .runtime import RealtimeRuntime

KiB, MiB = 1 << 10, 1 << 20
GPU_PAGES = (16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
BUSY_ROUNDS = 3  # rounds of the busy cells (interfere.median_rounds)
CPU_PAGES = (16 * KiB, 64 * KiB)


@dataclass
class Plan:
    """What to measure. ``quick`` (CPU mode) keeps every size tiny."""

    page_sizes: tuple[int, ...]
    batch_bytes: int
    repeats: int
    cta_counts: tuple[int, ...]
    disk_bytes: int
    disk_threads: tuple[int, ...]
    disk_pieces: tuple[int, ...]
    host_fill_bytes: int
    compute: bool
    small_page: int = 2 * MiB             # small batches: page size,
    small_counts: tuple[int, ...] = ()    # pages a batch,
    small_repeats: int = 25               # batches timed a cell (median; the first 3 dropped)
    interference: bool = False            # compute with copies (interfere.calibrate_grid)
    page_cache_cap: int = 0               # the most bytes the page-cache probe writes (0: none)
    rank_share: bool = False              # two ranks' steps on one GPU (rankshareprobe; a GPU's)

    @staticmethod
    def for_device(on_gpu: bool) -> "Plan":
        if on_gpu:
            return Plan(GPU_PAGES, 1024 * MiB, 3, (4, 8, 16, 24, 32, 64), 1 << 30, (1, 4, 16),
                        (1 * MiB, 4 * MiB), 2 << 30, True, 2 * MiB, (1, 2, 4, 16), 25, True,
                        page_cache_cap=8 << 30, rank_share=True)
        return Plan(CPU_PAGES, 2 * MiB, 2, (2, 4), 8 * MiB, (1, 2), (1 * MiB,), 8 * MiB, False,
                    64 * KiB, (1, 4), 6, page_cache_cap=64 * MiB)



def _wait(rt, waitables):
    def proc():
        return (yield rt.all_of(waitables))
    return rt.run(rt.process(proc()))


def _time_batches(rt, be, batches, path) -> float:
    """Seconds ``batches`` take started together, on ``path`` (a ``CopyPath``, or one per
    batch: a list)."""
    paths = path if isinstance(path, list) else [path] * len(batches)
    t0 = time.perf_counter()
    _wait(rt, [be.transfer(b, p) for b, p in zip(batches, paths)])
    return time.perf_counter() - t0


#: the mixed pairs measured (``link.mixed``): host -> GPU's path, GPU -> host's
MIXED = ((CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL), (CopyPath.SM_KERNEL, CopyPath.COPY_ENGINE))


#: (page_bytes, slots, **settings) -> BackendSettings on the profile being calibrated
#: (``kvsim.run.seam.settings_for`` with it): how the measurements build their backends
SettingsFor = Callable[..., BackendSettings]


def measure_copies(plan: Plan, device: str, m: Measured, settings_for: SettingsFor) -> None:
    rng = np.random.default_rng(0)
    for pb in plan.page_sizes:
        n = max(2, plan.batch_bytes // pb)
        rt = RealtimeRuntime()
        # the geometry of benchmarks/hw_copy.py: a batch of n pages a direction, both
        # directions at once = n each way, 2n slots a tier, random slots
        be = HwBackend(rt, settings_for(pb, {Level.GPU: 2 * n, Level.HOST: 2 * n}, device=device,
                                        refcheck=False))
        try:
            m.device = be.info["device"]
            paths = (CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL) if be.on_gpu else (CopyPath.COPY_ENGINE,)
            hs, gs = rng.permutation(2 * n), rng.permutation(2 * n)
            cells = {"h2d": [_batch(Level.HOST, Level.GPU, hs[:n], gs[:n], pb)],
                     "d2h": [_batch(Level.GPU, Level.HOST, gs[n:], hs[n:], pb)],
                     "both": [_batch(Level.HOST, Level.GPU, hs[:n], gs[:n], pb),
                              _batch(Level.GPU, Level.HOST, gs[n:], hs[n:], pb)]}
            own, timed = dict(be.ctas), partial(_time_batches, rt, be)
            split = both_split(plan.repeats, be, timed, cells["both"], m, pb) if be.on_gpu else own
            for path in paths:
                name = path.value if be.on_gpu else "cpu"
                for d, batches in cells.items():
                    be.ctas = split if (path is CopyPath.SM_KERNEL and d == "both") else own
                    _time_batches(rt, be, batches, path)  # warm-up
                    secs = [_time_batches(rt, be, batches, path) for _ in range(plan.repeats)]
                    pages = sum(b.pages for b in batches)
                    m.copies.append({"page": pb, "path": name, "dir": d, "pages": int(pages),
                                     "bytes": int(pages) * pb, "seconds": statistics.median(secs),
                                     "batches": [["h2d" if b.src == Level.HOST else "d2h", int(b.pages)]
                                                 for b in batches],
                                     "ctas": dict(be.ctas) if path is CopyPath.SM_KERNEL else None})
            be.ctas = own
            for pair in MIXED if be.on_gpu else ():  # one direction on each path
                both = cells["both"]
                _time_batches(rt, be, both, list(pair))  # warm-up
                secs = [_time_batches(rt, be, both, list(pair)) for _ in range(plan.repeats)]
                m.copies.append({"page": pb, "path": "mixed", "dir": "both", "pages": 2 * n,
                                 "bytes": 2 * n * pb, "seconds": statistics.median(secs),
                                 "batches": [["h2d", n], ["d2h", n]],
                                 "paths": {"h2d": pair[0].value, "d2h": pair[1].value},
                                 "ctas": dict(be.ctas)})
            if be.on_gpu:  # (one direction by CTAs: a sweep at 64 KiB, the fewest elsewhere)
                one_way(plan.cta_counts, plan.repeats, be, timed, cells, m, pb)
        finally:
            be.close()


def measure_small(plan: Plan, device: str, m: Measured, settings_for: SettingsFor) -> None:
    """Batches of ``plan.small_counts`` pages, each path and direction, random slots, timed
    from ``transfer()`` to the runtime seeing the completion (a replay's runtime: default
    polling); median of ``small_repeats`` after 3 dropped. Copy-engine cells also keep the
    median host time of the batched call itself (``call_s``)."""
    if not plan.small_counts:
        return
    rng = np.random.default_rng(1)
    pb, slots = plan.small_page, 4 * max(plan.small_counts)
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(pb, {Level.GPU: slots, Level.HOST: slots}, device=device,
                                    refcheck=False))
    try:
        paths = (CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL) if be.on_gpu else (CopyPath.COPY_ENGINE,)
        copier = getattr(be, "copier", None)
        for path in paths:
            name = path.value if be.on_gpu else "cpu"
            for d in ("h2d", "d2h"):
                src, dst = (Level.HOST, Level.GPU) if d == "h2d" else (Level.GPU, Level.HOST)
                for k in plan.small_counts:
                    secs, calls = [], []
                    for i in range(plan.small_repeats + 3):
                        b = _batch(src, dst, rng.choice(slots, k, replace=False),
                                   rng.choice(slots, k, replace=False), pb)
                        if copier is not None:
                            copier.last_call_s = None
                        t = _time_batches(rt, be, [b], path)
                        if i >= 3:
                            secs.append(t)
                            if copier is not None and copier.last_call_s is not None:
                                calls.append(copier.last_call_s)
                    m.small.append({"page": pb, "path": name, "dir": d, "pages": k, "bytes": k * pb,
                                    "seconds": statistics.median(secs),
                                    "call_s": statistics.median(calls) if calls else None})
    finally:
        be.close()


def measure_disk(plan: Plan, m: Measured, disk_dir: str | None = None, cuda=None) -> None:
    """The disk tier's file as the hw backend drives it, per I/O thread count and piece
    size: writes, rewrites of the same slots, reads. ``cuda`` (on a GPU): the source and
    destination buffer is pinned, as the backend's host tier and staging buffers are."""
    page = 4 * MiB if plan.disk_bytes >= 64 * MiB else 1 * MiB
    n = max(1, plan.disk_bytes // page)
    buf = HostRegion(n, page, cuda)
    buf.flat[:] = 7
    # each DiskStore is an owned scratch file, removed on close; a killed calibration's
    # file is swept by the next start that uses the folder (kvsim.scratch)
    d = disk_dir or tempfile.gettempdir()
    scratch.sweep(d)
    try:
        for threads in plan.disk_threads:
            for piece in plan.disk_pieces:
                ds = DiskStore(d, n, page, io_threads=threads, piece_bytes=piece)
                try:
                    slots = np.arange(n)
                    t0 = time.perf_counter()
                    for f in ds.submit_writes(slots, buf.view):
                        f.result()
                    # timed as the hw backend completes a write: when its pieces return
                    # (it never fsyncs); the fsync after, untimed, keeps the reads clean
                    tw = time.perf_counter() - t0
                    os.fsync(ds.fd)
                    # the same slots again: the first pass also converted the file's
                    # preallocated extents (NVMeSpec.rewrite)
                    t0 = time.perf_counter()
                    for f in ds.submit_writes(slots, buf.view):
                        f.result()
                    trw = time.perf_counter() - t0
                    os.fsync(ds.fd)
                    ds.mark_written(slots)
                    t0 = time.perf_counter()
                    for f in ds.submit_reads(slots, buf.view):
                        f.result()
                    tr = time.perf_counter() - t0
                    m.disk.append({"threads": threads, "piece": piece, "bytes": n * page,
                                   "write_Bps": n * page / tw, "rewrite_Bps": n * page / trw,
                                   "read_Bps": n * page / tr,
                                   "direct": ds.uses_direct, "pinned": cuda is not None})
                finally:
                    ds.close()
    finally:
        buf.close()


def measure_host_fill(plan: Plan, m: Measured, cp) -> None:
    """CPU mode: the rate of mapping and touching ``host_fill_bytes``. On a GPU: a fill of
    the hw backend's host tier per backing, probed (``driverprobe.fill_probed``), and an
    executor call's host time; a backing the machine cannot fill (``cumem`` without
    cuda-bindings) is recorded with its error."""
    if cp is None:
        page = 2 * MiB
        n = max(1, plan.host_fill_bytes // page)
        t0 = time.perf_counter()
        r = HostRegion(n, page)
        r.flat[::4096] = 1  # fault every page in
        dt = time.perf_counter() - t0
        r.close()
        m.host_fill_Bps = n * page / dt
        return
    for backing in (Backing.REGISTER, Backing.PINNED, Backing.CUMEM):
        try:
            row = fill_probed(plan.host_fill_bytes, backing, cp, UNIT_BYTES)
        except Exception as e:  # noqa: BLE001 (a backing this machine lacks: kept as data)
            row = {"backing": backing.value, "ok": False, "error": f"{type(e).__name__}: {e}"}
        row.pop("info", None)
        m.host_fills[backing.value] = row
    reg = m.host_fills[Backing.REGISTER.value]
    if reg.get("ok"):
        m.host_fill_Bps = reg["rate_Bps"]
    m.driver_call_s = call_cost(cp)


def measure_compute(m: Measured) -> None:
    import cupy as cp  # noqa: PLC0415

    n = 8192
    a = cp.ones((n, n), dtype=cp.float16)
    b = cp.ones((n, n), dtype=cp.float16)
    cp.matmul(a, b)
    cp.cuda.Device().synchronize()
    secs = []
    for _ in range(5):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        cp.matmul(a, b)
        e1.record()
        e1.synchronize()
        secs.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    m.compute["matmul_fp16_flops"] = 2 * n**3 / statistics.median(secs)
    x = cp.empty(1 << 30, dtype=cp.uint8)
    y = cp.empty_like(x)
    secs = []
    for _ in range(5):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        y[...] = x
        e1.record()
        e1.synchronize()
        secs.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    m.compute["hbm_copy_Bps"] = 2 * x.nbytes / statistics.median(secs[1:])
    del a, b, x, y


def measure_busy(m: Measured, device: str, settings_for: SettingsFor,
                 works: Mapping[str, StepWork] | None = None) -> None:
    """compute(d, work) of the hw backend for each kind of ``works`` (None: compute(d),
    the busy kernel): requested vs measured seconds; the stand-in's own rates."""
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(64 * KiB, {Level.GPU: 4}, device=device))
    try:
        if "standin" in be.info:
            m.compute["standin"] = be.info["standin"]
        if "copy_ctas_per_sm" in be.info:
            m.compute["copy_ctas_per_sm"] = be.info["copy_ctas_per_sm"]
        rows = []
        for kind, work in (works or {None: None}).items():
            for d in (0.002, 0.01, 0.05):
                for i in range(11 if works else 21):  # compute.latency: a median of these
                    t0 = time.perf_counter()
                    got = _wait(rt, [be.compute(d, work)])
                    if i:  # the first call of a duration is a warm-up (it captures graphs)
                        rows.append({"requested_s": d, "wall_s": time.perf_counter() - t0,
                                     "reported_s": list(got.values())[0], "kind": kind})
        m.compute["busy"] = rows
        # the refcheck of one page, as a replay waits for it (from read_tags_later to the
        # runtime seeing the tags): kvsim.tools.hwloop's refcheck.latency (a page's bytes are ~0 on a GPU)
        be.fill(Fill(Level.GPU, np.arange(1), np.ones(1, dtype=np.uint64)))
        secs = []
        for _ in range(16):
            t0 = time.perf_counter()
            _wait(rt, [be.read_tags_later(Level.GPU, np.arange(1))])
            secs.append(time.perf_counter() - t0)
        m.compute["refcheck"] = {"seconds": secs[1:], "how": "one 64 KiB GPU page, read_tags_later "
                                 "to the runtime seeing the tags (the first call a warm-up)"}
    finally:
        be.close()


POWER_IDLE_S = (2.0, 0.5, 0.2, 0.05, 0.0)  # the idle before each train of GEMM steps
POWER_TRAIN = (8, 8, 8, 8, 24)              # the train's steps (the last: towards the hot rate)


def measure_power(m: Measured, device: str, settings_for: SettingsFor, work: StepWork,
                  step_s: float = 0.02, rounds: int = 2) -> None:
    """The GPU's power state: after each idle spell of ``POWER_IDLE_S``, a train of
    ``POWER_TRAIN`` compute calls of ``work`` (a prefill chunk), ``step_s`` each, launched
    at once (back to back on the stream), ``rounds`` times; their rows of the hw
    backend's compute log (GPU times and gaps: what a replay's log holds) in
    ``m.compute["power"]``."""
    rt = RealtimeRuntime()
    log: list = []
    be = HwBackend(rt, settings_for(64 * KiB, {Level.GPU: 4}, device=device, compute_log=log))
    try:
        _wait(rt, [be.compute(step_s, work)])  # (a warm-up: the first call captures graphs)
        for _ in range(rounds):
            for idle, n in zip(POWER_IDLE_S, POWER_TRAIN):
                if idle:
                    _wait(rt, [rt.timeout(idle)])
                _wait(rt, [be.compute(step_s, work) for _ in range(n)])
        m.compute["power"] = {"rows": log[1:], "idle_s": list(POWER_IDLE_S), "train": list(POWER_TRAIN),
                              "how": "compute log rows (kvsim_backends.hw.logs) of GEMM-step trains after idle"}
    finally:
        be.close()


def measure(settings_for: SettingsFor, device: str = "auto", plan: Plan | None = None,
            disk_dir: str | None = None, works: Mapping[str, StepWork] | None = None,
            share_works: Mapping[str, StepWork] | None = None) -> tuple[Measured, Plan]:
    """Everything calibrate measures, with hw backends built from ``settings_for``'s
    settings (on the profile being calibrated); the disk also at the profile's queue
    depth and piece size. ``works``: a step's work of each kind (``gemm``, ``memory``,
    ``mix``), for the compute calls and the interference cells (None: neither);
    ``share_works``: the step kinds two ranks run beside each other on one GPU (None:
    not measured)."""
    cp = load_cupy() if device != "cpu" else None
    if device == "gpu" and cp is None:
        raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
    on_gpu = cp is not None
    plan = plan or Plan.for_device(on_gpu)
    nv = settings_for(4096, {Level.GPU: 1}).profile.nvme
    plan = replace(plan, disk_threads=tuple(sorted({*plan.disk_threads, nv.queue_depth})),
                   disk_pieces=tuple(sorted({*plan.disk_pieces, nv.piece})))
    dev = "gpu" if on_gpu else "cpu"
    m = Measured(device=dev, disk_setting={"queue_depth": nv.queue_depth, "piece": nv.piece})
    measure_copies(plan, dev, m, settings_for)
    measure_small(plan, dev, m, settings_for)
    measure_disk(plan, m, disk_dir, cp.cuda.runtime if on_gpu else None)
    if plan.page_cache_cap:
        m.page_cache = measure_for_calibrate(disk_dir or tempfile.gettempdir(), plan.page_cache_cap,
                                             nv.piece)
    measure_host_fill(plan, m, cp)
    if on_gpu and plan.compute:
        measure_compute(m)
    measure_busy(m, dev, settings_for, works if on_gpu else None)
    if on_gpu and plan.compute and works and "gemm" in works:
        measure_power(m, dev, settings_for, works["gemm"])
    if on_gpu and plan.interference and works:
        m.interference = measure_cells(settings_for, calibrate_grid(), works, dev, reps=3)
        if "gemm" in works:
            # back to back, as a replay's steps run (after idle the copy engine ran faster
            # beside a prefill on one H200: 64 KiB host -> GPU 30-35 GB/s against 28-30);
            # three rounds of backends built anew, the median round a cell (one backend's
            # copies under a prefill moved 27 GB/s, the next one's 38: ``median_rounds``)
            m.busy_copies = median_rounds([measure_cells(settings_for, busy_grid(), works, dev,
                                                         reps=3, gap_s=0.0, seed=k)
                                           for k in range(BUSY_ROUNDS)])
    if share_works:
        m.rank_share = (measure_rank_share(settings_for, dev, share_works) if on_gpu and plan.rank_share
                        else {"skipped": "needs a GPU" if not on_gpu else "not in the plan"})
    return m, plan
