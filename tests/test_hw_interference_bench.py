"""benchmarks/hw_interference.py: its CPU smoke run goes through the measurement and
prints the sim's prediction of each full-size cell (hw n/a); its grid; a saved run is
re-predicted offline; the within rule."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import hw_interference  # noqa: E402

from kvsim.config.hardware import load_profile  # noqa: E402
from kvsim.tools.fit import predict_cell  # noqa: E402
from kvsim_backends.hw.interfere import (LENGTHS, SPLIT_D2H_CTAS, SWEEP_CTAS, default_grid,  # noqa: E402
                                         full_grid, lengths_grid, split_grid, sweep_grid)


def test_the_default_grid_is_about_fifty_cells_of_every_kind_path_and_direction():
    g = default_grid()
    assert len(g) == 48 and len(full_grid()) == 192
    assert {c.kind for c in g} == {"gemm", "memory", "mix"}
    for kind in ("gemm", "memory", "mix"):
        mine = [c for c in g if c.kind == kind]
        assert {c.path for c in mine} == {"sm_kernel", "copy_engine"}
        assert {c.dir for c in mine} == {"h2d", "d2h", "both"}
        assert {c.compute_s for c in mine} == {0.002, 0.01, 0.02, 0.05}
    assert {c.page for c in g} == {16 << 10, 64 << 10, 1 << 20, 4 << 20}
    assert min(c.dir_bytes for c in g) == 64 << 20 and max(c.dir_bytes for c in g) == 2 << 30


def test_the_sweep_runs_the_sm_kernel_one_way_at_each_cta_count_under_each_kind():
    g = sweep_grid()
    assert len(g) == 54 and {c.sm_ctas for c in g} == set(SWEEP_CTAS)
    for kind in ("gemm", "memory", "mix"):
        for d in ("h2d", "d2h"):
            mine = [c for c in g if c.kind == kind and c.dir == d]
            assert sorted(c.sm_ctas for c in mine) == sorted(SWEEP_CTAS)
            # 512 MiB a CTA (5 GiB at most): at 10 GB/s a CTA, longer than the 40 ms compute
            assert all(c.path == "sm_kernel" and c.compute_s == 0.04 for c in mine)
            assert all(c.dir_bytes == min(5 << 30, c.sm_ctas * (512 << 20)) for c in mine)
    assert "14 CTAs" in [c for c in g if c.sm_ctas == 14][0].name


def test_the_split_grid_runs_both_ways_at_each_gpu_to_host_count_under_each_kind():
    g = split_grid()
    assert len(g) == 24 and {c.sm_ctas_d2h for c in g} == set(SPLIT_D2H_CTAS) == {4, 8}
    assert all(c.path == "sm_kernel" and c.dir == "both" and c.sm_ctas is None
               and c.compute_s == 0.02 for c in g)
    for kind in ("gemm", "memory", "mix"):
        mine = [c for c in g if c.kind == kind]
        assert sorted((c.page, c.sm_ctas_d2h) for c in mine) == sorted(
            (p, d) for p in (16 << 10, 64 << 10, 1 << 20, 4 << 20) for d in (4, 8))
    assert g[0].name.endswith(", 4 GPU -> host CTAs")


def test_the_lengths_grid_meets_each_copy_at_every_length_under_each_kind():
    g = lengths_grid()
    assert len(g) == 45 and LENGTHS == (0.001, 0.002, 0.005, 0.01, 0.02)
    copies = {(c.path, c.dir, c.page, c.dir_bytes) for c in g}
    assert copies == {("sm_kernel", "both", 16 << 10, 256 << 20), ("sm_kernel", "d2h", 64 << 10, 256 << 20),
                      ("copy_engine", "both", 16 << 10, 256 << 20)}
    for copy in copies:
        for kind in ("gemm", "memory", "mix"):
            mine = [c for c in g if (c.path, c.dir, c.page, c.dir_bytes) == copy and c.kind == kind]
            assert sorted(c.compute_s for c in mine) == list(LENGTHS)
    assert all(c.sm_ctas is None and c.sm_ctas_d2h is None for c in g)  # (the backend's own)


def test_one_grid_at_a_time(capsys):
    with pytest.raises(SystemExit) as e:
        hw_interference.main(["--split", "--lengths", "--device", "cpu"])
    assert e.value.code == 2 and "one grid at a time" in capsys.readouterr().err


def test_a_split_cell_runs_and_is_predicted_at_its_gpu_to_host_count(tmp_path):
    """A CPU run of the split grid's first cell records 4 GPU -> host CTAs beside the
    backend's own host -> GPU count; the sim predicts it at those CTAs: its GPU -> host
    batch at 16 KiB ends later than the same cell's at 8 CTAs."""
    from kvsim.tools.fitkinds import cell_work, sim_cell

    out = tmp_path / "split.json"
    hw_interference.main(["--split", "--device", "cpu", "--reps", "1", "--gap", "0",
                          "--part", "1/24", "--json", str(out)])
    cell = json.loads(out.read_text())["cells"][0]
    assert cell["sm_ctas_d2h"] == 4 and cell["page"] == 16 << 10 and cell["dir"] == "both"
    assert cell["ctas"]["d2h"] == 4 and cell["ctas"]["h2d"] > 8  # (the backend's own: 36)
    prof = load_profile(hw_interference.PROFILE)
    ends = {}
    for n in (4, 8):
        c = {**cell, "device": "gpu", "ctas": {**cell["ctas"], "d2h": n}}
        ends[n] = {}
        sim_cell(prof, c, c["compute_s"], cell_work(c), dir_s=ends[n])
    assert ends[4]["d2h"] > ends[8]["d2h"]


