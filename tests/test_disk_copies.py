"""Retained disk copies and write-through on both backends, and their config keys.

A small replay (GPU 3 MiB, host 2 MiB, disk 32 MiB of 4 KiB pages, sessions held between
turns, the refcheck on) evicts through host to disk and restores from disk, so pages keep
disk copies, evictions take them back and write-through copies pages in the background.
The refcheck reads back every taken-back copy's disk slot (``kvsim.engine.stages``): the
runs passing means every reused copy held its page's bytes, on the sim (tags) and on the
hw backend in CPU mode (bytes in the disk tier's file). Controls: a copy made stale on
purpose is caught; a failed write-through's copy is never taken back.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import ConfigFileError, load_config
from kvsim.core.plan import BatchKind
from kvsim.core.spec import Level
from kvsim.engine.refcheck import RefcheckError
from kvsim.run import prepare_run, replay
from kvsim_backends.hw import HwBackend
from kvsim_backends.sim.backend import SimBackend

BASE = ["workload.synthetic.n_sessions=6", "model=llama-3-8b", "cache.page_bytes=4KiB",
        "output.plots=false", "engine.refcheck=true"]
# write-through's writes are the disk I/O workers' background class: it needs workers
COPIES = ["cache.tiers[2].io_workers=4", "cache.tiers[2].keep_copy=true",
          "cache.tiers[2].write_through=true"]


def _tiers(path=None) -> str:
    where = f", path: '{path}'" if path else ""
    return ("cache.tiers=[{level: gpu, quota: 3MiB}, {level: host, quota: 2MiB}, "
            f"{{level: disk, quota: 32MiB{where}}}]")


def _run(backend: str, tmp_path: Path, extra=()):
    sets = [*BASE, _tiers(tmp_path if backend == "hw" else None), *extra]
    opts = {"device": "cpu", "time_scale": 100.0} if backend == "hw" else {}
    return replay(prepare_run(load_config("default", sets)), backend, backend_options=opts)


@pytest.mark.parametrize("backend", ["sim", "hw"])
def test_reused_copies_read_back_right_on_both_backends(tmp_path, backend):
    base_run = _run(backend, tmp_path)
    base = base_run.metrics
    run = _run(backend, tmp_path, COPIES)
    m = run.metrics
    c = m["disk_copies"]
    # the timeline reports retained copies apart from evictable disk pages (options on only)
    assert "disk_retained_slots" not in base_run.timeline[-1]
    assert max(r["disk_retained_slots"] for r in run.timeline) > 0
    assert "disk_copies" not in base  # the options off: the summary as before
    assert m["requests_completed"] == base["requests_completed"] > 0
    assert c["kept"] > 0 and c["write_through_pages"] > 0
    assert c["reused"] > 0  # each one's disk slot was read back by the refcheck
    # evictions that took a copy back wrote nothing: fewer pages written by evictions
    assert m["failed_batches"] == 0


@pytest.mark.parametrize("backend", ["sim", "hw"])
def test_a_stale_copy_taken_back_fails_the_refcheck(tmp_path, backend, monkeypatch):
    """The control: if a taken-back copy did not hold its page's bytes (here: its slot is
    spoiled as it is taken back), the refcheck stops the run."""
    cls = SimBackend if backend == "sim" else HwBackend
    real = cls._take_back

    def spoil(self, batch):
        slots = list(batch.dst_slots)
        if backend == "sim":
            for s in slots:
                self.tags[Level.DISK][s] = 12345
        else:
            for s in slots:  # the file itself: the slots' bytes zeroed
                self.disk._pwrite(np.zeros(self.page_bytes, np.uint8), s * self.page_bytes)
        return real(self, batch)

    monkeypatch.setattr(cls, "_take_back", spoil)
    with pytest.raises(RefcheckError, match="refcheck failed"):
        _run(backend, tmp_path, COPIES)


def test_a_failed_write_through_is_never_served_on_hw(tmp_path, monkeypatch):
    """Every other write-through batch fails (the hw backend's fault injection: its disk
    slots are marked as holding no completed write). The run completes with the refcheck
    passing, and no eviction ever takes back a copy in a slot whose last write failed."""
    real_transfer, real_take = HwBackend.transfer, HwBackend._take_back
    seen = {"failed": 0, "takebacks": 0}

    def transfer(self, batch, path=None):
        if batch.kind is BatchKind.BACKGROUND:
            seen["failed"] += 1
            if seen["failed"] % 2:
                self.fail_next_transfer(1)
        return real_transfer(self, batch, path)

    def take_back(self, batch):
        slots = np.asarray(batch.dst_slots, dtype=np.int64)
        assert self.disk.valid[slots].all(), "a copy whose write did not complete was reused"
        seen["takebacks"] += 1
        return real_take(self, batch)

    monkeypatch.setattr(HwBackend, "transfer", transfer)
    monkeypatch.setattr(HwBackend, "_take_back", take_back)
    m = _run("hw", tmp_path, COPIES).metrics
    c = m["disk_copies"]
    assert c["write_through_failed"] > 0 and c["write_through_pages"] > 0
    assert seen["takebacks"] > 0 and m["requests_completed"] > 0


@pytest.mark.parametrize("sets, key", [
    (["cache.tiers=[{level: gpu, quota: 3MiB}, "
      "{level: disk, quota: 32MiB, io_workers: 4, write_through: true}]"], "tiers[1].write_through"),
    (["cache.tiers[2].write_through=true"], "tiers[2].io_workers"),
    (["cache.tiers[2].protected_copy_fraction=1.5"], "protected_copy_fraction"),
    (["cache.tiers[2].protected_copy_fraction=-0.25"], "protected_copy_fraction"),
    (["cache.tiers[1].keep_copy=true"], "keep_copy"),
])
def test_bad_copy_options_are_errors_naming_the_key(sets, key):
    with pytest.raises(ConfigFileError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_config("default", sets)
    r = CliRunner().invoke(app, ["run", "default", *[a for s in sets for a in ("--set", s)]])
    assert r.exit_code == 2 and "Traceback" not in r.output
