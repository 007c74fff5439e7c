"""A node's shared host tier (``node.host: shared``): its checks, each rank's port to its
siblings, and its figures in the summary.

With ``shared`` a page one rank of a node computed and evicted to host (or disk) is
onboarded by another rank of the node whose turn has the same prefix (same reuse
scope): each rank's engine gets a ``kvsim.engine.siblingport.SiblingPort`` over the
node's other ranks (their managers lend pages, their backends are the source of the
bytes). What it is not yet: one pool. Each rank's host and disk quotas are still its
own (the ``cache`` quotas are a rank's, as with ``private``); the hw backend has no
shared pinned pool yet. With ``private`` (the default) nothing here runs and no output
changes.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.config import ConfigFileError
from kvsim.engine.siblingport import SiblingPort

KEY = "node.host"


def check_shared(cfg, backend: str) -> None:
    """What a shared host tier cannot be (yet): on the hw backend, beside a remote tier.
    ConfigFileError naming the key."""
    if cfg.node.host != "shared":
        return
    if backend != "sim":
        raise ConfigFileError(f"{KEY}: shared is built on the sim backend only (the {backend} "
                              f"backend's ranks have private host pools); use {KEY}: private "
                              f"or --backend sim")
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


def shared_metrics(metrics: dict, ports: list[SiblingPort] | None) -> None:
    """The summary's ``node`` section: the host tier's layout and, per rank and in all,
    the pages it onboarded from a sibling (``host_shared``: pages, fetches, tokens by
    the sibling's tier; already counted in ``hit_tokens`` host and disk)."""
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
