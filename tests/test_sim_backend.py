"""The SimPy backend, on a round-number profile, with timings computed by hand.

Round profile: link H2D 50 GB/s, D2H 40 GB/s, both 80 GB/s; 2 copy engines, 10 us a call
+ 2 us a page; copy CTAs 10 GB/s each, 8 CTA slots, 5 us launch; an SM kernel slows
compute by 0.05 a CTA, a copy-engine transfer by 0.1, and its CTAs run at half rate while
compute runs; disk read 2 GB/s, write 1 GB/s, 1 ms an op, queue depth 4; HBM 4 TB/s.
"""


import numpy as np
import pytest

from kvsim.run.seam import settings_for
from kvsim.backend import Backend, Runtime
from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level
from conftest import round_profile  # noqa: E402  (shared with the compute-model tests)
from kvsim.config.hardware import ProfileError, load_profile

from kvsim_backends.sim import SimBackend, SimRuntime

KiB, MiB = 2**10, 2**20
CALL, PER_PAGE, LAUNCH, DISK_LAT = 10e-6, 2e-6, 5e-6, 1e-3
H2D, D2H, BOTH = 50e9, 40e9, 80e9


def make(page_bytes=256 * KiB, slots=1024, **kw):
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(page_bytes, {Level.GPU: slots, Level.HOST: slots, Level.DISK: slots}, round_profile(), **kw))
    return rt, be


def batch(src, dst, n, page_bytes=256 * KiB, src0=0, dst0=0, kind=BatchKind.ONBOARD):
    return Batch(kind, src, dst, np.arange(src0, src0 + n, dtype=np.int64),
                 np.arange(dst0, dst0 + n, dtype=np.int64), np.zeros(n, np.uint64),
                 page_bytes, 0)


def finish(rt, ev):
    """Run until ``ev`` and return (time, value)."""
    out = {}

    def watch():
        out["v"] = yield ev
        out["t"] = rt.now
    rt.process(watch())
    rt.run()
    return out["t"], out["v"]


def test_protocols():
    rt, be = make()
    assert isinstance(rt, Runtime)
    assert isinstance(be, Backend)
    assert be.name == "sim" and be.runtime is rt


def test_one_copy_engine_batch_of_four_pages():
    # 4 pages of 256 KiB = 1 MiB H2D; 256 KiB / 2 us = 131 GB/s > 50 GB/s -> copy engine
    rt, be = make()
    assert be.paths["h2d"] is CopyPath.COPY_ENGINE
    t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 4)))
    assert ok is True
    assert t == pytest.approx(CALL + 4 * PER_PAGE + MiB / H2D, rel=1e-12)
    s = be.stats()
    assert s["h2d_bytes"] == MiB and s["copy_engine_calls"] == 1
    assert s["h2d_busy_s"] == pytest.approx(MiB / H2D, rel=1e-12)


def test_two_transfers_in_one_direction_share_the_link():
    rt, be = make()
    a = be.transfer(batch(Level.HOST, Level.GPU, 4))
    b = be.transfer(batch(Level.HOST, Level.GPU, 4, src0=4, dst0=4))
    t, _ = finish(rt, rt.all_of([a, b]))
    assert t == pytest.approx(CALL + 4 * PER_PAGE + MiB / (H2D / 2), rel=1e-12)


def test_opposite_directions_are_capped_by_the_both_directions_total():
    # max-min fair: H2D and D2H each rise to 40 GB/s, where D2H and the 80 GB/s total fill
    # (both on the copy engine: left to the rule, the second would take the SM kernel,
    # kvsim.core.datapath.pathcost)
    rt, be = make(copy_path=CopyPath.COPY_ENGINE)
    up = be.transfer(batch(Level.HOST, Level.GPU, 4))
    down = be.transfer(batch(Level.GPU, Level.HOST, 4, src0=8, dst0=8, kind=BatchKind.EVICT))
    t, _ = finish(rt, rt.all_of([up, down]))
    assert t == pytest.approx(CALL + 4 * PER_PAGE + MiB / 40e9, rel=1e-12)


def test_a_late_flow_slows_an_early_one_from_when_it_starts():
    # A (4 MiB) starts moving at 42 us alone; B (1 MiB) joins 50 us later; both at 25 GB/s
    # until B is done, then A alone again.
    rt, be = make()
    a = be.transfer(batch(Level.HOST, Level.GPU, 16))
    start_a = CALL + 16 * PER_PAGE
    ends = {}

    def late():
        yield rt.timeout(start_a + 50e-6 - (CALL + 4 * PER_PAGE))
        ends["b"] = yield be.transfer(batch(Level.HOST, Level.GPU, 4, src0=20, dst0=20))
        ends["tb"] = rt.now
    rt.process(late())
    t_a, _ = finish(rt, a)
    joined = start_a + 50e-6
    assert ends["tb"] == pytest.approx(joined + MiB / 25e9, rel=1e-9)
    moved_a = 50e-6 * H2D + MiB
    assert t_a == pytest.approx(ends["tb"] + (4 * MiB - moved_a) / H2D, rel=1e-9)


def test_a_third_copy_engine_call_waits_for_an_engine():
    rt, be = make()
    evs = [be.transfer(batch(Level.HOST, Level.GPU, 4, src0=4 * i, dst0=4 * i)) for i in range(3)]
    finish(rt, rt.all_of(evs))
    first = CALL + 4 * PER_PAGE + MiB / (H2D / 2)
    # the third starts its host time when an engine frees, then has the link alone
    assert rt.now == pytest.approx(first + CALL + 4 * PER_PAGE + MiB / H2D, rel=1e-12)


