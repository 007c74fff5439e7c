"""The run configuration's models: a validated, immutable ``RunConfig``.

Sizes and times accept units ('160GiB', '10ms'); unknown keys, wrong types and impossible
sizes are errors that name the file and the key path (``cache.tiers[1].quota``).
Loading YAML and ``--set`` overrides, and the errors that name their source, are
``kvsim.config.loading``'s. Nothing here touches a trace, a result or a disk tier's bytes;
building the run does (kvsim.run).

The ``workload`` section's models are in ``kvsim.config.workload``; the strict base model
and the size and duration field types every section uses, in ``kvsim.config.strict``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BeforeValidator, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError

from kvsim.config.remote import RemoteConfig
from kvsim.config.strict import PositiveSeconds, Seconds, Size
from kvsim.config.strict import Strict as _Strict
from kvsim.config.node import ClusterConfig, NodeConfig, RouterConfig
from kvsim.config.workload import WorkloadConfig
from kvsim.core.datapath.diskio import WRITE_SHARE
from kvsim.core.datapath.fill import UNIT_BYTES
from kvsim.core.datapath.work import READ_KERNEL_S
from kvsim.core.policy import BOUND_NAMES, PLACEMENT_NAMES, POLICIES, POLICY_NAMES, knobs_of


class ConfigFileError(ValueError):
    """A configuration file or override is wrong; the message says where and what."""


class FillConfig(_Strict):
    """How the host tier comes to exist (``kvsim.core.datapath.fill``; docs/config.md).
    ``mode``: ``none`` (at once before the run: not modelled by the sim, committed whole
    by the hw backend while it is built), ``progressive`` (unit by unit from the run's
    start; serving starts with the first unit), ``before_serve`` (unit by unit; serving
    starts with the last). ``backing``: ``register`` (fault in + cudaHostRegister) or
    ``pinned`` (one cudaHostAlloc of the range) or ``cumem`` (cuMemCreate unit by unit). ``huge_pages`` (register only) and
    ``numa`` (``auto``: the GPU's node where there are several; ``off``; a node) are the
    hw backend's; ``unit``: the commit unit (whole slots of it)."""

    mode: Literal["none", "progressive", "before_serve"] = "none"
    backing: Literal["register", "pinned", "cumem"] = "register"
    huge_pages: bool = False
    numa: Union[Literal["auto", "off"], Annotated[int, Field(ge=0)]] = "auto"
    unit: Size = UNIT_BYTES
    # register only: register each unit in calls of at most this many bytes (whole slots),
    # the node's fills taking turns call by call, so that any rank's driver call waits for
    # one short registration at most (None: a unit in one call)
    register_chunk: Optional[Size] = None


MAX_IO_WORKERS = 256


def _builtin_or_class(v: str, names: tuple[str, ...], what: str) -> str:
    """``v`` if it names a built-in policy or has the shape module:Class, else an error."""
    if v in names or (":" in v and all(v.partition(":")[::2])):
        return v
    raise ValueError(f"unknown {what} policy {v!r}; expected one of "
                     f"{', '.join(names)}, or module:Class for your own")


class TierConfig(_Strict):
    level: Literal["gpu", "host", "disk"]
    quota: Size
    max_quota: Optional[Size] = None   # reserved address range (host fill); default: quota
    path: Optional[str] = None         # disk tier: directory for the tier's file (hw backend)
    fill: Optional[FillConfig] = None  # host tier: how it comes to exist; default: at once
    # disk tier: N > 0 prioritised disk I/O workers in both backends (kvsim.core.datapath.diskio);
    # 0: off, the profile's nvme.queue_depth pieces in flight, no priorities
    io_workers: Annotated[int, Field(ge=0, le=MAX_IO_WORKERS, strict=True)] = 0
    # disk tier, with io_workers N > 0: while a restore is queued or running, writes hold
    # at most this share of the N workers (at least one; 1.0: no cap)
    io_write_share: Annotated[float, Field(ge=0.0, le=1.0)] = WRITE_SHARE
    # disk tier: how transfers reach the device (unset: pool with io_workers > 0, else the
    # device's queue_depth pieces in flight round robin). serial: the seed's pre-pool
    # baseline, one transfer at a time in arrival order (reads behind writes), each a
    # blocking loop on one host thread (io_workers 0, no write_through); pool: io_workers
    io_mode: Optional[Literal["serial", "pool"]] = None
    # disk tier: retained copies (kvsim.core.retained). keep_copy: a restore keeps a full
    # page's disk copy, and its next eviction to disk takes it back with no write;
    # write_through: a page evicted GPU -> host is also copied to disk in the background
    # (needs a host tier), at most write_through_inflight bytes in flight;
    # protected_copy_fraction: the share of the disk copies may hold ahead of disk-only pages
    keep_copy: bool = False
    write_through: bool = False
    write_through_inflight: Size = 1 << 30
    protected_copy_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    # disk tier, with write_through: a host page whose write-through is still running is
    # pinned on host (pin: no eviction candidate), or may be evicted, the eviction taking
    # the pending copy back and waiting for its write, promoted to the required writes
    # (take_back: seed 004's rule)
    write_through_pending: Literal["pin", "take_back"] = "pin"
    # disk tier: direct (O_DIRECT: a write completes when the drive has it) or buffered (the
    # file opened without O_DIRECT: writes complete into the page cache until the profile's
    # page_cache.dirty_limit, reads of pages it still holds come from memory)
    writes: Literal["direct", "buffered"] = "direct"
    # this tier's own eviction order (a built-in name or module:Class), instead of
    # cache.policy.eviction's; not belady (a bound over the whole cache)
    eviction: Optional[str] = None

    @field_validator("eviction")
    @classmethod
    def _known_eviction(cls, v: Optional[str]) -> Optional[str]:
        if v in BOUND_NAMES:
            raise ValueError(f"{v} is an offline bound over the whole cache: set it as "
                             "cache.policy.eviction, not for one tier")
        return v if v is None else _builtin_or_class(
            v, tuple(n for n in POLICY_NAMES if n not in BOUND_NAMES), "eviction")

    @model_validator(mode="after")
    def _check(self) -> "TierConfig":
        if self.max_quota is not None and self.max_quota < self.quota:
            raise ValueError(f"max_quota ({self.max_quota}) is below quota ({self.quota})")
        if self.fill is not None and self.level != "host":
            raise ValueError("fill is only for the host tier")
        if self.io_workers and self.level != "disk":
            raise ValueError("io_workers is only for the disk tier")
        if self.io_mode is not None and self.level != "disk":
            raise ValueError("io_mode is only for the disk tier")
        if self.io_mode == "pool" and not self.io_workers:
            raise ValueError("io_mode pool needs io_workers > 0 (the pool's threads)")
        if self.io_mode == "serial" and self.io_workers:
            raise ValueError(f"io_mode serial runs one transfer at a time on one host thread: "
                             f"io_workers must be 0 (got {self.io_workers}); io_mode pool uses them")
        if self.level == "disk" and not self.io_workers \
                and self.io_write_share != type(self).model_fields["io_write_share"].default:
            raise ValueError("io_write_share needs io_workers > 0 (it caps the disk I/O "
                             "workers' writes while restores run)")
        if self.level != "disk":  # (a resolved config dumps the defaults: compare to them)
            for k in ("keep_copy", "write_through", "write_through_inflight",
                      "protected_copy_fraction", "io_write_share", "write_through_pending",
                      "writes"):
                if getattr(self, k) != type(self).model_fields[k].default:
                    raise ValueError(f"{k} is only for the disk tier")
        if self.path is not None:
            if self.level != "disk":
                raise ValueError("path is only for the disk tier")
            p = Path(os.path.expanduser(self.path))
            try:
                if p.exists() and not p.is_dir():
                    raise ValueError(f"path {self.path!r} exists and is not a directory")
            except OSError as e:  # a name too long, a parent that cannot be read
                raise ValueError(f"path {self.path!r}: {e.strerror}; expected a directory") from None
        if self.write_through_pending != "pin" and not self.write_through:
            raise ValueError("write_through_pending needs write_through: true (it says what "
                             "an eviction does with a page whose write-through is running)")
        return self


def knob_problem(kind: str, value: Any) -> str | None:
    """What is wrong with a policy knob's ``value`` of ``kind`` (``kvsim.core.policy.
    knobs_of``), or None."""
    if kind == "ratio":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
            return f"expected a ratio in (0, 1), got {value!r}"
    elif kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"expected an integer >= 1, got {value!r}"
    return None


class PolicyConfig(_Strict):
    """The eviction order within a tier, and the placement (where a victim goes, which
    restored pages keep their disk copy): each a built-in name or ``module:Class``; and
    ``knobs``, the eviction policy's parameters (a built-in's ``KNOBS``; for
    ``module:Class``, keyword arguments of its constructor, checked when it is built)."""
    eviction: str = "lru"
    placement: str = "cascade"
    knobs: dict[str, Union[int, float]] = {}

    @field_validator("eviction")
    @classmethod
    def _known(cls, v: str) -> str:
        return _builtin_or_class(v, POLICY_NAMES, "eviction")

    @field_validator("knobs")
    @classmethod
    def _known_knobs(cls, v: dict, info: ValidationInfo) -> dict:
        name = info.data.get("eviction")
        if name not in POLICY_NAMES:
            return v  # (module:Class: its constructor checks them; or no valid name)
        known = knobs_of(dict(POLICIES)[name])
        errs = []
        for k, x in v.items():
            if k not in known:
                msg = (f"{name} takes no knob {k!r}; its knobs: "
                       f"{', '.join(known) if known else 'none'}")
            else:
                msg = knob_problem(known[k], x) or ""
            if msg:
                errs.append(InitErrorDetails(type=PydanticCustomError("knob", msg), loc=(k,),
                                             input=x))
        if errs:
            raise ValidationError.from_exception_data("knobs", errs)
        return v

    @field_validator("placement")
    @classmethod
    def _known_placement(cls, v: str) -> str:
        return _builtin_or_class(v, PLACEMENT_NAMES, "placement")


class CacheConfig(_Strict):
    tokens_per_block: Annotated[int, Field(gt=0)] = 32
    page_bytes: Optional[Size] = None   # default: the model's KV bytes per token x block
    tiers: list[TierConfig]
    policy: PolicyConfig = PolicyConfig()
    remote: Optional[RemoteConfig] = None  # a cluster-wide remote store (kvsim.config.remote)

    @property
    def disk_io_workers(self) -> int:
        """The disk tier's ``io_workers`` (0: off, or no disk tier)."""
        return next((t.io_workers for t in self.tiers if t.level == "disk"), 0)

    @property
    def disk_io_write_share(self) -> float:
        """The disk tier's ``io_write_share`` (its default without a disk tier)."""
        return next((t.io_write_share for t in self.tiers if t.level == "disk"), WRITE_SHARE)

    @model_validator(mode="after")
    def _order(self) -> "CacheConfig":
        order = {"gpu": 0, "host": 1, "disk": 2}
        levels = [t.level for t in self.tiers]
        if not levels or levels[0] != "gpu" or any(order[b] <= order[a] for a, b in zip(levels, levels[1:])):
            raise ValueError(f"tiers must be ordered gpu -> host -> disk (host and disk "
                             f"optional), got {' -> '.join(levels) or 'none'}")
        if self.policy.eviction in BOUND_NAMES and any(t.eviction for t in self.tiers):
            i = next(i for i, t in enumerate(self.tiers) if t.eviction)
            raise ValueError(f"tiers[{i}].eviction: {self.policy.eviction} (cache.policy.eviction) "
                             f"orders every tier; a tier's own eviction policy cannot be mixed with it")
        for i, t in enumerate(self.tiers):
            if t.write_through and "host" not in levels:
                raise ValueError(f"tiers[{i}].write_through needs a host tier above the disk "
                                 f"tier (write-through copies pages evicted GPU -> host)")
            if t.write_through and t.io_workers == 0:
                raise ValueError(f"tiers[{i}].write_through needs tiers[{i}].io_workers > 0 "
                                 f"(its writes are the disk I/O workers' background class)")
        return self

    @property
    def disk_tier(self) -> "TierConfig | None":
        return next((t for t in self.tiers if t.level == "disk"), None)


CopyPathName = Literal["auto", "copy_engine", "sm_kernel"]


def _both_directions(v: Any) -> Any:
    """``copy_path: sm_kernel`` (one name) sets both directions."""
    return {"h2d": v, "d2h": v} if isinstance(v, str) else v


def _cta_setting(v: Any) -> Any:
    def count(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x > 0
    if v == "auto" or count(v):
        return v
    if isinstance(v, dict) and set(v) == {"h2d", "d2h"} and all(count(x) for x in v.values()):
        return {"h2d": v["h2d"], "d2h": v["d2h"]}
    raise ValueError("expected 'auto', a positive number of CTAs, or one a direction "
                     "({h2d: N, d2h: N})")


class CopyPathConfig(_Strict):
    """The GPU <-> host copy path of each direction: ``auto`` (kvsim.core.datapath.copypath's rule
    on the hardware profile), or forced (``copy_engine``, ``sm_kernel``). Both backends."""

    h2d: CopyPathName = "auto"
    d2h: CopyPathName = "auto"


class ManagerCostConfig(_Strict):
    """The manager's own bookkeeping time, charged to the executor (seed 003): each plan
    costs ``per_plan`` + ``per_page`` a new GPU page it allocates + ``per_moved_page`` a
    page it moves, plus its statistics: ``stats: page`` commits them once a moved page
    ((``stats_per_page`` + ``stats_per_commit``) a page), ``batch`` once a batch
    (``stats_per_page`` a page + ``stats_per_commit`` a batch), ``off`` not at all. The
    next step starts that much later: a resize blocks serving for its time. All 0: free."""

    per_plan: Seconds = 0.0
    per_page: Seconds = 0.0
    per_moved_page: Seconds = 0.0
    stats: Literal["off", "page", "batch"] = "off"
    stats_per_page: Seconds = 0.0
    stats_per_commit: Seconds = 0.0


class EngineConfig(_Strict):
    max_batch_tokens: Annotated[int, Field(gt=0)] = 8192
    max_running: Annotated[int, Field(gt=0)] = 256
    fast_forward: bool = True
    refcheck: bool = True
    refcheck_disk_writes: bool = True
    hold_sessions: bool = True
    gpu_free_watermark: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    max_plan_failures: Annotated[int, Field(gt=0)] = 3
    copy_path: Annotated[CopyPathConfig, BeforeValidator(_both_directions)] = CopyPathConfig()
    # on a coherent (c2c) link, opt in to the SM copy kernel where the rule would take the
    # copy engine (the seed's opt-in); no effect on PCIe (kvsim.core.datapath.copypath, rule 3)
    kernel_on_coherent_link: bool = False
    # the SM copy kernel's CTAs a direction: auto (Little's law on the profile) or a count
    sm_ctas: Annotated[Union[Literal["auto"], int, dict[str, int]], BeforeValidator(_cta_setting)] = "auto"
    # kernels a step launches a layer (seed 000: the SM copy kernel's lasting idle gap is
    # paid once a kernel, the profile's sm.interference.lasting_gap_per_kernel)
    kernels_per_layer: Annotated[int, Field(gt=0)] = 8
    # one kernel of a step's HBM reads: the hw stand-in runs them as kernels this long,
    # and ranks on one GPU take turns on its SMs kernel by kernel (the sim shares them by
    # kernel length: kvsim_backends.sim.smshare); how the engine cuts work, not hardware
    read_kernel: PositiveSeconds = READ_KERNEL_S
    # the manager's bookkeeping time a plan, charged to the executor (seed 003)
    manager_cost: ManagerCostConfig = ManagerCostConfig()


class OutputConfig(_Strict):
    dir: str = "results/{name}"
    timeline_interval: PositiveSeconds = 1.0
    plots: bool = True


def host_fill(cfg: "RunConfig") -> FillConfig:
    """The host tier's fill settings (the default ``mode: none`` where it has none or there
    is no host tier)."""
    for t in cfg.cache.tiers:
        if t.level == "host" and t.fill is not None:
            return t.fill
    return FillConfig()


class RunConfig(_Strict):
    name: str = "run"
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    model: str = "llama-3-70b"          # preset under configs/models, a YAML, config.json or its folder
    tp: Optional[Annotated[int, Field(gt=0)]] = None   # overrides the model's tp
    # the KV cache's precision (bf16, fp16, fp8, fp4); None: the model file's (docs/models.md)
    kv_dtype: Optional[Literal["bf16", "fp16", "fp8", "fp4"]] = None
    hardware: str = "h200-pcie"         # preset under configs/hardware or a YAML path
    cache: CacheConfig
    engine: EngineConfig = EngineConfig()
    workload: WorkloadConfig = WorkloadConfig()
    output: OutputConfig = OutputConfig()
    node: NodeConfig = NodeConfig()
    router: RouterConfig = RouterConfig()
    cluster: ClusterConfig = ClusterConfig()
