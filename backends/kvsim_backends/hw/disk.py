"""The disk tier: one preallocated file of slots, read and written in pieces by a thread pool.

The file is a scratch file (``kvsim.scratch.make_file``: O_EXCL, mode 0600, private to the
user, its name carrying its owner's pid and start time, so the next run's sweep of the
folder removes it if this process is killed before ``close``), preallocated with posix_fallocate (a full disk fails construction with the sizes; with
``preallocate=False`` the file is sparse and a full disk fails later writes with ENOSPC,
which fail their transfer), and removed on close. Pages are read and written with pread/pwrite in pieces of at most
``piece_bytes``; pieces are grouped into jobs of at most ``piece_bytes`` (so small pages
do not cost one future each) and run on ``io_threads`` threads that serve the batches in
flight round robin (``FairPool``): a one-page write issued while a 512-page eviction is
being written shares the threads with it, as the sim's disk shares the device among the
transfers in flight, instead of waiting behind all its pieces (a FIFO pool made such
writes wait up to 0.58 s on the H200 machine). With ``priorities`` (the disk tier's
``io_workers`` > 0) the threads instead take pieces in the order of
``kvsim.core.datapath.diskio`` (``PriorityPool``): restores first, then required writes, then
background writes, with aging, and while a restore is queued or running at most
``write_cap(io_threads, io_write_share)`` write pieces in flight (the disk tier's
``io_write_share``), the rule the sim models too. With ``serial`` (``io_mode: serial``,
seed 004's baseline) one thread runs every transfer whole, first in first out, a restore
behind the writes queued before it; a failed piece fails its
transfer and its pieces not yet started are not run. O_DIRECT
is used where the filesystem takes it and the buffer, offset and length are aligned;
otherwise, or after the first EINVAL, the buffered descriptor.

Invariants:
- a slot is *valid* only after a write to it completed in full; a write marks it invalid
  when submitted, and a failed write leaves it invalid. ``check_readable`` refuses a read
  of an invalid slot, so no page is ever served from a copy whose write did not complete;
- ``io_hook(op, offset, nbytes)`` (tests' fault injection) runs before each system call
  that touches the file and may raise OSError, exactly as a failing call would: ``open``
  (creating the file; the O_DIRECT descriptor), ``allocate`` (posix_fallocate or
  ftruncate), and, on the I/O thread, ``write`` (pwrite) and ``read`` (pread). There is
  no fsync: the tier is scratch, never read after the process ends, so a write is done
  when its pwrite returned (a later writeback error on the buffered path would show as
  a page whose tags the refcheck does not find);
- the file's removal (its directory deleted) fails later writes with ENOENT; reads of
  completed writes still work through the open descriptor.
"""

from __future__ import annotations

import errno
import os
import shutil
import weakref
from concurrent.futures import Future
from typing import Callable, Hashable, Sequence

import numpy as np

from kvsim import scratch
from kvsim.core.datapath.diskio import WRITE_SHARE, IoClass, IoRule, pieces, write_cap

from .iopools import FairPool, PriorityPool

_ALIGN = 4096
IoHook = Callable[[str, int, int], None]


class DiskTierError(OSError):
    """The disk tier cannot be used as configured (directory, permissions, free space)."""


