"""What a node of ranks costs to simulate: the agentic workload (``configs/agentic-coding.yaml``:
real sessions, all three tiers) on a node of R ranks, against the same sessions replayed
rank by rank, each rank's share alone on a one-rank node (its sessions, at the node's
start times). Both sides replay the same requests; the node adds one shared clock, the
shared disk drive and the routing. CPU seconds of the replays alone (the trace is loaded
untimed), side by side in one process, median over ``--repeats`` rounds.

Prints each round, then ``node_cost_per_rank_x``: node CPU / (the ranks' CPU summed), the
node's cost per rank over a single instance's (1.0: a node costs what its ranks cost
alone; the goal is at most 1.3).

    python benchmarks/node_speed.py [--trace DIR] [--ranks 8] [--limit 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]  # the checkout, installed or not

from kvsim.config import load_config  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402
from kvsim.run.ranks import split  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "agentic-coding" / "sessions"


def cpu_replay(prep) -> tuple[float, int]:
    gc.collect()
    t = time.process_time()
    res = replay(prep)
    return time.process_time() - t, res.metrics["requests_completed"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--limit", type=int, default=100, help="sessions (the trace's first N)")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    sets = [f"workload.path={a.trace}", f"workload.limit={a.limit}",
            f"workload.sessions_per_s={0.05 * a.ranks}"]  # each rank sees the 1-rank rate
    node_cfg = load_config("configs/agentic-coding.yaml", [*sets, f"node.ranks={a.ranks}"])
    one_cfg = load_config("configs/agentic-coding.yaml", sets)
    node_prep = prepare_run(node_cfg)
    parts = []
    for w, starts in split(node_prep.workload, node_prep.starts, a.ranks):
        p = prepare_run(one_cfg, workload=w)
        p.starts = starts  # (the node's start times for these sessions)
        parts.append(p)
    ratios = []
    for i in range(a.repeats):
        node_s, node_n = cpu_replay(node_prep)
        part = [cpu_replay(p) for p in parts]
        alone_s, alone_n = sum(s for s, _ in part), sum(n for _, n in part)
        ratios.append(node_s / alone_s)
        print(f"round {i + 1}: node of {a.ranks} ranks {node_s:.2f} CPU s ({node_n} requests); "
              f"its ranks alone {alone_s:.2f} CPU s ({alone_n} requests; "
              f"{', '.join(f'{s:.2f}' for s, _ in part)}); ratio {ratios[-1]:.3f}", flush=True)
    print(f"node_cost_per_rank_x: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
