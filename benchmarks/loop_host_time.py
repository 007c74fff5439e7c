"""The sim's model of the engine loop's host time against the saved H200 runs, side by side.

On the H200 the engine step after a resume of a request with pages on the GPU starts late:
the loop's thread spends that time on the core's bookkeeping over the request's pages and
on launching their refcheck, while the compute stream sits idle. The hw compute log's host
lag measures it (``docs/runs/h200-agentic-slice-host-lag-2026-11-30-0308``: 0.87 ms + 0.75
us a page beyond the median step's lag, over the 58 steps that admitted a turn with only
GPU hits; with the refcheck off, ``...-refcheck-off-2026-11-30-0319``, 0.92 ms + 0.56 us a
page). The committed calibrated profile carries one joint fit of four runs (those two,
``...-sessions-10-12-2026-11-30-0328`` and ``...-loop-model-2026-11-30-0336``) as
``loop.resume`` / ``loop.resume_per_page`` and ``refcheck.launch_per_page``; ``kvsim
compare``'s sim side models it (``model_loop``).

This script re-predicts every saved calibrated compare in ``docs/runs`` (no GPU needed)
with the profile each ran with, once without the loop's time and once with the committed
profile's. It prints, per run, what each gives against hw: TTFT p50 / p90, turns with the
same hits by tier, the per-turn TTFT error (median, |.| p90), and the median error on the
turns that took under 100 ms on hw. The terms were fitted on the four runs of 03:08-03:42
UTC; the six before were not used to fit them. Last line: ``short_turn_bias_pct: <median without> -> <median
with>`` over the runs.

    python3 benchmarks/loop_host_time.py [--traces ../shared/traces/agentic-coding/sessions]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _slices import SESSIONS, session_slice, slice_config  # noqa: E402  (beside this script)
from kvsim.compare import compare_saved, saved_hw  # noqa: E402
from kvsim.hardware import load_profile  # noqa: E402

# (run folder under docs/runs, the session files of its slice, extra config overrides);
# the 23:24 run's summary records no profile: it ran with the committed calibrated profile
# of the time
RUNS = [
    ("h200-agentic-slice-calibrated-2026-11-29-2324", (1, 2, 3), []),
    ("h200-agentic-slice-compare-calibrate-2026-11-30-0018", (1, 2, 3), []),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0028", (10, 11, 12), []),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0137", (10, 11, 12), []),
    ("h200-agentic-slice-compare-calibrate-2026-11-30-0144", (1, 2, 3), []),
    ("h200-agentic-slice-instrumented-2026-11-30-0203", (1, 2, 3), []),
    ("h200-agentic-slice-host-lag-2026-11-30-0308", (1, 2, 3), []),
    ("h200-agentic-slice-host-lag-refcheck-off-2026-11-30-0319", (1, 2, 3), ["engine.refcheck=false"]),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0328", (10, 11, 12), []),
    ("h200-agentic-slice-loop-model-2026-11-30-0336", (1, 2, 3), []),
]
FITTED_ON = 4  # the last four runs: the loop's terms were fitted on their compute logs


def _short_turn_median(sim_rows, hw_rows, under_s: float = 0.1) -> float:
    key = lambda r: (str(r.session), int(r.turn))  # noqa: E731
    hw = {key(r): float(r.ttft_s) for r in hw_rows}
    errs = [(r.ttft_s - hw[key(r)]) / hw[key(r)] for r in sim_rows
            if key(r) in hw and 0 < hw[key(r)] < under_s and r.ttft_s >= 0]
    return statistics.median(errs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(SESSIONS))
    a = ap.parse_args()
    committed = load_profile("h200-pcie-calibrated")
    loop = {"resume": committed.loop.resume, "resume_per_page": committed.loop.resume_per_page,
            "launch_per_page": committed.refcheck.launch_per_page}
    none = {"resume": 0.0, "resume_per_page": 0.0, "launch_per_page": 0.0}
    print(f"loop: {loop['resume'] * 1e3:.3f} ms + {loop['resume_per_page'] * 1e6:.3f} us a page "
          f"(+ {loop['launch_per_page'] * 1e6:.3f} us a page checked)")
    print("| run | TTFT p50 | TTFT p90 | same turns | per turn median | per turn abs p90 | under 100 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    bias = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        for run, sessions, sets in RUNS:
            folder = ROOT / "docs" / "runs" / run
            trace = session_slice(tmp, sessions, a.traces)
            cfg = slice_config(sets)
            hw = saved_hw(folder, cfg)[0]
            base = hw.profile or committed
            cells = []
            for label, lp in (("without", none), ("with", loop)):
                prof = base.model_copy(update={
                    "loop": base.loop.model_copy(update={k: lp[k] for k in ("resume", "resume_per_page")}),
                    "refcheck": base.refcheck.model_copy(update={"launch_per_page": lp["launch_per_page"]})})
                report, sim = compare_saved(cfg, folder, str(trace), profile=prof)
                m, t = report["metrics"], report["turns"]
                short = _short_turn_median(sim.rows, hw.rows)
                bias[label].append(short)
                cells.append((m["ttft_p50_s"]["rel_err"], m["ttft_p90_s"]["rel_err"],
                              f"{t['same_hits_by_tier']}/{t['turns']}", t["ttft_rel_err_median"],
                              t["ttft_abs_rel_err_p90"], short))
            fmt = lambda i, pct=True: " -> ".join(  # noqa: E731
                (f"{c[i] * 100:+.1f}%" if pct else str(c[i])) for c in cells)
            print(f"| {run.removeprefix('h200-agentic-slice-')} | {fmt(0)} | {fmt(1)} | {fmt(2, False)} | "
                  f"{fmt(3)} | {' -> '.join(f'{c[4] * 100:.1f}%' for c in cells)} | {fmt(5)} |")
    n_out = len(RUNS) - FITTED_ON
    w, s = (statistics.median(bias[k][:n_out]) * 100 for k in ("without", "with"))
    print(f"out of sample ({n_out} runs not fitted on): short_turn_bias_pct {w:+.1f} -> {s:+.1f}")
    w, s = (statistics.median(bias[k]) * 100 for k in ("without", "with"))
    print(f"short_turn_bias_pct: {w:+.1f} -> {s:+.1f}")


if __name__ == "__main__":
    main()
