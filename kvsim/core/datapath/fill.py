"""Progressive host fill: the watermark arithmetic both backends share.

A host tier reserves its address range once, at its maximum quota, and becomes usable in
*commit units* as a background worker makes them resident. The worker publishes a
*watermark*: how many slots exist (the committed prefix of the range, in slots). The
tier's allocator (``kvsim.core.tiers.Tier``) hands out recycled slots first, then fresh
ids in ascending order, so every slot it has ever handed out lies below its ``next_fresh``
and a batch into slots ``s`` needs only ``needed_watermark(s)`` slots to exist: the unit
holding its highest slot. A slot recycled once existed already (watermarks only grow).

``FillLayout`` is the arithmetic: a unit is a whole number of slots (at most
``unit_bytes``, at least one slot), so no slot straddles two commit units (a copy never
spans two registrations); the last unit may be shorter. Nothing here waits or reads a
clock: the backends publish the watermark (the hw backend's fill thread, the sim's fill
process) and the engine waits on it through the backend (``Backend.slots_ready``).

Failure: a fill that stops after ``k`` units leaves ``watermark(k)`` slots usable; the
tier is then capped there (``Tier.cap``) so no later allocation hands out a slot that
will never exist.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

UNIT_BYTES = 512 << 20  # the commit unit the fill paces progress in


class FillMode(str, enum.Enum):
    """How a host tier comes to exist. ``NONE``: at once, before the run (the sim does not
    model it; the hw backend commits it all while it is built). ``PROGRESSIVE``: in units
    after the run starts; serving starts when the first unit is in. ``BEFORE_SERVE``: in
    units after the run starts; serving starts when the last unit is in."""

    NONE = "none"
    PROGRESSIVE = "progressive"
    BEFORE_SERVE = "before_serve"


class Backing(str, enum.Enum):
    """What makes host memory resident and pinned. ``REGISTER``: an anonymous mapping of
    the whole range, each unit faulted in and registered with the driver
    (cudaHostRegister). ``PINNED``: the driver allocates pinned memory (cudaHostAlloc):
    one allocation for the whole range (the runtime API cannot place it inside a
    reserved range), so the range becomes usable at once when it returns. ``CUMEM``: the
    driver allocates pinned memory unit by unit (cuMemCreate) and maps each unit into the
    reserved range: progressive, like ``REGISTER``, with the driver's allocation path."""

    REGISTER = "register"
    PINNED = "pinned"
    CUMEM = "cumem"


