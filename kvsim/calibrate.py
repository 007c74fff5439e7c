"""``kvsim calibrate``: microbenchmarks on this machine, fitted into a hardware profile.

Measured (hw backend, real bytes; on a GPU with CuPy, else CPU mode with tiny sizes):
- GPU <-> host batches per page size (16 KiB .. 4 MiB on a GPU), per copy path (copy
  engine, SM kernel), host -> GPU, GPU -> host and both at once; an SM-kernel CTA sweep;
- disk reads and writes per I/O thread count and piece size (the disk tier's file);
- host-tier fill (map, touch, pin);
- compute: fp16 matmul FLOP/s, device copy bandwidth, the busy kernel's accuracy.

Fitted into kvsim.hardware.HardwareProfile (the schema of configs/hardware/h200-pcie.yaml):
link rates, copy-engine host time per page, per-CTA rates, NVMe rates/latency/queue depth,
host fill rate, prefill/decode efficiencies. Everything else (interference, launch, step
overhead, public peaks) is kept from a base profile and marked ``base:`` in the YAML
comments. The fit is then checked: each measured batch is replayed alone on the sim
backend with the fitted profile, and the relative error per cell is reported.

The sim has one link rate per direction for both copy paths while the hw SM kernel
plateaus a little below the copy engine (PCIe zero-copy), so the fitted link rate is the
geometric middle of the two plateaus (each cell's error is then at most about half of
their gap); the report says so and lists every cell.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvsim.core.copypath import CopyPath
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
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

    @staticmethod
    def for_device(on_gpu: bool) -> "Plan":
        if on_gpu:
            return Plan(GPU_PAGES, 512 * MiB, 3, (4, 8, 16, 24, 32, 64), 1 << 30, (1, 4, 16),
                        (1 * MiB, 4 * MiB), 2 << 30, True)
        return Plan(CPU_PAGES, 2 * MiB, 2, (2, 4), 8 * MiB, (1, 2), (1 * MiB,), 8 * MiB, False)


@dataclass
class Measured:
    device: str
    copies: list[dict] = field(default_factory=list)   # page, path, dir, pages, bytes, seconds
    ctas: list[dict] = field(default_factory=list)
    disk: list[dict] = field(default_factory=list)
    host_fill_Bps: float | None = None
    compute: dict = field(default_factory=dict)


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


def measure_copies(plan: Plan, device: str, m: Measured) -> None:
    from kvsim_backends.hw import HwBackend, RealtimeRuntime  # noqa: PLC0415

    rng = np.random.default_rng(0)
    for pb in plan.page_sizes:
        n = max(2, plan.batch_bytes // pb)
        rt = RealtimeRuntime()
        be = HwBackend(rt, pb, {Level.GPU: n, Level.HOST: n}, device=device, refcheck=False)
        try:
            m.device = be.info["device"]
            paths = (CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL) if be.on_gpu else (CopyPath.COPY_ENGINE,)
            hs, gs = rng.permutation(n), rng.permutation(n)
            half = n // 2
            cells = {"h2d": [_batch(Level.HOST, Level.GPU, hs, gs, pb)],
                     "d2h": [_batch(Level.GPU, Level.HOST, gs, hs, pb)],
                     "both": [_batch(Level.HOST, Level.GPU, hs[:half], gs[:half], pb),
                              _batch(Level.GPU, Level.HOST, gs[half:], hs[half:], pb)]}
            for path in paths:
                name = path.value if be.on_gpu else "cpu"
                for d, batches in cells.items():
                    _time_batches(rt, be, batches, path)  # warm-up
                    secs = [_time_batches(rt, be, batches, path) for _ in range(plan.repeats)]
                    pages = sum(b.pages for b in batches)
                    m.copies.append({"page": pb, "path": name, "dir": d, "pages": int(pages),
                                     "bytes": int(pages) * pb, "seconds": statistics.median(secs),
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


def measure_disk(plan: Plan, m: Measured, disk_dir: str | None = None) -> None:
    from kvsim_backends.hw.disk import DiskStore  # noqa: PLC0415
    from kvsim_backends.hw.memory import HostRegion  # noqa: PLC0415

    page = 4 * MiB if plan.disk_bytes >= 64 * MiB else 1 * MiB
    n = max(1, plan.disk_bytes // page)
    buf = HostRegion(n, page)
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
                        os.fsync(ds.fd)
                        tw = time.perf_counter() - t0
                        ds.mark_written(slots)
                        t0 = time.perf_counter()
                        for f in ds.submit_reads(slots, buf.view):
                            f.result()
                        tr = time.perf_counter() - t0
                        m.disk.append({"threads": threads, "piece": piece, "bytes": n * page,
                                       "write_Bps": n * page / tw, "read_Bps": n * page / tr,
                                       "direct": ds.uses_direct})
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
            t0 = time.perf_counter()
            got = _wait(rt, [be.compute(d)])
            rows.append({"requested_s": d, "wall_s": time.perf_counter() - t0,
                         "reported_s": list(got.values())[0]})
        m.compute["busy"] = rows
    finally:
        be.close()


def measure(device: str = "auto", plan: Plan | None = None, disk_dir: str | None = None) -> tuple[Measured, Plan]:
    from kvsim_backends.hw.backend import _load_cupy  # noqa: PLC0415

    cp = _load_cupy() if device != "cpu" else None
    if device == "gpu" and cp is None:
        raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
    on_gpu = cp is not None
    plan = plan or Plan.for_device(on_gpu)
    dev = "gpu" if on_gpu else "cpu"
    m = Measured(device=dev)
    measure_copies(plan, dev, m)
    measure_disk(plan, m, disk_dir)
    measure_host_fill(plan, m, cp.cuda.runtime if on_gpu else None)
    if on_gpu and plan.compute:
        measure_compute(m)
    measure_busy(m, dev)
    return m, plan


# -- the fit ---------------------------------------------------------------------------

def _rate(c: dict) -> float:
    return c["bytes"] / c["seconds"]


def fit(m: Measured, base: HardwareProfile) -> tuple[dict, dict[str, str]]:
    """(profile as a dict of YAML values, comment per key). Raises nothing on missing
    cells: what was not measured stays the base's, and its comment says so."""
    d = base.model_dump()
    why: dict[str, str] = {}
    cells = m.copies
    big = max(c["page"] for c in cells)
    ce_path = "copy_engine" if m.device == "gpu" else "cpu"

    def cell(page, path, dr):
        return next((c for c in cells if c["page"] == page and c["path"] == path and c["dir"] == dr), None)

    for dr in ("h2d", "d2h"):
        ce = cell(big, ce_path, dr)
        sm = [_rate(c) for c in cells if c["path"] == "sm_kernel" and c["dir"] == dr]
        if sm:
            sm_plateau = statistics.median(sm)
            d["link"][dr] = float(np.sqrt(_rate(ce) * sm_plateau))
            why[f"link.{dr}"] = (f"fitted: geometric middle of copy engine at {big // KiB} KiB "
                                 f"({_rate(ce) / 1e9:.1f} GB/s) and SM kernel plateau ({sm_plateau / 1e9:.1f} GB/s)")
        else:
            d["link"][dr] = _rate(ce)
            why[f"link.{dr}"] = f"measured: {ce_path} at {big // KiB} KiB pages"
    both = cell(big, ce_path, "both")
    d["link"]["both"] = max(_rate(both), d["link"]["h2d"], d["link"]["d2h"])
    why["link.both"] = f"measured: {ce_path} both directions at {big // KiB} KiB pages"
    # host time per page of a batched copy-engine call (h2d, the costlier direction)
    per = []
    for c in cells:
        if c["path"] == ce_path and c["dir"] == "h2d" and c["page"] <= 256 * KiB:
            extra = c["seconds"] - c["bytes"] / d["link"]["h2d"] - base.copy_engine.per_call
            per.append(max(0.0, extra / c["pages"]))
    if per:
        d["copy_engine"]["per_page"] = max(1e-7, statistics.median(per))
        why["copy_engine.per_page"] = (f"fitted: h2d {ce_path} batches of <= 256 KiB pages, "
                                       "(time - bytes / link - per_call) / pages, median")
    for dr, key in (("h2d", "cta_onboard"), ("d2h", "cta_offload")):
        rows = sorted((r for r in m.ctas if r["dir"] == dr), key=lambda r: r["ctas"])
        if rows:
            r0 = rows[0]
            d["sm"][key] = r0["GBps"] * 1e9 / r0["ctas"]
            why[f"sm.{key}"] = f"measured: SM kernel with {r0['ctas']} CTAs, 64 KiB pages, rate / CTAs"
    if m.disk:
        best_r = max(m.disk, key=lambda r: r["read_Bps"])
        best_w = max(m.disk, key=lambda r: r["write_Bps"])
        d["nvme"]["read"], d["nvme"]["write"] = best_r["read_Bps"], best_w["write_Bps"]
        d["nvme"]["queue_depth"] = int(best_r["threads"])
        d["nvme"]["piece"] = int(best_r["piece"])
        one = [r for r in m.disk if r["threads"] == 1 and r["piece"] == best_r["piece"]]
        if one:
            p = best_r["piece"]
            d["nvme"]["latency"] = max(0.0, p / one[0]["read_Bps"] - p / best_r["read_Bps"])
        why["nvme"] = (f"measured: disk-tier file, best read {best_r['threads']} threads x "
                       f"{best_r['piece'] // MiB} MiB pieces; latency from the 1-thread read rate")
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
    return d, why


