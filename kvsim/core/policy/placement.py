"""Placement policies: where an evicted page goes, and whether a restored page keeps its
disk copy. The interface, the built-ins and their registry.

An eviction policy (``base.py``) orders a tier's candidates; a placement policy decides,
for each victim the manager picked, its destination:

    place(page, src, levels, clock) -> int

``src`` is the victim's tier position, ``levels`` the manager's tiers (``Level`` of each
position, warmest first). The answer is a colder tier position (``src < d < len(levels)``)
or ``DROP``. The default, ``Cascade``, answers ``src + 1``: the next colder tier (the last
tier drops, and is never asked). And, for a page restored from the disk tier when the
disk tier's ``keep_copy`` is on:

    keep_copy(page, clock) -> bool

whether its disk slot stays as the page's retained copy (default: yes, every full page, as
``keep_copy`` alone does). The decision only narrows ``keep_copy``: without it nothing is
kept, and ``protected_copy_fraction`` governs the copies kept as before.

The manager keeps the invariants whatever a placement answers, so no placement can break
them (``kvsim.core.destinations``):
- a plan is all-or-nothing: a victim goes where it is placed if that tier can take it
  (with its own victims), else the whole tier's victims go to the nearest colder tier
  that can, as without a placement; a refused plan changes nothing;
- ``DROP`` is honoured only for a page nobody holds whose tree children are gone or
  dropped before it in the same plan; otherwise the page goes to the next colder tier.
  A page with a ready retained disk copy is not dropped: it takes its copy back (no
  bytes move, nothing is lost); one whose copy is still being written goes to the next
  colder tier;
- the placement is asked during planning, a dry run that may be repeated: ``place`` and
  ``keep_copy`` must be pure functions of the page's metadata and the clock (no state).

A page shows the metadata an eviction policy sees (``base.py``): ``tier``, ``index``
(its depth in the prefix tree), ``ntokens``, ``priority``, ``key``; ``uses``,
``last_use`` and ``score`` only when the placement sets ``reads_use`` (the manager then
keeps them, as for an eviction policy other than ``lru``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from kvsim.core.spec import Level

if TYPE_CHECKING:
    from kvsim.core.pages import Page

#: ``place``'s answer for a page that is dropped instead of moved colder
DROP = -1


class PlacementPolicy:
    """Base class of placement policies (subclass it and override ``place`` and/or
    ``keep_copy``)."""

    name = "base"
    #: the manager's own cascade: it asks nothing (today's code path, unchanged)
    is_default = False
    #: reads ``page.uses``, ``last_use`` or ``score``: the manager keeps them for it
    reads_use = False
    #: ``keep_copy`` answers True for every page: the manager need not ask it
    keeps_every_copy = True

    def place(self, page: "Page", src: int, levels: Sequence[Level], clock: int) -> int:
        """The tier position a victim of tier ``src`` goes to, or ``DROP``."""
        return src + 1

    def keep_copy(self, page: "Page", clock: int) -> bool:
        """A full page restored from disk (``keep_copy`` on): keep its disk slot as its
        retained copy?"""
        return True


class Cascade(PlacementPolicy):
    """The default: a victim goes one tier colder (GPU -> host -> disk -> dropped), and
    every full page restored from disk keeps its copy when ``keep_copy`` is on."""

    name = "cascade"
    is_default = True


class RecomputeOverDisk(PlacementPolicy):
    """Cost-aware: a page that would go to the disk tier is dropped instead when
    recomputing it is cheaper than the disk's write and read of it, and such a page
    restored from disk keeps no copy. Dropping a page loses only that block (its children
    are gone first), so its recompute cost is that of one block at its depth, which grows
    with the depth (attention over the prefix before it): a page at depth below
    ``max_depth`` is cheaper to recompute. ``max_depth`` comes from the model and the
    hardware (``kvsim.run.policies`` works it out for a run); 0 drops nothing."""

    name = "recompute"

    def __init__(self, max_depth: int = 0) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
            raise ValueError(f"max_depth: got {max_depth!r}; expected an integer >= 0")
        self.max_depth = max_depth
        self.keeps_every_copy = max_depth == 0

    def place(self, page: "Page", src: int, levels: Sequence[Level], clock: int) -> int:
        d = src + 1
        if levels[d] == Level.DISK and page.index < self.max_depth:
            return DROP
        return d

    def keep_copy(self, page: "Page", clock: int) -> bool:
        return page.index >= self.max_depth


class SkipHost(PlacementPolicy):
    """Scan-resistant host tier: a GPU victim that only one turn has used goes straight
    to the disk tier, so one-off pages do not push reused ones out of host memory. Pages
    used again cascade as usual. Without both a host and a disk tier it is the default."""

    name = "skip-host"
    reads_use = True

    def place(self, page: "Page", src: int, levels: Sequence[Level], clock: int) -> int:
        d = src + 1
        if levels[src] == Level.GPU and page.uses <= 1 and levels[d] == Level.HOST \
                and levels[-1] == Level.DISK:
            return len(levels) - 1
        return d


#: the built-ins: (name, class), the default first
PLACEMENTS: tuple[tuple[str, type], ...] = (
    ("cascade", Cascade), ("recompute", RecomputeOverDisk), ("skip-host", SkipHost))
PLACEMENT_NAMES: tuple[str, ...] = tuple(n for n, _ in PLACEMENTS)


def make_placement(name: str, **kwargs: Any) -> PlacementPolicy:
    """A fresh built-in placement policy."""
    for n, cls in PLACEMENTS:
        if n == name:
            return cls(**kwargs)
    raise KeyError(f"unknown placement policy {name!r}; known: {', '.join(PLACEMENT_NAMES)}")


__all__ = ["DROP", "PlacementPolicy", "Cascade", "RecomputeOverDisk", "SkipHost", "PLACEMENTS",
           "PLACEMENT_NAMES", "make_placement"]
