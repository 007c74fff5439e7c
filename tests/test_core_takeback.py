"""Seed 004's write-through take-back (``write_through_take_back``): a host page whose
write-through is still running may be evicted to disk; the eviction takes the pending
copy back (a TAKEBACK batch onto the copy's slot) and waits for that write
(``takeback_waits`` names it; the engine promotes its queued pieces and waits). The
reference backend runs the write, then the eviction; the audit after every step checks
that a taken-back slot holds its page's tag. Without the option such pages are pinned."""

from __future__ import annotations

from conftest import TPB, backend_for, check, make_manager, new_active, run
from kvsim.core import Level
from kvsim.core.plan import BatchKind


def _setup(**over):
    opts = dict(gpu=4, host=2, disk=4, write_through=True, write_through_take_back=True)
    opts.update(over)
    m = make_manager(**opts)
    be = backend_for(m)
    req = new_active(m, be, 2 * TPB)
    m.suspend(req)
    run(m, be, m.evict(Level.GPU, 2))
    wt = m.write_through()  # in flight: it reads both host slots
    assert wt is not None
    return m, be, req, wt


def test_a_pending_copy_is_taken_back_after_its_write():
    m, be, req, wt = _setup()
    plan = m.evict(Level.HOST, 2)
    assert plan, plan
    kinds = [(b.kind, b.src, b.dst, b.pages) for b in plan.batches]
    assert kinds == [(BatchKind.TAKEBACK, Level.HOST, Level.DISK, 2)]
    take = plan.batches[0]
    assert m.takeback_waits(take) == [wt.pid]
    assert sorted(take.dst_slots) == sorted(wt.batches[0].dst_slots)  # the copies' slots
    check(m, be)
    run(m, be, wt)        # the write ends first (the engine waits for it)
    check(m, be)
    assert m.takeback_waits(take) == []
    run(m, be, plan)
    check(m, be)
    c = m.counters
    assert (c.copies_reused, c.copies_reused_pending, c.write_through_pages) == (2, 2, 2)
    assert all(p.tier == 2 and p.copy == -1 for p in req.pages)
    assert m.tier_stats(Level.DISK).retained == 0 and m.tiers[1].free == 2


def test_a_failed_write_fails_the_take_back_and_drops_the_copy():
    m, be, req, wt = _setup()
    plan = m.evict(Level.HOST, 2)
    run(m, be, wt, fail_batches={0})
    check(m, be)
    run(m, be, plan, fail_batches={0})  # (the engine fails a TAKEBACK whose write failed)
    check(m, be)
    assert all(p.tier == 1 and p.copy == -1 for p in req.pages)
    assert m.tier_stats(Level.DISK).used == 0 and m.counters.copies_reused_pending == 0
    run(m, be, m.evict(Level.HOST, 2))  # now written for real
    check(m, be)
    assert all(p.tier == 2 for p in req.pages)


def test_without_the_option_the_pages_are_pinned():
    m, be, req, wt = _setup(write_through_take_back=False)
    assert not m.evict(Level.HOST, 1)
    run(m, be, wt)
    assert m.evict(Level.HOST, 2)


def test_a_replay_takes_pending_copies_back_verified():
    """The default config's sessions on a small host (1 GiB) with write-through: with the
    option some evictions take back copies whose write was still running (the refcheck,
    on, reads every taken-back slot's tag), every request completes; without it none."""
    from kvsim.config import load_config
    from kvsim.run import prepare_run, replay

    got = {}
    for mode in ("pin", "take_back"):
        cfg = load_config("configs/default.yaml", [
            "workload.synthetic.n_sessions=6", "cache.tiers[0].quota=12GiB",
            "cache.tiers[1].quota=1GiB", "cache.tiers[2].io_workers=4",
            "cache.tiers[2].write_through=true", f"cache.tiers[2].write_through_pending={mode}"])
        assert cfg.engine.refcheck
        m = replay(prepare_run(cfg)).metrics
        assert m["requests_failed"] == 0 and m["failed_batches"] == 0
        got[mode] = m["disk_copies"]["reused_pending"]
    assert got["pin"] == 0 and got["take_back"] > 0


def test_the_key_needs_write_through():
    import pytest
    from kvsim.config import ConfigFileError, load_config
    with pytest.raises(ConfigFileError, match=r"tiers\[2\]: write_through_pending needs write_through"):
        load_config("configs/default.yaml", ["cache.tiers[2].write_through_pending=take_back"])
    with pytest.raises(ConfigFileError, match=r"tiers\[2\]\.write_through_pending"):
        load_config("configs/default.yaml", ["cache.tiers[2].write_through_pending=maybe"])
