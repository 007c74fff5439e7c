"""``kvsim calibrate``: microbenchmarks on this machine, fitted into a hardware profile.

Measured (hw backend, real bytes; on a GPU with CuPy, else CPU mode with tiny sizes):
- GPU <-> host batches per page size (16 KiB .. 4 MiB on a GPU), per copy path (copy
  engine, SM kernel), host -> GPU, GPU -> host and both at once; an SM-kernel CTA sweep;
- disk reads, writes and rewrites (the same slots again) per I/O thread count and piece size
  (the disk tier's file);
- host-tier fill (map, touch, pin);
- compute: fp16 matmul FLOP/s, device copy bandwidth, the busy kernel's accuracy, and of a
  ``compute()`` call the fixed cost and the overrun in proportion to its time
  (``compute.latency``, ``compute.scale``); the refcheck of one GPU page
  as a replay waits for it (``read_tags_later``: ``refcheck.latency``);
- small batches (1, 2, 4, 16 pages of 2 MiB on a GPU), each path and direction, timed as a
  replay's are (from ``transfer()`` to the runtime seeing the completion), and the batched
  copy-engine call's own host time.

Fitted into kvsim.hardware.HardwareProfile (the schema of configs/hardware/h200-pcie.yaml):
link rates (the copy engine's), the SM kernel's own ceilings (per direction and both at
once), the copy engine's host time per page per direction and page size, per-CTA rates,
NVMe rates/latency/queue depth, host fill rate, prefill/decode efficiencies, the copy
engine's ``per_call`` (the batched call's host time for one page) and the backend's fixed
cost per transfer (``transfer.latency``, ``transfer.latency_sm_kernel``: what small
batches take beyond everything else the sim models). Everything
else (interference, launch, step overhead, public peaks) is kept from a base profile and
marked ``base:`` in the YAML comments. The fit is then checked: each measured batch is
replayed alone on the sim backend with the fitted profile, and the relative error per
cell is reported (``fit`` says why each term has the form it has).

``refit`` (``python3 -m kvsim.calibrate --from-report R --out P``) fits again, offline,
from the measurements a saved report holds, so a profile is reproducible from its report
(and redoes the check of any ``out_of_sample`` cells the report holds).
``check_against`` (``python3 -m kvsim.calibrate --check CELLS.json --profile P``) replays
cells measured elsewhere (``benchmarks/hw_copy.py --json``) on the sim with a profile: the
out-of-sample check of a fit.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kvsim.core.copypath import CopyPath
from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level
from kvsim.config import RunConfig
from kvsim.hardware import HardwareProfile, load_profile

KiB, MiB = 1 << 10, 1 << 20
GPU_PAGES = (16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
CPU_PAGES = (16 * KiB, 64 * KiB)
DIRS = ("h2d", "d2h", "both")


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

    @staticmethod
    def for_device(on_gpu: bool) -> "Plan":
        if on_gpu:
            return Plan(GPU_PAGES, 1024 * MiB, 3, (4, 8, 16, 24, 32, 64), 1 << 30, (1, 4, 16),
                        (1 * MiB, 4 * MiB), 2 << 30, True, 2 * MiB, (1, 2, 4, 16), 25)
        return Plan(CPU_PAGES, 2 * MiB, 2, (2, 4), 8 * MiB, (1, 2), (1 * MiB,), 8 * MiB, False,
                    64 * KiB, (1, 4), 6)


@dataclass
class Measured:
    device: str
    copies: list[dict] = field(default_factory=list)   # page, path, dir, pages, bytes, seconds
    ctas: list[dict] = field(default_factory=list)
    disk: list[dict] = field(default_factory=list)
    host_fill_Bps: float | None = None
    compute: dict = field(default_factory=dict)
    small: list[dict] = field(default_factory=list)    # page, path, dir, pages, seconds, call_s
    # the profile's nvme.queue_depth and nvme.piece, which the hw backend runs its disk at:
    # the fit takes the disk cells measured at them (None: the best cells)
    disk_setting: dict | None = None


def _batch(src, dst, ss, ds, pb) -> Batch:
    ss, ds = np.asarray(ss, np.int64), np.asarray(ds, np.int64)
    return Batch(BatchKind.EVICT, src, dst, ss, ds, np.zeros(len(ss), np.uint64), pb, 0)


def _wait(rt, waitables):
    def proc():
        return (yield rt.all_of(waitables))
    return rt.run(rt.process(proc()))


def _time_batches(rt, be, batches, path) -> float:
    t0 = time.perf_counter()
    _wait(rt, [be.transfer(b, path) for b in batches])
    return time.perf_counter() - t0


def measure_copies(plan: Plan, device: str, m: Measured, profile: HardwareProfile | None = None) -> None:
    from kvsim_backends.hw import HwBackend, RealtimeRuntime  # noqa: PLC0415

    rng = np.random.default_rng(0)
    for pb in plan.page_sizes:
        n = max(2, plan.batch_bytes // pb)
        rt = RealtimeRuntime()
        # the geometry of benchmarks/hw_copy.py: a batch of n pages a direction, both
        # directions at once = n each way, 2n slots a tier, random slots
        be = HwBackend(rt, pb, {Level.GPU: 2 * n, Level.HOST: 2 * n}, device=device, refcheck=False,
                       profile=profile)
        try:
            m.device = be.info["device"]
            paths = (CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL) if be.on_gpu else (CopyPath.COPY_ENGINE,)
            hs, gs = rng.permutation(2 * n), rng.permutation(2 * n)
            cells = {"h2d": [_batch(Level.HOST, Level.GPU, hs[:n], gs[:n], pb)],
                     "d2h": [_batch(Level.GPU, Level.HOST, gs[n:], hs[n:], pb)],
                     "both": [_batch(Level.HOST, Level.GPU, hs[:n], gs[:n], pb),
                              _batch(Level.GPU, Level.HOST, gs[n:], hs[n:], pb)]}
            for path in paths:
                name = path.value if be.on_gpu else "cpu"
                for d, batches in cells.items():
                    _time_batches(rt, be, batches, path)  # warm-up
                    secs = [_time_batches(rt, be, batches, path) for _ in range(plan.repeats)]
                    pages = sum(b.pages for b in batches)
                    m.copies.append({"page": pb, "path": name, "dir": d, "pages": int(pages),
                                     "bytes": int(pages) * pb, "seconds": statistics.median(secs),
                                     "batches": [["h2d" if b.src == Level.HOST else "d2h", int(b.pages)]
                                                 for b in batches],
                                     "ctas": dict(be.ctas) if path is CopyPath.SM_KERNEL else None})
            if be.on_gpu and pb == 64 * KiB:
                for c in plan.cta_counts:
                    be.ctas = {"h2d": c, "d2h": c}
                    for d in ("h2d", "d2h"):
                        secs = [_time_batches(rt, be, cells[d], CopyPath.SM_KERNEL)
                                for _ in range(plan.repeats)]
                        s = statistics.median(secs)
                        m.ctas.append({"ctas": c, "dir": d, "GBps": n * pb / s / 1e9})
        finally:
            be.close()


def measure_small(plan: Plan, device: str, m: Measured, profile: HardwareProfile | None = None) -> None:
    """Batches of ``plan.small_counts`` pages, each path and direction, random slots, timed
    from ``transfer()`` to the runtime seeing the completion (a replay's runtime: default
    polling); median of ``small_repeats`` after 3 dropped. Copy-engine cells also keep the
    median host time of the batched call itself (``call_s``)."""
    from kvsim_backends.hw import HwBackend, RealtimeRuntime  # noqa: PLC0415

    if not plan.small_counts:
        return
    rng = np.random.default_rng(1)
    pb, slots = plan.small_page, 4 * max(plan.small_counts)
    rt = RealtimeRuntime()
    be = HwBackend(rt, pb, {Level.GPU: slots, Level.HOST: slots}, device=device, refcheck=False,
                   profile=profile)
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
    from kvsim_backends.hw.disk import DiskStore  # noqa: PLC0415
    from kvsim_backends.hw.memory import HostRegion  # noqa: PLC0415

    page = 4 * MiB if plan.disk_bytes >= 64 * MiB else 1 * MiB
    n = max(1, plan.disk_bytes // page)
    buf = HostRegion(n, page, cuda)
    buf.flat[:] = 7
    with tempfile.TemporaryDirectory(prefix="kvsim-cal-", dir=disk_dir) as d:
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


def measure_host_fill(plan: Plan, m: Measured, cuda) -> None:
    from kvsim_backends.hw.memory import HostRegion  # noqa: PLC0415

    page = 2 * MiB
    n = max(1, plan.host_fill_bytes // page)
    t0 = time.perf_counter()
    r = HostRegion(n, page)
    r.flat[::4096] = 1  # fault every page in
    if cuda is not None:
        r._cuda = cuda
        r._register(512 * MiB)
    dt = time.perf_counter() - t0
    r.close()
    m.host_fill_Bps = n * page / dt


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


def measure_busy(m: Measured, device: str) -> None:
    """compute(d) of the hw backend: requested vs measured seconds."""
    from kvsim_backends.hw import HwBackend, RealtimeRuntime  # noqa: PLC0415

    rt = RealtimeRuntime()
    be = HwBackend(rt, 64 * KiB, {Level.GPU: 4}, device=device)
    try:
        rows = []
        for d in (0.002, 0.01, 0.05):
            for i in range(21):  # the call's fixed cost (compute.latency) is a median of these
                t0 = time.perf_counter()
                got = _wait(rt, [be.compute(d)])
                if i:  # the first call of a duration is a warm-up (it captures its CUDA graphs)
                    rows.append({"requested_s": d, "wall_s": time.perf_counter() - t0,
                                 "reported_s": list(got.values())[0]})
        m.compute["busy"] = rows
        # the refcheck of one page, as a replay waits for it (from read_tags_later to the
        # runtime seeing the tags): refcheck.latency (the bytes of a page are ~0 on a GPU)
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


def measure(device: str = "auto", plan: Plan | None = None, disk_dir: str | None = None,
            profile: HardwareProfile | None = None) -> tuple[Measured, Plan]:
    """Everything calibrate measures, with the hw backend built on ``profile`` (default
    the default config's); the disk also at the profile's queue depth and piece size."""
    from kvsim_backends.hw.backend import _load_cupy  # noqa: PLC0415

    cp = _load_cupy() if device != "cpu" else None
    if device == "gpu" and cp is None:
        raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
    on_gpu = cp is not None
    plan = plan or Plan.for_device(on_gpu)
    profile = profile or load_profile(RunConfig.model_fields["hardware"].default)
    nv = profile.nvme
    plan = replace(plan, disk_threads=tuple(sorted({*plan.disk_threads, nv.queue_depth})),
                   disk_pieces=tuple(sorted({*plan.disk_pieces, nv.piece})))
    dev = "gpu" if on_gpu else "cpu"
    m = Measured(device=dev, disk_setting={"queue_depth": nv.queue_depth, "piece": nv.piece})
    measure_copies(plan, dev, m, profile)
    measure_small(plan, dev, m, profile)
    measure_disk(plan, m, disk_dir, cp.cuda.runtime if on_gpu else None)
    measure_host_fill(plan, m, cp.cuda.runtime if on_gpu else None)
    if on_gpu and plan.compute:
        measure_compute(m)
    measure_busy(m, dev)
    return m, plan


# -- the fit ---------------------------------------------------------------------------

def _rate(c: dict) -> float:
    return c["bytes"] / c["seconds"]


def _size_key(b: int) -> str:
    return f"{b // MiB}MiB" if b % MiB == 0 else f"{b // KiB}KiB" if b % KiB == 0 else str(b)


def fit_compute(busy: list[dict]) -> tuple[dict, str]:
    """``compute.latency`` and ``compute.scale`` from timed ``compute(d)`` calls (rows of
    ``requested_s`` and ``wall_s``): wall - d = latency + (scale - 1) x d, least squares over
    the calls (calibrate times 2, 10 and 50 ms). With one duration only, or a fitted slope
    below 0 (noise: the busy kernel never runs short), scale 1 and the median of wall - d."""
    d = [r["requested_s"] for r in busy]
    over = [r["wall_s"] - r["requested_s"] for r in busy]
    n = len(d)
    span = f"{len(over)} calls of {', '.join(f'{x * 1e3:g}' for x in sorted(set(d)))} ms"
    if len(set(d)) > 1:
        md, mo = sum(d) / n, sum(over) / n
        slope = sum((x - md) * (y - mo) for x, y in zip(d, over)) / sum((x - md) ** 2 for x in d)
        if slope >= 0:
            lat = max(0.0, mo - slope * md)
            return ({"latency": lat, "scale": 1.0 + slope},
                    f"fitted: the hw backend's compute(d) calls, wall - d = {lat * 1e6:.0f} us + "
                    f"{slope * 100:.2f}% of d (least squares, {span})")
    return ({"latency": max(0.0, statistics.median(over)), "scale": 1.0},
            f"measured: the hw backend's compute(d) calls, wall - d, median of {span}")


def fit(m: Measured, base: HardwareProfile) -> tuple[dict, dict[str, str]]:
    """(profile as a dict of YAML values, comment per key). Raises nothing on missing
    cells: what was not measured stays the base's, and its comment says so.

    Copy paths: the link rates are the copy engine's at the largest page (one direction,
    both at once); the SM kernel gets its own ceilings (``sm.h2d`` / ``sm.d2h``: median of
    its single-direction cells, a plateau flat in page size; ``sm.both``: median of its
    both-directions cells). The copy engine's host time per page is fitted per direction
    and per page size: ``(time - per_call - bytes / link) / pages`` of each single-direction
    cell (>= 0), stored as a table that the sim interpolates in log2(page size). A table,
    because the measured cost is not monotone in the page size (H200 GPU -> host: 0.50 /
    0.72 / 0.37 / 0.60 us at 16 KiB / 64 KiB / 256 KiB / 1 MiB), so no one- or two-
    parameter model (a constant, a + b * page, a power law, or host time overlapping the
    DMA) puts every cell within 5%. ``call_threads: 1``: the hw backend makes every CUDA
    call on one thread, so two batched calls' host times take turns.
    """
    d = base.model_dump()
    why: dict[str, str] = {}
    cells = m.copies
    big = max(c["page"] for c in cells)
    ce_path = "copy_engine" if m.device == "gpu" else "cpu"

    def cell(page, path, dr):
        return next((c for c in cells if c["page"] == page and c["path"] == path and c["dir"] == dr), None)

    for dr in ("h2d", "d2h"):
        ce = cell(big, ce_path, dr)
        d["link"][dr] = _rate(ce)
        why[f"link.{dr}"] = f"measured: {ce_path} at {big // KiB} KiB pages"
    both = cell(big, ce_path, "both")
    d["link"]["both"] = max(_rate(both), d["link"]["h2d"], d["link"]["d2h"])
    why["link.both"] = f"measured: {ce_path} both directions at {big // KiB} KiB pages"
    for dr in DIRS:
        sm = [_rate(c) for c in cells if c["path"] == "sm_kernel" and c["dir"] == dr]
        if sm:
            d["sm"][dr] = statistics.median(sm)
            why[f"sm.{dr}"] = (f"fitted: SM kernel {'both directions at once' if dr == 'both' else dr}, "
                               f"median over {len(sm)} page sizes ({min(sm) / 1e9:.1f}-{max(sm) / 1e9:.1f} GB/s)")
    if d["sm"].get("both") is not None:
        d["sm"]["both"] = max(d["sm"]["both"], *(d["sm"][k] or d["link"][k] for k in ("h2d", "d2h")))
    per_call = base.copy_engine.per_call
    one = [c["call_s"] for c in m.small if c["path"] == ce_path and c["pages"] == 1 and c.get("call_s")]
    if one:
        per_call = d["copy_engine"]["per_call"] = statistics.median(one)
        why["copy_engine.per_call"] = (f"measured: host time of the batched call for one "
                                       f"{_size_key(m.small[0]['page'])} page, median of {len(one)} cells")
    every = []
    for dr in ("h2d", "d2h"):
        table = {}
        for c in sorted((c for c in cells if c["path"] == ce_path and c["dir"] == dr), key=lambda c: c["page"]):
            extra = c["seconds"] - per_call - c["bytes"] / d["link"][dr]
            table[c["page"]] = max(0.0, extra / c["pages"])
        if table:
            d["copy_engine"][f"per_page_{dr}"] = table
            every += list(table.values())
            why[f"copy_engine.per_page_{dr}"] = (f"fitted: {ce_path} {dr} batches per page size, "
                                                 "(time - per_call - bytes / link) / pages, >= 0")
    if every:
        d["copy_engine"]["per_page"] = max(1e-9, statistics.median(every))
        why["copy_engine.per_page"] = "fitted: median of the two tables (the default for a direction without one)"
        d["copy_engine"]["call_threads"] = 1
        why["copy_engine.call_threads"] = "the hw backend: every CUDA call on the runtime's thread"
    for dr, key in (("h2d", "cta_onboard"), ("d2h", "cta_offload")):
        rows = sorted((r for r in m.ctas if r["dir"] == dr), key=lambda r: r["ctas"])
        if rows:
            r0 = rows[0]
            d["sm"][key] = r0["GBps"] * 1e9 / r0["ctas"]
            why[f"sm.{key}"] = f"measured: SM kernel with {r0['ctas']} CTAs, 64 KiB pages, rate / CTAs"
    if m.disk:
        # the sim predicts the hw backend, so the device is fitted as that backend drives it
        # (its I/O threads and piece size); the best cell only where those were not measured
        at = m.disk_setting or {}
        own = [r for r in m.disk if r["threads"] == at.get("queue_depth") and r["piece"] == at.get("piece")]
        best_r = own[0] if own else max(m.disk, key=lambda r: r["read_Bps"])
        best_w = own[0] if own else max(m.disk, key=lambda r: r["write_Bps"])
        d["nvme"]["read"], d["nvme"]["write"] = best_r["read_Bps"], best_w["write_Bps"]
        # (reports from before the rewrite pass have none: the rate of a first write then)
        d["nvme"]["rewrite"] = best_w.get("rewrite_Bps")
        d["nvme"]["queue_depth"] = int(best_r["threads"])
        d["nvme"]["piece"] = int(best_r["piece"])
        one = [r for r in m.disk if r["threads"] == 1 and r["piece"] == best_r["piece"]]
        if one:
            # a lone piece takes latency + piece / rate: one estimate from each pass (read,
            # write, rewrite), the median of them (the difference of two noisy rates alone
            # gave 18 us on one machine against 290-370 on others)
            p, o = best_r["piece"], one[0]
            ests = [p / o[k] - p / b[k] for k, b in (("read_Bps", best_r), ("write_Bps", best_w),
                                                     ("rewrite_Bps", best_w)) if o.get(k) and b.get(k)]
            d["nvme"]["latency"] = max(0.0, statistics.median(ests))
        how = "the hw backend's" if own else "best read"
        why["nvme"] = (f"measured: disk-tier file, {how} {best_r['threads']} threads x "
                       f"{best_r['piece'] // MiB} MiB pieces; latency: median over the passes of "
                       f"piece / 1-thread rate - piece / rate")
    if m.host_fill_Bps:
        d["host"]["fill_rate"] = m.host_fill_Bps
        why["host.fill_rate"] = "measured: anonymous map, touch every page, register (GPU)"
    if "matmul_fp16_flops" in m.compute:
        d["gpu"]["prefill_efficiency"] = min(1.0, m.compute["matmul_fp16_flops"] / base.gpu.flops_bf16)
        d["gpu"]["decode_efficiency"] = min(1.0, m.compute["hbm_copy_Bps"] / base.gpu.hbm)
        why["gpu.prefill_efficiency"] = "measured: fp16 8192^3 matmul FLOP/s over the base's peak"
        why["gpu.decode_efficiency"] = "measured: 1 GiB device copy bandwidth over the base's peak"
    if m.device == "gpu":
        d["sm"]["threads_per_cta"] = 128
        why["sm.threads_per_cta"] = "the hw backend's copy kernel, as measured here"
    _fit_latency(m, d, why, ce_path)
    busy = m.compute.get("busy", [])
    if busy:
        d["compute"], why["compute.latency"] = fit_compute(busy)
        why["compute.scale"] = "fitted with compute.latency, above"
    chk = (m.compute.get("refcheck") or {}).get("seconds")
    if chk:
        d["refcheck"] = {"latency": statistics.median(chk), "ctas": base.refcheck.ctas}
        why["refcheck.latency"] = (f"measured: {m.compute['refcheck'].get('how', 'one-page checks')}, "
                                   f"median of {len(chk)}")
        why["refcheck.ctas"] = f"base: {base.name} (not measured: CTAs at once beside compute)"
    lp, fitted = base.loop, f"base: {base.name} (not measured here: fitted from a replay's logs)"
    if lp.resume or lp.resume_per_page or lp.transfer or lp.disk:  # fitted from a replay, not measured here: kept
        d["loop"] = {"resume": lp.resume, "resume_per_page": lp.resume_per_page, "transfer": lp.transfer,
                     "disk": lp.disk}
        why["loop.resume"] = why["loop.resume_per_page"] = why["loop.transfer"] = why["loop.disk"] = fitted
    if base.refcheck.launch_per_page:  # (likewise)
        d.setdefault("refcheck", {"latency": base.refcheck.latency, "ctas": base.refcheck.ctas})
        d["refcheck"]["launch_per_page"] = base.refcheck.launch_per_page
        why["refcheck.launch_per_page"] = fitted
    if both is not None:
        _fit_link_both(both, d, why, ce_path, big)
    return d, why


def _fit_link_both(cell: dict, d: dict, why: dict[str, str], ce_path: str, big: int) -> None:
    """``link.both``: the total for which the sim reproduces the measured both-directions
    cell at the largest page (bisection between the faster direction and their sum). The
    cell's own rate is a little lower than the link's: the second direction's batched call
    starts only when the first returns (one calling thread), a start-up the sim models
    already, so the raw rate counted it twice. On the H200 (18:35 UTC) that moved link.both
    from 90.32 to 91.45 GB/s only; hw_copy.py's 1 GiB each way measured 97.7-99.7 GB/s in
    the same call, a difference with the batch size this model does not explain
    (docs/hw-notes.md)."""
    lo = max(d["link"]["h2d"], d["link"]["d2h"])
    hi = d["link"]["h2d"] + d["link"]["d2h"]

    def sim_s(total):
        d["link"]["both"] = total
        return _sim_seconds(HardwareProfile.model_validate(d), cell)

    if sim_s(hi) > cell["seconds"]:  # even the sum of both directions is too slow
        d["link"]["both"] = hi
    elif sim_s(lo) <= cell["seconds"]:
        d["link"]["both"] = lo
    else:
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sim_s(mid) > cell["seconds"] else (lo, mid)
        d["link"]["both"] = hi
    why["link.both"] = (f"fitted: the total for which the sim reproduces {ce_path} both directions "
                        f"at {big // KiB} KiB pages (measured {_rate(cell) / 1e9:.2f} GB/s)")


def _fit_latency(m: Measured, d: dict, why: dict[str, str], ce_path: str) -> None:
    """``transfer.latency`` (copy-engine small batches) and ``latency_sm_kernel`` (SM-kernel
    ones): the median over a path's small-batch cells of (measured - sim without the
    term), >= 0; the sim's time already holds per_call, per_page, launch and the bytes."""
    if not m.small:
        return
    d["transfer"] = {"latency": 0.0, "latency_sm_kernel": None}
    prof = HardwareProfile.model_validate(d)
    for path, key in ((ce_path, "latency"), ("sm_kernel", "latency_sm_kernel")):
        cells = [c for c in m.small if c["path"] == path]
        if not cells:
            continue
        resid = [c["seconds"] - _sim_seconds(prof, c) for c in cells]
        d["transfer"][key] = max(0.0, statistics.median(resid))
        pages = sorted({c["pages"] for c in cells})
        why[f"transfer.{key}"] = (f"fitted: {path} batches of {'/'.join(map(str, pages))} pages of "
                                  f"{_size_key(cells[0]['page'])}, each direction: median of "
                                  "(measured - sim without it) over the cells")


