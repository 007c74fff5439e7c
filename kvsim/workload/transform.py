"""Cutting a workload down to a slice: the first turns of each session.

``first_turns(workload, n)`` keeps, for every top-level session, its items up to and
including its n-th turn in replay order (a sub-agent's turns count, and a sub-agent cut
mid-way keeps its first turns). Sessions keep their scopes, ids and timing fields; the
result satisfies every invariant of kvsim.workload.model. Pure functions.
"""

from __future__ import annotations

from dataclasses import replace

from .model import Session, Turn, Workload


def _cut(session: Session, budget: int) -> tuple[Session, int]:
    """(the session cut to at most ``budget`` turns, turns kept)."""
    items = []
    kept = 0
    for item in session.items:
        if kept >= budget:
            break
        if isinstance(item, Turn):
            items.append(item)
            kept += 1
        else:
            sub, k = _cut(item, budget - kept)
            if k:
                items.append(sub)
                kept += k
    return replace(session, items=tuple(items)), kept


def first_turns(workload: Workload, n: int) -> Workload:
    """The workload with each top-level session cut to its first ``n`` turns."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"first_turns: n must be a positive integer, got {n!r}")
    sessions = tuple(_cut(s, n)[0] for s in workload.sessions)
    return replace(workload, sessions=tuple(s for s in sessions if s.items))
