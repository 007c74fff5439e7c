"""``kvsim study`` and ``kvsim tune`` as a user meets them: a study file expands into
named, validated points; bad files fail with the file and the key (exit 2, nothing
run); a study runs on a LocalCluster and on a real Dask cluster (a ``dask scheduler`` and
two ``dask worker`` processes on 127.0.0.1) with the same metrics; a finished point is
skipped when the study runs again, a changed one is rerun, a failing one is recorded
while the others finish. Every run uses the synthetic workload with a few sessions."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.study.points import expand, labels_for
from kvsim.study.definition import StudyFileError, load_study

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]

SMALL = """\
name: small
base: default
set:
  workload.synthetic.n_sessions: 3
  output.plots: false
"""


def _study(tmp_path: Path, body: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(SMALL + body)
    return p


def _points(path: Path, overrides=()):
    return expand(load_study(path), str(path), overrides)


# ------------------------------------------------------------------------------ expansion


def test_axes_expand_in_order_with_names_from_parameters(tmp_path):
    p = _study(tmp_path, """\
grid:
  cache.tiers[1].quota: [8GiB, 48GiB]
  engine.max_running: [16, 64]
variants:
  - {name: hold, set: {engine.hold_sessions: true}}
  - {name: nohold, set: {engine.hold_sessions: false}}
seeds: [0, 1]
""")
    pts = _points(p)
    assert len(pts) == 2 * 2 * 2 * 2
    assert pts[0].name == "hold__quota=8GiB__max_running=16__seed=0"
    assert pts[1].name == "hold__quota=8GiB__max_running=16__seed=1"
    assert pts[-1].name == "nohold__quota=48GiB__max_running=64__seed=1"
    last = pts[-1].config
    assert last["cache"]["tiers"][1]["quota"] == 48 * 2**30   # resolved, validated
    assert last["engine"]["hold_sessions"] is False and last["seed"] == 1
    assert last["workload"]["synthetic"]["n_sessions"] == 3   # the study's set
    assert pts[-1].numeric["quota"] == 48 * 2**30 and pts[-1].params["quota"] == "48GiB"
    assert len({q.name for q in pts}) == len(pts) and len({q.hash for q in pts}) == len(pts)
    assert [q.hash for q in _points(p)] == [q.hash for q in pts]          # stable
    moved = _points(p, ["engine.max_batch_tokens=4096"])                  # --set on the base
    assert all(q.config["engine"]["max_batch_tokens"] == 4096 for q in moved)
    assert all(a.hash != b.hash for a, b in zip(moved, pts))


def test_points_whose_values_print_alike_get_folders_of_their_own(tmp_path):
    """Folder names keep letters, digits and ``._=+-``: ``d?`` and ``d!`` both print as
    ``d-``, so the second is told apart with ``__1``, a name a third value may print as
    itself. Before, that third point and the second shared one folder (each run of the
    study replayed one of them again and the table showed one's results for both)."""
    p = _study(tmp_path, """\
grid:
  cache.tiers[2].path: ["/x/d?", "/x/d!", "/x/d-__1"]
""")
    pts = _points(p)
    assert [q.params["path"] for q in pts] == ["/x/d?", "/x/d!", "/x/d-__1"]
    assert pts[0].name == "path=-x-d-" and pts[2].name == "path=-x-d-__1"
    assert len({q.name for q in pts}) == 3
    # a name cut at 200 characters keeps its suffix beyond the cut
    long = "v" * 150 + "/" + "v" * 150
    p = _study(tmp_path, f"""\
grid:
  cache.tiers[2].path: ["/{long}a", "/{long}b"]
""", name="long.yaml")
    names = [q.name for q in _points(p)]
    assert names[1] == names[0] + "__1" and len(names[0]) == 200


def test_zip_moves_axes_together_and_labels_tell_clashing_keys_apart(tmp_path):
    p = _study(tmp_path, """\
zip:
  cache.tiers[1].quota: [8GiB, 16GiB]
  cache.tiers[2].quota: [64GiB, 128GiB]
""")
    pts = _points(p)
    assert [q.name for q in pts] == ["tiers1.quota=8GiB__tiers2.quota=64GiB",
                                     "tiers1.quota=16GiB__tiers2.quota=128GiB"]
    assert pts[1].params == {"tiers[1].quota": "16GiB", "tiers[2].quota": "128GiB"}
    assert pts[1].config["cache"]["tiers"][2]["quota"] == 128 * 2**30
    assert labels_for(["a.b.quota", "c.quota", "x.y"], {"x.y": "why"}) == \
        {"a.b.quota": "b.quota", "c.quota": "c.quota", "x.y": "why"}


@pytest.mark.parametrize("body, where, what", [
    ("grid:\n  cache.tiers[1].quota: []\n", "grid: cache.tiers[1].quota", "at least one value"),
    ("grid:\n  'cache..quota': [1]\n", "grid", "not a config key path"),
    ("zip:\n  seed: [1, 2]\n  engine.max_running: [4]\n", "zip", "same number of values"),
    ("variants:\n  - {name: a}\n  - {name: a}\n", "variants", "unique"),
    ("bogus: 1\n", "bogus", "Extra inputs"),
    ("metrics: [ttft]\n", "metrics", "not a summary metric"),
    ("baseline: nope\n", "baseline", "no point named 'nope'"),
    ("grid:\n  cache.tiers[1].quota: [8GiB, lots]\n", "point quota=lots", "cache.tiers[1].quota"),
    ("grid:\n  cache.tiers[7].quota: [8GiB]\n", "grid: cache.tiers[7].quota", "no list item [7]"),
    # a variant's key an axis sets at every point: the variant's value would never be run
    ("grid:\n  engine.max_running: [16, 32]\nvariants:\n  - {name: a, set: {engine.max_running: 8}}\n",
     "variants[a]", "engine.max_running is set at every point by the axis engine.max_running"),
    # a grid value twice, as given or once resolved: each such point would run twice
    ("grid:\n  engine.max_running: [8, 16, 8]\n", "grid: engine.max_running", "8 is given twice"),
    ("grid:\n  cache.tiers[1].quota: [8GiB, 8192MiB]\n", "grid: cache.tiers[1].quota",
     "'8GiB' and '8192MiB' are one value once resolved"),
    # the base is synthetic: the trace would be named in the table and never replayed
    ("traces: [t.jsonl]\n", "traces: point trace=t.jsonl would not replay t.jsonl",
     "workload.kind is synthetic"),
])
def test_bad_study_fails_with_file_and_key_and_runs_nothing(tmp_path, body, where, what):
    p = _study(tmp_path, body)
    with pytest.raises(StudyFileError) as e:
        _points(p)
    assert str(p) in str(e.value) and where in str(e.value) and what in str(e.value), str(e.value)
    out = tmp_path / "out"
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert str(p) in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_missing_or_malformed_study_file_exits_2(tmp_path):
    r = runner.invoke(app, ["study", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and "cannot read the study file" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngrid: [1\n")
    r = runner.invoke(app, ["study", str(bad)])
    assert r.exit_code == 2 and f"{bad}:" in r.output and "malformed YAML" in r.output
    bad.write_text("name: x\nseeds: [1]\nseeds: [2]\n")
    r = runner.invoke(app, ["study", str(bad)])
    assert r.exit_code == 2 and f"{bad}:3:" in r.output and "duplicate key 'seeds'" in r.output


# ------------------------------------------------------------------------------ running


def _table(folder: Path) -> list[dict]:
    import pandas as pd

    csv = pd.read_csv(folder / "study.csv", keep_default_na=False)
    pq = pd.read_parquet(folder / "study.parquet")
    assert list(csv["point"]) == list(pq["point"])
    return pq.to_dict("records")


def test_local_study_writes_points_table_plots_then_resumes(tmp_path):
    p = _study(tmp_path, """\
grid:
  cache.tiers[0].quota: [4GiB, 24GiB]
variants:
  - {name: hold, set: {engine.hold_sessions: true}}
  - {name: broken, set: {workload.kind: mooncake, workload.path: TRACE}}
baseline: hold__quota=24GiB
""".replace("TRACE", str(tmp_path / "later" / "trace.jsonl")))
    out = tmp_path / "out"
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "2", "--no-progress"])
    assert r.exit_code == 1, r.output              # a point failed; the others finished
    assert "point broken__quota=4GiB" in r.output and "later/trace.jsonl" in r.output
    rows = {row["point"]: row for row in _table(out)}
    assert set(rows) == {"hold__quota=4GiB", "hold__quota=24GiB", "broken__quota=4GiB",
                         "broken__quota=24GiB"}
    for name in ("hold__quota=4GiB", "hold__quota=24GiB"):
        row = rows[name]
        summary = json.loads((out / "points" / name / "summary.json").read_text())
        failed = summary["metrics"]["requests_failed"]   # (a 4 GiB GPU tier fails a few)
        assert row["status"] == ("requests failed" if failed else "ok"), (name, failed)
        assert row["ttft_s.p90"] == summary["metrics"]["ttft_s"]["p90"]
        assert row["requests_completed"] == summary["metrics"]["requests_completed"] > 0
        assert (out / "points" / name / "requests.csv").exists()
    assert rows["broken__quota=4GiB"]["status"] == "failed"
    assert "later/trace.jsonl" in rows["broken__quota=4GiB"]["error"]
    assert json.loads((out / "failures.json").read_text()).keys() == {"broken__quota=4GiB",
                                                                      "broken__quota=24GiB"}
    # a 4 GiB GPU tier against 24 GiB: the smaller one must show in the metrics
    small, big = rows["hold__quota=4GiB"], rows["hold__quota=24GiB"]
    assert small["hit_ratio"] != big["hit_ratio"] or small["ttft_s.p90"] != big["ttft_s.p90"]
    assert big["rel.ttft_s.p90"] == 0.0
    assert small["rel.ttft_s.p90"] == pytest.approx(
        (small["ttft_s.p90"] - big["ttft_s.p90"]) / big["ttft_s.p90"])
    assert {f.name for f in (out / "plots").iterdir()} >= {"axis-quota.png", "ttft_cdf.png"}
    assert "hold" in r.output and "quota" in r.output          # the rich table

    # again, the trace now there (the same study: the same config hash): the points done
    # are skipped, the failed ones run
    stamp = (out / "points" / "hold__quota=24GiB" / "point.json").stat().st_mtime_ns
    (tmp_path / "later").mkdir()
    shutil.copyfile(ROOT / "traces" / "fixtures" / "mooncake_ok.jsonl", tmp_path / "later" / "trace.jsonl")
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "2 run, 2 already done, 0 failed" in r.output
    assert (out / "points" / "hold__quota=24GiB" / "point.json").stat().st_mtime_ns == stamp
    assert {row["status"] for row in _table(out)} <= {"ok", "requests failed"}
    assert json.loads((out / "failures.json").read_text()) == {}
    # --set on the base changes every point: another study, refused in this one's folder
    # (kvsim.run.outputs), naming both config hashes; nothing in the folder changes
    before = {f: f.stat().st_mtime_ns for f in out.rglob("*")}
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "2", "--no-progress",
                            "--no-plots", "--set", "engine.max_batch_tokens=4096"])
    assert r.exit_code == 2, r.output
    old = json.loads((out / ".kvsim-results").read_text())["hash"]
    assert re.search(rf"holds a study of config hash {old}; this study's config hash is [0-9a-f]{{16}} ",
                     r.output), r.output
    assert {f: f.stat().st_mtime_ns for f in out.rglob("*")} == before


