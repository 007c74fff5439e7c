"""The ``node`` and ``router`` sections: how many model instances (ranks) a node runs,
what they share, and which rank serves a session.

A node is ``ranks`` model instances, each on ``tp`` GPUs of the node's ``gpus``; each
rank has its own GPU tier, engine and executor, and its own partition of the host tier
(``host: private``, the layout of FIELD.md's seed 001: every tier quota in ``cache`` is a
rank's) and of the disk tier, while the ranks share the node's hardware: the NVMe drive
and its I/O workers, and the CUDA driver's lock that every process on the machine takes.
``router.policy: session-hash`` sends every turn of a session to the rank its session id
hashes to (a stable hash: the same on every run and machine). Reuse scopes hold across
ranks: a tenant's pages are never another's hits on any rank.

``ranks_per_gpu`` > 1 puts that many ranks on each GPU (ranks ``i`` with the same
``i // ranks_per_gpu``): they share its SMs, its HBM, its copy engines and its PCIe link.

One rank (the default) is a plain single-instance replay, its outputs unchanged.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, field_validator, model_validator

from kvsim.config.strict import Strict

MAX_RANKS = 1024  # a replay keeps a manager, engine and backend per rank


class NodeConfig(Strict):
    """``ranks``: model instances on the node (each on ``tp`` GPUs); ``gpus``: the node's
    GPUs (default: ranks x tp, one instance per tp GPUs); ``host``: ``private`` (each rank
    its own partition of host memory, sized by the host tier's quota) or ``shared`` (a
    page one rank holds in host or disk is onboarded by another: ``kvsim.run.sharedhost``);
    ``ranks_per_gpu``: ranks that share each GPU (its compute, HBM, copy engines and link;
    1: each rank its own GPUs)."""

    ranks: Annotated[int, Field(ge=1, le=MAX_RANKS, strict=True)] = 1
    gpus: Optional[Annotated[int, Field(ge=1, strict=True)]] = None
    host: Literal["private", "shared"] = "private"
    ranks_per_gpu: Annotated[int, Field(ge=1, le=MAX_RANKS, strict=True)] = 1


MAX_NODES = 1024  # cluster.nodes: nodes x ranks instances, each a manager, engine, backend


class ClusterConfig(Strict):
    """``nodes``: nodes of the ``node`` section's shape (its ranks, its shared host and
    disk) behind one router; every rank of every node is an instance."""

    nodes: Annotated[int, Field(ge=1, le=MAX_NODES, strict=True)] = 1


Weight = Annotated[float, Field(ge=0.0, le=1.0)]


class RouterConfig(Strict):
    """Which instance serves a request (``kvsim.core.routing``): ``session-hash`` (a
    stable hash of the session id: the node's rule, decided by the id alone),
    ``round-robin``, ``least-loaded``, ``session-affinity``, ``prefix-aware``, or
    ``module:Class`` (a ``kvsim.core.routing.Router`` subclass, given ``knobs``).
    ``overlap_weight``, the tier weights, ``balance_threshold`` and ``temperature`` are
    prefix-aware's; ``threshold``, session-affinity's (docs/config.md)."""

    policy: str = "session-hash"
    overlap_weight: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    gpu_weight: Weight = 1.0
    host_weight: Weight = 0.8
    disk_weight: Weight = 0.5
    balance_threshold: Optional[Annotated[float, Field(ge=0.0)]] = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 0.0
    threshold: Annotated[float, Field(ge=1.0, le=1e6)] = 2.0
    knobs: dict[str, float] = {}

    @field_validator("policy")
    @classmethod
    def _known(cls, v: str) -> str:
        from kvsim.core.routing import ROUTER_NAMES  # noqa: PLC0415

        if v in ROUTER_NAMES or (":" in v and all(v.partition(":")[::2])):
            return v
        raise ValueError(f"unknown router policy {v!r}; expected one of "
                         f"{', '.join(ROUTER_NAMES)}, or module:Class for your own")

    @model_validator(mode="after")
    def _ordered(self) -> "RouterConfig":
        if not self.gpu_weight >= self.host_weight >= self.disk_weight:
            raise ValueError(f"gpu_weight >= host_weight >= disk_weight expected (a hit in a "
                             f"faster tier saves more); got {self.gpu_weight}, "
                             f"{self.host_weight}, {self.disk_weight}")
        return self

    @model_validator(mode="after")
    def _read(self) -> "RouterConfig":
        """A knob the chosen policy does not read is refused, not ignored (its default, or
        null where that is the default, unsets it)."""
        from kvsim.core.routing import ROUTER_KNOBS  # noqa: PLC0415

        reads = ROUTER_KNOBS.get(self.policy, ())
        for key in ("overlap_weight", "gpu_weight", "host_weight", "disk_weight",
                    "balance_threshold", "temperature", "threshold"):
            if key in reads or getattr(self, key) == type(self).model_fields[key].default:
                continue
            owners = [p for p, ks in ROUTER_KNOBS.items() if key in ks]
            mine = "" if self.policy in ROUTER_KNOBS else " (a module:Class router gets router.knobs only)"
            raise ValueError(f"router.{key} applies to router.policy {' or '.join(owners)} "
                             f"only; router.policy is {self.policy}{mine}")
        if self.knobs and self.policy in ROUTER_KNOBS:
            own = ", ".join(f"router.{k}" for k in reads) or "none"
            raise ValueError(f"router.knobs are a module:Class router's own; the built-in "
                             f"{self.policy} takes none of them (its knobs: {own})")
        return self

    def builtin_knobs(self) -> dict[str, float]:
        """The built-in routers' knobs, as ``kvsim.core.routing`` takes them."""
        k = {"overlap_weight": self.overlap_weight, "gpu_weight": self.gpu_weight,
             "host_weight": self.host_weight, "disk_weight": self.disk_weight,
             "temperature": self.temperature, "threshold": self.threshold}
        if self.balance_threshold is not None:
            k["balance_threshold"] = self.balance_threshold
        return k


def check_node(node: NodeConfig, tp: int) -> None:
    """What the node section cannot check alone, given the model's tensor-parallel degree:
    the ranks' GPUs fit the node's (``ranks_per_gpu`` ranks on each). ValueError naming
    the keys."""
    per = node.ranks_per_gpu
    if node.gpus is not None and node.ranks * tp > node.gpus * per:
        if per == 1:
            raise ValueError(f"node.ranks: {node.ranks} ranks x tp {tp} need {node.ranks * tp} GPUs; "
                             f"node.gpus is {node.gpus}")
        raise ValueError(f"node.ranks: {node.ranks} ranks x tp {tp} need {node.ranks * tp} GPU "
                         f"places; node.gpus {node.gpus} x node.ranks_per_gpu {per} give "
                         f"{node.gpus * per}")