def test_waiting_copy_engine_calls_go_first_come_first_served():
    # one engine: four one-page calls submitted together run one after another, in order
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 8, Level.HOST: 8}, round_profile(copy_engine={"count": 1, "per_call": "10us",
                                                   "per_page": "2us"})))
    ends: list[tuple[int, float]] = []
    for i in range(4):
        ev = be.transfer(batch(Level.HOST, Level.GPU, 1, src0=i, dst0=i))
        ev.callbacks.append(lambda e, i=i: ends.append((i, rt.now)))
    rt.run()
    one = CALL + PER_PAGE + 256 * KiB / H2D
    assert [i for i, _ in ends] == [0, 1, 2, 3]
    assert [t for _, t in ends] == pytest.approx([one, 2 * one, 3 * one, 4 * one], rel=1e-12)
    assert be.stats()["copy_engine_calls"] == 4 and be.copy_engines.free == 1


def test_small_pages_take_the_sm_kernel():
    # 4 KiB / 2 us = 2 GB/s < 50 GB/s -> SM kernel; H2D CTAs: 50/10 = 5 -> 6; D2H: 4
    rt, be = make(page_bytes=4 * KiB)
    assert be.paths["h2d"] is CopyPath.SM_KERNEL and be.ctas == {"h2d": 6, "d2h": 4}
    t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB)))
    assert ok and t == pytest.approx(LAUNCH + MiB / H2D, rel=1e-12)   # 6 CTAs = 60 GB/s > link
    assert be.stats()["sm_kernel_calls"] == 1


def test_sm_kernel_rate_is_capped_by_its_ctas():
    # 4 offload CTAs at 10 GB/s = 40 GB/s; force the kernel with one engine's worth fewer CTAs
    prof = round_profile(sm={**round_profile().sm.model_dump(), "cta_offload": 5e9})
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 8, Level.HOST: 8}, prof, copy_path=CopyPath.SM_KERNEL))
    assert be.ctas["d2h"] == 8   # 40 / 5 = 8
    t, _ = finish(rt, be.transfer(batch(Level.GPU, Level.HOST, 4, kind=BatchKind.EVICT)))
    assert t == pytest.approx(LAUNCH + MiB / 40e9, rel=1e-12)


def test_copy_kernels_wait_for_free_cta_slots():
    # 8 slots, 6 CTAs a kernel: the second kernel waits for the first to finish
    rt, be = make(page_bytes=4 * KiB)
    a = be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB))
    b = be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB, src0=300, dst0=300))
    finish(rt, rt.all_of([a, b]))
    assert rt.now == pytest.approx(2 * (LAUNCH + MiB / H2D), rel=1e-12)


def test_compute_alone_takes_its_duration():
    rt, be = make()
    t, took = finish(rt, be.compute(1e-3))
    assert t == pytest.approx(1e-3) and took == pytest.approx(1e-3)


def test_compute_is_stretched_by_an_sm_copy_kernel_and_slows_it():
    # kernel: 6 CTAs -> compute slowdown 0.3; under compute its CTAs run at half rate:
    # 6 * 10 GB/s * 0.5 = 30 GB/s. Timeline: 0-5 us launch (compute at full speed),
    # 5 us - 5 us + 1 MiB/30 GB/s copy (compute at 1/1.3), then compute alone.
    rt, be = make(page_bytes=4 * KiB)
    c = be.compute(1e-3)
    x = be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB))
    t_c, took = finish(rt, c)
    copy_s = MiB / 30e9
    assert x.value is True
    expect = LAUNCH + copy_s + (1e-3 - LAUNCH - copy_s / 1.3)
    assert t_c == pytest.approx(expect, rel=1e-12) and took == pytest.approx(expect, rel=1e-12)
    assert be.stats()["compute_stretch_s"] == pytest.approx(copy_s * 0.3 / 1.3, rel=1e-9)


def test_compute_is_stretched_less_by_a_copy_engine_transfer():
    rt, be = make()
    c = be.compute(1e-3)
    be.transfer(batch(Level.HOST, Level.GPU, 4))
    t_c, _ = finish(rt, c)
    start, copy_s = CALL + 4 * PER_PAGE, MiB / H2D   # the copy engine is not slowed
    assert t_c == pytest.approx(start + copy_s + (1e-3 - start - copy_s / 1.1), rel=1e-12)


def test_disk_to_gpu_is_staged_through_host():
    # 2 pages of 1 MiB; disk read rate min(2 GB/s, 4 * 1 MiB / (1 ms + 1 MiB / 2 GB/s)) = 2 GB/s
    rt, be = make(page_bytes=MiB)
    be.tags[Level.DISK][:2] = [11, 12]
    t, ok = finish(rt, be.transfer(batch(Level.DISK, Level.GPU, 2, page_bytes=MiB)))
    assert ok and t == pytest.approx(DISK_LAT + CALL + 2 * PER_PAGE + 2 * MiB / 2e9, rel=1e-12)
    assert list(be.read_tags(Level.GPU, np.array([0, 1]))) == [11, 12]
    s = be.stats()
    assert s["disk_read_bytes"] == s["h2d_bytes"] == 2 * MiB
    assert s["disk_read_busy_s"] == pytest.approx(2 * MiB / 2e9, rel=1e-12)


def test_gpu_to_disk_and_host_to_disk_writes():
    rt, be = make(page_bytes=MiB)
    t, _ = finish(rt, be.transfer(batch(Level.GPU, Level.DISK, 2, page_bytes=MiB, kind=BatchKind.EVICT)))
    assert t == pytest.approx(DISK_LAT + CALL + 2 * PER_PAGE + 2 * MiB / 1e9, rel=1e-12)
    t0 = rt.now
    t, _ = finish(rt, be.transfer(batch(Level.HOST, Level.DISK, 2, page_bytes=MiB, kind=BatchKind.EVICT)))
    assert t - t0 == pytest.approx(DISK_LAT + 2 * MiB / 1e9, rel=1e-9)
    assert be.stats()["disk_write_bytes"] == 4 * MiB


