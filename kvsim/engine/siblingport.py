"""An engine's side of a shared host tier (``node.host: shared``): the blocks a sibling
rank of its node holds in host or disk, onboarded into this rank.

The remote port's pattern (``kvsim.engine.remoteport``), with the node's other ranks in
the store's place:

- Match (at a turn's prepare): after the prefix the rank holds, the following full
  blocks whose pages one sibling could lend (``TierManager.lendable``: in the tree under
  the chain key, full, resident in host or disk; a read-only probe) are the turn's
  sibling hit, in ``lv.remote``. The sibling that holds the longest run wins (the
  lowest rank on a tie: deterministic). Chain keys carry the reuse scope, so a tenant
  never finds another's pages.
- Fetch (when the turn's prefill would start): its GPU pages over the hit are grown as
  a prefill chunk's are; then the sibling is probed again (its pages may have moved
  since) and the run it still holds, at most the hit, is lent (``TierManager.lend``:
  pinned against eviction and against the sibling's own resume while lent). The bytes
  come over this rank's GPU link (``Backend.onboard_from``; from disk, through the
  node's disk first), one batch per source tier; meanwhile the turn waits
  (``TurnState.GROWING``). Then the lease is given back (the sibling's engine looks
  again: a resume it was refused may pass now) and the pages are committed as the
  turn's own (``remoteport.land``): they join this rank's prefix tree and its prefill
  goes on after them. They are counted as this rank's host (or disk) hits and onboard
  bytes. Nothing is written as computed: with the refcheck on, the pages' tags on this
  GPU (the sibling's bytes) are checked against what the commit expects for their keys.
  A sibling that no longer holds any of the run: the turn computes it.

The lender counts no hit (its manager's counters do not move); ``shared_pages`` and
``shared_tokens`` count, per rank, what it onboarded from siblings.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
from kvsim.core.types import ReqState
from kvsim.engine.live import Live, TurnState
from kvsim.engine.remoteport import keys_after, land
from kvsim.engine.stages import check_tags


class SiblingPort:
    """One rank's onboarding from its node's other ranks (``siblings``: objects with
    ``mgr``, ``backend`` and ``engine``, in rank order)."""

    def __init__(self, siblings: Sequence[Any], page_bytes: int):
        self.siblings = list(siblings)
        self.page_bytes = page_bytes
        self.fetches = 0
        self.shared_pages = 0
        self.shared_tokens = {"host": 0, "disk": 0}

    def _held(self, key: bytes) -> bool:
        """Whether a sibling's prefix tree has ``key`` (the chain is hashed no further
        than the first block none has)."""
        for sib in self.siblings:
            if sib.mgr.tree.get(key) is not None:
                return True
        return False

    def _best(self, keys: list[bytes]) -> tuple[Any, int]:
        """The sibling that could lend the longest run of ``keys`` from the first, and
        its length (the lowest rank on a tie; (None, 0): none)."""
        best, n = None, 0
        for sib in self.siblings:
            m = len(sib.mgr.lendable(keys))
            if m > n:
                best, n = sib, m
        return best, n

    def match(self, eng: Any, lv: Live) -> int:
        """The turn's sibling hit in tokens (also ``lv.remote``)."""
        lv.remote = 0
        if not self.siblings:
            return 0
        keys = keys_after(eng, lv, lv.req.tokens, self._held)
        _, n = self._best(keys) if keys else (None, 0)
        lv.remote = n * eng.B
        return lv.remote

    def fetch(self, eng: Any, lv: Live) -> None:
        """Grow the turn's GPU pages over its sibling hit, borrow what a sibling still
        holds of it and copy it (or wait: a grow plan runs). ``lv.remote`` 0 after it:
        nothing is left to fetch, the turn computes now."""
        if not eng._ensure(lv, lv.kv + lv.remote):
            return
        B = eng.B
        keys = keys_after(eng, lv, lv.kv, self._held, lv.remote // B)
        sib, n = self._best(keys) if keys else (None, 0)
        if sib is None:
            lv.remote = 0
            return
        lv.remote = n * B
        lease = sib.mgr.lend(keys[:n])
        lv.state = TurnState.GROWING
        self.fetches += 1
        k = lv.kv // B
        dst = [p.slot for p in lv.req.pages[k:k + n]]
        eng._launch(self._fetch_proc(eng, lv, sib, lease, dst))

    def _fetch_proc(self, eng: Any, lv: Live, sib: Any, lease: Any, dst: list[int]):
        ok = True
        for level, idx, slots in lease.by_level():
            batch = Batch(BatchKind.ONBOARD, level, Level.GPU, slots, [dst[i] for i in idx],
                          [lease.tags[i] for i in idx], self.page_bytes, 0)
            done = yield eng.backend.onboard_from(sib.backend, batch)
            ok = bool(done) and ok
        sib.mgr.give_back(lease)
        sib.engine._notify()  # (a resume refused while they were lent may pass now)
        eng._inflight -= 1
        n = len(lease)
        lv.row.onboard_bytes += n * self.page_bytes
        if lv.state is TurnState.GROWING and lv.req.state is ReqState.ACTIVE:
            lv.remote = 0
            if ok:
                B = eng.B
                host = sum(1 for x in lease.levels if x == Level.HOST) * B
                lv.row.hit_host += host
                lv.row.hit_disk += n * B - host
                self.shared_pages += n
                self.shared_tokens["host"] += host
                self.shared_tokens["disk"] += n * B - host
                fill = land(eng, lv, n * B)
                if eng.p.refcheck and fill.pages:
                    check_tags(eng.backend.read_tags(Level.GPU, fill.slots), fill.tags,
                               f"request {lv.uid}'s pages onboarded from a sibling rank")
            else:  # a copy failed: the turn computes those blocks
                lv.state = TurnState.RUNNING
        eng._notify()

    def drain(self, eng: Any) -> None:
        """(The remote port's step-boundary hook: nothing to send.)"""

    def finished(self, eng: Any, req: Any) -> None:
        """(The remote port's end-of-turn hook: nothing to offer.)"""

    def stats(self) -> dict:
        return {"fetches": self.fetches, "pages": self.shared_pages,
                "tokens": dict(self.shared_tokens)}
