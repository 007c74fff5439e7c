"""Retained disk copies and write-through in the core, on hand-built cases.

Each test tells one story on a tiny manager (16-byte pages of 4 tokens) with the
reference backend (tags, not bytes) and audits after every step: the audit checks that
every ready copy's disk slot holds its page's tag, so a copy that was overwritten, or
taken back before its write finished, fails it.
"""

from __future__ import annotations

import pytest

from conftest import PAGE, TPB, backend_for, check, make_manager, new_active, run
from kvsim.core import Level
from kvsim.core.errors import ConfigError
from kvsim.core.plan import BatchKind


def _kinds(plan):
    return sorted((b.kind.name, b.src.name, b.dst.name, b.pages) for b in plan.batches)


def _to_disk(m, be, req):
    """Suspend ``req`` and push its pages GPU -> disk (no host tier) or via host."""
    m.suspend(req)
    plan = m.evict(Level.GPU, len(req.pages))
    assert plan, plan
    run(m, be, plan)
    check(m, be)


def test_restore_keeps_a_full_pages_copy_and_eviction_takes_it_back():
    m = make_manager(gpu=4, host=None, disk=4, keep_copy=True)
    be = backend_for(m)
    # 2 full pages and a partial third, written and pushed to disk
    req = new_active(m, be, 2 * TPB + 1)
    _to_disk(m, be, req)
    assert [p.tier for p in req.pages] == [1, 1, 1]
    disk_slots = [p.slot for p in req.pages]
    # the next turn restores them: the full pages keep their disk slots as copies
    plan = m.resume(req)
    run(m, be, plan)
    check(m, be)
    full, partial = req.pages[:2], req.pages[2]
    assert [p.copy for p in full] == disk_slots[:2] and all(p.copy_ready for p in full)
    assert partial.copy == -1  # a partial page never keeps one
    assert m.counters.copies_kept == 2
    assert m.tier_stats(Level.DISK).retained == 2 and m.tier_stats(Level.DISK).used == 2
    # evicting them again: the full pages take their copies back, the partial one is written
    m.suspend(req)
    plan = m.evict(Level.GPU, 3)
    assert _kinds(plan) == [("EVICT", "GPU", "DISK", 1), ("TAKEBACK", "GPU", "DISK", 2)]
    take = next(b for b in plan.batches if b.kind is BatchKind.TAKEBACK)
    assert sorted(take.dst_slots) == sorted(disk_slots[:2])
    written_before = m.counters.moved_bytes[0][2]
    run(m, be, plan)
    check(m, be)
    assert m.counters.copies_reused == 2
    assert m.counters.moved_bytes[0][2] - written_before == PAGE  # only the partial page
    assert [p.slot for p in full] == disk_slots[:2] and all(p.copy == -1 for p in full)
    assert m.tier_stats(Level.DISK).retained == 0


def test_failed_takeback_leaves_the_page_and_its_copy():
    m = make_manager(gpu=4, host=None, disk=4, keep_copy=True)
    be = backend_for(m)
    req = new_active(m, be, 2 * TPB)
    _to_disk(m, be, req)
    run(m, be, m.resume(req))
    m.suspend(req)
    plan = m.evict(Level.GPU, 2)
    run(m, be, plan, fail_batches={0})
    check(m, be)
    assert all(p.tier == 0 and p.copy_ready for p in req.pages)
    assert m.counters.copies_reused == 0
    run(m, be, m.evict(Level.GPU, 2))  # again, and it works
    check(m, be)
    assert m.counters.copies_reused == 2


def _disk_with_copies(fraction: float):
    """A full 4-slot disk: 2 retained copies (of pages now on GPU, locked by request a,
    active), then 2 disk-only droppable pages (of request b, closed). Returns (m, be, a's
    pages)."""
    m = make_manager(gpu=4, host=None, disk=4, keep_copy=True, protected_copy_fraction=fraction)
    be = backend_for(m)
    a = new_active(m, be, 2 * TPB, family=1)
    _to_disk(m, be, a)
    run(m, be, m.resume(a))  # a's pages back on GPU, their disk copies retained
    b = new_active(m, be, 2 * TPB, family=2)
    _to_disk(m, be, b)
    m.close(b)
    check(m, be)
    s = m.tier_stats(Level.DISK)
    assert (s.used, s.free, s.retained, s.droppable) == (4, 0, 2, 2)
    assert s.evictable == 2  # the copies are reported apart from evictable pages
    return m, be, a.pages


