"""The ``cache.remote`` section: a cluster-wide remote KV store (docs/config.md).

``capacity``: the store's size (pages of ``cache.page_bytes``); ``network``: each node's
link to it (``bandwidth`` each way, ``latency`` a transfer); ``gpudirect``: gets land in
GPU memory straight from the network (no host bounce, no PCIe leg of their own);
``policy``: the store's eviction order (``kvsim.core.remotestore.ORDERS``); ``write_through``:
put a turn's full pages when it ends, not only pages dropped from an instance's last tier.
Sim backend only.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from kvsim.config.strict import Seconds, Size, Strict
from kvsim.config.units import parse_rate

Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]


class NetworkConfig(Strict):
    """A node's network link to the remote store: bytes a second each way (full duplex,
    shared by the node's ranks) and the fixed latency of one transfer."""

    bandwidth: Rate
    latency: Seconds


class RemoteConfig(Strict):
    capacity: Size
    network: NetworkConfig
    gpudirect: bool = False
    policy: Literal["lru", "fifo"] = "lru"
    write_through: bool = False