def test_the_sim_runs_a_cell_with_its_own_cta_count():
    """A saved sweep cell's ``sm_ctas`` reaches the sim: 1 MiB pages GPU -> host with 2
    CTAs move at the CTAs' rate, with 14 at the link's; the two are not one cell's
    repeats when several runs are compared."""
    from kvsim.tools.fitkinds import kind_works

    prof = load_profile(hw_interference.PROFILE)
    work = list(kind_works(prof)["memory"])
    base = {"kind": "memory", "compute_s": 0.04, "path": "sm_kernel", "dir": "d2h",
            "page": 1 << 20, "dir_bytes": 256 << 20, "batches": [["d2h", 256]], "work": work,
            "stretch": 0.0, "spread": 0.0, "alone_s": 0.04, "device": "gpu"}
    _, few = predict_cell(prof, {**base, "sm_ctas": 2})
    _, many = predict_cell(prof, {**base, "sm_ctas": 14})
    per_cta = prof.sm.cta_rate("d2h", 1 << 20) * prof.sm.interference.busy_eff()[1]
    assert (256 << 20) / few < 2.05 * per_cta  # (under the compute: the CTAs' busy rate)
    assert many < few / 2 and (256 << 20) / many > 0.8 * prof.sm_ceiling("d2h")  # (the link's)
    got = hw_interference.against_runs([{**base, "sm_ctas": 2}, {**base, "sm_ctas": 14}], prof)
    assert got == {}  # one run of each: nothing to compare


