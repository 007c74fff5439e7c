"""RealtimeRuntime: the engine's SimPy-style generator processes, run against the wall clock.

The same processes the engine runs on SimPy run here unchanged: they yield waitables
(``timeout``, ``event`` triggered by ``.succeed(value)``, ``all_of``/``any_of``,
``process``) and are resumed with the waitable's value. Backends add two kinds of
waitables that complete outside the loop: ``watch(poll)`` (a callable polled every loop
turn, e.g. a CUDA event query) and ``external()`` (an event plus a thread-safe trigger,
e.g. for a future finishing on an I/O thread).

Invariants:
- single-threaded for the processes: every callback and every generator step runs on the
  thread that called ``run``; other threads only hand completions over through a queue;
- ``now`` is monotonic. A timer's event is processed at its scheduled time (``now`` reads
  exactly that time, as on SimPy, even when the loop is a little late; the lateness is
  kept in ``max_lag_s``); an external completion is processed at the wall-clock time it
  was seen. ``time_scale`` is sim seconds per wall second;
- events are processed in order of (time, insertion): a triggered event's callbacks run
  after the callbacks already queued at that time, never re-entrantly;
- a failed event nobody waited for raises out of ``run`` (bugs surface, as on SimPy).
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import queue
import sys
import time
from collections import deque
from typing import Any, Callable, Generator, Iterable

_PENDING = object()
_PR_SET_TIMERSLACK = 29
_libc = None


def _set_timer_slack(ns: int) -> bool:
    """Linux: this thread's timer slack in nanoseconds (how late a sleep may wake); True
    if set. Elsewhere, or if the call fails, False and nothing changes."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        return _libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class Event:
    """A waitable. ``succeed(value)`` / ``fail(exc)`` trigger it once."""

    __slots__ = ("rt", "callbacks", "_value", "_ok", "defused")

    def __init__(self, rt: "RealtimeRuntime"):
        self.rt = rt
        self.callbacks: list[Callable[["Event"], None]] | None = []
        self._value: Any = _PENDING
        self._ok = True
        self.defused = False

    @property
    def triggered(self) -> bool:
        return self._value is not _PENDING

    @property
    def processed(self) -> bool:
        return self.callbacks is None

    @property
    def ok(self) -> bool:
        return self._ok

    @property
    def value(self) -> Any:
        if self._value is _PENDING:
            raise AttributeError("the event has no value yet")
        return self._value

    def succeed(self, value: Any = None) -> "Event":
        if self.triggered:
            raise RuntimeError(f"{self!r} was already triggered")
        self._ok, self._value = True, value
        self.rt._schedule_now(self)
        return self

    def fail(self, exc: BaseException) -> "Event":
        if self.triggered:
            raise RuntimeError(f"{self!r} was already triggered")
        if not isinstance(exc, BaseException):
            raise TypeError(f"fail() needs an exception, got {exc!r}")
        self._ok, self._value = False, exc
        self.rt._schedule_now(self)
        return self


class Timeout(Event):
    __slots__ = ("delay",)

    def __init__(self, rt: "RealtimeRuntime", delay_s: float, value: Any = None):
        if delay_s < 0:
            raise ValueError(f"delay_s: got {delay_s!r}; expected >= 0")
        super().__init__(rt)
        self.delay = delay_s
        self._ok, self._value = True, value
        rt._schedule_at(rt.now + delay_s, self)


class Process(Event):
    """Runs a generator; succeeds with its return value (fails with its exception)."""

    __slots__ = ("gen", "target")

    def __init__(self, rt: "RealtimeRuntime", gen: Generator):
        if not hasattr(gen, "send") or not hasattr(gen, "throw"):
            raise TypeError(f"process() needs a generator, got {gen!r}")
        super().__init__(rt)
        self.gen = gen
        self.target: Event | None = None
        start = Event(rt)
        start.callbacks.append(self._resume)
        start.succeed(None)

    @property
    def is_alive(self) -> bool:
        return not self.triggered

    def _resume(self, ev: Event) -> None:
        while True:
            try:
                if ev._ok:
                    nxt = self.gen.send(ev._value)
                else:
                    ev.defused = True
                    nxt = self.gen.throw(ev._value)
            except StopIteration as stop:
                self.target = None
                self.succeed(stop.value)
                return
            except BaseException as exc:  # the process died: its waiters see the error
                self.target = None
                self.fail(exc)
                return
            if not isinstance(nxt, Event):
                bad = Event(self.rt)  # throw the mistake into the generator
                bad.callbacks, bad._ok = None, False
                bad._value = TypeError(f"a process yielded {nxt!r}, not a waitable of this runtime")
                ev = bad
                continue
            if nxt.callbacks is None:  # already processed: resume at once with its value
                ev = nxt
                continue
            self.target = nxt
            nxt.callbacks.append(self._resume)
            return


