"""The run's side of the seam: ``BackendSettings`` (``kvsim.settings``) built once from a
validated config, and the run options a caller adds (the hw backend's device and time
scale, probes).

``backend_settings`` is the one place a config setting becomes a backend setting: a
key keeps its name (``io_workers``, ``io_write_share``, ``backing``...), strings become
the core's enums, and nothing is checked or defaulted again (the config model did both).
``settings_for`` builds settings for tests, benchmarks and calibrate from a few values,
through the same config model, so its defaults and checks are the config's.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping

from kvsim.config import ConfigFileError, RunConfig, host_fill, validate_config
from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.config.hfmodel import load_model
from kvsim.config.modelshape import ModelShape
from kvsim.core.datapath.copypath import AUTO, CopyPath, force_per_direction
from kvsim.core.datapath.fill import Backing, FillMode
from kvsim.core.spec import Level
from kvsim.settings import (BackendSettings, CopySettings, DiskSettings, HostFillSettings,
                            HwSettings, ModelSettings, NetworkSettings, Probes)

#: run options a caller may pass (``replay(backend_options=...)``) besides ``hw_loop``
#: (the backend registry's: kvsim compare's wrapper of the sim backend)
HW_OPTIONS = {f.name for f in fields(HwSettings)}
PROBE_OPTIONS = {f.name for f in fields(Probes)}
DISK_OPTIONS = {"disk_dir": "dir", "disk_preallocate": "preallocate", "direct_io": "direct_io"}
LEVEL_NAMES = {Level.GPU: "gpu", Level.HOST: "host", Level.DISK: "disk"}


def tier_keys(cfg: RunConfig) -> dict[Level, str]:
    """The config key that sizes each tier: ``cache.tiers[i].quota``, or ``.max_quota``
    where the config reserves more than the quota."""
    levels = {v: k for k, v in LEVEL_NAMES.items()}
    return {levels[t.level]: f"cache.tiers[{i}].{'max_quota' if t.max_quota is not None else 'quota'}"
            for i, t in enumerate(cfg.cache.tiers)}


def check_profile_fit(cfg: RunConfig, profile: HardwareProfile) -> None:
    """What the config model cannot check alone, against the hardware profile: the SM
    kernel's CTAs within the profile's copy CTA slots; a buffered disk tier's page cache."""
    ctas, cta_slots = cfg.engine.sm_ctas, profile.sm.copy_cta_slots
    if ctas != AUTO and max(ctas.values() if isinstance(ctas, dict) else [ctas]) > cta_slots:
        raise ConfigFileError(f"engine.sm_ctas: got {ctas}; the hardware profile {profile.name} "
                              f"has {cta_slots} copy CTA slots (sm.copy_cta_slots)")
    for i, t in enumerate(cfg.cache.tiers):
        if t.writes == "buffered" and profile.page_cache is None:
            raise ConfigFileError(f"cache.tiers[{i}].writes: buffered needs the hardware profile's "
                                  f"page_cache section (its dirty limit and copy rate); "
                                  f"{profile.name} has none")


def backend_settings(cfg: RunConfig, profile: HardwareProfile, page_bytes: int,
                     slots: Mapping[Level, int], options: Mapping[str, Any] | None = None,
                     shape: ModelShape | None = None, rank: int = 0,
                     node: int = 0) -> BackendSettings:
    """The settings both backends are built from, for ``cfg`` on ``profile`` with tiers of
    ``slots`` slots of ``page_bytes``. ``options``: the run's own (``HwSettings``' and
    ``Probes``' fields, ``disk_dir``, ``disk_preallocate``, ``direct_io``); an unknown
    one is a TypeError (a caller's mistake, not a user's). ``shape``: the config's model
    (None: loaded from ``cfg.model`` and ``cfg.tp``)."""
    options = dict(options or {})
    unknown = set(options) - HW_OPTIONS - PROBE_OPTIONS - set(DISK_OPTIONS)
    if unknown:
        raise TypeError(f"unknown backend option(s): {', '.join(sorted(unknown))}")
    hw = HwSettings(**{k: options[k] for k in HW_OPTIONS if k in options})
    if not isinstance(hw.time_scale, (int, float)) or isinstance(hw.time_scale, bool) \
            or not hw.time_scale > 0:
        raise ConfigFileError(f"--time-scale: got {hw.time_scale!r}; expected simulated "
                              f"seconds per wall second > 0")
    if hw.device not in ("auto", "cpu", "gpu"):
        raise ConfigFileError(f"--device: got {hw.device!r}; expected auto, cpu or gpu")
    if shape is None:
        try:
            shape = load_model(cfg.model, tp=cfg.tp, kv_dtype=cfg.kv_dtype)
        except (ValueError, OSError) as err:
            raise ConfigFileError(str(err)) from None
    e, disk, fill = cfg.engine, cfg.cache.disk_tier, host_fill(cfg)
    d = None
    if disk is not None:
        where = {DISK_OPTIONS[k]: v for k, v in options.items() if k in DISK_OPTIONS and v is not None}
        d = DiskSettings(io_workers=disk.io_workers, io_write_share=disk.io_write_share,
                         io_mode=disk.io_mode or ("pool" if disk.io_workers else "queue"),
                         writes=disk.writes,
                         **{"dir": disk.path, **where})
    return BackendSettings(
        page_bytes=int(page_bytes), slots={Level(k): int(v) for k, v in slots.items()},
        profile=profile, refcheck=e.refcheck,
        copy=CopySettings(force=force_per_direction(e.copy_path.model_dump()),
                          sm_ctas=None if e.sm_ctas == AUTO else e.sm_ctas,
                          kernel_on_coherent_link=e.kernel_on_coherent_link),
        disk=d,
        host_fill=HostFillSettings(mode=FillMode(fill.mode), backing=Backing(fill.backing),
                                   unit_bytes=fill.unit, huge_pages=fill.huge_pages, numa=fill.numa,
                                   register_chunk=fill.register_chunk),
        model=ModelSettings.capped(shape.projections_per_gpu()),
        hw=hw, probes=Probes(**{k: options[k] for k in PROBE_OPTIONS if k in options}),
        tier_keys=tier_keys(cfg), rank=rank, ranks=cfg.node.ranks, node=node,
        kernels_per_step=shape.layers * e.kernels_per_layer, network=network_settings(cfg),
        tp=shape.tp, gpus=cfg.node.gpus or 0, host_shared=cfg.node.host == "shared",
        ranks_per_gpu=cfg.node.ranks_per_gpu, read_kernel_s=e.read_kernel)


