"""benchmarks/hw_copy.py: its CPU smoke run prints the sim's prediction of every cell (hw
n/a), and the arithmetic behind its table (medians and spreads over rounds, the
interference the busy cells imply) on hand-built cells."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hw_copy  # noqa: E402

from kvsim.tools.fit import sim_cell  # noqa: E402
from kvsim.config.hardware import load_profile  # noqa: E402

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
    p = load_profile(hw_copy.PROFILE)
    assert len(rows) == 9  # two paths and the default (the rule's, batch by batch) x three directions
    # both ways on the default path: the sim's prediction of the rule's own pair (1 MiB:
    # host -> GPU alone on the copy engine, then GPU -> host beside it)
    both = next(r for r in rows if "| default | both |" in r).split("|")
    c = {"page": MiB, "path": "default", "dir": "both", "pages": 2048, "bytes": 2048 * MiB,
         "batches": [["h2d", 1024], ["d2h", 1024]]}
    assert float(both[6]) == pytest.approx(2048 * MiB / sim_cell(p, c)[0] / 1e9, abs=0.05)
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


def _with(p, **interference):
    from kvsim.config.hardware import HardwareProfile  # noqa: PLC0415

    d = p.model_dump()
    d["sm"]["interference"].update(interference)
    return HardwareProfile.model_validate(d)


@pytest.mark.parametrize("eff", [0.3, 1.0])
def test_interference_fit_inverts_the_sim_model(eff):
    """Cells made by the sim itself with known interference give those values back: the
    per-CTA share where the CTAs bound the rate (0.3: 36 x 3.1 x 0.3 = 34 GB/s, below the
    SM ceiling), a lower bound at the ceiling where they do not (1.0), and the later start."""
    # (one share both ways: the printed fit reports one)
    p = _with(load_profile(hw_copy.PROFILE), busy_cta_efficiency=eff, busy_cta_efficiency_d2h=None,
              busy_start=2e-4)
    cells, idle = [], []
    for path, d in (("sm_kernel", "h2d"), ("sm_kernel", "d2h"), ("sm_kernel", "both"),
                    ("copy_engine", "h2d")):
        c = _cell(path, d, 0.0, busy_s=0.2)
        copy_s, took = sim_cell(p, c, 0.2)
        cells.append({**c, "seconds": copy_s, "compute_s": took})
        idle.append({**c, "seconds": sim_cell(p, c)[0]})
    fit = hw_copy.interference_fit(cells, p, idle)
    i = p.sm.interference
    assert fit["sm_kernel_slowdown"] == pytest.approx(i.sm_kernel_slowdown, rel=0.02)
    assert fit["copy_engine_slowdown"] == pytest.approx(i.copy_engine_slowdown, rel=0.02)
    assert fit["busy_start"] == pytest.approx(2e-4, abs=5e-6)
    if eff < 1:
        assert fit["busy_cta_efficiency"] == pytest.approx(eff, rel=0.01)
    else:  # at the ceiling: the least share that still reaches it (h2d's 49.7 / 111.9)
        ceil = p.sm_ceiling("h2d") / (36 * p.sm.cta_rate("h2d", MiB))
        assert fit["busy_cta_efficiency"] == pytest.approx(ceil, rel=0.01)


def _saved_run(tmp_path, spread=0.01):
    """A saved run of one page size (the --json format) whose hw cells are the sim's own
    times on the shipped profile, but the busy SM-kernel h2d cell 10% slower."""
    p = load_profile(hw_copy.PROFILE)
    copies, busy, sp, bsp = [], [], [], []
    for path in ("copy_engine", "sm_kernel"):
        for d in hw_copy.DIRS:
            c = _cell(path, d, 0.0)
            copies.append({**c, "seconds": sim_cell(p, c)[0]})
            b = _cell(path, d, 0.0, busy_s=0.1)
            s = sim_cell(p, b, 0.1)[0] * (1.1 if (path, d) == ("sm_kernel", "h2d") else 1.0)
            busy.append({**b, "seconds": s, "compute_s": 0.1})
            sp.append({"page": MiB, "path": path, "dir": d, "rounds": 2, "spread": spread})
            bsp.append({**sp[-1]})
    f = tmp_path / "run.json"
    f.write_text(json.dumps({"device": "gpu", "date": "then", "batch_bytes": 512 * MiB, "copies": copies,
                             "busy_copies": busy, "spread": sp, "busy_spread": bsp}))
    return f


def test_sim_from_recomputes_the_table_of_a_saved_run(tmp_path, capsys):
    hw_copy.main(["--sim-from", str(_saved_run(tmp_path))])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("hw_copy_min_GBps: ")
    # every cell but the one made 10% slower is the sim's own
    assert "hw_copy_sim_within_5pct: 11 of 12 (cells whose hw repeats within 5%; 12 cells in all)" in lines
    row = next(x for x in lines if x.startswith("| 1 MiB | sm_kernel | h2d |")).split("|")
    assert float(row[11]) == pytest.approx(1.1, abs=0.002)  # busy sim / hw


def test_sim_from_counts_only_cells_that_repeat(tmp_path, capsys):
    hw_copy.main(["--sim-from", str(_saved_run(tmp_path, spread=0.08))])
    assert "hw_copy_sim_within_5pct: 0 of 0" in capsys.readouterr().out


def test_sim_from_several_runs_counts_cells_that_repeat_across_them(tmp_path, capsys):
    """Two saved runs: the busy SM-kernel h2d cell is 10% slower than the sim in both (it
    repeats, and is a miss); in the second run the idle copy-engine d2h cell is 20% slower
    (it does not repeat across the runs, so it is not counted)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = _saved_run(tmp_path / "a"), _saved_run(tmp_path / "b")
    data = json.loads(b.read_text())
    for c in data["copies"]:
        if (c["path"], c["dir"]) == ("copy_engine", "d2h"):
            c["seconds"] *= 1.2
    b.write_text(json.dumps(data))
    hw_copy.main(["--sim-from", str(a), str(b)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == ("hw_copy_sim_within_5pct_across_runs: 10 of 11 (cells whose hw moves at "
                         "most 5% across the 2 runs; 12 cells in all)")
    assert [x for x in lines if x.startswith("miss: ")] == [
        next(x for x in lines if x.startswith("miss: 1 MiB sm_kernel h2d busy"))]


def test_sim_from_bad_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit) as e:
        hw_copy.main(["--sim-from", str(bad)])
    assert e.value.code == 2
    assert "--sim-from" in capsys.readouterr().err


def _copy_engine_run(extra_s: float, pages_scale: float = 1.0) -> dict:
    """A saved run whose copy-engine cells are the sim's own times on a profile without
    ``busy_per_page``, the busy ones ``extra_s`` a page longer (the idle ones
    ``pages_scale`` x the sim's: an idle model error the fit must take out)."""
    p = load_profile(hw_copy.PROFILE)
    d = p.model_dump()
    d["copy_engine"].update(busy_per_page_h2d=None, busy_per_page_d2h=None)
    bare = type(p).model_validate(d)
    copies, busy = [], []
    for dr in ("h2d", "d2h"):
        c = _cell("copy_engine", dr, 0.0)
        copies.append({**c, "seconds": sim_cell(bare, c)[0] * pages_scale})
        b = _cell("copy_engine", dr, 0.0, busy_s=0.1, compute_s=0.1)
        idle_err = sim_cell(bare, c)[0] * (pages_scale - 1) / c["pages"]
        busy.append({**b, "seconds": sim_cell(bare, b, 0.1)[0] + b["pages"] * (extra_s + idle_err)})
    return {"copies": copies, "busy_copies": busy}


def test_busy_per_page_fit_gives_back_the_extra_a_page_takes_under_compute():
    """Runs whose busy copy-engine pages take 0.6 us and 0.8 us longer than the sim (one
    with its idle cells 5% slow throughout: not interference) imply their median, 0.7 us,
    each direction; a run that took less under compute is clipped to 0."""
    got = hw_copy.busy_per_page_fit([_copy_engine_run(0.6e-6), _copy_engine_run(0.8e-6, 1.05)],
                                    load_profile(hw_copy.PROFILE))
    for dr in ("h2d", "d2h"):
        assert got[dr][MiB] == pytest.approx(0.7e-6, abs=2e-9)
    got = hw_copy.busy_per_page_fit([_copy_engine_run(-0.5e-6)], load_profile(hw_copy.PROFILE))
    assert got["h2d"][MiB] == 0.0


def test_busy_picks_judges_the_rule_by_the_runs_own_cells():
    """Under a prefill's work on the shipped profile the rule puts 1 MiB pages on the copy
    engine: judged right where the copy engine's cells cost less, wrong where the SM
    kernel's cost 20% less, and right again where the two are within their spread."""
    from kvsim.tools.fitkinds import kind_works  # noqa: PLC0415

    p = load_profile(hw_copy.PROFILE)
    work = list(kind_works(p)["gemm"])

    def run(sm_cost_ratio, rounds=None):
        busy = []
        for path in ("copy_engine", "sm_kernel"):
            for dr in hw_copy.DIRS:
                s = 0.010 * (sm_cost_ratio if path == "sm_kernel" else 1.0)
                busy.append(_cell(path, dr, s, busy_s=0.1, compute_s=0.1, alone_ratio=1.0, work=work))
        return {"busy_copies": busy, "busy_rounds": rounds}

    assert hw_copy.busy_picks(run(1.5), p)[:2] == (3, 3)
    good, n, misses = hw_copy.busy_picks(run(0.8), p)
    assert (good, n) == (0, 3) and misses[0].startswith("1 MiB h2d: the rule's copy_engine")
    # the copy engine's cost moves 33% between two rounds (10 and 14 ms about their median
    # 12): the SM kernel's 25% less is within it
    d = run(0.8)
    r2 = [{**c, "seconds": c["seconds"] * (1.4 if c["path"] == "copy_engine" else 1.0)} for c in d["busy_copies"]]
    assert hw_copy.busy_picks(run(0.8, [d["busy_copies"], r2]), p)[:2] == (3, 3)