def _cell_batches(c: dict) -> list[tuple[str, int]]:
    """(direction, pages) of each batch a measured cell ran at once."""
    if c.get("batches"):
        return [(str(dr), int(k)) for dr, k in c["batches"]]
    if c["dir"] == "both":
        h = c["pages"] // 2
        return [("h2d", h), ("d2h", c["pages"] - h)]
    return [(c["dir"], c["pages"])]


def _sim_seconds(profile: HardwareProfile, c: dict) -> float:
    """Seconds the sim backend takes for a measured cell's batches, started together."""
    from kvsim_backends.sim import SimBackend, SimRuntime  # noqa: PLC0415

    pb = c["page"]
    batches = _cell_batches(c)
    path = CopyPath.SM_KERNEL if c["path"] == "sm_kernel" else CopyPath.COPY_ENGINE
    n = sum(k for _, k in batches)
    rt = SimRuntime()
    be = SimBackend(rt, profile, pb, {Level.GPU: n, Level.HOST: n}, refcheck=False, copy_path=path)
    idx, a, evs = np.arange(n), 0, []
    for dr, k in batches:
        src, dst = (Level.HOST, Level.GPU) if dr == "h2d" else (Level.GPU, Level.HOST)
        evs.append(be.transfer(_batch(src, dst, idx[a:a + k], idx[a:a + k], pb)))
        a += k
    rt.run(rt.all_of(evs))
    return rt.now


