"""Eviction and placement policies: the interfaces, the built-ins and their registries.

``make_policy(name, **kw)`` builds a built-in by name (``kw``: its knobs, ``KNOBS``);
``POLICIES`` maps names to classes. Policies of keys order a tier through a heap
(``base.HeapOrder``); queue policies keep per-tier state of their own (``queues``):
``s3fifo``, ``arc``, ``sieve``. A user's own policy is an ``EvictionPolicy`` subclass
given to ``TierManager`` (the run configuration's ``cache.policy.eviction:
module:Class`` loads one, outside the core). Placement policies (where a victim goes, whether a restored page keeps its disk
copy) are in ``placement.py``: ``make_placement``, ``PLACEMENTS``.
"""

from __future__ import annotations

from typing import Any

from kvsim.core.errors import CoreError
from kvsim.core.policy.arc import ARC
from kvsim.core.policy.base import LRU, EvictionPolicy, PriorityLRU, TierOrder
from kvsim.core.policy.builtin import GDSF, LFU, LFUDA, Belady, NextUses
from kvsim.core.policy.queues import QueueOrder, TierQueue
from kvsim.core.policy.s3fifo import S3FIFO
from kvsim.core.policy.sieve import Sieve
from kvsim.core.policy.placement import (DROP, PLACEMENT_NAMES, PLACEMENTS, Cascade,
                                         PlacementPolicy, RecomputeOverDisk, SkipHost,
                                         make_placement)


#: the built-ins: (name, class), the default first
POLICIES: tuple[tuple[str, type[EvictionPolicy]], ...] = (
    ("lru", LRU), ("priority-lru", PriorityLRU), ("lfu", LFU), ("lfu-da", LFUDA),
    ("gdsf", GDSF), ("s3-fifo", S3FIFO), ("arc", ARC), ("sieve", Sieve), ("belady", Belady))
POLICY_NAMES: tuple[str, ...] = tuple(n for n, _ in POLICIES)
#: the built-ins that are offline bounds (``is_bound``: they read the trace's future)
BOUND_NAMES: tuple[str, ...] = tuple(n for n, cls in POLICIES if cls.is_bound)


def per_tier(policy: EvictionPolicy, tier_policies: dict[int, EvictionPolicy] | None,
             tiers: int) -> list[EvictionPolicy]:
    """Each tier's eviction policy: its own (``tier_policies``: tier position -> policy),
    else ``policy``."""
    over = dict(tier_policies or {})
    for pos in over:
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < tiers:
            raise CoreError(f"tier_policies: no tier at position {pos!r} (0..{tiers - 1})")
    return [over.get(i, policy) for i in range(tiers)]


def distinct(policies: list[EvictionPolicy]) -> list[EvictionPolicy]:
    """Each policy once (by identity), in order."""
    out: list[EvictionPolicy] = []
    for p in policies:
        if all(p is not q for q in out):
            out.append(p)
    return out


def knobs_of(cls: type) -> dict[str, str]:
    """The knobs a policy class takes (``cache.policy.knobs``): name -> kind, ``ratio``
    (a number in (0, 1)) or ``count`` (an integer >= 1)."""
    return dict(getattr(cls, "KNOBS", {}))


def make_policy(name: str, **kwargs: Any) -> EvictionPolicy:
    """A fresh built-in policy (a manager's own: policies may keep state)."""
    for n, cls in POLICIES:
        if n == name:
            return cls(**kwargs)
    raise KeyError(f"unknown eviction policy {name!r}; known: {', '.join(POLICY_NAMES)}")


__all__ = ["EvictionPolicy", "LRU", "PriorityLRU", "LFU", "LFUDA", "GDSF", "S3FIFO", "ARC", "Sieve",
           "Belady", "NextUses", "TierOrder", "TierQueue", "QueueOrder", "knobs_of",
           "POLICIES", "POLICY_NAMES", "BOUND_NAMES", "make_policy", "DROP", "PlacementPolicy", "Cascade",
           "RecomputeOverDisk", "SkipHost", "PLACEMENTS", "PLACEMENT_NAMES", "make_placement"]
