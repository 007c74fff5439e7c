"""benchmarks/hw_copy.py: its CPU smoke run prints the sim's prediction of every cell (hw
n/a), and the arithmetic behind its table (medians and spreads over rounds, the
interference the busy cells imply) on hand-built cells."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hw_copy  # noqa: E402

from kvsim.fit import sim_cell  # noqa: E402
from kvsim.hardware import load_profile  # noqa: E402

MiB = 1 << 20


def _cell(path, d, seconds, **kw):
    n = 512
    k = 2 if d == "both" else 1
    bs = [["h2d", n], ["d2h", n]] if d == "both" else [[d, n]]
    return {"page": MiB, "path": path, "dir": d, "pages": n * k, "bytes": n * k * MiB,
            "seconds": seconds, "batches": bs, "ctas": {"h2d": 36, "d2h": 14}, **kw}


def test_cpu_run_prints_sim_cells_and_na_hw(capsys):
    hw_copy.main(["--device", "cpu", "--sizes", "1MiB", "--rounds", "2", "--reps", "1",
                  "--cpu-pages", "4"])
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[-1] == "hw_copy_min_GBps: n/a (cpu)"
    rows = [x for x in lines if x.startswith("| 1 MiB |")]
    assert len(rows) == 6  # two paths x three directions
    p = load_profile(hw_copy.PROFILE)
    ce = next(r for r in rows if "| copy_engine | h2d |" in r).split("|")
    # idle sim column: the sim's own prediction of a 1 GiB batch of 1 MiB pages
    c = {"page": MiB, "path": "copy_engine", "dir": "h2d", "pages": 1024, "bytes": 1024 * MiB,
         "batches": [["h2d", 1024]]}
    want = 1024 * MiB / sim_cell(p, c)[0] / 1e9
    assert float(ce[6]) == pytest.approx(want, abs=0.05)
    assert ce[4].strip() == "n/a" and ce[7].strip() == "n/a"  # hw and ratio


def test_median_rounds_gives_median_time_and_spread():
    rounds = [[_cell("sm_kernel", "h2d", s, busy_s=0.1, compute_s=c)]
              for s, c in ((0.020, 0.11), (0.022, 0.12), (0.021, 0.10))]
    med, spread = hw_copy.median_rounds(rounds)
    assert med[0]["seconds"] == pytest.approx(0.021)
    assert med[0]["compute_s"] == pytest.approx(0.11)
    assert spread[0]["spread"] == pytest.approx(0.002 / 0.021)
    assert spread[0]["compute_spread"] == pytest.approx(0.02 / 0.11)


def test_interference_fit_inverts_the_sim_model():
    """Cells made by the sim itself with known interference give those values back."""
    p = load_profile(hw_copy.PROFILE)
    cells = []
    for path, d in (("sm_kernel", "h2d"), ("sm_kernel", "d2h"), ("copy_engine", "h2d")):
        c = _cell(path, d, 0.0, busy_s=0.2)
        copy_s, took = sim_cell(p, c, 0.2)
        cells.append({**c, "seconds": copy_s, "compute_s": took})
    fit = hw_copy.interference_fit(cells, p)
    i = p.sm.interference
    assert fit["sm_kernel_slowdown"] == pytest.approx(i.sm_kernel_slowdown, rel=0.02)
    assert fit["copy_engine_slowdown"] == pytest.approx(i.copy_engine_slowdown, rel=0.02)
    # h2d: 36 CTAs x 3.1 GB/s x 0.4 = 44.7 GB/s, below the SM ceiling: the efficiency shows
    assert fit["busy_cta_efficiency"] == pytest.approx(i.busy_cta_efficiency, rel=0.03)
