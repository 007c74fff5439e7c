"""The built-in eviction policies other than LRU (see base.py for the interface)."""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from kvsim.core.policy.base import EvictionPolicy

if TYPE_CHECKING:
    from kvsim.core.pages import Page

NEVER = float("inf")


class LFU(EvictionPolicy):
    """Frequency-aware LRU: lowest priority, then fewest uses, then least recently used."""

    name = "lfu"
    static_keys = True

    def key(self, page: "Page", clock: int) -> Any:
        return (page.priority, page.uses, page.last_use)


class GDSF(EvictionPolicy):
    """Greedy-Dual-Size-Frequency, cost-aware: a page's value is
    ``L + uses * cost / size``, set when the last turn that used it ends, lowest evicted
    first (within a priority). Size is one page. The cost is the recompute its eviction
    would bring on that turn: that page's block and every block after it in the turn (a
    miss ends the cached prefix), a block at depth d costing d + 1 (it attends to the d
    blocks before it). So a page deep in a long prefix is worth more than a leaf of a
    short one, and a parent at least as much as its child in the same turn (scoring at
    the turn's end, not chunk by chunk, keeps that: children leave first, so the last
    tier's drop order, children before parents, walks few pages it must skip). ``L`` (the inflation)
    rises to the value of each victim, so pages not used for long age out whatever their
    cost."""

    name = "gdsf"
    static_keys = True

    def __init__(self) -> None:
        self.inflation = 0.0

    def on_turn(self, pages: list["Page"], clock: int) -> None:
        if not pages:
            return
        last = pages[-1].index + 1  # sum of (j + 1) for j = i .. last - 1
        top = last * (last + 1) / 2
        inflation = self.inflation
        for p in pages:
            i = p.index
            p.score = inflation + p.uses * (top - i * (i + 1) / 2)

    def key(self, page: "Page", clock: int) -> Any:
        return (page.priority, page.score)

    def on_evict(self, pages: Iterable["Page"], clock: int) -> None:
        for p in pages:
            if p.score > self.inflation:
                self.inflation = p.score


class S3FIFO(EvictionPolicy):
    """A static-order approximation of S3-FIFO (Yang et al., SOSP 2023): pages used once
    (the small, probationary queue) leave before pages used again (the main queue), each
    queue in first-in-first-out order of its last entry. One-hit pages of a scan thus never
    push out reused ones. (Without S3-FIFO's ghost queue: a page that comes back after its
    eviction starts over as used once.)"""

    name = "s3-fifo"
    static_keys = True

    def key(self, page: "Page", clock: int) -> Any:
        return (page.priority, page.uses > 1, page.last_use)


class Belady(EvictionPolicy):
    """The offline optimum (Belady's MIN): evict the page whose next use is furthest in
    the future (never used again: first). It needs the future: ``future[chain key]`` is
    the sorted clock values (turn ordinals, as the manager's clock counts ``prepare``
    calls from 1) at which a turn uses that block. Priorities are ignored. A bound, not a
    policy a server could run: sim-only."""

    name = "belady"
    is_bound = True

    def __init__(self, future: Mapping[bytes, Sequence[int]]) -> None:
        self.future = future

    def next_use(self, page: "Page", clock: int) -> float:
        uses = self.future.get(page.key) if page.key else None
        if not uses:
            return NEVER
        i = bisect_right(uses, clock)
        return uses[i] if i < len(uses) else NEVER

    def keys(self, pages: list["Page"], clock: int) -> list[Any]:
        key = self.key
        return [-s if (s := p.score) > clock else key(p, clock) for p in pages]

    def key(self, page: "Page", clock: int) -> Any:
        # ``page.score`` keeps the next use found last time: looked up again only once the
        # clock has reached it (one dict lookup and bisection per use, not per comparison)
        s = page.score
        if s <= clock:
            s = self.next_use(page, clock)
            if page.key:  # (a page without its key yet may find its future later)
                page.score = s
        return -s
