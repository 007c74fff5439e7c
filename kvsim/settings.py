"""What a backend is built from: ``BackendSettings``, one frozen, typed object.

Both backends (and, on a node, every rank) are built as ``Backend(runtime, settings)``
from it and read nothing else: never ``kvsim.config``. The run builds it once from the
validated config (``kvsim.run.seam``), where every range is checked and every default
written; nothing here checks or defaults a setting that comes from the config. The
dataclass defaults below are the hw backend's own run options (device, staging, ...)
and the probes a caller may attach, which no config key sets.

A rule both backends apply to these settings is one pure function in
``kvsim.core.datapath`` (the copy path, the disk-I/O order, the host-fill layout),
called with values from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Optional, Union

from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.datapath.fill import Backing, FillMode
from kvsim.core.datapath.work import READ_KERNEL_S
from kvsim.core.spec import Level

if TYPE_CHECKING:
    from kvsim.config.hardware import HardwareProfile

Device = Literal["auto", "cpu", "gpu"]


@dataclass(frozen=True)
class CopySettings:
    """GPU <-> host copies. ``force``: the path each direction must take (``h2d``,
    ``d2h``; None: the rule's choice, ``kvsim.core.datapath.copypath``); ``sm_ctas``: the
    SM kernel's CTAs, one count or one a direction (None: by Little's law on the profile);
    ``kernel_on_coherent_link``: the rule's opt-in to the SM kernel on a c2c link."""

    force: Mapping[str, Optional[CopyPath]]
    sm_ctas: Union[int, Mapping[str, int], None]
    kernel_on_coherent_link: bool


@dataclass(frozen=True)
class DiskSettings:
    """The disk tier. ``io_workers``: N > 0 prioritised I/O workers in the order of
    ``kvsim.core.datapath.diskio``; 0, the profile's ``nvme.queue_depth`` pieces in flight
    round robin. ``io_write_share``: the share of the N workers writes may hold while a
    restore waits. ``dir``: the folder of the hw backend's tier file; ``preallocate``: the
    file's space reserved up front (else sparse: a full disk fails writes with ENOSPC);
    ``direct_io``: O_DIRECT where the file system allows. ``io_mode``: ``queue`` (the
    above with N 0), ``pool`` (N > 0) or ``serial``: one transfer at a time in arrival
    order on one thread, no priorities (seed 004's baseline). ``writes``: ``direct`` or
    ``buffered`` (the tier file without O_DIRECT: the page cache in front of the drive,
    the profile's ``page_cache``)."""

    io_workers: int
    io_write_share: float
    io_mode: str = "queue"
    writes: str = "direct"
    dir: Optional[str] = None
    preallocate: bool = True
    direct_io: bool = True


@dataclass(frozen=True)
class HostFillSettings:
    """How the host tier comes to exist (``kvsim.core.datapath.fill``): ``mode``,
    ``backing``, ``unit_bytes`` (the commit unit), the hw backend's ``huge_pages`` and
    ``numa`` (``auto``, ``off`` or a node), and ``register_chunk`` (``register``: each
    unit registered in calls of at most that many bytes, the node's fills taking turns)."""

    mode: FillMode
    backing: Backing
    unit_bytes: int
    huge_pages: bool
    numa: Union[Literal["auto", "off"], int]
    register_chunk: Optional[int] = None  # register: calls of at most this, in turns


@dataclass(frozen=True)
class ModelSettings:
    """The model's GEMMs, as the hw backend's compute stand-in runs them and the sim counts
    their waves (``kvsim.core.datapath.work``): ``projections``, one layer's projection
    GEMMs on one GPU as (K, N) (``ModelShape.projections_per_gpu``), each dimension capped
    at ``max_dim`` by ``capped``; their M is the step's tokens rounded down to a power of
    two within [``min_rows``, ``max_rows``] (``gemm_rows``)."""

    projections: tuple[tuple[int, int], ...]
    min_rows: int = 128
    max_rows: int = 8192
    max_dim: int = 16384

    @classmethod
    def capped(cls, projections) -> "ModelSettings":
        """Settings for ``projections`` (K, N) with each dimension at most ``max_dim``."""
        cap = cls.max_dim
        return cls(tuple((min(int(k), cap), min(int(n), cap)) for k, n in projections))


@dataclass(frozen=True)
class HwSettings:
    """How the hw backend runs (no config key: the command line's and callers' options).
    ``device``: the GPU when CuPy finds one (``auto``), or ``cpu``/``gpu``; ``time_scale``:
    simulated seconds a wall second; ``staging_bytes``: pinned staging for GPU <-> disk;
    ``compute_graphs``: the busy kernel and the stand-in's reads launched through CUDA
    graphs (each busy or read kernel ``BackendSettings.read_kernel_s`` long); ``compute_standin``:
    a step's work runs as the compute stand-in (GEMMs and HBM reads,
    ``kvsim_backends.hw.standin``), else as the busy kernel (a load of the SMs alone);
    ``check_capacity``: refuse tiers larger than the machine can give, before
    allocating."""

    device: Device = "auto"
    time_scale: float = 1.0
    staging_bytes: int = 64 << 20
    compute_graphs: bool = True
    compute_standin: bool = True
    check_capacity: bool = True