def test_a_write_into_disk_slots_written_before_moves_at_the_rewrite_rate():
    """nvme.rewrite 2 GB/s (write 1 GB/s): 2 pages of 1 MiB to fresh disk slots take their
    bytes at 1 GB/s; the same slots again at 2 GB/s; half old, half new: 1 MiB at each rate.
    A failed write marks nothing, a fill of disk pages marks them; without the rate every
    write is a first one."""
    nv = {"read": "2GB/s", "write": "1GB/s", "rewrite": "2GB/s", "queue_depth": 4,
          "latency": "1ms", "piece": "4MiB"}

    def sim(nvme):
        rt = SimRuntime()
        return rt, SimBackend(rt, settings_for(MiB, {lv: 16 for lv in Level}, round_profile(nvme=nvme)))

    def write(rt, be, dst0, n=2):
        t0 = rt.now
        t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.DISK, n, page_bytes=MiB, dst0=dst0,
                                             kind=BatchKind.EVICT)))
        return t - t0, ok

    rt, be = sim(nv)
    assert write(rt, be, 0)[0] == pytest.approx(DISK_LAT + 2 * MiB / 1e9, rel=1e-9)
    assert write(rt, be, 0)[0] == pytest.approx(DISK_LAT + 2 * MiB / 2e9, rel=1e-9)
    assert write(rt, be, 1)[0] == pytest.approx(DISK_LAT + MiB / 2e9 + MiB / 1e9, rel=1e-9)
    be.fail_next_transfer(1)
    t, ok = write(rt, be, 8)
    assert not ok and t == pytest.approx(DISK_LAT + 2 * MiB / 1e9, rel=1e-9)
    assert write(rt, be, 8)[0] == pytest.approx(DISK_LAT + 2 * MiB / 1e9, rel=1e-9)  # still new
    # GPU -> disk, slots written before: the disk leg at the rewrite rate
    t0 = rt.now
    t, _ = finish(rt, be.transfer(batch(Level.GPU, Level.DISK, 2, page_bytes=MiB, kind=BatchKind.EVICT)))
    assert t - t0 == pytest.approx(DISK_LAT + CALL + 2 * PER_PAGE + 2 * MiB / 2e9, rel=1e-9)
    be.fill(Fill(Level.DISK, np.array([12, 13]), np.array([1, 2], np.uint64)))  # written too
    assert write(rt, be, 12)[0] == pytest.approx(DISK_LAT + 2 * MiB / 2e9, rel=1e-9)
    rt, be = sim({k: v for k, v in nv.items() if k != "rewrite"})
    for _ in range(2):
        assert write(rt, be, 0)[0] == pytest.approx(DISK_LAT + 2 * MiB / 1e9, rel=1e-9)


def test_small_disk_ops_are_bound_by_queue_depth_and_latency():
    # 64 KiB ops: 4 * 64 KiB / (1 ms + 64 KiB / 2 GB/s) = 254 MB/s, below the 2 GB/s device
    rt, be = make(page_bytes=64 * KiB)
    rate = 4 * 64 * KiB / (1e-3 + 64 * KiB / 2e9)
    t, _ = finish(rt, be.transfer(batch(Level.DISK, Level.HOST, 16, page_bytes=64 * KiB)))
    assert t == pytest.approx(DISK_LAT + MiB / rate, rel=1e-12)


def test_gpu_copy_runs_at_half_hbm_bandwidth():
    rt, be = make()
    be.fill(Fill(Level.GPU, np.array([0, 1, 2, 3]), np.array([5, 6, 7, 8], np.uint64)))
    t, ok = finish(rt, be.transfer(batch(Level.GPU, Level.GPU, 4, dst0=10, kind=BatchKind.COPY)))
    assert ok and t == pytest.approx(LAUNCH + MiB / 2e12, rel=1e-12)
    assert list(be.read_tags(Level.GPU, np.arange(10, 14))) == [5, 6, 7, 8]
    assert be.stats()["gpu_copy_bytes"] == MiB


def test_refcheck_tags_follow_the_pages():
    rt, be = make()
    be.fill(Fill(Level.GPU, np.array([3, 1]), np.array([101, 102], np.uint64)))
    b = Batch(BatchKind.EVICT, Level.GPU, Level.HOST, np.array([3, 1]), np.array([7, 0]),
              np.array([101, 102], np.uint64), 256 * KiB, 0)
    ev = be.transfer(b)
    assert list(be.read_tags(Level.HOST, np.array([7, 0]))) == [0, 0]   # not there yet
    finish(rt, ev)
    assert list(be.read_tags(Level.HOST, np.array([7, 0]))) == [101, 102]


def test_a_failed_transfer_reports_false_and_leaves_garbage():
    rt, be = make()
    be.fill(Fill(Level.HOST, np.arange(4), np.arange(1, 5, dtype=np.uint64)))
    be.fail_next_transfer()
    t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 4)))
    assert ok is False
    assert t == pytest.approx(CALL + 4 * PER_PAGE + MiB / H2D, rel=1e-12)  # it took its time
    assert list(be.read_tags(Level.GPU, np.arange(4))) == [0xDEAD] * 4
    _, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 4)))
    assert ok is True and list(be.read_tags(Level.GPU, np.arange(4))) == [1, 2, 3, 4]
    s = be.stats()
    assert s["transfers"] == 2 and s["failed_transfers"] == 1


