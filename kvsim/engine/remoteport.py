"""An engine's side of the remote tier (``cache.remote``): what it finds there, what it
fetches, what it sends there.

- Match (at a turn's prepare): after the prefix the instance holds, the following full
  blocks whose chain keys the cluster's store holds (``kvsim.core.remotestore``) are the
  turn's remote hit (``row.hit_remote``), up to the last block before the prompt's last
  token (a prefill always computes at least one token, as for a local hit). Only a local
  prefix that ends on a block boundary is extended.
- Fetch (when the turn's prefill would start): its GPU pages for those blocks are grown
  as a prefill chunk's are, then their bytes come over the node's network link (and its
  PCIe link, without GPUDirect: ``kvsim_backends.sim.network``); meanwhile the turn waits
  (``TurnState.GROWING``), as for an onboarding; then its pages are committed and
  written, as computed ones: they join the instance's prefix tree, and its prefill goes
  on from after them.
- Put (at each step boundary): the full pages the instance's manager dropped since
  (``TierManager.dropped``; a partial page's key would stand for its whole block) whose
  keys are neither in the store nor on their way are sent over the node's link in one
  batch; they are in the store once it lands. With ``write_through`` a turn's full pages
  are offered too when it ends (the store then holds whole prefixes, not only the
  leaves an instance dropped: a chain with a hole is found only up to the hole).

A key matched stays in the store (shared by every instance). Nothing here decides a
policy: the store keeps its order, the manager its pages.
"""

from __future__ import annotations

from typing import Any, Callable

from kvsim.core.keys import chain_key
from kvsim.core.remotestore import RemoteStore
from kvsim.core.types import ReqState
from kvsim.engine.live import Live, TurnState


class RemotePort:
    """One engine's use of the cluster's remote store over its node's network link."""

    def __init__(self, store: RemoteStore, network: Any, page_bytes: int,
                 write_through: bool = False):
        self.store = store
        self.network = network  # its backend's: ``get(nbytes)``, ``put(nbytes)`` -> waitable
        self.page_bytes = page_bytes
        self.write_through = write_through
        self.fetches = 0

    def match(self, eng: Any, lv: Live) -> int:
        """The turn's remote hit in tokens (also ``lv.remote`` and ``lv.row.hit_remote``)."""
        B, store = eng.B, self.store
        lv.remote = lv.row.hit_remote = 0
        keys = keys_after(eng, lv, lv.req.tokens, store.__contains__)
        n = store.match(keys) * B if keys else 0
        lv.remote = lv.row.hit_remote = n
        return n

    def fetch(self, eng: Any, lv: Live) -> None:
        """Grow the turn's GPU pages over its remote hit and fetch them (or wait: a grow
        plan runs, or it was preempted; it comes back here when it runs again)."""
        if not eng._ensure(lv, lv.kv + lv.remote):
            return
        lv.state = TurnState.GROWING
        self.fetches += 1
        eng._launch(self._fetch_proc(eng, lv, lv.remote // eng.B * self.page_bytes))

    def _fetch_proc(self, eng: Any, lv: Live, nbytes: int):
        yield self.network.get(nbytes)
        eng._inflight -= 1
        lv.row.onboard_bytes += nbytes
        if lv.state is TurnState.GROWING and lv.req.state is ReqState.ACTIVE:
            n, lv.remote = lv.remote, 0
            fill = land(eng, lv, n)
            if fill.pages:
                eng.backend.fill(fill)
        eng._notify()

    def drain(self, eng: Any) -> None:
        """Offer the pages the manager dropped since the last call; send the new ones."""
        dropped = eng.mgr.dropped
        if dropped:
            eng.mgr.dropped = []
            self._offer(eng, dropped)

    def finished(self, eng: Any, req: Any) -> None:
        """A turn ended (its pages committed): with write-through, offer its pages."""
        if self.write_through:
            self._offer(eng, req.pages)

    def _offer(self, eng: Any, pages: Any) -> None:
        B = eng.B
        keys = self.store.offer([p.key for p in pages if p.key and p.ntokens == B])
        if keys:
            eng._launch(self._put_proc(eng, keys))

    def _put_proc(self, eng: Any, keys: list[bytes]):
        yield self.network.put(len(keys) * self.page_bytes)
        eng._inflight -= 1
        self.store.landed(keys)
        eng._notify()


def keys_after(eng: Any, lv: Live, start: int, has: Callable[[bytes], bool],
               limit: int = -1) -> list[bytes]:
    """The chain keys of the turn's full blocks after its first ``start`` tokens (the
    prefix its request holds), up to
    the block before its prompt's last token (a prefill computes at least one token) and
    at most ``limit`` (-1: no limit), while ``has(key)``. None after a partial last page
    (or one not yet committed: nothing follows it)."""
    req, B = lv.req, eng.B
    pages = req.pages
    k = start // B
    if start != k * B or len(pages) < k or (k and not pages[k - 1].key):
        return []
    parent = pages[k - 1].key if k else req.root
    end = (lv.prompt - 1) // B
    if limit >= 0 and k + limit < end:
        end = k + limit
    keys: list[bytes] = []
    for i in range(k, end):
        parent = chain_key(parent, lv.blocks[i])
        if not has(parent):
            break
        keys.append(parent)
    return keys


def land(eng: Any, lv: Live, n: int) -> Any:
    """``n`` tokens fetched from outside the turn's rank (its GPU pages over them grown
    and written) become its KV: its prefill goes on after them, they join its prefix
    tree, and it runs again. Returns the commit's fill (the pages whose bytes the caller
    accounts for: written as computed, or checked)."""
    lv.kv += n
    lv.prefill_left -= n
    d = n if n < lv.queued else lv.queued
    lv.queued -= d
    eng.queued_tokens -= d
    eng._load_moved()  # (a cluster's load order follows queued_tokens)
    fill = eng.mgr.commit(lv.req, lv.kv)
    lv.state = TurnState.RUNNING
    return fill
