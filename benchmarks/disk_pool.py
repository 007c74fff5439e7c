"""The hw backend's disk I/O pool: restore latency under write load, and pool throughput.

Runs the disk tier's own store (``backends.hw.disk.DiskStore``: a preallocated file, O_DIRECT
where the file system takes it) in a folder (``--dir``, default the temporary directory),
CPU only, so it runs alike on any machine. Every byte read was written first (a file's
unwritten extents read as zeros without touching the device).

1. Device figure, fio-style: ``T`` threads of O_DIRECT pread / pwrite of ``--piece`` bytes
   over the store's file in file order (each thread takes the next piece; from the start
   again at the end), from / into the very rows the pool moves (piece k: row k mod 64,
   page-aligned), for T = 1, 4, 16, each for ``--seconds``. With ``--one-buffer``, also
   the same with one buffer a thread reused for every piece (the usual fio set-up, and
   this benchmark's device figure before: not the goal's reference, a pool moves
   distinct pages; on a 2-core VM it came out from about half to 1.3x the rows' figure
   from one run to the next).
2. Pool throughput: the store's pool with N = T workers (``io_workers``, priorities on,
   the default write cap: with only reads or only writes queued the cap never applies)
   moving the whole file in file order as batches of 64 pages from / into those rows,
   as many batches in flight as the file holds, the next submitted as the oldest is done
   (the queue never runs dry, as direct I/O's threads never wait for each other), each
   batch waited for as a whole (as the hw backend's done callbacks: one wake-up a batch).
   Like with like: the same file, region, order, piece size, descriptor flags
   (``O_DIRECT`` where the store uses it, else both buffered), buffers and thread count;
   every read was written first, and O_DIRECT keeps the guest's page cache out of both.
   Device and pool alternate, the order rotating each repetition (a machine's drift, or
   the host's write-back after the writes, hits both alike); each figure is the median
   of ``--reps``. Pool N is compared with direct I/O at T = N (goal: at least 90%, read
   and write, at each N) and with the best T. The pool's own cost at N = 1 is its
   Python per piece (queueing, futures, the worker's hand-off), about 25-35 us of CPU a
   piece on a 2-core VM: 1-2% of a 4 MiB piece, more where the CPUs are oversubscribed.
3. Restore latency: single restores of ``--restore-pages`` pages, one every 5 ms, on an
   idle pool, and under a write load of eviction batches of ``--write-pages`` pages kept
   ``--write-depth`` in flight, with priorities off (the round-robin pool), on without the
   write cap (``kvsim.core.datapath.diskio``'s order, ``io_write_share`` 1.0), and on with the cap
   (``--write-share``, default the tier's default: while a restore runs, at most
   ``write_cap(workers, share)`` write pieces in flight); ``--workers`` threads; the four
   cases interleaved in ``--rounds`` rounds. p50 / p99 of submit -> last piece done, and
   the write load's rate meanwhile (what the cap costs the writes).
   Goal: p99 with priorities and the cap at most 2x idle.

The LAST line is the headline:
``disk_pool: restore p99 under writes <cap>x idle with priorities and the write cap (K=<k>;
<on>x priorities only, <off>x neither); pool read/write at N=1/4/16 <r1>/<r4>/<r16>% /
<w1>/<w4>/<w16>% of direct I/O`` (with ``--skip-latency``, parts 1 and 2 only, the
throughput half alone).

    python3 benchmarks/disk_pool.py [--dir PATH] [--size 1GiB] [--page 4MiB] [--workers 4]
                                    [--restores 100] [--rounds 2] [--seconds 1] [--reps 3]
                                    [--write-share 0.25] [--one-buffer] [--skip-latency]
                                    [--json PATH]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import mmap
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import wait as wait_futures

import numpy as np

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim_backends.hw.disk import DiskStore  # noqa: E402
from kvsim.core.datapath.diskio import WRITE_SHARE, write_cap  # noqa: E402
from kvsim.config.units import parse_size  # noqa: E402

THREADS = (1, 4, 16)
BATCH_PAGES = 64


def aligned(nbytes: int) -> np.ndarray:
    """A page-aligned buffer (anonymous mmap), as O_DIRECT needs."""
    m = mmap.mmap(-1, nbytes)
    return np.frombuffer(m, dtype=np.uint8)


def direct_io(path: str, size: int, piece: int, threads: int, write: bool, seconds: float,
              direct: bool = True, bufs: np.ndarray | None = None) -> float:
    """fio-style: ``threads`` threads of O_DIRECT pread/pwrite of ``piece`` bytes over
    ``path`` in file order (each thread takes the next piece; from the start again at the
    end), as the pool moves it, for about ``seconds``; bytes per second. ``bufs``: the
    rows the pool moves (piece k from / into row k mod their count, the same memory the
    pool's pieces use); None: one buffer per thread, reused for every piece (the usual
    fio set-up; not what a pool of distinct pages does). ``direct`` False (a file system that refuses O_DIRECT, as the store found):
    buffered, as the store."""
    flags = os.O_RDWR | (getattr(os, "O_DIRECT", 0) if direct else 0)
    fd = os.open(path, flags)
    n_pieces = size // piece
    moved = [0] * threads
    stop = time.perf_counter() + seconds
    nxt = itertools.count()  # (its next() is atomic under the GIL)
    if bufs is not None:
        views = [memoryview(b).cast("B")[i:i + piece] for b in bufs
                 for i in range(0, b.nbytes - piece + 1, piece)]

    def worker(i: int) -> None:
        if bufs is None:
            buf = aligned(piece)
            buf[:] = i + 1
            own = memoryview(buf)
        while time.perf_counter() < stop:
            k = next(nxt)
            off = (k % n_pieces) * piece
            mv = own if bufs is None else views[k % len(views)]
            n = os.pwrite(fd, mv, off) if write else os.preadv(fd, [mv], off)
            moved[i] += n

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    return sum(moved) / dt


def store(d: str, size: int, page: int, piece: int, workers: int, priorities: bool,
          share: float = WRITE_SHARE) -> DiskStore:
    return DiskStore(d, size // page, page, workers, piece, priorities=priorities,
                     io_write_share=share)


def fill(ds: DiskStore, rows: np.ndarray) -> None:
    """Write every slot (so that reads touch the device), in batches."""
    n = ds.slots
    for a in range(0, n, BATCH_PAGES):
        s = np.arange(a, min(n, a + BATCH_PAGES))
        futs = ds.submit_writes(s, rows[: len(s)])
        for f in futs:
            f.result()
        ds.mark_written(s)


def pool_throughput(ds: DiskStore, rows: np.ndarray, write: bool, seconds: float) -> float:
    """The file through the pool in file order, as batches of BATCH_PAGES pages (from /
    into ``rows``), from the start again at the end, for about ``seconds``: as many
    batches kept in flight as the file holds (so the queue never runs dry between
    passes, as direct I/O's threads never wait for each other), the next submitted as
    the oldest is done, each batch waited for as a whole (one wake-up a batch, as the hw
    backend's done callbacks; not one a piece); then drained. Bytes per second."""
    n = ds.slots
    starts = list(range(0, n, BATCH_PAGES))
    inflight: collections.deque = collections.deque()
    moved = 0
    k = 0
    t0 = time.perf_counter()
    while True:
        while len(inflight) < max(2, len(starts)) and time.perf_counter() - t0 < seconds:
            a = starts[k % len(starts)]
            k += 1
            s = np.arange(a, min(n, a + BATCH_PAGES))
            r = rows[: len(s)]
            futs = ds.submit_writes(s, r) if write else ds.submit_reads(s, r)
            inflight.append((futs, len(s) * ds.page_bytes))
        if not inflight:
            break
        futs, nbytes = inflight.popleft()
        wait_futures(futs)
        for f in futs:
            f.result()  # (raises a failed piece's error)
        moved += nbytes
    dt = time.perf_counter() - t0
    if write:
        ds.mark_written(np.arange(n))
    return moved / dt


def restore_latency(ds: DiskStore, rows: np.ndarray, restores: int, pages: int, gap_s: float,
                    write_depth: int, write_pages: int) -> tuple[list[float], float]:
    """Seconds of each of ``restores`` restores of ``pages`` pages (submit -> done), one
    every ``gap_s``, while a writer keeps ``write_depth`` eviction batches of
    ``write_pages`` pages in flight (0: idle), and the bytes a second the writer's batches
    completed meanwhile. Reads and writes use disjoint slots."""
    n = ds.slots
    half = n // 2
    read_rows = rows[:pages]
    write_rows = rows[pages:pages + write_pages]
    stop = threading.Event()
    rng = np.random.default_rng(1)
    written = [0]

    def writer() -> None:
        inflight: list = []
        k = 0
        while not stop.is_set():
            while len(inflight) < write_depth:
                a = half + (k * write_pages) % max(1, n - half - write_pages)
                k += 1
                inflight.append(ds.submit_writes(np.arange(a, a + write_pages), write_rows))
            wait_futures(inflight[0])
            inflight.pop(0)
            written[0] += write_pages * ds.page_bytes
        for fs in inflight:
            wait_futures(fs)

    w = threading.Thread(target=writer) if write_depth else None
    if w is not None:
        w.start()
        time.sleep(0.3)  # the write load is running
    out = []
    w0, t_start = written[0], time.perf_counter()
    try:
        for _ in range(restores):
            s = rng.choice(half - pages, 1)[0] + np.arange(pages)
            t0 = time.perf_counter()
            wait_futures(ds.submit_reads(s, read_rows))
            out.append(time.perf_counter() - t0)
            time.sleep(gap_s)
        rate = (written[0] - w0) / (time.perf_counter() - t_start)
    finally:
        stop.set()
        if w is not None:
            w.join()
    return out, rate


def restore_cases(a, size: int, page: int, piece: int, rows: np.ndarray, capped: str,
                  res: dict) -> dict:
    """Part 3: the four restore-latency cases, interleaved in ``a.rounds`` rounds."""
    cases = (("idle", True, 0, a.write_share), ("writes, priorities off", False, a.write_depth, 1.0),
             ("writes, priorities on", True, a.write_depth, 1.0),
             (capped, True, a.write_depth, a.write_share))
    samples: dict = {name: [] for name, *_ in cases}
    rates: dict = {name: [] for name, *_ in cases}
    per_round = max(1, a.restores // a.rounds)
    for _ in range(a.rounds):  # the cases interleaved, so a drift of the machine hits all alike
        for name, prio, depth, share in cases:
            ds = store(a.dir, size, page, piece, a.workers, prio, share)
            try:
                fill(ds, rows)
                xs, rate = restore_latency(ds, rows, per_round, a.restore_pages, 0.005, depth,
                                           a.write_pages)
                samples[name] += xs
                rates[name].append(rate)
                if prio and depth:
                    res.setdefault("jumps", {})
                    res["jumps"][name] = res["jumps"].get(name, 0) + ds.pool.queues.jumps
            finally:
                ds.close()
    lat = {}
    for name, xs in samples.items():
        wr = float(np.mean(rates[name]))
        lat[name] = {"p50": pct(xs, 50), "p99": pct(xs, 99), "n": len(xs), "write_rate": wr}
        print(f"restore of {a.restore_pages} pages, {a.workers} workers, {name}: "
              f"p50 {lat[name]['p50'] * 1e3:.1f} ms  p99 {lat[name]['p99'] * 1e3:.1f} ms  (n={len(xs)})"
              + (f"  writes meanwhile {wr / 1e9:.2f} GB/s" if wr else ""))
    res["latency"] = lat
    return lat


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="folder on the disk to measure")
    ap.add_argument("--size", default="1GiB", help="the tier file's size")
    ap.add_argument("--page", default="4MiB", help="page size")
    ap.add_argument("--piece", default="4MiB", help="most bytes a piece moves")
    ap.add_argument("--workers", type=int, default=4, help="pool workers for the latency test")
    ap.add_argument("--restores", type=int, default=100, help="restores timed per case")
    ap.add_argument("--rounds", type=int, default=2, help="rounds the cases are interleaved in")
    ap.add_argument("--restore-pages", type=int, default=2)
    ap.add_argument("--write-depth", type=int, default=4, help="eviction batches kept in flight")
    ap.add_argument("--write-pages", type=int, default=16, help="pages an eviction batch writes")
    ap.add_argument("--write-share", type=float, default=WRITE_SHARE,
                    help="the write-cap case's io_write_share")
    ap.add_argument("--seconds", type=float, default=1.0, help="each throughput measurement's length")
    ap.add_argument("--reps", type=int, default=3, help="throughput measurements (the median counts)")
    ap.add_argument("--one-buffer", action="store_true",
                    help="also direct I/O with one reused buffer a thread (for reference)")
    ap.add_argument("--skip-latency", action="store_true", help="only parts 1 and 2 (throughput)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    size, page, piece = parse_size(a.size), parse_size(a.page), parse_size(a.piece)
    size -= size % page
    if not 0.0 <= a.write_share <= 1.0:
        ap.error(f"--write-share: {a.write_share} is outside [0, 1]")
    if size < 4 * page * BATCH_PAGES // 16:
        ap.error(f"--size: {a.size} is too small for --page {a.page}")
    res: dict = {"dir": a.dir, "size": size, "page": page, "piece": piece}
    rows = aligned(BATCH_PAGES * page).reshape(BATCH_PAGES, page)
    rows[:] = np.arange(BATCH_PAGES, dtype=np.uint8)[:, None] + 1

    # 1 and 2, for N = 1, 4, 16 on one store's file (written in full first): the device's
    # figure with T = N threads, fio-style, with the pool's rows (and with one buffer a
    # thread), and the pool's with N workers, in a rotating order
    kinds = ("dev", "dev1", "pool") if a.one_buffer else ("dev", "pool")
    got_all: dict = {}
    for n in THREADS:
        ds = store(a.dir, size, page, piece, n, True)
        try:
            res["direct_io"] = ds.uses_direct
            fill(ds, rows)
            for rep in range(a.reps):
                for op, write in (("write", True), ("read", False)):
                    for kind in kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]:
                        if kind == "pool":
                            v = pool_throughput(ds, rows, write, a.seconds)
                        else:
                            v = direct_io(ds.path, size, piece, n, write, a.seconds, ds.uses_direct,
                                          rows if kind == "dev" else None)
                        got_all.setdefault((kind, op, n), []).append(v)
        finally:
            ds.close()
    med = {key: float(np.median(v)) for key, v in got_all.items()}
    dev = {op: {n: med[("dev", op, n)] for n in THREADS} for op in ("read", "write")}
    hot = ({op: {n: med[("dev1", op, n)] for n in THREADS} for op in ("read", "write")}
           if a.one_buffer else None)
    pool = {n: {op: med[("pool", op, n)] for op in ("read", "write")} for n in THREADS}
    res["device"], res["device_one_buffer"], res["pool"] = dev, hot, pool
    res["throughput_samples"] = {f"{kind} {op} {n}": v for (kind, op, n), v in got_all.items()}
    best = {k: max(v.values()) for k, v in dev.items()}
    print(f"dir {a.dir}  file {size >> 20} MiB  page {page >> 20} MiB  piece {piece >> 20} MiB  "
          f"O_DIRECT {'yes' if res['direct_io'] else 'NO (buffered: the figures include the page cache)'}  "
          f"medians of {a.reps}")
    print("direct I/O (fio-style, the pool's rows), GB/s:  " + "  ".join(
        f"T={t}: read {dev['read'][t] / 1e9:.2f} write {dev['write'][t] / 1e9:.2f}" for t in THREADS))
    if hot is not None:
        print("direct I/O, one reused buffer a thread, GB/s:  " + "  ".join(
            f"T={t}: read {hot['read'][t] / 1e9:.2f} write {hot['write'][t] / 1e9:.2f}" for t in THREADS))
    for n in THREADS:
        r, w = pool[n]["read"], pool[n]["write"]
        print(f"pool N={n:2d}: read {r / 1e9:.2f} GB/s ({r / dev['read'][n]:.0%} of T={n}, "
              f"{r / best['read']:.0%} of best)  write {w / 1e9:.2f} GB/s "
              f"({w / dev['write'][n]:.0%} of T={n}, {w / best['write']:.0%} of best)")

    # 3. restore latency: idle, under writes with priorities off, on, on with the write cap
    lat = None
    k = write_cap(a.workers, a.write_share)
    capped = f"writes, priorities on, write cap K={k}"
    if not a.skip_latency:
        lat = restore_cases(a, size, page, piece, rows, capped, res)
    ratio = {op: {n: pool[n][op] / dev[op][n] for n in THREADS} for op in ("read", "write")}
    res["of_direct"] = ratio
    if lat is not None:
        idle = lat["idle"]["p99"]
        on, off = lat["writes, priorities on"]["p99"] / idle, lat["writes, priorities off"]["p99"] / idle
        cap = lat[capped]["p99"] / idle
        res["headline"] = {"p99_cap_x_idle": cap, "write_cap": k, "p99_on_x_idle": on,
                           "p99_off_x_idle": off}
    res.setdefault("headline", {}).update(
        {"read16_of_direct": ratio["read"][16], "write16_of_direct": ratio["write"][16],
         "worst_read_of_direct": min(ratio["read"].values()),
         "worst_write_of_direct": min(ratio["write"].values())})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    tput = ("pool read/write at N=" + "/".join(map(str, THREADS)) + " "
            + "/".join(f"{ratio['read'][n]:.0%}" for n in THREADS) + " / "
            + "/".join(f"{ratio['write'][n]:.0%}" for n in THREADS) + " of direct I/O")
    if lat is None:
        print(f"disk_pool: {tput}")
    else:
        print(f"disk_pool: restore p99 under writes {cap:.2f}x idle with priorities and the write "
              f"cap (K={k}; {on:.2f}x priorities only, {off:.2f}x neither); {tput}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