def check_cells(cells: list[dict], profile: HardwareProfile) -> list[dict]:
    """Each measured cell (page, path, dir, pages, bytes, seconds; optional ``batches``)
    replayed on the sim backend with ``profile``: rel err = (sim - hw) / hw of the time."""
    out = []
    for c in cells:
        sim_s = _sim_seconds(profile, c)
        out.append({"page": c["page"], "path": c["path"], "dir": c["dir"], "pages": c["pages"],
                    "hw_GBps": _rate(c) / 1e9, "sim_GBps": c["bytes"] / sim_s / 1e9,
                    "hw_s": c["seconds"], "sim_s": sim_s,
                    "rel_err": (sim_s - c["seconds"]) / c["seconds"]})
    return out


def check_fit(m: Measured, profile: HardwareProfile) -> list[dict]:
    """Each measured copy cell replayed alone on the sim backend with ``profile``."""
    return check_cells(m.copies, profile)


def check_small(m: Measured, profile: HardwareProfile) -> list[dict]:
    """Each small-batch cell replayed on the sim backend with ``profile`` (rows marked
    ``small``)."""
    return [{**r, "small": True} for r in check_cells(m.small, profile)]


def check_against(cells_path: str | Path, profile: str | Path) -> dict:
    """Replay cells measured elsewhere (a JSON with ``copies``, as ``benchmarks/hw_copy.py
    --json`` writes) on the sim with ``profile``: the fit's out-of-sample check."""
    data = json.loads(Path(cells_path).read_text())
    prof = load_profile(profile)
    check = check_cells(data["copies"], prof)
    return {"cells": str(cells_path), "cells_date": data.get("date"), "profile": str(profile),
            "fit_check": check, "fit_max_abs_err": max((abs(r["rel_err"]) for r in check), default=None)}


