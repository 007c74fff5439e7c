"""The workload data model the engine consumes: Turn, Session, Workload, TraceError.

Invariants every loader and generator in this package keeps (the engine may rely on them):

- ``len(turn.hash_ids) == ceil(turn.input_tokens / workload.block_tokens)``: the ids cover
  the whole input, ``block_tokens`` tokens each, the last block possibly partial. Equal ids
  at equal positions within one reuse scope mean an identical prefix. Ids are ints that
  fit a signed 64-bit integer (the core encodes them so).
- ``input_tokens >= 1`` and ``output_tokens >= 0`` (0 happens in the agentic traces: a
  request that was cancelled or produced no text; treat it as prefill only).
- Open loop: every Turn has ``arrival_s`` (non-decreasing in file order for Mooncake) and
  every Session has ``start_s``; ``think_s`` is 0.
- Priorities: ``priority`` and ``prefix_priority`` are None (no priority given: 0) or ints
  in ``[-2**31, 2**31)``; ``0 <= prefix_tokens <= input_tokens``.
- Closed loop: ``arrival_s`` is None, and ``start_s`` too but for a session pinned to a
  start time (the synthetic burst's; ``session_start_times`` keeps it); a Turn is released
  ``think_s`` after the previous item of its session completes (the first item of a
  session: after the session starts). A nested Session is a sub-agent: it runs to completion, then its
  parent continues; it shares its parent's reuse scope.
- Tenants never share KV: a session of a tenant (the trace's ``tenant`` field) has a scope
  inside that tenant's namespace (``tenant_scope``), and a sub-agent its parent's tenant.

All classes are frozen and slotted; nothing here holds mutable state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Union

START_POLICIES = ("poisson", "concurrency")


PRIORITY_MIN, PRIORITY_MAX = -(1 << 31), (1 << 31) - 1


class TraceError(ValueError):
    """A trace file is malformed. The message starts with ``<path>:<line>: `` (JSONL) or
    ``<path>: <request path>: `` (JSON sessions) and says what was expected."""


@dataclass(frozen=True, slots=True)
class Turn:
    input_tokens: int
    output_tokens: int
    hash_ids: tuple  # tuple[int, ...]: trace blocks covering the input (last may be partial)
    think_s: float = 0.0  # closed loop: released think_s after the previous item completes
    arrival_s: float | None = None  # open loop: absolute arrival time (s, after scaling)
    # the request's priority in the cache (None: the default, 0); its first
    # ``prefix_tokens`` tokens (a shared tools + system prefix) may have one of their own
    priority: int | None = None
    prefix_tokens: int = 0
    prefix_priority: int | None = None


@dataclass(frozen=True, slots=True)
class Session:
    sid: str
    scope: str  # reuse scope; sub-agents share their parent's scope
    items: tuple  # tuple[Turn | Session, ...]; a nested Session is a sub-agent
    start_s: float | None = None  # open loop: when the session starts; closed loop: None
    tenant: str | None = None  # the trace's tenant (or user) id; None: the one tenant

    def iter_turns(self) -> Iterator[tuple["Session", Turn]]:
        """(owning session, turn) in replay order, depth first through sub-agents."""
        for item in self.items:
            if isinstance(item, Session):
                yield from item.iter_turns()
            else:
                yield self, item

    @property
    def n_turns(self) -> int:
        return sum(1 for _ in self.iter_turns())


Item = Union[Turn, Session]


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    block_tokens: int  # trace block size (512 Mooncake, 64 agentic)
    closed_loop: bool
    sessions: tuple  # tuple[Session, ...]
    # closed loop session start policy (ignored for open loop):
    start: str = "poisson"  # "poisson" (rate sessions_per_s, seeded) or "concurrency"
    sessions_per_s: float = 0.0
    concurrency: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.block_tokens, int) or self.block_tokens < 1:
            raise ValueError(f"Workload.block_tokens must be a positive int, got {self.block_tokens!r}")
        if self.start not in START_POLICIES:
            raise ValueError(f"Workload.start must be one of {START_POLICIES}, got {self.start!r}")
        if self.sessions_per_s < 0 or self.concurrency < 0:
            raise ValueError("Workload.sessions_per_s and concurrency must be >= 0")

    def iter_turns(self) -> Iterator[tuple[Session, Turn]]:
        """(owning session, turn) for every request: sessions in order, depth first."""
        for s in self.sessions:
            yield from s.iter_turns()

    @property
    def n_requests(self) -> int:
        return sum(1 for _ in self.iter_turns())

    def request_count(self) -> int:
        """Number of turns (requests), sub-agents included."""
        return self.n_requests

    @property
    def input_tokens(self) -> int:
        return sum(t.input_tokens for _, t in self.iter_turns())


TENANT_MAX_CHARS = 256


def tenant_scope(tenant: str | None, scope: str) -> str:
    """The reuse scope of a session of ``tenant`` whose trace scope is ``scope``: the
    tenant is an outer namespace, so two tenants never share a scope (and so never a
    block key, kvsim.core.keys), whatever their ids say. The tenant is JSON-quoted: no
    tenant name can make another's scope."""
    return scope if tenant is None else f"tenant:{json.dumps(tenant)}|{scope}"


def tenant_of(value, where: str) -> str | None:
    """A trace's tenant field as text (a string of 1-256 characters or an integer; absent:
    None), or TraceError starting with ``where``."""
    if value is None:
        return None
    if type(value) is int:
        return str(value)
    if type(value) is str and 0 < len(value) <= TENANT_MAX_CHARS:
        return value
    raise TraceError(f"{where}field 'tenant' must be a tenant or user id: a string of 1 to "
                     f"{TENANT_MAX_CHARS} characters or an integer, got {value!r}")


def check_start_policy(start: str, sessions_per_s: float, concurrency: int) -> None:
    """Raise ValueError unless the closed-loop start policy has the parameter it needs."""
    if start == "poisson":
        if not sessions_per_s > 0:
            raise ValueError(f"start='poisson' needs sessions_per_s > 0, got {sessions_per_s!r}")
    elif start == "concurrency":
        if not (isinstance(concurrency, int) and concurrency >= 1):
            raise ValueError(f"start='concurrency' needs concurrency >= 1, got {concurrency!r}")
    else:
        raise ValueError(f"start must be one of {START_POLICIES}, got {start!r}")
