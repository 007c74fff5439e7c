"""The hw backend and its real-time runtime.

CPU mode (numpy standing in for device memory, plain mmap for the host tier, a real file
for the disk tier) runs everywhere, CI included: transfers between every pair of tiers,
the refcheck on real bytes, fault injection on the disk path, and the RealtimeRuntime
driving tiny generator processes as one would on SimPy. Tests marked ``gpu`` run the same
scenarios on a CUDA GPU with CuPy, and are skipped cleanly where there is none.
"""

from __future__ import annotations

import errno
import os
import shutil
import time

import numpy as np
import pytest

from kvsim.run.seam import settings_for
from kvsim_backends.hw import HwBackend, RealtimeRuntime
from kvsim_backends.hw import pattern

from kvsim.backend import Backend, Runtime
from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level

PB = 16 << 10


from gpuskip import have_gpu as _have_gpu  # noqa: E402


gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not _have_gpu(), reason="needs CuPy and a CUDA GPU")


def batch(src, dst, ss, ds, pb=PB, kind=BatchKind.EVICT):
    ss, ds = np.asarray(ss, np.int64), np.asarray(ds, np.int64)
    return Batch(kind, src, dst, ss, ds, np.zeros(len(ss), np.uint64), pb, 0)


def tags_for(n, seed=1):
    return np.random.default_rng(seed).integers(1, 2**63, n, dtype=np.int64).astype(np.uint64)


def run1(rt, waitable):
    """Run a runtime until one waitable is done; its value."""
    def proc():
        return (yield waitable)
    return rt.run(rt.process(proc()))


def profile_with(**nvme):
    """The h200-pcie profile with its ``nvme`` keys replaced."""
    from kvsim.config.hardware import HardwareProfile, load_profile

    d = load_profile("h200-pcie").model_dump()
    d["nvme"].update(nvme)
    return HardwareProfile.model_validate(d)


@pytest.fixture
def make(tmp_path):
    made = []

    def _make(device="cpu", pb=PB, gpu_slots=64, host_slots=128, disk_slots=128, **kw):
        rt = RealtimeRuntime()
        slots = {Level.GPU: gpu_slots}
        if host_slots:
            slots[Level.HOST] = host_slots
        if disk_slots:
            slots[Level.DISK] = disk_slots
        be = HwBackend(rt, settings_for(pb, slots, disk_dir=tmp_path if disk_slots else None, device=device, **kw))
        made.append(be)
        return rt, be

    yield _make
    for be in made:
        be.close()


# -- the RealtimeRuntime, narrated like SimPy tests -------------------------------------

def test_runtime_satisfies_the_protocol():
    assert isinstance(RealtimeRuntime(), Runtime)


def test_run_sets_the_gil_switch_interval_and_restores_it():
    """While run() runs, Python's switch interval is the runtime's (so I/O threads get the
    GIL within it from the loop's Python work); after, whatever it was; None leaves it."""
    import sys

    before = sys.getswitchinterval()
    seen = []

    def proc():
        seen.append(sys.getswitchinterval())
        yield rt.timeout(0.001)
        seen.append(sys.getswitchinterval())
        raise KeyError("boom")  # an error out of run() restores it too

    rt = RealtimeRuntime(switch_interval_s=2e-4)
    with pytest.raises(KeyError):
        rt.run(rt.process(proc()))
    assert seen == [pytest.approx(2e-4)] * 2
    assert sys.getswitchinterval() == before
    def untouched():
        yield rt2.timeout(0)
        seen.append(sys.getswitchinterval())

    rt2 = RealtimeRuntime(switch_interval_s=None)
    rt2.run(rt2.process(untouched()))
    assert seen[-1] == before
    with pytest.raises(ValueError, match="switch_interval_s"):
        RealtimeRuntime(switch_interval_s=0)


def test_timeouts_fire_in_time_order_and_now_reads_their_times():
    rt = RealtimeRuntime(time_scale=100.0)  # 100 sim seconds a wall second
    seen = []

    def sleeper(name, delay):
        yield rt.timeout(delay)
        seen.append((name, rt.now))

    for name, d in (("c", 0.3), ("a", 0.1), ("b", 0.2), ("a2", 0.1)):
        rt.process(sleeper(name, d))
    rt.run()
    assert [n for n, _ in seen] == ["a", "a2", "b", "c"]
    assert [t for _, t in seen] == [0.1, 0.1, 0.2, 0.3]


