"""Which side of the sessions 10-12 race the sim lands on, by the disk's write rate (no GPU).

On session files 0010-0012 of ``configs/agentic-slice.yaml``, session 0011's turn 13 and
session 0012's turn 14 come back at about 126 s within a fraction of a second of each other;
the one the engine admits second waits ~9 s for GPU KV, and that sets the slice's TTFT p90
(hw landed on both sides over seven runs: docs/hw-notes.md, 2026-11-30 05:38 UTC). This
replays the slice with ``kvsim compare``'s sim side on the committed calibrated profile,
its disk write rates (``nvme.write`` and ``nvme.rewrite`` together) scaled over a grid, and
prints per factor the TTFT p90 and both turns' arrival and TTFT. About a minute.

    python3 benchmarks/race_disk_rate.py [--traces DIR] [--factors 0.9,1.0,1.1,1.2,1.3]

Last line: ``p90_flips_between_write_x: <factor> <next factor>`` (the first neighbours on
the grid whose order of the two turns differs; ``none`` if no pair does).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _slices import SESSIONS, comma_list, session_slice, slice_config  # noqa: E402  (beside this script)
from kvsim.compare import turn_times, replay_sim_side  # noqa: E402
from kvsim.hardware import load_profile  # noqa: E402
from kvsim.run import prepare_run  # noqa: E402

RACE = (("trace_0011", 13), ("trace_0012", 14))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(SESSIONS), help="the folder of session files")
    ap.add_argument("--factors", default="0.9,1.0,1.05,1.1,1.15,1.2,1.3")
    a = ap.parse_args()
    factors = sorted(comma_list(ap, "--factors", a.factors))
    if len(factors) < 2 or factors[0] <= 0:
        ap.error(f"--factors: got {a.factors!r}; expected at least two positive factors")
    cfg = slice_config()
    base = load_profile("h200-pcie-calibrated")
    nv = base.nvme
    print(f"committed profile: nvme.write {nv.write / 1e9:.3f} GB/s, nvme.rewrite "
          f"{(nv.rewrite or nv.write) / 1e9:.3f} GB/s")
    print("| write x | write GB/s | TTFT p90 s | 0011 turn 13: back at, TTFT s | 0012 turn 14: back at, TTFT s | first |")
    print("| --- | --- | --- | --- | --- | --- |")
    firsts = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = str(session_slice(tmp, (10, 11, 12), a.traces))
        for f in factors:
            scaled = nv.model_copy(update={"write": nv.write * f,
                                           "rewrite": None if nv.rewrite is None else nv.rewrite * f})
            res = replay_sim_side(prepare_run(cfg, trace, base.model_copy(update={"nvme": scaled})), [])
            times = turn_times(res.rows)
            (arr_a, ttft_a), (arr_b, ttft_b) = times[RACE[0]], times[RACE[1]]
            firsts.append(RACE[0] if arr_a < arr_b else RACE[1])
            print(f"| {f:g} | {nv.write * f / 1e9:.3f} | {res.metrics['ttft_s']['p90']:.3f} | "
                  f"{arr_a:.2f}, {ttft_a:.2f} | {arr_b:.2f}, {ttft_b:.2f} | {firsts[-1][0]} |", flush=True)
    flip = next((f"{factors[i]:g} {factors[i + 1]:g}" for i in range(len(factors) - 1)
                 if firsts[i] != firsts[i + 1]), "none")
    print(f"p90_flips_between_write_x: {flip}")


if __name__ == "__main__":
    main()
