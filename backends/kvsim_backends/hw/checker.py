"""Page contents of the hw backend: fills (the pattern a block key's tag gives) and the
refcheck's reads of tags back (``read_tags`` now, ``read_tags_later`` off the loop).

A page's bytes are ``pattern``'s function of its tag; reading a page's tag back verifies
every word (with the refcheck) or only the tag word. GPU pages (and, on a GPU, host pages
through their mapped device address) are filled and checked by the ``kv_fill`` /
``kv_check`` kernels; disk pages and everything in CPU mode by numpy.

Invariants: a GPU fill is enqueued on the compute stream (in stream order after the step
that produced the pages) and later copies wait for it (``StreamOrder``); a write into GPU
slots under a check the loop has not seen finish waits for that check; a failed read
fails the refcheck's waitable with an OSError that says the pages could not be read (the
run stops: pages it cannot verify are not taken as good), and the error goes to ``errors``.
"""

from __future__ import annotations

import errno
from time import perf_counter as _clock
from typing import Any

import numpy as np

from kvsim.core.plan import Fill
from kvsim.core.spec import Level

from . import pattern

CHECK_SPAN_WORDS = 8192  # kv_check: a CTA checks 64 KiB of a page (a 2 MiB page: 32 CTAs)
FILL_SPAN_WORDS = 8192   # kv_fill: a CTA writes 64 KiB of a page (a 2 MiB page: 32 CTAs)


