"""Placement mechanics: a placement policy's decisions applied to a selection, the
invariants kept whatever it answers (``kvsim.core.policy.placement`` for the interface).

With the default placement (``Cascade``) none of this runs: ``Eviction`` selects and
reserves as it always has. With another, ``Eviction._select_at`` hands each non-last
tier's victims to ``_place_victims``, which splits them three ways:

- dropped: the placement said ``DROP`` and the page may go: nobody holds it, no retained
  copy, and its tree children are gone or dropped before it in this split (so children
  still leave before parents). Its slot is freed at once, as a last-tier drop's is;
- far: placed beyond the next colder tier (the host is skipped: GPU -> disk, with host
  and disk tiers). They go there if the host takes the near ones and the disk takes the
  far ones together with the host's own victims; else every moving victim goes to the
  nearest tier beyond the host that can take them all;
- near: the rest, to the next colder tier (or beyond it, as without a placement, when it
  is full of pages that cannot leave).

``_reserve_placed`` applies such a selection. The last tier's victims and reclaimed copies
are applied once, by the first of its (at most two) reservations in one plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvsim.core.copies import Copies, take_back_split
from kvsim.core.errors import CoreError
from kvsim.core.pages import Page
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.policy.placement import DROP
from kvsim.core.spec import Level
from kvsim.core.types import Phase

if TYPE_CHECKING:
    from kvsim.core.policy.base import EvictionPolicy
    from kvsim.core.policy.placement import PlacementPolicy

# ``kvsim.core.eviction``'s Selection and PlanRecord (that module builds on this one)
Selection = Any
PlanRecord = Any


class Placing(Copies):
    """Mixin of TierManager (its tiers, placement policy, clock and eviction mechanics)."""

    # set by TierManager.__init__; declared here for the type checker (and mypyc)
    placement: "PlacementPolicy"
    _placing: bool
    _levels: list[Level]
    clock: int
    _fast: bool
    policies: list["EvictionPolicy"]

    def _split(self, t: int, victims: list[Page]) -> tuple[list[Page], list[Page], list[Page]]:
        """(dropped, near, far) of tier ``t``'s victims, each in the victims' order."""
        levels = self._levels
        n = len(levels)
        last = n - 1
        place = self.placement.place
        clock = self.clock
        drops: list[Page] = []
        near: list[Page] = []
        far: list[Page] = []
        gone: dict[Page, int] = {}  # page -> its children dropped so far in this split
        for p in victims:
            d = place(p, t, levels, clock)
            if d == DROP:
                if p.copy >= 0:  # a ready copy is taken back; one being written: cascade
                    (far if p.copy_ready and t + 1 < last else near).append(p)
                    continue
                if not p.holds and p.nchildren == gone.get(p, 0):
                    drops.append(p)
                    q = p.parent
                    if q is not None:
                        gone[q] = gone.get(q, 0) + 1
                    continue
                near.append(p)  # held, or a child still there: it cascades
            elif isinstance(d, bool) or not isinstance(d, int) or not t < d < n:
                raise CoreError(f"placement {self.placement.name!r} sent a page of tier {t} "
                                f"to {d!r}; expected a colder tier ({t + 1}..{last}) or DROP")
            elif d == t + 1:
                near.append(p)
            else:
                far.append(p)
        return drops, near, far

    def _place_victims(self, t: int, victims: list[Page], exclude: set | None,
                       sel: "Selection") -> tuple[list[Page], int, bool | None]:
        """Apply the placement to tier ``t``'s victims: (the victims still to place, the
        first tier to try for them, and None), or (.., .., the selection's outcome) when
        they are placed already."""
        drops, near, far = self._split(t, victims)
        sel.drops[t] = drops  # type: ignore[index]
        if not near and not far:
            sel.victims[t] = []
            return [], t + 1, True
        if not far:
            return near, t + 1, None
        if self._select_split(t, near, far, exclude, sel):
            return [], t + 1, True
        return near + far, t + 2, None  # the host cannot take them: all go further

    def _select_split(self, t: int, near: list[Page], far: list[Page], exclude: set | None,
                      sel: "Selection") -> bool:
        """``near`` to tier t + 1 and ``far`` to the last tier (the disk), which also takes
        the victims tier t + 1 sends it."""
        h = t + 1
        last = len(self.tiers) - 1
        disk = self._disk_pos
        if near and not self._select_at(h, len(near), exclude, True, sel):  # type: ignore[attr-defined]
            self._forget(sel, h)
            return False
        need = 0
        if sel.dest[h] == last:  # the host's own victims that the disk must take in
            need = sum(1 for v in sel.victims[h] if v not in sel.taking)
        take = take_back_split(far)[0] if last == disk and self._retained else []
        sel.taking.update(take)
        if not self._select_at(last, need + len(far) - len(take), exclude, True, sel):  # type: ignore[attr-defined]
            sel.taking.difference_update(take)
            self._forget(sel, h)
            return False
        sel.victims[t] = near
        sel.dest[t] = h
        sel.far[t] = far  # type: ignore[index]
        return True

    def _forget(self, sel: "Selection", start: int) -> None:
        """Forget the selection of tiers ``start`` on (a branch that failed)."""
        for j in range(start, len(self.tiers)):
            sel.victims[j] = []
            sel.drops[j] = []  # type: ignore[index]
            sel.far[j] = []  # type: ignore[index]
            sel.dest[j] = 0
        if start <= self._disk_pos:
            sel.reclaim = []

    def _reserve_placed(self, pos: int, n: int, sel: "Selection", rec: "PlanRecord",
                        batches: list[Batch], incoming: bool) -> list[int]:
        """``Eviction._reserve`` for a selection made with a placement policy."""
        tier = self.tiers[pos]
        if tier.is_last:  # (victims and copies applied by the first reservation of a plan)
            victims = sel.victims[pos]
            if victims:
                if not self._fast:
                    self.policies[pos].on_evict(victims, self.clock)
                self._drop_each(tier, victims)  # type: ignore[attr-defined]
                sel.victims[pos] = []
            if sel.reclaim:
                self._reclaim(sel.reclaim)
                sel.reclaim = []
            return tier.alloc_many(n) if incoming else []
        near = sel.victims[pos]
        drops = sel.drops[pos]  # type: ignore[index]
        far = sel.far[pos]  # type: ignore[index]
        freed = len(near) + len(drops) + len(far)
        slots = tier.alloc_many(n - freed) if incoming else []
        if not freed:
            return slots
        if not self._fast:
            self.policies[pos].on_evict(drops + near + far, self.clock)
        if drops:
            self._drop_each(tier, drops)  # type: ignore[attr-defined]
            if incoming:
                slots.extend(tier.alloc_many(len(drops)))
        stage = len(self.tiers) - 2 - pos  # deeper sources first: their slots are reused above
        handed: list[int] = []
        for d, group in ((sel.dest[pos], near), (len(self.tiers) - 1, far)):
            if not group:
                continue
            take, write = (take_back_split(group) if d == self._disk_pos and sel.taking
                           else ([], group))
            tier.index_discard_each(group)
            for v in group:
                v.phase = Phase.MOVING
            if write:
                dst = self._reserve(d, len(write), sel, rec, batches)  # type: ignore[attr-defined]
                handed.append(self._add_batch(rec, batches, BatchKind.EVICT, pos, d, write,  # type: ignore[attr-defined]
                                              dst, stage))
            if take:  # onto their retained copies: no longer reclaimable
                copies = self.tiers[d].copies
                for v in take:
                    del copies[v]
                handed.append(self._add_batch(rec, batches, BatchKind.TAKEBACK, pos, d, take,  # type: ignore[attr-defined]
                                              [v.copy for v in take], stage))
            if incoming:
                slots.extend([v.slot for v in write])
                slots.extend([v.slot for v in take])
        if incoming:
            rec.handed[pos] = handed
        return slots