class DiskStore:
    """``io_threads`` threads run the tier's pieces of at most ``piece_bytes``: round robin
    over the transfers in flight (``FairPool``), or with ``priorities`` in the order of
    ``kvsim.core.datapath.diskio`` (``PriorityPool``: the disk tier's ``io_workers`` setting), with
    its write cap from ``io_write_share`` (the tier's ``io_write_share``)."""

    def __init__(self, disk_dir: str | os.PathLike, slots: int, page_bytes: int,
                 io_threads: int, piece_bytes: int, io_hook: IoHook | None = None,
                 direct: bool = True, preallocate: bool = True, priorities: bool = False,
                 io_write_share: float = WRITE_SHARE, pool: SharedPool | None = None,
                 serial: bool = False):
        self.slots = slots
        self.page_bytes = page_bytes
        self.piece_bytes = piece_bytes
        self.io_hook = io_hook
        self.nbytes = slots * page_bytes
        d = os.fspath(disk_dir)
        if not os.path.exists(d):
            raise DiskTierError(errno.ENOENT, f"disk_dir: {d!r} does not exist")
        if not os.path.isdir(d):
            raise DiskTierError(errno.ENOTDIR, f"disk_dir: {d!r} is not a directory")
        if not os.access(d, os.W_OK | os.X_OK):
            raise DiskTierError(errno.EACCES, f"disk_dir: {d!r} is not writable by this user")
        try:
            if io_hook is not None:
                io_hook("open", 0, 0)
            path, self.fd = scratch.make_file(d, "kvsim-disk", ".bin")
        except OSError as e:
            raise DiskTierError(e.errno, f"disk_dir: cannot create the disk tier file "
                                         f"in {d!r}: {e.strerror or e}") from None
        self.path = os.fspath(path)
        self.direct_fd: int | None = None
        self.pool: FairPool | PriorityPool | None = None
        self.priorities = bool(priorities)
        # removed by close(), else when collected or at interpreter exit
        self._unlink = weakref.finalize(self, _unlink_quietly, self.path)
        try:
            if io_hook is not None:
                try:
                    io_hook("allocate", 0, self.nbytes)
                except OSError as e:
                    raise DiskTierError(e.errno, f"disk_dir: cannot allocate the disk tier's "
                                                 f"{self.nbytes} bytes in {d!r}: {e.strerror or e}") from None
            if preallocate:
                self._preallocate(d)
            else:  # a sparse file: a full disk shows up later as ENOSPC on a write
                os.ftruncate(self.fd, self.nbytes)
            if direct:
                self.direct_fd = self._open_direct()
        except BaseException:
            self.close()
            raise
        self.valid = np.zeros(slots, dtype=bool)
        self._layouts: dict[int, list[list[tuple[int, int, int]]]] = {}  # pages -> pieces
        # its I/O threads: its own, or a node's drive's, shared by the ranks' stores
        own = pool is None
        self._shared = (SharedPool(io_threads, piece_bytes, priorities, io_write_share, serial)
                        if own else pool)
        self.pool = self._shared.join()
        if own:
            self._stop_pool = weakref.finalize(self, self.pool.shutdown, False)  # if never closed

    # -- setup ------------------------------------------------------------------------

    def _preallocate(self, d: str) -> None:
        try:
            os.posix_fallocate(self.fd, 0, self.nbytes)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                free = shutil.disk_usage(d).free
                raise DiskTierError(errno.ENOSPC, f"slots[DISK]: the disk tier needs {self.nbytes} "
                                                  f"bytes in {d!r}, which has {free} free") from None
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                raise DiskTierError(e.errno, f"disk_dir: cannot preallocate {self.nbytes} bytes "
                                             f"in {d!r}: {e.strerror}") from None
            os.ftruncate(self.fd, self.nbytes)  # no fallocate here: a sparse file

    def _open_direct(self) -> int | None:
        o_direct = getattr(os, "O_DIRECT", 0)
        if not o_direct or self.page_bytes % _ALIGN or self.nbytes < _ALIGN:
            return None
        try:
            if self.io_hook is not None:
                self.io_hook("open", 0, 0)
            fd = os.open(self.path, os.O_RDWR | o_direct | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None  # buffered I/O on the first descriptor
        import mmap  # noqa: PLC0415 - an aligned probe buffer
        probe = mmap.mmap(-1, _ALIGN)
        try:
            os.pwrite(fd, probe, 0)
            os.preadv(fd, [probe], 0)
        except OSError:
            os.close(fd)
            return None
        finally:
            probe.close()
        return fd

    @property
    def uses_direct(self) -> bool:
        return self.direct_fd is not None

    # -- I/O --------------------------------------------------------------------------

    def _fd_for(self, addr: int, off: int, nbytes: int) -> int:
        """The O_DIRECT descriptor if it is open and the buffer's address ``addr``, the file
        offset and the length are aligned; else the buffered one."""
        fd = self.direct_fd
        if fd is not None and not (addr % _ALIGN or off % _ALIGN or nbytes % _ALIGN):
            return fd
        return self.fd

    def _pwrite(self, buf: np.ndarray, off: int, addr: int | None = None) -> None:
        self._io("write", buf, off, addr)

    def _pread(self, buf: np.ndarray, off: int, addr: int | None = None) -> None:
        self._io("read", buf, off, addr)

    def _io(self, op: str, buf: np.ndarray, off: int, addr: int | None) -> None:
        """Move ``buf`` to (``write``) or from (``read``) the file at ``off`` in as many
        calls as the kernel needs, on the O_DIRECT descriptor where aligned (dropped for
        good if the filesystem refuses it), else the buffered one."""
        if self.io_hook is not None:
            self.io_hook(op, off, buf.nbytes)
        mv = memoryview(buf).cast("B")
        total = len(mv)
        if addr is None:
            addr = buf.ctypes.data if self.direct_fd is not None else 0
        write = op == "write"
        done = 0
        while done < total:
            fd = self._fd_for(addr + done, off + done, total - done)
            try:
                n = (os.pwrite(fd, mv[done:], off + done) if write
                     else os.preadv(fd, [mv[done:]], off + done))
            except OSError as e:
                if e.errno == errno.EINVAL and fd == self.direct_fd:
                    self.direct_fd = None  # the filesystem refused O_DIRECT after all
                    continue
                raise
            if n <= 0:
                raise OSError(errno.EIO, f"pwrite wrote nothing at offset {off + done}" if write
                              else f"pread hit the end of the disk tier at offset {off + done}")
            done += n

    def _pieces(self, slots: Sequence[int] | np.ndarray,
                rows: Sequence[np.ndarray] | np.ndarray) -> list[list[tuple[int, np.ndarray, int | None]]]:
        """Slot ``slots[i]`` and its buffer ``rows[i]`` (as far as the shorter goes) ->
        jobs: lists of (file offset, buffer, its address or None) of <= piece_bytes total
        (``kvsim.core.datapath.diskio.pieces``: the cut the sim models; kept per page count). The
        addresses (for O_DIRECT's alignment) come from one look-up when ``rows`` is one
        array of byte rows; else each piece looks its buffer's up."""
        sl = np.asarray(slots).tolist()
        n = min(len(sl), len(rows))
        layout = self._layouts.get(n)
        if layout is None:
            if len(self._layouts) >= 64:
                self._layouts.clear()
            layout = self._layouts[n] = pieces(self.page_bytes, n, self.piece_bytes)
        pb = self.page_bytes
        if (isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.itemsize == 1
                and rows.strides[1] == 1 and self.direct_fd is not None):
            base, step = rows.ctypes.data, rows.strides[0]
            return [[(sl[i] * pb + a, rows[i][a:b], base + i * step + a) for i, a, b in piece]
                    for piece in layout]
        return [[(sl[i] * pb + a, rows[i][a:b], None) for i, a, b in piece] for piece in layout]

    def _write_job(self, job) -> None:
        for off, buf, addr in job:
            self._pwrite(buf, off, addr)

    def _read_job(self, job) -> None:
        for off, buf, addr in job:
            self._pread(buf, off, addr)

    def check_writable(self) -> None:
        if os.fstat(self.fd).st_nlink == 0:
            raise OSError(errno.ENOENT, f"the disk tier file {self.path!r} was removed")

    def check_readable(self, slots: np.ndarray) -> None:
        bad = np.asarray(slots, dtype=np.int64)[~self.valid[slots]]
        if bad.size:
            raise OSError(errno.EIO, f"disk slots {bad[:8].tolist()} hold no completed write")

    def submit_writes(self, slots: np.ndarray, rows: np.ndarray, cls: IoClass = IoClass.WRITE,
                      transfer: Hashable | None = None) -> list[Future]:
        """Write ``rows[i]`` into disk slot ``slots[i]``. Marks the slots invalid until
        ``mark_written`` (call it only when every future succeeded). ``cls``: WRITE (a
        required write) or BACKGROUND; ``transfer``: the key its pieces are queued under
        (one per transfer: ``promote`` and a failed piece act on all of them)."""
        self.check_writable()
        self.valid[slots] = False
        return self.pool.submit_group(self._write_job, self._pieces(slots, rows), cls, transfer)

    def mark_written(self, slots: np.ndarray) -> None:
        self.valid[slots] = True

    def submit_reads(self, slots: np.ndarray, rows: np.ndarray,
                     transfer: Hashable | None = None) -> list[Future]:
        """Read disk slot ``slots[i]`` into ``rows[i]`` (rows must be writable views)."""
        self.check_readable(slots)
        return self.pool.submit_group(self._read_job, self._pieces(slots, rows), IoClass.READ,
                                      transfer)

    def read_rows(self, slots: np.ndarray) -> np.ndarray:
        """Synchronous read of whole slots (for read_tags); no validity check."""
        out = np.empty((len(slots), self.page_bytes), dtype=np.uint8)
        for f in self.pool.submit_group(self._read_job, self._pieces(slots, out), IoClass.READ):
            f.result()
        return out

    def close(self) -> None:
        if self.pool is not None:
            self._shared.leave()  # (the last store to leave shuts the threads down)
            self.pool = None
        for name in ("direct_fd", "fd"):
            fd = getattr(self, name, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, None)
        unlink = getattr(self, "_unlink", None)
        if unlink is not None:
            unlink()


class SharedPool:
    """A node's disk I/O threads, shared by its ranks' stores (each its own file): the
    pool ``FairPool``/``PriorityPool`` of ``io_threads`` threads a ``DiskStore`` would make
    (``priorities``: in ``kvsim.core.datapath.diskio``'s order, ``io_write_share`` capping
    writes), made by the first store that joins and shut down when the last one leaves."""

    def __init__(self, io_threads: int, piece_bytes: int, priorities: bool,
                 io_write_share: float = WRITE_SHARE, serial: bool = False):
        rule = (IoRule(piece_bytes=piece_bytes, write_cap=write_cap(io_threads, io_write_share))
                if priorities else None)
        if serial:  # io_mode serial: one thread, one queue, transfers whole in arrival order
            self.pool: FairPool | PriorityPool = PriorityPool(
                1, "kvsim-disk", IoRule(piece_bytes=piece_bytes), serial=True)
        else:
            self.pool = (PriorityPool(io_threads, "kvsim-disk", rule) if rule is not None
                         else FairPool(io_threads, "kvsim-disk"))
        self.users = 0

    def join(self) -> FairPool | PriorityPool:
        self.users += 1
        return self.pool

    def leave(self) -> None:
        self.users -= 1
        if self.users == 0:
            self.pool.shutdown(wait=True)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
