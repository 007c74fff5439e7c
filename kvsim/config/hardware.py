"""Hardware profiles: every constant the sim backend and the compute model use, from YAML.

A ``HardwareProfile`` is a frozen pydantic model (unknown keys are refused). Sizes, times and
rates accept unit strings (``'4MiB'``, ``'2.5us'``, ``'55.5GB/s'``) through ``kvsim.config.units``;
inside the model they are plain bytes, seconds and bytes per second. ``load_profile`` takes
a path or a name (``'h200-pcie'`` -> ``configs/hardware/h200-pcie.yaml`` of the repository)
and raises ``ProfileError`` naming the file and the key path of every bad value. The hw
backend's own software costs are ``kvsim.tools.hwloop``'s (older keys ``loop``,
``refcheck`` are refused, named).

Optional terms (absent: the older, simpler model):
- ``copy_engine.per_page_h2d`` / ``per_page_d2h``: the batched call's host time per page in
  one direction, a time or a table ``{page size: time}`` (log-linear in the page size
  between its points, flat beyond its ends); default ``per_page``;
- ``sm.h2d`` / ``sm.d2h`` / ``sm.both``: the SM copy kernel's own ceilings (zero-copy
  reads and writes of host memory), per direction and for both directions at once;
  default the link's. They bound SM-kernel flows only.
- ``transfer.latency`` / ``transfer.latency_sm_kernel``: a fixed time every transfer
  takes on top of its data path: the backend's own cost, outside the copy engine's
  ``per_call`` (the DMA call's host time) and the SM kernel's ``launch``. On the hw backend
  that is the Python ``transfer()`` call and the runtime seeing it; the sim adds it after
  the bytes (holding nothing). ``latency_sm_kernel``: SM-kernel batches' own (default
  ``latency``). Default 0. ``kvsim calibrate`` fits both from batches of 1-16 pages.
- ``compute.latency`` / ``compute.scale``: a compute call of ``d`` nominal seconds takes
  ``d x scale`` of work on the SMs, then ``latency`` more (the launch, its completion
  event and the runtime seeing it; after the compute, SMs free). Default 0 and 1.
  ``kvsim calibrate`` fits both from its timed ``compute()`` calls (least squares).
- ``link.mixed`` / ``mixed_ce_h2d``: the link's total with one direction on each copy
  path, the copy engine GPU -> host / host -> GPU, a rate or a table by page size (H200:
  the SM kernel's stores wait for the engine's reads, 44-65 GB/s at 64 KiB-1 MiB pages
  that way, 58-70 the other). Default ``link.both``.
- ``driver``: the CUDA driver's node-wide lock (``DriverSpec``): what a host fill holds it
  for, per backing, and an executor's call. Default None: it costs and holds nothing.
- ``nvme.rewrite``: the disk's write rate into file space written before (the sim then
  tracks which disk slots were written). Default None: every write at ``nvme.write``.
- ``host.memory_bandwidth``: the node's host DRAM bandwidth that device transfers draw on
  (``HostSpec``); ``pcie``: PCIe switches, each shared by ``gpus_per_switch`` GPUs behind
  one uplink (``PcieSpec``); shared by a node's ranks (``kvsim_backends.sim.nodebus``).
  Default None: neither limits anything.
- ``gpu.gemm_flops``: FLOP/s of the model's layer projection GEMMs by M (``{rows:
  FLOP/s}``), as the GPU runs them; read by ranks sharing a GPU (turns on its SMs by
  kernel length: ``kvsim_backends.sim.smshare``) and by the interference model (the
  share of a GEMM's time its bytes take: ``interference.hbm_exposure``). Default None:
  the compute model's rate.
- ``gpu.kernel_overlap``: how long two ranks' consecutive kernels on one GPU run at once;
  another rank's kernel delays this one's by its length less this. Default 0.

Invariants: positive rates, counts and sizes; the both-directions link total is at least
the larger single direction, and so is the SM kernel's; at least 2 SMs for copy CTAs;
efficiencies in (0, 1].
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from kvsim.config.boostspec import BoostSpec
from kvsim.config.pagecachespec import PageCacheSpec
from kvsim.config.paths import CONFIGS
from kvsim.config.yamlfile import read_strict
from kvsim.config.interferencespec import InterferenceSpec, KindTerms
from kvsim.core.datapath.interference import Structure
from kvsim.config.units import (PageCost, PageRate, PageRateRequired, page_cost_at, parse_rate,
                                parse_size, parse_time)

CONFIG_DIR = CONFIGS  # configs/ of the checkout, or the installed copy (kvsim.config.paths)

Bytes = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(parse_time), Field(ge=0)]
PosSeconds = Annotated[float, BeforeValidator(parse_time), Field(gt=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
MOVED_KEYS = ("loop", "refcheck")  # older profiles' software terms: kvsim.tools.hwloop has them


class ProfileError(ValueError):
    """A profile file is missing or has a bad value; the message names file and key path."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkSpec(_Frozen):
    """The GPU <-> host link. Bandwidths are what a large copy achieves, per direction."""

    kind: Literal["pcie", "c2c"]
    h2d: Rate
    d2h: Rate
    both: Rate  # total of both directions at once
    mixed: PageRate = None  # (one direction on each copy path: the module docstring)
    mixed_ce_h2d: PageRate = None

    def mixed_for(self, ce_dir: str, page_bytes: int) -> float:
        """The pair's total with the copy engine in ``ce_dir`` at pages of ``page_bytes``."""
        r = self.mixed_ce_h2d if ce_dir == "h2d" and self.mixed_ce_h2d is not None else self.mixed
        return self.both if r is None else page_cost_at(r, page_bytes)

    @model_validator(mode="after")
    def _both_covers_one(self) -> "LinkSpec":
        if self.both < max(self.h2d, self.d2h):
            raise ValueError(f"both ({self.both:g} B/s) must be at least the faster direction "
                             f"({max(self.h2d, self.d2h):g} B/s)")
        return self


