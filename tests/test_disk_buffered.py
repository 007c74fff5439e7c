"""The disk tier's ``writes: buffered``: the page cache in front of the drive.

Sim, on the round profile (disk read 2 GB/s, write 1 GB/s, 1 ms an op, 4 MiB pieces, queue
depth 4) with 4 MiB pages and a page cache of round numbers: copies at 10 GB/s (a page in
C = 4 MiB / 10 GB/s), dirty limit 4 pages, write-back from 2 pages, expiry 1 s, room for 8
pages. A page written back takes D = 4 MiB / 1 GB/s of the drive; a page read from the
drive R = 1 ms + 4 MiB / 2 GB/s. hw (CPU mode): the tier file has no O_DIRECT descriptor
and pages round-trip. The key's bad uses are refused naming it.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import round_profile, run_events  # noqa: E402
from gpuskip import have_gpu  # noqa: E402
from kvsim.config import ConfigFileError, load_config
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
from kvsim.run.seam import settings_for

from kvsim_backends.hw.disk import DiskStore
from kvsim_backends.sim import SimBackend, SimRuntime

MiB = 2**20
PB = 4 * MiB
C = PB / 10e9
D = PB / 1e9
R = 1e-3 + PB / 2e9
CACHE = {"rate": "10GB/s", "dirty_limit": "16MiB", "dirty_background": "8MiB",
         "dirty_expire": "1s", "capacity": "32MiB"}


def batch(src, dst, n, kind, s0=0, d0=0, page=PB):
    return Batch(kind, src, dst, list(range(s0, s0 + n)), list(range(d0, d0 + n)), [0] * n, page, 0)


def sim(workers=None, writes="buffered"):
    rt = SimRuntime()
    return rt, SimBackend(rt, settings_for(PB, {lv: 64 for lv in Level}, round_profile(page_cache=CACHE),
                                           io_workers=workers, writes=writes))



def test_a_write_below_the_dirty_limit_completes_at_memory_speed_then_expires_to_the_drive():
    rt, be = sim()
    out = run_events(rt, {"w": be.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT))})
    assert out["w"] == (pytest.approx(C, rel=1e-9), True)  # (direct: 1 ms + D)
    # one page dirty is below the background limit: written back when it expires, 1 s on
    assert rt.now == pytest.approx(C + 1.0 + D, rel=1e-9)
    s = be.stats()
    assert s["page_cache_written_back"] == PB and s["page_cache_dirty"] == 0.0
    assert s["disk_write_busy_s"] == pytest.approx(D, rel=1e-9)  # write-back occupied the drive
    assert s["disk_write"] == PB  # the transfer's bytes, once (not again for the write-back)


@pytest.mark.parametrize("workers", [1, None])
def test_writes_above_the_dirty_limit_throttle_to_the_drive(workers):
    """Six pages, on one worker or as one batch of the queue (copied a piece at a time):
    pages 1-4 copy at memory speed (the limit is 4 pages); write-back starts once the
    third page makes the dirty bytes pass 2 pages; pages 5 and 6 each wait for a page's
    write-back, so they go at the drive's rate."""
    rt, be = sim(workers=workers)
    out = run_events(rt, {"w": be.transfer(batch(Level.HOST, Level.DISK, 6, BatchKind.EVICT))})
    # write-back of page 1 from 3C to 3C + D; page 5 copies then; page 2's ends at 3C + 2D
    assert out["w"] == (pytest.approx(3 * C + 2 * D + C, rel=1e-9), True)
    s = be.stats()
    assert s["page_cache_throttled"] == 2
    assert s["page_cache_throttle_s"] == pytest.approx((3 * C + D - 4 * C) + (3 * C + 2 * D - (4 * C + D)),
                                                       rel=1e-9)
    # then the drive writes back to the background limit (2 pages dirty left), and the
    # last two expire: every page written back once, the drive busy for all six
    assert s["page_cache_written_back"] == 6 * PB
    assert s["disk_write_busy_s"] == pytest.approx(6 * D, rel=1e-9)
    assert s["disk_write"] == 6 * PB


def test_the_direct_default_writes_through_to_the_drive():
    rt, be = sim(workers=1, writes=None)
    out = run_events(rt, {"w": be.transfer(batch(Level.HOST, Level.DISK, 2, BatchKind.EVICT))})
    assert out["w"] == (pytest.approx(2 * (1e-3 + D), rel=1e-9), True)
    assert "page_cache_written_back" not in be.stats()


def test_reads_of_pages_the_cache_holds_skip_the_drive():
    """Slot 0 written, then read: a copy out of memory. Slot 40 never written: from the
    drive. Then 8 more pages written (the cache holds 8): slot 0 is out, from the drive."""
    rt, be = sim()
    run_events(rt, {"w": be.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT))})
    t0 = rt.now
    out = run_events(rt, {"r": be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, d0=10))})
    assert out["r"] == (pytest.approx(t0 + C, rel=1e-9), True)
    t1 = rt.now
    out = run_events(rt, {"r": be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, s0=40, d0=11))})
    assert out["r"][0] == pytest.approx(t1 + R, rel=1e-9)
    for i in range(8):
        run_events(rt, {"w": be.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT, s0=i, d0=20 + i))})
    t2 = rt.now
    out = run_events(rt, {"r": be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, d0=12))})
    assert out["r"][0] == pytest.approx(t2 + R, rel=1e-9)
    s = be.stats()
    assert (s["page_cache_read_hits"], s["page_cache_read_misses"]) == (1, 2)
    assert s["disk_read"] == 3 * PB  # every read's bytes, hit or not


