"""The tier manager's read-only queries: what a prompt would find cached (``probe_reuse``),
a tier's occupancy (``tier_stats``), the requests, pages and plans it holds, and what
the refcheck expects on GPU. A layer of TierManager's single-inheritance chain
(``TierManager(Queries)``, ``Queries(FixedState)``, ``FixedState(Planning)``): none of these changes anything.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

from kvsim.core.keys import BlockIds, scope_root
from kvsim.core.pages import Page
from kvsim.core.plan import Fill
from kvsim.core.request import Request
from kvsim.core.spec import Level
from kvsim.core.statepages import FixedState
from kvsim.core.stats import TierStats
from kvsim.core.types import Phase


class Queries(FixedState):
    _requests: dict[int, Request]

    def _needs(self, ntokens: int, nblocks: int) -> list[int]:
        b = self.tokens_per_block
        full = max(0, min(nblocks, ntokens // b))  # blocks the tokens fill
        return [b] * full + [min(b, ntokens - i * b) for i in range(full, nblocks)]

    def _nblocks(self, ntokens: int) -> int:
        return -(-ntokens // self.tokens_per_block)

    def probe_reuse(self, scope: Hashable, blocks: Sequence[BlockIds], ntokens: int
                    ) -> dict[Level, int]:
        """Tokens of the prompt a new request would find cached, by tier. Changes nothing."""
        nb = self._nblocks(ntokens)
        pages, _ = self.tree.match(scope_root(scope), blocks[:nb], self._needs(ntokens, nb))
        out = {t.level: 0 for t in self.tiers}
        for p, need in zip(pages, self._needs(ntokens, len(pages))):
            out[self.tiers[p.tier].level] += need
        return out

    def probe_chain(self, chain: Sequence[tuple[bytes, int]]) -> list[int]:
        """Tokens cached, by tier position, of the prefix whose blocks have these (chain
        key, tokens needed) pairs (``kvsim.core.keys.chain_key`` from the request's scope
        root): its longest prefix in the tree, as ``probe_reuse`` finds it. Changes nothing."""
        out = [0] * len(self.tiers)
        get = self.tree.get
        for key, need in chain:
            p = get(key)
            if p is None or p.ntokens < need:
                break
            out[p.tier] += need
        return out

    def tier_stats(self, level: Level) -> TierStats:
        pos = self.tier_pos(level)
        tier = self.tiers[pos]
        locked = held = droppable = moving = 0
        for p in self._pages.values():
            if p.tier != pos or p.phase not in (Phase.RESIDENT, Phase.MOVING):
                continue
            moving += p.phase is Phase.MOVING
            if p.locks:
                locked += 1
            elif p.holds:
                held += 1
            else:
                droppable += 1
        used = tier.used
        retained = self._retained if pos == self._disk_pos else 0
        state = sum(1 for r in self._requests.values() for p in r.fixed if p.tier == pos)
        return TierStats(level=int(tier.level), total=tier.capacity, used=used, free=tier.free,
                         locked=locked, held=held, droppable=droppable,
                         reserved=used - locked - held - droppable - retained - state,
                         moving=moving, evictable=tier.index_size(), retained=retained,
                         state=state)

    def requests(self) -> Iterable[Request]:
        return self._requests.values()

    def pages(self) -> Iterable[Page]:
        return self._pages.values()

    def plans_in_flight(self) -> int:
        return len(self._plans)

    def expected(self, req: Request) -> Fill:
        """Slots and content tags of the request's written pages on GPU (for the refcheck)."""
        ps = [p for p in req.pages if p.tag and p.tier == 0 and p.phase is Phase.RESIDENT]
        return Fill(Level.GPU, [p.slot for p in ps], [p.tag for p in ps])
