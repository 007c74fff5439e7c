"""Waitables for the hw backend's work, on its real-time runtime.

Each helper returns something the engine can ``yield``: an event already succeeded
(``done``), one that succeeds when a job on the I/O pool returns (``on_pool``), when a list
of futures is done (``futures``), or when a CUDA stream passes the work enqueued so far
(``cuda_done``). Invariants: no helper raises into the engine; a failure is appended to
``errors`` and the waitable succeeds with False (``fail``, ``on_pool``) or with the first
exception (``futures``), which the caller turns into False.
"""

from __future__ import annotations

import threading
from typing import Any


class Waits:
    """Waitables over ``runtime`` (a RealtimeRuntime); ``pool`` runs blocking jobs;
    ``errors`` (a deque) collects what failed."""

    def __init__(self, runtime, pool, errors):
        self.runtime = runtime
        self.pool = pool
        self.errors = errors
        self._lock = threading.Lock()

    def done(self, value: Any) -> Any:
        ev = self.runtime.event()
        ev.succeed(value)
        return ev

    def fail(self, what: str, exc: BaseException) -> Any:
        self.errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return self.done(False)

    def on_pool(self, fn, *args) -> Any:
        """Run ``fn`` on the I/O pool; the waitable succeeds with True, or False if it raised."""
        ev, trigger = self.runtime.external()

        def done(f):
            exc = f.exception()
            if exc is not None:
                self.errors.append(f"{fn.__name__}: {type(exc).__name__}: {exc}")
            trigger(exc is None)

        self.pool.submit(fn, *args).add_done_callback(done)
        return ev

    def futures(self, futures, io: list | None = None) -> Any:
        """A waitable for a list of futures: succeeds with None, or the first exception.
        ``io``: gets the futures' jobs' (start, end) (``FairPool``'s ``kv_span``) when the
        last is done."""
        ev, trigger = self.runtime.external()
        if not futures:
            trigger(None)
            return ev
        left = [len(futures)]
        first: list[BaseException] = []

        def done(f):
            exc = f.exception()
            with self._lock:
                if exc is not None and not first:
                    first.append(exc)
                left[0] -= 1
                last = left[0] == 0
            if last:
                if io is not None:
                    io.extend(sp for sp in (getattr(g, "kv_span", None) for g in futures) if sp)
                trigger(first[0] if first else None)

        for f in futures:
            f.add_done_callback(done)
        return ev

    def cuda_done(self, cp, stream, keep) -> Any:
        """A waitable for the work enqueued on ``stream`` so far (``keep`` holds the
        arrays it reads until then)."""
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return self.runtime.watch(lambda: (True, True) if ev.done and keep is not None else (False, None))
