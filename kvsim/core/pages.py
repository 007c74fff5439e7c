"""A page: one block's KV bytes, its place, its owners and its place in the prefix tree.

Residency is explicit: ``phase`` says whether (tier, slot) holds the bytes at rest, is
the source of an in-flight move, or is a reservation for a page not yet written. Owners
are counted: ``locks`` (active requests), ``holds`` (suspended requests); ``in_tree`` says
the prefix tree refers to it. A live page is in exactly one PageState, derived from those.
A tree page's ``parent`` is the tree page of the previous block; ``nchildren`` counts tree
pages whose parent it is, so a parent is never dropped before its children. ``index`` is
also the page's depth in the prefix tree.
"""

from __future__ import annotations

from kvsim.core.types import PageState, Phase


class Page:
    # set at a page's first use, and only for a policy other than the default LRU (below)
    last_use: int
    uses: int
    score: float

    __slots__ = ("pid", "index", "key", "tag", "ntokens", "tier", "slot", "phase",
                 "locks", "holds", "in_tree", "parent", "nchildren", "priority", "last_use", "uses",
                 "score", "copy", "copy_ready")

    def __init__(self, pid: int, index: int, tier: int, slot: int, ntokens: int,
                 priority: int, phase: Phase):
        self.pid = pid
        self.index = index          # block position in its request's sequence
        self.key = b""              # chain key, set when committed
        self.tag = 0                # content tag, set when committed (0: no content yet)
        self.ntokens = ntokens      # tokens of the block this page covers
        self.tier = tier            # position in the manager's tier list (0: GPU)
        self.slot = slot
        self.phase = phase
        self.locks = 0
        self.holds = 0
        self.in_tree = False
        self.parent: Page | None = None
        self.nchildren = 0
        self.priority = priority
        # a retained disk copy (kvsim.core.retained): its disk slot (-1: none), and whether
        # its bytes are complete (False: a write-through still writing it)
        self.copy = -1
        self.copy_ready = False
        # ``last_use`` (its recency: the manager's recency counter when it last entered or
        # was touched in its tier's eviction index), ``uses`` (its uses so far) and
        # ``score`` (a value the policy may keep per page): set by the manager at a page's
        # first use, only for an eviction policy other than the default LRU (which reads
        # none of them: its pages are created without them)

    @property
    def state(self) -> PageState:
        if self.locks:
            return PageState.LOCKED
        if self.holds:
            return PageState.HELD
        return PageState.DROPPABLE

    @property
    def owned(self) -> bool:
        return bool(self.locks or self.holds)

    def __repr__(self) -> str:
        return (f"Page({self.pid}, idx={self.index}, T{self.tier}:{self.slot}, "
                f"{self.phase.name}, locks={self.locks}, holds={self.holds}, tree={self.in_tree})")