def _fmt_rate(x: float) -> str:
    return f"{x / 1e9:.4g}GB/s"


def _fmt_time(x: float) -> str:
    return f"{x * 1e6:.4g}us"


def profile_yaml(d: dict, why: dict[str, str], name: str, base_name: str, header: str) -> str:
    """The fitted profile as YAML with a comment on every line saying where it came from."""
    def c(key):
        return f"  # {why[key]}" if key in why else f"  # base: {base_name}"

    L, S, N, H, G, E = d["link"], d["sm"], d["nvme"], d["host"], d["gpu"], d["copy_engine"]
    I = S["interference"]  # noqa: E741

    def cost(v):
        if isinstance(v, dict):
            return "{" + ", ".join(f"{_size_key(k)}: {_fmt_time(t)}" for k, t in sorted(v.items())) + "}"
        return _fmt_time(v)

    ce_opt = [f"  {k}: {cost(E[k])}{c('copy_engine.' + k)}" for k in ("per_page_h2d", "per_page_d2h")
              if E.get(k) is not None]
    if E.get("call_threads") is not None:
        ce_opt.append(f"  call_threads: {E['call_threads']}{c('copy_engine.call_threads')}")
    sm_opt = [f"  {k}: {_fmt_rate(S[k])}{c('sm.' + k)}" for k in DIRS if S.get(k) is not None]
    lines = [*(f"# {h}" for h in header.splitlines()), f"name: {name}", "link:",
             f"  kind: {L['kind']}",
             f"  h2d: {_fmt_rate(L['h2d'])}{c('link.h2d')}", f"  d2h: {_fmt_rate(L['d2h'])}{c('link.d2h')}",
             f"  both: {_fmt_rate(L['both'])}{c('link.both')}",
             "copy_engine:", f"  count: {E['count']}  # base: {base_name}",
             f"  per_call: {_fmt_time(E['per_call'])}{c('copy_engine.per_call')}",
             f"  per_page: {_fmt_time(E['per_page'])}{c('copy_engine.per_page')}", *ce_opt,
             "sm:", f"  count: {S['count']}  # base: {base_name}", *sm_opt,
             f"  cta_offload: {_fmt_rate(S['cta_offload'])}{c('sm.cta_offload')}",
             f"  cta_onboard: {_fmt_rate(S['cta_onboard'])}{c('sm.cta_onboard')}",
             f"  threads_per_cta: {S['threads_per_cta']}{c('sm.threads_per_cta')}",
             f"  copy_cta_slots: {S['copy_cta_slots']}  # base: {base_name}",
             f"  launch: {_fmt_time(S['launch'])}  # base: {base_name}",
             "  interference:  # base: not measured by calibrate (see docs/hw-notes.md)",
             f"    sm_kernel_slowdown: {I['sm_kernel_slowdown']}", f"    sm_kernel_ctas: {I['sm_kernel_ctas']}",
             f"    copy_engine_slowdown: {I['copy_engine_slowdown']}",
             f"    busy_cta_efficiency: {I['busy_cta_efficiency']}",
             f"nvme:{c('nvme')}", f"  read: {_fmt_rate(N['read'])}", f"  write: {_fmt_rate(N['write'])}",
             f"  queue_depth: {N['queue_depth']}", f"  latency: {_fmt_time(N['latency'])}",
             f"  piece: {N['piece']}",
             *([f"  rewrite: {_fmt_rate(N['rewrite'])}"] if N.get("rewrite") else []),
             "host:", f"  fill_rate: {_fmt_rate(H['fill_rate'])}{c('host.fill_rate')}",
             "gpu:", f"  name: {G['name']}  # base", f"  memory: {G['memory']}  # base",
             f"  flops_bf16: {G['flops_bf16']:.6g}  # base (public peak)",
             f"  hbm: {_fmt_rate(G['hbm'])}  # base (public peak)",
             f"  prefill_efficiency: {G['prefill_efficiency']:.4g}{c('gpu.prefill_efficiency')}",
             f"  decode_efficiency: {G['decode_efficiency']:.4g}{c('gpu.decode_efficiency')}",
             f"  step_overhead: {_fmt_time(G['step_overhead'])}  # base: {base_name}"]
    T = d.get("transfer") or {}
    if T.get("latency") or T.get("latency_sm_kernel") is not None:
        lines += ["transfer:", f"  latency: {_fmt_time(T['latency'])}{c('transfer.latency')}"]
        if T.get("latency_sm_kernel") is not None:
            lines.append(f"  latency_sm_kernel: {_fmt_time(T['latency_sm_kernel'])}"
                         f"{c('transfer.latency_sm_kernel')}")
    C = d.get("compute") or {}
    if C.get("latency") or C.get("scale", 1.0) != 1.0:
        lines += ["compute:", f"  latency: {_fmt_time(C['latency'])}{c('compute.latency')}"]
        if C.get("scale", 1.0) != 1.0:
            lines.append(f"  scale: {C['scale']:.5f}{c('compute.scale')}")
    R = d.get("refcheck") or {}
    if R.get("latency") or R.get("launch_per_page"):
        lines += ["refcheck:", f"  latency: {_fmt_time(R['latency'])}{c('refcheck.latency')}",
                  f"  ctas: {R['ctas']}{c('refcheck.ctas')}"]
        if R.get("launch_per_page"):
            lines.append(f"  launch_per_page: {_fmt_time(R['launch_per_page'])}{c('refcheck.launch_per_page')}")
    L = d.get("loop") or {}
    if L.get("resume") or L.get("resume_per_page") or L.get("transfer") or L.get("disk"):
        lines += ["loop:", f"  resume: {_fmt_time(L['resume'])}{c('loop.resume')}",
                  f"  resume_per_page: {_fmt_time(L['resume_per_page'])}{c('loop.resume_per_page')}"]
        for k in ("transfer", "disk"):
            if L.get(k):
                lines.append(f"  {k}: {_fmt_time(L[k])}{c('loop.' + k)}")
    lines.append(f"notes: {json.dumps(d.get('notes', ''))}")
    return "\n".join(lines) + "\n"