class CopyEngineSpec(_Frozen):
    """Async copy engines; one batched call costs per_call + pages * per_page of host time,
    then its bytes move. ``per_page_h2d`` and ``per_page_d2h`` (a time or a table by page
    size) override ``per_page`` per direction. ``call_threads``: host threads making the
    calls (the hw backend makes every CUDA call on one), so calls' host times take turns;
    None: every call's host time runs at once (the older model). ``busy_per_page_h2d`` /
    ``_d2h`` (likewise; default 0): a page's more under compute, before its bytes move."""

    count: Annotated[int, Field(gt=0)]
    per_call: Seconds
    per_page: Seconds
    per_page_h2d: PageCost = None
    per_page_d2h: PageCost = None
    call_threads: Annotated[int, Field(gt=0)] | None = None
    busy_per_page_h2d: PageCost = None
    busy_per_page_d2h: PageCost = None

    def busy_per_page_for(self, direction: str, page_bytes: int) -> float:
        """Seconds a page of ``page_bytes`` costs more in ``direction`` while compute runs."""
        cost = self.busy_per_page_h2d if direction == "h2d" else self.busy_per_page_d2h
        return 0.0 if cost is None else page_cost_at(cost, page_bytes)

    def per_page_for(self, direction: str, page_bytes: int) -> float:
        """Host seconds a page of ``page_bytes`` costs in ``direction`` ('h2d' or 'd2h')."""
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction: got {direction!r}; expected 'h2d' or 'd2h'")
        cost = self.per_page_h2d if direction == "h2d" else self.per_page_d2h
        return self.per_page if cost is None else page_cost_at(cost, page_bytes)


