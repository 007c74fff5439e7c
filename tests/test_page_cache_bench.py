"""benchmarks/page_cache.py, tiny (32 MiB in 1 MiB pieces): it prints the profile's
``page_cache`` keys as YAML the profile's model accepts, the timeline beside the sim's,
and its headline last; it removes its file when it ends, when it fails, and one a killed
run left behind."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml

from kvsim import scratch
from kvsim.config.pagecachespec import PageCacheSpec

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux's /proc")
ROOT = Path(__file__).resolve().parent.parent


def bench():
    spec = importlib.util.spec_from_file_location("page_cache_bench", ROOT / "benchmarks" / "page_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_run_prints_the_keys_and_leaves_nothing(tmp_path, capsys):
    dead = tmp_path / f"kvsim-pagecache.kvsim-{2**22 + 7}-1-{scratch._host()}-abcdefgh.bin"
    dead.write_bytes(b"x")  # a killed run's file (no process has that pid)
    other = tmp_path / "keep.bin"
    other.write_bytes(b"y")  # not a scratch file: never touched
    assert bench().main(["--dir", str(tmp_path), "--size", str(32 / 1024), "--piece", "1",
                         "--read", str(8 / 1024)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]
    name, value = out[-1].split(": ")
    assert name == "page_cache_sim_rel_err" and float(value) > -1.0
    start = out.index("page_cache:")
    keys = yaml.safe_load("\n".join(out[start:start + 6]))["page_cache"]
    spec = PageCacheSpec.model_validate(keys)  # the profile's own validation
    assert spec.rate > 0 and spec.dirty_background <= spec.dirty_limit <= spec.capacity
    rows = [line.split() for line in out if line.startswith("# ") and line[2:].strip()[:1].isdigit()]
    assert len(rows) == 10 and float(rows[-1][1]) == pytest.approx(32 / 1024, abs=1e-3)
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)


def test_a_failed_run_removes_its_file(tmp_path, monkeypatch):
    mod = bench()

    def boom(fd, size, piece):
        os.pwrite(fd, b"z" * 4096, 0)
        raise KeyboardInterrupt  # as Ctrl-C mid-write

    from kvsim_backends.hw import pagecacheprobe
    monkeypatch.setattr(pagecacheprobe, "write_file", boom)
    with pytest.raises(KeyboardInterrupt):
        mod.main(["--dir", str(tmp_path), "--size", str(8 / 1024), "--piece", "1"])
    assert list(tmp_path.iterdir()) == []


def test_a_missing_folder_is_refused(tmp_path, capsys):
    assert bench().main(["--dir", str(tmp_path / "nope")]) == 2
    assert "--dir" in capsys.readouterr().err


def test_phases_find_the_throttle_in_a_known_timeline():
    """4 MiB pieces: 1 GiB at 8 GB/s, then 1 GiB at 2 GB/s; Dirty sampled every 64 MiB is
    the bytes written so far. The memory rate, the final rate and the onset (the first
    64 MiB window after 1 GiB) come back."""
    import numpy as np
    mib, piece = 2**20, 4 * 2**20
    n = 512
    dt = np.where(np.arange(n) < 256, piece / 8e9, piece / 2e9)
    ends = np.cumsum(dt)
    dirty = [((i + 1) * piece, (i + 1) * piece) for i in range(15, n, 16)]
    ph = bench().phases(ends, piece, dirty)
    assert ph["memory_rate"] == pytest.approx(8e9) and ph["throttled_rate"] == pytest.approx(2e9)
    assert ph["throttle_at"] == 1024 * mib and ph["dirty_at_throttle"] == 1024 * mib


def test_a_throttled_writer_starts_write_back_whatever_the_background():
    """The sim's page cache with ``dirty_background`` equal to ``dirty_limit`` (as the H200's
    measurement gave): a writer of 10 pieces past the limit goes on at the drive's pace,
    not at the 30 s expiry's (the model waited for it before 2026-12-03)."""
    mb = 1 << 20
    keys = {"rate": 1e9, "dirty_limit": 3 * mb, "dirty_background": 3 * mb, "dirty_expire": 30.0,
            "capacity": 64 * mb}
    ends = bench().predict(10, mb, keys, 0.5e9, mb)
    # 3 pieces into memory, then each further one after a piece of write-back at 0.5 GB/s
    assert ends[2] == pytest.approx(3 * mb / 1e9, rel=1e-6)
    assert 7 * mb / 0.5e9 <= ends[-1] < 3 * mb / 1e9 + 8 * mb / 0.5e9 + 8 * mb / 1e9
