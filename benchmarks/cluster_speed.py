"""What a cluster costs to simulate: the Mooncake conversation trace at its real rate on
``configs/mooncake-cluster.yaml`` made 8 instances (2 nodes x 4 ranks at tp 2: 16 GPUs),
prefix-aware routing. Seconds of the replay alone (the trace is loaded and the run
prepared untimed), wall and CPU (``time.process_time``: the replay's own, which other work
on a shared machine slows far less than it slows the wall), and the peak memory of the
process that ran it (max RSS, trace included).

Each replay runs in a fresh interpreter of its own (a child process), so that none runs on
top of another's heap: run in one process, the second replay's collector walks, and its
caches hold, what the first left referenced (``benchmarks/policy_speed.py`` found a replay
after another's large tables taking up to twice the CPU time of the same replay run first).

``--x8``: also the trace x8 (eight copies with disjoint hash ids, each copy's timestamps
shifted by a millisecond more, made in memory) on 64 instances (16 nodes x 4 ranks at tp
2: 128 GPUs), once, between the 8-instance replays (``--repeat`` of them, 3 by default:
the first half before it, the rest after), so that a change in the machine's speed falls
on both sides. Prints each replay, then ``cluster_replay_s`` (the median 8-instance wall),
``cluster_128_replay_s``, ``cluster_scaling_cpu_x`` = CPU(x8 on 64) / (8 x median CPU(trace
on 8)) and last ``cluster_scaling_x``, the same of the walls: 1.0 when a request costs the
same whatever the instances. Without ``--x8``: ``--repeat`` (1 by default) 8-instance
replays, ``cluster_replay_s`` (their median) last. ``--limit N``: the trace's first N
requests (both sides).

``--apart`` (with ``--x8``): the x8 trace on 64 instances is not 8 times the work of the
trace on 8: prefix-aware routing mixes the copies, so that an instance caches eight copies'
prefixes (the trace's shared first blocks among them) where it cached one, hits less and
queues more. Then also both sides once more with a router that keeps the copies apart
(copy k on instances 8k..8k+7, each group prefix-aware over its own 8, asking ``cached`` and
``load`` of each; the trace alone on 8: one group): every group replays what the 8
instances do (the same hit ratio), so ``cluster_scaling_apart_x`` (the same ratio of the
walls, ``..._apart_cpu_x`` of CPU times) is what the instances alone cost.

    python benchmarks/cluster_speed.py [--trace FILE] [--limit N] [--x8 [--apart]] [--repeat N]
                                       [--installed | --compiled]

``--compiled``: the replays with the optional compiled build (made first in
``local/compiled-venv`` when missing or stale; ``benchmarks/kvsim_choice.py``); each
child runs in the same interpreter, with the same build, as this script.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from kvsim_choice import choose  # noqa: E402

INSTALLED = choose(__file__)  # this checkout's source, --installed or --compiled

from kvsim.config import load_config  # noqa: E402
from kvsim.core.routing import Router, make_router  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
NODES = {8: 2, 64: 16}  # instances -> nodes of 4 ranks


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


class _Sub:
    """Instances ``base``..``base + n - 1`` of a probe, as instances 0..n-1."""

    def __init__(self, probe, base: int, n: int) -> None:
        self.probe, self.base, self.instances = probe, base, n

    def cached(self, i: int):
        return self.probe.cached(self.base + i)

    def load(self, i: int):
        return self.probe.load(self.base + i)


class Apart(Router):
    """``--apart``: copy k of the x8 trace (sessions ``...-xk``; the trace alone: 0) on
    instances 8k..8k+7, by a prefix-aware router of its own (the config's knobs)."""

    knobs_of_each: dict = {}

    def __init__(self, instances, knobs=None, seed=0) -> None:
        super().__init__(instances, knobs, seed)
        self.each = [make_router("prefix-aware", 8, self.knobs_of_each, seed)
                     for _ in range(instances // 8)]

    def route(self, req, probe) -> int:
        _, x, k = req.session.rpartition("-x")
        base = 8 * int(k) if x else 0
        prev = None if req.previous is None else req.previous - base
        return base + self.each[base // 8].route(dataclasses.replace(req, previous=prev),
                                                 _Sub(probe, base, 8))


def one_replay(instances: int, trace: str, limit: int | None, apart: bool = False) -> dict:
    """One replay on ``instances`` (8: the trace; 64: the trace x8), timed, in this process;
    ``apart``: the copies kept apart (``Apart``)."""
    sets = [f"workload.path={trace}", "router.policy=prefix-aware", "tp=2", "node.ranks=4",
            "output.plots=false", f"cluster.nodes={NODES[instances]}"] + (
        [f"workload.limit={limit}"] if limit else [])
    cfg = load_config(str(ROOT / "configs" / "mooncake-cluster.yaml"), sets)
    if apart:
        Apart.knobs_of_each = dict(cfg.router.builtin_knobs())
        cfg = load_config(str(ROOT / "configs" / "mooncake-cluster.yaml"),
                          [*sets, f"router.policy={__name__}:Apart"])
    prep = prepare_run(cfg)
    if instances == 64:
        prep = prepare_run(cfg, workload=times8(prep.workload))
    gc.collect()
    w, c = time.perf_counter(), time.process_time()
    m = replay(prep).metrics
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    per = m["cluster"]["requests_per_instance"]
    return {"instances": instances, "apart": apart, "wall_s": wall, "cpu_s": cpu,
            "requests": m["requests_completed"], "hit_ratio": m["hit_ratio"],
            "ttft_p50_s": m["ttft_s"]["p50"], "requests_per_instance": per,
            "idle_instances": m["cluster"]["idle_instances"],
            "peak_memory_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def child_replay(instances: int, trace: str, limit: int | None, apart: bool = False) -> dict:
    """``one_replay`` in a fresh interpreter: this script with ``--one``, the same build."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(instances),
           "--trace", trace] + (["--installed"] if INSTALLED else []) + (
        ["--limit", str(limit)] if limit else []) + (["--apart"] if apart else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the {instances}-instance replay failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(r: dict) -> None:
    what = ("trace x8 on 64 instances" if r["instances"] == 64 else "8 instances") + (
        ", copies apart" if r["apart"] else "")
    print(f"{what}: {r['requests']} requests, wall {r['wall_s']:.1f} s, cpu {r['cpu_s']:.1f} s, "
          f"peak memory {r['peak_memory_mb']:.0f} MB; hit ratio {r['hit_ratio']:.4f}, TTFT p50 "
          f"{r['ttft_p50_s']:.2f} s, idle instances {r['idle_instances']}"
          + ("" if r["instances"] == 64 else f", requests per instance {r['requests_per_instance']}"),
          flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--x8", action="store_true")
    ap.add_argument("--repeat", type=int, default=None,
                    help="8-instance replays (median); default 3 with --x8, else 1")
    ap.add_argument("--apart", action="store_true",
                    help="with --x8: also both sides with the copies kept apart")
    ap.add_argument("--installed", action="store_true",
                    help="replay with the installed kvsim (e.g. the compiled build), not this checkout")
    ap.add_argument("--compiled", action="store_true",
                    help="build local/compiled-venv if needed and run there with --installed")
    ap.add_argument("--one", type=int, choices=sorted(NODES), help=argparse.SUPPRESS)  # a child
    a = ap.parse_args(argv)
    if not Path(a.trace).is_file():
        print(f"--trace {a.trace}: no such file", file=sys.stderr)
        return 2
    if a.one:
        print(json.dumps(one_replay(a.one, a.trace, a.limit, a.apart)))
        return 0
    repeat = a.repeat if a.repeat is not None else (3 if a.x8 else 1)
    if repeat < 1:
        print(f"--repeat: got {repeat}; expected >= 1", file=sys.stderr)
        return 2
    if a.apart and not a.x8:
        print("--apart: with --x8 only", file=sys.stderr)
        return 2
    order = [(8, False)] * repeat
    if a.x8:
        order.insert((repeat + 1) // 2, (64, False))
    if a.apart:
        order += [(n, True) for n, _ in order]
    print("each replay in its own process, in this order: "
          + ", ".join(f"{n}{' apart' if x else ''}" for n, x in order) + " instances", flush=True)
    runs = []
    for n, x in order:
        runs.append(child_replay(n, a.trace, a.limit, x))
        show(runs[-1])
    if a.apart:
        sa = [r for r in runs if r["instances"] == 8 and r["apart"]]
        ba = next(r for r in runs if r["instances"] == 64 and r["apart"])
        print(f"cluster_scaling_apart_cpu_x: "
              f"{ba['cpu_s'] / (8 * statistics.median(r['cpu_s'] for r in sa)):.3f}")
        print(f"cluster_scaling_apart_x: "
              f"{ba['wall_s'] / (8 * statistics.median(r['wall_s'] for r in sa)):.3f}")
        runs = [r for r in runs if not r["apart"]]
    small = [r for r in runs if r["instances"] == 8]
    wall8 = statistics.median(r["wall_s"] for r in small)
    if not a.x8:
        print(f"cluster_replay_s: {wall8:.1f}")
        return 0
    cpu8 = statistics.median(r["cpu_s"] for r in small)
    big = next(r for r in runs if r["instances"] == 64)
    print(f"8 instances, median of {repeat}: wall {wall8:.2f} s, cpu {cpu8:.2f} s; "
          f"64 instances: wall {big['wall_s']:.2f} s, cpu {big['cpu_s']:.2f} s")
    print(f"cluster_replay_s: {wall8:.1f}")
    print(f"cluster_128_replay_s: {big['wall_s']:.1f}")
    print(f"cluster_scaling_cpu_x: {big['cpu_s'] / (8 * cpu8):.3f}")
    print(f"cluster_scaling_x: {big['wall_s'] / (8 * wall8):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
