"""How fast the hw backend's refcheck verifies pages on the host (host-tier pages and disk
pages read back): numpy over every word, on one thread and in parallel tiles on a pool of
every core (what ``HwBackend.read_tags`` uses), side by side in one run.

    python benchmarks/refcheck_verify.py [--page-bytes 2097152] [--pages 128]

Prints GB/s verified for a batch of ``--pages`` pages and for one-page batches, each on
one thread and on the pool, and the pool's speed-up.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.hw import pattern  # noqa: E402


def rate(fn, nbytes: int, reps: int = 3) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page-bytes", type=int, default=2 << 20)
    ap.add_argument("--pages", type=int, default=128)
    a = ap.parse_args()
    n, pb = a.pages, a.page_bytes
    view = np.zeros((n, pb), np.uint8)
    tags = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    pattern.write_pages(view, np.arange(n), tags)
    slots = np.arange(n)
    threads = max(1, min(16, os.cpu_count() or 1))
    print(f"pages: {n} x {pb} B; pool: {threads} threads")
    with ThreadPoolExecutor(threads) as pool:
        assert (pattern.verify_pages(view, slots, pool=pool) == tags).all()
        rows = []
        for what, fn_one, fn_pool, nbytes in (
            (f"batch of {n} pages", lambda: pattern.verify_pages(view, slots),
             lambda: pattern.verify_pages(view, slots, pool=pool), n * pb),
            ("one-page batches", lambda: [pattern.verify_pages(view, [i]) for i in range(16)],
             lambda: [pattern.verify_pages(view, [i], pool=pool) for i in range(16)], 16 * pb),
        ):
            one, par = rate(fn_one, nbytes), rate(fn_pool, nbytes)
            rows.append(par / one)
            print(f"{what}: one thread {one:.2f} GB/s, pool {par:.2f} GB/s, x{par / one:.2f}")
    print(f"refcheck_verify_speedup: {min(rows):.2f}")


if __name__ == "__main__":
    main()
