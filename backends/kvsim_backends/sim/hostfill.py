"""The host tier's fill in the sim: a progressive or fill-before-serve host tier comes in
unit by unit at the profile's rate for its backing (``kvsim.core.datapath.fill`` for the
layout), so unit k is in at ``start + layout.seconds(k + 1, rate)``; a plan's or the
engine's wait for host slots is a timeout until the unit that holds them is in. Mode
``none`` or no host tier: the tier exists at once."""

from __future__ import annotations

from typing import Sequence

import simpy

from kvsim.core.datapath.fill import UNIT_BYTES, Backing, FillLayout, FillMode, layout_for, needed_watermark
from kvsim.core.spec import Level
from kvsim.config.hardware import HardwareProfile

from .runtime import SimRuntime


class SimHostFill:
    """``host_fill``: the config's ``fill`` keys; ``fail_at``: a test hook, the fill stops
    before that unit (reported once in ``errors``)."""

    def __init__(self, runtime: SimRuntime, profile: HardwareProfile, page_bytes: int,
                 host_fill: dict | None, slots: dict[Level, int], fail_at: int | None,
                 errors: list[str]):
        self.runtime = runtime
        self.layout: FillLayout | None = None
        self.fail_at = fail_at
        self.errors = errors
        self.rate = 0.0
        self.t0 = runtime.env.now
        hf = host_fill or {}
        mode = FillMode(hf.get("mode", "none"))
        if mode is FillMode.NONE or Level.HOST not in slots:
            return
        backing = Backing(hf.get("backing", "register"))
        self.layout = layout_for(backing, page_bytes, int(slots[Level.HOST]),
                                 int(hf.get("unit", UNIT_BYTES)))
        self.rate = profile.host.fill_rate_for(backing.value)

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


def registration_unit_of(host_fill: dict | None, page_bytes: int, slots: dict) -> int | None:
    """Bytes a registration of the host tier when its fill registers it unit by unit (the
    ``register`` backing of a progressive or before-serve fill), else None (one)."""
    hf = host_fill or {}
    if FillMode(hf.get("mode", "none")) is FillMode.NONE or Level.HOST not in slots:
        return None
    if Backing(hf.get("backing", "register")) is not Backing.REGISTER:
        return None
    return layout_for(Backing.REGISTER, page_bytes, int(slots[Level.HOST]),
                      int(hf.get("unit", UNIT_BYTES))).unit_bytes
