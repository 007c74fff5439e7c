"""The disk I/O ordering rule of kvsim.core.datapath.diskio, on hand-built queues.

Each scenario pushes pieces at chosen times and pops them at chosen times, and checks
which piece comes out: reads first, then required writes, then background writes; aging
(10 ms for a write, 100 ms for a background write) jumps that order at most every other
piece while reads wait; a failed transfer's queued pieces come out; a promoted background
transfer's pieces join the writes with their age; while a read is queued or in flight, at
most the write cap's K write pieces are in flight (``pop`` to ``done``).
"""

from __future__ import annotations

import random

import pytest

from kvsim.core.datapath.diskio import (BACKGROUND_AGE_S, WRITE_AGE_S, WRITE_SHARE, DiskQueues, IoClass, IoRule,
                               io_class, piece_sizes, pieces, write_cap)
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


# -- the write cap: while reads run, at most K write pieces in flight -----------------

def test_write_cap_is_a_share_of_the_workers_at_least_one():
    assert WRITE_SHARE == 0.25
    assert [write_cap(n) for n in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 4]
    assert write_cap(16, 0.0) == 1            # writes never starve
    assert write_cap(16, 1.0) == 16           # all of them: no cap
    assert write_cap(10, 0.3) == 3 and write_cap(10, 0.7) == 7
    # (the share's and the workers' ranges are the config model's: test_disk_write_cap)
    with pytest.raises(ValueError, match="write_cap"):
        IoRule(write_cap=0)


def test_with_no_reads_writes_take_every_worker_despite_the_cap():
    q = DiskQueues(IoRule(write_cap=1))
    for i in range(4):
        q.push(f"w{i}", W, 0.0, "tw")
    q.push("b0", B, 0.0, "tb")
    assert drain(q, 0.0) == ["w0", "w1", "w2", "w3", "b0"]
    assert q.running(W) == 4 and q.running(B) == 1


def test_a_read_in_flight_holds_writes_back_until_fewer_than_k_are_in_flight():
    """Four workers, K = 1. Four writes hold the workers; a restore's one piece comes and
    takes the first worker freed; the next three workers freed stay idle while the read
    runs and a write is still in flight; once no write is, one more may start, and when
    the read ends the writes have every worker again."""
    q = DiskQueues(IoRule(write_cap=1))
    for i in range(8):
        q.push(f"w{i}", W, 0.0, "tw")
    running = [q.pop(0.0) for _ in range(4)]
    assert [p.item for p in running] == ["w0", "w1", "w2", "w3"]
    q.push("r0", R, 0.001, "tr")
    q.done(running[0])                        # w0 ends: its worker takes the read
    read = q.pop(0.002)
    assert read.item == "r0" and q.running(R) == 1
    for p in running[1:3]:                    # w1, w2 end: w3 is still in flight (>= K)
        q.done(p)
        assert q.pop(0.003) is None
    q.done(running[3])                        # no write in flight: one may start
    w4 = q.pop(0.004)
    assert w4.item == "w4"
    assert q.pop(0.004) is None               # K = 1 in flight
    q.done(read)                              # the read ended: no cap now
    assert [q.pop(0.005).item for _ in range(3)] == ["w5", "w6", "w7"]
    assert q.pop(0.005) is None and len(q) == 0


def test_without_a_cap_the_same_queue_gives_the_freed_workers_to_the_writes():
    q = DiskQueues()
    for i in range(8):
        q.push(f"w{i}", W, 0.0, "tw")
    running = [q.pop(0.0) for _ in range(4)]
    q.push("r0", R, 0.001, "tr")
    q.done(running[0])
    assert q.pop(0.002).item == "r0"
    for p, want in zip(running[1:], ["w4", "w5", "w6"]):
        q.done(p)
        assert q.pop(0.003).item == want


def test_background_pieces_count_against_the_cap_and_a_queued_read_still_goes():
    q = DiskQueues(IoRule(write_cap=2))
    q.push("b0", B, 0.0, "tb")
    q.push("w0", W, 0.0, "tw")
    q.push("w1", W, 0.0, "tw")
    first = [q.pop(0.0), q.pop(0.0)]
    assert [p.item for p in first] == ["w0", "w1"]
    q.push("r0", R, 0.0, "tr")
    q.push("r1", R, 0.0, "tr")
    assert q.pop(0.0).item == "r0"
    q.done(first[0])
    assert q.pop(0.0).item == "r1"            # reads first anyway
    assert q.pop(0.0).item == "b0"            # one write in flight < K = 2
    assert q.pop(0.0) is None                 # w1 and b0 in flight, reads in flight


