"""Disk I/O ordering: which piece a free disk worker runs next. Pure; both backends call it.

With ``cache.tiers[i].io_workers`` > 0 on the disk tier, each backend runs its disk
transfers as pieces on that many workers (the hw backend's I/O threads, the sim's model of
them), and every time a worker is free it asks a ``DiskQueues`` for the next piece. The
backends differ only in how long a piece takes and whether bytes move.

The rules:
- a transfer is cut in pieces of at most ``piece_bytes`` (``pieces``): a page larger than
  that in several, smaller pages grouped, never crossing a piece boundary;
- each piece waits in the queue of its transfer's class (``IoClass``, from the batch by
  ``io_class``): READ (restores: disk -> host or GPU), WRITE (required writes: evictions
  to disk), BACKGROUND (writes nothing waits for: write-through). Each queue is first in,
  first out;
- the next piece is the head of the first non-empty queue in that order, unless a head
  has *aged*: a WRITE head that has waited ``write_age_s`` (10 ms), a BACKGROUND head
  ``background_age_s`` (100 ms). An aged head jumps the order (of two aged heads, the one
  pushed first; on a tie, WRITE). While reads wait, a jump happens at most every other
  piece: after one, the next piece is a read. So a read waits at most one piece behind
  the writes' aging, and no queue starves: a write's wait is bounded by the reads'
  pieces ahead of it plus its aging, a background write's likewise;
- ``fail(transfer)`` takes a transfer's queued pieces out (one failed piece fails its
  transfer: the backend fails the rest without running them);
- ``promote(transfer)`` moves a transfer's queued BACKGROUND pieces to the WRITE queue
  (a required eviction came to depend on that write), keeping their push times, so they
  keep their age;
- the write cap (``IoRule.write_cap`` K; ``write_cap(workers, share)`` gives it from the
  disk tier's ``io_write_share``): while a read is queued or in flight, a write piece
  (WRITE or BACKGROUND) starts only if fewer than K write pieces are in flight. The order
  above only says which piece goes next; pieces already running on the other workers
  keep the device busy, so without a cap a restore shares the device with up to N - 1
  writes. With the cap it shares it with at most K (once the writes that were running
  when it came have ended), and a worker the cap holds back stays free for the reads.
  Aging still applies within the cap; K >= 1, so writes go on while reads wait. With no
  read queued or in flight, writes use every worker (write throughput is unchanged).
  A piece is in flight from the ``pop`` that returns it to ``done(pick)``, which the
  caller calls when the piece ended (ran, failed or was not run).

Time is the caller's: every call that needs it takes ``now`` in seconds (the hw backend
passes a monotonic clock, the sim its simulated time). Invariants: every pushed piece is
popped or failed exactly once; a queue's pieces are in push-time order; ``pop`` returns a
piece whenever any queue is non-empty, except a write the cap holds back: it returns None
only when no read is queued, a read is in flight and K write pieces are in flight, and
then only a ``done`` (or a ``push``) can change its answer, never the clock alone.
"""

from __future__ import annotations

import bisect
import enum
import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level

MiB = 1 << 20
PIECE_BYTES = 4 * MiB           # the most bytes one piece moves (FIELD.md section 4)
WRITE_AGE_S = 0.010             # a required write this old jumps the reads
BACKGROUND_AGE_S = 0.100        # a background write this old jumps reads and writes
WRITE_SHARE = 0.25              # the share of the workers writes may hold while reads run


class IoClass(enum.IntEnum):
    """A disk transfer's priority class, most urgent first."""

    READ = 0        # disk -> host or GPU: a restore a request waits for
    WRITE = 1       # host or GPU -> disk: an eviction the freed slots wait for
    BACKGROUND = 2  # -> disk, nothing waits for it (write-through)


def io_class(batch: Batch) -> IoClass | None:
    """The class of ``batch``'s disk leg; None when it has none. A batch of kind
    ``BatchKind.BACKGROUND`` to disk is BACKGROUND: that is how a transfer is marked as one
    nothing waits for."""
    if batch.src == Level.DISK:
        return IoClass.READ
    if batch.dst == Level.DISK:
        return IoClass.BACKGROUND if batch.kind is BatchKind.BACKGROUND else IoClass.WRITE
    return None


