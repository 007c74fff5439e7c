"""Benchmark: the core's CPU time to plan and complete one burst.

A request grows to 200K tokens in one step (32 tokens a block, 16 KiB pages: 6,250 new
pages) while the GPU tier is already full of evictable pages (a finished request's cached
prompt), so every one of those pages must move to host (host has room for all of them).

Timed, per run: ``TierManager.grow`` (plan) and ``TierManager.complete`` (complete), CPU
time of this process. Not timed: building a fresh manager and filling the GPU (setup), and
the transfers, which the reference backend performs between plan and complete (tags copied
in numpy); the refcheck then verifies the first run. Prints each run, the per-phase
medians, and last the line ``core_burst_resize_ms: <median>``.

Then probes while a resize is in flight: the same burst made through a ``SharedManager``
(kvsim.run.sharedmanager: mutations exclusive, probes shared) on the main thread, while
``--probers`` threads probe a 4K-token prompt of the cached scope (``probe_reuse``) in a
loop. A probe's latency is wall time from the call to its answer; the ones that overlap
the resize (from ``grow`` to the end of ``complete``) are reported as p50/p99/max, beside
the same probes' latency with no resize running. ``--copy-ms`` holds the transfers that
long between plan and complete (no lock held), as a GPU's copy would; 0 by default (the
reference backend's tag copy). The GIL's switch interval is 0.1 ms in this phase (as
kvsim's real-time runtime sets it; CPython's default 5 ms would add up to 5 ms to a probe
whenever another thread holds the GIL). This phase runs after the timed runs and does not touch
their figure.

    python3 benchmarks/core_burst_resize.py [--runs 15] [--profile] [--probers 2]
                                            [--probe-runs 5] [--copy-ms 0] [--policy NAME]

``--policy``: the eviction policy of the timed runs (default ``lru``; any online built-in,
or ``all``: each in turn, one ``core_burst_resize_ms NAME: <median>`` line each, the
largest last as ``core_burst_resize_ms``).
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import sys
import threading
import time

_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "backends")]  # the checkout, installed or not

import numpy as np  # noqa: E402

from kvsim.core import Level, ManagerSpec, ReqState, TierManager, TierSpec  # noqa: E402
from kvsim.core.audit import audit  # noqa: E402
from kvsim.core.policy import POLICY_NAMES, make_policy  # noqa: E402
from kvsim.run.sharedmanager import SharedManager  # noqa: E402

ONLINE = tuple(n for n in POLICY_NAMES if n != "belady")  # belady needs a trace's future

TOKENS = 200_000
TPB = 32
PAGE = 16 * 1024
PAGES = TOKENS // TPB  # 6,250


def _backend(m: TierManager):
    from kvsim_backends.reference import ReferenceBackend  # installed with kvsim (pip install -e .)

    return ReferenceBackend({t.level: t.max_slots for t in m.tiers})


def setup(policy: str = "lru"):
    """A fresh manager whose GPU is full of evictable pages, and an active empty request
    that declared its 6,250 blocks. Untimed."""
    m = TierManager(ManagerSpec(page_bytes=PAGE, tokens_per_block=TPB, tiers=(
        TierSpec(Level.GPU, PAGES * PAGE),
        TierSpec(Level.HOST, 2 * PAGES * PAGE))), make_policy(policy))
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


def one_run(check: bool, policy: str = "lru") -> tuple[float, float]:
    m, be, req = setup(policy)
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


PROBE_TOKENS = 4096  # a short prompt of the cached scope: 128 blocks
SWITCH_S = 1e-4  # the GIL's switch interval in the probe phase (as kvsim's RealtimeRuntime)


def probe_phase(runs: int, probers: int, copy_s: float) -> tuple[list[float], list[float], list[float]]:
    """Latencies (ms) of probes that overlapped a resize, of probes with none running,
    and each resize's wall time (ms) with the probers running."""
    blocks = list(range(PROBE_TOKENS // TPB))
    during: list[float] = []
    idle: list[float] = []
    walls: list[float] = []
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)
    try:
        return _probe_runs(runs, probers, copy_s, blocks, during, idle, walls)
    finally:
        sys.setswitchinterval(before)


def _probe_runs(runs, probers, copy_s, blocks, during, idle, walls):
    for _ in range(runs):
        m, be, req = setup()
        sm = SharedManager(m)
        stop = threading.Event()
        spans: list[list[tuple[float, float]]] = [[] for _ in range(probers)]

        def probe(out: list[tuple[float, float]]) -> None:
            clock = time.perf_counter
            while not stop.is_set():
                t0 = clock()
                sm.probe_reuse("old", blocks, PROBE_TOKENS)
                out.append((t0, clock()))

        ths = [threading.Thread(target=probe, args=(spans[k],), daemon=True) for k in range(probers)]
        for th in ths:
            th.start()
        time.sleep(0.02)  # probes with no resize running
        r0 = time.perf_counter()
        plan = sm.grow(req, TOKENS)
        oks = be.run_plan(plan)  # transfers: no lock held
        if copy_s:
            time.sleep(copy_s)
        sm.complete(plan, oks)
        r1 = time.perf_counter()
        time.sleep(0.005)
        stop.set()
        for th in ths:
            th.join()
        assert plan and plan.pages == PAGES and m.tier_stats(Level.HOST).used == PAGES
        walls.append((r1 - r0) * 1e3)
        for out in spans:
            for t0, t1 in out:
                if t1 > r0 and t0 < r1:
                    during.append((t1 - t0) * 1e3)
                elif t1 <= r0:
                    idle.append((t1 - t0) * 1e3)
    return during, idle, walls


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def median_run(policy: str, runs: int) -> float:
    """Each run printed; the per-phase medians; returns the median total (ms)."""
    plans, completes, totals = [], [], []
    for i in range(max(10, runs)):
        p, c = one_run(check=(i == 0), policy=policy)
        plans.append(p)
        completes.append(c)
        totals.append(p + c)
        print(f"{policy} run {i + 1:2d}: plan {p:7.2f} ms  complete {c:7.2f} ms  "
              f"total {p + c:7.2f} ms")
    print(f"{policy} median plan: {statistics.median(plans):.2f} ms")
    print(f"{policy} median complete: {statistics.median(completes):.2f} ms")
    return statistics.median(totals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--profile", action="store_true", help="cProfile one run and exit")
    ap.add_argument("--probers", type=int, default=2, help="probe threads in the probe phase")
    ap.add_argument("--probe-runs", type=int, default=5, help="resizes in the probe phase (0: skip)")
    ap.add_argument("--copy-ms", type=float, default=0.0,
                    help="probe phase: transfer time held between plan and complete")
    ap.add_argument("--policy", default="lru", choices=[*ONLINE, "all"],
                    help="eviction policy (all: each online built-in)")
    args = ap.parse_args()
    policies = list(ONLINE) if args.policy == "all" else [args.policy]
    if args.profile:
        import cProfile
        import pstats
        m, be, req = setup(policies[0])
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
    medians = {p: median_run(p, args.runs) for p in policies}
    if args.probe_runs > 0 and args.probers > 0:
        during, idle, walls = probe_phase(args.probe_runs, args.probers, args.copy_ms / 1e3)
        print(f"probes ({args.probers} threads, {PROBE_TOKENS}-token prompt, SharedManager) while "
              f"a resize is in flight ({args.probe_runs} resizes, wall median "
              f"{statistics.median(walls):.2f} ms, copy held {args.copy_ms:g} ms):")
        if idle:
            print(f"  no resize running: n={len(idle)}  p50 {_pct(idle, 0.5):.3f} ms  "
                  f"p99 {_pct(idle, 0.99):.3f} ms")
        if during:
            print(f"  resize in flight:  n={len(during)}  p50 {_pct(during, 0.5):.3f} ms  "
                  f"p99 {_pct(during, 0.99):.3f} ms  max {max(during):.3f} ms")
            print(f"probe_during_resize_p50_ms: {_pct(during, 0.5):.3f}")
            print(f"probe_during_resize_p99_ms: {_pct(during, 0.99):.3f}")
    if len(policies) > 1:
        for p, ms in medians.items():
            print(f"core_burst_resize_ms {p}: {ms:.2f}")
    print(f"core_burst_resize_ms: {max(medians.values()):.2f}")


if __name__ == "__main__":
    main()
