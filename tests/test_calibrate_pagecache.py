"""``kvsim calibrate`` measures the page cache in front of the disk folder
(``kvsim_backends.hw.pagecacheprobe``) and fits its dirty limits where a throttle was seen
(``kvsim.tools.fitpagecache``): the keys written validate, a tiny CPU run leaves nothing
behind, and a throttle found or not decides which keys are measured and which stay the
base profile's."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.tools.calibrate import calibrate, profile_text
from kvsim.tools.fitpagecache import fit_page_cache
from kvsim_backends.hw import pagecacheprobe as probe

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux's /proc")
MiB, GiB = 1 << 20, 1 << 30
PIECE = 4 * MiB


def limits(dirty_limit: int, background: int) -> dict:
    return {"dirty_limit": dirty_limit, "dirty_background": background, "dirty_expire": 12.5,
            "mem_total": 64 * GiB, "mem_available": 48 * GiB}


def fake_writer(throttle_piece):
    """A writer of ``size`` bytes (nothing written) at 8 GB/s, from piece ``throttle_piece(n)``
    on at 2 GB/s (None: never); Dirty every 64 MiB is the bytes written so far."""
    def write_file(fd, size, piece):
        n = size // piece
        at = throttle_piece(n)
        dt = np.where(np.arange(n) < (n if at is None else at), piece / 8e9, piece / 2e9)
        every = 64 * MiB // piece
        return np.cumsum(dt), [((i + 1) * piece, (i + 1) * piece) for i in range(every - 1, n, every)]
    return write_file


def fitted(pc: dict, base: str) -> tuple[HardwareProfile, dict]:
    """The base profile with ``pc`` fitted, written as calibrate writes it and loaded back."""
    b = load_profile(base)
    d, why = b.model_dump(), {}
    fit_page_cache(pc, d, why)
    text = profile_text(d, why, b.name, "test")
    return HardwareProfile.model_validate(yaml.safe_load(text)), why


def test_a_tiny_cpu_calibration_measures_and_leaves_nothing(tmp_path):
    disk, out = tmp_path / "disk", tmp_path / "hw" / "cal.yaml"
    disk.mkdir()
    report = calibrate(out, device="cpu", disk_dir=str(disk))
    assert list(disk.iterdir()) == []  # the probe's scratch file and the disk tier's are gone
    pc = report["page_cache"]
    # CPU mode writes at most 64 MiB, the kernel's dirty limit x 1.25 or half the free space
    lim = pc["limits"]
    want = min(64 * MiB, lim["dirty_limit"] * 5 // 4 // MiB * MiB) // PIECE * PIECE
    assert pc["size"] <= want and pc["piece"] == load_profile("h200-pcie").nvme.piece
    # one 64 MiB window at most: too few to tell a throttle, so the base's keys stay
    assert pc["phases"]["throttle_at"] is None
    prof, base = load_profile(out), load_profile("h200-pcie")
    assert prof.page_cache == base.page_cache
    saved = json.loads(out.with_name(out.name + ".report.json").read_text())
    assert saved["why"]["page_cache.dirty_*"].startswith("base: no throttle seen")
    assert "page_cache.rate: base:" in out.read_text()


def test_a_failed_probe_removes_its_file(tmp_path, monkeypatch):
    def boom(fd, size, piece):
        os.pwrite(fd, b"z" * 4096, 0)
        raise KeyboardInterrupt  # as Ctrl-C mid-write
    monkeypatch.setattr(probe, "write_file", boom)
    with pytest.raises(KeyboardInterrupt):
        probe.measure_for_calibrate(str(tmp_path), 64 * MiB, PIECE)
    assert list(tmp_path.iterdir()) == []


def test_the_size_is_the_dirty_limit_and_a_quarter_under_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "kernel_limits", lambda: limits(16 * MiB, 8 * MiB))
    pc = probe.measure_for_calibrate(str(tmp_path), 64 * MiB, PIECE)
    assert pc["size"] == 20 * MiB and pc["size_bound"] == "the kernel's dirty limit x 1.25"
    pc = probe.measure_for_calibrate(str(tmp_path), 16 * MiB, PIECE)
    assert pc["size"] == 16 * MiB and pc["size_bound"].startswith("the cap")
    pc = probe.measure_for_calibrate(str(tmp_path), 16 * MiB, 4 * MiB // 2)
    assert pc["size"] == 16 * MiB  # 8 pieces of 2 MiB: measured
    pc = probe.measure_for_calibrate(str(tmp_path), 8 * MiB, PIECE)
    assert pc["skipped"] and "under 8 pieces" in pc["skipped"]
    assert list(tmp_path.iterdir()) == []


def test_a_throttle_found_sets_the_dirty_keys(tmp_path, monkeypatch):
    """1 GiB of /proc dirty limit: 1.25 GiB written (320 pieces); the throttle from the
    160th piece (640 MiB, a window's start) on. dirty_limit is the Dirty bytes then,
    dirty_background the smaller of /proc's 512 MiB and that; rate and capacity the base's."""
    monkeypatch.setattr(probe, "kernel_limits", lambda: limits(GiB, 512 * MiB))
    monkeypatch.setattr(probe, "shutil", type("S", (), {"disk_usage": staticmethod(
        lambda p: type("U", (), {"free": 100 * GiB})())}))
    monkeypatch.setattr(probe, "write_file", fake_writer(lambda n: n // 2))
    pc = probe.measure_for_calibrate(str(tmp_path), 8 * GiB, PIECE)
    assert list(tmp_path.iterdir()) == []
    assert pc["size"] == 1280 * MiB and pc["phases"]["throttle_at"] == 640 * MiB
    prof, why = fitted(pc, "h200-pcie")
    base = load_profile("h200-pcie").page_cache
    assert prof.page_cache.dirty_limit == 640 * MiB
    assert prof.page_cache.dirty_background == 512 * MiB
    assert prof.page_cache.dirty_expire == 12.5
    assert (prof.page_cache.rate, prof.page_cache.capacity) == (base.rate, base.capacity)
    assert why["page_cache.dirty_limit"].startswith("measured:")
    assert why["page_cache.rate"].startswith("base:") and why["page_cache.capacity"].startswith("base:")
    # a base without a page_cache section: one written whole, rate one thread's (8 GB/s
    # here), capacity MemAvailable
    prof, why = fitted(pc, "h200-dgx")
    assert prof.page_cache.rate == pytest.approx(8e9) and prof.page_cache.capacity == 48 * GiB
    assert prof.page_cache.dirty_limit == 640 * MiB


def test_no_throttle_keeps_the_base_keys(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "kernel_limits", lambda: limits(GiB, 512 * MiB))
    monkeypatch.setattr(probe, "write_file", fake_writer(lambda n: None))
    pc = probe.measure_for_calibrate(str(tmp_path), 256 * MiB, PIECE)
    assert pc["size"] == 256 * MiB and pc["phases"]["throttle_at"] is None
    prof, why = fitted(pc, "h200-pcie")
    assert prof.page_cache == load_profile("h200-pcie").page_cache
    assert "no throttle seen in 256 MiB" in why["page_cache.dirty_*"]
    prof, why = fitted(pc, "h200-dgx")
    assert prof.page_cache is None


def test_a_folder_without_write_back_is_not_measured(tmp_path, monkeypatch):
    monkeypatch.setattr(probe, "fs_type", lambda folder: "tmpfs")
    pc = probe.measure_for_calibrate(str(tmp_path), 64 * MiB, PIECE)
    assert "tmpfs" in pc["skipped"] and list(tmp_path.iterdir()) == []
    prof, why = fitted(pc, "h200-pcie")
    assert prof.page_cache == load_profile("h200-pcie").page_cache
    assert why["page_cache"].startswith("base: not measured")


def test_a_report_from_before_keeps_the_profile_as_it_was():
    prof, why = fitted(None, "h200-pcie")
    assert prof.page_cache == load_profile("h200-pcie").page_cache and why == {}
