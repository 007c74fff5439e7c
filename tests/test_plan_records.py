"""Batch, Plan and Fill are written out by hand (kvsim/core/plan.py says why); here each is
checked against its plain form, the frozen slotted dataclass of the same fields
(``eq=False``): the same fields in the same order, the same constructor (positions,
keywords, defaults), the same values read back, identity equality and hashing.
"""

from __future__ import annotations

import inspect
from dataclasses import FrozenInstanceError, fields, make_dataclass
from typing import Sequence

import numpy as np
import pytest

from kvsim.core.plan import Batch, BatchKind, Fill, Plan, PlanKind
from kvsim.core.spec import Level

_NO_DEFAULT = object()

# the plain forms: (name, type, default) of each field, in order
FIELDS = {
    Batch: [("kind", BatchKind, _NO_DEFAULT), ("src", Level, _NO_DEFAULT),
            ("dst", Level, _NO_DEFAULT), ("src_slots", Sequence[int], _NO_DEFAULT),
            ("dst_slots", Sequence[int], _NO_DEFAULT), ("tags", Sequence[int], _NO_DEFAULT),
            ("page_bytes", int, _NO_DEFAULT), ("stage", int, _NO_DEFAULT)],
    Plan: [("pid", int, _NO_DEFAULT), ("kind", PlanKind, _NO_DEFAULT),
           ("batches", tuple, _NO_DEFAULT), ("new_pages", int, 0)],
    Fill: [("level", Level, _NO_DEFAULT), ("slots", Sequence[int], _NO_DEFAULT),
           ("tags", Sequence[int], _NO_DEFAULT)],
}


def plain_form(cls):
    spec = [(n, t) if d is _NO_DEFAULT else (n, t, d) for n, t, d in FIELDS[cls]]
    return make_dataclass(cls.__name__, spec, frozen=True, slots=True, eq=False)


def _sample(cls) -> dict:
    batch = Batch(BatchKind.EVICT, Level.GPU, Level.HOST, [3, 1], [0, 2], [11, 12], 4096, 1)
    return {
        Batch: dict(kind=BatchKind.ONBOARD, src=Level.DISK, dst=Level.GPU, src_slots=[5, 6, 7],
                    dst_slots=np.array([1, 2, 3]), tags=[9, 8, 7], page_bytes=1 << 20, stage=2),
        Plan: dict(pid=7, kind=PlanKind.GROW, batches=(batch,), new_pages=3),
        Fill: dict(level=Level.HOST, slots=[4, 2], tags=np.array([1, 2], np.uint64)),
    }[cls]


@pytest.mark.parametrize("cls", [Batch, Plan, Fill], ids=lambda c: c.__name__)
def test_each_record_equals_its_frozen_dataclass_form(cls):
    plain = plain_form(cls)
    names = [f.name for f in fields(plain)]
    assert list(cls.__slots__) == names  # the same fields, in the same order

    def params(c):
        return [(p.name, p.kind, p.default) for p in inspect.signature(c).parameters.values()]
    assert params(cls) == params(plain)  # the same constructor

    values = _sample(cls)
    by_position = cls(*values.values())
    by_keyword = cls(**values)
    reference = plain(**values)
    for obj in (by_position, by_keyword):
        for n in names:
            assert getattr(obj, n) is getattr(reference, n), n
        assert not hasattr(obj, "__dict__")  # slotted: no stray attributes
    # eq=False: equality and hashing by identity, as the plain form's
    twin = cls(**values)
    assert (twin == by_keyword) is (plain(**values) == reference) is False
    assert twin == twin and hash(twin) == hash(twin) != hash(by_keyword)
    with pytest.raises(FrozenInstanceError):
        setattr(reference, names[0], None)  # (the plain form enforces at run time; the
        #                                     hand-written one through its Final fields)


def test_a_plan_is_truthy_and_its_stages_follow_the_batches():
    b0 = Batch(BatchKind.EVICT, Level.HOST, Level.DISK, [1], [2], [3], 8, 0)
    b1 = Batch(BatchKind.EVICT, Level.GPU, Level.HOST, [4, 5], [1, 6], [7, 8], 8, 1)
    b2 = Batch(BatchKind.ONBOARD, Level.DISK, Level.GPU, [9], [4], [10], 8, 1)
    plan = Plan(1, PlanKind.RESUME, (b1, b0, b2))
    assert plan and plan.new_pages == 0
    assert plan.stages == ((b0,), (b1, b2))
    assert (plan.pages, plan.nbytes) == (4, 32)
    assert Fill(Level.GPU, [1, 2], [3, 4]).pages == 2
