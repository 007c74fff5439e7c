"""Benchmark: one burst resize end to end on the hw backend (plan + copy + complete).

The seed's case: a request grows to 200K tokens in one step (32 tokens a page: 6,250 new
pages) while the GPU tier is full of evictable pages (a finished request's cached prompt),
so every one of those pages must first move GPU -> host (host has room for all of them).
The seed measured 14.9 ms for that blocking resize (18.6 ms before batching statistics).

Timed, per run, wall clock: ``TierManager.grow`` (plan), the plan's transfers on the hw
backend from the first ``transfer()`` to the runtime seeing the last one complete (copy),
and ``TierManager.complete`` (complete). Untimed: a fresh manager each run, filling the GPU
tier with the old prompt's content. The backend is built once (its memory allocated and
registered once) and reused; run 1 is a warm-up and not counted. Every run checks that the
evicted pages' content arrived on host (all pages: the refcheck's tags).

Runs on a GPU (CuPy) and, with ``--device cpu`` or without CuPy, in CPU mode (numpy arrays
standing in for device memory; the figure then says nothing about a GPU). Prints each run,
the per-phase medians, and last ``hw_burst_resize_ms: <median total>``.

    python3 benchmarks/hw_burst_resize.py [--runs 10] [--tokens 200000] [--page-bytes 16KiB]
                                          [--device auto|gpu|cpu] [--path auto|copy_engine|sm_kernel]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim.run.seam import settings_for
from kvsim_backends.hw import HwBackend, RealtimeRuntime  # noqa: E402
from kvsim.core import Level, ManagerSpec, ReqState, TierManager, TierSpec  # noqa: E402
from kvsim.core.datapath.copypath import CopyPath  # noqa: E402
from kvsim.config.units import parse_size  # noqa: E402

TPB = 32
SEED_MS = 14.9  # the seed's blocking resize of 200K tokens, 32-token pages, all to host
PROFILE = "h200-pcie-calibrated"  # the H200's own profile: copy path, CTAs, threads a CTA


def fresh_manager(be: HwBackend, pages: int, tokens: int, page: int):
    """A manager whose GPU tier (``pages`` slots) is full of an old prompt's evictable
    pages, their content written on the backend, and an active empty request that declared
    ``pages`` blocks of another scope (nothing matches)."""
    m = TierManager(ManagerSpec(page_bytes=page, tokens_per_block=TPB, tiers=(
        TierSpec(Level.GPU, pages * page), TierSpec(Level.HOST, 2 * pages * page))))
    old = m.create("old", list(range(pages)), tokens)
    m.complete(m.resume(old))
    m.complete(m.grow(old, tokens))  # free slots: the plan moves nothing
    be.fill(m.commit(old, tokens, final=True))
    m.close(old)
    gpu = m.tier_stats(Level.GPU)
    assert gpu.free == 0 and gpu.evictable == pages, gpu
    req = m.create("new", list(range(pages)), tokens)
    m.complete(m.resume(req))
    assert req.state is ReqState.ACTIVE and req.tokens == 0
    return m, req


def one_run(rt, be: HwBackend, pages: int, tokens: int, page: int, path) -> tuple[float, float, float]:
    m, req = fresh_manager(be, pages, tokens, page)
    t0 = time.perf_counter()
    plan = m.grow(req, tokens)
    t1 = time.perf_counter()
    oks = [False] * len(plan.batches)
    index = {id(b): i for i, b in enumerate(plan.batches)}
    for stage in plan.stages:
        events = [be.transfer(b, path=path) for b in stage]
        done = rt.run(rt.all_of(events))
        for b, ev in zip(stage, events):
            oks[index[id(b)]] = bool(done[ev])
        if not all(oks[index[id(b)]] for b in stage):
            break
    t2 = time.perf_counter()
    m.complete(plan, oks)
    t3 = time.perf_counter()
    if not all(oks):
        raise SystemExit(f"a transfer failed: {list(be.errors)}")
    # one batched plan: a single GPU -> host batch of every old page, then the new pages
    evicts = [b for b in plan.batches if b.src == Level.GPU and b.dst == Level.HOST]
    assert len(plan.batches) == 1 and len(evicts) == 1 and evicts[0].pages == pages, plan
    assert plan.new_pages == pages and len(req.pages) == pages
    b = evicts[0]
    got = be.read_tags(Level.HOST, np.asarray(b.dst_slots))
    if not np.array_equal(np.asarray(got, dtype=np.uint64), np.asarray(b.tags, dtype=np.uint64)):
        raise SystemExit("refcheck: evicted pages' content did not arrive on host")
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="timed runs (after one warm-up)")
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--page-bytes", default="16KiB", help="bytes of one 32-token page")
    ap.add_argument("--device", default="auto", choices=("auto", "gpu", "cpu"))
    ap.add_argument("--path", default="auto", choices=("auto", "copy_engine", "sm_kernel"),
                    help="GPU -> host copy path (auto: the profile's rule)")
    ap.add_argument("--profile", default=PROFILE)
    a = ap.parse_args(argv)
    if a.runs < 1 or a.tokens < TPB:
        ap.error("--runs must be >= 1 and --tokens >= 32")
    page = parse_size(a.page_bytes)
    pages = -(-a.tokens // TPB)
    path = None if a.path == "auto" else CopyPath(a.path)
    rt = RealtimeRuntime(poll_interval_s=5e-6)
    be = HwBackend(rt, settings_for(page, {Level.GPU: pages, Level.HOST: 2 * pages}, device=a.device, profile=a.profile))
    try:
        used = (path or be.copy_paths["d2h"]).value
        print(f"burst resize on the hw backend ({be.info.get('device')}): grow to {a.tokens:,} "
              f"tokens = {pages:,} pages of {page // 1024} KiB ({pages * page / 2**20:.0f} MiB), "
              f"GPU full of evictable pages, all evicted to host; d2h path {used}")
        print("timed (wall): plan = grow, copy = transfers until seen complete, complete; "
              "fresh manager each run, backend reused, run 0 a warm-up")
        plans, copies, completes, totals = [], [], [], []
        for i in range(a.runs + 1):
            p, c, k = one_run(rt, be, pages, a.tokens, page, path)
            tag = "warm-up" if i == 0 else f"run {i:2d}"
            print(f"{tag}: plan {p:7.2f} ms  copy {c:7.2f} ms  complete {k:7.2f} ms  "
                  f"total {p + c + k:7.2f} ms  ({pages * page / (c / 1e3) / 1e9:.1f} GB/s copy)",
                  flush=True)
            if i:
                plans.append(p)
                copies.append(c)
                completes.append(k)
                totals.append(p + c + k)
    finally:
        be.close()
    med = statistics.median
    print(f"median plan: {med(plans):.2f} ms")
    print(f"median copy: {med(copies):.2f} ms")
    print(f"median complete: {med(completes):.2f} ms")
    print(f"median plan + complete (core, CPU): {med(plans) + med(completes):.2f} ms")
    print(f"seed (KVCM2, 200K tokens, 32-token pages, blocking resize): {SEED_MS} ms")
    print(f"hw_burst_resize_ms: {med(totals):.2f}")


if __name__ == "__main__":
    main()