def test_a_read_partly_in_the_cache_moves_the_rest_from_the_drive():
    rt, be = sim()
    run_events(rt, {"w": be.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT))})
    t0 = rt.now
    out = run_events(rt, {"r": be.transfer(batch(Level.DISK, Level.HOST, 2, BatchKind.ONBOARD, d0=10))})
    assert out["r"][0] == pytest.approx(t0 + 1e-3 + PB / 2e9, rel=1e-9)  # half the bytes


def test_same_seed_same_timeline():
    def run():
        rt, be = sim(workers=2)
        evs = {i: be.transfer(batch(Level.HOST, Level.DISK, 3, BatchKind.EVICT, s0=3 * i, d0=3 * i))
               for i in range(4)}
        evs["r"] = be.transfer(batch(Level.DISK, Level.HOST, 2, BatchKind.ONBOARD, d0=40))
        return run_events(rt, evs), be.stats()
    assert run() == run()


@pytest.mark.parametrize("sets, msg", [
    (["cache.tiers[1].writes=buffered"], r"tiers\[1\]: writes is only for the disk tier"),
    (["cache.tiers[2].writes=cached"], r"tiers\[2\]\.writes: .*'direct' or 'buffered'")])
def test_bad_writes_is_refused_naming_the_key(sets, msg):
    with pytest.raises(ConfigFileError, match=msg):
        load_config("configs/default.yaml", sets)


def test_buffered_needs_a_profile_with_a_page_cache():
    with pytest.raises(ConfigFileError, match=r"cache\.tiers\[2\]\.writes: buffered needs .*page_cache"):
        settings_for(PB, {lv: 4 for lv in Level}, round_profile(), writes="buffered")


def test_profile_page_cache_limits_are_ordered():
    with pytest.raises(ValueError, match="dirty_background .* is above dirty_limit"):
        round_profile(page_cache=dict(CACHE, dirty_background="32MiB"))
    with pytest.raises(ValueError, match="dirty_limit .* is above capacity"):
        round_profile(page_cache=dict(CACHE, capacity="8MiB"))


PB_HW = 64 << 10


def test_hw_buffered_store_opens_no_direct_descriptor(tmp_path):
    ds = DiskStore(tmp_path, 8, PB_HW, io_threads=2, piece_bytes=PB_HW, direct=False)
    try:
        assert not ds.uses_direct
        rows = np.arange(2 * PB_HW, dtype=np.uint64).astype(np.uint8).reshape(2, PB_HW)
        for f in ds.submit_writes(np.array([3, 5]), rows):
            f.result(timeout=10)
        ds.mark_written(np.array([3, 5]))
        back = np.zeros_like(rows)
        for f in ds.submit_reads(np.array([3, 5]), back):
            f.result(timeout=10)
        assert (back == rows).all()
    finally:
        ds.close()


def hw_backend(tmp_path, device, writes, page):
    from kvsim_backends.hw import HwBackend, RealtimeRuntime
    return HwBackend(RealtimeRuntime(), settings_for(
        page, {Level.GPU: 8, Level.DISK: 8}, disk_dir=tmp_path, device=device, refcheck=True,
        profile=round_profile(page_cache=CACHE), writes=writes, io_workers=2))


def round_trip(be, page):
    rt = be.runtime
    out = rt.run(be.transfer(batch(Level.GPU, Level.DISK, 4, BatchKind.EVICT, page=page)))
    back = rt.run(be.transfer(batch(Level.DISK, Level.GPU, 4, BatchKind.ONBOARD, page=page, d0=4)))
    return out, back


def test_hw_backend_buffered_writes_open_the_tier_without_o_direct(tmp_path):
    """CPU mode: with writes buffered the store has no O_DIRECT descriptor (the backend's
    info says so) and pages round-trip; the default asks for O_DIRECT."""
    be = hw_backend(tmp_path, "cpu", "buffered", PB_HW)
    try:
        assert be.settings.disk.writes == "buffered"
        assert be.disk.direct_fd is None and be.info["disk_direct_io"] is False
        assert round_trip(be, PB_HW) == (True, True)
        assert be.disk.valid[[0, 1, 2, 3]].all()
    finally:
        be.close()
    be = hw_backend(tmp_path, "cpu", None, PB_HW)
    try:
        assert be.settings.disk.writes == "direct"  # (O_DIRECT where the file system takes it)
    finally:
        be.close()


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_buffered_disk_round_trips_pages(tmp_path):
    """On a GPU: GPU -> disk -> GPU with writes buffered, the refcheck's tags read back."""
    pb = 1 << 20
    be = hw_backend(tmp_path, "gpu", "buffered", pb)
    try:
        assert be.disk.direct_fd is None
        assert round_trip(be, pb) == (True, True)
    finally:
        be.close()