def _write(out: Path, m: Measured, base_p: HardwareProfile, name: str, header: str,
           notes: str) -> tuple[HardwareProfile, list[dict]]:
    """Fit ``m``, write the profile YAML to ``out`` (validated first); (profile, fit check)."""
    d, why = fit(m, base_p)
    d["name"] = name
    d["notes"] = notes
    text = profile_yaml(d, why, name, base_p.name, header)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    try:
        fitted = load_profile(tmp)  # validate before it replaces anything
    except Exception:
        tmp.unlink()
        raise
    os.replace(tmp, out)
    return fitted, check_fit(m, fitted) + check_small(m, fitted)


def _check_yaml(out) -> None:
    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise ValueError(f"--out: got {str(out)!r}; expected a .yaml file")


def calibrate(out: str | Path, base: str = "h200-pcie", device: str = "auto",
              plan: Plan | None = None, name: str | None = None, disk_dir: str | None = None) -> dict:
    """Measure, fit, write ``out`` (YAML) and ``out`` with ``.report.json``; returns the report."""
    _check_yaml(out)
    out = Path(out)
    base_p = load_profile(base)
    t0 = time.perf_counter()
    m, plan = measure(device, plan, disk_dir, base_p)
    name = name or out.stem
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    notes = (f"kvsim calibrate on {m.device} ({stamp}); base {base_p.name} for what was "
             "not measured" + ("; CPU mode: tiny sizes, not a GPU profile" if m.device == "cpu" else ""))
    header = (f"Written by `kvsim calibrate` on {stamp}, device {m.device}.\n"
              f"Each line says whether it was measured/fitted here or kept from the base profile "
              f"{base_p.name}.\nThe measurements and the per-cell fit check: {out.name}.report.json")
    fitted, check = _write(out, m, base_p, name, header, notes)
    report = {"device": m.device, "date": stamp, "base": base_p.name, "profile": str(out),
              "seconds": time.perf_counter() - t0, "plan": plan.__dict__, "copies": m.copies,
              "ctas": m.ctas, "disk": m.disk, "host_fill_Bps": m.host_fill_Bps,
              "compute": m.compute, "small": m.small, "disk_setting": m.disk_setting, "fit_check": check,
              "fit_max_abs_err": max((abs(r["rel_err"]) for r in check), default=None)}
    Path(str(out) + ".report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def measured_from_report(report: dict) -> Measured:
    """The measurements a saved ``.report.json`` holds (nothing fitted)."""
    return Measured(device=report["device"], copies=list(report["copies"]), ctas=list(report.get("ctas", [])),
                    disk=list(report.get("disk", [])), host_fill_Bps=report.get("host_fill_Bps"),
                    compute=dict(report.get("compute", {})), small=list(report.get("small", [])),
                    disk_setting=report.get("disk_setting"))


def refit(report_path: str | Path, out: str | Path, base: str | None = None,
          name: str | None = None) -> dict:
    """Fit a profile offline from the measurements in a saved report (no device needed):
    writes ``out`` and ``out.report.json`` (the same measurements, this fit's check; an
    earlier fit check of the same report is kept under ``previous_fit_checks``)."""
    _check_yaml(out)
    out, report_path = Path(out), Path(report_path)
    old = json.loads(report_path.read_text())
    base_p = load_profile(base or old["base"])
    m = measured_from_report(old)
    name = name or out.stem
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    src = report_path.name
    notes = (f"kvsim calibrate on {m.device} ({old['date']}), re-fitted offline from {src} "
             f"({stamp}); base {base_p.name} for what was not measured")
    header = (f"Re-fitted by `python3 -m kvsim.calibrate --from-report {src}` on {stamp} from the\n"
              f"measurements of `kvsim calibrate` on {old['date']}, device {m.device}.\n"
              f"Each line says whether it was measured/fitted there or kept from the base profile "
              f"{base_p.name}.\nThe measurements and the per-cell fit check: {out.name}.report.json")
    fitted, check = _write(out, m, base_p, name, header, notes)
    previous = list(old.get("previous_fit_checks", []))
    if old.get("fit_check"):
        previous.append({"date": old.get("refit_date", old["date"]), "fit_check": old["fit_check"],
                         "fit_max_abs_err": old.get("fit_max_abs_err")})
    report = {k: v for k, v in old.items() if k not in ("fit_check", "fit_max_abs_err", "previous_fit_checks")}
    report.update({"profile": str(out), "refit_from": str(report_path), "refit_date": stamp,
                   "fit_check": check,
                   "fit_max_abs_err": max((abs(r["rel_err"]) for r in check), default=None),
                   "previous_fit_checks": previous})
    # cells measured elsewhere (benchmarks/hw_copy.py --json), kept in the report: their
    # out-of-sample check is redone with this fit
    oos = []
    for entry in old.get("out_of_sample", []):
        c = check_cells(entry["copies"], fitted)
        oos.append({**entry, "fit_check": c, "fit_max_abs_err": max((abs(r["rel_err"]) for r in c), default=None)})
    if oos:
        report["out_of_sample"] = oos
    Path(str(out) + ".report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def fit_table(check: list[dict]) -> str:
    """The fit check as a markdown table: page x (path, direction), rel err of the time
    (the large-batch cells; ``small_table`` has the small ones)."""
    check = [r for r in check if not r.get("small")]
    cols = [(p, d) for p in ("copy_engine", "cpu", "sm_kernel") for d in DIRS
            if any(r["path"] == p and r["dir"] == d for r in check)]
    short = {"copy_engine": "CE", "cpu": "CPU", "sm_kernel": "SM"}
    lines = ["| page | " + " | ".join(f"{short[p]} {d}" for p, d in cols) + " |",
             "| --- |" + " --- |" * len(cols)]
    for pb in sorted({r["page"] for r in check}):
        row = []
        for p, d in cols:
            r = next((r for r in check if r["page"] == pb and r["path"] == p and r["dir"] == d), None)
            row.append("" if r is None else f"{r['rel_err'] * 100:+.1f}%")
        lines.append(f"| {_size_key(pb).replace('KiB', ' KiB').replace('MiB', ' MiB')} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def small_table(check: list[dict]) -> str:
    """The small-batch rows of a fit check as a markdown table: pages x (path, direction),
    measured and sim microseconds a batch and the rel err."""
    rows = [r for r in check if r.get("small")]
    if not rows:
        return ""
    short = {"copy_engine": "CE", "cpu": "CPU", "sm_kernel": "SM"}
    cols = [(p, d) for p in ("copy_engine", "cpu", "sm_kernel") for d in ("h2d", "d2h")
            if any(r["path"] == p and r["dir"] == d for r in rows)]
    lines = [f"| pages of {_size_key(rows[0]['page'])} | " + " | ".join(f"{short[p]} {d} hw / sim us" for p, d in cols)
             + " |", "| --- |" + " --- |" * len(cols)]
    for k in sorted({r["pages"] for r in rows}):
        cells = []
        for p, d in cols:
            r = next((r for r in rows if r["pages"] == k and r["path"] == p and r["dir"] == d), None)
            cells.append("" if r is None else
                         f"{r['hw_s'] * 1e6:.0f} / {r['sim_s'] * 1e6:.0f} ({r['rel_err'] * 100:+.1f}%)")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m kvsim.calibrate --from-report PATH --out PATH [--base NAME]`` (refit), or
    ``python3 -m kvsim.calibrate --check CELLS.json --profile P [--out REPORT.json]``
    (the sim against cells measured elsewhere)."""
    import argparse  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python3 -m kvsim.calibrate", description=refit.__doc__)
    ap.add_argument("--from-report", help="a saved NAME.yaml.report.json: fit again from it")
    ap.add_argument("--out", help="profile to write (.yaml); with --check: the check's JSON")
    ap.add_argument("--base", default=None, help="base profile (default: the report's)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--check", help="cells measured elsewhere (benchmarks/hw_copy.py --json)")
    ap.add_argument("--profile", help="with --check: the profile to replay them with")
    a = ap.parse_args(argv)
    try:
        if a.check:
            if not a.profile:
                print("error: --check needs --profile")
                return 2
            report = check_against(a.check, a.profile)
            if a.out:
                Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
        elif a.from_report and a.out:
            report = refit(a.from_report, a.out, base=a.base, name=a.name)
        else:
            print("error: give --from-report and --out, or --check and --profile")
            return 2
    except (ValueError, OSError, KeyError) as e:
        print(f"error: {type(e).__name__}: {e}")
        return 2
    print(fit_table(report["fit_check"]))
    small = small_table(report["fit_check"])
    if small:
        print()
        print(small)
    print(f"max |rel err| {report['fit_max_abs_err'] * 100:.1f}%" + (f"; profile: {a.out}" if not a.check else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
