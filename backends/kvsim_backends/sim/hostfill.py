"""The host tier's fill in the sim: a progressive or fill-before-serve host tier comes in
unit by unit at the profile's rate for its backing (``kvsim.core.datapath.fill`` for the
layout), so unit k is in at ``start + layout.seconds(k + 1, rate)``; a plan's or the
engine's wait for host slots is a timeout until the unit that holds them is in. Mode
``none`` or no host tier: the tier exists at once."""

from __future__ import annotations

from typing import Sequence

import simpy

from kvsim.core.datapath.fill import Backing, FillLayout, FillMode, layout_for, needed_watermark
from kvsim.core.spec import Level
from kvsim.settings import HostFillSettings

from .runtime import SimRuntime


class SimHostFill:
    """``fill``: the host tier's fill settings; ``profile``: the hardware profile (its fill
    rate per backing, and the driver's allocation granule for ``cumem``); ``fail_at``: a
    test hook, the fill stops before that unit (reported once in ``errors``)."""

    def __init__(self, runtime: SimRuntime, profile, page_bytes: int,
                 fill: HostFillSettings, slots: dict[Level, int], fail_at: int | None,
                 errors: list[str]):
        self.runtime = runtime
        self.layout: FillLayout | None = None
        self.fail_at = fail_at
        self.errors = errors
        self.rate = 0.0
        self.t0 = runtime.env.now
        if fill.mode is FillMode.NONE or Level.HOST not in slots:
            return
        granule = profile.host.cumem_granule if fill.backing is Backing.CUMEM else None
        self.layout = layout_for(fill.backing, page_bytes, int(slots[Level.HOST]),
                                 fill.unit_bytes, granule)
        self.rate = profile.host.fill_rate_for(fill.backing.value)

    def done_at(self, units: int) -> float:
        """When the host tier's first ``units`` units are in (its fill configured)."""
        f = self.layout
        if f is None:
            raise ValueError("the host tier has no fill configured")
        return self.t0 + f.seconds(units, self.rate)

    def slots_ready(self, slots: Sequence[int]) -> simpy.Event | None:
        """None if the host ``slots`` exist; else an event that succeeds with True once they
        do, or with False when the fill stops below them."""
        f = self.layout
        if f is None:
            return None
        units = f.units_for(needed_watermark(slots))
        fail = self.fail_at
        if fail is not None and units > fail:
            if not any("host fill stopped" in e for e in self.errors):
                self.errors.append(f"host fill stopped after {fail} of {f.units} units "
                                   f"({f.watermark(fail)} of {f.slots} slots usable): injected failure")
            return self.runtime.timeout_at(self.done_at(fail), False)
        at = self.done_at(units)
        if at <= self.runtime.env.now:
            return None
        return self.runtime.timeout_at(at, True)

    def slot_limit(self) -> int | None:
        """The host slots that will ever exist, once a failed fill stopped; else None."""
        f, fail = self.layout, self.fail_at
        if f is None or fail is None or self.runtime.env.now < self.done_at(fail):
            return None
        return f.watermark(fail)

