"""Benchmark: at how many ranks a node's host memory bandwidth binds, in the sim.

N ranks of one node (one GPU each, on one clock) each start a batch at the same moment:
host -> GPU only (``one way``), or host -> GPU and GPU -> host at once (``both ways``), on
the copy engine. Midway through, each rank's bytes per second over its link (the sum of
its flows' rates) is read from its fluid. Printed per N: the rate a rank gets on the
profile with ``host.memory_bandwidth`` (default ``h200-dgx``) and on the same profile
without it, and last the line ``host_mem_binds_at_ranks: N``, the fewest ranks at which
a rank moving both ways gets less than without the key (0: not up to ``--ranks``).

    python3 benchmarks/node_bus.py [--profile h200-dgx] [--ranks 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]

import numpy as np  # noqa: E402

from kvsim.config.hardware import load_profile  # noqa: E402
from kvsim.core.plan import Batch, BatchKind  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402
from kvsim.run.seam import settings_for  # noqa: E402
from kvsim_backends.sim import SimBackend, SimRuntime  # noqa: E402

PB = 2 << 20
PAGES = 256  # 512 MiB a batch: ~10 ms on a PCIe Gen5 link


def rank_rate(profile, ranks: int, both: bool) -> float:
    """One rank's bytes a second over its link midway, with ``ranks`` ranks copying."""
    rt = SimRuntime()
    base = settings_for(PB, {Level.GPU: 2 * PAGES, Level.HOST: 2 * PAGES}, profile,
                        copy_path="copy_engine")
    bes = [SimBackend(rt, dataclasses.replace(base, rank=r, ranks=ranks, tp=1))
           for r in range(ranks)]
    idx = np.arange(PAGES, dtype=np.int64)
    for be in bes:
        be.transfer(Batch(BatchKind.ONBOARD, Level.HOST, Level.GPU, idx, idx, [0] * PAGES, PB, 0))
        if both:
            be.transfer(Batch(BatchKind.EVICT, Level.GPU, Level.HOST, idx + PAGES, idx + PAGES,
                              [0] * PAGES, PB, 0))
    rt.env.run(until=2e-3)  # (past the calls' host time, before any batch's bytes are in)
    return sum(f.rate for f in bes[0].fluid.flows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="h200-dgx")
    ap.add_argument("--ranks", type=int, default=8)
    a = ap.parse_args()
    keyed = load_profile(a.profile)
    if keyed.host.memory_bandwidth is None:
        raise SystemExit(f"{a.profile}: no host.memory_bandwidth to study")
    data = keyed.model_dump()
    data["host"]["memory_bandwidth"] = None
    free = type(keyed).model_validate(data)
    print(f"{a.profile}: host memory {keyed.host.memory_bandwidth / 1e9:.1f} GB/s; "
          f"a rank's GB/s over its link, with the key / without")
    print("ranks | one way | both ways")
    binds = 0
    for n in range(1, a.ranks + 1):
        one = rank_rate(keyed, n, False), rank_rate(free, n, False)
        two = rank_rate(keyed, n, True), rank_rate(free, n, True)
        print(f"{n:5d} | {one[0] / 1e9:6.1f} / {one[1] / 1e9:5.1f} | {two[0] / 1e9:6.1f} / {two[1] / 1e9:5.1f}")
        if not binds and two[0] < two[1] * (1 - 1e-9):
            binds = n
    print(f"host_mem_binds_at_ranks: {binds}")


if __name__ == "__main__":
    main()
