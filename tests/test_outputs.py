"""One output rule for every command that writes (kvsim.run.outputs), tried the way a
careless user would: the current folder, a folder of one's own with a ``study.csv`` in it,
one command's folder given to another, a folder holding someone else's ``optuna.db``, a
file kvsim did not write as ``calibrate --out`` or ``diff --out``. Each is refused before
any work with exit code 2 and one line naming the folder or file, and nothing that existed
before changes anywhere; ``--force`` adds kvsim's files beside a user's, never over them."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.run.outputs import MARKER, NAMES

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "workload.synthetic.n_sessions=2", "--set", "output.plots=false"]
STUDY = """\
name: small
base: default
set:
  workload.synthetic.n_sessions: 2
  output.plots: false
seeds: [0]
"""
TUNE = """\
name: t
base: default
set:
  workload.synthetic.n_sessions: 4
  output.plots: false
space:
  engine.gpu_free_watermark: {type: float, low: 0.0, high: 0.3}
objective:
  minimize: ttft_s.p90
trials: 2
"""
REPORT = str(ROOT / "configs/hardware/h200-pcie-calibrated.yaml.report.json")


def _tree(folder: Path) -> dict[str, tuple]:
    """Every path under ``folder``: its bytes (files) and modification time."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = (p.read_bytes() if p.is_file() else None, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A user's folder: their own files, and folders that kvsim run and kvsim study wrote."""
    h = tmp_path_factory.mktemp("home")
    (h / "mine").mkdir()
    (h / "mine" / "study.csv").write_text("my,own\n1,2\n")
    (h / "mine" / "notes.txt").write_text("precious")
    (h / "db").mkdir()
    con = sqlite3.connect(h / "db" / "optuna.db")
    con.execute("create table accounts (name text)")
    con.commit()
    con.close()
    (h / "profile.yaml").write_text("link: {h2d: 1}\n")
    (h / "report.json").write_text('{"mine": 1}\n')
    (h / "s.yaml").write_text(STUDY)
    (h / "t.yaml").write_text(TUNE)
    (h / "s-out.yaml").write_text(STUDY + f"out: {h / 'mine'}\n")
    r = runner.invoke(app, ["run", "default", "--no-progress", *TINY, "--out", str(h / "a-run")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["study", str(h / "s.yaml"), "--out", str(h / "a-study"), "--workers", "1",
                            "--no-progress", "--no-plots"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["tune", str(h / "t.yaml"), "--out", str(h / "a-tune"), "--workers", "1",
                            "--no-progress", "--trials", "1"])
    assert r.exit_code == 0, r.output
    return h


def _cases(h: Path) -> list[tuple[list[str], str]]:
    s, t = str(h / "s.yaml"), str(h / "t.yaml")
    study_hash = json.loads((h / "a-study" / MARKER).read_text())["hash"]
    tune_hash = json.loads((h / "a-tune" / MARKER).read_text())["hash"]
    return [
        (["study", s, "--out", "."], "--out .: is the current folder or holds it"),
        (["study", s, "--out", str(h / "mine")], f"--out {h / 'mine'}: exists and was not written by kvsim"),
        (["study", s, "--out", str(h / "mine"), "--force"],
         f"--force: {h / 'mine' / 'study.csv'} exists and kvsim did not write it"),
        (["study", str(h / "s-out.yaml")], f"out {h / 'mine'}: exists and was not written by kvsim"),
        (["study", s, "--out", str(h / "a-run")], f"--out {h / 'a-run'}: is a kvsim run folder"),
        (["study", s, "--out", str(h / "a-run"), "--force"], f"--out {h / 'a-run'}: is a kvsim run folder"),
        (["study", s, "--out", str(h / "a-study"), "--set", "engine.max_running=8"],
         f"--out {h / 'a-study'}: holds a study of config hash {study_hash}; this study's config hash is "),
        (["run", "default", *TINY, "--out", str(h / "a-study")], f"--out {h / 'a-study'}: is a kvsim study folder"),
        (["run", "default", *TINY, "--out", str(h / "mine")], f"--out {h / 'mine'}: exists and was not written"),
        (["compare", "default", *TINY, "--out", str(h / "a-run")], f"--out {h / 'a-run'}: is a kvsim run folder"),
        (["tune", t, "--out", str(h / "a-tune"), "--set", "engine.max_batch_tokens=4096"],
         f"--out {h / 'a-tune'}: holds a tune of config hash {tune_hash}; this tune's config hash is "),
        (["tune", t, "--out", str(h / "a-study")], f"--out {h / 'a-study'}: is a kvsim study folder"),
        (["tune", t, "--out", str(h / "db")], f"--out {h / 'db'}: exists and was not written by kvsim"),
        (["tune", t, "--out", str(h / "db"), "--force"],
         f"--force: {h / 'db' / 'optuna.db'} exists and kvsim did not write it"),
        (["tune", t, "--out", str(h / "new-tune"), "--storage", f"sqlite:///{h / 'db' / 'optuna.db'}"],
         f"{h / 'db' / 'optuna.db'} exists and is not an Optuna storage"),
        (["tune", t, "--out", str(h / "new-tune"), "--storage", "nonsense://x"],
         "--storage nonsense://x: not a storage URL kvsim can open"),
        (["study", s, "--out", str(h / "new-study"), "--scheduler", "garbage"], "--scheduler garbage: "),
        (["study", s, "--out", str(h / "new-study"), "--scheduler", "tcp://127.0.0.1:8786", "--workers", "2"],
         "--workers 2: not with --scheduler"),
        (["tune", t, "--out", str(h / "new-tune"), "--scheduler", "tcp://127.0.0.1:8786", "--workers", "2"],
         "--workers 2: not with --scheduler"),
        (["calibrate", "--out", str(h / "profile.yaml"), "--from-report", REPORT],
         f"--out {h / 'profile.yaml'}: exists and was not written by kvsim calibrate"),
        (["calibrate", "--check", REPORT, "--profile", "h200-pcie", "--out", str(h / "report.json")],
         f"--out {h / 'report.json'}: exists and was not written by kvsim calibrate --check"),
        (["diff", str(h / "a-run"), str(h / "a-run"), "--out", str(h / "report.json")],
         f"--out {h / 'report.json'}: exists and was not written by kvsim diff"),
    ]


def test_every_command_refuses_what_it_may_not_write(home, monkeypatch):
    monkeypatch.chdir(home)
    before = _tree(home)
    for args, expect in _cases(home):
        r = runner.invoke(app, [*args, "--no-progress"] if args[0] in ("run", "study", "tune") else args)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.startswith("error: ") and r.output.count("\n") == 1, (args, r.output)
        assert expect in r.output, (args, r.output)
        assert "Traceback" not in r.output
        assert _tree(home) == before, args        # nothing made, changed or removed
    con = sqlite3.connect(home / "db" / "optuna.db")
    assert [r[0] for r in con.execute("select name from sqlite_master")] == ["accounts"]


def test_force_writes_beside_a_users_files_and_replaces_only_its_own(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    args = ["run", "default", "--no-progress", *TINY, "--out", str(mine)]
    assert runner.invoke(app, args).exit_code == 2                     # not without --force
    r = runner.invoke(app, [*args, "--force"])
    assert r.exit_code == 0, r.output
    marker = json.loads((mine / MARKER).read_text())
    assert marker["shared"] is True and marker["kind"] == "run"
    assert marker["files"] == ["requests.csv", "summary.json", "timeline.csv"]
    first = (mine / "summary.json").read_text()
    # again, another seed: kvsim's files are replaced, the user's stays as it was
    r = runner.invoke(app, [*args, "--set", "seed=3"])
    assert r.exit_code == 0, r.output
    assert (mine / "summary.json").read_text() != first
    assert json.loads((mine / "summary.json").read_text())["config"]["seed"] == 3
    assert (mine / "notes.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]      # no staging left
    # the user's own summary.json in a folder: a collision, refused before the replay
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "summary.json").write_text("{}")
    r = runner.invoke(app, ["run", "default", "--no-progress", *TINY, "--out", str(theirs), "--force"])
    assert r.exit_code == 2 and f"{theirs / 'summary.json'} exists and kvsim did not write it" in r.output
    assert sorted(os.listdir(theirs)) == ["summary.json"] and (theirs / "summary.json").read_text() == "{}"


def test_a_runs_files_are_the_names_the_rule_knows(tmp_path):
    """The collision check knows a command's names up front: a run's must all be among them."""
    r = runner.invoke(app, ["run", "default", "--no-progress", "--set", "workload.synthetic.n_sessions=2",
                            "--out", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    assert set(os.listdir(tmp_path / "r")) - {MARKER} <= NAMES["run"]


def test_a_run_folder_holding_what_kvsim_did_not_write_is_not_replaced_whole(tmp_path):
    """A run replaces its earlier folder whole: a user's notes put into it afterwards were
    deleted with the old results ("kvsim deletes only what it created")."""
    out = tmp_path / "res"
    args = ["run", "default", "--no-progress", *TINY, "--out", str(out)]
    assert runner.invoke(app, args).exit_code == 0
    (out / "notes.txt").write_text("precious")
    before = _tree(tmp_path)
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and r.output.startswith(f"error: --out {out}: holds {out / 'notes.txt'}, "), r.output
    assert _tree(tmp_path) == before
    # --force: kvsim's files are replaced one by one, the notes stay; the folder is shared now
    r = runner.invoke(app, [*args, "--force", "--set", "seed=3"])
    assert r.exit_code == 0, r.output
    assert (out / "notes.txt").read_text() == "precious"
    assert json.loads((out / "summary.json").read_text())["config"]["seed"] == 3
    assert json.loads((out / MARKER).read_text())["shared"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]      # no staging left


def test_a_study_inside_another_studys_point_folder_survives_that_point_running_again(tmp_path):
    """A point that runs again replaces its folder: a study whose --out was inside it went
    with it. Now that point fails, naming what is in the way, and the inner study stays."""
    (tmp_path / "s.yaml").write_text(STUDY)
    outer = tmp_path / "outer"
    study = ["study", str(tmp_path / "s.yaml"), "--workers", "1", "--no-progress", "--no-plots"]
    assert runner.invoke(app, [*study, "--out", str(outer)]).exit_code == 0
    point = outer / "points" / "seed=0"
    inner = point / "inner"
    assert runner.invoke(app, [*study, "--out", str(inner)]).exit_code == 0
    kept = _tree(inner)
    (point / "point.json").unlink()                 # the point is not complete: it runs again
    r = runner.invoke(app, [*study, "--out", str(outer)])
    assert r.exit_code == 1 and f"holds {inner}, which kvsim did not write there" in r.output, r.output
    assert _tree(inner) == kept


_PLOT_ON_A_FULL_DISK = """
import resource, sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kvsim.study.tierbars import tier_bars

points = [SimpleNamespace(name=f"p{i}") for i in range(3)]
rows = [{"point": f"p{i}", "cluster.hit_ratio_by_tier.gpu": 0.5, "cluster.hit_ratio_by_tier.host": 0.2}
        for i in range(3)]
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))   # the disk fills up
try:
    tier_bars(points, rows, Path(sys.argv[1]), "s", lambda: plt)
except OSError as e:
    print("failed", e.errno)
"""


def test_a_study_plot_cut_short_by_a_full_disk_leaves_the_earlier_one(tmp_path):
    """A study's and a tune's plots were saved straight into their folder: a full disk (or
    a kill) while one was written left a cut PNG in place of the earlier, complete one."""
    import subprocess
    import sys

    earlier = tmp_path / "hit_ratio_by_tier.png"
    earlier.write_bytes(b"the earlier, complete plot")
    r = subprocess.run([sys.executable, "-c", _PLOT_ON_A_FULL_DISK, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("failed"), (r.stdout, r.stderr)
    assert earlier.read_bytes() == b"the earlier, complete plot"
    assert [p.name for p in tmp_path.iterdir()] == [earlier.name]   # no temporary file left
