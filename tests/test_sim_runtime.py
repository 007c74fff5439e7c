"""The sim runtime's special form against plain SimPy.

backends/kvsim_backends/sim/runtime.py is the one module that touches SimPy's private names (its own
event loop, process driver and ``Clock``, for speed). These tests pin down what it relies
on: the SimPy installed is in the range pyproject.toml pins and has those internals, and
each ``Clock`` operation leaves SimPy's queue exactly as SimPy's own call would, so a run
goes in the same order. (tests/test_sim_backend.py runs a whole scenario of processes,
failures and callbacks both ways.)
"""

from __future__ import annotations

import pathlib
import re

import simpy
from simpy.events import NORMAL, PENDING, URGENT

from kvsim_backends.sim.runtime import Clock, SimRuntime

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def test_simpy_is_in_the_pinned_range_and_has_the_internals_the_runtime_uses():
    pin = re.search(r'"simpy>=([\d.]+),<([\d.]+)"', PYPROJECT.read_text())
    assert pin, "pyproject.toml must bound simpy on both sides (runtime.py uses its internals)"
    low, high = _version(pin.group(1)), _version(pin.group(2))
    assert low <= _version(simpy.__version__) < high, (simpy.__version__, pin.group(0))

    env = simpy.Environment(initial_time=2.5)
    assert env._now == env.now == 2.5
    assert isinstance(env._queue, list) and env._queue == []
    first = next(env._eid)
    assert isinstance(first, int) and next(env._eid) == first + 1
    ev = env.event()
    assert ev._value is PENDING and ev.callbacks == []
    ev.succeed("v")
    assert ev._ok is True and ev._value == "v"
    # a queue entry: (time, priority, event id, event)
    t = env.timeout(1.0)
    assert env._queue[-1] == (3.5, NORMAL, first + 3, t) and URGENT < NORMAL
    failed = env.event()
    failed.fail(KeyError("x"))
    failed.defused = True  # SimPy's public spelling of the flag the loop reads
    assert failed._defused is True


def _keys(env: simpy.Environment) -> list[tuple]:
    """The queue's entries as the loop orders them: (time, priority, event id)."""
    return sorted(e[:3] for e in env._queue)


def test_clock_operations_leave_the_queue_as_simpys_own_calls_do():
    plain, fast = simpy.Environment(), simpy.Environment()
    clock = Clock(fast)
    order_plain: list = []
    order_fast: list = []

    # a timeout with a callback vs a bare wake-up
    plain.timeout(0.25).callbacks.append(lambda ev: order_plain.append(("wake", plain.now)))
    clock.wake_after(0.25, lambda w: order_fast.append(("wake", clock.now)))
    # an event succeeded now, by SimPy vs by the clock
    a = plain.event()
    a.callbacks.append(lambda ev: order_plain.append(("a", ev.value, plain.now)))
    a.succeed(1)
    b = clock.new_event()
    b.callbacks.append(lambda ev: order_fast.append(("a", ev.value, clock.now)))
    clock.succeed(b, 1)
    assert isinstance(b, simpy.Event) and b.env is fast and b.triggered

    assert _keys(fast) == _keys(plain) == [(0.0, NORMAL, 1), (0.25, NORMAL, 0)]
    plain.run()
    fast.run()
    assert order_fast == order_plain == [("a", 1, 0.0), ("wake", 0.25)]
    assert clock.now == fast.now == plain.now == 0.25


def test_drop_head_takes_only_stale_entries_at_the_head():
    env = simpy.Environment()
    clock = Clock(env)
    fired: list = []
    stale = {clock.wake_after(1.0, fired.append), clock.wake_after(2.0, fired.append)}
    live = clock.wake_after(3.0, fired.append)
    later_stale = clock.wake_after(4.0, fired.append)
    stale.add(later_stale)
    clock.drop_head(stale)
    assert stale == {later_stale}  # behind a live entry: stays
    assert [e[3] for e in sorted(env._queue, key=lambda e: e[:3])] == [live, later_stale]
    assert clock.now == 0.0  # the clock does not move
    env.run()
    assert fired == [live, later_stale]


def test_timeout_at_and_advance_to_land_where_timeouts_would():
    rt = SimRuntime()
    plain = simpy.Environment()
    seen_rt: list = []
    seen_plain: list = []

    def proc_rt():
        yield rt.timeout_at(0.75)
        seen_rt.append(rt.now)
        yield rt.advance_to(1.5)  # nothing due before: the clock moves without an event
        seen_rt.append(rt.now)
        yield rt.timeout_at(1.0)  # in the past: now
        seen_rt.append(rt.now)

    def proc_plain():
        yield plain.timeout(0.75)
        seen_plain.append(plain.now)
        yield plain.timeout(0.75)
        seen_plain.append(plain.now)
        yield plain.timeout(0)
        seen_plain.append(plain.now)

    rt.run(rt.process(proc_rt()))
    plain.run(plain.process(proc_plain()))
    assert seen_rt == seen_plain == [0.75, 1.5, 1.5]