def test_disk_pressure_drops_disk_only_pages_before_copies():
    m, be, a_pages = _disk_with_copies(1.0)
    # a new request's 2 pages go GPU -> disk: the 2 droppable disk pages make room
    c = new_active(m, be, 2 * TPB, family=3)
    m.suspend(c)
    run(m, be, m.evict(Level.GPU, 2))
    check(m, be)
    assert m.counters.dropped_pages[Level.DISK] == 2 and m.counters.copies_reclaimed == 0
    assert all(p.copy_ready for p in a_pages)


def test_protected_share_reclaims_copies_beyond_it_first():
    m, be, a_pages = _disk_with_copies(0.25)  # 1 of 4 slots protected: 1 copy beyond it
    c = new_active(m, be, 2 * TPB, family=3)
    m.suspend(c)
    victims = list(m.tiers[0].candidates())[:2]
    run(m, be, m.evict(Level.GPU, 2))
    check(m, be)
    assert m.counters.copies_reclaimed == 1 and m.counters.dropped_pages[Level.DISK] == 1
    # the oldest copy went (a's first page was restored first: its copy is the oldest)
    assert [p.copy_ready for p in a_pages] == [False, True]
    assert all(p.tier == 1 for p in victims)


def test_held_pages_take_a_copys_slot_when_nothing_else_can_leave():
    m = make_manager(gpu=2, host=None, disk=2, keep_copy=True)
    be = backend_for(m)
    a = new_active(m, be, 2 * TPB, family=1)
    _to_disk(m, be, a)
    run(m, be, m.resume(a))  # a on GPU (2 pages), copies fill the disk (2 slots)
    m.suspend(a)
    # b needs the GPU: a's held pages must go to disk, where only their own copies are
    b = m.create("s", [7000, 7001], 2 * TPB)
    run(m, be, m.resume(b))  # nothing cached: nothing to bring
    plan = m.grow(b, 2 * TPB)
    assert plan
    assert _kinds(plan) == [("TAKEBACK", "GPU", "DISK", 2)]
    run(m, be, plan)
    check(m, be)
    # b's held page next: the disk is full of a's held pages (which never drop): refused
    m.suspend(b)
    before = m.counters.snapshot()
    assert not m.evict(Level.GPU, 1)
    assert m.counters.snapshot()["refusals"] == before["refusals"] + 1


def test_held_page_reclaims_another_pages_copy():
    m = make_manager(gpu=3, host=None, disk=2, keep_copy=True)
    be = backend_for(m)
    a = new_active(m, be, 2 * TPB, family=1)
    _to_disk(m, be, a)
    run(m, be, m.resume(a))  # the disk: a's 2 copies; a on GPU, active
    b = new_active(m, be, TPB, family=2)  # a third GPU page, held once suspended
    m.suspend(b)
    plan = m.evict(Level.GPU, 1)  # b's page must go to disk: a copy makes way
    assert plan and _kinds(plan) == [("EVICT", "GPU", "DISK", 1)]
    run(m, be, plan)
    check(m, be)
    assert m.counters.copies_reclaimed == 1 and b.pages[0].tier == 1


def _wt_manager(**over):
    opts = dict(gpu=4, host=4, disk=4, write_through=True)
    opts.update(over)
    m = make_manager(**opts)
    return m, backend_for(m)


def _evict_to_host(m, be, req, n):
    m.suspend(req)
    plan = m.evict(Level.GPU, n)
    assert _kinds(plan) == [("EVICT", "GPU", "HOST", n)]
    run(m, be, plan)


def test_write_through_copies_then_host_eviction_writes_nothing():
    m, be = _wt_manager()
    req = new_active(m, be, 2 * TPB + 2)  # 2 full pages and a partial one
    _evict_to_host(m, be, req, 3)
    plan = m.write_through()
    assert _kinds(plan) == [("BACKGROUND", "HOST", "DISK", 2)]  # full pages only
    run(m, be, plan)
    check(m, be)
    assert m.counters.write_through_pages == 2 and m.write_through() is None
    plan = m.evict(Level.HOST, 3)
    assert _kinds(plan) == [("EVICT", "HOST", "DISK", 1), ("TAKEBACK", "HOST", "DISK", 2)]
    run(m, be, plan)
    check(m, be)
    assert m.counters.copies_reused == 2 and all(p.tier == 2 for p in req.pages)


