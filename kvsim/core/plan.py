"""Plans: the read-only objects the core hands to the engine, and what the engine reports back.

A Plan groups page moves into one Batch per (source tier, destination tier) and orders the
batches in stages: every batch of stage s runs after every batch of stage s-1 completed
(a slot vacated by an eviction in one stage may be the destination of a later stage).
Batches of one stage may run concurrently. Byte and page counts are carried so backends
and statistics never recount.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from kvsim.core.spec import Level


class BatchKind(enum.IntEnum):
    EVICT = 0    # warmer -> colder, to make room
    ONBOARD = 1  # colder -> GPU, for a request being resumed
    COPY = 2     # GPU -> GPU copy-on-write of a shared page a request must append to


@dataclass(frozen=True, slots=True, eq=False)
class Batch:
    """Pages moving from one tier to another: source slots, destination slots and the
    pages' content tags, sequences of ints of equal length (the core hands Python lists;
    a backend that needs arrays converts them, as the hw backend does with
    ``np.asarray``). Nothing changes the sequences once the batch is built.

    Like Plan and Fill: compared and hashed by identity (``eq=False``): the sequences may
    be numpy arrays, whose ``==`` is elementwise, and a plan is handed back exactly once."""

    kind: BatchKind
    src: Level
    dst: Level
    src_slots: Sequence[int]
    dst_slots: Sequence[int]
    tags: Sequence[int]  # expected content tag of each page (0: not yet written), < 2**63
    page_bytes: int
    stage: int

    @property
    def pages(self) -> int:
        return len(self.src_slots)

    @property
    def nbytes(self) -> int:
        return self.pages * self.page_bytes

    def __repr__(self) -> str:
        return (f"Batch({self.kind.name}, {self.src.name}->{self.dst.name}, pages={self.pages}, "
                f"stage={self.stage})")


class PlanKind(enum.IntEnum):
    GROW = 0
    RESUME = 1
    QUOTA = 2
    EVICT = 3


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """A two-phase state change. Pass it back to ``TierManager.complete`` exactly once.
    Truthy (a Refusal is falsy)."""

    pid: int
    kind: PlanKind
    batches: tuple[Batch, ...]
    new_pages: int = 0  # pages a grow allocates on GPU when the plan commits

    def __repr__(self) -> str:
        return (f"Plan({self.pid}, {self.kind.name}, batches={len(self.batches)}, "
                f"new_pages={self.new_pages})")

    @property
    def pages(self) -> int:
        return sum(b.pages for b in self.batches)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.batches)

    @property
    def stages(self) -> tuple[tuple[Batch, ...], ...]:
        """Batches grouped by stage, in execution order (empty stages left out)."""
        out: dict[int, list[Batch]] = {}
        for b in self.batches:
            out.setdefault(b.stage, []).append(b)
        return tuple(tuple(out[s]) for s in sorted(out))


class RefusalReason(enum.IntEnum):
    NO_ROOM = 0   # not enough free or evictable slots: nothing was changed
    BUSY = 1      # a page the request needs is moving for another plan: retry after it


@dataclass(frozen=True, slots=True)
class Refusal:
    """A plan that could not be made. Falsy, so ``if not plan:`` reads naturally."""

    reason: RefusalReason
    detail: str = ""

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True, slots=True, eq=False)
class Fill:
    """Pages whose content the engine must write (it just computed their KV): their slots
    and content tags, sequences of ints as a Batch's."""

    level: Level
    slots: Sequence[int]
    tags: Sequence[int]

    @property
    def pages(self) -> int:
        return len(self.slots)

    def __repr__(self) -> str:
        return f"Fill({self.level.name}, pages={self.pages})"
