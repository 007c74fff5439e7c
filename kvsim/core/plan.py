"""Plans: the read-only objects the core hands to the engine, and what the engine reports back.

A Plan groups page moves into one Batch per (source tier, destination tier) and orders the
batches in stages: every batch of stage s runs after every batch of stage s-1 completed
(a slot vacated by an eviction in one stage may be the destination of a later stage).
Batches of one stage may run concurrently. Byte and page counts are carried so backends
and statistics never recount.

Batch, Plan and Fill are read-only records, each what a frozen, slotted dataclass of its
fields (``eq=False``) would be, but written out as slotted classes whose fields are
``Final`` (the type checker refuses an assignment after ``__init__``): the core builds
one per batch, plan and commit, and a frozen dataclass's ``__init__`` sets every field
through ``object.__setattr__`` (and runs interpreted in the compiled build). As frozen
dataclasses they cost about 3% more instructions in a pure-Python Mooncake replay and 7%
in the compiled build's. tests/test_plan_records.py proves each class equals its
dataclass form: the same fields in the same order, the same constructor, the same values
read back. This module is the only place with that form.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Sequence

from kvsim.core.spec import Level


class BatchKind(enum.IntEnum):
    EVICT = 0    # warmer -> colder, to make room
    ONBOARD = 1  # colder -> GPU, for a request being resumed
    COPY = 2     # GPU -> GPU copy-on-write of a shared page a request must append to
    BACKGROUND = 3  # a copy to disk nothing waits for (write-through): disk I/O's lowest class
    TAKEBACK = 4    # warmer -> disk onto the page's retained disk copy: no bytes move
    STATE = 5       # a request's fixed state, GPU -> host on suspend, host -> GPU on resume


class Batch:
    """Pages moving from one tier to another: source slots, destination slots and the
    pages' content tags, sequences of ints of equal length (the core hands Python lists;
    a backend that needs arrays converts them, as the hw backend does with
    ``np.asarray``). Nothing changes the sequences once the batch is built. Compared and
    hashed by identity, as Plan and Fill: the sequences may be numpy arrays."""

    __slots__ = ("kind", "src", "dst", "src_slots", "dst_slots", "tags", "page_bytes", "stage")

    def __init__(self, kind: BatchKind, src: Level, dst: Level, src_slots: Sequence[int],
                 dst_slots: Sequence[int], tags: Sequence[int], page_bytes: int, stage: int):
        self.kind: Final = kind
        self.src: Final = src
        self.dst: Final = dst
        self.src_slots: Final = src_slots
        self.dst_slots: Final = dst_slots
        self.tags: Final = tags  # expected content tag of each page (0: not yet written), < 2**63
        self.page_bytes: Final = page_bytes
        self.stage: Final = stage

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
    WRITE_THROUGH = 4  # background copies to disk (``TierManager.write_through``)
    STATE = 5          # a request's fixed state moving (``kvsim.core.statepages``)


class Plan:
    """A two-phase state change. Pass it back to ``TierManager.complete`` exactly once.
    Truthy (a Refusal is falsy)."""

    __slots__ = ("pid", "kind", "batches", "new_pages")

    def __init__(self, pid: int, kind: PlanKind, batches: tuple[Batch, ...], new_pages: int = 0):
        self.pid: Final = pid
        self.kind: Final = kind
        self.batches: Final = batches
        self.new_pages: Final = new_pages  # pages a grow allocates on GPU when the plan commits

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


class Fill:
    """Pages whose content the engine must write (it just computed their KV): their slots
    and content tags, sequences of ints as a Batch's."""

    __slots__ = ("level", "slots", "tags")

    def __init__(self, level: Level, slots: Sequence[int], tags: Sequence[int]):
        self.level: Final = level
        self.slots: Final = slots
        self.tags: Final = tags

    @property
    def pages(self) -> int:
        return len(self.slots)

    def __repr__(self) -> str:
        return f"Fill({self.level.name}, pages={self.pages})"