def test_write_through_uses_free_disk_slots_only_and_skips_the_rest():
    m, be = _wt_manager(disk=1)
    req = new_active(m, be, 3 * TPB)
    _evict_to_host(m, be, req, 3)
    plan = m.write_through()
    assert plan.batches[0].pages == 1
    assert m.counters.write_through_skipped == 2
    assert m.counters.dropped_pages == [0, 0, 0]  # it evicted nothing
    run(m, be, plan)
    check(m, be)


def test_write_through_in_flight_cap_holds_the_rest_for_later():
    m, be = _wt_manager(write_through_inflight_bytes=2 * PAGE)
    req = new_active(m, be, 3 * TPB)
    _evict_to_host(m, be, req, 3)
    first = m.write_through()
    assert first.batches[0].pages == 2 and m.write_through() is None  # the cap is reached
    run(m, be, first)
    second = m.write_through()
    assert second.batches[0].pages == 1 and m.counters.write_through_skipped == 0
    run(m, be, second)
    check(m, be)
    assert m.counters.write_through_pages == 3


def test_failed_write_through_is_never_served():
    m, be = _wt_manager()
    req = new_active(m, be, 2 * TPB)
    _evict_to_host(m, be, req, 2)
    plan = m.write_through()
    run(m, be, plan, fail_batches={0})  # the disk slots now hold garbage
    check(m, be)
    assert m.counters.write_through_failed == 2
    assert all(p.copy == -1 for p in req.pages) and m.tier_stats(Level.DISK).used == 0
    # the eviction writes the pages for real, and they read back right
    plan = m.evict(Level.HOST, 2)
    assert _kinds(plan) == [("EVICT", "HOST", "DISK", 2)]
    run(m, be, plan)
    run(m, be, m.resume(req))
    check(m, be)


def test_host_slot_read_by_a_write_through_is_not_reused():
    m, be = _wt_manager(host=2)
    req = new_active(m, be, 2 * TPB)
    _evict_to_host(m, be, req, 2)
    wt = m.write_through()  # in flight: it reads both host slots
    host_slots = sorted(p.slot for p in req.pages)
    # the pages are no eviction candidates of the host tier while they are read
    assert not m.evict(Level.HOST, 1)
    # they may be onboarded: their host slots wait for the write before they are free
    run(m, be, m.resume(req))
    check(m, be)
    assert m.tiers[1].free == 0 and sorted(m._wt_deferred) == host_slots
    run(m, be, wt)
    check(m, be)
    assert m.tiers[1].free == 2
    assert all(p.copy_ready for p in req.pages)  # the copies are ready: pages are on GPU


def test_page_written_to_disk_before_its_write_through_ends_gives_the_copy_up():
    m, be = _wt_manager(host=2, disk=4)
    req = new_active(m, be, 2 * TPB)
    _evict_to_host(m, be, req, 2)
    wt = m.write_through()
    run(m, be, m.resume(req))  # back on GPU, copies still being written
    m.suspend(req)
    # the host is full of slots the write still reads: GPU victims go straight to disk;
    # their copies are not ready, so they are written again, not taken back
    plan = m.evict(Level.GPU, 2)
    assert _kinds(plan) == [("EVICT", "GPU", "DISK", 2)]
    run(m, be, plan)
    check(m, be)
    assert m.counters.write_through_dropped == 2
    run(m, be, wt)  # its end frees the slots it wrote: never served
    check(m, be)
    assert m.tier_stats(Level.DISK).retained == 0 and m.tier_stats(Level.DISK).used == 2


@pytest.mark.parametrize("opts, field", [
    ({"write_through": True, "host": None}, "write_through"),
    ({"keep_copy": True, "disk": None}, "keep_copy"),
    ({"protected_copy_fraction": 1.5}, "protected_copy_fraction"),
    ({"protected_copy_fraction": -0.1}, "protected_copy_fraction"),
])
def test_bad_options_name_the_field(opts, field):
    with pytest.raises(ConfigError) as e:
        make_manager(**opts)
    assert e.value.field == field