@dataclass(frozen=True)
class Probes:
    """What a caller watches or injects (tests, ``kvsim compare``, ``kvsim calibrate``),
    none by default. Logs are lists the backend appends to: ``timing_log`` (a record per
    batch), ``compute_log`` (per compute call), ``host_log`` (hw: the loop's host time).
    Faults: ``fail_fill_at_unit`` (the host fill stops before that unit),
    ``fill_unit_delay_s`` (hw: a pause before each unit), ``io_hook`` (hw: called before
    each disk piece, may raise OSError), ``registration_unit`` (sim: the host tier
    registered in units of that many bytes, in place of its fill's)."""

    timing_log: Optional[list] = None
    compute_log: Optional[list] = None
    host_log: Optional[list] = None
    fail_fill_at_unit: Optional[int] = None
    fill_unit_delay_s: float = 0.0
    io_hook: Optional[Callable[..., Any]] = None
    registration_unit: Optional[int] = None


NO_PROBES = Probes()


@dataclass(frozen=True)
class NetworkSettings:
    """The remote tier's network (``cache.remote``): each node's link to the store,
    ``bandwidth`` bytes a second each way and ``latency`` seconds a transfer;
    ``gpudirect``: a get lands in GPU memory from the network (no host bounce);
    ``nodes``: the cluster's nodes, each with its own link."""

    bandwidth: float
    latency: float
    gpudirect: bool
    nodes: int = 1


@dataclass(frozen=True)
class BackendSettings:
    """Everything a backend is built from. ``slots``: slots a tier (its reserved range),
    by level; ``tier_keys``: the config key that sizes each tier (for errors that name
    it); ``profile``: the hardware profile (the sim's constants; both backends' copy-path
    and CTA rules read it); ``model``: the model's GEMM shapes (the compute stand-in)."""

    page_bytes: int
    slots: Mapping[Level, int]
    profile: "HardwareProfile"
    refcheck: bool
    copy: CopySettings
    disk: Optional[DiskSettings]  # None: no disk tier
    host_fill: HostFillSettings
    model: ModelSettings
    hw: HwSettings = HwSettings()
    probes: Probes = NO_PROBES
    tier_keys: Mapping[Level, str] = field(default_factory=dict)
    #: this backend's rank on its node, of ``ranks`` (the node's shared parts, its disk
    #: drive and the driver's lock, come from the runtime: ``Runtime.shared``)
    rank: int = 0
    ranks: int = 1
    #: kernels an engine step launches (the model's layers x engine.kernels_per_layer): the
    #: profile's lasting_gap_per_kernel is paid this many times a step
    kernels_per_step: int = 0
    #: its node in a cluster (``cluster.nodes``): each node's shared parts are its own
    node: int = 0
    #: the remote tier's network (``cache.remote``; None: no remote tier)
    network: Optional[NetworkSettings] = None
    #: GPUs a rank spans (the model's tp) and the node's GPUs (``node.gpus``; 0: ranks x
    #: tp): which PCIe switch a rank is behind (the profile's ``pcie``)
    tp: int = 1
    gpus: int = 0
    #: ``node.host: shared``: the node's ranks share one host tier (the hw backend: one
    #: pinned allocation, slot ids the node's; ``kvsim.core.tiers.SlotPool``)
    host_shared: bool = False
    #: ranks on each GPU (``node.ranks_per_gpu``): rank r's GPUs are those from
    #: ``(r // ranks_per_gpu) x tp``, and ranks on one GPU share its compute, HBM, copy
    #: engines, copy CTAs and PCIe link (the sim: one ``Fluid`` a GPU)
    ranks_per_gpu: int = 1
    #: one kernel of a step's HBM reads (``engine.read_kernel``): the hw stand-in's read
    #: and busy kernels' length; in the sim, ranks on one GPU share its SMs by their
    #: steps' kernel lengths (``kvsim_backends.sim.smshare``)
    read_kernel_s: float = READ_KERNEL_S

    def node_part(self, name: str) -> str:
        """The name under which this backend's node keeps its shared part ``name``."""
        return f"{name}@{self.node}" if self.node else name

    def gpu_index(self) -> int:
        """The first GPU of this backend's rank on its node."""
        return (self.rank // self.ranks_per_gpu) * self.tp

    def key(self, level: Level) -> str:
        """The config key that sizes the tier at ``level``."""
        return self.tier_keys.get(level, f"slots[{level.name}]")
