"""What a cluster's router reads without visiting every instance (``Cluster``'s two views):

- ``KeyIndex``: the chain key of each block at depth < ``DEPTH`` (a prompt's first two
  blocks) -> the instances whose prefix tree holds a page with that key, in any tier (a
  bit mask). Each instance's tree tells it as such a page enters or leaves
  (``PrefixTree.watch``), so the instances that may hold a request's first blocks are one
  dictionary read a block; every other instance's cached prefix is shorter.
- ``LoadOrder``: the instances sorted by load in blocks (queued prefill tokens / block
  tokens + decode blocks, ``kvsim.core.routing.load_blocks``; ties by index). An engine
  tells it when its load may have moved (``Engine.on_load``); it re-places only those,
  when a router next reads it (``refresh``): a request costs O(moved x log instances),
  and an engine's move at most one re-placing a request, so the cost grows with the
  engines' steps, not with the instances.

Both change nothing in an instance; both give, for every instance, what asking the instance
(``probe_chain``, ``queue_load``) would: the router's decisions do not depend on them
being used (tests/test_routeindex.py replays each router both ways).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from functools import partial
from typing import Any, Callable, Iterator, Sequence

__all__ = ["DEPTH", "KeyIndex", "LoadOrder", "bits"]

DEPTH = 2  # blocks of a prompt the key index knows


def bits(mask: int) -> list[int]:
    """The positions of a mask's set bits, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class KeyIndex:
    """Chain key (a block at depth < DEPTH) -> bit mask of the instances holding it."""

    __slots__ = ("masks",)

    def __init__(self) -> None:
        self.masks: dict[bytes, int] = {}

    def watch(self, trees: Sequence[Any]) -> None:
        """Follow each instance's prefix tree (instance ``i``: ``trees[i]``), empty or not."""
        for i, tree in enumerate(trees):
            tell = self.watcher(i)
            for key, page in tree.items():
                if page.index < DEPTH:
                    tell(key, True)
            tree.watch, tree.watch_depth = tell, DEPTH

    def watcher(self, i: int) -> Callable[[bytes, bool], None]:
        bit, masks = 1 << i, self.masks

        def tell(key: bytes, added: bool) -> None:
            if added:
                masks[key] = masks.get(key, 0) | bit
            else:
                left = masks[key] & ~bit
                if left:
                    masks[key] = left
                else:
                    del masks[key]
        return tell

    def holding(self, keys: Sequence[bytes]) -> int:
        """The mask of the instances holding every one of ``keys`` (at most DEPTH)."""
        masks = self.masks
        m = -1
        for key in keys:
            m &= masks.get(key, 0)
            if not m:
                break
        return m


class LoadOrder:
    """The instances by load in blocks, re-placed lazily as their engines move."""

    __slots__ = ("engines", "B", "entry", "parts", "order", "moved", "q_sum", "d_sum", "_exact")

    def __init__(self, engines: Sequence[Any], block_tokens: int) -> None:
        self.engines = engines
        self.B = block_tokens
        n = len(engines)
        self.entry: list[tuple[float, int] | None] = [None] * n  # each one's place in order
        self.parts = [(0, 0)] * n                    # each one's (queued tokens, decode blocks)
        self.order: list[tuple[float, int]] = []     # (load in blocks, instance), ascending
        self.moved: set[int] = set(range(n))
        self.q_sum = self.d_sum = 0                  # the parts, summed over the instances
        # a power-of-two block: every load and every sum of them is exact in a float
        self._exact = block_tokens > 0 and block_tokens & (block_tokens - 1) == 0
        for i, e in enumerate(engines):
            e.on_load = partial(self.moved.add, i)

    def refresh(self) -> None:
        """Re-place the instances whose load moved since the last refresh."""
        if not self.moved:
            return
        engines, entry, parts, order, B = self.engines, self.entry, self.parts, self.order, self.B
        for i in self.moved:
            q, d, _, _ = engines[i].queue_load()
            new = (q / B + d, i)
            old = entry[i]
            if old is not None:
                if old == new:
                    continue
                del order[bisect_left(order, old)]
            insort(order, new)
            entry[i] = new
            oq, od = parts[i]
            parts[i] = (q, d)
            self.q_sum += q - oq
            self.d_sum += d - od
        self.moved.clear()

    def ascending(self) -> Iterator[tuple[float, int]]:
        return iter(self.order)

    def span(self) -> tuple[float, float]:
        order = self.order
        return order[0][0], order[-1][0]

    def mean(self) -> float:
        """sum(loads) / instances as the plain sum over the instances in index order
        gives it: from the running sums when every partial sum is exact (a power-of-two
        block and sums below 2**53), else summed in that order."""
        n = len(self.engines)
        if self._exact and (self.q_sum + self.d_sum * self.B) < 1 << 53:
            return (self.q_sum / self.B + self.d_sum) / n
        loads = [0.0] * n
        for load, i in self.order:
            loads[i] = load
        return sum(loads) / n
