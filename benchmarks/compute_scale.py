"""The sim's compute call against the H200's, before and after ``compute.scale``: the saved
compares re-predicted (no GPU) with the compute fitted as calibrate did before (a fixed
``compute.latency``, the median of wall - d over its timed ``compute(d)`` calls) and as it
does now (wall - d = latency + (scale - 1) x d, least squares over the same calls).

hw's busy kernel runs ~1% over what it is asked for at every step size (its compute log:
measured / nominal 1.010-1.013 p50 from 6 to 300 ms in the four runs of sessions 1-3 at
05:59-07:44 UTC; calibrate's calls: 0.24-1.16% of d on eight machines), so a fixed term
alone makes the sim's long prefill steps too short and its short ones too long.

Runs: each ``kvsim compare --calibrate`` run with its own profile (its compute refitted
from its own report, the issue's protocol: calibrated on that machine), and the runs of
the current hw backend on the committed profile (its compute refitted from its report).
Prints, per run and both ways: TTFT p50 / p90 error, turns with the same hits by tier, the
per-turn TTFT error median, and the sim's total compute seconds against hw's (where hw
logged them). Last line: ``compute_total_err_pct (runs with hw's compute logged, median):
<before> -> <after>``.

    python3 benchmarks/compute_scale.py [--traces ../shared/traces/agentic-coding/sessions]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _slices import SESSIONS, session_slice, slice_config  # noqa: E402  (beside this script)
from kvsim.calibrate import fit_compute  # noqa: E402
from kvsim.compare import compare_saved  # noqa: E402
from kvsim.hardware import CONFIG_DIR, load_profile  # noqa: E402

RUNS_DIR = ROOT / "docs" / "runs"
S13, S1012 = (1, 2, 3), (10, 11, 12)
# (run under docs/runs, its slice, True: calibrated on its machine, the profile in the
# folder; False: the committed profile)
RUNS = [
    ("h200-agentic-slice-compare-calibrate-2026-11-30-0018", S13, True),
    ("h200-agentic-slice-compare-calibrate-2026-11-30-0144", S13, True),
    ("h200-agentic-slice-sessions-1-3-calibrated-2026-11-30-0723", S13, True),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0028", S1012, True),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0137", S1012, True),
    ("h200-agentic-slice-sessions-10-12-calibrated-2026-11-30-0539", S1012, True),
    ("h200-agentic-slice-sessions-10-12-calibrated-2026-11-30-0612", S1012, True),
    ("h200-agentic-slice-sessions-1-3-loop-disk-2026-11-30-0559", S13, False),
    ("h200-agentic-slice-sessions-10-12-loop-disk-2026-11-30-0605", S1012, False),
    ("h200-agentic-slice-sessions-1-3-repeat-2026-11-30-0732", S13, False),
    ("h200-agentic-slice-sessions-1-3-repeat-2026-11-30-0738", S13, False),
    ("h200-agentic-slice-sessions-1-3-repeat-2026-11-30-0744", S13, False),
]


def before_after(profile, report_path: Path):
    """(the profile with compute as fitted before, as fitted now) from a report's calls."""
    busy = json.loads(report_path.read_text())["compute"]["busy"]
    over = [r["wall_s"] - r["requested_s"] for r in busy]
    old = profile.compute.model_copy(update={"latency": max(0.0, statistics.median(over)), "scale": 1.0})
    new = profile.compute.model_copy(update=fit_compute(busy)[0])
    return (profile.model_copy(update={"compute": old}), profile.model_copy(update={"compute": new}))


def line(report: dict) -> tuple[str, float | None]:
    m, t, c = report["metrics"], report["turns"], report["compute"]
    sim_s, hw_s = c["sim"].get("seconds"), c["hw"].get("seconds")
    err = (sim_s - hw_s) / hw_s if sim_s and hw_s else None
    txt = (f"{m['ttft_p50_s']['rel_err'] * 100:+6.1f}% {m['ttft_p90_s']['rel_err'] * 100:+6.1f}% "
           f"{t['same_hits_by_tier']:3d}/{t['turns']} {t['ttft_rel_err_median'] * 100:+5.1f}% "
           f"{sim_s:7.2f}/" + (f"{hw_s:6.2f}" if hw_s else "   n/a"))
    return txt, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(SESSIONS))
    a = ap.parse_args()
    committed = load_profile("h200-pcie-calibrated")
    committed_report = CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml.report.json"
    cfg = slice_config()
    print("per run: TTFT p50, p90 error; turns with the same hits; per-turn TTFT error median; "
          "sim / hw compute s")
    errs: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for run, sessions, own in RUNS:
            folder = RUNS_DIR / run
            trace = str(session_slice(tmp, sessions, a.traces))
            if own:
                prof = load_profile(folder / "hardware.yaml")
                old, new = before_after(prof, folder / "hardware.yaml.report.json")
            else:
                old, new = before_after(committed, committed_report)
            out = []
            for name, p in (("before", old), ("after", new)):
                txt, err = line(compare_saved(cfg, folder, trace, profile=p)[0])
                out.append(txt)
                if err is not None:
                    errs[name].append(err)
            print(f"{run[19:]:44s} {'own' if own else 'com'} lat {new.compute.latency * 1e6:4.0f} us "
                  f"scale {new.compute.scale:.5f} | {out[0]} -> {out[1]}", flush=True)
    med = {k: statistics.median(v) * 100 for k, v in errs.items()}
    print(f"compute_total_err_pct (runs with hw's compute logged, median of {len(errs['after'])}): "
          f"{med['before']:+.2f} -> {med['after']:+.2f}")


if __name__ == "__main__":
    main()