def test_time_scale_maps_sim_seconds_onto_the_wall_clock():
    import time
    rt = RealtimeRuntime(time_scale=50.0)
    t0 = time.perf_counter()
    rt.run(until=1.0)  # one sim second = 20 ms of wall time
    wall = time.perf_counter() - t0
    assert rt.now == 1.0 and 0.015 < wall < 0.5


def test_process_return_values_and_waiting_on_processes():
    rt = RealtimeRuntime(time_scale=1000.0)

    def child(x):
        yield rt.timeout(1.0)
        return x * 2

    def parent():
        a = yield rt.process(child(3))
        b = yield rt.timeout(0.5, value="v")
        return a, b, rt.now

    assert rt.run(rt.process(parent())) == (6, "v", 1.5)


def test_all_of_and_any_of_values():
    rt = RealtimeRuntime(time_scale=1000.0)
    out = {}

    def proc():
        t1, t2 = rt.timeout(1, "one"), rt.timeout(2, "two")
        got = yield rt.all_of([t1, t2])
        out["all"] = (dict(got) == {t1: "one", t2: "two"}, rt.now)
        t3, t4 = rt.timeout(5, "slow"), rt.timeout(1, "fast")
        got = yield rt.any_of([t3, t4])
        out["any"] = (list(got.values()), rt.now)
        e1 = yield rt.all_of([])
        e2 = yield rt.any_of([])
        out["empty"] = (e1, e2)

    rt.run(rt.process(proc()))
    assert out["all"] == (True, 2)
    assert out["any"] == (["fast"], 3)
    assert out["empty"] == ({}, {})


def test_events_triggered_by_succeed_wake_their_waiters_in_order():
    rt = RealtimeRuntime(time_scale=1000.0)
    ev = rt.event()
    got = []

    def waiter(i):
        v = yield ev
        got.append((i, v))

    def trigger():
        yield rt.timeout(1)
        ev.succeed("go")

    for i in range(3):
        rt.process(waiter(i))
    rt.process(trigger())
    rt.run()
    assert got == [(0, "go"), (1, "go"), (2, "go")]
    with pytest.raises(RuntimeError):
        ev.succeed("again")


def test_a_failure_is_thrown_into_the_waiting_process_and_unhandled_ones_raise():
    rt = RealtimeRuntime(time_scale=1000.0)

    def boom():
        yield rt.timeout(1)
        raise KeyError("x")

    def catcher():
        try:
            yield rt.process(boom())
        except KeyError:
            return "caught"

    assert rt.run(rt.process(catcher())) == "caught"
    rt.process(boom())
    with pytest.raises(KeyError):
        rt.run()


def test_external_completions_from_other_threads_and_polled_watches():
    import threading
    rt = RealtimeRuntime()
    ev, trigger = rt.external()
    armed = time.perf_counter()
    threading.Timer(0.02, trigger, args=("from a thread",)).start()
    flag = []
    w = rt.watch(lambda: (True, "polled") if flag else (False, None))
    threading.Timer(0.01, flag.append, args=(1,)).start()
    started = time.perf_counter()
    got = rt.run(rt.all_of([ev, w]))
    assert list(got.values()) == ["from a thread", "polled"]
    # the clock starts at run(): the thread fired 0.02 s after it was armed, just before
    assert rt.now >= 0.02 - (started - armed)


# -- construction and validation -------------------------------------------------------

def test_backend_satisfies_the_protocol(make):
    _, be = make()
    assert isinstance(be, Backend)
    assert be.info["device"] == "cpu"


