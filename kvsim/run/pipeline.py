"""One replay, end to end: config -> model, tiers, workload, backend, engine -> results.

``prepare_run`` validates everything and loads the trace before anything is written, so
a run that fails validation leaves no results folder. ``replay`` runs the engine on the
chosen backend; ``kvsim.run.results.write_results`` writes the folder (which
folders it may replace, staging, the atomic swap). Backends are built through a registry
(``BACKENDS``; ``sim_backend`` and ``measure_hardware`` for calibrate): the one module of
kvsim that imports ``kvsim_backends``; the rest of kvsim never asks which backend it has.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kvsim.engine.compute import ComputeModel, ModelShape, load_model
from kvsim.config import ConfigFileError, RunConfig, host_fill
from kvsim.core import Level, ManagerSpec, TierManager, TierSpec
from kvsim.engine import Engine, EngineParams
from kvsim.engine.metrics import Row, dist
from kvsim.engine.balance import tier_balance
from kvsim.engine.managercost import manager_cost_params
from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.run.policies import (build_placement, build_policy, build_tier_policies, check_tiers,
                                describe)
from kvsim.run.budget import available_bytes, check_requests, check_span
from kvsim.run.cluster import Cluster, build_router, check_cluster, instances_of, routed
from kvsim.run.clustermetrics import cluster_metrics, is_cluster
from kvsim.run.ranks import RankRun, check_node_fit, merge, split, sum_counts
from kvsim.run.remotetier import attach_remote, check_remote, remote_metrics
from kvsim.run.sharedhost import (attach_shared, check_shared, check_shared_policies, share_pools,
                                  shared_metrics)
from kvsim.run.replaygc import collector_for_replay, freeze_built
from kvsim.run.results import git_commit, kvsim_version
from kvsim.run.seam import backend_settings, check_profile_fit, settings_for
from kvsim.run.tracepath import trace_path
from kvsim.settings import BackendSettings
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
    page = cfg.cache.page_bytes or shape.page_bytes_per_token * cfg.cache.tokens_per_block
    for i, t in enumerate(cfg.cache.tiers):
        if page > t.quota:   # no slot fits: name the key at fault (the one set off its default)
            if cfg.cache.page_bytes or cfg.cache.tokens_per_block != 32:
                key, why = (("cache.page_bytes", f"{page:,} bytes") if cfg.cache.page_bytes else
                            ("cache.tokens_per_block", f"{cfg.cache.tokens_per_block:,} tokens a block "
                             f"make pages of {page:,} bytes ({shape.page_bytes_per_token:,} a token)"))
                raise ConfigFileError(f"{key}: {why}, more than cache.tiers[{i}].quota "
                                      f"({t.quota:,} bytes): no page fits in the {t.level} tier")
            raise ConfigFileError(f"cache.tiers[{i}].quota: {t.quota:,} bytes hold no page of {page:,} "
                                  f"bytes (cache.tokens_per_block {cfg.cache.tokens_per_block} x "
                                  f"{shape.page_bytes_per_token:,} bytes a token); expected at least one page")
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
        protected_copy_fraction=disk.protected_copy_fraction,
        write_through_take_back=disk.write_through_pending == "take_back")
    return ManagerSpec(page_bytes=page, tokens_per_block=cfg.cache.tokens_per_block, tiers=tiers,
                       **copies)


def state_pages(shape: ModelShape, page_bytes: int, tokens_per_block: int) -> int:
    """GPU pages a running request's fixed state takes beside its KV pages: the sliding
    layers' window and the recurrent layers' state, rounded up to whole pages
    (docs/models.md)."""
    return -(-shape.state_bytes(tokens_per_block) // page_bytes)


def load_workload(cfg: RunConfig, trace: str | None = None) -> Workload:
    from kvsim import workload as wl

    workload = _load_workload(cfg, trace)
    if cfg.workload.max_turns is not None:
        workload = wl.first_turns(workload, cfg.workload.max_turns)
    return wl.scoped(workload, cfg.workload.scope)


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
    from kvsim.run.budget import check_workload_memory

    check_workload_memory(cfg)  # a generator asked for more than memory holds: refused now
    w = cfg.workload
    path = trace_path(w.kind, w.path, trace)  # refused here when it names nothing
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
        shape = load_model(cfg.model, tp=cfg.tp, kv_dtype=cfg.kv_dtype)
        profile = profile or load_profile(cfg.hardware)
    except (ValueError, OSError) as e:
        raise ConfigFileError(str(e)) from None
    check_profile_fit(cfg, profile)
    spec = build_spec(cfg, shape)
    check_node_fit(cfg, shape, profile, spec.page_bytes)
    disk = next((t for t in cfg.cache.tiers if t.level == "disk"), None)
    if workload is None:
        workload = load_workload(cfg, trace)
    if workload.request_count() == 0:
        src = trace or cfg.workload.path or "the synthetic workload"
        raise TraceError(f"{src}: no requests to replay; expected at least one request")
    starts = None
    if workload.closed_loop and workload.start == "poisson":
        starts = session_start_times(workload, seed=cfg.seed)
    check_span(cfg, workload, starts, trace)
    check_requests(cfg, workload, trace)
    return Prepared(cfg, shape, profile, spec, workload, starts,
                    os.path.expanduser(disk.path) if disk and disk.path else None)


def _build_sim(settings: BackendSettings, runtime=None, hw_loop=None):
    """The sim backend on ``runtime`` (a new one when None); with ``hw_loop`` (a
    ``kvsim.tools.hwloop.HwLoop``: kvsim compare's), wrapped in the hw backend's own host
    costs."""
    from kvsim_backends.sim import SimBackend, SimRuntime

    rt = runtime if runtime is not None else SimRuntime()
    be = SimBackend(rt, settings)
    if hw_loop is not None:
        from kvsim_backends.sim.loopcosts import HwLoopSim

        return rt, HwLoopSim(be, hw_loop)
    return rt, be


def _build_hw(settings: BackendSettings, runtime=None, hw_loop=None):
    from kvsim_backends.hw import build_hw_backend

    if hw_loop is not None:
        raise TypeError("hw_loop: the sim side's model of the hw backend, not for the hw backend")
    return build_hw_backend(settings, runtime)


#: backend name -> build(settings, runtime=None, hw_loop=None) -> (runtime, backend)
BACKENDS: dict[str, Callable] = {"sim": _build_sim, "hw": _build_hw}


def build_backend(prep: Prepared, mgr: TierManager, backend: str,
                  options: dict | None = None, rank: int = 0,
                  runtime=None, node: int = 0) -> tuple[BackendSettings, Any, Any]:
    """(settings, runtime, backend) for a prepared run's ``rank`` on ``backend``: the
    settings built once from its config and ``options`` (``kvsim.run.seam.backend_settings``;
    besides, ``hw_loop``: compare's wrapper of the sim backend), then the registry's
    builder, on ``runtime`` (the node's, made by the first rank's build when None)."""
    options = dict(options or {})
    hw_loop = options.pop("hw_loop", None)
    settings = backend_settings(prep.cfg, prep.profile, mgr.page_bytes,
                                {t.level: t.max_slots for t in mgr.tiers}, options, prep.shape,
                                rank=rank, node=node)
    return (settings, *BACKENDS[backend](settings, runtime, hw_loop))


def sim_backend(settings: BackendSettings):
    """(runtime, sim backend) for ``settings`` outside a replay (calibrate's fit check;
    ``kvsim.run.seam.settings_for`` builds them)."""
    return _build_sim(settings)


def measure_hardware(device: str = "auto", plan=None, disk_dir: str | None = None,
                     profile: HardwareProfile | None = None, model: str | None = None,
                     works: dict | None = None, share_works: dict | None = None):
    """``kvsim calibrate``'s measurements of this machine on the hw backend, its backends
    built on ``profile`` (default: the default config's) for ``model``'s GEMMs (default:
    the config's): (``kvsim.tools.fit.Measured``, the plan measured); ``works``: a step's
    work of each kind, ``share_works`` of each kind two ranks run on one GPU; see
    ``kvsim_backends.hw.microbench``."""
    from kvsim_backends.hw.microbench import measure

    profile = profile or load_profile(RunConfig.model_fields["hardware"].default)
    return measure(partial(settings_for, profile=profile, model=model), device, plan, disk_dir,
                   works, share_works)


def replay(prep: Prepared, backend: str = "sim", progress: Callable[[float, float], None] | None = None,
           backend_options: dict | None = None,
           pinned_arrivals: dict[tuple[str, int], float] | None = None,
           on_resume: Callable[[int], None] | None = None) -> Result:
    """Replay the prepared run on ``backend``. ``pinned_arrivals`` ((session, turn) ->
    seconds): release those turns then, not a think time after their previous item
    (``Engine.pin_arrivals``). ``on_resume``: the engine's (told the GPU pages of each
    resumed request). The collector is tuned from start to end (``kvsim.run.replaygc``)."""
    with collector_for_replay():
        return _replay(prep, backend, progress, backend_options, pinned_arrivals, on_resume)


def _replay(prep: Prepared, backend: str, progress: Callable[[float, float], None] | None,
            backend_options: dict | None, pinned_arrivals: dict[tuple[str, int], float] | None,
            on_resume: Callable[[int], None] | None) -> Result:
    cfg = prep.cfg
    if backend not in BACKENDS:
        raise ConfigFileError(f"--backend: got {backend!r}; expected one of {', '.join(BACKENDS)}")
    n, per_node, spec = instances_of(cfg), cfg.node.ranks, prep.spec
    check_cluster(cfg, backend, sum(t.quota_bytes // spec.page_bytes for t in spec.tiers),
                  available_bytes())
    check_remote(cfg, backend, spec.page_bytes)
    check_shared(cfg, backend)
    at_run = routed(cfg)  # the router decides at each arrival (else: split by session hash)
    parts = [(prep.workload, prep.starts)] * n if at_run else split(prep.workload, prep.starts, n)
    ranks = []
    for r, (workload, starts) in enumerate(parts):
        policy = build_policy(cfg, workload, backend, starts)  # belady: sim only
        placement = build_placement(cfg, prep.shape, prep.profile, spec.page_bytes)
        tier_policies = build_tier_policies(cfg)
        check_tiers(cfg, [t.quota_bytes // spec.page_bytes for t in spec.tiers], policy,
                    tier_policies)
        ranks.append(RankRun(r, workload, starts, policy, placement, tier_policies,
                             TierManager(spec, policy, placement, tier_policies)))
    check_shared_policies(cfg, ranks)
    pools = share_pools(cfg, ranks)
    rt = None
    try:  # from here on the backends hold memory and files: close them on every exit
        for rk in ranks:
            rk.settings, rt, rk.backend = build_backend(prep, rk.mgr, backend, backend_options,
                                                        rank=rk.rank % per_node, runtime=rt,
                                                        node=rk.rank // per_node)
        model = ComputeModel(prep.shape, prep.profile)
        e = cfg.engine
        for rk in ranks:
            params = EngineParams(max_batch_tokens=e.max_batch_tokens, max_running=e.max_running,
                                  fast_forward=e.fast_forward, refcheck=e.refcheck,
                                  refcheck_disk_writes=e.refcheck_disk_writes,
                                  hold_sessions=e.hold_sessions, gpu_free_watermark=e.gpu_free_watermark,
                                  max_plan_failures=e.max_plan_failures,
                                  timeline_interval_s=cfg.output.timeline_interval,
                                  host_serve_slots=host_serve_slots(rk.settings, rk.backend),
                                  state_pages=state_pages(prep.shape, rk.mgr.page_bytes,
                                                          cfg.cache.tokens_per_block),
                                  state_recurrent=prep.shape.recurrent_state_bytes > 0,
                                  state_window=prep.shape.window if prep.shape.windowed else 0,
                                  **manager_cost_params(e.manager_cost))
            rk.engine = Engine(rt, rk.backend, rk.mgr, model, params, on_resume=on_resume)
            if pinned_arrivals is not None:
                rk.engine.pin_arrivals(pinned_arrivals)
            if not at_run:
                rk.engine.load(rk.workload, rk.starts)
        store = attach_remote(cfg, ranks, spec.page_bytes)
        shared = attach_shared(cfg, ranks, spec.page_bytes)
        cluster = None
        if at_run:
            cluster = Cluster(rt, [rk.engine for rk in ranks], [rk.mgr for rk in ranks],
                              build_router(cfg, n), prep.workload.block_tokens)
            cluster.load(prep.workload, prep.starts)
        if progress is not None:
            engines = [rk.engine for rk in ranks]
            for eng in engines:
                eng.on_progress = lambda t_ns: progress(t_ns / 1e9, sum(len(x.metrics.rows) for x in engines))
        freeze_built()  # (the instances, built: no collection walks them while they serve)
        wall0 = time.perf_counter()
        if cluster is not None:  # (first: a turn due at 0 is handed before serving starts)
            rt.process(cluster.dispatch())
        done = [rt.process(rk.engine.serve()) for rk in ranks]
        rt.run(until=done[0] if n == 1 else rt.all_of(done))
        # a host fill that failed: the slots it made
        fill_limit = ranks[0].backend.slot_limit(Level.HOST)
    finally:
        for rk in ranks:
            if rk.backend is not None:
                rk.backend.close()
    wall = time.perf_counter() - wall0
    traffic = sum_counts([rk.backend.stats() for rk in ranks])
    mgr = ranks[0].mgr
    levels = {int(t.level): t.level.name.lower() for t in mgr.tiers}
    counters = []
    for rk in ranks:
        c = rk.mgr.counters.snapshot()
        if rk.mgr.copies_on:
            c["retained_slots"] = rk.mgr.retained_slots()
        counters.append(c)
    node = merge([rk.engine.metrics for rk in ranks], n)
    end = max(rk.engine.t for rk in ranks)
    metrics = node.summary(sum_counts(counters), traffic, end, wall, levels)
    metrics["page_bytes"] = mgr.page_bytes
    metrics["balance"] = tier_balance([(rk.mgr, rk.engine.metrics.timeline) for rk in ranks],
                                      mgr.page_bytes)
    metrics["tiers_slots"] = {t.level.name.lower(): t.capacity for t in mgr.tiers}
    if any(t.fill is not None for t in cfg.cache.tiers):
        done = [rk.backend.stats().get("host_fill_done_s") for rk in ranks]
        metrics["host_fill"] = host_fill_metrics(
            cfg, node, fill_limit, max(done) if all(d is not None and d >= 0 for d in done) else None)
    if "driver_wait_s" in traffic:  # executor calls' waits for the driver's lock
        metrics["driver"] = {"executor_wait_s": traffic["driver_wait_s"],
                             "executor_waits": traffic["driver_waits"]}
    if "page_cache_written_back" in traffic:  # a buffered disk tier: the node's page cache
        metrics["page_cache"] = {k[len("page_cache_"):]: v for k, v in ranks[0].backend.stats().items()
                                 if k.startswith("page_cache_")}
    if n > 1:
        each = [rk.engine.metrics.summary(c, rk.backend.stats(), rk.engine.t, wall, levels)
                for rk, c in zip(ranks, counters)]
        if is_cluster(cfg):  # per instance, and the cluster's own figures
            metrics.update(cluster_metrics(cfg, node, each, cluster))
        else:
            metrics["ranks"] = each
    remote_metrics(metrics, store, traffic)
    shared_metrics(metrics, shared, pools)
    info = getattr(ranks[0].backend, "info", {})
    run_info = {"backend": backend, "device": info.get("device", "simulated"),
                "time_scale": info.get("time_scale"), "kvsim_version": kvsim_version(),
                "git_commit": git_commit(), "policy": cfg.cache.policy.eviction,
                "policy_is_bound": bool(ranks[0].policy.is_bound), "ranks": n,
                "model": prep.shape.derived(cfg.cache.tokens_per_block),
                **({"cluster": True, "instances": n} if is_cluster(cfg) else {}),
                **describe(cfg, ranks[0].placement, ranks[0].tier_policies)}
    if "standin" in info:  # the hw compute stand-in's calibration (what a step's GEMMs took)
        run_info["standin"] = info["standin"]
    return Result(cfg, backend, metrics, node.rows, node.timeline, sum_counts(counters),
                  prep.profile, run_info)


FIRST_REQUESTS = 10  # host_fill.ttft_first_*: the TTFT of this many first arrivals


def host_serve_slots(settings: BackendSettings, be) -> int:
    """Host slots that must exist before serving starts: none without a fill, the first
    unit (progressive), the whole tier (before_serve), in the units the backend fills
    (``Backend.fill_layout``; ``kvsim.core.datapath.fill``)."""
    layout = be.fill_layout(Level.HOST)
    return 0 if layout is None else layout.first_serve(settings.host_fill.mode)


def host_fill_metrics(cfg: RunConfig, m, limit: int | None = None,
                      done_s: float | None = None) -> dict:
    """What a host fill did to the start of a replay: when serving started, when the
    first token came, the TTFT of the first requests to arrive (mean and worst), and,
    where the fill failed, the host slots it made usable (``usable_slots``; else None).
    ``done_s``: when the (last rank's) fill was complete, where the backend says: then
    also that time and the TTFT of the turns that arrived before it (``ttft_during_s``)."""
    fill = host_fill(cfg)
    firsts = [r.first_token_ns for r in m.rows if r.first_token_ns >= 0]
    early = sorted(m.rows, key=lambda r: (r.arrival_ns, r.rid))[:FIRST_REQUESTS]
    ttft = [r.ttft_s for r in early if r.first_token_ns >= 0]
    out = {"mode": fill.mode, "backing": fill.backing, "serve_start_s": m.serve_start_ns / 1e9,
           "first_token_s": min(firsts) / 1e9 if firsts else None,
           "ttft_first_mean_s": sum(ttft) / len(ttft) if ttft else None,
           "ttft_first_max_s": max(ttft) if ttft else None, "usable_slots": limit}
    if done_s is not None:
        during = [r.ttft_s for r in m.rows if r.first_token_ns >= 0 and r.arrival_ns < done_s * 1e9]
        out.update(done_s=done_s, ttft_during_s=dist(during))
    return out