def test_cpu_run_prints_the_sims_cells_and_saves_them(tmp_path, capsys):
    out = tmp_path / "run.json"
    hw_interference.main(["--device", "cpu", "--reps", "1", "--gap", "0", "--part", "1/16",
                          "--json", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "hw_interference_sim_within: n/a (cpu)"
    rows = [x for x in lines if x.startswith("| ") and "| n/a |" in x]
    assert len(rows) == 3  # cells 1, 17, 33 of 48
    saved = json.loads(out.read_text())["cells"]
    assert [c["device"] for c in saved] == ["cpu"] * 3
    assert [c["plan"] for c in saved] == [None] * 3  # (no stand-in on numpy)
    # each direction's batch timed apart, the copy as long as the later of them
    for c in saved:
        dirs = {"both": {"h2d", "d2h"}}.get(c["dir"], {c["dir"]})
        assert set(c["copy_dir_s"]) == dirs
        assert max(c["copy_dir_s"].values()) == pytest.approx(c["copy_s"])  # (one rep)
        assert all(0.0 < v for v in c["copy_dir_s"].values())
    # the sim column is the sim's prediction of the full-size cell
    prof = load_profile(hw_interference.PROFILE)
    sim, _ = predict_cell(prof, saved[0], nominal=True)
    assert f"| {sim * 100:+.1f}% |" in rows[0]
    # offline, the same table again
    hw_interference.main(["--sim-from", str(out)])
    assert capsys.readouterr().out.strip().splitlines()[-1] == "hw_interference_sim_within: n/a (cpu)"


@pytest.mark.parametrize("name", ["gpu.json", "gpu.json.gz"])
def test_a_saved_gpu_run_is_re_predicted_and_counted(tmp_path, capsys, name):
    """Two GPU cells, one the sim gets within 10% and one it does not; --sim-from counts
    (a run kept gzipped, ``.json.gz``, read as it is)."""
    import gzip
    prof = load_profile(hw_interference.PROFILE)
    base = json.loads(json.dumps(_cpu_cell(tmp_path)))
    base["device"] = "gpu"
    sim, _ = predict_cell(prof, base)
    good = {**base, "stretch": sim * 1.05, "spread": 0.0}
    bad = {**base, "stretch": sim + 0.5, "spread": 0.01}
    p = tmp_path / name
    with (gzip.open(p, "wt") if name.endswith(".gz") else open(p, "w")) as f:
        json.dump({"cells": [good, bad]}, f)
    hw_interference.main(["--sim-from", str(p)])
    assert capsys.readouterr().out.strip().splitlines()[-1] == "hw_interference_sim_within: 1 of 2"


def test_cells_of_several_runs_against_hws_own_repeatability(tmp_path, capsys):
    """The same GPU cell in three runs (a calibrate report and two saved runs): the sim's
    distance from hw's median over them beside the runs' own mean distance."""
    base = {**_cpu_cell(tmp_path), "device": "gpu"}
    prof = load_profile(hw_interference.PROFILE)
    sim, _ = predict_cell(prof, base)
    runs = [sim + 0.02, sim + 0.04, sim + 0.09]  # median sim + 0.04; runs 0.02, 0, 0.05 from it
    paths = []
    for i, st in enumerate(runs):
        p = tmp_path / f"r{i}.json"
        cells = [{**base, "stretch": st, "spread": 0.0}]
        p.write_text(json.dumps({"interference": cells} if i == 0 else {"cells": cells}))
        paths.append(str(p))
    got = hw_interference.against_runs([{**base, "stretch": st, "spread": 0.0} for st in runs], prof)
    assert got == {base["kind"]: pytest.approx((0.04, 0.07 / 3, 1))}
    hw_interference.main(["--sim-from", *paths])
    lines = capsys.readouterr().out.strip().splitlines()
    k = sum(hw_interference.within(st, 0.0, sim) for st in runs)
    assert lines[-5].startswith("by kind, path and direction, the sim within / the median of the "
                                "other runs within, of the cells measured in several runs: "
                                f"{base['kind']} {base['path']} {base['dir']} {k} / ")
    assert lines[-1] == f"hw_interference_sim_within: {k} of 3"
    assert lines[-4] == (f"{base['kind']}: over 1 cells measured in several runs, the sim 4.00 points of "
                         f"stretch from hw's median, hw's runs 2.33 (x1.71)")
    # each run judged with each other run's stretch as its prediction, beside the sim's
    pairs = sum(hw_interference.within(a, 0.0, b) for a in runs for b in runs if b is not a)
    med = sum(hw_interference.within(a, 0.0, statistics.median([b for b in runs if b is not a]))
              for a in runs)
    assert hw_interference.repeat_within(
        [{**base, "stretch": st, "spread": 0.0} for st in runs], prof) == (pairs, 6, med, k, 3)
    assert lines[-3] == (f"{base['kind']}: another run's hw within for {pairs / 6:.0%} of pairs, the median "
                         f"of the other runs {med / 3:.0%}, the sim {k / 3:.0%} ({k} of 3 cells)")
    assert lines[-2] == (f"over the cells measured in several runs: another run's hw within {pairs} of 6 "
                         f"({pairs / 6:.0%}), the median of the other runs within {med} of 3 "
                         f"({med / 3:.0%}), the sim within {k} of 3 ({k / 3:.0%})")
    # one run: nothing to judge repeatability by
    assert hw_interference.against_runs([{**base, "stretch": 0.1, "spread": 0.0}], prof) == {}


def test_each_run_of_a_cell_is_predicted_with_its_own_copy_lead(tmp_path):
    """Two runs of one cell whose copies started at different times after the compute:
    the sim's distance from hw's median is the mean of each run's own prediction's, not
    the first run's taken for both."""
    base = {**_cpu_cell(tmp_path), "device": "gpu", "compute_s": 0.002, "spread": 0.0}
    prof = load_profile(hw_interference.PROFILE)
    early, late = {**base, "copy_lead_s": 0.0}, {**base, "copy_lead_s": 0.0015}
    p0, p1 = predict_cell(prof, early)[0], predict_cell(prof, late)[0]
    assert p0 != p1  # (a copy that starts later slows less of the compute)
    runs = [{**early, "stretch": 0.10}, {**late, "stretch": 0.20}]
    got = hw_interference.against_runs(runs, prof)
    med = 0.15
    assert got == {base["kind"]: pytest.approx(((abs(p0 - med) + abs(p1 - med)) / 2, 0.05, 1))}


def test_the_median_of_the_other_runs_is_judged_as_a_prediction(tmp_path):
    """Four runs of one cell, one far off: each run judged by the median of the other
    three; the three close runs each find theirs within 10%, the far one not; of the 12
    ordered pairs, each close run has the other two close ones within (6)."""
    base = {**_cpu_cell(tmp_path), "device": "gpu", "spread": 0.0}
    prof = load_profile(hw_interference.PROFILE)
    rows = [{**base, "stretch": st} for st in (0.10, 0.101, 0.102, 0.30)]
    hw, pairs, med, _, cells = hw_interference.repeat_within(rows, prof)
    assert (hw, pairs, med, cells) == (6, 12, 3, 4)


def test_repeatability_is_counted_per_kind_and_sums_to_the_whole(tmp_path):
    """Two kinds, each a cell measured by three runs: each kind's counts are its own
    cells' (as ``repeat_within`` counts one kind alone), and the totals their sums."""
    base = {**_cpu_cell(tmp_path), "device": "gpu", "spread": 0.0}
    prof = load_profile(hw_interference.PROFILE)
    close = [{**base, "kind": "memory", "stretch": st} for st in (0.10, 0.101, 0.30)]
    apart = [{**base, "kind": "gemm", "stretch": st} for st in (0.10, 0.20, 0.40)]
    per = hw_interference.repeat_within_kinds(close + apart, prof)
    assert set(per) == {"memory", "gemm"}
    assert per["memory"] == hw_interference.repeat_within(close, prof)
    assert per["gemm"] == hw_interference.repeat_within(apart, prof)
    # memory: the two close runs find each other (2 of 6 pairs); gemm: no pair within
    assert per["memory"][:2] == (2, 6) and per["gemm"][:2] == (0, 6)
    assert hw_interference.repeat_within(close + apart, prof) == tuple(
        a + b for a, b in zip(per["memory"], per["gemm"]))
    # grouped by any part of a cell's key (the benchmark prints kind, path and direction)
    assert hw_interference.repeat_within_kinds(close + apart, prof, lambda k: "all") == {
        "all": hw_interference.repeat_within(close + apart, prof)}
    by_path = hw_interference.repeat_within_kinds(close + apart, prof, lambda k: f"{k[0]} {k[2]} {k[3]}")
    assert by_path == {f"memory {base['path']} {base['dir']}": per["memory"],
                       f"gemm {base['path']} {base['dir']}": per["gemm"]}


def test_leave_one_run_out_predicts_each_run_by_the_terms_fitted_to_the_others(
        tmp_path, capsys, monkeypatch):
    """--loo: three runs of one cell, each fold fitted to the other two (the fit here gives
    back the profile's own terms), each run's cell by its fold's profile; the distance
    from hw's median by each run's own prediction."""
    base = {**_cpu_cell(tmp_path), "device": "gpu"}
    prof = load_profile(hw_interference.PROFILE)
    sim, _ = predict_cell(prof, base)
    runs = [sim + 0.02, sim + 0.04, sim + 0.09]
    paths = []
    for i, st in enumerate(runs):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps({"cells": [{**base, "stretch": st, "spread": 0.0}]}))
        paths.append(str(p))
    trained = []
    own = prof.model_dump()["sm"]["interference"]

    def fit(rows, profile):
        trained.append(sorted(r["stretch"] for r in rows))
        return {"gemm": own["gemm"], "memory": own["memory"]}, {}
    monkeypatch.setattr(hw_interference, "fit_interference", fit)
    hw_interference.main(["--sim-from", *paths, "--loo"])
    assert trained == [sorted(runs[1:]), sorted([runs[0], runs[2]]), sorted(runs[:2])]
    lines = capsys.readouterr().out.strip().splitlines()
    k = sum(hw_interference.within(st, 0.0, sim) for st in runs)
    assert lines[-1] == f"hw_interference_loo_within: {k} of 3"
    assert lines[-2].endswith("the sim 4.00 points of stretch from hw's median, hw's runs 2.33 (x1.71)")
    # each run's own prediction: the mean of their distances from the median
    rows = [{**base, "stretch": st, "spread": 0.0} for st in runs]
    got = hw_interference.against_runs(rows, prof, [sim + 0.04, sim, sim + 0.10])
    assert got == {base["kind"]: pytest.approx(((0.0 + 0.04 + 0.06) / 3, 0.07 / 3, 1))}
    with pytest.raises(SystemExit):
        hw_interference.main(["--sim-from", paths[0], "--loo"])  # one run: nothing to leave out


def _cpu_cell(tmp_path):
    out = tmp_path / "one.json"
    hw_interference.main(["--device", "cpu", "--reps", "1", "--gap", "0", "--part", "2/48",
                          "--json", str(out)])
    return json.loads(out.read_text())["cells"][0]


@pytest.mark.parametrize("hw, spread, sim, ok", [(0.40, 0.0, 0.43, True), (0.40, 0.0, 0.45, False),
                                                 (0.01, 0.02, 0.025, True), (0.0, 0.0, 0.001, False)])
def test_within_ten_percent_or_hws_own_spread(hw, spread, sim, ok):
    assert hw_interference.within(hw, spread, sim) is ok


def test_a_file_that_is_not_a_run_is_refused(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text('{"copies": []}')
    with pytest.raises(SystemExit) as e:
        hw_interference.main(["--sim-from", str(p)])
    assert e.value.code == 2 and f"--sim-from {p}: not a saved" in capsys.readouterr().err
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"cells": [_cpu_cell(tmp_path)]}))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:   # (the option that named the file, in the error)
        hw_interference.main(["--sim-from", str(run), "--leads-from", str(p)])
    assert e.value.code == 2 and f"--leads-from {p}: not a saved" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        hw_interference.main(["--leads-from", str(run)])
    assert e.value.code == 2 and "only with --sim-from" in capsys.readouterr().err


