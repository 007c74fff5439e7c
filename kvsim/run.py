"""One replay, end to end: config -> model, tiers, workload, backend, engine -> results.

``prepare_run`` validates everything and loads the trace before anything is written, so
a run that fails validation leaves no results folder. ``replay`` runs the engine on the
chosen backend; ``write_results`` writes the folder through ``kvsim.results`` (which
folders it may replace, staging, the atomic swap). Backends are built through a registry
(``BACKENDS``; ``sim_backend`` and ``measure_hardware`` for calibrate): the one module of
kvsim that imports ``kvsim_backends``; the rest of kvsim never asks which backend it has.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kvsim.compute import ComputeModel, ModelShape, load_model
from kvsim.config import ConfigFileError, RunConfig, host_fill
from kvsim.core import Level, ManagerSpec, TierManager, TierSpec
from kvsim.core.hostfill import FillMode, layout_for
from kvsim.engine import Engine, EngineParams
from kvsim.engine.metrics import Row
from kvsim.hardware import HardwareProfile, load_profile
from kvsim.placements import build_placement, build_tier_policies, describe
from kvsim.policies import build_policy, check_tiers
from kvsim.results import Staging, kvsim_version, mark
from kvsim.workload import TraceError, Workload, session_start_times

LEVELS = {"gpu": Level.GPU, "host": Level.HOST, "disk": Level.DISK}


@dataclass
class Prepared:
    cfg: RunConfig
    shape: ModelShape
    profile: HardwareProfile
    spec: ManagerSpec
    workload: Workload
    starts: list[float] | None
    disk_dir: str | None


@dataclass
class Result:
    cfg: RunConfig
    backend: str
    metrics: dict
    rows: list[Row]
    timeline: list[dict]
    core: dict = field(default_factory=dict)
    profile: HardwareProfile | None = None  # the hardware profile the replay used
    run_info: dict = field(default_factory=dict)  # how it ran: device, time scale, version

    def summary(self) -> dict:
        out = {"kvsim": kvsim_version(), "backend": self.backend, "run": self.run_info,
               "metrics": self.metrics, "core_counters": self.core,
               "config": self.cfg.model_dump(mode="json")}
        if self.profile is not None:  # its content, not only the name the config gives
            out["hardware_profile"] = self.profile.model_dump(mode="json")
        return out


MAX_SLOTS = 1 << 28  # slots a tier: the backends keep a word or more per slot


def build_spec(cfg: RunConfig, shape: ModelShape) -> ManagerSpec:
    page = cfg.cache.page_bytes or shape.kv_bytes_per_token * cfg.cache.tokens_per_block
    for i, t in enumerate(cfg.cache.tiers):
        n = (t.max_quota or t.quota) // page
        if n > MAX_SLOTS:
            key = f"cache.tiers[{i}].{'max_quota' if t.max_quota else 'quota'}"
            raise ConfigFileError(f"{key}: {n:,} pages of {page:,} bytes; kvsim handles at most "
                                  f"{MAX_SLOTS:,} pages a tier (use larger pages, "
                                  f"cache.tokens_per_block, or a smaller quota)")
    tiers = tuple(TierSpec(LEVELS[t.level], t.quota, t.max_quota or 0) for t in cfg.cache.tiers)
    disk = cfg.cache.disk_tier
    copies = {} if disk is None else dict(
        keep_copy=disk.keep_copy, write_through=disk.write_through,
        write_through_inflight_bytes=max(page, disk.write_through_inflight),
        protected_copy_fraction=disk.protected_copy_fraction)
    return ManagerSpec(page_bytes=page, tokens_per_block=cfg.cache.tokens_per_block, tiers=tiers,
                       **copies)


def load_workload(cfg: RunConfig, trace: str | None = None) -> Workload:
    from kvsim import workload as wl

    workload = _load_workload(cfg, trace)
    if cfg.workload.max_turns is not None:
        workload = wl.first_turns(workload, cfg.workload.max_turns)
    return workload


def workload_key(cfg: RunConfig, trace: str | None = None) -> str:
    """What ``load_workload(cfg, trace)`` depends on, as text: two configs with equal keys
    load equal workloads (a study's worker reuses one it loaded, kvsim.study.execute). It
    must cover every input of ``_load_workload``: the workload section, the seed, and the
    trace file as it is now (path, size, modification time). OSError when the trace
    cannot be read."""
    path = trace or cfg.workload.path
    src = None
    if path:
        p = Path(os.path.expanduser(path)).resolve()
        st = p.stat()
        src = [str(p), st.st_size, st.st_mtime_ns]
    return json.dumps([cfg.workload.model_dump(mode="json"), cfg.seed, src], sort_keys=True)


def _load_workload(cfg: RunConfig, trace: str | None) -> Workload:
    from kvsim import workload as wl

    w = cfg.workload
    path = trace or w.path
    if w.kind == "mooncake":
        return wl.load_mooncake(path, time_scale=w.time_scale, limit=w.limit)
    if w.kind == "agentic":
        return wl.load_agentic(path, shared_prefix=w.shared_prefix, limit=w.limit,
                               start=w.start, sessions_per_s=w.sessions_per_s,
                               concurrency=w.concurrency, seed=cfg.seed,
                               max_think_s=w.max_think,
                               priorities=w.priorities.model_dump() if w.priorities else None)
    seed = w.synthetic.seed if w.synthetic.seed is not None else cfg.seed
    b = w.synthetic.burst
    burst = {} if b is None else {"burst_requests": b.requests, "burst_input_tokens": b.input_tokens,
                                  "burst_output_tokens": b.output_tokens, "burst_at_s": b.at}
    return wl.synthetic_agentic(w.synthetic.n_sessions, seed=seed, start=w.start,
                                sessions_per_s=w.sessions_per_s, concurrency=w.concurrency, **burst,
                                **w.synthetic.shape())


def prepare_run(cfg: RunConfig, trace: str | None = None, profile: HardwareProfile | None = None,
                workload: Workload | None = None) -> Prepared:
    """Everything a replay needs, validated; no file written. ``profile`` replaces the
    one the config names (e.g. the one a saved run recorded); ``workload``, one already
    loaded for this config (``load_workload(cfg, trace)``: workloads are immutable)."""
    try:
        shape = load_model(cfg.model, tp=cfg.tp)
        profile = profile or load_profile(cfg.hardware)
    except (ValueError, OSError) as e:
        raise ConfigFileError(str(e)) from None
    ctas, slots = cfg.engine.sm_ctas, profile.sm.copy_cta_slots
    if ctas != "auto" and ctas > slots:
        raise ConfigFileError(f"engine.sm_ctas: got {ctas}; the hardware profile {profile.name} "
                              f"has {slots} copy CTA slots (sm.copy_cta_slots)")
    spec = build_spec(cfg, shape)
    disk = next((t for t in cfg.cache.tiers if t.level == "disk"), None)
    if workload is None:
        workload = load_workload(cfg, trace)
    if workload.request_count() == 0:
        src = trace or cfg.workload.path or "the synthetic workload"
        raise TraceError(f"{src}: no requests to replay; expected at least one request")
    starts = None
    if workload.closed_loop and workload.start == "poisson":
        starts = session_start_times(workload, seed=cfg.seed)
    _check_span(cfg, workload, starts, trace)
    return Prepared(cfg, shape, profile, spec, workload, starts,
                    os.path.expanduser(disk.path) if disk and disk.path else None)


# the engine's clock counts nanoseconds in a float's 53 bits of mantissa: beyond this many
# seconds a step no longer moves it exactly (about 104 days)
MAX_SIM_S = 2**53 / 1e9


def _check_span(cfg: RunConfig, workload: Workload, starts: list[float] | None,
                trace: str | None) -> None:
    """Refuse a workload whose arrivals lie beyond what the engine's clock can count."""
    if starts:
        last, key = max(starts), "workload.sessions_per_s"
    elif not workload.closed_loop:
        last = max((t.arrival_s or 0.0) for _, t in workload.iter_turns())
        key = "workload.time_scale" if cfg.workload.kind == "mooncake" else "the trace's arrival times"
    else:
        return
    if last > MAX_SIM_S:
        raise ConfigFileError(f"{key}: the last arrival would come at {last:.3g} s of simulated time; "
                              f"kvsim's clock is exact up to {MAX_SIM_S:.3g} s (about 104 days): "
                              f"raise the rate or lower the time scale")


def _build_sim(prep: Prepared, mgr: TierManager, options: dict):
    """The sim backend; with ``hw_loop`` (a ``kvsim.hwloop.HwLoop``: kvsim compare's),
    wrapped in the hw backend's own host costs."""
    from kvsim_backends.sim import SimBackend, SimRuntime

    rt = SimRuntime()
    slots = {t.level: t.max_slots for t in mgr.tiers}
    e = prep.cfg.engine
    be = SimBackend(rt, prep.profile, mgr.page_bytes, slots, refcheck=e.refcheck,
                    copy_path=e.copy_path.model_dump(), sm_ctas=e.sm_ctas,
                    kernel_on_coherent_link=e.kernel_on_coherent_link,
                    timing_log=options.get("timing_log"), compute_log=options.get("compute_log"),
                    host_fill=host_fill(prep.cfg).model_dump(),
                    fail_fill_at_unit=options.get("fail_fill_at_unit"),
                    disk_io_workers=prep.cfg.cache.disk_io_workers,
                    disk_io_write_share=prep.cfg.cache.disk_io_write_share)
    if options.get("hw_loop") is not None:
        from kvsim_backends.sim.hwloop import HwLoopSim

        return rt, HwLoopSim(be, options["hw_loop"])
    return rt, be


def _build_hw(prep: Prepared, mgr: TierManager, options: dict):
    from kvsim_backends.hw import build_hw_backend

    return build_hw_backend(prep, mgr, **options)


BACKENDS: dict[str, Callable] = {"sim": _build_sim, "hw": _build_hw}


def sim_backend(profile: HardwareProfile, page_bytes: int, slots: dict, **options):
    """(runtime, sim backend) on ``profile`` outside a replay (calibrate's fit check)."""
    from kvsim_backends.sim import SimBackend, SimRuntime

    rt = SimRuntime()
    return rt, SimBackend(rt, profile, page_bytes, slots, **options)


def measure_hardware(device: str = "auto", plan=None, disk_dir: str | None = None,
                     profile: HardwareProfile | None = None):
    """``kvsim calibrate``'s measurements of this machine on the hw backend:
    (``kvsim.fit.Measured``, the plan measured); see ``kvsim_backends.hw.calibrate``."""
    from kvsim_backends.hw.calibrate import measure

    return measure(device, plan, disk_dir, profile)


def replay(prep: Prepared, backend: str = "sim", progress: Callable[[float, float], None] | None = None,
           backend_options: dict | None = None,
           pinned_arrivals: dict[tuple[str, int], float] | None = None,
           on_resume: Callable[[int], None] | None = None) -> Result:
    """Replay the prepared run on ``backend``. ``pinned_arrivals`` ((session, turn) ->
    seconds): release those turns then, not a think time after their previous item
    (``Engine.pin_arrivals``). ``on_resume``: the engine's (told the GPU pages of each
    resumed request)."""
    cfg = prep.cfg
    if backend not in BACKENDS:
        raise ConfigFileError(f"--backend: got {backend!r}; expected one of {', '.join(BACKENDS)}")
    policy = build_policy(cfg, prep.workload, backend, prep.starts)  # belady: sim only
    placement = build_placement(cfg, prep.shape, prep.profile, prep.spec.page_bytes)
    tier_policies = build_tier_policies(cfg)
    spec = prep.spec
    check_tiers(cfg, [t.quota_bytes // spec.page_bytes for t in spec.tiers], policy,
                tier_policies)
    mgr = TierManager(spec, policy, placement, tier_policies)
    rt, be = BACKENDS[backend](prep, mgr, backend_options or {})
    try:  # from here on the backend holds memory and files: close it on every exit
        model = ComputeModel(prep.shape, prep.profile)
        e = cfg.engine
        params = EngineParams(max_batch_tokens=e.max_batch_tokens, max_running=e.max_running,
                              fast_forward=e.fast_forward, refcheck=e.refcheck,
                              refcheck_disk_writes=e.refcheck_disk_writes,
                              hold_sessions=e.hold_sessions,
                              gpu_free_watermark=e.gpu_free_watermark,
                              max_plan_failures=e.max_plan_failures,
                              timeline_interval_s=cfg.output.timeline_interval,
                              host_serve_slots=host_serve_slots(cfg, mgr))
        engine = Engine(rt, be, mgr, model, params, on_resume=on_resume)
        if pinned_arrivals is not None:
            engine.pin_arrivals(pinned_arrivals)
        engine.load(prep.workload, prep.starts)
        if progress is not None:
            engine.on_progress = lambda t_ns: progress(t_ns / 1e9, len(engine.metrics.rows))
        wall0 = time.perf_counter()
        with _gc_for_replay():
            done = rt.process(engine.serve())
            rt.run(until=done)
        fill_limit = be.slot_limit(Level.HOST)  # a host fill that failed: the slots it made
    finally:
        be.close()
    wall = time.perf_counter() - wall0
    traffic = be.stats()
    levels = {int(t.level): t.level.name.lower() for t in mgr.tiers}
    counters = mgr.counters.snapshot()
    if mgr.copies_on:
        counters["retained_slots"] = mgr.retained_slots()
    metrics = engine.metrics.summary(counters, traffic, engine.t, wall, levels)
    metrics["page_bytes"] = mgr.page_bytes
    metrics["tiers_slots"] = {t.level.name.lower(): t.capacity for t in mgr.tiers}
    if any(t.fill is not None for t in cfg.cache.tiers):
        metrics["host_fill"] = host_fill_metrics(cfg, engine.metrics, fill_limit)
    info = getattr(be, "info", {})
    run_info = {"backend": backend, "device": info.get("device", "simulated"),
                "time_scale": info.get("time_scale"), "kvsim_version": kvsim_version(),
                "git_commit": git_commit(), "policy": cfg.cache.policy.eviction,
                "policy_is_bound": bool(policy.is_bound),
                **describe(cfg, placement, tier_policies)}
    return Result(cfg, backend, metrics, engine.metrics.rows, engine.metrics.timeline, counters,
                  prep.profile, run_info)


FIRST_REQUESTS = 10  # host_fill.ttft_first_*: the TTFT of this many first arrivals


def host_serve_slots(cfg: RunConfig, mgr: TierManager) -> int:
    """Host slots that must exist before serving starts: none without a fill, the first
    unit (progressive), the whole tier (before_serve); ``kvsim.core.hostfill``."""
    fill = host_fill(cfg)
    host = next((t for t in mgr.tiers if t.level == Level.HOST), None)
    if host is None or fill.mode == "none":
        return 0
    layout = layout_for(fill.backing, mgr.page_bytes, host.max_slots, fill.unit)
    return layout.first_serve(FillMode(fill.mode))


def host_fill_metrics(cfg: RunConfig, m, limit: int | None = None) -> dict:
    """What a host fill did to the start of a replay: when serving started, when the
    first token came, the TTFT of the first requests to arrive (mean and worst), and,
    where the fill failed, the host slots it made usable (``usable_slots``; else None)."""
    fill = host_fill(cfg)
    firsts = [r.first_token_ns for r in m.rows if r.first_token_ns >= 0]
    early = sorted(m.rows, key=lambda r: (r.arrival_ns, r.rid))[:FIRST_REQUESTS]
    ttft = [r.ttft_s for r in early if r.first_token_ns >= 0]
    return {"mode": fill.mode, "backing": fill.backing, "serve_start_s": m.serve_start_ns / 1e9,
            "first_token_s": min(firsts) / 1e9 if firsts else None,
            "ttft_first_mean_s": sum(ttft) / len(ttft) if ttft else None,
            "ttft_first_max_s": max(ttft) if ttft else None, "usable_slots": limit}


def git_commit() -> str | None:
    """The commit of the checkout kvsim runs from (with ``-dirty`` when it has uncommitted
    changes), or None for an installed copy or where git is absent."""
    import subprocess  # noqa: PLC0415

    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


@contextmanager
def _gc_for_replay(young: int = 20_000, older: int = 20):
    """Run a replay with the cyclic garbage collector tuned for it, then restore it. What
    exists before the replay (the loaded trace, the configuration) lives through it: frozen,
    full collections skip it. A replay allocates short-lived events, plans and pages by the
    million: collecting the young generation every ``young`` net allocations rather than
    every 700 (and each older one after ``older`` collections of the one below, not 10)
    spends less time finding little. Changes timing only, never results."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, older, older)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def output_dir(cfg: RunConfig, out: str | None) -> Path:
    return Path(out or cfg.output.dir.format(name=cfg.name))


def write_files(result: Result, folder: Path, plots: bool = True) -> None:
    """summary.json, requests.csv, timeline.csv (and plots) into ``folder`` (created if
    absent), marked as a results folder."""
    folder = Path(folder)
    folder.mkdir(exist_ok=True)
    mark(folder)
    (folder / "summary.json").write_text(json.dumps(result.summary(), indent=2, sort_keys=True,
                                                    allow_nan=False) + "\n")
    with open(folder / "requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(Row.COLUMNS)
        for r in result.rows:
            w.writerow(r.csv_values())
    if result.timeline:
        keys = list(dict.fromkeys(k for row in result.timeline for k in row))
        with open(folder / "timeline.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(result.timeline)
    if plots:
        from kvsim.plots import write_plots

        write_plots(result, folder)


def write_results(result: Result, out: Path, plots: bool = True) -> Path:
    """Write the results folder ``out`` (kvsim.results: refused unless ``out`` is absent,
    empty or an earlier results folder; staged beside it and swapped into place)."""
    with Staging.reserve(out) as stage:
        write_files(result, stage.path, plots)
        return stage.commit()