@dataclass(frozen=True, slots=True)
class FillLayout:
    """``slots`` slots of ``slot_bytes`` (the reserved range), committed ``unit_slots`` at
    a time."""

    slot_bytes: int
    slots: int
    unit_slots: int

    @classmethod
    def of(cls, slot_bytes: int, slots: int, unit_bytes: int = UNIT_BYTES) -> "FillLayout":
        """The layout of ``slots`` slots whose units hold as many whole slots as fit in
        ``unit_bytes`` (at least one)."""
        for name, v in (("slot_bytes", slot_bytes), ("slots", slots), ("unit_bytes", unit_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name}: got {v!r}; expected a positive integer")
        return cls(slot_bytes, slots, min(slots, max(1, unit_bytes // slot_bytes)))

    @classmethod
    def aligned(cls, slot_bytes: int, slots: int, unit_bytes: int, granule: int) -> "FillLayout":
        """``of``, with units that are also whole ``granule``s (a driver's allocation
        granularity): as many slots as fit in ``unit_bytes``, rounded down to a multiple of
        the slots that make whole granules (at least that many)."""
        base = cls.of(slot_bytes, slots, unit_bytes)
        if isinstance(granule, bool) or not isinstance(granule, int) or granule <= 0:
            raise ValueError(f"granule: got {granule!r}; expected a positive integer")
        if base.unit_slots >= slots:  # one unit: the whole tier (its end rounds up)
            return base
        step = granule // math.gcd(slot_bytes, granule)  # slots per whole number of granules
        unit = max(step, base.unit_slots // step * step)
        return cls(slot_bytes, slots, min(slots, unit))

    @classmethod
    def whole(cls, slot_bytes: int, slots: int) -> "FillLayout":
        """One unit: the whole range at once (the pinned backing)."""
        return cls.of(slot_bytes, slots, slot_bytes * slots)

    @property
    def unit_bytes(self) -> int:
        return self.unit_slots * self.slot_bytes

    @property
    def units(self) -> int:
        return -(-self.slots // self.unit_slots)

    @property
    def nbytes(self) -> int:
        return self.slots * self.slot_bytes

    def span(self, unit: int) -> tuple[int, int]:
        """The slots ``[first, stop)`` of ``unit``."""
        if not 0 <= unit < self.units:
            raise IndexError(f"unit {unit} is outside 0..{self.units - 1}")
        first = unit * self.unit_slots
        return first, min(self.slots, first + self.unit_slots)

    def byte_span(self, unit: int) -> tuple[int, int]:
        """(offset, bytes) of ``unit`` in the range."""
        first, stop = self.span(unit)
        return first * self.slot_bytes, (stop - first) * self.slot_bytes

    def watermark(self, units_done: int) -> int:
        """Slots that exist once the first ``units_done`` units are committed."""
        if units_done <= 0:
            return 0
        return min(self.slots, units_done * self.unit_slots)

    def unit_of(self, slot: int) -> int:
        return slot // self.unit_slots

    def units_for(self, watermark: int) -> int:
        """Units that must be committed for ``watermark`` slots to exist."""
        if watermark <= 0:
            return 0
        if watermark > self.slots:
            raise ValueError(f"watermark {watermark} is beyond the {self.slots} slots reserved")
        return -(-watermark // self.unit_slots)

    def first_serve(self, mode: FillMode) -> int:
        """The watermark serving waits for: nothing (NONE), the first unit (PROGRESSIVE),
        every slot (BEFORE_SERVE)."""
        mode = FillMode(mode)
        if mode is FillMode.NONE:
            return 0
        if mode is FillMode.PROGRESSIVE:
            return self.watermark(1)
        return self.slots

    def seconds(self, units: int, bytes_per_s: float) -> float:
        """Time to commit the first ``units`` units at ``bytes_per_s``."""
        if not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s: got {bytes_per_s!r}; expected a rate > 0")
        return self.watermark(units) * self.slot_bytes / bytes_per_s


def layout_for(backing: Backing | str, slot_bytes: int, slots: int,
               unit_bytes: int = UNIT_BYTES, granule: int | None = None) -> FillLayout:
    """The layout a backing commits in, the one rule for the engine's serve watermark, the
    sim's fill and the hw backend's: the whole range at once (pinned: one driver
    allocation), or units of whole slots in ``unit_bytes`` (register), also whole
    ``granule``s of the driver's allocation where one is given (cumem: the hw backend
    passes the driver's granularity; the sim, the profile's ``host.cumem_granule``)."""
    backing = Backing(backing)
    if backing is Backing.PINNED:
        return FillLayout.whole(slot_bytes, slots)
    if backing is Backing.CUMEM and granule:
        return FillLayout.aligned(slot_bytes, slots, unit_bytes, granule)
    return FillLayout.of(slot_bytes, slots, unit_bytes)


def registration_unit(backing: Backing | str, layout: FillLayout | None) -> int | None:
    """Bytes a registration of the host tier: its fill's units when they are registered
    one by one with the driver (``register``), else None (one registration, or memory the
    driver allocated). A copy engine copy may not span two (``copypath``)."""
    if layout is None or Backing(backing) is not Backing.REGISTER:
        return None
    return layout.unit_bytes


def needed_watermark(slots: Sequence[int]) -> int:
    """The watermark at which every slot in ``slots`` exists (0 for none)."""
    if not len(slots):
        return 0
    return int(max(slots)) + 1


def ready(slots: Sequence[int], watermark: int) -> bool:
    """Every slot in ``slots`` exists at ``watermark``."""
    return needed_watermark(slots) <= watermark