from gpuskip import have_gpu  # noqa: E402


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_cells_measure_the_compute_alone_and_with_the_copy():
    """Two cells on the GPU, two reps each: the compute alone lasts about what was asked
    (the stand-in; a GEMM after idle up to the power state's boost shorter), the copy moves at a plausible rate, the stretch is the medians' ratio."""
    from kvsim.run.seam import settings_for
    from kvsim.tools.fitkinds import kind_works
    from kvsim_backends.hw.interfere import Cell, measure_cells

    prof = load_profile(hw_interference.PROFILE)
    cells = [Cell("gemm", 0.02, "sm_kernel", "both", 64 << 10, 256 << 20),
             Cell("memory", 0.01, "copy_engine", "h2d", 1 << 20, 256 << 20)]
    rows = measure_cells(lambda pb, slots, **kw: settings_for(pb, slots, prof, model="llama-3-8b", **kw),
                         cells, kind_works(prof), "gpu", reps=2, gap_s=0.05)
    # a GEMM-bound compute after the cells' idle gap runs short by the GPU's power state, at
    # most to what the profile's boost gives from idle (x0.878 on the H200: 17.5 ms for
    # 20 ms there, 2026-12-03 11:41); memory-bound work is not power-bound
    b = prof.compute.boost
    fastest = (1 + b.gain * b.calibrated) / (1 + b.gain) if b is not None else 1.0
    for c, r in zip(cells, rows):
        assert r["device"] == "gpu" and r["kind"] == c.kind
        low = 0.9 * c.compute_s * (fastest if c.kind == "gemm" else 1.0)
        assert low < r["alone_s"] < 1.1 * c.compute_s, r
        assert 10e9 < r["bytes"] / r["copy_s"] < 120e9, r
        assert r["stretch"] == pytest.approx(r["with_s"] / r["alone_s"] - 1)
        assert r["spread"] >= 0 and len(r["with_reps"]) == 2
    # the stand-in's plan: a 4096-token prefill's 20 ms as GEMM chains at M <= 4096
    plan = rows[0]["plan"]
    assert plan["gemms"] and all(m <= 4096 and k >= 1 for m, k in plan["gemms"])
    assert set(plan["chain_s"]) and plan["read_s"] >= 0