def test_a_study_resumed_after_its_trace_changed_reruns_the_points_that_replay_it(tmp_path):
    """The points' configs name the trace by path only: a trace rewritten in place must not
    leave the old trace's results standing as this trace's (they were skipped as done)."""
    lines = [line for line in (ROOT / "traces" / "fixtures" / "mooncake_ok.jsonl").read_text()
             .splitlines(keepends=True) if line.strip()]   # a request a line
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(lines))
    p = _study(tmp_path, f"""\
grid:
  cache.tiers[0].quota: [8GiB, 24GiB]
variants:
  - {{name: trace, set: {{workload.kind: mooncake, workload.path: {trace}}}}}
  - {{name: synthetic, set: {{}}}}
""")
    out = tmp_path / "out"

    def completed() -> dict:
        return {row["point"]: row["requests_completed"] for row in _table(out)}

    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    synthetic = {k: v for k, v in completed().items() if k.startswith("synthetic")}
    assert [v for k, v in completed().items() if k.startswith("trace")] == [len(lines)] * 2
    os.utime(trace, ns=(1, 1))              # touched, the same content: nothing to run again
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    assert r.exit_code == 0 and "0 run, 4 already done" in r.output, r.output
    trace.write_text("".join(lines[:2]))   # rewritten: its points run again, the others not
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    assert r.exit_code == 0 and "2 run, 2 already done" in r.output, r.output
    assert completed() == {"trace__quota=8GiB": 2, "trace__quota=24GiB": 2, **synthetic}


def test_a_users_profile_or_model_file_edited_in_place_changes_its_points(tmp_path):
    """A profile or model the points name by path: edited in place, the points computed on
    the old file are not the new one's (their hashes change); touched, they stay; points
    on shipped presets keep the hash of their config alone."""
    prof = tmp_path / "my-gpu.yaml"
    prof.write_text((ROOT / "configs" / "hardware" / "h200-pcie.yaml").read_text())
    model = tmp_path / "my-model.yaml"
    model.write_text((ROOT / "configs" / "models" / "llama-3-8b.yaml").read_text())
    p = _study(tmp_path, f"""\
grid:
  cache.tiers[0].quota: [8GiB, 24GiB]
variants:
  - {{name: mine, set: {{hardware: {prof}, model: {model}}}}}
  - {{name: shipped, set: {{}}}}
""")

    def hashes() -> dict:
        return {pt.name: pt.hash for pt in _points(p)}

    first = hashes()
    os.utime(prof, ns=(1, 1))
    assert hashes() == first
    prof.write_text(prof.read_text() + "\n# edited\n")
    second = hashes()
    changed = {k for k in first if first[k] != second[k]}
    assert changed == {k for k in first if k.startswith("mine")}
    model.write_text(model.read_text() + "\n# edited\n")
    third = hashes()
    assert {k for k in first if third[k] != second[k]} == changed
    from kvsim.study.points import config_hash, inputs_digest
    shipped = next(pt for pt in _points(p) if pt.name.startswith("shipped"))
    assert inputs_digest(shipped.config, {}) is None
    assert shipped.hash == config_hash(shipped.config, shipped.backend)


