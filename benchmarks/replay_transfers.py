"""The sim's per-batch transfer times against the saved H200 runs, with and without the three
transfer terms of the committed calibrated profile, side by side (no GPU needed).

- ``loop.transfer`` (126.8 us): what a replay's engine loop adds to a transfer with a GPU
  leg beyond calibrate's tight loop of copies. It shows in the one-page GPU -> host batches
  (the engine's background eviction, ~1,600 a run). Fitted on
  ``docs/runs/h200-agentic-slice-fill-in-parts-2026-11-30-0420``; the runs before it ran the
  older fill kernel (a CTA a page), which held every GPU -> host copy ~40 us more, so only
  the later runs say how well it predicts.
- ``loop.disk`` (426.6 us): what a replay adds to a transfer with a disk leg beyond the
  I/O threads alone. It shows in the one-page host -> disk batches (the host tier's
  eviction to disk, ~800-1,100 a run). Measured from the hw log of
  ``docs/runs/h200-agentic-slice-sessions-10-12-calibrated-2026-11-30-0539`` (each batch's
  wait for an I/O thread and its completion's wait for the loop, not a fit to the error).
- ``nvme.rewrite`` (write x 1.311): a disk write into slots written before. It shows in
  the big disk writes (500+ pages). Applied to each run's own profile as that ratio of its
  write rate, or the run's own measured rate where its profile has one.

Every saved compare in ``docs/runs`` with per-batch logs is re-predicted with the profile it
ran with (``saved_hw``), once with none of the terms and once with all three (the compare's
sim side, ``model_loop`` on). Per run: the one-page GPU -> host p50 error, the big disk
writes' median error (batch by batch, in order), the one-page host -> disk p50 error, TTFT
p50 / p90 errors. Last three lines, medians over runs: ``one_page_gpu_to_host_err_pct (runs
after the fill change, not fitted on): <without> -> <with>``, ``one_page_host_to_disk_err_pct
(not fitted on): <without> -> <with>`` and ``big_disk_write_err_pct: <without> -> <with>``.

    python3 benchmarks/replay_transfers.py [--traces ../shared/traces/agentic-coding/sessions]
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

# (run folder under docs/runs, the session files of its slice, extra config overrides, ran
# with the fill kernel in parts)
RUNS = [
    ("h200-agentic-slice-calibrated-2026-11-29-2324", (1, 2, 3), [], False),
    ("h200-agentic-slice-compare-calibrate-2026-11-30-0018", (1, 2, 3), [], False),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0028", (10, 11, 12), [], False),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0137", (10, 11, 12), [], False),
    ("h200-agentic-slice-compare-calibrate-2026-11-30-0144", (1, 2, 3), [], False),
    ("h200-agentic-slice-instrumented-2026-11-30-0203", (1, 2, 3), [], False),
    ("h200-agentic-slice-host-lag-2026-11-30-0308", (1, 2, 3), [], False),
    ("h200-agentic-slice-host-lag-refcheck-off-2026-11-30-0319", (1, 2, 3), ["engine.refcheck=false"], False),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0328", (10, 11, 12), [], False),
    ("h200-agentic-slice-loop-model-2026-11-30-0336", (1, 2, 3), [], False),
    ("h200-agentic-slice-fill-in-parts-2026-11-30-0420", (1, 2, 3), [], True),
    ("h200-agentic-slice-sessions-10-12-2026-11-30-0429", (10, 11, 12), [], True),
    ("h200-agentic-slice-sessions-1-3-2026-11-30-0438", (1, 2, 3), [], True),
    ("h200-agentic-slice-18-turns-2026-11-30-0450", (1, 2, 3), ["workload.max_turns=18"], True),
    ("h200-agentic-slice-sessions-10-12-calibrated-2026-11-30-0539", (10, 11, 12), [], True),
    ("h200-agentic-slice-sessions-1-3-loop-disk-2026-11-30-0559", (1, 2, 3), [], True),
    ("h200-agentic-slice-sessions-10-12-loop-disk-2026-11-30-0605", (10, 11, 12), [], True),
    ("h200-agentic-slice-sessions-10-12-calibrated-2026-11-30-0612", (10, 11, 12), [], True),
]
FITTED_ON = "h200-agentic-slice-fill-in-parts-2026-11-30-0420"  # loop.transfer's one run
DISK_MEASURED_ON = "h200-agentic-slice-sessions-10-12-calibrated-2026-11-30-0539"  # loop.disk measured on
BIG = 500  # pages: a big disk batch


def _p50(log, src, dst, pages=1):
    xs = [r["seconds"] for r in log if r["src"] == src and r["dst"] == dst and r["pages"] == pages]
    return statistics.median(xs) if xs else None


def _err(sim, hw):
    return None if sim is None or hw is None else (sim - hw) / hw


def _big_writes_err(sim_log, hw_log):
    """Median error of the big disk writes, matched in order (both sides write the same
    big batches, one for one, as long as their page counts agree within 5%)."""
    big = lambda log: [r for r in log if r["dst"] == "disk" and r["pages"] >= BIG]  # noqa: E731
    errs = [(s["seconds"] - h["seconds"]) / h["seconds"] for s, h in zip(big(sim_log), big(hw_log))
            if s["src"] == h["src"] and abs(s["pages"] - h["pages"]) <= 0.05 * h["pages"]]
    return statistics.median(errs) if errs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=str(SESSIONS))
    a = ap.parse_args()
    committed = load_profile("h200-pcie-calibrated")
    lp = committed.loop
    if not (lp.transfer > 0 and lp.disk > 0 and committed.nvme.rewrite):
        raise SystemExit("the committed calibrated profile lacks loop.transfer, loop.disk or nvme.rewrite")
    ratio = committed.nvme.rewrite / committed.nvme.write
    print(f"loop.transfer {lp.transfer * 1e6:.1f} us; loop.disk {lp.disk * 1e6:.1f} us; "
          f"nvme.rewrite = write x {ratio:.3f}")
    print("| run | 1-page GPU -> host p50 | big disk writes, median | 1-page host -> disk p50 | TTFT p50 | TTFT p90 |")
    print("| --- | --- | --- | --- | --- | --- |")
    one, big, disk1 = ({"without": [], "with": []} for _ in range(3))
    with tempfile.TemporaryDirectory() as tmp:
        for run, sessions, sets, new_fill in RUNS:
            folder = ROOT / "docs" / "runs" / run
            trace = session_slice(tmp, sessions, a.traces)
            cfg = slice_config(sets)
            hw, hw_log, _ = saved_hw(folder, cfg)
            base = hw.profile or committed
            cols: list[list[float | None]] = []
            own_rw = base.nvme.rewrite or base.nvme.write * ratio
            for label, lt, ld, rw in (("without", 0.0, 0.0, None), ("with", lp.transfer, lp.disk, own_rw)):
                prof = base.model_copy(update={"loop": base.loop.model_copy(update={"transfer": lt, "disk": ld}),
                                               "nvme": base.nvme.model_copy(update={"rewrite": rw})})
                report, _ = compare_saved(cfg, folder, str(trace), profile=prof)
                sim_log, m = report["logs"]["sim"], report["metrics"]
                row = [_err(_p50(sim_log, "gpu", "host"), _p50(hw_log, "gpu", "host")),
                       _big_writes_err(sim_log, hw_log),
                       _err(_p50(sim_log, "host", "disk"), _p50(hw_log, "host", "disk")),
                       m["ttft_p50_s"]["rel_err"], m["ttft_p90_s"]["rel_err"]]
                cols.append(row)
                if new_fill and run != FITTED_ON and row[0] is not None:
                    one[label].append(row[0])
                if row[1] is not None:
                    big[label].append(row[1])
                if run != DISK_MEASURED_ON and row[2] is not None:
                    disk1[label].append(row[2])
            cell = lambda i: " -> ".join("-" if c[i] is None else f"{c[i] * 100:+.1f}%" for c in cols)  # noqa: E731
            tag = "" if new_fill else " (older fill)"
            tag += " (loop.transfer fitted on)" if run == FITTED_ON else ""
            tag += " (loop.disk measured on)" if run == DISK_MEASURED_ON else ""
            print(f"| {run.removeprefix('h200-agentic-slice-')}{tag} | {cell(0)} | {cell(1)} | {cell(2)} | "
                  f"{cell(3)} | {cell(4)} |", flush=True)
    med = lambda xs: statistics.median(xs) * 100  # noqa: E731
    print(f"one_page_gpu_to_host_err_pct (runs after the fill change, not fitted on): "
          f"{med(one['without']):+.1f} -> {med(one['with']):+.1f}")
    print(f"one_page_host_to_disk_err_pct (not fitted on): "
          f"{med(disk1['without']):+.1f} -> {med(disk1['with']):+.1f}")
    print(f"big_disk_write_err_pct: {med(big['without']):+.1f} -> {med(big['with']):+.1f}")


if __name__ == "__main__":
    main()
