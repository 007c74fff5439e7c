"""The disk tier's ``io_mode: serial`` (seed 004's baseline): one transfer at a time, whole,
in arrival order, a restore behind the writes queued before it, on both backends.

Sim, on the round profile (disk read 2 GB/s, write 1 GB/s, 1 ms an op, 4 MiB pieces) with
4 MiB pages: a read piece takes R = 1 ms + 4 MiB / 2 GB/s, a write piece W = 1 ms + 4 MiB /
1 GB/s, and with one transfer at a time the completion times are sums of them. hw (CPU
mode): the one thread is held by an I/O hook while transfers queue, then released, and
the order the pieces reach the file is checked. The key's bad combinations are refused.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import round_profile, run_events  # noqa: E402
from kvsim.config import ConfigFileError, load_config
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
from kvsim.run.seam import settings_for

from kvsim_backends.hw.disk import DiskStore
from kvsim_backends.sim import SimBackend, SimRuntime

MiB = 2**20
PB = 4 * MiB
R = 1e-3 + PB / 2e9
W = 1e-3 + PB / 1e9


def batch(src, dst, n, kind, s0=0, d0=0, page=PB):
    return Batch(kind, src, dst, list(range(s0, s0 + n)), list(range(d0, d0 + n)), [0] * n, page, 0)



def sim(mode=None, workers=None):
    rt = SimRuntime()
    return rt, SimBackend(rt, settings_for(PB, {lv: 64 for lv in Level}, round_profile(),
                                           io_mode=mode, io_workers=workers))


def test_sim_serial_a_restore_waits_behind_the_writes_queued_before_it():
    rt, be = sim("serial")
    ev1 = be.transfer(batch(Level.HOST, Level.DISK, 4, BatchKind.EVICT))
    ev2 = be.transfer(batch(Level.HOST, Level.DISK, 2, BatchKind.EVICT, s0=4, d0=4))
    rd = be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, s0=10, d0=10))
    out = run_events(rt, {"e1": ev1, "e2": ev2, "rd": rd})
    assert out["e1"] == (pytest.approx(4 * W, rel=1e-9), True)
    assert out["e2"] == (pytest.approx(6 * W, rel=1e-9), True)
    assert out["rd"] == (pytest.approx(6 * W + R, rel=1e-9), True)  # (the pool: W + R)
    assert be.stats()["disk_pieces"] == 7


def test_sim_serial_against_the_pool_and_the_queue():
    """The same two writes and a restore: the pool serves the restore after one write
    piece; the queue (no io_mode, no workers) runs them at once; serial is slowest."""
    def restore_end(mode, workers):
        rt, be = sim(mode, workers)
        be.transfer(batch(Level.HOST, Level.DISK, 4, BatchKind.EVICT))
        rd = be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, s0=10, d0=10))
        return run_events(rt, {"rd": rd})["rd"][0]
    serial, pool = restore_end("serial", None), restore_end("pool", 1)
    assert serial == pytest.approx(4 * W + R, rel=1e-9)
    assert pool == pytest.approx(W + R, rel=1e-9)
    assert restore_end(None, None) < serial


class Gate:
    """An I/O hook that holds the first write until ``ev`` is set and records the order
    of the slots the pieces touch."""

    def __init__(self):
        self.ev = threading.Event()
        self.order: list[int] = []
        self.started = threading.Semaphore(0)

    def __call__(self, op, off, nbytes):
        if op not in ("read", "write"):
            return
        self.order.append(off // PB_HW)
        if len(self.order) == 1:
            self.started.release()
            self.ev.wait(10)


PB_HW = 64 << 10


def test_hw_serial_runs_transfers_whole_in_arrival_order(tmp_path):
    gate = Gate()
    ds = DiskStore(tmp_path, 64, PB_HW, io_threads=8, piece_bytes=PB_HW, io_hook=gate, serial=True)
    try:
        assert len(ds.pool._threads) == 1
        rows = np.zeros((8, PB_HW), np.uint8)
        first = ds.submit_writes(np.array([0]), rows[:1])
        assert gate.started.acquire(timeout=10)
        wr = ds.submit_writes(np.array([3, 4]), rows[:2])
        ds.mark_written(np.array([5, 6]))
        rd = ds.submit_reads(np.array([5, 6]), rows[2:4])
        wr2 = ds.submit_writes(np.array([1]), rows[:1])
        gate.ev.set()
        for f in first + wr + rd + wr2:
            f.result(timeout=10)
        assert gate.order == [0, 3, 4, 5, 6, 1]  # (the pool: 0, 5, 6, 3, 4, 1)
    finally:
        gate.ev.set()
        ds.close()


def test_hw_backend_reads_io_mode(tmp_path):
    from kvsim_backends.hw import HwBackend, RealtimeRuntime
    be = HwBackend(RealtimeRuntime(), settings_for(PB_HW, {Level.GPU: 4, Level.DISK: 8}, disk_dir=tmp_path,
                                                   device="cpu", profile=round_profile(), io_mode="serial"))
    try:
        assert be.disk.pool.serial and len(be.disk.pool._threads) == 1
        ok = be.runtime.run(be.transfer(batch(Level.GPU, Level.DISK, 2, BatchKind.EVICT, page=PB_HW)))
        assert ok is True and be.disk.valid[[0, 1]].all()
    finally:
        be.close()


class Hold:
    """An I/O hook that, once ``armed``, holds the first piece until ``go`` is set, and
    records the disk slot each piece touches from then on."""

    def __init__(self):
        self.armed = False
        self.go = threading.Event()
        self.order: list[int] = []

    def __call__(self, op, off, nbytes):
        if not self.armed or op not in ("read", "write"):
            return
        self.order.append(off // PB_HW)
        if len(self.order) == 1:
            self.go.wait(10)


def test_hw_serial_keeps_a_staged_transfer_whole(tmp_path):
    """GPU <-> disk goes through staging buffers a buffer at a time (here one page each,
    two in flight), so a disk -> GPU read of three pages submits its third piece only
    after its first is done. Serial: a write submitted after the read still waits for
    all three, and the read brings back the bytes the disk held."""
    from kvsim_backends.hw import HwBackend, RealtimeRuntime
    hold = Hold()
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(PB_HW, {Level.GPU: 8, Level.DISK: 32}, disk_dir=tmp_path,
                                    device="cpu", profile=round_profile(), io_mode="serial",
                                    staging_bytes=PB_HW, io_hook=hold))
    try:
        pages = np.arange(3 * PB_HW, dtype=np.uint64).view(np.uint8)[: 3 * PB_HW].reshape(3, PB_HW)
        for f in be.disk.submit_writes(np.array([10, 11, 12]), pages):
            f.result(timeout=10)
        be.disk.mark_written(np.array([10, 11, 12]))
        hold.armed = True
        first = be.transfer(batch(Level.GPU, Level.DISK, 1, BatchKind.EVICT, page=PB_HW))
        read = be.transfer(batch(Level.DISK, Level.GPU, 3, BatchKind.ONBOARD, s0=10, d0=4, page=PB_HW))
        last = be.transfer(batch(Level.GPU, Level.DISK, 1, BatchKind.EVICT, s0=1, d0=20, page=PB_HW))
        threading.Timer(0.3, hold.go.set).start()
        assert rt.run(rt.all_of([first, read, last])) is not None
        assert (first.value, read.value, last.value) == (True, True, True)
        assert hold.order == [0, 10, 11, 12, 20]  # (the read cut in two: 0, 10, 11, 20, 12)
        assert np.array_equal(be.gpu.view[4:7], pages)
        assert be.staged.turn.turns == 3 and not be.staged.turn.busy
    finally:
        hold.go.set()
        be.close()


@pytest.mark.parametrize("sets, msg", [
    (["cache.tiers[2].io_mode=serial", "cache.tiers[2].io_workers=4"], r"tiers\[2\]: .*io_workers must be 0"),
    (["cache.tiers[2].io_mode=pool"], r"tiers\[2\]: io_mode pool needs io_workers > 0"),
    (["cache.tiers[1].io_mode=serial"], r"tiers\[1\]: io_mode is only for the disk tier"),
    (["cache.tiers[2].io_mode=fast"], r"tiers\[2\]\.io_mode: .*'serial' or 'pool'")])
def test_bad_io_mode_is_refused_naming_the_key(sets, msg):
    with pytest.raises(ConfigFileError, match=msg):
        load_config("configs/default.yaml", sets)


from gpuskip import have_gpu  # noqa: E402


@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_serial_disk_round_trips_pages_in_arrival_order(tmp_path):
    """On a GPU: GPU -> disk, then disk -> GPU through io_mode serial, the refcheck's tags
    read back; one disk thread, its pieces counted in the order they came."""
    from kvsim_backends.hw import HwBackend, RealtimeRuntime
    pb = 1 << 20
    be = HwBackend(RealtimeRuntime(), settings_for(pb, {Level.GPU: 8, Level.DISK: 8}, disk_dir=tmp_path,
                                                   device="gpu", io_mode="serial", refcheck=True))
    try:
        assert be.disk.pool.serial and len(be.disk.pool._threads) == 1
        rt = be.runtime
        out = rt.run(be.transfer(batch(Level.GPU, Level.DISK, 4, BatchKind.EVICT, page=pb)))
        back = rt.run(be.transfer(batch(Level.DISK, Level.GPU, 4, BatchKind.ONBOARD, page=pb, d0=4)))
        assert out is True and back is True
        assert be.disk.pool.pieces_run >= 8
    finally:
        be.close()