def test_the_profile_gives_the_measured_hinge_of_reads_beside_waiting_ctas():
    """An H200's sweep (19:39): a step of HBM reads beside 1-8 GPU -> host SM-kernel
    CTAs ran at most 2% longer, beside 14-66 CTAs 35-190% (the CTAs beyond those the link
    drains). The shipped profile gives that hinge: under 10% to 8 CTAs, 15% and more
    from 14, growing with the CTAs, each within 55% of hw's from 14 on (three machines
    gave 72%, 77% and 108% at 24 CTAs, the 2026-12-04 13:31 one 79.5%). (The terms
    refitted 2026-12-04 20:00 give 19.6% at 14 CTAs and 51.7% at 24, those of 17:45
    19.5% and 51.5%, the terms before them 27.9% and 74.6%: the split grids' reads beside
    8 GPU -> host CTAs both ways, +10-13% on hw, pull the waiting CTAs' term down.)"""
    rows = json.loads((ROOT / "tests/fixtures/h200-cta-sweep-reads-2026-12-03.json").read_text())["cells"]
    prof = load_profile(hw_interference.PROFILE)
    got = [(r["sm_ctas"], r["stretch"], predict_cell(prof, r)[0]) for r in rows]
    assert [c for c, _, _ in got] == [1, 2, 4, 8, 14, 24, 36, 50, 66]
    for ctas, hw, sim in got:
        if ctas <= 8:
            assert hw < 0.02 and sim < 0.10, (ctas, hw, sim)
        else:
            assert hw > 0.3 and sim > 0.15 and abs(sim - hw) < 0.55 * hw, (ctas, hw, sim)
    sims = [s for _, _, s in got]
    assert sims == sorted(sims)


