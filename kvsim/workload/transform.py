"""Reshaping a loaded workload: a slice of it, and who may share KV with whom.

``first_turns(workload, n)`` keeps, for every top-level session, its items up to and
including its n-th turn in replay order (a sub-agent's turns count, and a sub-agent cut
mid-way keeps its first turns). Sessions keep their scopes, ids and timing fields.

``scoped(workload, scope)`` applies ``workload.scope``: ``tenant`` (as loaded: sharing as
the trace's ids allow, within a tenant) or ``session`` (every top-level session a scope of
its own inside its tenant's, its sub-agents with it: nothing shared across sessions).

Results satisfy every invariant of kvsim.workload.model. Pure functions.
"""

from __future__ import annotations

from dataclasses import replace

from .model import Session, Turn, Workload, tenant_scope


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


SCOPES = ("tenant", "session")


def _rescope(session: Session, scope: str) -> Session:
    items = tuple(_rescope(i, scope) if isinstance(i, Session) else i for i in session.items)
    return replace(session, scope=scope, items=items)


def scoped(workload: Workload, scope: str) -> Workload:
    """The workload with ``workload.scope`` applied (module docstring)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if scope == "tenant":
        return workload
    return replace(workload, sessions=tuple(
        _rescope(s, tenant_scope(s.tenant, f"session:{s.sid}")) for s in workload.sessions))
