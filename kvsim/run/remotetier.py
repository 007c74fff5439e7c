"""The remote tier of a run (``cache.remote``): its checks, its store, each engine's
port to it, and its figures in the summary.

One ``kvsim.core.remotestore.RemoteStore`` for the whole run (every instance of the cluster
shares it), sized in pages of the run's ``page_bytes``; each engine gets a
``kvsim.engine.remoteport.RemotePort`` over its backend's network link, and its manager
collects the pages it drops (``TierManager.dropped``). Without
``cache.remote`` nothing here runs and no output changes.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.config import ConfigFileError
from kvsim.core.remotestore import RemoteStore
from kvsim.engine.remoteport import RemotePort

KEY = "cache.remote"


def check_remote(cfg, backend: str, page_bytes: int) -> None:
    """What a remote tier cannot be: on another backend than the sim (the network is
    modelled, not built), smaller than a page. ConfigFileError naming the key."""
    r = cfg.cache.remote
    if r is None:
        return
    if backend != "sim":
        raise ConfigFileError(f"{KEY}: the remote tier is simulated only; the {backend} backend "
                              f"has none (remove {KEY} or use --backend sim)")
    if r.capacity < page_bytes:
        raise ConfigFileError(f"{KEY}.capacity: {r.capacity:,} bytes is less than one page "
                              f"({page_bytes:,} bytes)")


def attach_remote(cfg, ranks: Sequence[Any], page_bytes: int) -> RemoteStore | None:
    """The run's remote store, each rank's engine connected to it (None: no remote tier)."""
    r = cfg.cache.remote
    if r is None:
        return None
    store = RemoteStore(r.capacity // page_bytes, r.policy)
    for rk in ranks:
        rk.mgr.dropped = []
        rk.engine.remote = RemotePort(store, rk.backend.network, page_bytes, r.write_through)
        rk.engine.metrics.remote_on = True  # (an instance that serves nothing counts 0 remote)
    return store


def remote_metrics(metrics: dict, store: RemoteStore | None, traffic: dict) -> None:
    """The summary's ``remote`` section (the store's counters and occupancy, the bytes
    each way over the network) and the cluster's ``network_bytes``."""
    if store is None:
        return
    get, put = int(traffic.get("remote_get_bytes", 0)), int(traffic.get("remote_put_bytes", 0))
    metrics["remote"] = {**store.stats(), "get_bytes": get, "put_bytes": put,
                         "occupancy": len(store) / store.capacity}
    if "cluster" in metrics:
        metrics["cluster"]["network_bytes"] = get + put
        metrics["cluster"]["network_bytes_by_direction"] = {"get": get, "put": put}