class SMSpec(_Frozen):
    """Streaming multiprocessors, as SM copy kernels see them. ``h2d`` / ``d2h`` / ``both``:
    the copy kernel's own ceilings (None: the link's). ``cta_headroom``: a copy kernel gets
    CTAs for this many times its link (``kvsim.core.datapath.copypath.copy_ctas``), since the per-CTA
    rates, measured with few CTAs, sag as the link fills; default 1. ``cta_headroom_d2h``:
    GPU -> host's where it differs (None: the same). ``both_ctas_d2h``: the GPU -> host
    CTAs of an SM-kernel batch beside one host -> GPU on the SM kernel, which keeps its
    own; ``kvsim calibrate`` measures the count of the greatest total (None: both sized by
    Little's law on half ``both``). ``both_crowded``: the kernel's both-ways total with
    more GPU -> host CTAs than that (they wait on the link and slow host -> GPU; None:
    ``both``). ``cta_offload`` / ``cta_onboard``: one copy CTA's rate GPU -> host / host
    -> GPU, a rate or a table by page size (``cta_rate``; on the H200 GPU -> host 8.6-9.0
    GB/s a CTA at 64 KiB pages, 10.7-11.0 at 256 KiB-1 MiB)."""

    count: Annotated[int, Field(ge=2)]
    cta_offload: PageRateRequired   # one copy CTA, GPU -> host
    cta_onboard: PageRateRequired   # one copy CTA, host -> GPU
    threads_per_cta: Annotated[int, Field(gt=0)]
    copy_cta_slots: Annotated[int, Field(ge=2)]  # copy CTAs resident at once, all kernels
    launch: Seconds
    interference: InterferenceSpec
    h2d: Rate | None = None
    d2h: Rate | None = None
    both: Rate | None = None
    cta_headroom: Annotated[float, Field(ge=1)] = 1.0
    cta_headroom_d2h: Annotated[float, Field(ge=1)] | None = None
    both_ctas_d2h: Annotated[int, Field(ge=1)] | None = None
    both_crowded: Rate | None = None

    @model_validator(mode="after")
    def _both_ctas_fit(self) -> "SMSpec":
        if self.both_ctas_d2h is not None and self.both_ctas_d2h > self.copy_cta_slots:
            raise ValueError(f"both_ctas_d2h ({self.both_ctas_d2h}) must not exceed copy_cta_slots "
                             f"({self.copy_cta_slots})")
        return self

    def cta_rate(self, direction: str, page_bytes: int | None = None) -> float:
        """One copy CTA's bytes per second in ``direction`` ('h2d': ``cta_onboard``, 'd2h':
        ``cta_offload``) at pages of ``page_bytes``: a rate as it is; a table linear in
        log2(page size) between its two nearest points, its end value beyond either end
        (``page_cost_at``). ``page_bytes`` None (no page size known): a table's value at
        its largest page, the rate of large pages."""
        if direction not in ("h2d", "d2h"):
            raise ValueError(f"direction: got {direction!r}; expected 'h2d' or 'd2h'")
        r = self.cta_onboard if direction == "h2d" else self.cta_offload
        if not isinstance(r, dict):
            return r
        return r[max(r)] if page_bytes is None else page_cost_at(r, page_bytes)

    def headroom(self, direction: str) -> float:
        """``cta_headroom`` of ``direction`` ('h2d' or 'd2h')."""
        d2h = self.cta_headroom_d2h
        return d2h if direction == "d2h" and d2h is not None else self.cta_headroom


class NVMeSpec(_Frozen):
    """The disk tier's device. A transfer is cut into pieces of at most ``piece`` bytes;
    ``queue_depth`` of them in flight; each costs ``latency`` plus its bytes at the rate.
    Both backends read ``queue_depth`` and ``piece``: the sim's queue model, the hw
    backend's I/O threads and the most bytes one of its pread / pwrite calls moves. A
    disk tier with ``io_workers`` N > 0 (``kvsim.core.datapath.diskio``) has N workers instead of
    ``queue_depth`` in both backends; ``piece`` stays the profile's.
    ``write`` is the rate of a first write into the tier's (preallocated) file space,
    ``rewrite`` that into space written before (None: ``write``): the file system converts
    a preallocated extent on its first write (on the H200 machine 2.09-2.36 GB/s first,
    2.84-2.98 GB/s again)."""

    read: Rate
    write: Rate
    queue_depth: Annotated[int, Field(gt=0)]
    latency: Seconds
    piece: Bytes
    rewrite: Rate | None = None


class HostSpec(_Frozen):
    """Host-tier fill rates per backing (``kvsim.core.datapath.fill.Backing``): ``fill_rate``
    faults in and registers (``register``), ``pinned_fill_rate`` is the driver's pinned
    allocation of the whole range (``pinned``), ``cumem_fill_rate`` the driver's unit by
    unit (``cumem``); None: ``fill_rate``. ``benchmarks/host_fill.py`` measures each."""

    fill_rate: Rate  # host-tier commit (fault in + register) rate
    pinned_fill_rate: Rate | None = None
    cumem_fill_rate: Rate | None = None
    # the driver's allocation granularity for pinned host memory (cuMemCreate): a cumem
    # fill's units are whole granules (kvsim.core.datapath.fill.layout_for); None: none
    cumem_granule: Bytes | None = None
    # the node's DRAM bandwidth for device transfers, both directions of all GPUs and the
    # disk together (None: not a limit)
    memory_bandwidth: Rate | None = None

    def fill_rate_for(self, backing: str) -> float:
        """Bytes per second the fill commits at with ``backing`` ('register', 'pinned' or
        'cumem')."""
        rates = {"register": None, "pinned": self.pinned_fill_rate, "cumem": self.cumem_fill_rate}
        if backing not in rates:
            raise ValueError(f"backing: got {backing!r}; expected one of {', '.join(rates)}")
        rate = rates[backing]
        return self.fill_rate if rate is None else rate


