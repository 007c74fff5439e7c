"""A request as the tier manager sees it: the blocks one client owns and their pages.

One Request may live across the turns of a session (``TierManager.prepare`` declares each
turn's prompt). Its ``state`` is one ReqState; ``pages[i]`` holds block ``i``; the first
``committed`` pages have a key (committed or matched); ``plan`` is the id of the plan in
flight for it (-1: none; a plan moving its fixed state is not named); ``ahead`` holds the chain keys of blocks ``ahead_from`` on, when
the manager hashed them ahead of their commit (a policy wanted them at ``prepare``). The
manager owns every field; callers only read them.
"""

from __future__ import annotations

from typing import Hashable

from kvsim.core.keys import BlockIds, scope_root
from kvsim.core.pages import Page
from kvsim.core.types import ReqState


class Request:
    """A sequence of blocks whose pages one client owns (a request, or a whole session)."""

    __slots__ = ("rid", "scope", "root", "priority", "prefix_blocks", "prefix_priority",
                 "blocks", "pages", "tokens", "committed", "state", "hit_by_level", "plan",
                 "ahead", "ahead_from", "fixed", "fixed_version")

    def __init__(self, rid: int, scope: Hashable, priority: int):
        self.rid = rid
        self.scope = scope
        self.root = scope_root(scope)
        self.priority = priority  # of the pages it computes, but those of its prefix:
        self.prefix_blocks = 0    # its first blocks (a shared tools + system prefix) ...
        self.prefix_priority = priority  # ... get this one
        self.blocks: list[BlockIds] = []
        self.pages: list[Page] = []
        self.tokens = 0           # tokens the pages cover
        self.committed = 0        # leading pages that have a key (committed or matched)
        self.state = ReqState.SUSPENDED
        self.hit_by_level: tuple[int, ...] = (0, 0, 0)  # cached tokens of the last create/prepare, by Level
        self.plan = -1            # pid of the plan in flight for this request
        self.ahead: list[bytes] = []  # chain keys of blocks ahead_from.. (hashed early)
        self.ahead_from = 0
        self.fixed: list[Page] = []  # its fixed state's pages (kvsim.core.statepages): no
        #                              blocks, never in the tree or an eviction index
        self.fixed_version = 0    # times its state was written (its content tags follow it)

    @property
    def cached_tokens(self) -> int:
        return sum(self.hit_by_level)

    def __repr__(self) -> str:
        return f"Request({self.rid}, {self.state.name}, pages={len(self.pages)}, tokens={self.tokens})"