def test_a_tune_refuses_its_folder_once_its_trace_changed(tmp_path):
    """A tune continues one Optuna study: trials of two traces would be ranked together."""
    from kvsim.study.tune import plan_tune, tune_hash

    trace = tmp_path / "t.jsonl"
    trace.write_text((ROOT / "traces" / "fixtures" / "mooncake_ok.jsonl").read_text())
    p = tmp_path / "t.yaml"
    p.write_text(TUNE.replace("output.plots: false", f"output.plots: false\n  workload.kind: mooncake\n"
                                                     f"  workload.path: {trace}"))

    def hash_now() -> str:
        return tune_hash(*plan_tune(str(p)))

    first = hash_now()
    os.utime(trace, ns=(1, 1))
    assert hash_now() == first
    trace.write_text(trace.read_text().splitlines(keepends=True)[0])
    assert hash_now() != first


def test_interrupted_study_exits_130_leaves_no_process_and_continues(tmp_path):
    p = _study(tmp_path, "seeds: [0, 1, 2, 3, 4, 5]\n")
    out = tmp_path / "out"
    exe = Path(sys.executable).with_name("kvsim")
    cmd = [str(exe), "study", str(p), "--out", str(out), "--workers", "1",
           "--set", "workload.synthetic.n_sessions=12"]   # points of about a second
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob("points/*/point.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(out.glob("points/*/point.json")), "no point finished within 60 s"
        os.killpg(proc.pid, signal.SIGINT)          # a terminal's Ctrl-C reaches the group
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 130, err
    assert "interrupted (SIGINT)" in err and "Traceback" not in err, err
    deadline = time.monotonic() + 10                # the workers went with it
    while True:
        ps = subprocess.run(["ps", "-eo", "pgid=,pid=,args="], capture_output=True, text=True).stdout
        left = [line for line in ps.splitlines() if line.split()[0] == str(proc.pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, left
    done = len(list(out.glob("points/*/point.json")))
    assert 1 <= done < 6
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "2", "--no-progress",
                            "--no-plots", "--set", "workload.synthetic.n_sessions=12"])
    assert r.exit_code == 0, r.output
    assert f"{6 - done} run, {done} already done, 0 failed" in r.output


def test_a_workers_log_of_the_scheduler_gone_is_dropped_and_nothing_else():
    # (an interrupted study closes the scheduler before its workers: a worker whose
    # heartbeat falls in between logged it with a traceback on the command's stderr)
    import logging

    from kvsim.study.execute import HeartbeatNoise, quiet_interrupts

    log = logging.getLogger("distributed.worker")
    before = signal.getsignal(signal.SIGINT)
    try:
        quiet_interrupts()
        quiet_interrupts()   # (once per worker, however often it runs)
        assert sum(isinstance(f, HeartbeatNoise) for f in log.filters) == 1
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
        for f in [f for f in log.filters if isinstance(f, HeartbeatNoise)]:
            log.removeFilter(f)

    def record(msg):
        return logging.LogRecord("distributed.worker", logging.ERROR, "worker.py", 1, msg, None, None)
    noise = HeartbeatNoise()
    assert not noise.filter(record("Failed to communicate with scheduler during heartbeat."))
    assert noise.filter(record("Compute Failed"))
    assert noise.filter(record("Worker stream died during communication"))


def test_points_sharing_a_workload_load_it_once_per_worker_and_replay_as_alone(tmp_path):
    from kvsim.config import validate_config
    from kvsim.run import prepare_run, replay

    p = _study(tmp_path, "grid:\n  cache.tiers[0].quota: [4GiB, 24GiB]\nseeds: [0, 1]\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress",
                            "--no-plots"])
    assert r.exit_code == 0, r.output
    infos = [json.loads(f.read_text()) for f in sorted(out.glob("points/*/point.json"))]
    assert len(infos) == 4
    # one worker, two seeds: each seed's sessions loaded once, kept for its other point
    assert sorted(i["workload_kept"] for i in infos) == [False, False, True, True]
    for point in _points(p):   # each point's metrics as if it had been replayed alone
        alone = replay(prepare_run(validate_config(point.config, point.name))).metrics
        got = json.loads((out / "points" / point.name / "summary.json").read_text())["metrics"]
        alone.pop("wall_time_s"), got.pop("wall_time_s")
        assert got == json.loads(json.dumps(alone)), point.name


def test_workload_key_follows_the_workload_the_seed_and_the_trace_file(tmp_path):
    from kvsim.config import read_yaml, set_path, validate_config
    from kvsim.run import workload_key

    trace = tmp_path / "t.jsonl"
    shutil.copyfile(ROOT / "traces" / "fixtures" / "mooncake_ok.jsonl", trace)

    def key(**over):
        data = read_yaml(ROOT / "configs" / "default.yaml")
        over = {"workload.kind": "mooncake", "workload.path": str(trace), **over}
        for k, v in over.items():
            set_path(data, k, v)
        return workload_key(validate_config(data, "test"))

    base = key()
    assert key(**{"cache.tiers[0].quota": "8GiB"}) == base      # not what the workload reads
    assert key(**{"engine.max_running": 8}) == base
    assert key(**{"workload.time_scale": 2.0}) != base
    assert key(**{"workload.limit": 1}) != base
    assert key(seed=3) != base
    os.utime(trace, ns=(1, 1))                                   # the file changed
    assert key() != base
    trace.unlink()
    with pytest.raises(OSError):
        key()


def test_the_ttft_cdf_points_are_known_once_the_first_ok_points_are_done():
    from kvsim.study.figures import MAX_LINES, cdf_points
    from kvsim.study.points import Point

    pts = [Point(f"p{i}", {}, {}, None, {}) for i in range(MAX_LINES + 3)]
    status = {p.name: "ok" for p in pts[1:MAX_LINES]}
    assert cdf_points(pts, status) is None                  # p0 still running
    status["p0"] = "failed"
    assert cdf_points(pts, status) is None                  # p0 failed: p12 is in, not done
    status[f"p{MAX_LINES}"] = "ok"
    assert [p.name for p in cdf_points(pts, status)] == [f"p{i}" for i in range(1, MAX_LINES + 1)]
    assert [p.name for p in cdf_points(pts[:3], {"p0": "ok", "p1": "failed", "p2": "ok"})] == ["p0", "p2"]