def test_both_ways_cells_show_each_directions_end_beside_the_sims(tmp_path, capsys):
    """A saved GPU cell both ways with each direction's batch timed (``copy_dir_s``): the
    table is followed by hw's and the sim's end of each direction's batch."""
    from kvsim.tools.fitkinds import cell_work, sim_cell

    prof = load_profile(hw_interference.PROFILE)
    cell = {**_cpu_cell(tmp_path), "device": "gpu", "stretch": 0.1, "spread": 0.0}
    assert cell["dir"] == "both"
    both = {**cell, "copy_dir_s": {"h2d": 0.0123, "d2h": 0.0456}}
    del cell["copy_dir_s"]  # (a run from before the directions were timed apart)
    p = tmp_path / "both.json"
    p.write_text(json.dumps({"cells": [cell, both]}))
    hw_interference.main(["--sim-from", str(p)])
    out = capsys.readouterr().out.splitlines()
    i = out.index("both ways, each direction's batch to its end, ms (hw / sim):")
    sim_dir: dict = {}
    sim_cell(prof, both, both["compute_s"], cell_work(both), dir_s=sim_dir)
    assert set(sim_dir) == {"h2d", "d2h"} and all(v > 0 for v in sim_dir.values())
    assert out[i + 1].endswith(f"h2d 12.3 / {sim_dir['h2d'] * 1e3:.1f}, d2h 45.6 / {sim_dir['d2h'] * 1e3:.1f}")
    assert len([x for x in out[i + 1:] if x.startswith("- ")]) == 1  # none for the older cell


