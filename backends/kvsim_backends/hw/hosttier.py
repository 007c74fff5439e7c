"""The hw backend's host tier as the engine sees it: its fill started, and waited for
while the backend is built (``start_host_fill``), and which of its slots exist yet
(``HostSlots``: the Backend protocol's ``slots_ready`` and ``slot_limit`` for the host
level).

Invariants: a backend gets a host tier only once it is usable: all of it with fill mode
``none``, else its first unit (else the fill is closed and the backend refused, naming the
fill's error); the fill's error is appended to ``errors`` once, by the first wait that
learns of it.
"""

from __future__ import annotations

from typing import Any

from kvsim.core.datapath.fill import FillMode, needed_watermark
from kvsim.settings import HostFillSettings

from .hostfill import HostFill


def start_host_fill(page_bytes: int, slots: int, fill: HostFillSettings, cuda_rt,
                    fail_at_unit: int | None = None, unit_delay_s: float = 0.0,
                    turns=None) -> tuple[HostFill, dict]:
    """The host tier (``hostfill.HostFill``) of ``slots`` pages, its fill started as
    ``fill`` says, and what the backend's ``info`` reports of it. Mode ``none``: wait until
    it is all in (an unfilled CPU-mode tier is not faulted in: it grows as it is written);
    otherwise until its first unit is, so the copy path can see its mapping. Nothing
    usable by then: RuntimeError, naming the fill's error. ``turns``: the lock the node's
    fills take turns on, call by call (with ``register_chunk``)."""
    mode = fill.mode
    host = HostFill(page_bytes, slots, fill.unit_bytes, fill.backing, cuda_rt,
                    huge_pages=fill.huge_pages, numa=fill.numa,
                    prefault=mode is not FillMode.NONE, fail_at_unit=fail_at_unit,
                    unit_delay_s=unit_delay_s, register_chunk=fill.register_chunk,
                    turns=turns).start()
    need = host.slots if mode is FillMode.NONE else host.layout.watermark(1)
    if not host.wait(need):
        error = host.error
        host.close()
        raise RuntimeError(f"host tier: {error}")
    return host, {"mode": mode.value, **host.info, **host.timings()}


class HostSlots:
    """Which slots of ``fill`` (the host tier's HostFill, or None: none) exist yet.
    ``runtime``: the backend's (its ``external`` events); ``waits``: its ``Waits``;
    ``errors``: where the fill's error is reported. The backend sets ``fill`` to None when
    it closes it."""

    def __init__(self, fill: HostFill | None, runtime, waits, errors):
        self.fill = fill
        self.runtime = runtime
        self.waits = waits
        self.errors = errors
        self._reported = False

    def ready(self, slots) -> Any:
        """None if ``slots`` of the tier exist; else a waitable that succeeds with True once
        the host fill has committed them, or False if it never will (its error is reported
        in ``errors`` once)."""
        h = self.fill
        if h is None or h.watermark >= h.slots:
            return None
        r = h.ready(needed_watermark(slots))
        if r:
            return None
        if r is False:
            self._report()
            return self.waits.done(False)
        ev, trigger = self.runtime.external()

        def told(ok: bool) -> None:
            if not ok:
                self._report()
            trigger(ok)

        h.notify_when(needed_watermark(slots), told)
        return ev

    def limit(self) -> int | None:
        """The slots that will ever exist, where the fill failed (None: it did not, or there
        is no host tier)."""
        h = self.fill
        return h.limit if h is not None else None

    def _report(self) -> None:
        if not self._reported and self.fill is not None and self.fill.error:
            self._reported = True
            self.errors.append(self.fill.error)


class SharedHost:
    """A node's one host tier (``node.host: shared``), shared by its ranks' backends
    through the runtime (``Runtime.shared``): the fill, its info, and how many backends
    use it (the last to leave closes it)."""

    def __init__(self, host: HostFill, info: dict):
        self.host = host
        self.info = info
        self.users = 0

    @staticmethod
    def join(runtime, make) -> "SharedHost":
        """The node's host tier (made by ``make()`` -> (fill, info) for its first user)."""
        box = runtime.shared("host_pool", lambda: SharedHost(*make()))
        box.users += 1
        return box

    def leave(self) -> bool:
        """A backend is done with it: True while others still use it (do not close)."""
        self.users -= 1
        return self.users > 0