def pieces(page_bytes: int, pages: int, piece_bytes: int = PIECE_BYTES) -> list[list[tuple[int, int, int]]]:
    """A transfer of ``pages`` pages of ``page_bytes`` -> its pieces, in order: each a list
    of (page index, start byte, end byte) spans of at most ``piece_bytes`` bytes in all."""
    if page_bytes <= 0 or piece_bytes <= 0 or pages < 0:
        raise ValueError(f"pieces: page_bytes {page_bytes}, piece_bytes {piece_bytes} and "
                         f"pages {pages}: expected positive sizes and pages >= 0")
    out: list[list[tuple[int, int, int]]] = []
    cur: list[tuple[int, int, int]] = []
    cur_bytes = 0
    for i in range(pages):
        for a in range(0, page_bytes, piece_bytes):
            b = min(page_bytes, a + piece_bytes)
            if cur and cur_bytes + (b - a) > piece_bytes:
                out.append(cur)
                cur, cur_bytes = [], 0
            cur.append((i, a, b))
            cur_bytes += b - a
    if cur:
        out.append(cur)
    return out


def piece_sizes(page_bytes: int, pages: int, piece_bytes: int = PIECE_BYTES) -> list[int]:
    """The byte count of each of ``pieces(page_bytes, pages, piece_bytes)``."""
    return [sum(b - a for _, a, b in p) for p in pieces(page_bytes, pages, piece_bytes)]


def write_cap(workers: int, share: float = WRITE_SHARE) -> int:
    """K, the write pieces that may be in flight while a read is queued or in flight, for
    ``workers`` workers (>= 1) and the disk tier's ``io_write_share`` (in [0, 1]: the
    config model checks both): ``share`` of the workers, rounded down, at least 1 (so
    writes never starve); ``share`` 1.0 gives N, no cap."""
    return max(1, math.floor(share * workers + 1e-9))


def io_threads(io_workers: int, queue_depth: int) -> int:
    """The disk tier's I/O threads: its ``io_workers`` N > 0 (prioritised, in this
    module's order), else the device's queue depth (round robin, no priorities)."""
    return io_workers if io_workers > 0 else queue_depth


_CLASSES = (IoClass.READ, IoClass.WRITE, IoClass.BACKGROUND)  # by value, without a lookup


@dataclass(frozen=True)
class IoRule:
    """The ordering's constants (seconds, bytes) and the write cap (pieces; None: none)."""

    write_age_s: float = WRITE_AGE_S
    background_age_s: float = BACKGROUND_AGE_S
    piece_bytes: int = PIECE_BYTES
    write_cap: int | None = None

    def __post_init__(self) -> None:
        if not (self.write_age_s >= 0 and self.background_age_s >= 0 and self.piece_bytes > 0):
            raise ValueError(f"IoRule: ages must be >= 0 and piece_bytes > 0, got {self}")
        if self.write_cap is not None and (isinstance(self.write_cap, bool)
                                           or not isinstance(self.write_cap, int) or self.write_cap < 1):
            raise ValueError(f"IoRule: write_cap must be None or a whole number >= 1, got {self.write_cap!r}")


@dataclass(frozen=True)
class Pick:
    """A popped piece: the caller's ``item``, its class and transfer, how long it waited,
    and whether it jumped the order by aging."""

    item: Any
    cls: IoClass
    transfer: Hashable
    waited_s: float
    jumped: bool


class _Entry:
    __slots__ = ("t", "seq", "transfer", "item")

    def __init__(self, t: float, seq: int, transfer: Hashable, item: Any):
        self.t = t
        self.seq = seq
        self.transfer = transfer
        self.item = item

    def key(self) -> tuple[float, int]:
        return (self.t, self.seq)