def check_fit(m: Measured, profile: HardwareProfile) -> list[dict]:
    """Each measured copy cell replayed alone on the sim backend with ``profile``."""
    from kvsim_backends.sim import SimBackend, SimRuntime  # noqa: PLC0415

    out = []
    for c in m.copies:
        pb, n = c["page"], c["pages"]
        path = CopyPath.SM_KERNEL if c["path"] == "sm_kernel" else CopyPath.COPY_ENGINE
        rt = SimRuntime()
        be = SimBackend(rt, profile, pb, {Level.GPU: n, Level.HOST: n}, refcheck=False, copy_path=path)
        idx = np.arange(n)
        if c["dir"] == "both":
            h = n // 2
            evs = [be.transfer(_batch(Level.HOST, Level.GPU, idx[:h], idx[:h], pb)),
                   be.transfer(_batch(Level.GPU, Level.HOST, idx[h:], idx[h:], pb))]
        else:
            src, dst = (Level.HOST, Level.GPU) if c["dir"] == "h2d" else (Level.GPU, Level.HOST)
            evs = [be.transfer(_batch(src, dst, idx, idx, pb))]
        rt.run(rt.all_of(evs))
        sim_s = rt.now
        out.append({"page": pb, "path": c["path"], "dir": c["dir"], "hw_GBps": _rate(c) / 1e9,
                    "sim_GBps": c["bytes"] / sim_s / 1e9, "hw_s": c["seconds"], "sim_s": sim_s,
                    "rel_err": (sim_s - c["seconds"]) / c["seconds"]})
    return out


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
    lines = [*(f"# {h}" for h in header.splitlines()), f"name: {name}", "link:",
             f"  kind: {L['kind']}",
             f"  h2d: {_fmt_rate(L['h2d'])}{c('link.h2d')}", f"  d2h: {_fmt_rate(L['d2h'])}{c('link.d2h')}",
             f"  both: {_fmt_rate(L['both'])}{c('link.both')}",
             "copy_engine:", f"  count: {E['count']}  # base: {base_name}",
             f"  per_call: {_fmt_time(E['per_call'])}  # base: {base_name}",
             f"  per_page: {_fmt_time(E['per_page'])}{c('copy_engine.per_page')}",
             "sm:", f"  count: {S['count']}  # base: {base_name}",
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
             "host:", f"  fill_rate: {_fmt_rate(H['fill_rate'])}{c('host.fill_rate')}",
             "gpu:", f"  name: {G['name']}  # base", f"  memory: {G['memory']}  # base",
             f"  flops_bf16: {G['flops_bf16']:.6g}  # base (public peak)",
             f"  hbm: {_fmt_rate(G['hbm'])}  # base (public peak)",
             f"  prefill_efficiency: {G['prefill_efficiency']:.4g}{c('gpu.prefill_efficiency')}",
             f"  decode_efficiency: {G['decode_efficiency']:.4g}{c('gpu.decode_efficiency')}",
             f"  step_overhead: {_fmt_time(G['step_overhead'])}  # base: {base_name}",
             f"notes: {json.dumps(d.get('notes', ''))}"]
    return "\n".join(lines) + "\n"