def network_settings(cfg: RunConfig) -> NetworkSettings | None:
    """The remote tier's network (``cache.remote.network``), or None without one."""
    r = cfg.cache.remote
    if r is None:
        return None
    return NetworkSettings(bandwidth=r.network.bandwidth, latency=r.network.latency,
                           gpudirect=r.gpudirect, nodes=cfg.cluster.nodes)


def settings_for(page_bytes: int, slots: Mapping[Level, int],
                 profile: HardwareProfile | str | None = None, *, copy_path: Any = None,
                 sm_ctas: Any = None, kernel_on_coherent_link: bool | None = None,
                 refcheck: bool | None = None, io_workers: int | None = None,
                 io_write_share: float | None = None, host_fill: Mapping | None = None,
                 io_mode: str | None = None, writes: str | None = None,
                 model: str | None = None, **options: Any) -> BackendSettings:
    """Settings for ``slots`` (level -> slots) of ``page_bytes`` outside a replay (tests,
    benchmarks, calibrate): the config keys given here (``engine.copy_path``,
    ``engine.sm_ctas``, ``engine.kernel_on_coherent_link``, ``engine.refcheck``, the disk
    tier's ``io_workers``, ``io_write_share``, ``io_mode`` and ``writes``, the host tier's ``fill``) validated by
    the config model, the rest its defaults; ``profile``: a profile or a preset name
    (default: the config's); ``model``: a model preset or path (default: the config's);
    ``options``: ``backend_settings``'."""
    tiers = []
    for lv in (Level.GPU, Level.HOST, Level.DISK):  # (the config's: a GPU tier first)
        if lv not in slots and lv != Level.GPU:
            continue
        t: dict[str, Any] = {"level": LEVEL_NAMES[lv], "quota": max(1, int(slots.get(lv, 1))) * int(page_bytes)}
        if lv == Level.DISK:
            t.update({k: v for k, v in (("io_workers", io_workers), ("io_write_share", io_write_share),
                                        ("io_mode", io_mode), ("writes", writes)) if v is not None})
        if lv == Level.HOST and host_fill is not None:
            t["fill"] = dict(host_fill)
        tiers.append(t)
    if isinstance(copy_path, CopyPath):
        copy_path = copy_path.value
    elif isinstance(copy_path, Mapping):
        copy_path = {d: v.value if isinstance(v, CopyPath) else v for d, v in copy_path.items()}
    engine = {k: v for k, v in (("copy_path", copy_path), ("sm_ctas", sm_ctas),
                                ("kernel_on_coherent_link", kernel_on_coherent_link),
                                ("refcheck", refcheck)) if v is not None}
    data: dict[str, Any] = {"cache": {"page_bytes": int(page_bytes), "tiers": tiers}, "engine": engine}
    if isinstance(profile, str):
        data["hardware"] = profile
    if model is not None:
        data["model"] = model
    cfg = validate_config(data, source="settings_for")
    if not isinstance(profile, HardwareProfile):
        profile = load_profile(cfg.hardware)
    check_profile_fit(cfg, profile)
    return backend_settings(cfg, profile, page_bytes, slots, options)
