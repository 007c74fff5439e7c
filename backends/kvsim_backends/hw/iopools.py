"""The disk tier's I/O threads: ``FairPool`` serves the batches in flight round robin (a
one-page write issued while a 512-page eviction is being written shares the threads with
it, as the sim's disk shares the device among the transfers in flight); ``PriorityPool``
takes pieces in the order of ``kvsim.core.datapath.diskio`` (restores, then required
writes, then background writes, with aging; while a restore waits at most the rule's
``write_cap`` write pieces in flight), the order the sim's disk pool models too. A piece
that fails fails its transfer; that transfer's pieces not yet started are not run.

Invariants: a job runs on one thread, once; its future is resolved exactly once (its
result or its exception); ``shutdown`` lets running jobs finish and fails none.
"""

from __future__ import annotations

import collections
import errno
import itertools
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Hashable, Sequence

from kvsim.core.datapath.diskio import DiskQueues, IoClass, IoRule


class _Threads:
    """The threads of a pool (``_work`` is the subclass's loop, under ``_cv``) and what both
    pools do alike: run one job for its future, and shut down."""

    def __init__(self, workers: int, name: str):
        self._cv = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]

    def _start(self) -> None:
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        raise NotImplementedError

    @staticmethod
    def _run(fut: Future, fn: Callable[[Any], Any], job: Any) -> tuple[Any, BaseException | None]:
        """Run ``fn(job)``; its result or exception, with ``kv_span`` set on ``fut``."""
        t0 = time.perf_counter()
        out, exc = None, None
        try:
            out = fn(job)
        except BaseException as e:  # noqa: BLE001 - delivered through the future
            exc = e
        fut.kv_span = (t0, time.perf_counter())  # type: ignore[attr-defined]
        return out, exc

    def shutdown(self, wait: bool = True) -> None:
        """No new groups; the threads finish the jobs already submitted, then exit."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()


class FairPool(_Threads):
    """``workers`` threads that run groups of jobs, the groups round robin: an idle thread
    takes the next job of the group after the one it last served from. A group is one
    batch's pieces, so batches in flight share the threads (and the device) instead of
    each waiting for every piece submitted before it. A job's future carries ``kv_span``,
    (start, end) of the job on its thread (``time.perf_counter``), set before it is done."""

    def __init__(self, workers: int, name: str):
        super().__init__(workers, name)
        self._groups: collections.deque = collections.deque()  # deques of (future, fn, job)
        self._start()

    def submit_group(self, fn: Callable[[Any], Any], jobs: Sequence[Any],
                     cls: IoClass = IoClass.WRITE, transfer: Hashable | None = None) -> list[Future]:
        """Run ``fn(job)`` for each job; their futures, in order (``cls`` and ``transfer``:
        PriorityPool's, unused here: every group is served alike)."""
        futs = [Future() for _ in jobs]
        if not futs:
            return futs
        with self._cv:
            if self._closed:
                raise RuntimeError("the disk tier's I/O pool is shut down")
            self._groups.append(collections.deque((f, fn, job) for f, job in zip(futs, jobs)))
            self._cv.notify(len(futs))
        return futs

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._groups and not self._closed:
                    self._cv.wait()
                if not self._groups:
                    return  # shut down and drained
                group = self._groups.popleft()
                fut, fn, job = group.popleft()
                if group:
                    self._groups.append(group)  # its next job after the other groups' turns
            if not fut.set_running_or_notify_cancel():
                continue
            out, exc = self._run(fut, fn, job)
            if exc is None:
                fut.set_result(out)
            else:
                fut.set_exception(exc)

    def promote(self, transfer: Hashable) -> int:
        """Nothing to promote: no group has a priority here."""
        return 0

class PriorityPool(_Threads):
    """``workers`` threads that run pieces in the order of ``kvsim.core.datapath.diskio``: every
    time a thread is free it takes the piece ``DiskQueues.pop`` names (reads, then required
    writes, then background writes; aging; the write cap while reads run: ``rule``'s
    ``write_cap``), the clock ``time.perf_counter``. A group is one
    transfer's pieces (``transfer``: its key, for ``promote``; default a new one). When a
    piece raises, the group's pieces not yet started are not run: their futures get an
    OSError saying so, after the failed piece's own (so the first error a caller sees is
    the real one). A job's future carries ``kv_span`` as FairPool's, and ``kv_wait``: the
    seconds it waited in its queue."""

    def __init__(self, workers: int, name: str, rule: IoRule | None = None,
                 serial: bool = False):
        super().__init__(workers, name)
        self.queues = DiskQueues(rule)
        self.serial = serial  # one queue for every class: first in, first out
        self.pieces_run = 0      # pieces taken by a thread
        self.pieces_dropped = 0  # queued pieces of failed transfers, never run
        self._ids = itertools.count()
        self._start()

    def submit_group(self, fn: Callable[[Any], Any], jobs: Sequence[Any],
                     cls: IoClass = IoClass.WRITE, transfer: Hashable | None = None) -> list[Future]:
        """Run ``fn(job)`` for each job, queued in ``cls``; their futures, in order."""
        futs = [Future() for _ in jobs]
        if not futs:
            return futs
        key = ("group", next(self._ids)) if transfer is None else transfer
        if self.serial:
            cls = IoClass.WRITE
        with self._cv:
            if self._closed:
                raise RuntimeError("the disk tier's I/O pool is shut down")
            self.queues.push_many([(f, fn, job) for f, job in zip(futs, jobs)], cls,
                                  time.perf_counter(), key)
            self._cv.notify(len(futs))
        return futs

    def promote(self, transfer: Hashable) -> int:
        """Move ``transfer``'s queued background pieces to the required writes."""
        with self._cv:
            return self.queues.promote(transfer)

    def _ended(self, pick) -> None:
        """``pick``'s piece is no longer in flight (under ``_cv``): a write the cap held
        back may start now, on any waiting thread."""
        self.queues.done(pick)
        if len(self.queues):
            self._cv.notify_all()

    def _pop(self) -> Any:
        """The next piece to run, counted (None: none startable now); under the lock."""
        pick = self.queues.pop(time.perf_counter())
        if pick is not None:
            self.pieces_run += 1
        return pick

    def _work(self) -> None:
        """Take a piece and run it. A piece that ran is ended in the queues and the next
        one taken on one hold of the lock; its future completes right after (before this
        thread waits for work, if there is none)."""
        done: tuple[Any, Future, Any] | None = None  # (pick, future, result): ran, not ended
        while True:
            with self._cv:
                if done is not None:
                    self._ended(done[0])
                pick = self._pop()
            if done is not None:
                done[1].set_result(done[2])
                done = None
            if pick is None:
                with self._cv:
                    while (pick := self._pop()) is None:
                        if self._closed and not len(self.queues):
                            return  # shut down and drained
                        self._cv.wait()  # nothing queued, or the write cap holds the writes
            fut, fn, job = pick.item
            if not fut.set_running_or_notify_cancel():
                with self._cv:
                    self._ended(pick)
                continue
            out, exc = self._run(fut, fn, job)
            fut.kv_wait = pick.waited_s  # type: ignore[attr-defined]
            if exc is None:
                done = (pick, fut, out)
                continue
            with self._cv:
                self._ended(pick)
                rest = self.queues.fail(pick.transfer)
                self.pieces_dropped += len(rest)
            fut.set_exception(exc)
            for f, _, _ in rest:
                if f.set_running_or_notify_cancel():
                    f.set_exception(OSError(errno.ECANCELED, "not run: another piece of its "
                                                             f"transfer failed ({exc})"))
