"""What a manager shares with its node's other ranks (``node.host: shared``): its
pages, lent to a sibling rank (which leading blocks of a chain it could lend,
``lendable``; pinning them while a sibling copies them, ``lend``; letting them go,
``give_back``), and a tier's slots, drawn from a node-wide pool (``share_tier``). A
layer of TierManager's single-inheritance chain (``TierManager(Lending)``,
``Lending(Queries)``).

A page is lendable when the prefix tree holds it under the chain key, full (a block's
tokens), resident (not the source or destination of a move) and in a tier below the GPU
(host or disk: a sibling's GPU is not readable by this rank's copies). A lent page is
locked, one lock per lease: out of its tier's eviction index (no eviction moves it, no
placement drops it), and ``resume`` refuses a request that holds it (``BUSY``) until it
is given back, so its slot keeps its bytes while the borrower reads them. Giving it back
settles it where its owners say (into its tier's index at the recent end: a lent page
was just used). The lender's hit counters do not change: the borrower counts the hit.

Leases are all-or-nothing and pure bookkeeping: no bytes move here (the engine copies
them, ``kvsim.engine.siblingport``).
"""

from __future__ import annotations

from typing import Sequence

from kvsim.core.errors import CoreError
from kvsim.core.pages import Page
from kvsim.core.queries import Queries
from kvsim.core.spec import Level
from kvsim.core.tiers import SlotPool
from kvsim.core.types import Phase


class Lease:
    """Pages lent to a sibling: ``pages`` in chain order, and for each its tier's level,
    slot and content tag (what the borrower copies and what its refcheck expects)."""

    __slots__ = ("lid", "pages", "levels", "slots", "tags")

    def __init__(self, lid: int, pages: list[Page], levels: list[Level]):
        self.lid = lid
        self.pages = pages
        self.levels = levels
        self.slots = [p.slot for p in pages]
        self.tags = [p.tag for p in pages]

    def __len__(self) -> int:
        return len(self.pages)

    def by_level(self) -> list[tuple[Level, list[int], list[int]]]:
        """(level, positions in the lease, slots) for each level among the pages, warmest
        first: one copy batch each."""
        out: list[tuple[Level, list[int], list[int]]] = []
        for lv in sorted(set(self.levels)):
            idx = [i for i, x in enumerate(self.levels) if x == lv]
            out.append((lv, idx, [self.slots[i] for i in idx]))
        return out


class Lending(Queries):
    _leases: dict[int, Lease]
    _levels: list[Level]
    _next_lease: int
    lent_pages: int

    def lendable(self, keys: Sequence[bytes]) -> list[Level]:
        """The tier level of each of ``keys``, from the first, whose page this manager
        could lend now (stopping at the first it could not). Changes nothing."""
        get = self.tree.get
        full = self.tokens_per_block
        resident = Phase.RESIDENT
        levels = self._levels
        out: list[Level] = []
        for k in keys:
            p = get(k)
            if p is None or p.tier == 0 or p.phase is not resident or p.ntokens < full:
                break
            out.append(levels[p.tier])
        return out

    def lend(self, keys: Sequence[bytes]) -> Lease:
        """Pin the pages of ``keys`` (all lendable: ``lendable(keys)`` covers them) for a
        sibling's copy. CoreError, changing nothing, when one is not."""
        levels = self.lendable(keys)
        if len(levels) < len(keys):
            raise CoreError(f"lend: block {len(levels)} of {len(keys)} is not lendable")
        get = self.tree.get
        pages: list[Page] = []
        for k in keys:
            p = get(k)
            assert p is not None
            p.locks += 1
            self.tiers[p.tier].index_discard(p)
            pages.append(p)
        lease = Lease(self._next_lease, pages, levels)
        self._next_lease += 1
        self._leases[lease.lid] = lease
        self.lent_pages += len(pages)
        return lease

    def give_back(self, lease: Lease) -> None:
        """The borrower is done with the lease's pages: unpin them."""
        if self._leases.pop(lease.lid, None) is None:
            raise CoreError(f"give_back: lease {lease.lid} is not out")
        for p in lease.pages:
            p.locks -= 1
            self._settle(p, touch=False)

    def lent(self) -> dict[int, int]:
        """pid -> leases pinning it, over the leases out (for the audit)."""
        out: dict[int, int] = {}
        for lease in self._leases.values():
            for p in lease.pages:
                out[p.pid] = out.get(p.pid, 0) + 1
        return out

    def share_tier(self, level: Level, pool: SlotPool) -> None:
        """The tier at ``level`` draws its slots from ``pool`` from now on (its free
        slots: at most what the pool has left; ``kvsim.core.tiers.SlotPool``). Before
        the tier holds any slot: CoreError otherwise."""
        tier = self.tiers[self.tier_pos(level)]
        if tier.used:
            raise CoreError(f"share_tier: the {level.name} tier already holds {tier.used} slots")
        if pool.capacity - pool.used < 0:
            raise CoreError("share_tier: the pool is over its capacity")
        tier.pool = pool