def test_traffic_callback_and_empty_batch():
    rt, be = make(page_bytes=MiB)
    seen = []
    be.on_traffic = lambda now, kind, n: seen.append((kind, n))
    finish(rt, be.transfer(batch(Level.DISK, Level.GPU, 1, page_bytes=MiB)))
    assert seen == [("disk_read", MiB), ("h2d", MiB)]
    _, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 0, page_bytes=MiB)))
    assert ok is True


def test_unknown_route_and_refcheck_off():
    rt, be = make(refcheck=False)
    with pytest.raises(ValueError, match="no data path"):
        be.transfer(batch(Level.DISK, Level.DISK, 1))
    with pytest.raises(RuntimeError):
        be.read_tags(Level.GPU, np.arange(2))


def test_many_transfers_are_deterministic():
    def run():
        rt, be = make(page_bytes=MiB, slots=4096)
        evs = []

        def gen():
            for i in range(2000):
                src, dst = ((Level.HOST, Level.GPU), (Level.GPU, Level.HOST),
                            (Level.DISK, Level.GPU), (Level.GPU, Level.DISK))[i % 4]
                evs.append(be.transfer(batch(src, dst, 1 + i % 7, page_bytes=MiB)))
                if i % 5 == 0:
                    evs.append(be.compute(2e-3))
                yield rt.timeout(1e-4)
        rt.process(gen())
        rt.run()
        return rt.now, be.stats()
    a = run()
    assert a[0] > 0.2 and a == run()  # (its speed: benchmarks/sim_speed.py)


def test_presets_load_and_errors_name_file_and_key(tmp_path):
    pcie, c2c = load_profile("h200-pcie"), load_profile("gh200-c2c")
    assert pcie.link.kind == "pcie" and pcie.link.h2d == 55.5e9 and pcie.nvme.piece == 4 * MiB
    assert c2c.link.kind == "c2c" and c2c.sm.cta_onboard == 44 * 2**30
    assert pcie.sm.interference.per_cta_slowdown == pytest.approx(0.17 / 32)
    bad = tmp_path / "bad.yaml"
    text = (load_profile.__globals__["CONFIG_DIR"] / "hardware" / "h200-pcie.yaml").read_text()
    bad.write_text(text.replace("h2d: 55.5GB/s", "h2d: 55.5GB"))
    with pytest.raises(ProfileError, match=r"bad\.yaml: link\.h2d"):
        load_profile(bad)
    bad.write_text(text.replace("  count: 3", "  count: 3\n  colour: blue"))
    with pytest.raises(ProfileError, match=r"copy_engine\.colour"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="no such file"):
        load_profile("no-such-gpu")


def test_h200_profile_reproduces_hardware_md_in_scale():
    """HARDWARE.md: batched copy engine, 2,048 pages of 1 MiB H2D at 52.5 GB/s; SM gather of
    16 KiB pages at ~51 GB/s; compute +5% beside a copy-engine transfer."""
    def rate(page, pages, **kw):
        rt = SimRuntime()
        be = SimBackend(rt, settings_for(page, {Level.GPU: pages, Level.HOST: pages}, "h200-pcie", **kw))
        t, _ = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, pages, page_bytes=page)))
        return pages * page / t, be
    ce, be = rate(MiB, 2048)
    assert be.paths["h2d"] is CopyPath.COPY_ENGINE and ce == pytest.approx(52.5e9, rel=0.1)
    sm, be = rate(16 * KiB, 32768)
    assert be.paths["h2d"] is CopyPath.SM_KERNEL and sm == pytest.approx(51e9, rel=0.1)
    forced, _ = rate(16 * KiB, 32768, copy_path=CopyPath.COPY_ENGINE)
    assert forced < sm / 3          # HARDWARE.md: "at 16 KiB the SM gather kernel is 3-14x faster"
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(4 * MiB, {Level.GPU: 1024, Level.HOST: 1024}, "h200-pcie"))
    be.transfer(batch(Level.HOST, Level.GPU, 1024, page_bytes=4 * MiB))   # 4 GiB, ~80 ms

    def later():   # after the call's 2.6 ms of host time, while the bytes move
        yield rt.timeout(10e-3)
        return (yield be.compute(2.06e-3))
    _, took = finish(rt, rt.process(later()))
    assert took == pytest.approx(2.06e-3 * 1.05, rel=0.01)


def test_stats_carry_the_names_the_metrics_summary_reads():
    rt, be = make(page_bytes=MiB)
    finish(rt, be.transfer(batch(Level.DISK, Level.GPU, 2, page_bytes=MiB)))
    finish(rt, be.transfer(batch(Level.GPU, Level.HOST, 1, page_bytes=MiB, kind=BatchKind.EVICT)))
    s = be.stats()
    assert (s["host_to_gpu"], s["gpu_to_host"], s["disk_read"], s["disk_write"]) == (2 * MiB, MiB, 2 * MiB, 0)


# -- the SM kernel's own ceilings, per-direction copy-engine costs, one CUDA-calling thread --

def _sm_wide(**sm_over):
    """The round profile with 16 copy-CTA slots (both directions' kernels fit at once)."""
    sm = {**round_profile().sm.model_dump(), "count": 16, "copy_cta_slots": 16, **sm_over}
    return round_profile(sm=sm)