class DiskQueues:
    """The three queues and the rule that picks from them (see the module docstring).
    ``transfer`` keys are any hashable the caller chooses (one per transfer)."""

    def __init__(self, rule: IoRule | None = None):
        self.rule = rule if rule is not None else IoRule()
        self._q: list[list[_Entry]] = [[], [], []]  # by IoClass; each sorted by (t, seq)
        self._head = [0, 0, 0]  # index of each queue's head (popped entries before it)
        self._seq = 0
        self._jumped = False  # the last piece jumped the reads while reads waited
        self._running = [0, 0, 0]  # pieces in flight by IoClass (popped, not yet done)
        self.jumps = 0        # pieces that jumped the order by aging

    def __len__(self) -> int:
        return sum(len(q) - h for q, h in zip(self._q, self._head))

    def waiting(self, cls: IoClass) -> int:
        """Pieces queued in ``cls``."""
        return len(self._q[cls]) - self._head[cls]

    def running(self, cls: IoClass) -> int:
        """Pieces of ``cls`` in flight (popped, not yet ``done``)."""
        return self._running[cls]

    def done(self, pick: Pick) -> None:
        """``pick``'s piece ended (ran, failed, or was not run): it is no longer in flight."""
        if self._running[pick.cls] <= 0:
            raise ValueError(f"done: no {pick.cls.name} piece is in flight")
        self._running[pick.cls] -= 1

    def push(self, item: Any, cls: IoClass, now: float, transfer: Hashable) -> None:
        """Queue one piece of ``transfer`` (FIFO within its class)."""
        self.push_many((item,), cls, now, transfer)

    def push_many(self, items: Sequence[Any], cls: IoClass, now: float, transfer: Hashable) -> None:
        """Queue ``items``, pieces of ``transfer`` in order, all at ``now`` (FIFO within
        their class; a clock that went back sorts them in by time)."""
        c = IoClass(cls)
        q = self._q[c]
        seq = self._seq
        self._seq += len(items)
        entries = [_Entry(now, seq + i, transfer, item) for i, item in enumerate(items)]
        if not entries:
            return
        if len(q) > self._head[c] and q[-1].t > now:  # (a clock that went back)
            for e in entries:
                bisect.insort(q, e, lo=self._head[c], key=_Entry.key)
        else:
            q.extend(entries)

    def _take(self, cls: int) -> _Entry:
        q = self._q[cls]
        e = q[self._head[cls]]
        self._head[cls] += 1
        if self._head[cls] > 64 and self._head[cls] * 2 > len(q):  # compact now and then
            del q[: self._head[cls]]
            self._head[cls] = 0
        return e

    def _capped(self, reads_wait: bool) -> bool:
        """Whether the write cap holds every write back now."""
        cap = self.rule.write_cap
        if cap is None or not (reads_wait or self._running[IoClass.READ]):
            return False
        return self._running[IoClass.WRITE] + self._running[IoClass.BACKGROUND] >= cap

    def pop(self, now: float) -> Pick | None:
        """The next piece to run (in flight until ``done``), or None when every queue is
        empty or the write cap holds back every queued piece."""
        q, h = self._q, self._head
        rh = q[0][h[0]] if h[0] < len(q[0]) else None
        wh = q[1][h[1]] if h[1] < len(q[1]) else None
        bh = q[2][h[2]] if h[2] < len(q[2]) else None
        reads_wait = rh is not None
        if (wh is not None or bh is not None) and self._capped(reads_wait):
            wh = bh = None  # not startable now
        if rh is None and wh is None and bh is None:
            return None
        rule = self.rule
        aged: _Entry | None = None
        aged_cls = -1
        if wh is not None and now - wh.t >= rule.write_age_s:
            aged, aged_cls = wh, 1
        if bh is not None and now - bh.t >= rule.background_age_s and (aged is None or bh.t < aged.t):
            aged, aged_cls = bh, 2  # (a tie: WRITE, visited first)
        jumped = False
        if aged is not None and not (reads_wait and self._jumped):
            cls = aged_cls
            # a jump: past the reads, or (a background head) past the writes
            jumped = reads_wait or (aged_cls == 2 and wh is not None)
        else:
            cls = 0 if reads_wait else 1 if wh is not None else 2
        self._jumped = jumped and reads_wait
        if jumped:
            self.jumps += 1
        e = self._take(cls)
        self._running[cls] += 1
        return Pick(e.item, _CLASSES[cls], e.transfer, now - e.t, jumped)

    def fail(self, transfer: Hashable) -> list[Any]:
        """Take every queued piece of ``transfer`` out; their items, in push order."""
        out: list[_Entry] = []
        for c in range(3):
            q, h = self._q[c], self._head[c]
            keep = [e for e in q[h:] if e.transfer != transfer]
            if len(keep) != len(q) - h:
                out.extend(e for e in q[h:] if e.transfer == transfer)
                self._q[c] = keep
                self._head[c] = 0
        out.sort(key=_Entry.key)
        return [e.item for e in out]

    def promote(self, transfer: Hashable) -> int:
        """Move ``transfer``'s queued BACKGROUND pieces to the WRITE queue (in push-time
        order among the writes); how many moved."""
        bg, h = self._q[IoClass.BACKGROUND], self._head[IoClass.BACKGROUND]
        moving = [e for e in bg[h:] if e.transfer == transfer]
        if not moving:
            return 0
        self._q[IoClass.BACKGROUND] = [e for e in bg[h:] if e.transfer != transfer]
        self._head[IoClass.BACKGROUND] = 0
        wq = self._q[IoClass.WRITE]
        for e in moving:
            bisect.insort(wq, e, lo=self._head[IoClass.WRITE], key=_Entry.key)
        return len(moving)
