"""The disk I/O ordering rule of kvsim.core.diskio, on hand-built queues.

Each scenario pushes pieces at chosen times and pops them at chosen times, and checks
which piece comes out: reads first, then required writes, then background writes; aging
(10 ms for a write, 100 ms for a background write) jumps that order at most every other
piece while reads wait; a failed transfer's queued pieces come out; a promoted background
transfer's pieces join the writes with their age.
"""

from __future__ import annotations

import pytest

from kvsim.core.diskio import (BACKGROUND_AGE_S, WRITE_AGE_S, DiskQueues, IoClass, IoRule, io_class,
                               piece_sizes, pieces)
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level

R, W, B = IoClass.READ, IoClass.WRITE, IoClass.BACKGROUND
MiB = 1 << 20


def drain(q: DiskQueues, now: float, step: float = 0.0) -> list:
    out = []
    while True:
        p = q.pop(now)
        if p is None:
            return out
        out.append(p.item)
        now += step


def test_reads_then_writes_then_background_when_nothing_has_aged():
    q = DiskQueues()
    q.push("b1", B, 0.0, "tb")
    q.push("w1", W, 0.0, "tw")
    q.push("r1", R, 0.0, "tr")
    q.push("w2", W, 0.0, "tw")
    q.push("r2", R, 0.0, "tr")
    assert drain(q, 0.001) == ["r1", "r2", "w1", "w2", "b1"]
    assert q.jumps == 0 and len(q) == 0


def test_an_aged_write_jumps_the_reads_at_most_every_other_piece():
    q = DiskQueues()
    for i in range(3):
        q.push(f"w{i}", W, 0.0, "tw")
    for i in range(4):
        q.push(f"r{i}", R, 0.0, "tr")
    # at 5 ms the writes have not aged: reads go first
    assert q.pop(0.005).item == "r0"
    # at 10 ms they have: a write, then a read, then a write, ...
    picks = [q.pop(0.010) for _ in range(6)]
    assert [p.item for p in picks] == ["w0", "r1", "w1", "r2", "w2", "r3"]
    assert [p.jumped for p in picks] == [True, False, True, False, True, False]
    assert picks[0].waited_s == pytest.approx(WRITE_AGE_S)
    assert q.jumps == 3


def test_an_aged_background_write_jumps_writes_and_reads():
    q = DiskQueues()
    q.push("b0", B, 0.0, "tb")
    q.push("w0", W, 0.095, "tw")
    q.push("r0", R, 0.095, "tr")
    assert q.pop(0.099).item == "r0"          # background not aged yet; write not aged
    q.push("r1", R, 0.099, "tr")
    p = q.pop(0.100)                          # background aged (100 ms): it jumps
    assert (p.item, p.cls, p.jumped) == ("b0", B, True)
    assert q.pop(0.100).item == "r1"          # every other piece: a read now
    assert q.pop(0.100).item == "w0"


def test_of_two_aged_heads_the_older_goes_first():
    q = DiskQueues()
    q.push("b0", B, 0.0, "tb")
    q.push("w0", W, 0.050, "tw")
    assert q.pop(0.200).item == "b0"          # both aged: the background one waited longer
    assert q.pop(0.200).item == "w0"
    q.push("b1", B, 0.300, "tb")
    q.push("w1", W, 0.300, "tw")
    assert q.pop(0.500).item == "w1"          # same push time: the write first


def test_reads_never_wait_more_than_one_piece_behind_aging():
    """Under a constant stream of aged writes and background writes, between two reads at
    most one other piece runs, and every class keeps moving."""
    q = DiskQueues()
    for i in range(50):
        t = i * 0.001
        q.push(("w", i), W, t, "tw")
        q.push(("b", i), B, t, "tb")
        q.push(("r", i), R, t, "tr")
    order = []
    for k in range(150):
        t = 1.0 + k * 0.001                   # everything has aged
        order.append(q.pop(t).item[0])
    first_reads = order[: order.index("r") + 1]
    assert len(first_reads) <= 2
    runs, cur = [], 0
    for c in order[: 99]:                     # while reads wait
        if c == "r":
            runs.append(cur)
            cur = 0
        else:
            cur += 1
    assert max(runs) <= 1
    assert "b" in order[:99] and "w" in order[:99]   # neither starves while reads wait


def test_no_starvation_bound_for_a_write_under_reads():
    """A write pushed while reads keep arriving runs within its aging plus one piece."""
    q = DiskQueues()
    q.push("w", W, 0.0, "tw")
    t, n = 0.0, 0
    while True:
        q.push(("r", n), R, t, "tr")
        p = q.pop(t)
        if p.item == "w":
            break
        n += 1
        t += 0.002                            # a read piece every 2 ms
    assert t < WRITE_AGE_S + 0.002 + 1e-12


def test_a_failed_transfer_takes_its_queued_pieces_out():
    q = DiskQueues()
    for i in range(3):
        q.push(("a", i), W, 0.0, "ta")
        q.push(("b", i), W, 0.0, "tb")
    assert q.pop(0.0).item == ("a", 0)
    assert q.fail("ta") == [("a", 1), ("a", 2)]
    assert drain(q, 0.0) == [("b", 0), ("b", 1), ("b", 2)]
    assert q.fail("ta") == []


def test_promote_moves_background_pieces_to_the_writes_with_their_age():
    q = DiskQueues()
    q.push("b0", B, 0.0, "tb")
    q.push("b1", B, 0.0, "tb")
    q.push("x0", B, 0.0, "other")
    q.push("w0", W, 0.004, "tw")
    q.push("r0", R, 0.004, "tr")
    assert q.promote("tb") == 2
    assert q.waiting(W) == 3 and q.waiting(B) == 1
    # at 10 ms the promoted pieces (pushed at 0) have aged as writes: they jump the read
    assert q.pop(0.010).item == "b0"
    assert drain(q, 0.010) == ["r0", "b1", "w0", "x0"]
    assert q.promote("tb") == 0


def test_io_class_of_batches():
    def b(kind, src, dst):
        return Batch(kind, src, dst, [0], [1], [7], 4096, 0)
    assert io_class(b(BatchKind.ONBOARD, Level.DISK, Level.GPU)) is R
    assert io_class(b(BatchKind.EVICT, Level.HOST, Level.DISK)) is W
    assert io_class(b(BatchKind.BACKGROUND, Level.HOST, Level.DISK)) is B
    assert io_class(b(BatchKind.EVICT, Level.GPU, Level.HOST)) is None


def test_pieces_are_at_most_the_piece_size_and_cover_every_byte():
    ps = pieces(10 * MiB, 3, 4 * MiB)
    assert piece_sizes(10 * MiB, 3, 4 * MiB) == [4 * MiB, 4 * MiB, 2 * MiB] * 3
    covered = sorted((i, a, b) for p in ps for i, a, b in p)
    assert covered[0] == (0, 0, 4 * MiB) and covered[-1] == (2, 8 * MiB, 10 * MiB)
    small = pieces(MiB, 9, 4 * MiB)           # small pages are grouped, 4 a piece
    assert [len(p) for p in small] == [4, 4, 1]
    assert all(sum(b - a for _, a, b in p) <= 4 * MiB for p in ps + small)
    assert pieces(MiB, 0) == []
    with pytest.raises(ValueError, match="piece_bytes"):
        pieces(MiB, 1, 0)


def test_rule_defaults_and_bad_values():
    r = IoRule()
    assert (r.write_age_s, r.background_age_s, r.piece_bytes) == (0.010, BACKGROUND_AGE_S, 4 * MiB)
    with pytest.raises(ValueError):
        IoRule(write_age_s=-1)