class DriverSpec(_Frozen):
    """The CUDA driver's lock, which every driver call on the machine takes (FIELD.md s.2):
    ``call``, an executor's call (a kernel launch, a copy call, a memory query);
    ``register_rate``, the bytes ``cudaHostRegister`` pins a second, the lock held
    throughout (the rest of a ``register`` unit's fill, faulting it in, takes no lock);
    ``cumem_lock_share``, the share of a ``cumem`` unit's fill the lock is held
    (``cuMemCreate`` and ``cuMemMap``). A ``pinned`` fill's one ``cudaHostAlloc`` holds it
    throughout."""

    call: Seconds = 0.0
    register_rate: Rate
    cumem_lock_share: Fraction


class PcieSpec(_Frozen):
    """PCIe switches: GPU g sits behind switch ``g // gpus_per_switch``, whose uplink to
    the host moves ``uplink`` bytes a second each way (full duplex)."""

    gpus_per_switch: Annotated[int, Field(ge=1, strict=True)]
    uplink: Rate


class GPUSpec(_Frozen):
    name: str
    memory: Bytes
    flops_bf16: Annotated[float, Field(gt=0)]  # dense bf16 FLOP/s, a plain number
    hbm: Rate
    prefill_efficiency: Fraction
    decode_efficiency: Fraction
    step_overhead: Seconds
    # FLOP/s of the layer projections' GEMMs by M (see the module docstring); None: none
    gemm_flops: dict[Annotated[int, Field(gt=0)], Annotated[float, Field(gt=0)]] | None = None
    kernel_overlap: Seconds = 0.0  # ranks on one GPU: consecutive kernels' overlap (docstring)


class TransferSpec(_Frozen):
    """A fixed time per transfer beyond its data path (see the module docstring): the
    backend's own call, completion event and polling. ``latency`` for every transfer,
    ``latency_sm_kernel`` for SM-kernel batches (None: ``latency``)."""

    latency: Seconds = 0.0
    latency_sm_kernel: Seconds | None = None

    def latency_for(self, sm_kernel: bool) -> float:
        """The fixed time of one transfer (``sm_kernel``: the batch runs on the SM kernel)."""
        if sm_kernel and self.latency_sm_kernel is not None:
            return self.latency_sm_kernel
        return self.latency


class ComputeSpec(_Frozen):
    """A fixed time per compute call beyond the step's work, and how much longer than
    nominal the work itself runs (see the module docstring)."""
    latency: Seconds = 0.0
    scale: float = Field(1.0, gt=0)
    boost: BoostSpec | None = None  # the power state (kvsim.config.boostspec); None: none