def test_sm_kernel_both_directions_capped_by_its_own_ceiling():
    # 4 KiB pages -> SM kernel both ways (6 + 4 CTAs, 60 / 40 GB/s caps). sm.both 60 GB/s:
    # max-min fair, both rise to 30 GB/s where sm_both fills (the link's 80 is not reached):
    # 1 MiB each way -> launch + 1 MiB / 30 GB/s.
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(4 * KiB, {Level.GPU: 512, Level.HOST: 512}, _sm_wide(both="60GB/s")))
    assert be.paths == {"h2d": CopyPath.SM_KERNEL, "d2h": CopyPath.SM_KERNEL}
    up = be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB))
    down = be.transfer(batch(Level.GPU, Level.HOST, 256, page_bytes=4 * KiB, src0=256, dst0=256,
                             kind=BatchKind.EVICT))
    t, _ = finish(rt, rt.all_of([up, down]))
    assert t == pytest.approx(LAUNCH + MiB / 30e9, rel=1e-12)
    # without sm.both: the link's 80 GB/s total, D2H's 40 GB/s fills first -> 40 each
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(4 * KiB, {Level.GPU: 512, Level.HOST: 512}, _sm_wide()))
    up = be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB))
    down = be.transfer(batch(Level.GPU, Level.HOST, 256, page_bytes=4 * KiB, src0=256, dst0=256,
                             kind=BatchKind.EVICT))
    t, _ = finish(rt, rt.all_of([up, down]))
    assert t == pytest.approx(LAUNCH + MiB / 40e9, rel=1e-12)


def test_sm_ceilings_bind_sm_flows_only():
    # one direction: the SM kernel's own 45 GB/s H2D ceiling, below the link's 50
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(4 * KiB, {Level.GPU: 512, Level.HOST: 512}, _sm_wide(h2d="45GB/s", both="60GB/s")))
    t, _ = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB)))
    assert t == pytest.approx(LAUNCH + MiB / 45e9, rel=1e-12)
    # copy-engine flows both ways (256 KiB pages) ignore sm.both: the link's 40 + 40
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 16, Level.HOST: 16}, _sm_wide(both="60GB/s"),
                                     copy_path="copy_engine"))
    assert be.paths["h2d"] is CopyPath.COPY_ENGINE
    up = be.transfer(batch(Level.HOST, Level.GPU, 4))
    down = be.transfer(batch(Level.GPU, Level.HOST, 4, src0=8, dst0=8, kind=BatchKind.EVICT))
    t, _ = finish(rt, rt.all_of([up, down]))
    assert t == pytest.approx(CALL + 4 * PER_PAGE + MiB / 40e9, rel=1e-12)


def test_sm_both_below_a_direction_is_refused():
    with pytest.raises(ValueError, match="sm.both"):
        _sm_wide(both="45GB/s")          # below the link's 50 GB/s H2D (the SM default)


def _ce_dir(**ce_over):
    ce = {"count": 2, "per_call": "10us", "per_page": "2us", **ce_over}
    return round_profile(copy_engine=ce)


def test_copy_engine_per_page_cost_per_direction_and_page_size():
    prof = _ce_dir(per_page_h2d="3us", per_page_d2h={"64KiB": "1us", "256KiB": "0.5us"})
    ce = prof.copy_engine
    assert ce.per_page_for("h2d", 4 * KiB) == pytest.approx(3e-6)
    assert ce.per_page_for("d2h", 16 * KiB) == pytest.approx(1e-6)      # flat below the table
    assert ce.per_page_for("d2h", 128 * KiB) == pytest.approx(0.75e-6)  # halfway in log2
    assert ce.per_page_for("d2h", 4 * MiB) == pytest.approx(0.5e-6)     # flat above
    assert _ce_dir().copy_engine.per_page_for("d2h", MiB) == pytest.approx(PER_PAGE)  # default
    # 4 pages of 256 KiB each way, one at a time: per_call + 4 x the direction's cost + bytes
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 16, Level.HOST: 16}, prof))
    t, _ = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 4)))
    assert t == pytest.approx(CALL + 4 * 3e-6 + MiB / H2D, rel=1e-12)
    t0 = rt.now
    t, _ = finish(rt, be.transfer(batch(Level.GPU, Level.HOST, 4, kind=BatchKind.EVICT)))
    assert t - t0 == pytest.approx(CALL + 4 * 0.5e-6 + MiB / D2H, rel=1e-9)


def test_one_cuda_thread_serialises_copy_engine_host_time():
    # call_threads 1: the H2D call's 22 us of host time, then the D2H call's 12 us.
    # H2D moves alone 22 -> 34 us at 50 GB/s (600,000 B); then both at 40 GB/s (D2H and the
    # 80 GB/s total fill together) until H2D is done; then D2H alone at 40 GB/s.
    prof = _ce_dir(per_page_h2d="3us", per_page_d2h="0.5us", call_threads=1)
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 16, Level.HOST: 16}, prof,
                                     copy_path="copy_engine"))
    ends = {}

    def watch(name, ev):
        yield ev
        ends[name] = rt.now
    rt.process(watch("up", be.transfer(batch(Level.HOST, Level.GPU, 4))))
    rt.process(watch("down", be.transfer(batch(Level.GPU, Level.HOST, 4, src0=8, dst0=8,
                                               kind=BatchKind.EVICT))))
    rt.run()
    alone = 12e-6 * H2D
    t_up = 34e-6 + (MiB - alone) / 40e9
    assert ends["up"] == pytest.approx(t_up, rel=1e-9)
    assert ends["down"] == pytest.approx(t_up + alone / D2H, rel=1e-9)
    # without call_threads the host times overlap: D2H starts at 12 us
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 16, Level.HOST: 16}, _ce_dir(per_page_h2d="3us", per_page_d2h="0.5us")))
    down = be.transfer(batch(Level.GPU, Level.HOST, 4, src0=8, dst0=8, kind=BatchKind.EVICT))
    t, _ = finish(rt, down)
    assert t == pytest.approx(12e-6 + MiB / D2H, rel=1e-12)


