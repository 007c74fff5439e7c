"""Placement decisions: a placement policy's answers for one tier's victims, with the
invariants kept whatever it answers (``kvsim.core.policy.placement`` for the interface).

``place_victims`` is a pure function of the victims and the policy: it changes nothing.
``Eviction`` calls it for each non-last tier's victims when the placement is not the
default (``Cascade``: then nothing here runs), and selects and reserves the three groups
it returns, each in the victims' order:

- dropped: the placement said ``DROP`` and the page may go: nobody holds it, no retained
  copy, and its tree children are gone or dropped before it in this split (so children
  still leave before parents). Its slot is freed at once, as a last-tier drop's is;
- far: placed beyond the next colder tier (the host is skipped: GPU -> disk, with host
  and disk tiers), or a page with a ready retained copy the placement would drop (it
  takes its copy back on disk: no bytes move, nothing is lost);
- near: the rest, to the next colder tier: those placed there, and those the placement
  would drop that may not go (held, a child still there, a copy still being written).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.core.errors import CoreError
from kvsim.core.policy.placement import DROP

if TYPE_CHECKING:
    from kvsim.core.pages import Page
    from kvsim.core.policy.placement import PlacementPolicy
    from kvsim.core.spec import Level


def place_victims(placement: "PlacementPolicy", t: int, victims: list["Page"],
                  levels: list["Level"], clock: int
                  ) -> tuple[list["Page"], list["Page"], list["Page"]]:
    """(dropped, near, far) of tier ``t``'s victims (``levels``: the tiers, warmest
    first; ``t`` is not the last). Raises ``CoreError`` for an answer that is neither a
    colder tier nor ``DROP``."""
    n = len(levels)
    last = n - 1
    place = placement.place
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
            raise CoreError(f"placement {placement.name!r} sent a page of tier {t} "
                            f"to {d!r}; expected a colder tier ({t + 1}..{last}) or DROP")
        elif d == t + 1:
            near.append(p)
        else:
            far.append(p)
    return drops, near, far
