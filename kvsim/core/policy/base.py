"""The eviction policy interface, and the default: per tier, lowest priority, then least
recently used.

A policy orders a tier's eviction candidates. The manager asks it only which candidates
go first; everything else stays the manager's job: which pages are candidates at all
(resident, unlocked, not held in the last tier), all-or-nothing plans, where victims go,
and dropping children before parents in the last tier. So no policy can break those.

A policy sees each candidate page's metadata, read-only:

    page.tier        position of its tier (0: GPU)        page.ntokens   tokens it holds
    page.index       block position = depth in the tree   page.priority  its priority
    page.last_use    the manager's logical clock at its last use (a request's turn that
                     included it); the clock advances once per turn (``prepare``)
    page.uses        turns that used it                   page.key       its chain key
    page.score       a number the policy may keep per page (its own; 0.0 at first)

and the manager's logical clock. It does no I/O and reads no wall clock.

``LRU`` is special-cased: the manager walks the tier's recency index itself (one
insertion-ordered dict per priority), the fast path. Any other policy goes through the
generic path: the candidates, in that recency order, sorted by ``key(page, clock)``
(stable: ties keep least recently used first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from kvsim.core.pages import Page


class EvictionPolicy:
    """Base class of eviction policies (subclass it, or provide the same attributes).

    ``key(page, clock)``: a sortable value; lowest is evicted first.
    ``on_use(page, clock)``: a page was used (a turn included it, or created it);
    ``page.last_use`` and ``page.uses`` are already updated.
    ``on_evict(pages, clock)``: these pages were chosen as victims and leave their tier.
    """

    name = "base"
    #: needs the future of the trace (an offline bound, not a policy a server could run)
    is_bound = False
    #: the manager keeps its own recency order only: ``key`` is never called
    fast_lru = False

    def key(self, page: "Page", clock: int) -> Any:
        raise NotImplementedError

    def on_use(self, page: "Page", clock: int) -> None:
        pass

    def on_evict(self, pages: Iterable["Page"], clock: int) -> None:
        pass

    def order(self, candidates: Iterable["Page"], clock: int) -> list["Page"]:
        """The candidates (given least recently used first) in eviction order."""
        key = self.key
        return sorted(candidates, key=lambda p: key(p, clock))


class LRU(EvictionPolicy):
    """Per tier: lowest priority first, then least recently used (kvsim's historic order;
    with priorities from the workload this is priority-LRU)."""

    name = "lru"
    fast_lru = True

    def key(self, page: "Page", clock: int) -> Any:  # what the fast path's order means
        return (page.priority, page.last_use)