class Condition(Event):
    """all_of / any_of. Succeeds with a dict {event: value} of the events triggered so far
    (in the order given); fails with the first failure among them."""

    __slots__ = ("events", "need", "done")

    def __init__(self, rt: "RealtimeRuntime", events: Iterable[Event], need_all: bool):
        super().__init__(rt)
        self.events = list(events)
        for e in self.events:
            if not isinstance(e, Event) or e.rt is not rt:
                raise TypeError(f"{e!r} is not a waitable of this runtime")
        self.need = len(self.events) if need_all else min(1, len(self.events))
        self.done = 0
        if self.need == 0:
            self.succeed({})
            return
        for e in self.events:
            if e.callbacks is None:
                self._check(e)
            else:
                e.callbacks.append(self._check)

    def _check(self, ev: Event) -> None:
        if self.triggered:
            return
        if not ev._ok:
            ev.defused = True
            self.fail(ev._value)
            return
        self.done += 1
        if self.done >= self.need:
            self.succeed({e: e._value for e in self.events if e.processed or e is ev})


class RealtimeRuntime:
    """kvsim.backend.Runtime in real time. ``time_scale``: sim seconds per wall second.

    ``poll_interval_s``: how long the loop sleeps between polls while a ``watch`` is
    pending (CUDA events); with only timers and external events pending it blocks on the
    completion queue until the next timer is due. ``tight_sleep``: ask Linux for 1 ns of
    timer slack on the loop's thread while ``run`` runs (``prctl(PR_SET_TIMERSLACK)``);
    with the default 50 us slack a 20 us poll sleeps about 70 us, which every short
    transfer's completion waited for. A no-op elsewhere.
    ``switch_interval_s``: Python's GIL switch interval while ``run`` runs (restored after;
    None: left alone). The loop runs Python for milliseconds at a time, and an I/O thread
    that needs the GIL to finish a disk piece waits for it up to the interval: on the H200
    machine a one-page (2 MiB) disk write beside a thread running Python took 21.9 ms (p50)
    at CPython's default 5 ms, 2.80 at 0.5 ms and 1.55 at 0.1 ms, against ~1.05 alone.
    """

    def __init__(self, time_scale: float = 1.0, start: float = 0.0, poll_interval_s: float = 20e-6,
                 tight_sleep: bool = True, switch_interval_s: float | None = 1e-4):
        if not time_scale > 0:
            raise ValueError(f"time_scale: got {time_scale!r}; expected sim seconds per wall second > 0")
        if poll_interval_s < 0:
            raise ValueError(f"poll_interval_s: got {poll_interval_s!r}; expected >= 0")
        self.time_scale = float(time_scale)
        self.poll_interval_s = float(poll_interval_s)
        self.tight_sleep = bool(tight_sleep)
        if switch_interval_s is not None and not switch_interval_s > 0:
            raise ValueError(f"switch_interval_s: got {switch_interval_s!r}; expected seconds > 0 or None")
        self.switch_interval_s = switch_interval_s
        self._start = float(start)
        self._wall0 = time.perf_counter()
        self._now = float(start)
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, Event]] = []
        self._ready: deque[Event] = deque()
        self._watches: list[tuple[Callable[[], tuple[bool, Any]], Event]] = []
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._externals = 0  # external events handed out and not yet triggered
        self.max_lag_s = 0.0  # worst lateness of a timer, in sim seconds
        self._shared: dict[str, Any] = {}  # the node's shared parts, by name (``shared``)

    # -- the Runtime protocol -------------------------------------------------------

    @property
    def now(self) -> float:
        return self._now

    def shared(self, name: str, make: Callable[[], Any]) -> Any:
        """The node's shared part ``name`` (built by ``make`` the first time; the loop's
        thread builds and reads them all)."""
        part = self._shared.get(name)
        if part is None:
            part = self._shared[name] = make()
        return part

    def wall_now(self) -> float:
        """The wall clock, in sim seconds since start (what ``now`` would be if idle)."""
        return self._start + (time.perf_counter() - self._wall0) * self.time_scale

    def timeout(self, delay_s: float, value: Any = None) -> Event:
        return Timeout(self, float(delay_s), value)

    def event(self) -> Event:
        return Event(self)

    def all_of(self, waitables: Iterable[Event]) -> Event:
        return Condition(self, waitables, need_all=True)

    def any_of(self, waitables: Iterable[Event]) -> Event:
        return Condition(self, waitables, need_all=False)

    def process(self, gen: Generator) -> Process:
        return Process(self, gen)

    def run(self, until: Event | float | None = None) -> Any:
        """Run until ``until`` (an event: processed; a number: that sim time) or idle.
        Returns the event's value when ``until`` is an event."""
        if self.switch_interval_s is None:
            return self._run(until)
        before = sys.getswitchinterval()
        sys.setswitchinterval(self.switch_interval_s)
        try:
            return self._run(until)
        finally:
            sys.setswitchinterval(before)

    def _run(self, until: Event | float | None) -> Any:
        # The clock runs only inside run(): whatever happened since the runtime was made
        # (building a backend, say) or since the last run() returned is not sim time.
        self._wall0 = time.perf_counter() - (self._now - self._start) / self.time_scale
        if self.tight_sleep:
            _set_timer_slack(1)
        stop_at = None
        if isinstance(until, Event):
            if until.rt is not self:
                raise TypeError("until: an event of another runtime")
        elif until is not None:
            stop_at = float(until)
            if stop_at < self._now:
                raise ValueError(f"until: {stop_at} is in the past (now is {self._now})")
        while True:
            if isinstance(until, Event) and until.processed:
                if not until._ok:
                    until.defused = True
                    raise until._value
                return until._value
            if not self._step(stop_at):
                if stop_at is not None:
                    self._sleep_until(stop_at)
                    self._now = max(self._now, stop_at)
                    return None
                if isinstance(until, Event):
                    raise RuntimeError("run(until=event): nothing left to run and the event "
                                       "was never triggered")
                return None

    # -- for backends ----------------------------------------------------------------

    def watch(self, poll: Callable[[], tuple[bool, Any]]) -> Event:
        """An event that succeeds with ``value`` once ``poll()`` returns ``(True, value)``.
        ``poll`` runs on the loop thread, once per loop turn while pending."""
        ev = Event(self)
        self._watches.append((poll, ev))
        return ev

    def external(self) -> tuple[Event, Callable[[Any], None]]:
        """An event and a thread-safe ``trigger(value)`` that succeeds it from any thread."""
        ev = Event(self)
        self._externals += 1
        fired = []

        def trigger(value: Any = None) -> None:
            if fired:
                raise RuntimeError("an external completion was triggered twice")
            fired.append(True)
            self._inbox.put((ev, value))

        return ev, trigger

    def wall_to_sim(self, wall_s: float) -> float:
        return wall_s * self.time_scale

    def sim_to_wall(self, sim_s: float) -> float:
        return sim_s / self.time_scale

    # -- the loop ----------------------------------------------------------------------

    def _schedule_now(self, ev: Event) -> None:
        self._ready.append(ev)

    def _schedule_at(self, t: float, ev: Event) -> None:
        heapq.heappush(self._timers, (t, next(self._seq), ev))

    def _wall_of(self, t: float) -> float:
        return self._wall0 + (t - self._start) / self.time_scale

    def _process(self, ev: Event) -> None:
        cbs, ev.callbacks = ev.callbacks, None
        for cb in cbs or ():
            cb(ev)
        if not ev._ok and not ev.defused:
            raise ev._value

    def _drain_external(self, block_s: float) -> bool:
        got = False
        try:
            item = self._inbox.get(timeout=block_s) if block_s > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return False
        while True:
            ev, value = item
            self._externals -= 1
            self._now = max(self._now, self.wall_now())
            ev.succeed(value)
            got = True
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return got

    def _poll_watches(self) -> bool:
        if not self._watches:
            return False
        fired, keep = [], []
        for poll, ev in self._watches:
            done, value = poll()
            (fired if done else keep).append((ev, value) if done else (poll, ev))
        self._watches = keep
        if fired:
            self._now = max(self._now, self.wall_now())
            for ev, value in fired:
                ev.succeed(value)
        return bool(fired)

    def _step(self, stop_at: float | None) -> bool:
        """Process one event, waiting for one if needed. False: nothing left before stop_at."""
        while True:
            if self._ready:
                self._process(self._ready.popleft())
                return True
            self._drain_external(0)
            self._poll_watches()
            if self._ready:
                continue
            next_t = self._timers[0][0] if self._timers else None
            if next_t is not None and stop_at is not None and next_t > stop_at:
                next_t = None  # only timers after stop_at: they wait for a later run()
            if next_t is not None:
                lag = self.wall_now() - next_t
                if lag >= 0:
                    t, _, ev = heapq.heappop(self._timers)
                    self.max_lag_s = max(self.max_lag_s, lag)
                    self._now = max(self._now, t)
                    self._process(ev)
                    return True
                deadline = next_t
            else:
                if not self._watches and not self._externals:
                    return False  # idle before stop_at
                if stop_at is not None and self.wall_now() >= stop_at:
                    return False
                deadline = stop_at
            # wait: for the deadline, a completion, or the next poll
            wait = None if deadline is None else max(0.0, self._wall_of(deadline) - time.perf_counter())
            if self._watches:
                wait = self.poll_interval_s if wait is None else min(wait, self.poll_interval_s)
            if self._externals:
                self._drain_external(wait if wait is not None else 0.05)
            elif wait:
                time.sleep(wait)

    def _sleep_until(self, t: float) -> None:
        delay = self._wall_of(t) - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
