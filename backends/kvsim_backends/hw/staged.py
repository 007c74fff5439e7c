"""Disk transfers of the hw backend: host <-> disk directly, GPU <-> disk staged.

Host <-> disk is one pread/pwrite job a piece on the disk store's I/O threads, straight
from or into the host tier's rows. GPU <-> disk goes through pinned staging buffers, two
at a time per transfer (one copying while the other is read or written). Each transfer is
a generator process on the runtime and returns True only when every byte landed. With
``io_mode: serial`` (a ``SerialTurn``) each transfer holds the disk from its first piece
to its last, staging copies included, and transfers take turns in the order they were
submitted: seed 004's blocking loop in a host callback, whole transfers one at a time (a
staged transfer submits its pieces a staging buffer at a time, after its first copy, so
without the turn a later transfer's pieces could run before or between them).

Invariants: a disk slot is marked written only after its write completed; a GPU -> disk
transfer marks its destination slots unwritten before it starts (a failed write leaves
them unreadable, never stale); every staging buffer taken is given back, and none is
reused while a read or write into it is in flight; failures are appended to ``errors``;
a ``SerialTurn`` is held by one transfer at a time, handed on in first-come order when
that transfer ends (failed or not).
"""

from __future__ import annotations

import collections

import numpy as np

from kvsim.core.datapath.diskio import IoClass


def rows(view: np.ndarray, slots: np.ndarray) -> list[np.ndarray]:
    """Row views (no copies) of ``view`` at ``slots``."""
    return [view[int(s)] for s in slots]


class SerialTurn:
    """The disk's turn (``io_mode: serial``), on the runtime's thread: ``take`` when a
    transfer is submitted (None: the disk is free, go; else a waitable of this runtime),
    ``give`` when it ends (the next in line goes)."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.busy = False
        self.line: collections.deque = collections.deque()
        self.turns = 0  # transfers that took a turn

    def take(self):
        self.turns += 1
        if not self.busy:
            self.busy = True
            return None
        ev = self.runtime.event()
        self.line.append(ev)
        return ev

    def give(self) -> None:
        if self.line:
            self.line.popleft().succeed(None)  # (the turn passes on: still busy)
        else:
            self.busy = False

    def whole(self, gen):
        """``gen`` (a transfer's generator) run in its turn, taken now: a generator."""
        ev = self.take()

        def run():
            try:
                if ev is not None:
                    yield ev
                return (yield from gen)
            finally:
                self.give()
        return run()


class StagedDisk:
    """Transfers to and from ``disk`` (a DiskStore) for the ``host`` tier (HostRegion or
    None) and, through ``staging`` (a StagingPool) and ``copies``, the GPU."""

    def __init__(self, disk, host, staging, copies, waits, errors, turn: SerialTurn | None = None):
        self.turn = turn  # io_mode serial: whole transfers one at a time
        self.disk = disk
        self.host = host
        self.staging = staging
        self.copies = copies
        self.waits = waits
        self.errors = errors

    def process(self, gen):
        """``gen`` (one of the transfers below) as a process of the runtime, in its turn
        where the disk is serial."""
        return self.waits.runtime.process(self.turn.whole(gen) if self.turn is not None else gen)

    def host_to_disk(self, src, dst, io: list, cls: IoClass = IoClass.WRITE, transfer=None):
        """``cls``: the write's class (WRITE, or BACKGROUND); ``transfer``: the key its
        pieces are queued under (the Batch)."""
        try:
            futs = self.disk.submit_writes(dst, rows(self.host.view, src), cls, transfer)
        except OSError as e:
            self.errors.append(f"host->disk: {e}")
            return False
        err = yield self.waits.futures(futs, io)
        return self._finish_write(dst, err, "host->disk")

    def disk_to_host(self, src, dst, io: list, transfer=None):
        try:
            futs = self.disk.submit_reads(src, rows(self.host.view, dst), transfer)
        except OSError as e:
            self.errors.append(f"disk->host: {e}")
            return False
        err = yield self.waits.futures(futs, io)
        if err is not None:
            self.errors.append(f"disk->host: {type(err).__name__}: {err}")
        return err is None

    def _finish_write(self, slots, err, what: str) -> bool:
        if err is not None:
            self.errors.append(f"{what}: {type(err).__name__}: {err}")
            return False
        self.disk.mark_written(slots)
        return True

    def _stage_chunks(self, n: int):
        step = self.staging.slots
        return [(i, min(n, i + step)) for i in range(0, n, step)]

    def gpu_to_disk(self, src, dst, io: list, cls: IoClass = IoClass.WRITE, transfer=None):
        """GPU -> staging (copy) then staging -> disk (pwrite), two buffers in flight."""
        try:
            self.disk.check_writable()
        except OSError as e:
            self.errors.append(f"gpu->disk: {e}")
            return False
        self.disk.valid[dst] = False
        ok, inflight = True, collections.deque()
        for a, b in self._stage_chunks(len(src)):
            if len(inflight) >= 2:
                ok &= yield from self._retire_write(inflight)
            if not ok:
                break
            buf = self.staging.get()
            copied = yield self.copies.to_staging(buf, src[a:b])
            if not copied:
                self.staging.put(buf)
                ok = False
                break
            try:
                futs = self.disk.submit_writes(dst[a:b], buf.view[: b - a], cls, transfer)
            except OSError as e:
                self.errors.append(f"gpu->disk: {e}")
                self.staging.put(buf)
                ok = False
                break
            inflight.append((buf, dst[a:b], self.waits.futures(futs, io)))
        while inflight:  # wait for every write before the staging buffers are reused
            ok &= yield from self._retire_write(inflight)
        return bool(ok)

    def _retire_write(self, inflight):
        buf, slots, ev = inflight.popleft()
        err = yield ev
        self.staging.put(buf)
        return self._finish_write(slots, err, "gpu->disk")

    def disk_to_gpu(self, src, dst, io: list, transfer=None):
        """disk -> staging (pread) then staging -> GPU (copy), two buffers in flight."""
        try:
            self.disk.check_readable(src)
        except OSError as e:
            self.errors.append(f"disk->gpu: {e}")
            return False
        ok, inflight = True, collections.deque()
        for a, b in self._stage_chunks(len(src)):
            buf = self.staging.get()
            futs = self.disk.submit_reads(src[a:b], buf.view[: b - a], transfer)
            inflight.append((buf, a, b, self.waits.futures(futs, io)))
            if len(inflight) >= 2:
                ok &= yield from self._retire_read(inflight, dst)
            if not ok:
                break
        while inflight:  # let every read finish before the staging buffers are reused
            ok &= yield from self._retire_read(inflight, dst)
        return bool(ok)

    def _retire_read(self, inflight, dst):
        buf, a, b, ev = inflight.popleft()
        err = yield ev
        if err is not None:
            self.errors.append(f"disk->gpu: {type(err).__name__}: {err}")
            self.staging.put(buf)
            return False
        copied = yield self.copies.from_staging(buf, dst[a:b])
        self.staging.put(buf)
        return bool(copied)
