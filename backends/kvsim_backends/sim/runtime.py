"""SimRuntime: the engine's Runtime protocol over a SimPy environment (simulated time).

Each runtime owns its own ``simpy.Environment``; two runtimes in one process never share
state. Waitables are SimPy events: a process yields them and resumes with their value.

``run`` steps SimPy's clock with its own loop, the one ``Environment.step`` runs (the same
order, the same callbacks, a failed event crashes the run the same way), and ``process``
drives a generator the way ``simpy.Process`` does (``_Proc``), so that the compiled build
runs both as C; a ``Clock`` puts bare entries on SimPy's queue for callbacks (``Wake``:
what a ``Timeout`` with that callback would be to the loop; backends use them for their
internal wake-ups, which nothing yields on) and makes and triggers events, without SimPy's
interpreted code (the same fields, the same queue entries), and reads the time as
``env._now`` (``env.now`` is an interpreted property): the backend creates, triggers and
reads these hundreds of thousands of times in a replay.

This is the one module that touches SimPy's private names (``Environment._queue``,
``_eid``, ``_now``; ``Event._ok``, ``_value``, ``_defused``; the queue's entry layout):
the rest of the sim backend goes through ``Clock`` and ``SimRuntime``. They are those of
SimPy 4.1, the range pyproject.toml pins; tests/test_sim_backend.py checks that they are
there and that this loop runs processes and callbacks in plain SimPy's order.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Callable, Final, Iterable

import simpy
from simpy.events import NORMAL, PENDING, URGENT


class Wake:
    """A clock entry that calls its callbacks when its time comes, as an event would: what
    SimPy's step reads of one (``callbacks``, ``_ok``). Not an event: nothing may yield
    it or wait on it in a condition."""

    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self, callback: Callable[[Any], object]):
        self.callbacks: list | None = [callback]
        self._ok = True
        self._value: object = None


_new_object = object.__new__
_EVENT: Final = simpy.Event


class Clock:
    """The sim's hand on a SimPy environment's event queue, for its hot paths:
    ``wake_after`` puts a bare entry (``Wake``) on it, where ``env.timeout(delay)`` with
    that callback would fire; ``new_event`` and ``succeed`` are ``simpy.Event(env)`` and
    ``event.succeed(value)``. Each makes the very entry SimPy would (time, priority, its
    next event id), so the order of everything is unchanged, without SimPy's interpreted
    code. It keeps the environment's queue and event counter, which SimPy creates once and
    never replaces; the time is read from the environment each time (``env._now``)."""

    __slots__ = ("env", "queue", "eid")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.queue: list[Any] = env._queue
        self.eid: Any = env._eid

    @property
    def now(self) -> float:
        """The environment's time: ``env.now`` without SimPy's interpreted property."""
        return self.env._now

    def drop_head(self, stale: set) -> None:
        """Take the entries at the head of the queue whose event is in ``stale`` off it
        (and out of ``stale``): wake-ups that would do nothing when they fire. The clock
        does not move."""
        queue = self.queue
        while queue and queue[0][3] in stale:
            stale.discard(heappop(queue)[3])

    def wake_after(self, delay: float, callback: Callable[[Any], object]) -> Wake:
        """Call ``callback(wake)`` ``delay`` seconds from now."""
        w = Wake(callback)
        heappush(self.queue, (self.env._now + delay, NORMAL, next(self.eid), w))
        return w

    def new_event(self) -> simpy.Event:
        """``simpy.Event(env)``: a real SimPy event (processes, conditions, ``value``), its
        fields set as ``Event.__init__`` sets them (``_value`` is the class's PENDING)."""
        ev: Any = _new_object(_EVENT)
        ev.env = self.env
        ev.callbacks = []
        return ev

    def succeed(self, event: Any, value: Any = None) -> None:
        """``event.succeed(value)`` for an event of this environment: scheduled now."""
        if event._value is not PENDING:
            raise RuntimeError(f"{event} has already been triggered")
        event._ok = True
        event._value = value
        heappush(self.queue, (self.env._now, NORMAL, next(self.eid), event))


class _Proc:
    """A generator process, driven as ``simpy.Process._resume`` drives one: resumed with
    the value of the event it yielded (or that event's exception thrown into it), on to
    the next event it yields; its end succeeds ``done`` with its return value, an
    exception fails ``done`` with it (which crashes the run when nothing waits on it, as
    a failed SimPy process does). What it leaves out of ``simpy.Process`` nothing here
    uses: ``interrupt``, ``env.active_process``."""

    __slots__ = ("gen", "done", "clock")

    def __init__(self, gen: Any, done: simpy.Event, clock: Clock):
        self.gen = gen
        self.done = done
        self.clock = clock

    def resume(self, event: Any) -> None:
        gen = self.gen
        while True:
            try:
                if event._ok:
                    event = gen.send(event._value)
                else:  # the process has to handle the failed event (or fail itself)
                    event._defused = True
                    exc = type(event._value)(*event._value.args)  # (a copy, as SimPy's)
                    exc.__cause__ = event._value
                    event = gen.throw(exc)
            except StopIteration as stop:
                self.clock.succeed(self.done, stop.value)
                return
            except BaseException as e:  # (as SimPy's: the process fails with it)
                self.done.fail(e)  # type: ignore[arg-type]  # (SimPy takes any BaseException)
                return
            try:
                callbacks = event.callbacks
            except AttributeError:
                raise RuntimeError(f"a process yielded {event!r}, not an event") from None
            if callbacks is not None:  # not processed yet: resume when it is
                callbacks.append(self.resume)
                return


class SimRuntime:
    """Simulated time. ``env`` is exposed for backends built on the same clock."""

    __slots__ = ("env", "clock", "_passed", "_shared")

    def __init__(self, env: simpy.Environment | None = None, initial_time: float = 0.0):
        self.env = env if env is not None else simpy.Environment(initial_time=initial_time)
        self.clock = Clock(self.env)
        self._shared: dict[str, Any] = {}  # the node's shared parts, by name (``shared``)
        # an event already processed: a process that yields it goes on at once (SimPy
        # resumes a process at once for an event whose callbacks are gone)
        self._passed = simpy.Event(self.env)
        self._passed._ok = True
        self._passed._value = None
        self._passed.callbacks = None  # type: ignore[assignment]

    @property
    def now(self) -> float:
        return self.env._now

    def shared(self, name: str, make: Callable[[], Any]) -> Any:
        """The node's shared part ``name`` (built by ``make`` the first time)."""
        part = self._shared.get(name)
        if part is None:
            part = self._shared[name] = make()
        return part

    def timeout(self, delay_s: float, value: Any = None) -> simpy.Event:
        return self.env.timeout(delay_s, value)

    def timeout_at(self, at_s: float, value: Any = None) -> simpy.Event:
        """A timeout that fires at the absolute time ``at_s`` (now if that has passed).
        ``timeout(at_s - now)`` would land at ``now + (at_s - now)``, which can differ from
        ``at_s`` in the last bit; a run-ahead must land on exactly the float the steps it
        skipped would have reached. (SimPy schedules only relative delays; this pushes
        onto its queue the way ``Environment.schedule`` does.)"""
        env = self.env
        if at_s <= env._now:
            return env.timeout(0, value)
        ev = simpy.Event(env)
        ev._ok = True
        ev._value = value
        heappush(env._queue, (at_s, NORMAL, next(env._eid), ev))
        return ev

    def advance_to(self, at_s: float) -> simpy.Event:
        """``timeout_at(at_s)`` for the process that runs now, without an event when none
        is due up to ``at_s``: the clock then moves to ``at_s`` at once and the returned
        event is one already processed (the process yielding it goes on). Nothing can tell
        the two apart: no event fires in between, and nothing is due at ``at_s`` that the
        timeout would have let run first. (The clock is SimPy's own ``_now``, which its
        ``step`` sets the same way from the next event's time.) For a process whose resume
        is the last callback of the event it resumed on (the engine's serve loop: it alone
        waits on its events), else a later callback of that event would see the new time."""
        env = self.env
        queue = env._queue
        if at_s > env._now and (not queue or queue[0][0] > at_s):
            env._now = at_s
            return self._passed
        return self.timeout_at(at_s)

    def event(self) -> simpy.Event:
        return self.clock.new_event()

    def all_of(self, waitables: Iterable[simpy.Event]) -> simpy.Event:
        return self.env.all_of(list(waitables))

    def any_of(self, waitables: Iterable[simpy.Event]) -> simpy.Event:
        return self.env.any_of(list(waitables))

    def process(self, gen) -> simpy.Event:
        """Start a generator process now; the event succeeds with its return value. It
        starts where ``env.process`` would (an urgent entry at now: the same order)."""
        clock = self.clock
        done = clock.new_event()
        heappush(clock.queue, (self.env._now, URGENT, next(clock.eid),
                               Wake(_Proc(gen, done, clock).resume)))
        return done

    def run(self, until: simpy.Event | float | None = None) -> Any:
        """Run until ``until`` (an event) has been processed, or until nothing is left;
        returns its value. A time: SimPy's own ``run``."""
        env = self.env
        if until is not None and not isinstance(until, simpy.Event):
            return env.run(until=until)
        if until is not None and until.callbacks is None:
            return until.value  # processed already
        queue: list[Any] = env._queue
        while queue:
            # Environment.step, inline
            env._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if event is until:  # (SimPy's stop callback: its value, or its exception itself)
                if until._ok:
                    return until._value
                raise until._value
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)  # (a copy, as SimPy raises)
                exc.__cause__ = event._value
                raise exc
        if until is not None:
            raise RuntimeError(f'No scheduled events left but "until" event was not triggered: {until}')
        return None
