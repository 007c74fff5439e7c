"""What a cluster costs to simulate: the Mooncake conversation trace at its real rate on
``configs/mooncake-cluster.yaml`` made 8 instances (2 nodes x 4 ranks at tp 2: 16 GPUs),
prefix-aware routing. Wall seconds of the replay alone (the trace is loaded and the run
prepared untimed) and the process's peak memory (max RSS, trace included).

``--x8``: then, in the same process, the trace x8 (eight copies with disjoint hash ids,
each copy's timestamps shifted by a millisecond more, made in memory) on 64 instances
(16 nodes x 4 ranks at tp 2: 128 GPUs): ``cluster_128_replay_s``, and
``cluster_scaling_x`` = wall(x8 on 64) / (8 x wall(trace on 8)): 1.0 when a request costs
the same whatever the instances. ``--limit N``: the trace's first N requests (both runs).

Prints ``cluster_replay_s`` last (``cluster_scaling_x`` with ``--x8``).

    python benchmarks/cluster_speed.py [--trace FILE] [--limit N] [--x8] [--installed | --compiled]

``--compiled``: the replays with the optional compiled build (made first in
``local/compiled-venv`` when missing or stale; ``benchmarks/kvsim_choice.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from kvsim_choice import choose  # noqa: E402

INSTALLED = choose(__file__)  # this checkout's source, --installed or --compiled

from kvsim.config import load_config  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


def times8(workload):
    """Eight copies of an open-loop workload: disjoint hash ids (copy k's ids + k << 40),
    copy k's arrivals k ms later, sessions interleaved by arrival."""
    sessions = []
    for k in range(8):
        for s in workload.sessions:
            items = tuple(dataclasses.replace(
                t, hash_ids=tuple(h + (k << 40) for h in t.hash_ids),
                arrival_s=t.arrival_s + k * 1e-3) for t in s.items)
            sessions.append(dataclasses.replace(s, sid=f"{s.sid}-x{k}", items=items,
                                                start_s=(s.start_s or 0.0) + k * 1e-3))
    sessions.sort(key=lambda s: s.start_s)
    return dataclasses.replace(workload, sessions=tuple(sessions))


def timed(prep) -> tuple[float, dict]:
    gc.collect()
    t = time.perf_counter()
    res = replay(prep)
    return time.perf_counter() - t, res.metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--x8", action="store_true")
    ap.add_argument("--installed", action="store_true",
                    help="replay with the installed kvsim (e.g. the compiled build), not this checkout")
    ap.add_argument("--compiled", action="store_true",
                    help="build local/compiled-venv if needed and run there with --installed")
    a = ap.parse_args()
    sets = [f"workload.path={a.trace}", "router.policy=prefix-aware", "tp=2", "node.ranks=4",
            "output.plots=false"] + ([f"workload.limit={a.limit}"] if a.limit else [])
    prep = prepare_run(load_config(str(ROOT / "configs" / "mooncake-cluster.yaml"), [*sets, "cluster.nodes=2"]))
    wall8, m = timed(prep)
    c = m["cluster"]
    print(f"8 instances: {m['requests_completed']} requests in {wall8:.1f} s; hit ratio "
          f"{m['hit_ratio']:.4f}, TTFT p50 {m['ttft_s']['p50']:.2f} s, requests per instance "
          f"{c['requests_per_instance']}", flush=True)
    print(f"peak_memory_mb: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
    if a.x8:
        cfg = load_config(str(ROOT / "configs" / "mooncake-cluster.yaml"), [*sets, "cluster.nodes=16"])
        big = prepare_run(cfg, workload=times8(prep.workload))
        wall64, m64 = timed(big)
        print(f"64 instances, trace x8: {m64['requests_completed']} requests in {wall64:.1f} s; "
              f"idle instances {m64['cluster']['idle_instances']}", flush=True)
        print(f"peak_memory_mb: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}")
        print(f"cluster_128_replay_s: {wall64:.1f}")
        print(f"cluster_replay_s: {wall8:.1f}")
        print(f"cluster_scaling_x: {wall64 / (8 * wall8):.3f}")
        return
    print(f"cluster_replay_s: {wall8:.1f}")


if __name__ == "__main__":
    main()