def test_path_per_direction_compares_time_per_page_with_sm_ceilings():
    # 256 KiB pages. H2D: SM 256 KiB / 45 GB/s = 5.83 us < CE 1 us + 256 KiB / 50 GB/s =
    # 6.24 us -> SM kernel. D2H: SM 256 KiB / 39 GB/s = 6.72 us > CE 0 + 6.55 us -> copy engine.
    prof = round_profile(copy_engine={"count": 2, "per_call": "10us", "per_page": "2us",
                                      "per_page_h2d": "1us", "per_page_d2h": "0us"},
                         sm={**_sm_wide().sm.model_dump(), "h2d": 45e9, "d2h": 39e9})
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 16, Level.HOST: 16}, prof))
    assert be.paths == {"h2d": CopyPath.SM_KERNEL, "d2h": CopyPath.COPY_ENGINE}
    assert (be.stats()["copy_path_h2d"], be.stats()["copy_path_d2h"]) == ("sm_kernel", "copy_engine")


def test_transfer_latency_defaults_to_zero_and_is_validated():
    assert round_profile().transfer.latency == 0 and round_profile().transfer.latency_sm_kernel is None
    assert load_profile("h200-pcie").transfer.latency == 0  # profiles without the section
    prof = round_profile(transfer={"latency": "60us", "latency_sm_kernel": "80us"})
    assert prof.transfer.latency_for(False) == pytest.approx(60e-6)
    assert prof.transfer.latency_for(True) == pytest.approx(80e-6)
    assert round_profile(transfer={"latency": "60us"}).transfer.latency_for(True) == pytest.approx(60e-6)
    with pytest.raises(ValueError, match="transfer.latency"):
        round_profile(transfer={"latency": "-1us"})
    with pytest.raises(ValueError, match="transfer.colour"):
        round_profile(transfer={"colour": "blue"})


def test_transfer_latency_is_added_to_each_transfer_and_holds_nothing():
    prof = round_profile(transfer={"latency": "60us", "latency_sm_kernel": "80us"})
    # copy engine, 4 pages of 256 KiB H2D: per_call + 4 x per_page + bytes, then 60 us
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 16, Level.HOST: 16}, prof))
    t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 4)))
    assert ok and t == pytest.approx(CALL + 4 * PER_PAGE + MiB / H2D + 60e-6, rel=1e-12)
    # SM kernel, 256 pages of 4 KiB H2D: launch + bytes at the link, then 80 us
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(4 * KiB, {Level.GPU: 256, Level.HOST: 256}, prof))
    assert be.paths["h2d"] is CopyPath.SM_KERNEL
    t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 256, page_bytes=4 * KiB)))
    assert ok and t == pytest.approx(LAUNCH + MiB / H2D + 80e-6, rel=1e-12)
    # disk -> host, one 4 MiB piece: latency + bytes at the read rate, then 60 us
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(4 * MiB, {Level.HOST: 4, Level.DISK: 4}, prof))
    t, ok = finish(rt, be.transfer(batch(Level.DISK, Level.HOST, 1, page_bytes=4 * MiB)))
    assert ok and t == pytest.approx(DISK_LAT + 4 * MiB / 2e9 + 60e-6, rel=1e-12)
    # it holds no copy engine: with one engine, a second call starts when the first's bytes
    # have moved (10 + 8 + 20.97 us), not after its latency
    one = round_profile(transfer={"latency": "60us"},
                        copy_engine={"count": 1, "per_call": "10us", "per_page": "2us"})
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 16, Level.HOST: 16}, one))
    e1 = be.transfer(batch(Level.HOST, Level.GPU, 4))
    e2 = be.transfer(batch(Level.HOST, Level.GPU, 4, src0=4, dst0=4))
    t2, _ = finish(rt, e2)
    one_s = CALL + 4 * PER_PAGE + MiB / H2D
    assert e1.processed and t2 == pytest.approx(2 * one_s + 60e-6, rel=1e-12)


# -- run-ahead: compute_ahead predicts compute() to the last bit ---------------------------

def _compute_end(start_flow: bool, at: float, work: float, path=CopyPath.COPY_ENGINE):
    """Start a long H2D batch at 0 (if ``start_flow``), then at ``at`` a compute of
    ``work`` seconds; return (the compute_ahead answer at ``at``, the compute's real end)."""
    rt, be = make(copy_path=path)
    if start_flow:
        be.transfer(batch(Level.HOST, Level.GPU, 1000))  # 256 MB: ~5 ms on the link
    out = {}

    def proc():
        yield rt.timeout(at)
        out["ahead"] = be.compute_ahead(rt.now, work, quiet=False)
        yield be.compute(work)
        out["end"] = rt.now
    rt.process(proc())
    rt.run()
    return out["ahead"], out["end"]


def test_compute_ahead_equals_compute_with_a_copy_engine_flow():
    """A copy-engine flow stretches compute by 0.1 (round profile): the predicted end is
    the stretched one and the very float a real compute ends at."""
    # the batch's host time (10 us + 1000 x 2 us) ends at 2.01 ms; its flow then moves
    # 256 MB at 50 GB/s until ~7.1 ms
    ahead, end = _compute_end(True, 0.0025, 0.0013)
    assert ahead == end
    assert end == pytest.approx(0.0025 + 0.0013 * 1.1, rel=1e-12)
    # before the flow starts, its start is an event the compute would cross
    ahead, _ = _compute_end(True, 0.001, 0.0013)
    assert ahead is None
    ahead, end = _compute_end(False, 0.1, 0.2)  # nothing in flight: no stretch
    assert ahead == end == 0.1 + 0.2