def test_an_axis_of_many_values_labels_a_few_spread_along_it():
    import math

    from kvsim.study.figures import MAX_TICKS, _tick_values

    few = [1, 2, 3, 5]
    assert _tick_values(few) == few
    many = [64 + 4 * i for i in range(1000)]
    for log in (False, True):
        got = _tick_values(many, log)
        assert 2 < len(got) <= MAX_TICKS and got[0] == 64 and got[-1] == many[-1]
        assert got == sorted(set(got)) and set(got) <= set(many)
        f = math.log if log else float
        gaps = [f(b) - f(a) for a, b in zip(got, got[1:])]
        assert max(gaps) < 1.5 * min(gaps), (log, got)       # evenly spread on the axis


def test_a_point_file_name_must_be_plain(tmp_path):
    from kvsim.study.execute import write_point
    from kvsim.study.points import Point

    pt = Point("p", {}, {}, None, {}, "sim", "h")
    with pytest.raises(ValueError, match="plain name"):
        write_point(tmp_path / "p", pt, {"files": {"../escape.csv": b"x"}})
    assert not (tmp_path / "escape.csv").exists() and not (tmp_path / "p").exists()
    write_point(tmp_path / "p", pt, {"files": {"summary.json": b"{}", "requests.csv": b"a\n"}})
    assert (tmp_path / "p" / "requests.csv").read_bytes() == b"a\n"
    assert json.loads((tmp_path / "p" / "point.json").read_text())["hash"] == "h"


# ---------------------------------------------------------------------- a real Dask cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dask_cli(name: str) -> list[str]:
    exe = Path(sys.executable).with_name("dask")
    return [str(exe), name] if exe.exists() else [sys.executable, "-m", "distributed.cli.dask_" + name]


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@pytest.mark.skipif(shutil.which("dask", path=os.path.dirname(sys.executable)) is None
                    and shutil.which("dask") is None, reason="the dask command is not installed")
