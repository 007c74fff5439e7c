"""The hw backend's host tier filled by a worker thread (CPU mode here; GPU where marked).

Scenarios: the fill publishes its watermark unit by unit and the first unit is usable
before the last is in; a worker that fails keeps the committed prefix usable and tells
waiters beyond it no; the pinned backing comes in one piece; close stops a fill midway.
"""

from __future__ import annotations

import pytest

from kvsim.core.datapath.fill import Backing
from kvsim_backends.hw.hostfill import HostFill

MiB = 1 << 20


def test_register_fill_publishes_unit_by_unit():
    fill = HostFill(MiB, 16, 4 * MiB, Backing.REGISTER, None, unit_delay_s=0.05).start()
    try:
        assert fill.wait(4, timeout_s=5)
        first = fill.watermark
        assert first < 16 and fill.ready(16) is None  # serving may start, the rest comes later
        fill.view[:first] = 7  # the slots below the watermark are usable now
        assert fill.wait(16, timeout_s=5) and fill.ready(16) is True
        assert fill.watermark == 16 and not fill.failed and fill.error is None
        assert int(fill.view[:first].min()) == 7  # committing later units kept earlier bytes
        t = fill.timings()
        assert 0 <= t["first_unit_s"] < t["full_s"]
    finally:
        fill.close()


def test_failed_fill_keeps_the_committed_prefix():
    fill = HostFill(MiB, 16, 4 * MiB, Backing.REGISTER, None, fail_at_unit=2).start()
    try:
        assert not fill.wait(9, timeout_s=5)  # slot 8 is in unit 2: it never comes
        assert fill.failed and fill.watermark == 8 and fill.limit == 8
        assert "after 2 of 4 units (8 of 16 slots usable)" in fill.error
        assert "injected failure of unit 2" in fill.error
        assert fill.ready(8) is True and fill.ready(9) is False
        fill.view[:8] = 3  # below the prefix: still usable
        assert int(fill.view[7, 0]) == 3
    finally:
        fill.close()


def test_pinned_backing_comes_in_one_piece():
    fill = HostFill(MiB, 10, 4 * MiB, Backing.PINNED, None).start()
    try:
        assert fill.layout.units == 1
        assert fill.wait(1, timeout_s=5) and fill.watermark == 10
        fill.view[9] = 1
    finally:
        fill.close()


def test_cumem_backing_in_cpu_mode_fills_unit_by_unit():
    fill = HostFill(MiB, 16, 4 * MiB, Backing.CUMEM, None, unit_delay_s=0.05).start()
    try:
        assert fill.wait(4, timeout_s=5)
        assert fill.layout.units == 4 and fill.ready(16) is None  # progressive, as register
        fill.view[:4] = 5
        assert fill.wait(16, timeout_s=5) and int(fill.view[:4].min()) == 5
        assert fill.info["backing"] == "cumem" and fill.info["huge_pages"] is False
    finally:
        fill.close()


def test_close_stops_a_fill_midway_and_is_idempotent():
    fill = HostFill(MiB, 64, MiB, Backing.REGISTER, None, unit_delay_s=0.02).start()
    fill.wait(1, timeout_s=5)
    fill.close()
    assert fill.done and fill.watermark < 64
    fill.close()


def test_bad_numa_setting_is_refused():
    with pytest.raises(ValueError, match="numa"):
        HostFill(MiB, 4, MiB, Backing.REGISTER, None, numa="near")


from gpuskip import have_gpu as _have_gpu  # noqa: E402


@pytest.mark.gpu
@pytest.mark.skipif(not _have_gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("backing", ["register", "pinned", "cumem"])
def test_gpu_fill_pins_the_range_and_the_device_reads_it(backing):
    import cupy as cp

    rt = cp.cuda.runtime
    fill = HostFill(MiB, 64, 8 * MiB, backing, rt).start()
    try:
        assert fill.wait(64, timeout_s=60), fill.error
        assert fill.dev_ptr is not None and not fill.failed
        fill.view[5] = 9
        fill.view[63] = 4  # the last unit
        d = cp.zeros(2 * MiB, cp.uint8)
        rt.memcpy(d.data.ptr, fill.ptr + 5 * MiB, MiB, rt.memcpyHostToDevice)
        rt.memcpy(d.data.ptr + MiB, fill.ptr + 63 * MiB, MiB, rt.memcpyHostToDevice)
        assert int(d[:MiB].min()) == 9 and int(d[MiB:].max()) == 4
        # zero-copy through the device address of the range (the SM kernel's path)
        mem = cp.cuda.UnownedMemory(fill.dev_ptr, 64 * MiB, fill)
        view = cp.ndarray(64 * MiB, cp.uint8, cp.cuda.MemoryPointer(mem, 0))
        assert int(view[63 * MiB]) == 4
    finally:
        fill.close()


def test_numa_and_thp_are_read_from_sysfs(tmp_path):
    from kvsim_backends.hw.hostfill import node_cpus, numa_nodes, thp_mode

    for n, cpus in ((0, "0-3,8"), (1, "4-7")):
        d = tmp_path / f"node{n}"
        d.mkdir()
        (d / "cpulist").write_text(cpus + "\n")
    (tmp_path / "possible").write_text("0-1\n")
    assert numa_nodes(str(tmp_path)) == [0, 1]
    assert node_cpus(0, str(tmp_path)) == {0, 1, 2, 3, 8} and node_cpus(1, str(tmp_path)) == {4, 5, 6, 7}
    assert node_cpus(2, str(tmp_path)) == set()
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert thp_mode(str(f)) == "madvise"
    assert thp_mode(str(tmp_path / "absent")) is None


def test_huge_pages_off_by_default_and_recorded():
    off = HostFill(MiB, 4, MiB, Backing.REGISTER, None)
    on = HostFill(MiB, 4, MiB, Backing.REGISTER, None, huge_pages=True)
    try:
        assert off.info["huge_pages"] is False
        # asked for: applied where the kernel has transparent huge pages
        assert on.info["huge_pages"] is (on.info["thp_mode"] in ("always", "madvise"))
    finally:
        off.close()
        on.close()