def test_compute_ahead_refuses_what_it_cannot_predict():
    # the flow ends (~5 ms) before the compute would: the rates change mid-compute
    ahead, end = _compute_end(True, 0.0025, 0.01)
    assert ahead is None and end > 0.0125
    # an SM copy kernel's rate depends on compute running
    ahead, _ = _compute_end(True, 0.0025, 0.0001, path=CopyPath.SM_KERNEL)
    assert ahead is None
    # quiet (the caller has nothing in flight): pending events do not bound it
    rt, be = make()
    rt.timeout(0.5)
    assert be.compute_ahead(0.0, 1.0, quiet=True) == 1.0
    assert be.compute_ahead(0.0, 1.0, quiet=False) is None


def test_catch_up_lands_on_the_exact_float():
    """A relative timeout would land on now + (t - now), which can miss t by a bit."""
    rt, be = make()
    now, t = 0.0938595867742349, 2.834747652200631
    assert now + (t - now) != t

    def proc():
        yield rt.timeout(now)
        yield be.catch_up(t)
    rt.process(proc())
    rt.run()
    assert rt.now == t


def test_catch_up_moves_the_clock_without_an_event_only_when_none_is_due_before():
    rt, be = make()
    seen = []
    rt.timeout(2.0).callbacks.append(lambda ev: seen.append(("timer", rt.now)))

    def proc():
        ev = be.catch_up(1.5)  # nothing due up to 1.5: the clock moves at once
        assert ev.processed and rt.now == 1.5
        yield ev
        seen.append(("at", rt.now))
        ev = be.catch_up(2.0)  # the timer is due at 2.0: a real timeout, after it
        assert not ev.processed
        yield ev
        seen.append(("at", rt.now))
    rt.process(proc())
    rt.run()
    assert seen == [("at", 1.5), ("timer", 2.0), ("at", 2.0)]


def _scenario(process, timeout, event, wake, log, now):
    """Processes, timeouts, failures and callbacks at equal times: what the order of a
    run depends on. ``wake(delay, cb)``: a bare callback entry (or a timeout's)."""
    def child(name, d):
        yield timeout(d)
        log.append((name, now()))
        return name

    def failing():
        yield timeout(0.5)
        raise KeyError("lost")

    def main():
        a, b = process(child("a", 1.0)), process(child("b", 1.0))
        wake(1.0, lambda _: log.append(("wake", now())))
        log.append(("a returned", (yield a)))
        log.append(("b returned", (yield b)))
        try:
            yield process(failing())
        except KeyError as e:  # a copy of the child's exception, the original its cause
            log.append(("caught", repr(e), repr(e.__cause__)))
        ev = event()
        ev.succeed(7)
        log.append(("processed", (yield ev)))
        yield timeout(0.0)
        return "main done"
    return process(main())


def test_the_runtime_runs_processes_and_callbacks_in_simpys_order():
    """SimRuntime's own loop, processes (_Proc) and bare wake-ups (Clock.wake_after) give the
    very order and values a plain SimPy environment gives."""
    import simpy  # noqa: PLC0415

    env = simpy.Environment()
    want: list = []

    def timeout_cb(d, cb):
        env.timeout(d).callbacks.append(cb)
    main = _scenario(env.process, env.timeout, env.event, timeout_cb, want, lambda: env.now)
    env.run(until=main)
    rt = SimRuntime()
    got: list = []
    done = _scenario(rt.process, rt.timeout, rt.event,
                     rt.clock.wake_after, got, lambda: rt.now)
    assert rt.run(done) == main.value == "main done"
    assert got == want and ("caught", "KeyError('lost')", "KeyError('lost')") in got
    assert got[:3] == [("wake", 1.0), ("a", 1.0), ("b", 1.0)]  # (the children start after)


def test_a_process_that_fails_with_nothing_waiting_stops_the_run():
    rt = SimRuntime()

    def bad():
        yield rt.timeout(1.0)
        raise ValueError("boom")
    rt.process(bad())
    with pytest.raises(ValueError, match="boom"):
        rt.run()
    assert rt.now == 1.0


def test_the_runtime_refuses_a_non_event_yield_and_a_second_trigger():
    rt = SimRuntime()

    def wrong():
        yield 42
    rt.process(wrong())
    with pytest.raises(RuntimeError, match="a process yielded 42, not an event"):
        rt.run()
    ev = rt.event()
    rt.clock.succeed(ev, 1)
    with pytest.raises(RuntimeError, match="already been triggered"):
        rt.clock.succeed(ev, 2)
    assert rt.run(ev) == 1 and rt.run(5.0) is None and rt.now == 5.0  # (a time: SimPy's run)


def test_running_until_a_failed_process_raises_its_exception_itself():
    """As SimPy's run(until=...): the exception object the process raised, not a copy."""
    rt = SimRuntime()
    raised = []

    def bad():
        yield rt.timeout(1.0)
        raised.append(KeyError("gone"))
        raise raised[0]
    with pytest.raises(KeyError) as caught:
        rt.run(rt.process(bad()))
    assert caught.value is raised[0] and rt.now == 1.0


def test_compute_latency_delays_every_call_and_run_ahead_agrees():
    """compute.latency (the hw backend's fixed cost a call): a compute of d completes at
    d + latency, with the SMs free during the latency; compute_ahead says the same float."""
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 8, Level.HOST: 8}, round_profile(compute={"latency": "200us"})))
    t, took = finish(rt, be.compute(0.003))
    assert t == 0.003 + 200e-6 and took == pytest.approx(0.0032)
    assert be.fluid.compute_busy_s == pytest.approx(0.003)  # the latency is not SM time
    start = rt.now
    ahead = be.compute_ahead(start, 0.003, quiet=True)
    t2, _ = finish(rt, be.compute(0.003))
    assert ahead == t2 == start + 0.003 + 200e-6


