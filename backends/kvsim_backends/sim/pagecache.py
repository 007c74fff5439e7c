"""The sim's model of the host's page cache in front of the disk tier's file, for a disk
tier with ``writes: buffered`` (the hw backend opens the file without O_DIRECT); the
numbers are the hardware profile's ``page_cache`` (``kvsim.config.pagecachespec``, which cites
Linux's ``vm.dirty_*`` semantics).

What it models:
- a buffered write copies its bytes into the page cache at the ``rate`` (a fluid
  resource, ``disk_cache``, shared by every copy in or out) and completes: the drive is
  not in its path. While the dirty bytes (plus those being copied in) would pass
  ``dirty_limit`` the writer waits, first come first served, until write-back has made
  room: above the limit writers go at the drive's write rate (Linux's
  ``balance_dirty_pages``, modelled as a hard limit rather than its gradual throttle
  between the background and the hard limit); while a writer waits, write-back runs
  whatever the dirty bytes (Linux starts it for a throttled writer; without this a
  ``dirty_background`` equal to ``dirty_limit`` left a writer waiting for the expiry);
- write-back: one flusher writes dirty bytes oldest first, in chunks of at most
  ``chunk`` bytes, as a flow over the drive's write side (``disk_write``), while the
  dirty bytes are above ``dirty_background`` or the oldest dirty byte is older than
  ``dirty_expire`` (a wake-up at that age; Linux's flusher wakes every
  ``dirty_writeback_centisecs`` and expires whole inodes, this expires bytes in order);
- reads: the cache holds up to ``capacity`` bytes of the tier's pages, least recently
  used first out (a page enters when written or read); a read's pages found there move
  at the ``rate`` without the drive (``hits``; the backend's transfer decides how).

Not modelled: the drive's read and write sides are separate resources in kvsim's disk
model, so write-back competes with the other writes only, never with reads; dirty pages
are not pinned in the LRU (with ``capacity`` >= ``dirty_limit`` they are the most recent).

Invariants: ``reserved`` = dirty bytes + bytes being copied in, never above
``dirty_limit`` except for one piece alone larger than it; bytes written back are
counted here (``written_back``) and never in the backend's disk byte counters (a
transfer's bytes are counted once, at its completion). Deterministic: FIFO orders only.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Callable, Hashable, Iterable

_WRITE_BACK: tuple[str, ...] = ("disk_write",)


class SimPageCache:
    """A node's page cache of its disk tier files on ``fluid`` (the node's disk fluid)."""

    def __init__(self, fluid: Any, dirty_limit: float, dirty_background: float,
                 dirty_expire: float, capacity: float, chunk: float, piece: float):
        self.fluid = fluid
        self.clock = fluid.clock
        self.limit = float(dirty_limit)
        self.background = float(dirty_background)
        self.expire = float(dirty_expire)
        self.capacity = float(capacity)
        self.chunk = float(chunk)  # a write-back flow's most bytes
        self.piece = float(piece)  # a write's copy's most bytes (the drive's piece)
        self.reserved = 0.0
        self.dirty = 0.0
        self.entries: deque[list[float]] = deque()  # [dirtied at, bytes not written back]
        self.waiting: deque[tuple[float, Callable[[], None]]] = deque()  # throttled writers
        self.flushing = False
        self.timer = False  # an expiry wake-up is pending
        self.lru: OrderedDict[Hashable, float] = OrderedDict()  # page -> its bytes
        self.cached = 0.0
        self.counts = {"page_cache_written_back": 0.0, "page_cache_throttled": 0,
                       "page_cache_throttle_s": 0.0, "page_cache_read_hits": 0,
                       "page_cache_read_misses": 0, "page_cache_dirty_max": 0.0}

    # -- writes ---------------------------------------------------------------------

    def write(self, nbytes: float, res: tuple[str, ...], cap: float, ce: bool,
              then: Callable[[], None]) -> None:
        """A buffered write of ``nbytes`` over ``res`` (its route with the page cache in
        the drive's place): copied in pieces of at most ``piece`` bytes, one after the
        other, each once there is dirty room for it (a large write streams in at the
        write-back's pace rather than waiting for room for all of it), then ``then()``."""
        if nbytes > self.piece:
            rest = nbytes - self.piece
            self._write(self.piece, res, cap, ce, lambda: self.write(rest, res, cap, ce, then))
            return
        self._write(nbytes, res, cap, ce, then)

    def _write(self, nbytes: float, res: tuple[str, ...], cap: float, ce: bool,
               then: Callable[[], None]) -> None:
        if self.waiting or not self._room(nbytes):
            t0 = self.clock.now
            self.counts["page_cache_throttled"] += 1
            self.waiting.append((nbytes, lambda: self._copy(nbytes, res, cap, ce, then, t0)))
            self._kick()  # (a throttled writer waits on write-back: it must be running)
            return
        self._copy(nbytes, res, cap, ce, then, -1.0)

    def _room(self, nbytes: float) -> bool:
        return self.reserved == 0.0 or self.reserved + nbytes <= self.limit

    def _copy(self, nbytes: float, res: tuple[str, ...], cap: float, ce: bool,
              then: Callable[[], None], t0: float) -> None:
        if t0 >= 0.0:
            self.counts["page_cache_throttle_s"] += self.clock.now - t0
        self.reserved += nbytes
        self.fluid.add_flow_then(lambda: self._copied(nbytes, then), nbytes, res, cap, 0, ce)

    def _copied(self, nbytes: float, then: Callable[[], None]) -> None:
        self.dirty += nbytes
        if self.dirty > self.counts["page_cache_dirty_max"]:
            self.counts["page_cache_dirty_max"] = self.dirty
        self.entries.append([self.clock.now, nbytes])
        self._kick()
        then()

    # -- write-back -----------------------------------------------------------------

    def _kick(self) -> None:
        """Start the flusher's next chunk if one is due, else a wake-up at the oldest
        dirty byte's expiry."""
        if self.flushing or not self.entries:
            return
        now = self.clock.now
        due = self.entries[0][0] + self.expire
        if self.dirty > self.background or due <= now or self.waiting:
            self.flushing = True
            n = min(self.chunk, self.entries[0][1])
            self.fluid.add_flow_then(lambda: self._flushed(n), n, _WRITE_BACK, 0.0, 0, False)
        elif not self.timer:
            self.timer = True
            self.clock.wake_after(due - now, self._expired)

    def _expired(self, _: object = None) -> None:
        self.timer = False
        self._kick()

    def _flushed(self, n: float) -> None:
        self.flushing = False
        head = self.entries[0]
        head[1] -= n
        if head[1] <= 0.0:
            self.entries.popleft()
        self.dirty -= n
        self.reserved -= n
        if not self.entries:  # (no float dust left: what stays reserved is in copy)
            self.reserved = max(0.0, self.reserved - self.dirty)
            self.dirty = 0.0
        self.counts["page_cache_written_back"] += n
        while self.waiting and self._room(self.waiting[0][0]):
            self.waiting.popleft()[1]()
        self._kick()

    # -- reads ----------------------------------------------------------------------

    def hits(self, pages: Iterable[Hashable]) -> int:
        """How many of ``pages`` the cache holds (each becomes the most recently used)."""
        lru, n = self.lru, 0
        for p in pages:
            if p in lru:
                lru.move_to_end(p)
                n += 1
        return n

    def insert(self, pages: Iterable[Hashable], page_bytes: float) -> None:
        """``pages`` are in the cache now (written, or read from the drive), the least
        recently used out beyond ``capacity``."""
        lru = self.lru
        for p in pages:
            if p in lru:
                lru.move_to_end(p)
            else:
                lru[p] = page_bytes
                self.cached += page_bytes
        while self.cached > self.capacity and lru:
            self.cached -= lru.popitem(last=False)[1]

    def stats(self) -> dict:
        return dict(self.counts, page_cache_dirty=self.dirty)
