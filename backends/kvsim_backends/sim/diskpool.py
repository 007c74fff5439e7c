"""The sim's model of the prioritised disk I/O pool (the disk tier's ``io_workers`` > 0),
and of the serial disk (``io_mode: serial``: one worker, one first-in first-out queue).

The hw backend runs disk transfers as pieces of at most ``nvme.piece`` bytes on N I/O
threads, in the order ``kvsim.core.datapath.diskio`` gives; this models the same: N workers, the
same queues, the same cut (``kvsim.core.datapath.diskio.pieces``). A piece on a worker costs the
device's op latency (``nvme.latency``), then its bytes as a fluid flow over its route's
resources (the disk's read or write bandwidth, plus the link's for GPU <-> disk), shared
max-min fair with every other flow. So N pieces in flight give the rate today's model
gives for ``queue_depth`` N, and a restore's pieces overtake queued eviction writes as on
hw. While a restore's piece is queued or running, at most ``write_cap(N, io_write_share)``
write pieces are in flight (the disk tier's ``io_write_share``): the hw pool's cap, the
same rule (``kvsim.core.datapath.diskio``); a piece is in flight from its pop to its end.

A buffered write's piece (the disk tier's ``writes: buffered``) costs no op latency and
goes into the page cache (``kvsim_backends.sim.pagecache``), holding its worker while the
dirty limit throttles it, as a pwrite blocks on hw.

Invariants: at most N pieces hold a worker; a worker goes to the next piece (``pop`` at the
simulated now) the moment its piece ends; a transfer completes when its last piece that
ran ends. A transfer marked to fail fails at its first piece: its pieces still queued are
taken out (``DiskQueues.fail``) and never run, as on hw. Deterministic: the order is a
function of push times and the order of calls.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

from kvsim.core.datapath.diskio import WRITE_SHARE, DiskQueues, IoClass, IoRule, piece_sizes, write_cap

from .pagecache import SimPageCache


class DiskJob:
    """One transfer's disk leg in the pool: ``then(ok)`` when its pieces are done."""

    __slots__ = ("res", "cap", "ce", "scale", "left", "fail", "failed", "then", "key", "cache")

    def __init__(self, res: tuple[str, ...], cap: float, ce: bool, scale: float,
                 fail: bool, then: Callable[[bool], None], key: Hashable, cache: Any = None):
        self.res = res
        self.cap = cap
        self.ce = ce
        self.scale = scale    # flow bytes per byte (the rewrite rate's saving, else 1)
        self.left = 0         # pieces queued or running
        self.fail = fail      # the first piece to run fails
        self.failed = False
        self.then = then
        self.key = key
        self.cache = cache    # a buffered write's page cache (SimPageCache; None: the drive)


class SimDiskPool:
    """``io_workers`` disk workers on ``fluid``'s clock, ``latency`` seconds an op; at most
    ``write_cap(io_workers, io_write_share)`` write pieces in flight while reads run."""

    def __init__(self, fluid, io_workers: int, latency: float, piece_bytes: int,
                 io_write_share: float = WRITE_SHARE, serial: bool = False):
        self.fluid = fluid
        self.clock = fluid.clock
        # serial (the disk tier's io_mode serial): one worker and one queue, so transfers
        # run one at a time, whole, in the order they came (a restore behind the writes)
        self.serial = serial
        self.free = 1 if serial else io_workers
        self.latency = latency
        self.piece_bytes = piece_bytes
        self.queues = DiskQueues(IoRule(piece_bytes=piece_bytes, write_cap=None) if serial else
                                 IoRule(piece_bytes=piece_bytes,
                                        write_cap=write_cap(io_workers, io_write_share)))
        self.pieces_run = 0
        self.pieces_dropped = 0

    def submit(self, job: DiskJob, cls: IoClass, page_bytes: int, pages: int) -> None:
        """Queue ``job``'s pieces (``pages`` pages of ``page_bytes``) in ``cls``."""
        now = self.clock.now
        sizes = piece_sizes(page_bytes, pages, self.piece_bytes)
        job.left = len(sizes)
        if self.serial:
            cls = IoClass.WRITE  # (one queue: no class goes ahead of another)
        self.queues.push_many([(job, n) for n in sizes], cls, now, job.key)
        self._dispatch()

    def promote(self, key: Hashable) -> int:
        """Move the transfer ``key``'s queued background pieces to the required writes."""
        return self.queues.promote(key)

    def _dispatch(self) -> None:
        while self.free and len(self.queues):
            pick = self.queues.pop(self.clock.now)
            if pick is None:  # the write cap holds the queued writes until a piece ends
                return
            self.free -= 1
            self.pieces_run += 1
            job, nbytes = pick.item
            if self.latency > 0 and job.cache is None:  # (a buffered write: no device op)
                self.clock.wake_after(self.latency, lambda _w, p=pick: self._move(p))
            else:
                self._move(pick)

    def _move(self, pick) -> None:
        job, nbytes = pick.item
        if job.cache is not None:  # into the page cache (its worker waits while throttled)
            job.cache.write(nbytes * job.scale, job.res, job.cap, job.ce,
                            lambda: self._piece_done(pick))
            return
        self.fluid.add_flow_then(lambda: self._piece_done(pick), nbytes * job.scale, job.res,
                                 job.cap, 0, job.ce)

    def _piece_done(self, pick) -> None:
        job = pick.item[0]
        self.queues.done(pick)
        self.free += 1
        job.left -= 1
        if job.fail and not job.failed:
            job.failed = True  # this piece failed: the transfer's queued pieces never run
            dropped = self.queues.fail(job.key)
            self.pieces_dropped += len(dropped)
            job.left -= len(dropped)
        if job.left == 0:
            job.then(not job.failed)
        self._dispatch()


def disk_parts(fluid: Any, bus: Any, pcs: Any, nv: Any, workers: int, write_share: float,
               serial: bool) -> tuple[Any, "SimDiskPool | None", SimPageCache | None]:
    """The disk's parts on ``fluid`` (a node's ranks share them): the fluid joined to the
    node's bus (if any), its I/O pool (``workers`` > 0 or ``serial``; else None) and its
    page cache (``pcs``, a profile's ``page_cache`` for buffered writes; else None), which
    writes back in chunks of the flusher's I/O in flight (``queue_depth`` pieces)."""
    if bus is not None:
        bus.join(fluid)
    cache = (SimPageCache(fluid, pcs.dirty_limit, pcs.dirty_background, pcs.dirty_expire,
                          pcs.capacity, nv.piece * nv.queue_depth, nv.piece)
             if pcs is not None else None)
    pool = (SimDiskPool(fluid, workers, nv.latency, nv.piece, write_share, serial=serial)
            if workers > 0 or serial else None)
    return fluid, pool, cache
