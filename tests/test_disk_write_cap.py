"""The disk tier's write cap (``io_write_share``) on both backends, and its config key.

While a restore's piece is queued or in flight, at most K = ``write_cap(N, share)`` write
pieces may be in flight (``kvsim.core.datapath.diskio``). Sim, on the round profile (disk read
2 GB/s, write 1 GB/s, 1 ms an op, 4 MiB pieces and pages): four workers, an eviction of
four pages holds them, a one-page restore A and a second eviction wait for them; when
they end A and then one write (K = 1) or three (no cap) start, and a second restore B issued half a
millisecond later starts at once on a free worker (cap) or waits for A's worker (no
cap); the completion times are computed by hand. hw (CPU mode): each piece is held at
the file by an I/O hook until the test releases it, and which pieces reach the file
while the read runs is checked.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import round_profile  # noqa: E402
from kvsim.run.seam import settings_for
from kvsim.config import ConfigFileError, load_config
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level

from kvsim_backends.hw.disk import DiskStore
from kvsim_backends.sim import SimBackend, SimRuntime

MiB = 2**20
PB = 4 * MiB
LAT = 1e-3
R = LAT + PB / 2e9          # one read piece alone on the disk
T1 = LAT + 4 * PB / 1e9     # four write pieces sharing the disk's write rate


def batch(src, dst, n, kind, s0=0, d0=0, page=PB):
    return Batch(kind, src, dst, list(range(s0, s0 + n)), list(range(d0, d0 + n)), [0] * n, page, 0)


def two_restores_behind_an_eviction(share):
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(PB, {lv: 64 for lv in Level}, round_profile(), io_workers=4, io_write_share=share))
    out = {}

    def watch(name, ev):
        v = yield ev
        out[name] = (rt.now, v)

    def later(t, name, b):
        yield rt.timeout(t)
        yield from watch(name, be.transfer(b))
    rt.process(watch("evict", be.transfer(batch(Level.HOST, Level.DISK, 4, BatchKind.EVICT))))
    # (queued 1 ms before the first four end: young enough not to age while A and B run)
    rt.process(later(T1 - 1e-3, "evict2", batch(Level.HOST, Level.DISK, 4, BatchKind.EVICT, 4, 4)))
    rt.process(later(T1 + 0.5e-3, "B", batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, 21, 21)))
    rt.process(watch("A", be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD,
                                            s0=20, d0=20))))
    rt.run()
    return be, out


def test_sim_with_the_cap_a_second_restore_finds_a_free_worker():
    be, out = two_restores_behind_an_eviction(0.25)  # 4 workers: K = 1
    assert be.disk_pool.queues.rule.write_cap == 1
    # A starts at T1, its op then its bytes; B's op from T1 + 0.5 ms: from T1 + 1 ms the
    # disk's read rate moves A's and B's bytes back to back
    assert out["A"] == (pytest.approx(T1 + 1.5e-3 + (PB - 1e6) / 1e9, rel=1e-9), True)
    assert out["B"] == (pytest.approx(T1 + LAT + PB / 1e9, rel=1e-9), True)
    assert out["evict"] == (pytest.approx(T1, rel=1e-9), True)
    assert out["evict2"][1] is True


def test_sim_without_the_cap_the_second_restore_waits_for_a_worker():
    be, out = two_restores_behind_an_eviction(1.0)   # K = 4: no cap
    assert be.disk_pool.queues.rule.write_cap == 4
    assert out["A"] == (pytest.approx(T1 + R, rel=1e-9), True)
    assert out["B"] == (pytest.approx(T1 + 2 * R, rel=1e-9), True)  # A's worker, then alone


def test_sim_the_cap_leaves_a_write_only_load_alone():
    ends = []
    for share in (0.25, 1.0):
        rt = SimRuntime()
        be = SimBackend(rt, settings_for(PB, {lv: 64 for lv in Level}, round_profile(), io_workers=4, io_write_share=share))
        ev = be.transfer(batch(Level.HOST, Level.DISK, 8, BatchKind.EVICT))
        rt.run()
        ends.append(rt.now)
        assert ev.value is True
    assert ends[0] == ends[1] == pytest.approx(2 * T1, rel=1e-9)


# -- hw (CPU mode): the store's threads ----------------------------------------------

PB_HW = 64 << 10


class SlotGate:
    """An io_hook that records each piece's slot as it reaches the file and holds it
    there until ``release(slot)``."""

    def __init__(self):
        self.lock = threading.Lock()
        self.order: list[int] = []
        self.events: dict[int, threading.Event] = {}

    def _ev(self, slot):
        with self.lock:
            return self.events.setdefault(slot, threading.Event())

    def __call__(self, op, off, n):
        if op not in ("read", "write"):
            return
        slot = off // PB_HW
        ev = self._ev(slot)
        with self.lock:
            self.order.append(slot)
        ev.wait(10)

    def release(self, *slots):
        for s in slots:
            self._ev(s).set()

    def release_all(self):
        with self.lock:
            evs = list(self.events.values())
        for e in evs:
            e.set()
        for s in range(64):
            self._ev(s).set()

    def wait_started(self, n):
        deadline = time.monotonic() + 10
        while len(self.order) < n and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(self.order) >= n, self.order


def started_during_a_read(tmp_path, share, expect):
    """Four threads; writes to slots 0-7 (one transfer), the first four held at the file;
    a read of slot 20 queued; then the four writes end one by one. The slots that reached
    the file while the read was held (once ``expect`` had, and 50 ms more), then all of
    them once it ended."""
    gate = SlotGate()
    ds = DiskStore(tmp_path, 64, PB_HW, io_threads=4, piece_bytes=PB_HW, io_hook=gate,
                   priorities=True, io_write_share=share)
    try:
        rows = np.zeros((8, PB_HW), np.uint8)
        wr = ds.submit_writes(np.arange(8), rows)
        gate.wait_started(4)
        ds.mark_written(np.array([20]))
        rd = ds.submit_reads(np.array([20]), rows[:1].copy())
        gate.release(0)
        gate.wait_started(5)                  # the freed thread took the read
        for s in (1, 2, 3):
            gate.release(s)
            wr[s].result(timeout=10)
        gate.wait_started(expect)
        time.sleep(0.05)                      # (no more start)
        during = list(gate.order)
        gate.release(20)
        rd[0].result(timeout=10)
        gate.release_all()
        for f in wr:
            f.result(timeout=10)
        return during, list(gate.order)
    finally:
        gate.release_all()
        ds.close()


def test_hw_with_the_cap_a_read_in_flight_holds_the_writes_to_k(tmp_path):
    during, after = started_during_a_read(tmp_path, 0.25, 6)      # K = 1
    # the read took w0's thread; w1 and w2 ended while w3 was in flight, w4 only after
    assert during[:5] == [0, 1, 2, 3, 20] and during[5:] == [4]
    assert sorted(after) == [0, 1, 2, 3, 4, 5, 6, 7, 20]


def test_hw_without_the_cap_the_freed_threads_go_to_the_writes(tmp_path):
    during, after = started_during_a_read(tmp_path, 1.0, 8)
    assert during[:5] == [0, 1, 2, 3, 20] and sorted(during[5:]) == [4, 5, 6]
    assert sorted(after) == [0, 1, 2, 3, 4, 5, 6, 7, 20]


def test_hw_a_failed_piece_under_the_cap_frees_its_place(tmp_path):
    """Two threads, K = 1: a write piece and a read are held at the file, two writes
    queue behind the cap. The write piece raises: it is no longer in flight, so a queued
    write starts while the read is still held, and the pool drains."""
    fail_now, read_go = threading.Event(), threading.Event()

    def hook(op, off, n):
        if op == "write" and off // PB_HW == 0:
            fail_now.wait(10)
            raise OSError(5, "injected EIO")
        if op == "read":
            read_go.wait(10)

    ds = DiskStore(tmp_path, 64, PB_HW, io_threads=2, piece_bytes=PB_HW, io_hook=hook,
                   priorities=True, io_write_share=0.5)
    try:
        assert ds.pool.queues.rule.write_cap == 1
        rows = np.zeros((4, PB_HW), np.uint8)
        bad = ds.submit_writes(np.array([0]), rows[:1])
        ds.mark_written(np.array([9]))
        rd = ds.submit_reads(np.array([9]), rows[1:2].copy())
        good = ds.submit_writes(np.array([5, 6]), rows[2:4])
        time.sleep(0.02)
        assert not good[0].done()             # held back: w0 in flight while the read runs
        fail_now.set()
        with pytest.raises(OSError, match="injected EIO"):
            bad[0].result(timeout=5)
        good[0].result(timeout=5)             # the read is still held
        assert not rd[0].done()
        read_go.set()
        for f in rd + good:
            f.result(timeout=5)
        q = ds.pool.queues
        assert len(q) == 0 and all(q.running(c) == 0 for c in range(3))
    finally:
        fail_now.set()
        read_go.set()
        ds.close()


# -- the key, end to end ----------------------------------------------------------------

def test_both_backends_built_from_a_config_read_the_key(tmp_path):
    from kvsim.core.manager import TierManager
    from kvsim.run import build_backend, prepare_run

    cfg = load_config("configs/default.yaml", ["workload.synthetic.n_sessions=2",
                                               "cache.tiers[0].quota=1GiB",
                                               "cache.tiers[1].quota=1GiB",
                                               "cache.tiers[2].quota=1GiB",
                                               "cache.tiers[2].io_workers=8",
                                               "cache.tiers[2].io_write_share=0.5"])
    prep = prepare_run(cfg)
    _, _, sim_be = build_backend(prep, TierManager(prep.spec), "sim")
    assert sim_be.disk_pool.queues.rule.write_cap == 4
    _, _, hw_be = build_backend(prep, TierManager(prep.spec), "hw",
                                {"device": "cpu", "disk_dir": str(tmp_path)})
    try:
        assert hw_be.disk.pool.queues.rule.write_cap == 4
    finally:
        hw_be.close()


def test_backend_settings_with_a_bad_share_cannot_be_made_naming_it():
    """The share's range is checked once, by the config model: settings for either
    backend go through it (``kvsim.run.seam``), so a bad share never reaches one."""
    for share in (1.5, -0.1):
        with pytest.raises(ConfigFileError, match=r"cache\.tiers\[1\]\.io_write_share"):
            settings_for(PB, {Level.GPU: 4, Level.DISK: 4}, round_profile(), io_workers=4,
                         io_write_share=share)


@pytest.mark.parametrize("sets, msg", [
    (["cache.tiers[2].io_workers=4", "cache.tiers[2].io_write_share=1.5"],
     r"cache\.tiers\[2\]\.io_write_share: .*less than or equal to 1"),
    (["cache.tiers[2].io_workers=4", "cache.tiers[2].io_write_share=-0.5"],
     r"cache\.tiers\[2\]\.io_write_share: .*greater than or equal to 0"),
    (["cache.tiers[2].io_workers=4", "cache.tiers[2].io_write_share=true"],
     r"cache\.tiers\[2\]\.io_write_share: .*boolean"),
    (["cache.tiers[2].io_write_share=0.5"],
     r"cache\.tiers\[2\]: io_write_share needs io_workers > 0"),
    (["cache.tiers[1].io_write_share=0.5"],
     r"cache\.tiers\[1\]: io_write_share is only for the disk tier"),
])
def test_bad_io_write_share_is_refused_naming_the_key(sets, msg):
    with pytest.raises(ConfigFileError, match=msg):
        load_config("configs/default.yaml", sets)


def test_io_write_share_defaults_to_a_quarter():
    assert load_config("configs/default.yaml").cache.disk_io_write_share == 0.25
    cfg = load_config("configs/default.yaml", ["cache.tiers[2].io_workers=4",
                                               "cache.tiers[2].io_write_share=1"])
    assert cfg.cache.disk_io_write_share == 1.0
