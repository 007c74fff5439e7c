"""SIEVE: Yazhuo Zhang, Juncheng Yang, Yao Yue, Ymir Vigfusson, K. V. Rashmi, "SIEVE is
Simpler than LRU: an Efficient Turn-Key Eviction Algorithm for Web Caches", NSDI 2024
(https://www.usenix.org/conference/nsdi24/presentation/zhang-yazhuo), as libCacheSim
implements it (``Sieve.c``).

Per tier: one FIFO queue, newest at its head, a visited bit per page (set by a hit) and a
hand. An eviction starts at the hand (at the tail, the oldest, when the hand is unset) and
moves toward the head: a visited page loses its bit and is passed; the first page not
visited is evicted, and the hand stops at the page after it toward the head (unset when
there is none: the next eviction starts at the tail again). Past the head the hand wraps
to the tail. New pages join at the head; a page never moves.

The queue is a list, oldest first, with a position per page: a departure leaves a hole
(skipped), and the list is compacted once holes outnumber pages. A walk is a dry run (the
bits it would clear kept aside); ``evicted`` runs it again up to the last victim and
applies it. A page the manager skips (locked, or held in the last tier) keeps its place;
the hand moves past it. Priorities are ignored (every page gets 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional

from kvsim.core.policy.base import EvictionPolicy
from kvsim.core.policy.queues import TierQueue, WalkRun

if TYPE_CHECKING:
    from kvsim.core.pages import Page
    from kvsim.core.tiers import Tier


class _Run(WalkRun):
    """A walk's overlay: the bits it cleared, the position after its last eviction."""

    __slots__ = ("cleared", "after")

    def __init__(self) -> None:
        super().__init__()
        self.cleared: set["Page"] = set()
        self.after = -1  # the list position after the last page it yielded


class SieveQueue(TierQueue):
    """One tier's SIEVE state (see the module docstring)."""

    def __init__(self, tier: "Tier") -> None:
        super().__init__(tier)
        self.q: list[Optional["Page"]] = []  # oldest first; None: a page that left
        self.pos: dict["Page", int] = {}
        self.visited: set["Page"] = set()
        self.hand: Optional[int] = None  # a position in q, or None: start at the tail

    def __contains__(self, page: object) -> bool:
        return page in self.pos

    def __len__(self) -> int:
        return len(self.pos)

    def insert(self, page: "Page") -> None:
        self.version += 1
        self.pos[page] = len(self.q)
        self.q.append(page)

    def admit(self, pages: list["Page"]) -> None:
        self.version += 1
        pos, q = self.pos, self.q
        for page in pages:
            if page not in pos:
                pos[page] = len(q)
                q.append(page)

    def hit(self, page: "Page") -> None:
        if page not in self.visited:
            self.version += 1
            self.visited.add(page)

    def _settle_hand(self, at: int) -> None:
        """The hand at position ``at`` or the first page after it toward the head; unset
        if there is none."""
        q = self.q
        while at < len(q) and q[at] is None:
            at += 1
        self.hand = at if at < len(q) else None

    def remove(self, page: "Page") -> None:
        self.version += 1
        i = self.pos.pop(page)
        self.q[i] = None
        self.visited.discard(page)
        if self.hand == i:
            self._settle_hand(i)
        self._compact()

    def _compact(self) -> None:
        q = self.q
        if len(q) < 64 or len(q) < 2 * len(self.pos):
            return
        hand = self.hand
        new_hand = None
        live: list[Optional["Page"]] = []
        for i, p in enumerate(q):
            if i == hand:
                new_hand = len(live)
            if p is not None:
                live.append(p)
        self.q = live
        self.pos = {p: i for i, p in enumerate(live)}  # type: ignore[misc]
        self.hand = new_hand if hand is not None and new_hand is not None \
            and new_hand < len(live) else None

    def new_run(self) -> _Run:
        return _Run()

    def _walk(self, run: _Run) -> Iterator["Page"]:
        q, visited, cleared = self.q, self.visited, run.cleared
        n = len(q)
        left = len(self.pos)
        gone = run.seen
        i = 0 if self.hand is None else self.hand
        while left:
            if i >= n:
                i = 0  # past the head: back to the tail
            p = q[i]
            i += 1
            if p is None or p in gone:
                continue
            if p in visited and p not in cleared:
                cleared.add(p)
                continue
            gone.add(p)
            run.last = p
            left -= 1
            run.after = i
            yield p

    def _apply(self, run: _Run, gone: set["Page"], stray: set["Page"]) -> None:
        q, pos, visited = self.q, self.pos, self.visited
        visited.difference_update(run.cleared)
        for p in gone:
            q[pos.pop(p)] = None
            visited.discard(p)
        if run.after >= 0:
            self._settle_hand(run.after)
        for p in stray:
            if p in self:
                self.remove(p)
        self._compact()


class Sieve(EvictionPolicy):
    """SIEVE (see the module docstring)."""

    name = "sieve"
    honours_priority = False
    KNOBS: dict[str, str] = {}

    def key(self, page: "Page", clock: int) -> int:  # (a queue policy: never asked)
        raise NotImplementedError("sieve orders its tiers by queues, not keys")

    def tier_queue(self, tier: "Tier") -> SieveQueue:
        return SieveQueue(tier)