class HardwareProfile(_Frozen):
    name: str
    link: LinkSpec
    copy_engine: CopyEngineSpec
    sm: SMSpec
    nvme: NVMeSpec
    host: HostSpec
    gpu: GPUSpec
    transfer: TransferSpec = TransferSpec()
    compute: ComputeSpec = ComputeSpec()
    driver: DriverSpec | None = None
    page_cache: PageCacheSpec | None = None  # kvsim.config.pagecachespec (writes: buffered)
    pcie: PcieSpec | None = None
    notes: str = ""

    @model_validator(mode="before")
    @classmethod
    def _no_software_terms(cls, data):
        for key in MOVED_KEYS:
            if isinstance(data, dict) and key in data:
                raise PydanticCustomError(
                    "moved_key", "{key}: not a hardware term: the hw backend's own loop and refcheck "
                    "costs are kvsim compare's hw-loop model (kvsim.tools.hwloop, configs/hwloop/*.yaml); "
                    "move the numbers there and delete the key here", {"key": key})
        return data

    @model_validator(mode="after")
    def _sm_both_covers_one(self) -> "HardwareProfile":
        if self.sm.both is not None:
            one = max(self.sm_ceiling("h2d"), self.sm_ceiling("d2h"))
            if self.sm.both < one:
                raise ValueError(f"sm.both ({self.sm.both:g} B/s) must be at least the SM kernel's "
                                 f"faster direction ({one:g} B/s)")
        return self

    def copy_path_args(self, direction: str, page_bytes: int) -> dict:
        """Keyword arguments of ``kvsim.core.datapath.copypath.choose_copy_path`` for ``direction``
        ('h2d' or 'd2h'): the direction's link rate and per-page host cost, and the SM
        kernel's ceiling where the profile gives one (the time-per-page rule; else the
        older overlap rule). Both backends call this so they choose alike."""
        own = getattr(self.sm, direction)
        return {"link_kind": self.link.kind, "page_bytes": page_bytes,
                "per_copy_host_s": self.copy_engine.per_page_for(direction, page_bytes),
                "link_bytes_per_s": getattr(self.link, direction), "sm_bytes_per_s": own}

    def cta_args(self, direction: str, page_bytes: int) -> dict:
        """Keyword arguments of ``kvsim.core.datapath.copypath.sm_ctas`` (after the setting) for
        ``direction`` ('h2d' or 'd2h') at pages of ``page_bytes`` (the per-CTA rate's page
        size). Both backends call this so they size alike."""
        per = self.sm.cta_rate(direction, page_bytes)
        return {"link_bytes_per_s": getattr(self.link, direction), "per_cta_bytes_per_s": per,
                "max_ctas": self.sm.copy_cta_slots, "headroom": self.sm.headroom(direction)}

    def interference_structure(self, gemm: KindTerms | None = None, memory: KindTerms | None = None,
                               page_bytes: int | None = None) -> Structure | None:
        """The structural interference model with the profile's kinds' terms, or ``gemm`` /
        ``memory`` in their place (a fit's); None without them (the older model). Its GPU
        -> host CTAs drain at the per-CTA rate at pages of ``page_bytes`` (``SMSpec.cta_rate``;
        None: a table's largest page's), and their pages are counted at that size (None:
        not at all: ``Structure.pages_d2h``); beside GEMMs the waiting ones are told at
        that rate itself (``Structure.cta_d2h_idle_Bps``)."""
        i = self.sm.interference
        g = gemm or (i.gemm.terms() if i.gemm else None)
        m = memory or (i.memory.terms() if i.memory else None)
        if g is None or m is None:
            return None
        rates = (tuple(sorted(self.gpu.gemm_flops.items())) if self.gpu.gemm_flops
                 else ((1, self.gpu.flops_bf16 * self.gpu.prefill_efficiency),))
        cta = self.sm.cta_rate("d2h", page_bytes)
        return Structure(self.sm.count, self.gpu.hbm * self.gpu.decode_efficiency,
                         tuple(i.gemm_tile), g, m, cta * i.drain_eff(),
                         i.copy_ctas_per_sm, rates, page_bytes or 0, cta)

    def sm_ceiling(self, direction: str) -> float:
        """The SM copy kernel's ceiling in ``direction`` ('h2d', 'd2h' or 'both')."""
        own = getattr(self.sm, direction)
        return getattr(self.link, direction) if own is None else own


def _resolve(path_or_name: str | Path, kind: str) -> Path:
    p = Path(path_or_name)
    if p.suffix in (".yaml", ".yml") or p.exists() or len(p.parts) > 1:
        return p
    return CONFIG_DIR / kind / f"{path_or_name}.yaml"


def profile_file(path_or_name: str | Path) -> Path:
    """The file ``hardware:`` names: a YAML path as it is, a preset's under configs/."""
    return _resolve(path_or_name, "hardware")


def load_yaml_model(model: type[BaseModel], path_or_name: str | Path, kind: str):
    """Load and validate ``model`` from a YAML file or a preset name under configs/<kind>/."""
    path = _resolve(path_or_name, kind)
    if path.is_dir():
        raise ProfileError(f"{path}: is a folder; expected a YAML file")
    if not path.is_file():
        presets = sorted(q.stem for q in (CONFIG_DIR / kind).glob("*.yaml"))
        raise ProfileError(f"{path}: no such file (presets in configs/{kind}: {presets})")
    data = read_strict(path, ProfileError)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"])
            got = "" if not where else f" (got {err.get('input')!r})"  # (not the whole file)
            lines.append(f"{path}: {where or '(top)'}: {err['msg']}{got}")
        raise ProfileError("\n".join(lines)) from None


def load_profile(path_or_name: str | Path) -> HardwareProfile:
    """A hardware profile from a YAML path or a preset name such as ``'h200-pcie'``."""
    return load_yaml_model(HardwareProfile, path_or_name, "hardware")
