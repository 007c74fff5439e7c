"""A node's shared host tier (``node.host: shared``): its checks, each rank's port to its
siblings, and its figures in the summary.

With ``shared`` a page one rank of a node computed and evicted to host (or disk) is
onboarded by another rank of the node whose turn has the same prefix (same reuse
scope): each rank's engine gets a ``kvsim.engine.siblingport.SiblingPort`` over the
node's other ranks (their managers lend pages, their backends are the source of the
bytes). The host tier is one pool: its quota in ``cache.tiers`` is the node's, and
every rank's host tier draws its slots from the node's ``kvsim.core.tiers.SlotPool``
(a rank may hold any share of it); when the pool is full the rank that needs room
evicts its own least recent host pages (each manager moves only its own pages: a
node-wide least-recent choice would have one rank plan moves of another's pages). The
disk tier's quota stays a rank's. On the hw backend the node's ranks share one pinned
host allocation (``kvsim_backends.hw.hosttier.SharedHost``), the pool's slot ids its
rows. With ``private`` (the default) nothing here runs and no output changes.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.config import ConfigFileError
from kvsim.core.spec import Level
from kvsim.core.tiers import SlotPool
from kvsim.engine.siblingport import SiblingPort

KEY = "node.host"


def check_shared(cfg, backend: str) -> None:
    """What a shared host tier cannot be (yet): filled unit by unit, beside a remote tier.
    ConfigFileError naming the key. (Both backends build it: ``backend`` is for checks
    one of them may need.)"""
    if cfg.node.host != "shared":
        return
    for i, t in enumerate(cfg.cache.tiers):
        if t.level == "host" and t.fill is not None and t.fill.mode != "none":
            raise ConfigFileError(f"cache.tiers[{i}].fill: a host fill with {KEY}: shared is not "
                                  f"built (the node's pool would fill once, not a rank's part)")
    if cfg.cache.remote is not None:
        raise ConfigFileError(f"{KEY}: shared beside cache.remote is not built (both onboard "
                              f"the blocks after a turn's own prefix); use one of them")


def check_shared_policies(cfg, ranks: Sequence[Any]) -> None:
    """A shared tier needs a policy that serves several ranks: an offline bound (belady)
    reads its own rank's future only, so a page a sibling will use looks dead to it and
    the figure is no bound. ConfigFileError naming the key."""
    if cfg.node.host != "shared" or len(ranks) == 1:
        return
    if any(getattr(rk.policy, "is_bound", False) for rk in ranks):
        raise ConfigFileError(f"cache.policy.eviction: {cfg.cache.policy.eviction} is an offline "
                              f"bound over one rank's future; with {KEY}: shared a sibling "
                              f"rank's turns use the pages too (use an online policy, or "
                              f"{KEY}: private)")


def attach_shared(cfg, ranks: Sequence[Any], page_bytes: int) -> list[SiblingPort] | None:
    """Each rank's engine connected to its node's other ranks (None: a private host)."""
    if cfg.node.host != "shared":
        return None
    per_node = cfg.node.ranks
    ports = []
    for rk in ranks:
        node = rk.rank // per_node
        sibs = [s for s in ranks if s.rank // per_node == node and s is not rk]
        rk.engine.remote = port = SiblingPort(sibs, page_bytes)
        ports.append(port)
    return ports


def share_pools(cfg, ranks: Sequence[Any]) -> list[SlotPool] | None:
    """One host pool a node, of the host tier's quota, that its ranks' host tiers draw
    from (None: a private host, or no host tier)."""
    if cfg.node.host != "shared":
        return None
    mgr = ranks[0].mgr
    if Level.HOST not in [t.level for t in mgr.tiers]:
        return None
    per_node = cfg.node.ranks
    capacity = mgr.tiers[mgr.tier_pos(Level.HOST)].capacity
    pools = [SlotPool(capacity) for _ in range(-(-len(ranks) // per_node))]
    for rk in ranks:
        rk.mgr.share_tier(Level.HOST, pools[rk.rank // per_node])
    return pools


def shared_metrics(metrics: dict, ports: list[SiblingPort] | None,
                   pools: list[SlotPool] | None = None) -> None:
    """The summary's ``node`` section: the host tier's layout; per rank and in all, the
    pages it onboarded from a sibling (``host_shared``: pages, fetches, tokens by the
    sibling's tier; already counted in ``hit_tokens`` host and disk); each node's host
    pool (``host_pool``)."""
    if ports is None:
        return
    each = [p.stats() for p in ports]
    metrics["node"] = {
        "host": "shared",
        "host_shared": {"pages": sum(s["pages"] for s in each),
                        "fetches": sum(s["fetches"] for s in each),
                        "tokens": {t: sum(s["tokens"][t] for s in each) for t in ("host", "disk")},
                        "by_rank": each},
    }
    if pools:  # each node's host pool, in pages: its capacity, the most held at once
        metrics["node"]["host_pool"] = [{"capacity_pages": p.capacity, "peak_pages": p.peak,
                                         "used_pages": p.used} for p in pools]