class Checker:
    """Fills and tag reads over the tiers ``gpu``, ``host`` (or None), ``disk`` (or None).
    GPU mode: ``cp``, ``streams``, ``kernels``, ``order`` and ``copies`` (its slot upload)."""

    def __init__(self, runtime, page_bytes: int, refcheck: bool, gpu, host, disk, waits, logs,
                 errors, pool, check_pool=None, *, cp=None, streams=None, kernels=None,
                 order=None, copies=None):
        self.runtime = runtime
        self.page_bytes = page_bytes
        self.refcheck = refcheck
        self.gpu, self.host, self.disk = gpu, host, disk
        self.waits = waits
        self.logs = logs
        self.errors = errors
        self.pool = pool
        self.check_pool = check_pool
        self.cp = cp
        self.streams = streams
        self.kernels = kernels
        self.order = order
        self.copies = copies

    def view(self, lv: Level) -> np.ndarray:
        if lv == Level.GPU:
            return self.gpu.view
        if lv == Level.HOST and self.host is not None:
            return self.host.view
        raise ValueError(f"level: this backend has no {lv.name} tier in memory")

    def fill(self, fill: Fill) -> None:
        slots = np.asarray(fill.slots, dtype=np.int64)
        tags = np.asarray(fill.tags, dtype=np.uint64)
        if slots.size == 0:
            return
        lv = Level(fill.level)
        if lv == Level.GPU and self.cp is not None:
            # on the compute stream: the step that produced these pages wrote them, so they
            # are written in stream order right after it, before the next step's kernels.
            # (On the misc stream the fill waited for a free SM behind the next step's busy
            # chunks, and every GPU -> host copy waits for the last fill: one-page evictions
            # took a median 247 us under replay load against ~100 us idle.)
            self.enqueue_fill(slots, tags)
        elif lv == Level.DISK:
            rows = np.empty((len(slots), self.page_bytes), dtype=np.uint8)
            pattern.write_pages(rows, np.arange(len(slots)), tags, self.refcheck)
            for f in self.disk.submit_writes(slots, rows):
                f.result()
            self.disk.mark_written(slots)
        else:
            pattern.write_pages(self.view(lv), slots, tags, self.refcheck)

    def read_tags(self, level: Level, slots: np.ndarray) -> np.ndarray:
        slots = np.asarray(slots, dtype=np.int64)
        lv = Level(level)
        if slots.size == 0:
            return np.zeros(0, dtype=np.uint64)
        if lv == Level.GPU and self.cp is not None:
            tags, ev, _ = self.enqueue_check(self.gpu.ptr, slots)
            ev.synchronize()
            return tags()
        if lv == Level.DISK:
            return pattern.verify_rows(self.disk.read_rows(slots), self.refcheck, self.check_pool)
        return pattern.verify_pages(self.view(lv), slots, self.refcheck, self.check_pool)

    def read_tags_later(self, level: Level, slots: np.ndarray) -> Any:
        """``read_tags`` while the runtime's loop runs on (the refcheck of a replay): GPU
        pages, and host pages through the host tier's mapped device address, by the
        ``kv_check`` kernel on the GPU (a CUDA event completes it; host pages cross the
        link at its speed instead of numpy's ~1.4-1.9 GB/s on one core, which a pool of
        16 did not speed up on the H200); disk pages (and everything in CPU mode) read
        back and checked on an I/O thread. The waitable succeeds with the tags found; if
        reading fails, it fails with an OSError that says so, and the error is in
        ``errors``."""
        h0 = _clock()
        slots = np.asarray(slots, dtype=np.int64)
        lv = Level(level)
        if slots.size == 0:
            return self.waits.done(np.zeros(0, dtype=np.uint64))
        base = None
        if self.cp is not None and lv == Level.GPU:
            base = self.gpu.ptr
        elif self.cp is not None and lv == Level.HOST and self.host is not None and self.host.dev_ptr is not None:
            base = self.host.dev_ptr
        if base is not None:
            tags, done_ev, keep = self.enqueue_check(base, slots)
            if self.logs.host_log is not None:
                where = f"{lv.name.lower()} {len(slots)}"
                self.logs.host_time(f"check enqueue {where}", h0)
                tags = self.logs.timed(tags, f"check tags {where}")
            if lv != Level.GPU:
                return self.runtime.watch(lambda: (True, tags())
                                          if done_ev.done and keep is not None else (False, None))
            # A write into these slots before the loop sees the check finish waits for it
            # (a resumed request's check runs on while the request may end and its slots be
            # reused); writes into other slots do not wait.
            self.order.check_event = done_ev
            checking = self.order.checking
            checking[slots] += 1

            def poll():
                if not done_ev.done or keep is None:  # (keep: alive until the kernel is done)
                    return False, None
                checking[slots] -= 1
                return True, tags()
            return self.runtime.watch(poll)
        ev, trigger = self.runtime.external()
        n = len(slots)

        def done(f):
            exc = f.exception()
            if exc is not None:
                self.errors.append(f"refcheck read of {n} {lv.name} page(s): {type(exc).__name__}: {exc}")
                exc = OSError(getattr(exc, "errno", None) or errno.EIO,
                              f"the refcheck could not read back {n} {lv.name} page(s), so their "
                              f"contents are unverified: {type(exc).__name__}: {exc}")
            trigger(exc if exc is not None else f.result())

        self.pool.submit(self.read_tags, lv, slots).add_done_callback(done)
        return self.runtime.process(_raise_error(ev))

    def enqueue_fill(self, slots: np.ndarray, tags: np.ndarray, span_words: int = 0) -> None:
        """``kv_fill`` of GPU ``slots`` on the compute stream, a CTA a part of ``span_words``
        words of a page (0: FILL_SPAN_WORDS; without the refcheck only word 0 is written, a
        CTA a page); later GPU -> host copies wait for it (``StreamOrder.wait_fill``)."""
        cp, s = self.cp, self.streams["compute"]
        self.order.wait_checks(s, slots)
        # slots and tags in one async upload from pinned memory (two ``cupy.asarray``
        # uploads held the stream ~50 us before a one-page fill's kernel)
        ds, dt, keep = self.copies.upload_slots(s, slots, tags.view(np.int64))
        words = self.page_bytes // 8
        span = min(words, span_words or FILL_SPAN_WORDS) if self.refcheck else words
        parts = -(-words // span)
        self.kernels.fill((min(len(slots) * parts, 65535),), (256,),
                          (self.gpu.flat, ds, dt, np.int64(len(slots)), np.int64(words),
                           np.int32(self.refcheck), np.int64(span)), stream=s)
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(s)
        self.order.filled(ev, keep)  # the pinned upload buffer lives until the stream passed it

    def enqueue_check(self, base_ptr: int, slots: np.ndarray, span_words: int = 0):
        """``kv_check`` over pages at ``base_ptr`` (device memory, or host memory through
        its mapped address) on the misc stream, a CTA a part of ``span_words`` words of a
        page (0: CHECK_SPAN_WORDS): (a function giving the tags found once the event has
        passed, the event after the kernel, the arrays to keep alive until then)."""
        cp, s = self.cp, self.streams["misc"]
        n = len(slots)
        words = self.page_bytes // 8
        span = min(words, span_words or CHECK_SPAN_WORDS)
        with s:
            ds = cp.asarray(slots)
            out = cp.zeros(n, dtype=cp.uint64)
            bad = cp.zeros(n, dtype=cp.int32)
        parts = -(-words // span)
        self.kernels.check((min(n * parts, 65535),), (256,),
                           (np.uint64(base_ptr), ds, out, bad, np.int64(n), np.int64(words),
                            np.int32(self.refcheck), np.int64(span)), stream=s)
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(s)

        def tags() -> np.ndarray:
            found = cp.asnumpy(out)
            found[cp.asnumpy(bad) != 0] = 0
            return found
        return tags, ev, (ds, out, bad)


def _raise_error(ev):
    """Process: the value of ``ev``, or raise it if it is an exception."""
    got = yield ev
    if isinstance(got, BaseException):
        raise got
    return got