@pytest.mark.parametrize("kw,field", [
    (dict(page_bytes=0), "page_bytes"),
    (dict(page_bytes=1000), "page_bytes"),
    (dict(slots={Level.GPU: 0}), "slots[GPU]"),
    (dict(slots={Level.HOST: 4}), "slots"),
    (dict(copy_path="dma"), "copy_path"),
    (dict(copy_path={"h2d": "sm_kernel", "d2h": "dma"}), "copy_path.d2h"),
    (dict(copy_path={"up": "sm_kernel"}), "copy_path"),
    (dict(sm_ctas=0), "sm_ctas"),
    (dict(sm_ctas=133), "sm_ctas"),
    (dict(device="tpu"), "device"),
    (dict(slots={Level.GPU: 4, Level.DISK: 4}), "disk.dir"),
])
def test_impossible_sizes_are_rejected_naming_the_parameter(kw, field):
    args = dict(page_bytes=PB, slots={Level.GPU: 4}, device="cpu")
    args.update(kw)
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        HwBackend(RealtimeRuntime(), settings_for(args.pop("page_bytes"), args.pop("slots"), **args))


def test_disk_dir_must_be_a_writable_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for bad, why in ((tmp_path / "missing", "does not exist"), (f, "not a directory")):
        with pytest.raises(OSError, match=why):
            HwBackend(RealtimeRuntime(), settings_for(PB, {Level.GPU: 4, Level.DISK: 4}, disk_dir=bad, device="cpu"))
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(OSError, match="not writable"):
            HwBackend(RealtimeRuntime(), settings_for(PB, {Level.GPU: 4, Level.DISK: 4}, disk_dir=ro, device="cpu"))


def test_the_disk_file_is_private_preallocated_and_removed_on_close(make, tmp_path):
    _, be = make(disk_slots=32)
    path = be.disk.path
    st = os.stat(path)
    assert st.st_mode & 0o777 == 0o600
    assert st.st_size == 32 * PB
    be.close()
    assert not os.path.exists(path)