def calibrate(out: str | Path, base: str = "h200-pcie", device: str = "auto",
              plan: Plan | None = None, name: str | None = None, disk_dir: str | None = None) -> dict:
    """Measure, fit, write ``out`` (YAML) and ``out`` with ``.report.json``; returns the report."""
    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise ValueError(f"--out: got {str(out)!r}; expected a .yaml file")
    base_p = load_profile(base)
    t0 = time.perf_counter()
    m, plan = measure(device, plan, disk_dir)
    d, why = fit(m, base_p)
    name = name or out.stem
    d["name"] = name
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    d["notes"] = (f"kvsim calibrate on {m.device} ({stamp}); base {base_p.name} for what was "
                  "not measured" + ("; CPU mode: tiny sizes, not a GPU profile" if m.device == "cpu" else ""))
    header = (f"Written by `kvsim calibrate` on {stamp}, device {m.device}.\n"
              f"Each line says whether it was measured/fitted here or kept from the base profile "
              f"{base_p.name}.\nThe measurements and the per-cell fit check: {out.name}.report.json")
    text = profile_yaml(d, why, name, base_p.name, header)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    fitted = load_profile(tmp)  # validate before it replaces anything
    os.replace(tmp, out)
    check = check_fit(m, fitted)
    report = {"device": m.device, "date": stamp, "base": base_p.name, "profile": str(out),
              "seconds": time.perf_counter() - t0, "plan": plan.__dict__, "copies": m.copies,
              "ctas": m.ctas, "disk": m.disk, "host_fill_Bps": m.host_fill_Bps,
              "compute": m.compute, "fit_check": check,
              "fit_max_abs_err": max((abs(r["rel_err"]) for r in check), default=None)}
    Path(str(out) + ".report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report
