"""Progressive host fill: the core's watermark arithmetic and the allocator under a watermark.

Hand-built cases: the layout of commit units, which watermark a batch of slots needs,
the allocator's order (recycled first, then fresh ascending) seen against a growing
watermark, and a tier capped where a failed fill stopped.
"""

from __future__ import annotations

import math

import pytest

from kvsim.core.datapath.fill import FillLayout, FillMode, needed_watermark, ready
from kvsim.core.spec import Level
from kvsim.core.tiers import Tier

MiB = 1 << 20


def test_layout_units_hold_whole_slots():
    # 5 MiB slots, 512 MiB units: 102 whole slots a unit (510 MiB), never a straddling slot
    lay = FillLayout.of(5 * MiB, 1000, 512 * MiB)
    assert lay.unit_slots == 102 and lay.unit_bytes == 510 * MiB
    assert lay.units == 10  # 9 full units and a last one of 82 slots
    assert lay.span(0) == (0, 102) and lay.span(9) == (918, 1000)
    assert lay.byte_span(9) == (918 * 5 * MiB, 82 * 5 * MiB)
    assert [lay.watermark(k) for k in (0, 1, 2, 9, 10, 11)] == [0, 102, 204, 918, 1000, 1000]
    assert lay.unit_of(101) == 0 and lay.unit_of(102) == 1
    assert [lay.units_for(w) for w in (0, 1, 102, 103, 1000)] == [0, 1, 1, 2, 10]
    with pytest.raises(ValueError):
        lay.units_for(1001)
    with pytest.raises(IndexError):
        lay.span(10)


def test_layout_slot_larger_than_unit_and_whole():
    lay = FillLayout.of(1024 * MiB, 3, 512 * MiB)  # a slot bigger than a unit: one a unit
    assert lay.unit_slots == 1 and lay.units == 3
    whole = FillLayout.whole(5 * MiB, 1000)
    assert whole.units == 1 and whole.watermark(1) == 1000
    with pytest.raises(ValueError, match="slot_bytes"):
        FillLayout.of(0, 10)


def test_aligned_layout_units_are_whole_slots_and_whole_granules():
    g = 2 * MiB
    for slot, unit, want in ((5 * MiB, 512 * MiB, 102), (3 * MiB, 512 * MiB, 170),
                             (16 << 10, 512 * MiB, 32768), (5 * MiB, 4 * MiB, 2), (160 * MiB, 512 * MiB, 3)):
        lay = FillLayout.aligned(slot, 100_000, unit, g)
        assert lay.unit_slots == want, (slot, unit)
        assert lay.unit_bytes % g == 0 and lay.unit_bytes % slot == 0
        assert lay.unit_bytes <= max(unit, g * slot // math.gcd(slot, g))
    assert FillLayout.aligned(5 * MiB, 3, 512 * MiB, g).unit_slots == 3  # the whole tier
    with pytest.raises(ValueError, match="granule"):
        FillLayout.aligned(MiB, 10, 4 * MiB, 0)


def test_first_serve_and_fill_time():
    lay = FillLayout.of(4 * MiB, 512, 64 * MiB)  # 16 slots a unit, 32 units
    assert lay.first_serve(FillMode.NONE) == 0
    assert lay.first_serve(FillMode.PROGRESSIVE) == 16
    assert lay.first_serve("before_serve") == 512
    # N units at rate R take N x unit / R
    rate = 2e9
    assert lay.seconds(1, rate) == pytest.approx(64 * MiB / rate)
    assert lay.seconds(32, rate) == pytest.approx(32 * 64 * MiB / rate)


def test_needed_watermark_is_the_highest_slot_plus_one():
    assert needed_watermark([]) == 0
    assert needed_watermark([3, 17, 5]) == 18
    assert ready([3, 17, 5], 18) and not ready([3, 17, 5], 17)


def test_allocations_wait_only_for_the_unit_that_holds_them():
    # a host tier of 64 slots committed 16 at a time; the watermark grows unit by unit
    lay = FillLayout.of(MiB, 64, 16 * MiB)
    t = Tier(Level.HOST, 1, False, MiB, capacity=64, max_slots=64)
    watermark = lay.watermark(1)  # serving starts with the first unit
    first = t.alloc_many(10)
    assert first == list(range(10)) and ready(first, watermark)
    more = t.alloc_many(10)  # slots 10..19: the last four are in the second unit
    assert needed_watermark(more) == 20 and not ready(more, watermark)
    assert lay.units_for(needed_watermark(more)) == 2  # waits for unit 1 only, not the rest
    # freed slots come back first, and they existed already: no wait
    t.release_many([3, 4])
    again = t.alloc_many(2)
    assert sorted(again) == [3, 4] and ready(again, watermark)
    # then fresh ids continue ascending from where they stopped
    assert t.alloc() == 20


def test_cap_keeps_slots_below_the_committed_prefix_usable():
    # a fill failed after 2 units of 8 slots: slots >= 16 never come to exist
    t = Tier(Level.HOST, 1, False, MiB, capacity=40, max_slots=40)
    slots = t.alloc_many(20)  # 16..19 lie beyond what will exist (their batch will fail)
    t.release_many([1, 2, 17])
    t.cap(16)
    assert t.limit == 16 and t.capacity == 16
    assert 17 not in t.recycled and sorted(t.recycled) == [1, 2]  # 17 is forgotten
    # owned: 0, 3..15 and, until their owners let go, 16, 18 and 19
    assert t.used == 17 and t.free == 0
    t.release_many([16, 18, 19])  # owners of slots beyond the limit let go: forgotten
    assert t.used == 14 and t.free == 2 and sorted(t.recycled) == [1, 2] and t.lost == 4
    assert sorted(t.alloc_many(2)) == [1, 2] and t.free == 0
    with pytest.raises(RuntimeError, match="no slot left below 16"):
        t.alloc()
    t.release(5)
    assert t.alloc() == 5  # a slot below the prefix stays usable
    assert slots[:16] == list(range(16))


def test_cap_never_raises_the_limit():
    t = Tier(Level.HOST, 1, False, MiB, capacity=8, max_slots=8)
    t.cap(6)
    t.cap(7)
    assert t.limit == 6 and t.capacity == 6
    with pytest.raises(ValueError):
        t.cap(-1)
