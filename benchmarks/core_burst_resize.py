"""Benchmark: the core's CPU time to plan and complete one burst.

A request grows to 200K tokens in one step (32 tokens a block, 16 KiB pages: 6,250 new
pages) while the GPU tier is already full of evictable pages (a finished request's cached
prompt), so every one of those pages must move to host (host has room for all of them).

Timed, per run: ``TierManager.grow`` (plan) and ``TierManager.complete`` (complete), CPU
time of this process. Not timed: building a fresh manager and filling the GPU (setup), and
the transfers, which the reference backend performs between plan and complete (tags copied
in numpy); the refcheck then verifies the first run. Prints each run, the per-phase
medians, and last the line ``core_burst_resize_ms: <median>``.

    python3 benchmarks/core_burst_resize.py [--runs 15] [--profile]
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import sys
import time

_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402

from kvsim.core import Level, ManagerSpec, ReqState, TierManager, TierSpec  # noqa: E402
from kvsim.core.audit import audit  # noqa: E402

TOKENS = 200_000
TPB = 32
PAGE = 16 * 1024
PAGES = TOKENS // TPB  # 6,250


def _backend(m: TierManager):
    from kvsim_backends.reference import ReferenceBackend  # installed with kvsim (pip install -e .)

    return ReferenceBackend({t.level: t.max_slots for t in m.tiers})


def setup():
    """A fresh manager whose GPU is full of evictable pages, and an active empty request
    that declared its 6,250 blocks. Untimed."""
    m = TierManager(ManagerSpec(page_bytes=PAGE, tokens_per_block=TPB, tiers=(
        TierSpec(Level.GPU, PAGES * PAGE),
        TierSpec(Level.HOST, 2 * PAGES * PAGE))))
    be = _backend(m)
    old = m.create("old", list(range(PAGES)), TOKENS)
    m.complete(m.resume(old))
    plan = m.grow(old, TOKENS)
    be.run_plan(plan)
    m.complete(plan)
    be.fill(m.commit(old, TOKENS, final=True))
    m.close(old)  # its pages stay cached: droppable, evictable
    assert m.tier_stats(Level.GPU).evictable == PAGES and m.tier_stats(Level.GPU).free == 0
    req = m.create("new", list(range(PAGES)), TOKENS)  # another scope: nothing matches
    m.complete(m.resume(req))
    assert req.state is ReqState.ACTIVE and req.tokens == 0
    return m, be, req


def one_run(check: bool) -> tuple[float, float]:
    m, be, req = setup()
    gc.collect()
    gc.disable()
    try:
        t0 = time.process_time_ns()
        plan = m.grow(req, TOKENS)
        t1 = time.process_time_ns()
        oks = be.run_plan(plan)  # the transfers: untimed
        t2 = time.process_time_ns()
        m.complete(plan, oks)
        t3 = time.process_time_ns()
    finally:
        gc.enable()
    assert plan and plan.pages == PAGES and plan.new_pages == PAGES, plan
    assert m.tier_stats(Level.HOST).used == PAGES and len(req.pages) == PAGES
    if check:
        be.fill(m.commit(req, TOKENS, final=True))
        exp = m.expected(req)
        assert np.array_equal(be.read_tags(Level.GPU, exp.slots), exp.tags)
        audit(m, be.read_tags)
    return (t1 - t0) / 1e6, (t3 - t2) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--profile", action="store_true", help="cProfile one run and exit")
    args = ap.parse_args()
    if args.profile:
        import cProfile
        import pstats
        m, be, req = setup()
        prof = cProfile.Profile()
        prof.enable()
        plan = m.grow(req, TOKENS)
        prof.disable()
        be.run_plan(plan)
        prof.enable()
        m.complete(plan)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    print(f"burst: grow to {TOKENS:,} tokens ({PAGES:,} pages of {PAGE // 1024} KiB, "
          f"{TPB} tokens a block), GPU full of evictable pages, all evicted to host")
    print("timed: CPU time of grow (plan) and complete; transfers run untimed on the "
          "reference backend; setup untimed; fresh manager each run")
    plans, completes, totals = [], [], []
    for i in range(max(10, args.runs)):
        p, c = one_run(check=(i == 0))
        plans.append(p)
        completes.append(c)
        totals.append(p + c)
        print(f"run {i + 1:2d}: plan {p:7.2f} ms  complete {c:7.2f} ms  total {p + c:7.2f} ms")
    print(f"median plan: {statistics.median(plans):.2f} ms")
    print(f"median complete: {statistics.median(completes):.2f} ms")
    print(f"core_burst_resize_ms: {statistics.median(totals):.2f}")


if __name__ == "__main__":
    main()
