"""``kvsim fidelity``: the fidelity standard figure by figure (``kvsim.tools.fidelity``).

Scenarios (every expectation worked out from the inputs here):
- a figure is within when the sim's error is inside its tolerance (10% TTFT, 5% bytes), or
  inside hw's own spread (the largest error of another hw run against the compared one),
  and not otherwise; with no other hw run the spread is 0;
- a figure whose hw value is 0: within where the sim's is 0 too, or another hw run's is not;
- a node of ranks: node-wide rows, then each rank's; runs of different rank counts refused;
- the CLI: a compare folder (sim/, hw/) and further hw runs; a ``--hw-from`` compare folder
  (its hw side where compare.json points); the last line counts the figures within;
  ``--out`` writes the rows; a folder without a summary exits 2 naming it.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.tools.fidelity import judge

KINDS = ("host_to_gpu", "gpu_to_host", "disk_read", "disk_write")


def metrics(p50, p90, nbytes=(100, 200, 50, 80), ranks=None):
    m = {"ttft_s": {"p50": p50, "p90": p90}, "bytes": dict(zip(KINDS, nbytes)),
         "throughput": {"requests_per_s": 1.0}}
    if ranks is not None:
        m["ranks"] = ranks
    return m


def by(rows, scope="node"):
    return {r["figure"]: r for r in rows if r["scope"] == scope}


def test_within_by_tolerance_or_by_hws_own_spread():
    hw = metrics(1.0, 2.0)
    sim = metrics(1.09, 2.3, (104, 212, 50, 80))  # +9%, +15%; bytes +4%, +6%
    rows = by(judge(sim, hw, []))
    assert rows["ttft_p50_s"]["err"] == pytest.approx(0.09) and rows["ttft_p50_s"]["within"]
    assert not rows["ttft_p90_s"]["within"] and rows["ttft_p90_s"]["spread"] == 0.0
    assert rows["bytes_host_to_gpu"]["within"] and not rows["bytes_gpu_to_host"]["within"]
    # another hw run 20% off at p90 and 7% at gpu->host: the sim's +15% and +6% are within it
    other = metrics(0.95, 2.4, (100, 186, 50, 80))
    rows = by(judge(sim, hw, [other]))
    assert rows["ttft_p90_s"]["spread"] == pytest.approx(0.2) and rows["ttft_p90_s"]["within"]
    assert rows["bytes_gpu_to_host"]["spread"] == pytest.approx(0.07) and rows["bytes_gpu_to_host"]["within"]
    assert rows["ttft_p50_s"]["spread"] == pytest.approx(0.05)


def test_a_figure_hw_has_at_zero():
    hw = metrics(1.0, 2.0, (100, 200, 0, 80))
    assert by(judge(metrics(1.0, 2.0, (100, 200, 0, 80)), hw, []))["bytes_disk_read"]["within"]
    sim = metrics(1.0, 2.0, (100, 200, 30, 80))
    assert not by(judge(sim, hw, []))["bytes_disk_read"]["within"]
    assert by(judge(sim, hw, [metrics(1.0, 2.0, (100, 200, 0, 80))]))["bytes_disk_read"]["within"] is False
    row = by(judge(sim, hw, [metrics(1.0, 2.0, (100, 200, 9, 80))]))["bytes_disk_read"]
    assert row["within"] and row["spread"] is None  # (hw itself moved off 0: no scale)


def test_a_node_of_ranks_node_wide_then_rank_by_rank():
    r_hw = [metrics(1.0, 2.0), metrics(1.0, 2.0)]
    r_sim = [metrics(1.0, 2.0), metrics(1.5, 2.0)]
    rows = judge(metrics(1.0, 2.0, ranks=r_sim), metrics(1.0, 2.0, ranks=r_hw), [])
    assert [r["scope"] for r in rows] == ["node"] * 6 + ["rank 0"] * 6 + ["rank 1"] * 6
    assert [r["figure"] for r in rows if not r["within"]] == ["ttft_p50_s"]
    assert by(rows, "rank 1")["ttft_p50_s"]["err"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"sim 2, hw 2, other 1"):
        judge(metrics(1.0, 2.0, ranks=r_sim), metrics(1.0, 2.0, ranks=r_hw), [metrics(1.0, 2.0)],
              ["sim", "hw", "other"])


def _summary(folder, m):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"metrics": m}))


def test_cli_on_compare_folders_and_further_hw_runs(tmp_path):
    cmp = tmp_path / "cmp"
    _summary(cmp / "sim", metrics(1.12, 2.0))
    _summary(cmp / "hw", metrics(1.0, 2.0))
    other = tmp_path / "other-cmp"
    _summary(other / "hw", metrics(0.85, 2.0))  # a compare folder: its hw/ is the run
    r = CliRunner().invoke(app, ["fidelity", str(cmp)])
    assert r.exit_code == 0, r.output
    assert r.output.strip().splitlines()[-1].startswith("fidelity: 5 of 6 figures within")
    out = tmp_path / "f.json"
    r = CliRunner().invoke(app, ["fidelity", str(cmp), str(other), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "fidelity: 6 of 6 figures within" in " ".join(r.output.split())
    saved = json.loads(out.read_text())
    assert saved["kvsim_report"] == "fidelity" and len(saved["rows"]) == 6
    assert by(saved["rows"])["ttft_p50_s"]["spread"] == pytest.approx(0.15)
    # a --hw-from compare: sim/ here, the hw side where compare.json says
    again = tmp_path / "again"
    _summary(again / "sim", metrics(1.0, 2.0))
    (again / "compare.json").write_text(json.dumps({"hw_from": str(cmp)}))
    r = CliRunner().invoke(app, ["fidelity", str(again)])
    assert r.exit_code == 0 and "6 of 6" in r.output, r.output


def test_cli_refuses_a_further_hw_run_of_another_workload(tmp_path):
    """hw's spread is how far hw repeats one config: a run of another workload or model
    would make any sim error look within it."""
    cfg = {"seed": 0, "model": "llama-3-8b", "tp": 1, "kv_dtype": "bf16",
           "workload": {"kind": "agentic", "limit": 3, "path": "traces/a"}, "cache": {"tiers": 3}}

    def run(folder, m, backend="hw", **change):
        folder.mkdir(parents=True)
        c = json.loads(json.dumps(cfg))
        for k, v in change.items():
            section, _, key = k.partition("__")
            (c[section].__setitem__(key, v) if key else c.__setitem__(section, v))
        (folder / "summary.json").write_text(json.dumps({"backend": backend, "config": c, "metrics": m}))

    cmp = tmp_path / "cmp"
    run(cmp / "sim", metrics(1.3, 2.0), "sim")                 # +30% at p50
    run(cmp / "hw", metrics(1.0, 2.0))
    # the same workload from another folder, on another machine's profile and tiers: its
    # spread counts (35% at p50: the sim's +30% within it)
    same = tmp_path / "same"
    run(same, metrics(1.35, 2.0), workload__path="/elsewhere/a", cache={"tiers": 2})
    r = CliRunner().invoke(app, ["fidelity", str(cmp), str(same)])
    assert r.exit_code == 0 and "6 of 6 figures within" in " ".join(r.output.split()), r.output
    for change in ({"workload__limit": 40}, {"model": "qwen3-8b"}, {"seed": 1}):
        other = tmp_path / "other" / next(iter(change))
        run(other, metrics(1.35, 2.0), **change)
        r = CliRunner().invoke(app, ["fidelity", str(cmp), str(same), str(other)])
        said = " ".join(r.output.split())
        key = next(iter(change)).replace("__", ".")
        assert r.exit_code == 2, r.output
        assert str(other / "summary.json") in said and f"{key} " in said and "Traceback" not in said


def test_cli_refuses_a_folder_without_a_summary_and_a_users_file(tmp_path):
    r = CliRunner().invoke(app, ["fidelity", str(tmp_path / "nothing")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "nothing" in r.output and "summary.json" in r.output
    cmp = tmp_path / "cmp"
    _summary(cmp / "sim", metrics(1.0, 2.0))
    _summary(cmp / "hw", metrics(1.0, 2.0))
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}')
    r = CliRunner().invoke(app, ["fidelity", str(cmp), "--out", str(mine)])
    assert r.exit_code == 2 and "was not written by kvsim fidelity" in " ".join(r.output.split())
    assert mine.read_text() == '{"mine": 1}'


def test_cli_refuses_a_run_that_is_not_the_side_it_stands_for(tmp_path):
    """A plain results folder is no compare (its one run would stand for both sides and
    agree with itself), and a sim run is no hw run."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"backend": "sim", "metrics": metrics(1.0, 2.0)}))
    r = CliRunner().invoke(app, ["fidelity", str(run)])
    assert r.exit_code == 2 and f"{run}: expected a kvsim compare folder (sim/summary.json)" in r.output
    cmp = tmp_path / "cmp"
    _summary(cmp / "sim", metrics(1.0, 2.0))
    _summary(cmp / "hw", metrics(1.0, 2.0))
    r = CliRunner().invoke(app, ["fidelity", str(cmp), str(run)])
    assert r.exit_code == 2, r.output
    assert "a run on the sim backend; expected a hw run" in " ".join(r.output.split())
    swapped = tmp_path / "swapped"
    for side, backend in (("sim", "sim"), ("hw", "sim")):
        (swapped / side).mkdir(parents=True)
        (swapped / side / "summary.json").write_text(json.dumps({"backend": backend,
                                                                 "metrics": metrics(1.0, 2.0)}))
    r = CliRunner().invoke(app, ["fidelity", str(swapped)])
    assert r.exit_code == 2 and "expected a hw run" in " ".join(r.output.split())
