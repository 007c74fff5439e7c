"""Benchmark: what a replay costs before and between its events, on this machine.

- ``trace_load_s``: loading the Mooncake conversation trace (12,031 requests,
  ``kvsim.workload.load_mooncake``): each run's wall time in this process, the median of
  ``--runs``. The figure a study pays once a point.
- ``step_time_us``: one ``ComputeModel.step_time`` call (Llama 3 8B on ``h200-pcie``, one
  prefill chunk of 512 tokens at a 10,000-token context beside 64 decoding requests of
  2,000 tokens): the median over ``--runs`` of the mean over 10,000 calls. The sim calls it
  once a step.

These were timed assertions in the tests (a trace load under 1.5 s, a step under 50 us);
a shared 2-core runner's speed moves by 20-30% within minutes, so the figures are measured
here instead. Prints each run, ``trace_load_s: <median>``, and last ``step_time_us:
<median>``.

    python3 benchmarks/load_speed.py [--trace PATH] [--runs 3]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT), str(_ROOT / "backends")]  # the checkout, installed or not

from kvsim.config.hardware import load_profile  # noqa: E402
from kvsim.engine.compute import ComputeModel, load_model  # noqa: E402
from kvsim.workload import load_mooncake  # noqa: E402

TRACE = _ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
CALLS = 10_000


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    if a.runs < 1:
        ap.error(f"--runs: got {a.runs}; expected >= 1")
    if not pathlib.Path(a.trace).is_file():
        ap.error(f"--trace: {a.trace}: no such file (the Mooncake conversation trace)")
    loads = []
    for i in range(a.runs):
        t0 = time.perf_counter()
        w = load_mooncake(a.trace)
        loads.append(time.perf_counter() - t0)
        print(f"run {i + 1}: {w.n_requests} requests loaded in {loads[-1]:.3f} s")
    m = ComputeModel(load_model("llama-3-8b"), load_profile("h200-pcie"))
    pre, dec = [(512, 10_000)], [2000] * 64
    steps = []
    for i in range(a.runs):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            m.step_time(pre, dec)
        steps.append((time.perf_counter() - t0) / CALLS)
        print(f"run {i + 1}: step_time {steps[-1] * 1e6:.2f} us a call ({CALLS} calls)")
    print(f"trace_load_s: {statistics.median(loads):.3f}")
    print(f"step_time_us: {statistics.median(steps) * 1e6:.2f}")


if __name__ == "__main__":
    main()