def test_a_small_disk_batch_shares_the_threads_with_a_large_one_in_flight(tmp_path):
    """Batches in flight take the I/O threads round robin: a one-page write submitted
    behind a 40-page one starts within a job or two, not after all 40 (a FIFO pool's
    head-of-line blocking, which held such writes up to 0.58 s on the H200 machine)."""
    import threading
    from kvsim_backends.hw.disk import DiskStore
    gate, starts, lock = threading.Event(), [], threading.Lock()

    def hook(op, off, n):
        if op not in ("read", "write"):
            return  # the file's creation
        with lock:
            starts.append(off // PB)
        gate.wait(5)  # the first jobs hold their threads until the small write is queued

    ds = DiskStore(tmp_path, 48, PB, io_threads=2, piece_bytes=PB, io_hook=hook)
    try:
        rows = np.zeros((41, PB), dtype=np.uint8)
        big = ds.submit_writes(np.arange(40), rows[:40])
        deadline = time.monotonic() + 5
        while len(starts) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert len(starts) == 2  # both threads busy with the big batch's first pieces
        small = ds.submit_writes(np.array([47]), rows[40:])
        gate.set()
        for f in big + small:
            f.result(timeout=10)
        assert sorted(starts) == list(range(40)) + [47]  # every piece ran once
        assert starts.index(47) <= 3  # FIFO: 40
    finally:
        gate.set()
        ds.close()


def test_a_disk_too_small_for_the_tier_fails_construction_with_the_sizes(tmp_path, monkeypatch):
    def no_space(fd, off, n):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(OSError, match=r"slots\[DISK\].*needs"):
        HwBackend(RealtimeRuntime(), settings_for(PB, {Level.GPU: 4, Level.DISK: 8}, disk_dir=tmp_path, device="cpu"))
    assert os.listdir(tmp_path) == []  # nothing left behind


# -- the refcheck on real bytes -----------------------------------------------------------

def test_splitmix64_is_the_reference_function():
    # splitmix64's first output for seed 0 (the published reference sequence)
    assert int(pattern.splitmix64(np.array([0], np.uint64))[0]) == 0xE220A8397B1DCDAF
    x = np.arange(5, dtype=np.uint64)
    pattern.splitmix64(x)
    assert (x == np.arange(5)).all()  # the input is left alone


def test_patterns_recover_tags_and_catch_torn_and_misplaced_pages():
    view = np.zeros((4, 4096), np.uint8)
    tags = tags_for(4)
    pattern.write_pages(view, np.arange(4), tags)
    assert (pattern.verify_pages(view, np.arange(4)) == tags).all()
    view[1, 2048:] = view[2, 2048:]  # torn: half of another page
    view[3, 100] ^= 1                # one flipped bit
    got = pattern.verify_pages(view, np.arange(4))
    assert got[0] == tags[0] and got[2] == tags[2]
    assert got[1] == 0 and got[3] == 0
    assert pattern.verify_pages(np.zeros((1, 4096), np.uint8), [0])[0] == 0  # never written


@pytest.mark.parametrize("page_bytes", [4096, 1 << 20])  # many pages a tile; two tiles a page
def test_verify_in_parallel_tiles_equals_serial(page_bytes):
    from concurrent.futures import ThreadPoolExecutor

    n = 40
    view = np.zeros((n, page_bytes), np.uint8)
    tags = tags_for(n)
    pattern.write_pages(view, np.arange(n), tags)
    view[3, page_bytes - 1] ^= 1        # last word of a page (the last tile of a big page)
    view[17, 8:16] = view[18, 8:16]     # word 1 from another page
    view[30, :8] = view[31, :8]         # word 0 says another page's tag
    slots = np.arange(n)[::-1].copy()
    want = tags[::-1].copy()
    want[[n - 1 - 3, n - 1 - 17, n - 1 - 30]] = 0
    with ThreadPoolExecutor(3) as pool:
        for got in (pattern.verify_pages(view, slots), pattern.verify_pages(view, slots, pool=pool),
                    pattern.verify_rows(view[slots], pool=pool)):
            assert (got == want).all()


def test_fill_then_read_tags_on_every_tier(make):
    _, be = make()
    t = tags_for(8)
    for lv in (Level.GPU, Level.HOST, Level.DISK):
        be.fill(Fill(lv, np.arange(8) * 3, t))
        assert (be.read_tags(lv, np.arange(8) * 3) == t).all(), lv
        assert (be.read_tags(lv, np.array([1, 2])) == 0).all()


def _later_checks(make, device):
    """read_tags_later gives what read_tags gives, on every tier, without the caller's
    thread doing the check; a corrupted page reads as no tag."""
    rt, be = make(device=device)
    t = tags_for(8)
    slots = np.arange(8) * 3
    for lv in (Level.GPU, Level.HOST, Level.DISK):
        be.fill(Fill(lv, slots, t))
        assert (run1(rt, be.read_tags_later(lv, slots)) == t).all(), lv
        assert (run1(rt, be.read_tags_later(lv, np.array([1, 2]))) == 0).all(), lv
    be.host.view[slots[2], 4096] ^= 1  # one flipped bit inside a host page
    got = run1(rt, be.read_tags_later(Level.HOST, slots))
    assert got[2] == 0 and (np.delete(got, 2) == np.delete(t, 2)).all()
    assert run1(rt, be.read_tags_later(Level.GPU, np.zeros(0, np.int64))).size == 0
    return rt, be, slots


def test_read_tags_later_checks_every_tier_off_the_loop(make):
    rt, be, slots = _later_checks(make, "cpu")
    shutil.rmtree(be.disk.path, ignore_errors=True)
    os.close(be.disk.fd)  # the disk tier's file is gone: the read fails
    be.disk.fd = os.open(os.devnull, os.O_RDONLY)
    if be.disk.direct_fd is not None:
        os.close(be.disk.direct_fd)
        be.disk.direct_fd = None
    # the refcheck fails loudly, saying it could not read (never passes, never blames the bytes)
    with pytest.raises(OSError, match="refcheck could not read back 8 DISK page"):
        run1(rt, be.read_tags_later(Level.DISK, slots))
    assert any("refcheck read" in e for e in be.errors)


@gpu
@needs_gpu
def test_gpu_read_tags_later_checks_host_pages_through_the_mapped_address(make):
    _, be, _ = _later_checks(make, "gpu")
    assert be.host.dev_ptr is not None


@gpu
@needs_gpu
def test_gpu_check_in_parts_finds_a_wrong_word_in_any_part(make):
    """kv_check splits a page into parts of 64 KiB, a CTA each: a wrong word in the first,
    a middle or the last part (host pages through the mapped address, and GPU pages) makes
    that page, and only it, read as no tag."""
    rt, be = make(device="gpu", pb=1 << 20, gpu_slots=8, host_slots=8, disk_slots=0)
    t = tags_for(8)
    slots = np.arange(8)
    wrong = {1: 8, 3: 5 * 65536 + 800, 6: (1 << 20) - 1}  # page -> byte offset
    for lv in (Level.GPU, Level.HOST):
        be.fill(Fill(lv, slots, t))
        be.streams["compute"].synchronize()
        for page, off in wrong.items():
            if lv == Level.HOST:
                be.host.view[page, off] ^= 4
            else:
                be.gpu.view[page, off] ^= 4
        be.cp.cuda.Device().synchronize()  # (the xor ran on CuPy's current stream)
        want = t.copy()
        want[list(wrong)] = 0
        assert (be.read_tags(lv, slots) == want).all(), lv
        assert (run1(rt, be.read_tags_later(lv, slots)) == want).all(), lv


@gpu
@needs_gpu
@pytest.mark.parametrize("refcheck", [True, False])
def test_gpu_fill_in_parts_writes_what_numpy_writes(make, refcheck):
    """kv_fill writes a page in parts of 64 KiB, a CTA each: every byte of every page (1 MiB
    pages: 16 parts; slots out of order, one page a part smaller than the span) is what
    ``pattern.write_pages`` writes; without the refcheck only word 0, the rest untouched."""
    for pb in (1 << 20, 24 * 1024):
        rt, be = make(device="gpu", pb=pb, gpu_slots=16, host_slots=0, disk_slots=0, refcheck=refcheck)
        slots = np.array([9, 2, 15, 0, 7], np.int64)
        t = tags_for(len(slots), 3)
        be.gpu.view[:] = 0xAB  # (on CuPy's current stream)
        be.cp.cuda.Device().synchronize()
        be.fill(Fill(Level.GPU, slots, t))
        be.streams["compute"].synchronize()
        want = np.full((16, pb), 0xAB, np.uint8)
        pattern.write_pages(want, slots, t, full=refcheck)
        got = be.cp.asnumpy(be.gpu.view)
        assert (got == want).all(), (pb, refcheck)
        be.close()


@gpu
@needs_gpu
def test_gpu_write_waits_for_a_pending_check_of_its_slots_only(make):
    """A GPU check the engine does not wait for (a resumed request's pages) reads its pages
    before a later write into them; a write into other slots does not wait for it."""
    rt, be = make(device="gpu", pb=1 << 20, gpu_slots=512, host_slots=0, disk_slots=0)
    old, new = tags_for(256, 1), tags_for(256, 2)
    mine, other = np.arange(256), np.arange(256, 512)
    be.fill(Fill(Level.GPU, mine, old))
    be.streams["compute"].synchronize()
    later = be.read_tags_later(Level.GPU, mine)     # 256 MiB to read: still running below
    compute = be.streams["compute"].ptr
    be.fill(Fill(Level.GPU, other, new))
    assert be.order.check_waited.get(compute) is None  # other slots: no wait
    be.fill(Fill(Level.GPU, mine, new))             # the same slots: after the check
    assert be.order.check_waited.get(compute) is be.order.check_event
    assert (run1(rt, later) == old).all()
    assert not be.order.checking.any()  # the loop saw it finish
    assert (be.read_tags(Level.GPU, mine) == new).all()


# -- transfers in CPU mode ----------------------------------------------------------------

def roundtrip(rt, be, n=24, seed=0):
    """GPU -> host -> disk -> GPU and GPU -> disk -> host, checking tags at every hop."""
    rng = np.random.default_rng(seed)
    t = tags_for(n, seed)
    g = rng.permutation(be.slots[Level.GPU])[:n]
    be.fill(Fill(Level.GPU, g, t))
    h = rng.permutation(be.slots[Level.HOST])[:n]
    d = rng.permutation(be.slots[Level.DISK])[:n]
    g2 = rng.permutation(be.slots[Level.GPU])[:n]
    d2 = np.setdiff1d(np.arange(be.slots[Level.DISK]), d)[:n]
    h2 = np.setdiff1d(np.arange(be.slots[Level.HOST]), h)[:n]
    steps = [(Level.GPU, Level.HOST, g, h), (Level.HOST, Level.DISK, h, d),
             (Level.DISK, Level.GPU, d, g2), (Level.GPU, Level.DISK, g2, d2),
             (Level.DISK, Level.HOST, d2, h2), (Level.HOST, Level.GPU, h2, g)]
    for src, dst, ss, ds in steps:
        assert run1(rt, be.transfer(batch(src, dst, ss, ds, be.page_bytes))) is True, (src, dst, list(be.errors))
        assert (be.read_tags(dst, ds) == t).all(), (src, dst)


def test_pages_round_trip_through_every_tier_in_cpu_mode(make):
    rt, be = make()
    roundtrip(rt, be)
    assert not be.errors


def test_the_timing_log_times_a_disk_batchs_io_inside_its_transfer(make):
    """Every disk batch's log row says when its first piece started on an I/O thread and
    when its last ended, from the transfer call: 0 <= start <= end <= the batch's seconds;
    GPU <-> host rows have neither. The compare's transfer table takes their medians."""
    from kvsim.tools.compare import transfer_table

    log: list = []
    rt, be = make(pb=1 << 20, gpu_slots=16, host_slots=24, disk_slots=24, profile=profile_with(piece=256 << 10),
                  staging_bytes=3 << 20, timing_log=log)
    roundtrip(rt, be, n=10)
    disk = [r for r in log if "disk" in (r["src"], r["dst"])]
    assert len(disk) == 4 and len(log) == 6
    for r in disk:
        assert 0 <= r["io_start_s"] <= r["io_end_s"] <= r["seconds"], r
    assert not any("io_start_s" in r for r in log if r not in disk)
    table = transfer_table(log)
    hd = table["host->disk disk"]
    assert 0 <= hd["io_wait_s_p50"] and 0 < hd["io_s_p50"] and 0 <= hd["after_io_s_p50"]
    assert "io_s_p50" not in table["gpu->host " + be.copy_paths["d2h"].value]


def test_large_pages_split_into_pieces_and_staging_chunks(make):
    # 1 MiB pages, 256 KiB pieces, a staging buffer of 3 pages: every pipeline stage loops
    rt, be = make(pb=1 << 20, gpu_slots=16, host_slots=24, disk_slots=24,
                  profile=profile_with(piece=256 << 10), staging_bytes=3 << 20)
    assert be.disk.piece_bytes == 256 << 10
    roundtrip(rt, be, n=10)


def test_gpu_to_gpu_copy_and_concurrent_batches(make):
    rt, be = make()
    t = tags_for(8)
    be.fill(Fill(Level.GPU, np.arange(8), t))
    a = be.transfer(batch(Level.GPU, Level.GPU, np.arange(8), np.arange(8) + 40, kind=BatchKind.COPY))
    b = be.transfer(batch(Level.GPU, Level.HOST, np.arange(8), np.arange(8)))
    c = be.transfer(batch(Level.GPU, Level.DISK, np.arange(8), np.arange(8)))
    assert list(rt.run(rt.all_of([a, b, c])).values()) == [True, True, True]
    for lv, s in ((Level.GPU, np.arange(8) + 40), (Level.HOST, np.arange(8)), (Level.DISK, np.arange(8))):
        assert (be.read_tags(lv, s) == t).all()


def test_a_page_restored_into_the_wrong_slot_is_caught(make):
    rt, be = make()
    t = tags_for(4)
    be.fill(Fill(Level.HOST, np.arange(4), t))
    run1(rt, be.transfer(batch(Level.HOST, Level.GPU, [0, 1, 2, 3], [10, 11, 13, 12])))
    assert (be.read_tags(Level.GPU, [10, 11, 12, 13]) != t).sum() == 2


def test_compute_takes_about_its_duration_in_cpu_mode(make):
    rt, be = make(disk_slots=0)
    assert run1(rt, be.compute(0.02)) == pytest.approx(0.02)
    assert rt.now == pytest.approx(0.02)


# -- fault injection on the disk path ----------------------------------------------------

def test_a_failed_pwrite_fails_the_transfer_and_the_copy_is_never_served(make):
    calls = []

    def hook(op, off, n):
        calls.append(op)
        if op == "write" and off >= 5 * PB:
            raise OSError(errno.EIO, "injected write failure")

    rt, be = make(io_hook=hook)
    t = tags_for(8)
    be.fill(Fill(Level.HOST, np.arange(8), t))
    assert run1(rt, be.transfer(batch(Level.HOST, Level.DISK, np.arange(8), np.arange(8)))) is False
    assert any("injected" in e for e in be.errors)
    # the disk copy is not served: a restore from it fails instead of returning garbage
    assert run1(rt, be.transfer(batch(Level.DISK, Level.GPU, np.arange(8), np.arange(8)))) is False
    assert run1(rt, be.transfer(batch(Level.DISK, Level.HOST, [6], [20]))) is False
    # ... and the torn slots read as no content
    assert (be.read_tags(Level.DISK, np.arange(5, 8)) != t[5:]).all()


def test_enospc_while_writing_fails_the_transfer(make):
    def hook(op, off, n):
        if op == "write":
            raise OSError(errno.ENOSPC, "No space left on device")

    rt, be = make(io_hook=hook)
    be.fill(Fill(Level.GPU, np.arange(4), tags_for(4)))
    assert run1(rt, be.transfer(batch(Level.GPU, Level.DISK, np.arange(4), np.arange(4)))) is False
    assert any("No space" in e for e in be.errors)
    assert run1(rt, be.transfer(batch(Level.DISK, Level.GPU, np.arange(4), np.arange(4)))) is False


def test_a_failed_read_fails_the_restore(make):
    def hook(op, off, n):
        if op == "read":
            raise OSError(errno.EIO, "injected read failure")

    rt, be = make(io_hook=hook)
    be.fill(Fill(Level.GPU, np.arange(4), tags_for(4)))
    assert run1(rt, be.transfer(batch(Level.GPU, Level.DISK, np.arange(4), np.arange(4)))) is True
    assert run1(rt, be.transfer(batch(Level.DISK, Level.GPU, np.arange(4), np.arange(4) + 8))) is False
    assert run1(rt, be.transfer(batch(Level.DISK, Level.HOST, np.arange(4), np.arange(4)))) is False


def test_the_disk_directory_removed_under_the_backend(make, tmp_path):
    rt, be = make()
    t = tags_for(4)
    be.fill(Fill(Level.GPU, np.arange(4), t))
    assert run1(rt, be.transfer(batch(Level.GPU, Level.DISK, np.arange(4), np.arange(4)))) is True
    shutil.rmtree(tmp_path)
    # writes fail clearly; completed copies stay readable through the open file
    assert run1(rt, be.transfer(batch(Level.GPU, Level.DISK, np.arange(4), np.arange(4) + 8))) is False
    assert any("removed" in e for e in be.errors)
    assert run1(rt, be.transfer(batch(Level.DISK, Level.HOST, np.arange(4), np.arange(4)))) is True
    assert (be.read_tags(Level.HOST, np.arange(4)) == t).all()


# -- on a GPU ---------------------------------------------------------------------------

@gpu
@needs_gpu
@pytest.mark.parametrize("path", [CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL])
@pytest.mark.parametrize("pb", [16 << 10, 1 << 20])
def test_gpu_round_trip_on_each_copy_path(make, path, pb):
    rt, be = make(device="gpu", pb=pb, gpu_slots=96, host_slots=96, disk_slots=96, copy_path=path)
    assert be.info["device"] == "gpu" and be.copy_path == path
    roundtrip(rt, be, n=40)
    assert not be.errors


@gpu
@needs_gpu
def test_gpu_both_paths_move_the_same_bytes_and_the_refcheck_catches_misplacement(make):
    rt, be = make(device="gpu", pb=64 << 10, gpu_slots=256, host_slots=256, disk_slots=0)
    t = tags_for(128)
    g = np.random.default_rng(3).permutation(256)[:128]
    be.fill(Fill(Level.GPU, g, t))
    for path, base in ((CopyPath.COPY_ENGINE, 0), (CopyPath.SM_KERNEL, 128)):
        ok = run1(rt, be.transfer(batch(Level.GPU, Level.HOST, g, np.arange(128) + base, 64 << 10), path=path))
        assert ok is True
        assert (be.read_tags(Level.HOST, np.arange(128) + base) == t).all(), path
    assert np.array_equal(be.host.view[:128], be.host.view[128:])
    run1(rt, be.transfer(batch(Level.HOST, Level.GPU, [0, 1], [g[1], g[0]], 64 << 10)))
    assert list(be.read_tags(Level.GPU, g[:2])) == [t[1], t[0]]


@gpu
@needs_gpu
def test_gpu_compute_kernel_by_kernel_occupies_about_its_duration(make):
    rt, be = make(device="gpu", disk_slots=0, compute_graphs=False)
    assert be.info["compute_graphs"] is False
    took = run1(rt, be.compute(0.05))
    assert 0.04 < took < 0.08
    assert be.info["busy_iters_per_s"] > 0


@gpu
@needs_gpu
def test_gpu_compute_through_graphs_occupies_about_its_duration(make):
    rt, be = make(device="gpu", disk_slots=0)
    assert be.info["compute_graphs"] is True  # the default
    prio = be.info["stream_priorities"]  # copies and checks before compute (lower = higher)
    assert all(prio[k] < prio["compute"] for k in ("h2d", "d2h", "d2d", "misc")), prio
    for d in (0.05, 0.0123):
        took = run1(rt, be.compute(d))
        assert 0.8 * d < took < 0.8 * d + 0.03, (d, took)
    assert be.kernels._graphs  # the chunks went as captured graphs


@gpu
@needs_gpu
def test_gpu_compute_log_measures_the_loops_host_lag_and_the_streams_gap(tmp_path):
    """Two computes; between them the loop's thread is busy 20 ms (a sleep in the process
    that resumes when the first is seen). The second row's host lag is those 20 ms (and
    a little), and the compute stream's GPU gap before it at least that; the first row
    has no gap (nothing before it)."""
    rt = RealtimeRuntime()
    log: list = []
    be = HwBackend(rt, settings_for(PB, {Level.GPU: 16}, device="gpu", compute_log=log))
    try:
        def proc():
            yield be.compute(0.01)
            time.sleep(0.02)
            yield be.compute(0.01)
        rt.run(rt.process(proc()))
    finally:
        be.close()
    assert [len(r) for r in log] == [8, 8]  # (logs.py: the row's fields)
    assert [r[7] for r in log] == [0, 0]  # (one rank: rank 0's calls)
    assert log[0][4] is None and log[0][5] < 0.005
    assert 0.02 <= log[1][5] < 0.04, log[1]
    assert 0.02 <= log[1][4] < 0.05, log[1]
    assert all(0.008 < r[2] < 0.03 and r[3] >= r[2] for r in log), log


def test_realtime_clock_starts_at_run_not_at_construction():
    """Building a backend can take seconds; that is not sim time: the first event a run
    sees happens at the runtime's start time, not at start + setup time."""
    rt = RealtimeRuntime(time_scale=1.0)
    time.sleep(0.2)  # a slow setup between construction and run()
    seen = []

    def proc():
        seen.append(rt.now)
        yield rt.timeout(0.01)
        seen.append(rt.now)

    rt.run(rt.process(proc()))
    assert seen[0] < 0.05, seen
    assert 0.01 <= seen[1] < 0.06, seen


@gpu
@needs_gpu
def test_gpu_copy_ctas_an_sm_holds_are_the_drivers_occupancy(make):
    """The backend's ``copy_ctas_per_sm`` (what calibrate writes into the profile) is the
    copy kernel's resident CTAs an SM as the driver's occupancy calculator gives them."""
    driver = pytest.importorskip("cuda.bindings.driver")
    _, be = make(device="gpu")
    threads = be.threads_per_cta
    err, got = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        driver.CUfunction(be.kernels.copy.kernel.ptr), threads, 0)
    assert err == driver.CUresult.CUDA_SUCCESS
    assert be.info["copy_ctas_per_sm"] == got >= 1