def test_study_on_a_dask_cluster_matches_a_local_run(tmp_path):
    p = _study(tmp_path, "grid:\n  cache.tiers[0].quota: [4GiB, 24GiB]\nseeds: [0, 1]\n")
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        procs.append(subprocess.Popen(
            [*_dask_cli("scheduler"), "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            stdout=subprocess.DEVNULL, stderr=open(logs / "scheduler.log", "w"), env=env, cwd=ROOT))
        for i in range(2):
            procs.append(subprocess.Popen(
                [*_dask_cli("worker"), addr, "--host", "127.0.0.1", "--nthreads", "1",
                 "--nworkers", "1", "--no-dashboard", "--memory-limit", "0"],
                stdout=subprocess.DEVNULL, stderr=open(logs / f"worker{i}.log", "w"), env=env, cwd=ROOT))
        from distributed import Client

        deadline = time.monotonic() + 45
        while True:  # wait for both workers to register
            try:
                with Client(addr, timeout="5s") as c:
                    c.wait_for_workers(2, timeout=max(1, deadline - time.monotonic()))
                break
            except (OSError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail("the Dask cluster did not come up:\n" + "\n".join(
                        f.read_text()[-2000:] for f in logs.iterdir()))
                time.sleep(0.5)
        out = tmp_path / "remote"
        r = runner.invoke(app, ["study", str(p), "--out", str(out), "--scheduler", addr,
                                "--no-progress", "--no-plots"])
        assert r.exit_code == 0, r.output
    finally:
        _stop(procs)
    remote = {row["point"]: row for row in _table(out)}
    assert len(remote) == 4 and {row["status"] for row in remote.values()} <= {"ok", "requests failed"}
    workers = {json.loads((out / "points" / n / "point.json").read_text())["worker"] for n in remote}
    assert all(not w.endswith(f":{os.getpid()}") for w in workers)   # ran in the workers
    # the same study in this process's own LocalCluster: the same metrics
    local = tmp_path / "local"
    r = runner.invoke(app, ["study", str(p), "--out", str(local), "--workers", "1", "--no-progress",
                            "--no-plots"])
    assert r.exit_code == 0, r.output
    for row in _table(local):
        a = json.loads((local / "points" / row["point"] / "summary.json").read_text())["metrics"]
        b = json.loads((out / "points" / row["point"] / "summary.json").read_text())["metrics"]
        a.pop("wall_time_s"), b.pop("wall_time_s")
        assert a == b, row["point"]


# ----------------------------------------------------------------------------------- tune

TUNE = """\
name: t
base: default
set:
  workload.synthetic.n_sessions: 6
  output.plots: false
space:
  engine.gpu_free_watermark: {type: float, low: 0.0, high: 0.3}
  cache.tiers[0].quota: {type: int, low: 4, high: 24, unit: GiB}
  hostdisk: {type: split, total: 128GiB, keys: ["cache.tiers[1].quota", "cache.tiers[2].quota"],
             low: 0.1, high: 0.9}
objective:
  minimize: ttft_s.p90
constraints:
  - {metric: requests_failed, max: 0}
trials: 3
split: {held_out: 0.34, seed: 1}
top: 2
"""


def _sessions(folder: Path) -> set[str]:
    import csv

    with open(folder / "requests.csv", newline="") as f:
        return {r["session"].split("/")[0] for r in csv.DictReader(f)}   # sub-agents: their parent


def test_tune_searches_on_train_sessions_evaluates_held_out_and_resumes(tmp_path):
    from kvsim.config import load_config

    p = tmp_path / "t.yaml"
    p.write_text(TUNE)
    out = tmp_path / "tune"
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "2", "--no-progress"])
    assert r.exit_code == 0, r.output
    trials = sorted((out / "trials").iterdir())
    assert len(trials) == 3
    import pandas as pd

    top = pd.read_parquet(out / "top.parquet").to_dict("records")
    assert len(top) == 2 and top[0]["objective.train"] <= top[1]["objective.train"]
    for row in top:  # the objective is the trial's own summary metric, on both parts
        name = f"{row['trial']:04d}"
        train = json.loads((out / "trials" / name / "summary.json").read_text())
        held = json.loads((out / "held_out" / name / "summary.json").read_text())
        assert row["objective.train"] == train["metrics"]["ttft_s"]["p90"]
        assert row["objective.held_out"] == held["metrics"]["ttft_s"]["p90"]
        a, b = _sessions(out / "trials" / name), _sessions(out / "held_out" / name)
        assert len(a) == 4 and len(b) == 2 and not a & b        # a split by session
        cfg = train["config"]
        host, disk = cfg["cache"]["tiers"][1]["quota"], cfg["cache"]["tiers"][2]["quota"]
        assert host + disk == 128 * 2**30                        # the split keeps the budget
        assert cfg["cache"]["tiers"][0]["quota"] % 2**30 == 0
    # the base config on both parts: each trial's gain over it on each part (minimize: a
    # lower TTFT is a positive gain)
    base = {part: json.loads((out / "base" / part / "summary.json").read_text())["metrics"]["ttft_s"]["p90"]
            for part in ("train", "held_out")}
    assert _sessions(out / "base" / "train") == _sessions(out / "trials" / f"{top[0]['trial']:04d}")
    for row in top:
        assert row["gain.train"] == pytest.approx((base["train"] - row["objective.train"]) / base["train"])
        assert row["gain.held_out"] == pytest.approx(
            (base["held_out"] - row["objective.held_out"]) / base["held_out"])
    best = load_config(out / "best.yaml")                        # ready to run
    best_trial = json.loads((out / "trials" / f"{top[0]['trial']:04d}" / "summary.json").read_text())
    assert best.cache.model_dump() == best_trial["config"]["cache"]
    assert {f.name for f in (out / "plots").iterdir()} >= {"history.png"}
    # again with a larger budget: the study continues from its SQLite storage
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "1", "--trials", "4",
                            "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "4 trials complete, 0 failed (1 run now)" in r.output
    assert len(list((out / "trials").iterdir())) == 4


@pytest.mark.parametrize("edit, what", [
    (("minimize: ttft_s.p90", "minimize: ttft"), "objective: Value error, 'ttft' is not a summary metric"),
    (("low: 0.0, high: 0.3", "low: 0.3, high: 0.0"), "space.engine.gpu_free_watermark"),
    (("max: 0}", "}"), "constraints[0]"),
    (("type: int, low: 4", "type: integer, low: 4"), "space.cache.tiers[0].quota.type"),
    # a bound no trial can meet: every trial infeasible, no best config after the budget
    (("max: 0}", "min: 2, max: 1}"), "constraints[0]: Value error, min (2.0) is above max (1.0)"),
    (("held_out: 0.34", "held_out: 1.5"), "split.held_out"),
    # a key the split sets too: one would overwrite the other, a dimension searched for nothing
    (("cache.tiers[0].quota: {type: int", "cache.tiers[1].quota: {type: int"),
     "space: Value error, cache.tiers[1].quota: set by both"),
])
def test_bad_tune_file_exits_2_naming_the_key(tmp_path, edit, what):
    p = tmp_path / "t.yaml"
    assert edit[0] in TUNE
    p.write_text(TUNE.replace(*edit))
    r = runner.invoke(app, ["tune", str(p), "--out", str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert str(p) in r.output and what.split(": Value error, ")[0] in r.output and "Traceback" not in r.output
    assert what.split(": Value error, ")[-1] in " ".join(r.output.split())   # and why
    assert not (tmp_path / "o").exists()


def _tune_refused(tmp_path: Path, edit: tuple[str, str], key: str, why: str) -> Path:
    """The tune file ``TUNE`` edited: refused, exit 2, naming the file, the key and why,
    no folder written. Returns the file."""
    p = tmp_path / "t.yaml"
    assert edit[0] in TUNE
    p.write_text(TUNE.replace(*edit))
    r = runner.invoke(app, ["tune", str(p), "--out", str(tmp_path / "o"), "--no-progress"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert f"{p}" in said and key in said and why in said and "Traceback" not in said
    assert not (tmp_path / "o").exists()
    return p


@pytest.mark.parametrize("edit, key, why", [
    # a field the parameter's type never reads would be dropped: the user meant something
    (("low: 0.0, high: 0.3}", "low: 0.0, high: 0.3, choices: [0.1]}"), "space.engine.gpu_free_watermark",
     "choices: not read by a float parameter"),
    (("low: 0.1, high: 0.9}", "low: 0.1, high: 0.9, log: true}"), "space.hostdisk",
     "log: not read by a split parameter"),
    # an int parameter's fractional bounds would be cut to whole numbers
    (("low: 4, high: 24", "low: 4.5, high: 24"), "space.cache.tiers[0].quota", "whole numbers"),
    # a step Optuna could not take over low..high: it would search low alone (24 - 4 < 40),
    # or lower high to the last whole step (20 / 7), or fail (0) at the first trial
    (("high: 24, unit", "high: 24, step: 40, unit"), "space.cache.tiers[0].quota", "step (40.0)"),
    (("high: 24, unit", "high: 24, step: 7, unit"), "space.cache.tiers[0].quota", "step (7.0)"),
    (("high: 24, unit", "high: 24, step: 0, unit"), "space.cache.tiers[0].quota", "step (0.0)"),
    (("low: 0.0, high: 0.3}", "low: 0.0, high: 0.3, step: -0.1}"), "space.engine.gpu_free_watermark",
     "step (-0.1)"),
])
def test_a_search_dimension_optuna_would_change_is_refused(tmp_path, edit, key, why):
    p = _tune_refused(tmp_path, edit, key, why)
    # the same dimension with a step that divides its range into whole steps is taken
    if "step: 40" in edit[1]:
        from kvsim.study.definition import load_tune

        p.write_text(TUNE.replace(edit[0], "high: 24, step: 5, unit"))
        assert load_tune(p).space["cache.tiers[0].quota"].step == 5


@pytest.mark.parametrize("edit, key, why", [
    # YAML's true is not the number 1, as in a run config: a bound of 1 s was meant or not
    (("max: 0}", "max: true}"), "constraints[0].max", "expected a number, got the boolean True"),
    (("held_out: 0.34, seed: 1", "held_out: 0.34, seed: true"), "split.seed",
     "expected a whole number, got the boolean True"),
    # NaN or infinity is no number: a NaN bound makes every trial infeasible, a NaN weight
    # every objective NaN (each trial failed)
    (("max: 0}", "max: .nan}"), "constraints[0].max", "finite number"),
    (("minimize: ttft_s.p90", "{direction: minimize, terms: {ttft_s.p90: .inf}}"),
     "objective.terms.ttft_s.p90", "finite number"),
    (("low: 0.0, high: 0.3}", "low: 0.0, high: .inf}"), "space.engine.gpu_free_watermark.high",
     "finite number"),
])
def test_a_tune_file_takes_no_boolean_or_nan_for_a_number(tmp_path, edit, key, why):
    _tune_refused(tmp_path, edit, key, why)


def test_a_misspelt_metric_stops_a_study_or_tune_naming_what_is_there(tmp_path):
    """The root of a metric path is checked with the file; the rest only a run's summary can
    tell. A study asked for a name no point's summary has stops before its table (no column
    of dashes), its points kept for the corrected study; a tune stops at its first trial."""
    from kvsim.study.definition import missing_metric

    m = {"throughput": {"requests_per_s": 1.0, "output_tokens_per_s": 2.0}, "hit_ratio": 0.5}
    assert missing_metric([m], "throughput.requests_per_s") is None
    assert missing_metric([m], "throughput.rps") == ("no metric 'throughput.rps' in any run's summary: "
                                                    "throughput has output_tokens_per_s, requests_per_s")
    assert missing_metric([m], "hit_ratio.p50") == ("no metric 'hit_ratio.p50' in any run's summary: "
                                                   "hit_ratio has a number, nothing below it")
    assert missing_metric([m], "host_fill.done_s") is None     # an option's root: may be absent
    assert missing_metric([{}, {"hit_tokens": {"remote": 3}}], "hit_tokens.remote") is None  # one has it
    p = _study(tmp_path, "grid:\n  engine.max_running: [8, 16]\nmetrics: [hit_ratio, throughput.rps]\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "metrics: no metric 'throughput.rps'" in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not (out / "study.csv").exists() and len(list((out / "points").iterdir())) == 2
    p.write_text(p.read_text().replace("throughput.rps", "throughput.requests_per_s"))
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    assert r.exit_code == 0 and "0 run, 2 already done" in r.output, r.output
    t = tmp_path / "t.yaml"
    t.write_text(TUNE.replace("minimize: ttft_s.p90", "minimize: ttft_s.p95"))
    r = runner.invoke(app, ["tune", str(t), "--out", str(tmp_path / "o"), "--workers", "1", "--no-progress"])
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())
    assert "no metric 'ttft_s.p95' in any run's summary: ttft_s has mean, p50, p90, p99" in said
    assert "Traceback" not in r.output


@pytest.mark.parametrize("entry, says", [
    # the first choice is valid, the second a key the synthetic workload does not read
    ("workload.shared_prefix: {type: categorical, choices: [false, true]}",
     "space.workload.shared_prefix at True: workload: workload.shared_prefix applies to agentic"),
    # the low end is the default (valid), the high end one the config refuses
    ("workload.time_scale: {type: float, low: 1.0, high: 2.0}",
     "space.workload.time_scale at 2.0: workload: workload.time_scale applies to Mooncake"),
])
def test_a_search_value_the_config_refuses_is_found_before_any_trial(tmp_path, entry, says):
    """Each end of each dimension (each choice) is checked with the file: else a trial that
    drew it stopped the tune mid-search, its folder and storage left behind."""
    p = tmp_path / "t.yaml"
    p.write_text(TUNE.replace("space:\n", f"space:\n  {entry}\n"))
    out = tmp_path / "o"
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert f"{p}: {says}" in said and "Traceback" not in said
    assert not out.exists()


def test_a_split_the_workload_cannot_have_stops_the_tune_at_its_first_trial(tmp_path):
    """One session cannot be split into train and held-out parts: every trial would fail
    alike, so the tune stops at the first (exit 2 naming split), not after its budget with
    "no trial completed" (exit 1)."""
    import optuna

    p = tmp_path / "t.yaml"
    p.write_text(TUNE.replace("n_sessions: 6", "n_sessions: 1"))
    out, db = tmp_path / "o", tmp_path / "shared.db"   # (a storage of the user's: it stays)
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "1", "--no-progress",
                            "--storage", f"sqlite:///{db}"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert f"{p}: split: " in said and "at least 2 sessions, the workload has 1" in said
    assert "Traceback" not in said and f"its trials stay in --storage sqlite:///{db}" in said
    trials = optuna.load_study(study_name="t", storage=f"sqlite:///{db}").trials
    assert len(trials) == 1     # of the budget of 3
    assert not out.exists()     # (its trial's run folder went with the folder it made)


def test_a_tune_stopped_by_its_file_leaves_nothing_of_its_own(tmp_path):
    """A tune whose file fails every trial (a misspelt metric) stops at its first: what it
    wrote goes, the folder too where it made it; a folder of the user's taken with --force
    keeps the user's files and gets no marker."""
    p = tmp_path / "t.yaml"
    p.write_text(TUNE.replace("minimize: ttft_s.p90", "minimize: ttft_s.p95"))
    out = tmp_path / "deep" / "o"
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "no metric 'ttft_s.p95'" in said, r.output
    assert "nothing of it was kept" in said
    assert not (tmp_path / "deep").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    r = runner.invoke(app, ["tune", str(p), "--out", str(mine), "--workers", "1", "--no-progress",
                            "--force"])
    assert r.exit_code == 2 and "nothing of it was kept" in " ".join(r.output.split()), r.output
    assert sorted(x.name for x in mine.iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------------- resuming a tune

RESUME = """\
name: r
base: default
set:
  workload.synthetic.n_sessions: 4
  output.plots: false
space:
  engine.gpu_free_watermark: {type: float, low: 0.0, high: 0.3}
  engine.max_batch_tokens: {type: int, low: 1024, high: 16384}
objective:
  minimize: ttft_s.p90
trials: 2
split: null
"""


def _trials(out: Path) -> list[dict]:
    import pandas as pd

    return pd.read_csv(out / "trials.csv", keep_default_na=False).to_dict("records")


def _params(row: dict) -> tuple:
    return (row["engine.gpu_free_watermark"], row["engine.max_batch_tokens"])


def test_a_resumed_tune_proposes_new_parameters_and_retries_a_killed_trial_once(tmp_path):
    import optuna

    p = tmp_path / "r.yaml"
    p.write_text(RESUME)
    out = tmp_path / "tune"
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    first = {_params(t) for t in _trials(out)}
    assert len(first) == 2
    # a tune killed (SIGKILL) while a trial ran: the trial stays RUNNING in the storage
    study = optuna.load_study(study_name="r", storage=f"sqlite:///{out / 'optuna.db'}")
    killed = study.ask()
    killed.suggest_float("engine.gpu_free_watermark", 0.0, 0.3)
    killed.suggest_int("engine.max_batch_tokens", 1024, 16384)
    lost = (killed.params["engine.gpu_free_watermark"], killed.params["engine.max_batch_tokens"])
    # the next start: that trial is interrupted (not failed), asked again once, and the two
    # new trials of the budget of 5 propose parameters none of the earlier ones had
    r = runner.invoke(app, ["tune", str(p), "--out", str(out), "--workers", "1", "--no-progress",
                            "--trials", "5"])
    assert r.exit_code == 0, r.output
    assert "5 trials complete, 0 failed, 1 interrupted (3 run now)" in r.output, r.output
    rows = _trials(out)
    assert [t["state"] for t in rows] == ["COMPLETE", "COMPLETE", "INTERRUPTED", "COMPLETE",
                                          "COMPLETE", "COMPLETE"]
    retry = [t for t in rows if t["retry_of"] != ""]
    assert len(retry) == 1 and int(float(retry[0]["retry_of"])) == killed.number
    assert _params(retry[0]) == pytest.approx(lost)
    new = [_params(t) for t in rows[3:] if t["retry_of"] == ""]
    assert len(new) == 2 and not set(new) & first and len(set(new)) == 2
    assert optuna.load_study(study_name="r", storage=f"sqlite:///{out / 'optuna.db'}").trials[
        killed.number].state == optuna.trial.TrialState.PRUNED


def test_a_storage_holding_another_tunes_study_of_the_name_is_refused(tmp_path):
    """One storage may hold many tunes' studies, by name; a tune of another config under
    the same name would rank its trials with the other's, its best config one this search
    never asked for."""
    import optuna

    from kvsim.study.tune import plan_tune, tune_hash

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(RESUME)
    b.write_text(RESUME.replace("engine.max_batch_tokens: {type: int, low: 1024, high: 16384}",
                                "engine.max_running: {type: int, low: 8, high: 64}"))
    db = tmp_path / "shared.db"
    url = f"sqlite:///{db}"
    r = runner.invoke(app, ["tune", str(a), "--out", str(tmp_path / "a"), "--workers", "1",
                            "--no-progress", "--storage", url])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["tune", str(b), "--out", str(tmp_path / "b"), "--workers", "1",
                            "--no-progress", "--storage", url])
    said = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    ha, hb = tune_hash(*plan_tune(str(a))), tune_hash(*plan_tune(str(b)))
    assert f"--storage {url}" in said and ha in said and hb in said and "Traceback" not in said
    assert not (tmp_path / "b").exists()                       # nothing left behind
    assert len(optuna.load_study(study_name="r", storage=url).trials) == 2   # nor added
    # a study of that name that kvsim did not make (no hash) is not taken either
    other = f"sqlite:///{tmp_path / 'other.db'}"
    optuna.create_study(study_name="r", storage=other).enqueue_trial({"x": 1})
    r = runner.invoke(app, ["tune", str(a), "--out", str(tmp_path / "c"), "--workers", "1",
                            "--no-progress", "--storage", other])
    assert r.exit_code == 2 and "not a kvsim tune's" in " ".join(r.output.split()), r.output
    # the same tune continues its study from another folder: its budget is already spent
    r = runner.invoke(app, ["tune", str(a), "--out", str(tmp_path / "a2"), "--workers", "1",
                            "--no-progress", "--storage", url])
    assert r.exit_code == 0 and "2 trials complete, 0 failed (0 run now)" in r.output, r.output


def test_an_interrupted_tune_prints_a_command_that_continues_it(tmp_path):
    import shlex

    p = tmp_path / "r.yaml"
    n = 24  # trials of about 0.2 s: the interrupt lands while most are still to run
    p.write_text(RESUME.replace("trials: 2", f"trials: {n}"))
    out = tmp_path / "my tune"              # a space: the printed command quotes it
    exe = Path(sys.executable).with_name("kvsim")
    cmd = [str(exe), "tune", str(p), "--out", str(out), "--workers", "1", "--no-progress",
           "--set", "workload.synthetic.n_sessions=12"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        second = out / "trials" / "0001"  # (with one worker, the first trial is told by then)
        while not second.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert second.exists(), "no trial finished within 90 s"
        os.killpg(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 130, err
    hint = re.search(r"to continue: (kvsim tune .*)$", err, re.M)
    assert hint, err
    again = shlex.split(hint.group(1))
    assert again[again.index("--out") + 1] == str(out)
    assert again[again.index("--set") + 1] == "workload.synthetic.n_sessions=12"
    done = sum(1 for t in _trials_db(out) if t.state.name == "COMPLETE")
    assert 1 <= done < n
    r = subprocess.run([str(exe), *again[1:]], cwd=tmp_path,   # exactly as printed
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    states = [t["state"] for t in _trials(out)]
    assert "FAIL" not in states and states.count("COMPLETE") == n, states
    assert states.count("INTERRUPTED") == len([t for t in _trials(out) if t["retry_of"] != ""])


def _trials_db(out: Path):
    import optuna

    return optuna.load_study(study_name="r", storage=f"sqlite:///{out / 'optuna.db'}").trials


# ----------------------------------------------------------------- honest, legible output


def test_a_point_with_failed_requests_says_so_and_equal_points_are_flagged(tmp_path):
    import csv

    p = _study(tmp_path, """\
grid:
  cache.tiers[0].quota: [2GiB, 24GiB]
variants:
  - {name: default, set: {}}
  - {name: same, set: {engine.hold_sessions: true}}     # the default already: changes nothing
  - {name: smaller-batch, set: {engine.max_batch_tokens: 1024}}
""")
    out = tmp_path / "out"
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "2", "--no-progress"])
    assert r.exit_code == 0, r.output
    rows = {row["point"]: row for row in _table(out)}

    def failed(name: str) -> int:   # counted from the point's own requests.csv
        with open(out / "points" / name / "requests.csv", newline="") as f:
            return sum(1 for row in csv.DictReader(f) if row["failed"])

    small = rows["default__quota=2GiB"]
    n = failed("default__quota=2GiB")
    assert n > 0, "a 2 GiB GPU tier should fail some of these requests"
    assert small["status"] == "requests failed" and small["requests_failed"] == n
    assert small["error"].startswith(f"{n} of {n + small['requests_completed']} requests failed (")
    assert rows["default__quota=24GiB"]["status"] == "ok" and failed("default__quota=24GiB") == 0
    assert "requests failed: " in r.output                       # the printed table says so too
    # same_as: the points whose requests.csv is byte for byte an earlier point's
    data = {name: (out / "points" / name / "requests.csv").read_bytes() for name in rows}
    for name, row in rows.items():
        earlier = [o for o in rows if o != name and list(rows).index(o) < list(rows).index(name)
                   and data[o] == data[name]]
        assert row["same_as"] == (earlier[0] if earlier else ""), name
    assert rows["same__quota=24GiB"]["same_as"] == "default__quota=24GiB"
    assert rows["smaller-batch__quota=24GiB"]["same_as"] == ""


def test_plots_have_titles_units_numeric_legends_distinct_series_and_seed_bands(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from kvsim.study.figures import natural, style, write_study_plots
    from kvsim.study.points import axis_keys
    from kvsim.study.table import build_rows

    assert sorted(["10", "2", "1", "64GiB", "8GiB", "x"], key=natural) == ["1", "2", "10", "8GiB", "64GiB", "x"]
    looks = {tuple(style(i).values()) for i in range(12)}
    assert len(looks) == 12                                       # 12 series, 12 looks
    p = _study(tmp_path, """\
grid:
  cache.tiers[0].quota: [4GiB, 24GiB]
  engine.max_running: [1, 2, 10]
variants:
  - {name: a, set: {}}
  - {name: b, set: {engine.max_batch_tokens: 4096}}
seeds: [0, 1]
""")
    out = tmp_path / "out"
    r = runner.invoke(app, ["study", str(p), "--out", str(out), "--workers", "2", "--no-progress",
                            "--no-plots"])
    assert r.exit_code == 0, r.output
    spec, points = load_study(p), _points(p)
    rows = build_rows(points, lambda q: out / "points" / q.name, list(spec.metrics), {}, None)
    drawn: dict[str, Figure] = {}
    for where in ("kvsim.study.figures", "kvsim.study.tierbars"):   # (each plot is written whole)
        monkeypatch.setattr(f"{where}.save_png", lambda fig, path, **kw: drawn.setdefault(Path(path).name, fig))
    write_study_plots(points, rows, lambda q: out / "points" / q.name, list(spec.plot_metrics),
                      tmp_path / "plots", axes=axis_keys(spec), study=spec.name)
    assert set(drawn) == {"axis-quota.png", "axis-max_running.png", "ttft_cdf.png", "variants.png"}
    for name, fig in drawn.items():
        title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
        assert title.startswith("small"), (name, title)
        for ax in fig.axes:
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                if label or name != "variants.png":
                    assert re.search(r"\(.+\)$", label), (name, label)   # a unit in parentheses
    quota = drawn["axis-quota.png"]
    assert quota.axes[0].get_xlabel() == "cache.tiers[0].quota (GiB)"
    assert quota.axes[0].get_ylabel() == "TTFT p90 (s)"
    legend = [t.get_text() for t in quota.legends[0].get_texts()]
    assert legend == ["a max_running=1", "a max_running=2", "a max_running=10",
                      "b max_running=1", "b max_running=2", "b max_running=10"]
    assert "mean over 2 seeds" in quota._suptitle.get_text()
    assert all(ax.collections for ax in quota.axes)               # a band per series
    bars = drawn["variants.png"]
    assert all(ax.containers and ax.containers[-1].errorbar is not None for ax in bars.axes)
    assert "error bars: lowest to highest" in bars._suptitle.get_text()


def test_an_interrupted_close_waits_seconds_and_stops_its_own_workers():
    """On a signal or an error, a Dask close that hangs is given up after QUICK_CLOSE_S,
    the worker processes kvsim started are killed, and Dask's exit hook skips the
    cluster; a normal end closes as Dask does, without a limit."""
    from types import SimpleNamespace

    from kvsim.study import daskclient as dask_cluster

    calls = []

    class Hangs:
        def close(self, timeout=None):
            calls.append(timeout)
            if timeout is not None:
                raise TimeoutError("still closing")

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cluster = Hangs()
        cluster.shutdown_on_close = True
        cluster.workers = {"w0": SimpleNamespace(process=SimpleNamespace(pid=worker.pid)),
                           "w1": SimpleNamespace(process=None)}
        t0 = time.monotonic()
        dask_cluster._close(Hangs(), cluster, quick=True)
        assert worker.wait(timeout=10) == -signal.SIGKILL
        assert time.monotonic() - t0 < 10
        assert calls == [dask_cluster.QUICK_CLOSE_S] * 2 and cluster.shutdown_on_close is False
        calls.clear()
        dask_cluster._close(Hangs(), None, quick=False)
        assert calls == [None]
    finally:
        if worker.poll() is None:
            worker.kill()


@pytest.mark.skipif(sys.platform != "linux", reason="kvsim's workers fork from a fork server on Linux")
def test_a_ctrl_c_while_the_fork_server_imports_leaves_it_running(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group, the fork server too, which
    imports Dask and kvsim for a second after it starts: it goes on, quietly, and the
    command sees the Ctrl-C. (A module that signals and sleeps stands for that second.)"""
    (tmp_path / "slow_import.py").write_text(textwrap.dedent(f"""
        import pathlib, time
        pathlib.Path({str(tmp_path / "importing")!r}).touch()
        time.sleep(2)
    """))
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from multiprocessing import forkserver
        from kvsim.study import daskclient as cluster

        cluster.WORKER_MODULES = cluster.WORKER_MODULES[:1] + ("slow_import",) + cluster.WORKER_MODULES[1:]
        signal.signal(signal.SIGINT, lambda *_: print("command saw it", flush=True))
        cluster._preload_fork_server({{"distributed.worker.multiprocessing-method": "forkserver"}})
        deadline = time.monotonic() + 30
        while not os.path.exists({str(tmp_path / "importing")!r}) and time.monotonic() < deadline:
            time.sleep(0.01)
        os.killpg(0, signal.SIGINT)
        time.sleep(3)
        pid = forkserver._forkserver._forkserver_pid
        print("alive" if os.waitpid(pid, os.WNOHANG) == (0, 0) else "gone", flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(   # (the fork server's path: Python 3.11's
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}   # ignores the parent's)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         start_new_session=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["command saw it", "alive"], out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "KeyboardInterrupt" not in out.stderr, out.stderr


def test_only_dasks_cancel_noise_is_dropped_from_the_log():
    """The NameError Dask's ``sync`` raises in its cancel callback on a Ctrl-C is not
    logged; any other NameError, or any other error, is."""
    import logging

    from kvsim.study.daskclient import SyncCancelNoise

    def record_of(filename: str, name: str) -> logging.LogRecord:
        ns: dict = {}
        exec(compile(f"def {name}():\n    return future\n", filename, "exec"), ns)
        try:
            ns[name]()
        except NameError:
            exc_info = sys.exc_info()
        return logging.LogRecord("tornado.application", logging.ERROR, filename, 1,
                                 "Exception in callback", None, exc_info)

    noise = SyncCancelNoise()
    assert not noise.filter(record_of("/x/site-packages/distributed/utils.py", "cancel"))
    assert noise.filter(record_of("/x/site-packages/distributed/utils.py", "other"))
    assert noise.filter(record_of("/x/kvsim/study/daskclient.py", "cancel"))
    assert noise.filter(logging.LogRecord("tornado.application", logging.ERROR, "f", 1, "m", None, None))


def test_a_signal_that_comes_out_as_another_error_is_an_interrupt():
    """A Ctrl-C inside C code can come out as another error (matplotlib's renderer turns
    it into "ValueError: Invalid bounding box"): the command reports the interrupt (exit
    130, one line); an error without a signal stays that error."""
    import io

    import typer
    from rich.console import Console

    from kvsim.cli_studies import _plan_and_run

    def cut_short(_planned):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise ValueError("Invalid bounding box") from None

    def fails(_planned):
        raise ValueError("a real error")

    console = Console(file=io.StringIO(), width=200)
    with pytest.raises(typer.Exit) as e:
        _plan_and_run(console, "study", lambda: ("planned",), cut_short, lambda _p: "kept this")
    assert e.value.exit_code == 130
    assert "interrupted (SIGINT); kept this" in console.file.getvalue()
    with pytest.raises(ValueError, match="a real error"):
        _plan_and_run(console, "study", lambda: ("planned",), fails, lambda _p: "kept this")


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_processes_spawned_ignoring_sigint_and_the_command_still_sees_it():
    """What ``spawn_ignoring_sigint`` starts blocks SIGINT from its first instant; a
    SIGINT to the command meanwhile is not lost, and its handler runs after, though numpy
    (imported here, as kvsim imports it) has started a BLAS thread that may be the one
    the signal reaches."""
    code = textwrap.dedent("""
        import os, signal, subprocess, sys, time
        from pathlib import Path
        import numpy
        from kvsim.study.daskclient import spawn_ignoring_sigint

        seen = []
        signal.signal(signal.SIGINT, lambda *_: seen.append(time.monotonic()))
        kids = []

        def start():
            kids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]))
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            print("during", len(seen), flush=True)

        spawn_ignoring_sigint(start)
        time.sleep(0.2)
        print("after", len(seen), flush=True)
        status = Path(f"/proc/{kids[0].pid}/status").read_text().splitlines()
        blk = next(l for l in status if l.startswith("SigBlk:"))
        print("child blocks" if int(blk.split()[1], 16) >> (signal.SIGINT - 1) & 1 else "child does not",
              flush=True)
        kids[0].kill()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["during 0", "after 1", "child blocks"], out.stdout