def test_each_directions_end_is_counted_within_ten_percent_of_hws(tmp_path, capsys):
    """Both ways: the sim's end of each direction against hw's, counted within 10% per
    direction (host -> GPU 5% off: within; GPU -> host twice as long: not)."""
    from kvsim.tools.fitkinds import cell_work, sim_cell

    prof = load_profile(hw_interference.PROFILE)
    cell = {**_cpu_cell(tmp_path), "device": "gpu", "stretch": 0.1, "spread": 0.0}
    sim_dir: dict = {}
    sim_cell(prof, cell, cell["compute_s"], cell_work(cell), dir_s=sim_dir)
    cell["copy_dir_s"] = {"h2d": sim_dir["h2d"] * 1.05, "d2h": sim_dir["d2h"] * 2.0}
    p = tmp_path / "both.json"
    p.write_text(json.dumps({"cells": [cell]}))
    hw_interference.main(["--sim-from", str(p)])
    out = capsys.readouterr().out.splitlines()
    assert ("each direction's end both ways, the sim's against hw's: h2d: 1 of 1 within 10%; "
            "d2h: 0 of 1 within 10%") in out


def test_fitted_terms_keep_each_kinds_other_keys():
    """``--fit`` and ``--loo`` predict with the profile's kinds' other keys (the GEMM
    kind's busy shares) and the fitted terms over them, as a profile written from the
    fit would."""
    base = load_profile("h200-pcie-calibrated")
    g = base.sm.interference.gemm
    assert g.busy_cta_efficiency is not None
    fitted = hw_interference.with_terms(base, {"gemm": {"straggle_h2d": 0.5}, "memory": {"hbm_weight": 0.25}})
    fg, fm = fitted.sm.interference.gemm, fitted.sm.interference.memory
    assert fg.straggle_h2d == 0.5 and fm.hbm_weight == 0.25
    assert (fg.busy_cta_efficiency, fg.busy_cta_efficiency_d2h) == (g.busy_cta_efficiency, g.busy_cta_efficiency_d2h)
    assert fg.backlog_d2h == g.backlog_d2h and fm.hbm_write_weight == base.sm.interference.memory.hbm_write_weight


def test_a_step_of_two_parts_is_timed_part_by_part():
    """Three reps of a step whose GEMM part hw timed apart (ms): each part's stretch is
    the medians' ratio, its spread half the range of each rep over the median alone, the
    reads' part a rep's time less its GEMM part's."""
    from kvsim_backends.hw.interfere import _parts
    alone, ga = [10.0, 10.2, 9.8], [4.0, 4.1, 3.9]
    with_, gw = [12.0, 12.4, 11.8], [5.0, 5.2, 4.8]
    got = _parts(alone, with_, ga, gw)
    assert got["gemm_part_stretch"] == pytest.approx(5.0 / 4.0 - 1)
    assert got["gemm_part_spread"] == pytest.approx((5.2 - 4.8) / 4.0 / 2)
    # reads alone 6.0, 6.1, 5.9 (median 6.0); with the copy 7.0, 7.2, 7.0 (median 7.0)
    assert got["reads_part_stretch"] == pytest.approx(7.0 / 6.0 - 1)
    assert got["reads_part_spread"] == pytest.approx((7.2 - 7.0) / 6.0 / 2)
    assert got["gemm_part_alone_reps"] == ga and got["gemm_part_with_reps"] == gw
    # a step of one part (or CPU mode, no stand-in) has none
    assert _parts(alone, with_, [None] * 3, [None] * 3) == {} and _parts([], [], [], []) == {}


def test_a_cpu_cell_has_no_parts(tmp_path):
    assert not any(k.endswith("_part_stretch") for k in _cpu_cell(tmp_path))
