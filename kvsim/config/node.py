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

One rank (the default) is a plain single-instance replay, its outputs unchanged.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from kvsim.config.strict import Strict

MAX_RANKS = 1024  # a replay keeps a manager, engine and backend per rank


class NodeConfig(Strict):
    """``ranks``: model instances on the node (each on ``tp`` GPUs); ``gpus``: the node's
    GPUs (default: ranks x tp, one instance per tp GPUs); ``host``: ``private`` (each rank
    its own partition of host memory, sized by the host tier's quota)."""

    ranks: Annotated[int, Field(ge=1, le=MAX_RANKS, strict=True)] = 1
    gpus: Optional[Annotated[int, Field(ge=1, strict=True)]] = None
    host: Literal["private"] = "private"


class RouterConfig(Strict):
    """Which rank serves a session: ``session-hash`` (a stable hash of the session id)."""

    policy: Literal["session-hash"] = "session-hash"


def check_node(node: NodeConfig, tp: int) -> None:
    """What the node section cannot check alone, given the model's tensor-parallel degree:
    the ranks' GPUs fit the node's. ValueError naming the key."""
    if node.gpus is not None and node.ranks * tp > node.gpus:
        raise ValueError(f"node.ranks: {node.ranks} ranks x tp {tp} need {node.ranks * tp} GPUs; "
                         f"node.gpus is {node.gpus}")

