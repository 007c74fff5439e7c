"""The prefix tree: chain key -> page, for pages committed by some request.

Match is read-only (probe_reuse relies on it): it walks the request's blocks, hashing
each onto its parent's key, and stops at the first block not in the tree or whose page
covers fewer tokens than the request needs from that block (a partial page is reusable
as a prefix of the block). Insert links a page to its parent; remove requires a leaf.

``watch`` (a cluster's key index, ``kvsim.run.routeindex``): when set, it is told
``watch(key, True)`` as a page at depth < ``watch_depth`` enters the tree and
``watch(key, False)`` as it leaves, so that a router can find the instances holding a
request's first blocks without asking each one.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from kvsim.core.keys import BlockIds, chain_key
from kvsim.core.pages import Page


class PrefixTree:
    __slots__ = ("_by_key", "watch", "watch_depth")

    def __init__(self) -> None:
        self._by_key: dict[bytes, Page] = {}
        self.watch: Callable[[bytes, bool], None] | None = None
        self.watch_depth = 0                 # pages at a depth below it are told to watch

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: bytes) -> Page | None:
        return self._by_key.get(key)

    def match(self, parent_key: bytes, blocks: Sequence[BlockIds], need_tokens: Sequence[int]
              ) -> tuple[list[Page], list[bytes]]:
        """Pages for the longest cached prefix of ``blocks``, and the keys of those blocks.

        ``parent_key`` is the key before blocks[0]; ``need_tokens[i]`` the tokens the
        caller needs from block i. Changes nothing.
        """
        pages: list[Page] = []
        keys: list[bytes] = []
        key = parent_key
        for ids, need in zip(blocks, need_tokens):
            key = chain_key(key, ids)
            page = self._by_key.get(key)
            if page is None or page.ntokens < need:
                break
            pages.append(page)
            keys.append(key)
        return pages, keys

    def insert(self, page: Page, key: bytes, parent: Page | None) -> bool:
        """Make ``page`` the tree's page for ``key``; False if the key already has one."""
        if key in self._by_key:
            return False
        self._by_key[key] = page
        page.key = key
        page.in_tree = True
        page.parent = parent
        if parent is not None:
            parent.nchildren += 1
        watch = self.watch
        if watch is not None and page.index < self.watch_depth:
            watch(key, True)
        return True

    def remove(self, page: Page) -> None:
        assert page.nchildren == 0, "a child never outlives its parent"
        del self._by_key[page.key]
        watch = self.watch
        if watch is not None and page.index < self.watch_depth:
            watch(page.key, False)
        page.in_tree = False
        if page.parent is not None:
            page.parent.nchildren -= 1
            page.parent = None

    def remove_each(self, pages: Iterable[Page]) -> None:
        """``remove`` for each page in order (every one in the tree; children first)."""
        by_key, watch, depth = self._by_key, self.watch, self.watch_depth
        for page in pages:
            assert page.nchildren == 0, "a child never outlives its parent"
            del by_key[page.key]
            if watch is not None and page.index < depth:
                watch(page.key, False)
            page.in_tree = False
            parent = page.parent
            if parent is not None:
                parent.nchildren -= 1
                page.parent = None

    def pages(self) -> Iterable[Page]:
        return self._by_key.values()

    def items(self) -> Iterable[tuple[bytes, Page]]:
        """(key, page) for every page in the tree."""
        return self._by_key.items()
