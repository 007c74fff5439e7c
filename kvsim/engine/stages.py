"""Running a plan: submit each stage's batches to the backend, wait, complete the plan.

A stage starts only after the previous one succeeded and once its destination slots
exist (a host tier filling progressively: the backend's watermark, ``slots_ready``);
after a failed batch, or destination slots that never come, the later stages are not
run (the core rolls them back). With the refcheck on, every committed
batch's destination is read back and compared with the tags the core expects (on the hw
backend off the runtime's thread, so the replay keeps real time while bytes are checked);
a batch that takes a retained disk copy back is checked whatever ``disk_writes`` says:
the copy it reuses must hold the page's bytes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from kvsim.backend import Backend, Runtime
from kvsim.core import Batch, Plan, TierManager
from kvsim.core.plan import BatchKind
from kvsim.core.spec import Level
from kvsim.engine.refcheck import RefcheckError, check_tags

__all__ = ["RefcheckError", "check_tags", "run_plan", "tags_equal"]  # (the first two live in refcheck.py)


def tags_equal(found: Sequence[int], expected: Sequence[int]) -> bool:
    """Every tag as expected (same length, same values): two lists (the core's, the sim's)
    compared in place, anything else (the hw backend's uint64 arrays) through numpy."""
    if type(found) is list and type(expected) is list:
        return found == expected
    f = np.asarray(found, dtype=np.uint64)
    e = np.asarray(expected, dtype=np.uint64)
    return f.shape == e.shape and f.tobytes() == e.tobytes()


def _slots_exist(rt: Runtime, backend: Backend, mgr: TierManager, stage: Sequence[Batch]):
    """Generator: wait until the destination slots of ``stage`` exist (a host tier that
    fills progressively: ``Backend.slots_ready``). True if they do; False if some never
    will: the tier is then capped at what its fill committed (``cap_tier``) and the
    stage is not run (its plan rolls back; later plans stay below the cap)."""
    waits = None
    for b in stage:
        w = backend.slots_ready(b.dst, b.dst_slots)
        if w is not None:
            waits = [w] if waits is None else waits + [w]
    if waits is None:
        return True
    yield waits[0] if len(waits) == 1 else rt.all_of(waits)
    if all(bool(w.value) for w in waits):
        return True
    for level in {b.dst for b in stage}:
        limit = backend.slot_limit(level)
        if limit is not None:
            mgr.cap_tier(level, limit)
    return False


def run_plan(rt: Runtime, backend: Backend, mgr: TierManager, plan: Plan, refcheck: bool,
             disk_writes: bool = True, waits: Callable[[Batch], list] | None = None):
    """Generator process: execute ``plan`` and complete it. Returns True if all batches ran.
    ``disk_writes``: the refcheck also reads back batches written to disk. ``waits``
    (write_through_take_back): a TAKEBACK batch -> the (write-through batch, its end) it
    waits for; the stage promotes those writes' queued pieces to the required writes,
    waits for them, and a TAKEBACK batch whose write failed fails."""
    oks = [False] * len(plan.batches)
    index = {id(b): i for i, b in enumerate(plan.batches)}
    for stage in plan.stages:
        if not (yield from _slots_exist(rt, backend, mgr, stage)):
            break
        lost: set[int] = set()
        if waits is not None:
            held = [(b, waits(b)) for b in stage if b.kind is BatchKind.TAKEBACK]
            pend = [w for _, ws in held for w in ws]
            if pend:
                for wb, _ in pend:
                    backend.promote(wb)
                yield rt.all_of([ev for _, ev in pend])
                lost = {id(b) for b, ws in held if not all(ev.value for _, ev in ws)}
        events = [backend.transfer(b) for b in stage]
        # (one batch, the common stage: its own event, without a condition over it)
        yield events[0] if len(events) == 1 else rt.all_of(events)
        stage_ok = True
        for b, ev in zip(stage, events):
            ok = bool(ev.value) and id(b) not in lost
            oks[index[id(b)]] = ok
            stage_ok &= ok
        if not stage_ok:
            break
    if refcheck:
        done = [b for b, ok in zip(plan.batches, oks) if ok and (disk_writes or b.dst != Level.DISK)]
        later = [backend.read_tags_later(b.dst, b.dst_slots) for b in done]
        pending = [w for w in later if w is not None]
        if pending:  # the hw backend verifies off the runtime's thread (the sim, if modelling it)
            yield rt.all_of(pending)
        for b, w in zip(done, later):
            found = backend.read_tags(b.dst, b.dst_slots) if w is None else w.value
            if not tags_equal(found, b.tags):  # else equal: skip naming the batch
                check_tags(found, b.tags,
                           f"a {b.kind.name.lower()} batch {b.src.name}->{b.dst.name}")
    mgr.complete(plan, oks)
    return all(oks)
