"""The host tier's fill in the sim: a progressive or fill-before-serve host tier comes in
unit by unit at the profile's rate for its backing (``kvsim.core.datapath.fill`` for the
layout). Without a ``driver`` in the profile unit k is in at ``start + layout.seconds(k +
1, rate)``. With one, each unit is first faulted in (no lock) and then holds the node's
driver lock (``driver.DriverLock``, shared by the node's ranks) for the driver's part of
it, per backing (``DriverSpec``), so the node's fills queue for the lock and every
executor call waits while they hold it; the unit's time alone is the same as without
(its rate is the profile's). A plan's or the engine's wait for host slots waits until the
unit that holds them is in. Mode ``none`` or no host tier: the tier exists at once."""

from __future__ import annotations

from typing import Mapping, Sequence

import simpy

from kvsim.core.datapath.fill import Backing, FillLayout, FillMode, layout_for, needed_watermark
from kvsim.core.spec import Level
from kvsim.settings import HostFillSettings

from .driver import DriverLock
from .runtime import SimRuntime


class SimHostFill:
    """``fill``: the host tier's fill settings; ``profile``: the hardware profile (its fill
    rate per backing, the driver's allocation granule for ``cumem``, and its ``driver``);
    ``lock``: the node's driver lock (None: the profile has no driver); ``fail_at``: a test
    hook, the fill stops before that unit (reported once in ``errors``)."""

    def __init__(self, runtime: SimRuntime, profile, page_bytes: int,
                 fill: HostFillSettings, slots: Mapping[Level, int], fail_at: int | None,
                 errors: list[str], lock: DriverLock | None = None, node: int = 0):
        self.runtime = runtime
        self.clock = runtime.clock
        self.layout: FillLayout | None = None
        self.fail_at = fail_at
        self.errors = errors
        self.rate = 0.0
        self.t0 = runtime.env.now
        self.lock = lock
        self.ends: list[float] = []  # (with the lock) when each unit came in, in order
        self._chunk: int | None = None
        self._turns: DriverLock | None = None
        self._waiters: list[tuple[int, simpy.Event]] = []  # (units, event) not yet in
        if fill.mode is FillMode.NONE or Level.HOST not in slots:
            return
        granule = profile.host.cumem_granule if fill.backing is Backing.CUMEM else None
        self.layout = layout_for(fill.backing, page_bytes, int(slots[Level.HOST]),
                                 fill.unit_bytes, granule)
        self.rate = profile.host.fill_rate_for(fill.backing.value)
        if lock is not None:
            d = profile.driver
            self._lock_share = {Backing.REGISTER: None, Backing.PINNED: 1.0,
                                Backing.CUMEM: d.cumem_lock_share}[fill.backing]
            self._register_rate = d.register_rate
            # register in calls of at most this many bytes, taking turns with the node's
            # other fills (a first-come queue of their calls: ``turns``)
            chunk = fill.register_chunk if fill.backing is Backing.REGISTER else None
            self._chunk = max(page_bytes, chunk // page_bytes * page_bytes) if chunk else None
            self._turns = runtime.shared(f"fill_turns@{node}" if node else "fill_turns", lambda: DriverLock(0.0)) if chunk else None
            lock.fills += 1
            self._unit(0)

    # -- with the driver's lock: unit by unit, on the clock ------------------------------
    def _last(self) -> int:
        """The units this fill will commit (all, or those before an injected failure)."""
        f = self.layout
        assert f is not None  # (only a configured fill commits units)
        return f.units if self.fail_at is None else min(f.units, self.fail_at)

    def _unit(self, k: int) -> None:
        """Unit ``k`` starts: fault it in (no lock), then take the lock for the driver's
        part of it."""
        lock, layout = self.lock, self.layout
        assert lock is not None and layout is not None  # (only a fill that takes the lock)
        if k >= self._last():
            lock.fills -= 1
            self._tell()
            return
        _, nbytes = layout.byte_span(k)
        total = nbytes / self.rate
        share = self._lock_share
        held = min(total, nbytes / self._register_rate) if share is None else total * share
        if self._chunk is not None:
            self.clock.wake_after(total - held, lambda _w: self._call(k, nbytes, held / nbytes))
            return
        self.clock.wake_after(total - held, lambda _w: self._locked(k, held))

    def _call(self, k: int, left: int, per_byte: float) -> None:
        """A registration call of unit ``k`` (``left`` bytes of it still to register), in
        its turn among the node's fills, holding the driver's lock for its bytes."""
        chunk, turns, lock = self._chunk, self._turns, self.lock
        assert chunk is not None and turns is not None and lock is not None  # (a paced fill)
        n = min(chunk, left)
        start = turns.hold(self.clock.now, n * per_byte)

        def take(_w) -> None:
            end = lock.fill_hold(self.clock.now, n * per_byte)
            turns.free_at = max(turns.free_at, end)
            done = (lambda _x: self._unit_in(k)) if n >= left else \
                (lambda _x: self._call(k, left - n, per_byte))
            self.clock.wake_after(end - self.clock.now, done)
        self.clock.wake_after(start - self.clock.now, take)

    def _locked(self, k: int, held: float) -> None:
        assert self.lock is not None
        end = self.lock.fill_hold(self.clock.now, held)
        self.clock.wake_after(end - self.clock.now, lambda _w: self._unit_in(k))

    def _unit_in(self, k: int) -> None:
        self.ends.append(self.clock.now)
        self._tell()
        self._unit(k + 1)

    def _tell(self) -> None:
        """Wake the waiters whose units are in (True), or never will be (False)."""
        done, over = len(self.ends), self.lock is not None and len(self.ends) >= self._last()
        keep = []
        for units, ev in self._waiters:
            if units <= done:
                self.clock.succeed(ev, True)
            elif over:
                self.clock.succeed(ev, False)
            else:
                keep.append((units, ev))
        self._waiters = keep

    # -- the Backend protocol's host-tier questions ----------------------------------
    def done_at(self, units: int) -> float:
        """When the host tier's first ``units`` units are in (its fill configured; with the
        lock, only for units already in)."""
        f = self.layout
        if f is None:
            raise ValueError("the host tier has no fill configured")
        if self.lock is not None:
            return self.ends[units - 1] if units else self.t0
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
            if self.lock is None:
                return self.runtime.timeout_at(self.done_at(fail), False)
        if self.lock is not None:
            if units <= len(self.ends):
                return None
            ev = self.clock.new_event()
            self._waiters.append((units, ev))
            self._tell()
            return ev
        at = self.done_at(units)
        if at <= self.runtime.env.now:
            return None
        return self.runtime.timeout_at(at, True)

    def slot_limit(self) -> int | None:
        """The host slots that will ever exist, once a failed fill stopped; else None."""
        f, fail = self.layout, self.fail_at
        if f is None or fail is None:
            return None
        if self.lock is not None:
            return f.watermark(fail) if len(self.ends) >= self._last() else None
        if self.runtime.env.now < self.done_at(fail):
            return None
        return f.watermark(fail)