def test_aging_still_applies_within_the_cap():
    """K = 1, reads keep a queue, the writes have aged: a write jumps only while no write
    is in flight; while one is, the reads go (so a read still waits at most one piece)."""
    q = DiskQueues(IoRule(write_cap=1))
    for i in range(3):
        q.push(f"w{i}", W, 0.0, "tw")
    for i in range(6):
        q.push(f"r{i}", R, 0.0, "tr")
    t = 0.020                                 # the writes have aged
    a = q.pop(t)
    assert (a.item, a.jumped) == ("w0", True)
    assert q.pop(t).item == "r0"              # every other piece
    assert q.pop(t).item == "r1"              # w0 still in flight: K reached, no jump
    assert q.pop(t).item == "r2"
    q.done(a)
    b = q.pop(t)
    assert (b.item, b.jumped) == ("w1", True)
    assert q.pop(t).item == "r3"
    assert q.jumps == 2


def test_done_without_a_piece_in_flight_is_an_error():
    q = DiskQueues(IoRule(write_cap=1))
    q.push("r0", R, 0.0, "tr")
    p = q.pop(0.0)
    q.done(p)
    with pytest.raises(ValueError, match="no READ piece is in flight"):
        q.done(p)


@pytest.mark.parametrize("workers, k", [(4, 1), (8, 2), (16, 4), (4, 4)])
def test_n_workers_with_random_pieces_keep_the_cap_and_finish_every_piece(workers, k):
    """N simulated workers, pieces of random classes pushed at random times and taking
    random times: a write starts while a read is queued or in flight only when fewer than
    K writes are in flight; ``pop`` says None only when that holds a write back; every
    piece runs once."""
    rng = random.Random(workers * 100 + k)
    q = DiskQueues(IoRule(write_cap=k))
    arrivals = sorted((rng.uniform(0, 1.0), rng.choice([R, R, W, W, B]), i) for i in range(400))
    events: list = []                         # (end time, pick)
    free, now, ran = workers, 0.0, []
    ai = 0
    while ai < len(arrivals) or events or len(q):
        times = [e[0] for e in events] + ([arrivals[ai][0]] if ai < len(arrivals) else [])
        assert times, "pieces queued with none in flight and none to come, yet none popped"
        now = min(times)
        for e in [e for e in events if e[0] <= now]:
            events.remove(e)
            q.done(e[1])
            free += 1
        while ai < len(arrivals) and arrivals[ai][0] <= now:
            _, c, i = arrivals[ai]
            q.push(i, c, now, ("t", i))
            ai += 1
        while free:
            reads_active = q.waiting(R) > 0 or q.running(R) > 0
            writes_running = q.running(W) + q.running(B)
            p = q.pop(now)
            if p is None:
                if len(q):                    # held back by the cap, and only so
                    assert q.waiting(R) == 0 and q.running(R) > 0 and writes_running >= k
                break
            if p.cls is not R and reads_active:
                assert writes_running < k
            ran.append(p.item)
            free -= 1
            events.append((now + rng.uniform(0.001, 0.02), p))
    assert sorted(ran) == list(range(400))
    assert q.running(R) == q.running(W) == q.running(B) == 0


def test_push_many_queues_as_that_many_pushes():
    """A transfer's pieces queued in one call come out, with their waits and jumps, as
    the same pieces pushed one by one, among other transfers', with a clock that went
    back, and under the write cap."""
    rng = random.Random(7)
    for trial in range(30):
        ops = []  # (cls, now, transfer, items)
        t = 0.0
        for k in range(rng.randint(1, 8)):
            t += rng.choice((0.0, 0.004, 0.02, -0.003))  # (-: a clock that went back)
            ops.append((rng.choice((R, W, B)), t, f"t{k}", [(k, i) for i in range(rng.randint(0, 5))]))
        cap = rng.choice((None, 1, 2))
        one, many = DiskQueues(IoRule(write_cap=cap)), DiskQueues(IoRule(write_cap=cap))
        for cls, now, tr, items in ops:
            for it in items:
                one.push(it, cls, now, tr)
            many.push_many(items, cls, now, tr)
        assert len(one) == len(many)
        now = t
        while True:
            a, b = one.pop(now), many.pop(now)
            assert (a is None) == (b is None), trial
            if a is None:
                break
            assert (a.item, a.cls, a.transfer, a.waited_s, a.jumped) == \
                   (b.item, b.cls, b.transfer, b.waited_s, b.jumped), trial
            if rng.random() < 0.5:
                one.done(a)
                many.done(b)
            now += 0.003
        assert one.jumps == many.jumps


def test_pop_returns_none_only_when_empty_or_capped():
    q = DiskQueues(IoRule(write_cap=1))
    assert q.pop(0.0) is None
    q.push_many(["w0", "w1"], W, 0.0, "tw")
    q.push_many(["r0"], R, 0.0, "tr")
    r = q.pop(0.0)
    assert r.item == "r0"
    w = q.pop(0.0)  # no read queued, one in flight: one write may start (K = 1)
    assert w.item == "w0"
    assert q.pop(0.0) is None  # the cap holds w1 while r0 runs
    q.done(w)
    assert q.pop(0.0).item == "w1"
