"""Prioritised disk I/O (the disk tier's ``io_workers``) on both backends.

Sim, on the round profile (disk read 2 GB/s, write 1 GB/s, 1 ms an op, 4 MiB pieces) with
4 MiB pages, so a page is one piece: a read piece takes R = 1 ms + 4 MiB / 2 GB/s, a write
piece W = 1 ms + 4 MiB / 1 GB/s. With one worker the order of the pieces is visible in
the completion times, computed by hand. hw (CPU mode): the disk store's threads are held
by an I/O hook while pieces queue, then released, and the order the pieces reach the
file is checked. The config key's bad values are refused naming it.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from conftest import round_profile, run_events  # noqa: E402
from kvsim.run.seam import settings_for
from kvsim.config import ConfigFileError, load_config
from kvsim.core.datapath.diskio import IoClass
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level

from kvsim_backends.hw.disk import DiskStore
from kvsim_backends.sim import SimBackend, SimRuntime

MiB = 2**20
PB = 4 * MiB
LAT, CALL, PER_PAGE = 1e-3, 10e-6, 2e-6
R = LAT + PB / 2e9
W = LAT + PB / 1e9


def sim(workers=1):
    rt = SimRuntime()
    return rt, SimBackend(rt, settings_for(PB, {lv: 64 for lv in Level}, round_profile(), io_workers=workers))


def batch(src, dst, n, kind, s0=0, d0=0, page=PB):
    return Batch(kind, src, dst, list(range(s0, s0 + n)), list(range(d0, d0 + n)), [0] * n, page, 0)



def test_sim_a_restore_overtakes_queued_eviction_writes():
    rt, be = sim(1)
    ev = be.transfer(batch(Level.HOST, Level.DISK, 4, BatchKind.EVICT))  # takes the worker
    rd = be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, s0=10, d0=10))
    out = run_events(rt, {"evict": ev, "restore": rd})
    assert out["restore"] == (pytest.approx(W + R, rel=1e-9), True)  # after one write piece
    assert out["evict"] == (pytest.approx(4 * W + R, rel=1e-9), True)
    assert be.stats()["disk_pieces"] == 5


def test_sim_an_aged_write_jumps_a_long_restore_once_then_the_reads_go_on():
    rt, be = sim(1)
    rd = be.transfer(batch(Level.DISK, Level.HOST, 10, BatchKind.ONBOARD))
    ev = be.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT, s0=20, d0=20))
    out = run_events(rt, {"restore": rd, "evict": ev})
    j = math.ceil(0.010 / R)  # the read pieces that end before the write has waited 10 ms
    assert out["evict"][0] == pytest.approx(j * R + W, rel=1e-9)
    assert out["restore"][0] == pytest.approx(10 * R + W, rel=1e-9)
    assert be.stats()["disk_jumps"] == 1


def test_sim_background_writes_go_last_unless_promoted():
    for promote in (False, True):
        rt, be = sim(1)
        blocker = be.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT, s0=30, d0=30))
        bg_batch = batch(Level.HOST, Level.DISK, 1, BatchKind.BACKGROUND, s0=31, d0=31)
        bg = be.transfer(bg_batch)
        wr = be.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT, s0=32, d0=32))
        rd = be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD, s0=33, d0=33))
        if promote:
            assert be.promote(bg_batch) == 1
        out = run_events(rt, {"blocker": blocker, "bg": bg, "wr": wr, "rd": rd})
        t = {k: v[0] for k, v in out.items()}
        assert t["blocker"] == pytest.approx(W) and t["rd"] == pytest.approx(W + R)
        if promote:  # pushed before the eviction: first among the writes now
            assert (t["bg"], t["wr"]) == (pytest.approx(2 * W + R), pytest.approx(3 * W + R))
        else:
            assert (t["wr"], t["bg"]) == (pytest.approx(2 * W + R), pytest.approx(3 * W + R))
        assert all(v[1] is True for v in out.values())


def test_sim_a_failed_piece_fails_its_transfer_and_its_queued_pieces_never_run():
    rt, be = sim(1)
    be.fail_next_transfer(1)
    bad = be.transfer(batch(Level.DISK, Level.HOST, 4, BatchKind.ONBOARD))
    good = be.transfer(batch(Level.DISK, Level.HOST, 2, BatchKind.ONBOARD, s0=8, d0=8))
    out = run_events(rt, {"bad": bad, "good": good})
    assert out["bad"] == (pytest.approx(R), False)       # its first piece, then it fails
    assert out["good"] == (pytest.approx(3 * R), True)   # the 3 pieces left never ran
    s = be.stats()
    assert (s["disk_pieces"], s["disk_pieces_dropped"], s["failed_transfers"]) == (3, 3, 1)


def test_sim_n_workers_share_the_device_and_pay_the_op_latency_each():
    rt, be = sim(4)
    out = run_events(rt, {"r": be.transfer(batch(Level.DISK, Level.HOST, 16, BatchKind.ONBOARD))})
    assert out["r"][0] == pytest.approx(4 * (LAT + 4 * PB / 2e9), rel=1e-9)  # 4 waves of 4


def test_sim_gpu_to_disk_pieces_after_the_copy_call():
    rt, be = sim(1)
    out = run_events(rt, {"g": be.transfer(batch(Level.GPU, Level.DISK, 1, BatchKind.EVICT))})
    assert out["g"] == (pytest.approx(CALL + PER_PAGE + W, rel=1e-9), True)


def test_sim_io_workers_zero_is_todays_model():
    rt, be = sim(0)
    assert be.disk_pool is None and "disk_pieces" not in be.stats()
    out = run_events(rt, {"r": be.transfer(batch(Level.DISK, Level.HOST, 1, BatchKind.ONBOARD))})
    assert out["r"][0] == pytest.approx(LAT + PB / 2e9, rel=1e-9)
    with pytest.raises(ValueError, match=r"cache\.tiers\[2\]\.io_workers"):
        sim(-1)


# -- hw (CPU mode): the store's threads ----------------------------------------------

class Gate:
    """An io_hook that records each piece's slot as it reaches the file and holds the
    threads until ``open()``; ``fail_slot`` makes that slot's write raise EIO."""

    def __init__(self, fail_slot=None):
        self.ev = threading.Event()
        self.order: list[int] = []
        self.lock = threading.Lock()
        self.fail_slot = fail_slot

    def __call__(self, op, off, n):
        if op not in ("read", "write"):
            return
        with self.lock:
            self.order.append(off // PB_HW)
        self.ev.wait(10)
        if self.fail_slot is not None and off // PB_HW == self.fail_slot:
            raise OSError(5, "injected EIO")

    def wait_started(self, n):
        deadline = time.monotonic() + 10
        while len(self.order) < n and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(self.order) >= n


PB_HW = 64 << 10


def hw_store(tmp_path, gate, workers=1):
    return DiskStore(tmp_path, 64, PB_HW, io_threads=workers, piece_bytes=PB_HW, io_hook=gate,
                     priorities=True)


def test_hw_pieces_run_reads_then_writes_then_background(tmp_path):
    gate = Gate()
    ds = hw_store(tmp_path, gate)
    try:
        rows = np.zeros((8, PB_HW), np.uint8)
        first = ds.submit_writes(np.array([0]), rows[:1])          # holds the one thread
        gate.wait_started(1)
        bg = ds.submit_writes(np.array([1, 2]), rows[:2], IoClass.BACKGROUND)
        wr = ds.submit_writes(np.array([3, 4]), rows[:2])
        ds.mark_written(np.array([5, 6]))
        rd = ds.submit_reads(np.array([5, 6]), rows[2:4])
        gate.ev.set()
        for f in first + bg + wr + rd:
            f.result(timeout=10)
        assert gate.order == [0, 5, 6, 3, 4, 1, 2]
        assert all(getattr(f, "kv_wait", -1) >= 0 for f in bg + wr + rd)
    finally:
        gate.ev.set()
        ds.close()


def test_hw_promoted_background_pieces_run_with_the_writes(tmp_path):
    gate = Gate()
    ds = hw_store(tmp_path, gate)
    try:
        rows = np.zeros((8, PB_HW), np.uint8)
        first = ds.submit_writes(np.array([0]), rows[:1])
        gate.wait_started(1)
        bg = ds.submit_writes(np.array([1, 2]), rows[:2], IoClass.BACKGROUND, transfer="wt")
        wr = ds.submit_writes(np.array([3]), rows[:1])
        assert ds.pool.promote("wt") == 2
        gate.ev.set()
        for f in first + bg + wr:
            f.result(timeout=10)
        assert gate.order == [0, 1, 2, 3]
    finally:
        gate.ev.set()
        ds.close()


def test_hw_an_aged_write_jumps_the_reads(tmp_path):
    gate = Gate()
    ds = hw_store(tmp_path, gate)
    try:
        rows = np.zeros((8, PB_HW), np.uint8)
        first = ds.submit_writes(np.array([0]), rows[:1])
        gate.wait_started(1)
        wr = ds.submit_writes(np.array([1]), rows[:1])
        time.sleep(0.03)                     # the write has waited more than 10 ms
        ds.mark_written(np.array([4, 5, 6]))
        rd = ds.submit_reads(np.array([4, 5, 6]), rows[2:5])
        gate.ev.set()
        for f in first + wr + rd:
            f.result(timeout=10)
        assert gate.order == [0, 1, 4, 5, 6]
        assert ds.pool.queues.jumps == 1
    finally:
        gate.ev.set()
        ds.close()


def test_hw_a_failed_piece_fails_its_transfer_and_the_rest_do_not_run(tmp_path):
    gate = Gate(fail_slot=1)
    ds = hw_store(tmp_path, gate)
    try:
        rows = np.zeros((8, PB_HW), np.uint8)
        first = ds.submit_writes(np.array([0]), rows[:1])
        gate.wait_started(1)
        bad = ds.submit_writes(np.array([1, 2, 3]), rows[:3])
        other = ds.submit_writes(np.array([6]), rows[:1])
        gate.ev.set()
        first[0].result(timeout=10)
        with pytest.raises(OSError, match="injected EIO"):
            bad[0].result(timeout=10)
        for f in bad[1:]:
            with pytest.raises(OSError, match="another piece of its transfer failed"):
                f.result(timeout=10)
        other[0].result(timeout=10)
        assert gate.order == [0, 1, 6]       # slots 2 and 3 never reached the file
        assert not ds.valid[[1, 2, 3]].any()
        assert (ds.pool.pieces_run, ds.pool.pieces_dropped) == (3, 2)
    finally:
        gate.ev.set()
        ds.close()


def test_hw_backend_reads_io_workers(tmp_path):
    from kvsim_backends.hw import HwBackend, RealtimeRuntime
    from kvsim_backends.hw.iopools import FairPool, PriorityPool
    for n, kind, threads in ((0, FairPool, 4), (3, PriorityPool, 3)):
        be = HwBackend(RealtimeRuntime(), settings_for(PB_HW, {Level.GPU: 4, Level.DISK: 8}, disk_dir=tmp_path, device="cpu", profile=round_profile(), io_workers=n))
        try:
            assert type(be.disk.pool) is kind and len(be.disk.pool._threads) == threads
            rt = be.runtime
            ok = rt.run(be.transfer(batch(Level.GPU, Level.DISK, 2, BatchKind.EVICT, page=PB_HW)))
            assert ok is True and be.disk.valid[[0, 1]].all()
            assert ("disk_pieces" in be.stats()) == (n > 0)
        finally:
            be.close()
    with pytest.raises(ValueError, match=r"cache\.tiers\[1\]\.io_workers"):  # the config model's check
        settings_for(PB_HW, {Level.GPU: 4, Level.DISK: 8}, device="cpu", io_workers=1.5)


# -- the config key -------------------------------------------------------------------

@pytest.mark.parametrize("value, msg", [
    ("-1", "greater than or equal to 0"), ("2.5", "valid integer"), ('"4"', "valid integer"),
    ("true", "boolean"), ("257", "less than or equal to 256"), ("many", "valid integer")])
def test_bad_io_workers_are_refused_naming_the_key(value, msg):
    with pytest.raises(ConfigFileError, match=rf"cache\.tiers\[2\]\.io_workers: .*{msg}"):
        load_config("configs/default.yaml", [f"cache.tiers[2].io_workers={value}"])


def test_io_workers_only_on_the_disk_tier_and_default_off():
    with pytest.raises(ConfigFileError, match=r"cache\.tiers\[1\]: io_workers is only for the disk tier"):
        load_config("configs/default.yaml", ["cache.tiers[1].io_workers=4"])
    cfg = load_config("configs/default.yaml")
    assert cfg.cache.disk_io_workers == 0
    assert load_config("configs/default.yaml", ["cache.tiers[2].io_workers=16"]).cache.disk_io_workers == 16


# -- a replay ---------------------------------------------------------------------------

def test_a_sim_replay_with_io_workers_completes_verified_and_repeats():
    """The default config's sessions (8 of them, GPU 12 GiB, host 2 GiB: the disk serves
    restores), disk tier with 4 workers: every request
    completes, the refcheck (on) finds every restored page's content, disk pages were read
    and written in pieces, and a second run gives the same metrics."""
    from kvsim.run import prepare_run, replay

    out = []
    for _ in range(2):
        cfg = load_config("configs/default.yaml", ["workload.synthetic.n_sessions=8",
                                                   "cache.tiers[2].io_workers=4",
                                                   "cache.tiers[0].quota=12GiB",
                                                   "cache.tiers[1].quota=2GiB"])
        assert cfg.engine.refcheck
        m = replay(prepare_run(cfg)).metrics
        m.pop("wall_time_s")
        out.append(m)
    m = out[0]
    assert m["requests_completed"] > 0 and m["requests_failed"] == 0 and m["failed_batches"] == 0
    assert m["bytes"]["disk_read"] > 0 and m["bytes"]["disk_write"] > 0
    assert out[0] == out[1]


def test_compares_sim_side_reads_disk_checks_as_pool_pieces():
    """kvsim compare's sim side (HwLoopSim) models the hw refcheck of disk pages: with
    io_workers on, as read pieces on the disk pool, queued before writes; promote passes
    through."""
    from kvsim_backends.sim.loopcosts import HwLoopSim
    from kvsim.tools.hwloop import HwLoop, load_hw_loop

    rt, be = sim(1)
    w = HwLoopSim(be, HwLoop(load_hw_loop("h200")))
    blocker = w.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT, s0=40, d0=40))
    wr = w.transfer(batch(Level.HOST, Level.DISK, 1, BatchKind.EVICT, s0=41, d0=41))
    chk = w.read_tags_later(Level.DISK, [50, 51])
    out = run_events(rt, {"blocker": blocker, "wr": wr, "chk": chk})
    assert be.stats()["disk_pieces"] == 4
    assert out["chk"][0] < out["wr"][0]  # the check's pieces went before the queued write
    assert w.promote(batch(Level.HOST, Level.DISK, 1, BatchKind.BACKGROUND)) == 0