def test_compute_scale_stretches_the_work_not_the_latency():
    """compute.scale (the hw busy kernel's overrun): a compute of d takes d x scale on the
    SMs, then the latency; compute_ahead says the same float; the stretch counts the
    overrun against the nominal d (as the hw backend's stats count its GPU time), not the
    latency (no SM time)."""
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(256 * KiB, {Level.GPU: 8, Level.HOST: 8}, round_profile(compute={"latency": "200us", "scale": 1.01})))
    t, took = finish(rt, be.compute(0.003))
    assert t == 0.003 * 1.01 + 200e-6
    assert took == pytest.approx(0.003 * 1.01 + 200e-6)
    assert be.fluid.compute_busy_s == pytest.approx(0.00303)  # the overrun is SM time
    start = rt.now
    ahead = be.compute_ahead(start, 0.003, quiet=True)
    t2, _ = finish(rt, be.compute(0.003))
    assert ahead == t2 == start + 0.003 * 1.01 + 200e-6
    s = be.stats()
    assert s["compute_calls"] == 3
    assert s["compute_stretch_s"] == pytest.approx(3 * 0.003 * 0.01, rel=1e-9)


def test_refcheck_is_free_and_immediate():
    """The tags are not bytes: a check costs nothing (kvsim.tools.hwloop models the hw one's)."""
    _, be = make()
    assert be.read_tags_later(Level.HOST, np.arange(4)) is None
    assert be.read_tags_later(Level.GPU, np.arange(4)) is None


def test_superseded_flow_wake_ups_leave_the_queue_head_and_change_nothing():
    """Each change to the flows re-times the one live wake-up; the old one would fire and
    do nothing. ``drop_stale`` takes such wake-ups off the head of the clock's queue (the
    horizon a run ahead reads), and the flows still end exactly when they would."""
    import simpy

    from kvsim_backends.sim.fluid import Fluid

    def run(drop: bool):
        env = simpy.Environment()
        fl = Fluid(env, {"a": 1e9, "b": 1e9}, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
                   busy_cta_efficiency=1.0)
        ends = {}

        def start(name, nbytes, res, at):
            yield env.timeout(at)
            yield fl.add_flow(nbytes, (res,))
            ends[name] = env.now

        for name, nbytes, res, at in (("x", 4e6, "a", 0.0), ("y", 1e6, "a", 0.001), ("z", 1e6, "b", 0.0015)):
            env.process(start(name, nbytes, res, at))
        env.run(until=0.002)  # x and y share "a"; z started: x's first wake-up superseded twice
        assert fl._stale  # superseded wake-ups are still queued
        if drop:
            fl.drop_stale()
            assert env._queue[0][3] not in fl._stale  # the head is an event that does something
        env.run()
        return ends

    assert run(drop=True) == run(drop=False) == pytest.approx(
        {"x": 0.005, "y": 0.003, "z": 0.0025}, rel=1e-12)


def test_busy_start_delays_only_sm_kernel_copies_under_compute():
    """``sm.interference.busy_start``: an SM-kernel batch launched while compute runs moves
    its bytes that much later; idle, or on the copy engine, nothing changes."""
    from kvsim.tools.fit import sim_cell
    from kvsim.config.hardware import HardwareProfile

    base = load_profile("h200-pcie-calibrated")
    d = base.model_dump()
    d["sm"]["interference"]["busy_start"] = 0.0
    p0 = HardwareProfile.model_validate(d)
    d["sm"]["interference"]["busy_start"] = 3e-4
    p1 = HardwareProfile.model_validate(d)
    for path in ("sm_kernel", "copy_engine"):
        c = {"page": 1 << 20, "path": path, "dir": "h2d", "pages": 256, "bytes": 256 << 20,
             "batches": [["h2d", 256]]}
        busy0, busy1 = sim_cell(p0, c, 0.05)[0], sim_cell(p1, c, 0.05)[0]
        assert sim_cell(p1, c)[0] == sim_cell(p0, c)[0]  # idle: no later start
        assert busy1 - busy0 == pytest.approx(3e-4 if path == "sm_kernel" else 0.0, abs=1e-9)


def test_busy_per_page_slows_only_copy_engine_copies_under_compute():
    """``copy_engine.busy_per_page_d2h``: a copy-engine batch issued while compute runs
    takes that much longer a page (host -> GPU, whose term is 0, and the SM kernel do not);
    idle, nothing changes."""
    from kvsim.tools.fit import sim_cell
    from kvsim.config.hardware import HardwareProfile

    base = load_profile("h200-pcie-calibrated")
    d = base.model_dump()
    d["copy_engine"].update(busy_per_page_h2d=None, busy_per_page_d2h=None)
    p0 = HardwareProfile.model_validate(d)
    d["copy_engine"].update(busy_per_page_d2h={"64KiB": "1us", "4MiB": "2us"})
    p1 = HardwareProfile.model_validate(d)
    per = p1.copy_engine.busy_per_page_for("d2h", 1 << 20)
    assert per == pytest.approx((1 + 4 / 6) * 1e-6)  # 1 MiB: 4 of the 6 doublings from 64 KiB
    assert p1.copy_engine.busy_per_page_for("h2d", 1 << 20) == 0.0
    for path in ("copy_engine", "sm_kernel"):
        for dr in ("d2h", "h2d"):
            c = {"page": 1 << 20, "path": path, "dir": dr, "pages": 256, "bytes": 256 << 20,
                 "batches": [[dr, 256]]}
            assert sim_cell(p1, c)[0] == sim_cell(p0, c)[0]  # idle
            extra = sim_cell(p1, c, 0.05)[0] - sim_cell(p0, c, 0.05)[0]
            want = 256 * per if (path, dr) == ("copy_engine", "d2h") else 0.0
            assert extra == pytest.approx(want, abs=1e-9)
