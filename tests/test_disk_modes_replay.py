"""Seed 004's disk modes in a replay on the hw backend, refcheck on: ``io_mode: serial``
and write-through's take-back (``write_through_pending: take_back``).

Six synthetic sessions (Llama 3 8B shape, 4 KiB pages) on a small GPU (8 MiB) and host
(1 MiB) tier, so pages go to disk and come back. The test records, in order, each disk
batch the engine hands the backend and each piece the disk's I/O thread runs (with the
transfer it belongs to; the refcheck's own reads belong to none). Staging is two pages,
so a GPU <-> disk batch reaches the disk a staging buffer at a time.

- serial: the pieces of the transfers, read in the order they ran, form one unbroken run
  per transfer, the runs in the order the batches came, each with the pieces
  ``kvsim.core.datapath.diskio.pieces`` cuts it into;
- take-back: some evictions take back copies whose write-through was still running; each
  take-back reaches the backend only after the writes of its slots completed (its slots
  hold a completed write), moves no bytes, and the take-backs' pages are the core's
  reused copies;
- both: every request completes, no batch fails (the refcheck verified every page read
  back), the disk bytes counted are the batches' pages, and once the run ends the tier's
  folder is empty and no disk I/O thread is left.

In CPU mode (numpy standing in for device memory) in CI; on a GPU with the ``gpu`` marker.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from gpuskip import have_gpu
from kvsim.config import load_config
from kvsim.core.datapath.diskio import pieces
from kvsim.core.plan import BatchKind
from kvsim.core.spec import Level
from kvsim.run import prepare_run, replay

from kvsim_backends.hw import HwBackend
from kvsim_backends.hw.iopools import PriorityPool

PAGE = 4096
BASE = ["workload.synthetic.n_sessions=6", "model=llama-3-8b", f"cache.page_bytes={PAGE}",
        "cache.tiers=[{level: gpu, quota: 8MiB}, {level: host, quota: 1MiB}, {level: disk, quota: 16MiB}]",
        "output.plots=false"]
MODES = {"serial": ["cache.tiers[2].io_mode=serial"],
         "take_back": ["cache.tiers[2].io_workers=4", "cache.tiers[2].write_through=true",
                       "cache.tiers[2].write_through_pending=take_back"]}
DEVICES = ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not have_gpu(), reason="needs CuPy and a CUDA GPU")])]


def _replay(mode, device, tmp_path, monkeypatch):
    """The replay's metrics, and what it recorded: ``batches`` (each disk batch handed to
    the backend, in order, with whether its disk slots held a completed write then),
    ``ran`` (each disk piece as its thread took it: its transfer's batch or None), the
    backends."""
    cfg = load_config("default", BASE + MODES[mode])
    assert cfg.engine.refcheck
    rec = {"batches": [], "ran": [], "backends": []}
    lock = threading.Lock()
    transfer, submit = HwBackend.transfer, PriorityPool.submit_group

    def on_transfer(self, batch, path=None):
        if self not in rec["backends"]:
            rec["backends"].append(self)
        if Level.DISK in (batch.src, batch.dst) and batch.pages:
            slots = np.asarray(batch.src_slots if batch.src == Level.DISK else batch.dst_slots)
            rec["batches"].append((batch, bool(self.disk.valid[slots].all())))
        return transfer(self, batch, path)

    def on_submit(self, fn, jobs, cls=None, transfer=None):
        def run(job, fn=fn, key=transfer):
            with lock:
                rec["ran"].append(key)
            return fn(job)
        return submit(self, run, jobs, *(() if cls is None else (cls,)), transfer)

    monkeypatch.setattr(HwBackend, "transfer", on_transfer)
    monkeypatch.setattr(PriorityPool, "submit_group", on_submit)
    prep = prepare_run(cfg)
    m = replay(prep, "hw", backend_options={"device": device, "time_scale": 40.0,
                                            "disk_dir": str(tmp_path), "staging_bytes": 2 * PAGE}).metrics
    assert m["requests_completed"] == prep.workload.request_count()
    assert m["requests_failed"] == 0 and m["failed_batches"] == 0  # (refcheck on: all verified)
    moved = [b for b, _ in rec["batches"] if b.kind is not BatchKind.TAKEBACK]
    assert m["bytes"]["disk_read"] == PAGE * sum(b.pages for b in moved if b.src == Level.DISK) > 0
    assert m["bytes"]["disk_write"] == PAGE * sum(b.pages for b in moved if b.dst == Level.DISK) > 0
    assert os.listdir(tmp_path) == []  # the tier's file removed
    assert not [t for t in threading.enumerate() if t.name.startswith("kvsim-disk")]
    return m, rec


def cut(batch, piece: int) -> int:
    """How many pieces ``batch`` reaches the disk in: host <-> disk at once, GPU <-> disk
    a staging buffer (two pages) at a time, each part cut by ``pieces``."""
    n = int(batch.pages)
    if Level.GPU not in (batch.src, batch.dst):
        return len(pieces(PAGE, n, piece))
    return sum(len(pieces(PAGE, min(2, n - i), piece)) for i in range(0, n, 2))


@pytest.mark.parametrize("device", DEVICES)
def test_serial_runs_each_disk_transfer_whole_in_the_order_it_came(device, tmp_path, monkeypatch):
    m, rec = _replay("serial", device, tmp_path, monkeypatch)
    (be,) = rec["backends"]
    piece = be.profile.nvme.piece
    runs: list = []  # (transfer, pieces) in the order they ran
    for key in rec["ran"]:
        if key is None:
            continue  # the refcheck's read of a page just written
        if runs and runs[-1][0] is key:
            runs[-1][1] += 1
        else:
            runs.append([key, 1])
    batches = [b for b, _ in rec["batches"]]
    assert [k for k, _ in runs] == batches  # each once, whole, in the order it came
    assert [n for _, n in runs] == [cut(b, piece) for b in batches]
    assert any(b.src == Level.DISK for b in batches) and any(b.dst == Level.DISK for b in batches)
    assert any(b.pages > 2 and Level.GPU in (b.src, b.dst) for b in batches)  # (staged in parts)
    turn = be.staged.turn  # every batch took the disk's turn and handed it back
    assert turn.turns == len(batches) and not turn.busy and not turn.line


@pytest.mark.parametrize("device", DEVICES)
def test_take_back_waits_for_the_write_and_moves_no_bytes(device, tmp_path, monkeypatch):
    m, rec = _replay("take_back", device, tmp_path, monkeypatch)
    takes = [(b, written) for b, written in rec["batches"] if b.kind is BatchKind.TAKEBACK]
    copies = m["disk_copies"]
    assert copies["reused_pending"] > 0  # some copies were taken back while being written
    assert all(written for _, written in takes)  # ... each only after its write completed
    assert sum(b.pages for b, _ in takes) == copies["reused"]
    assert sum(b.pages for b, _ in rec["batches"] if b.kind is BatchKind.BACKGROUND) >= copies["reused"]
