"""A new user's mistakes, one by one: kvsim refuses them before any work, names the file,
line or key, exits 2, writes nothing, and never deletes what it did not create."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvsim.console
from kvsim import scratch
from kvsim.cli import app
from kvsim.run.results import MARKER

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--no-progress", "--set", "workload.synthetic.n_sessions=2"]
MOONCAKE = "configs/mooncake-conversation.yaml"


def _run(*args: str):
    return runner.invoke(app, ["run", "default", *SMALL, *args])


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- the results folder: what a run may replace ----------------------------------------------
def test_a_folder_kvsim_did_not_write_is_refused_before_the_replay(tmp_path):
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    (home / "notes.txt").write_text("precious")
    (home / "src" / "main.c").write_text("int main;")
    before = _tree(home)
    # --trace names a file that does not exist: had the replay started, that would be the error
    r = _run("--out", str(home), "--trace", str(tmp_path / "nope.jsonl"))
    assert r.exit_code == 2, r.output
    assert f"--out {home}: exists and was not written by kvsim" in r.output
    assert _tree(home) == before and sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_output_dir_in_a_config_is_held_to_the_same_rule(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep").write_text("x")
    r = _run("--set", f"output.dir={mine}")
    assert r.exit_code == 2 and f"output.dir {mine}: exists and was not written by kvsim" in r.output
    assert (mine / "keep").read_text() == "x"


def test_a_results_folder_is_marked_and_may_be_replaced(tmp_path):
    out = tmp_path / "res"
    assert _run("--out", str(out)).exit_code == 0
    marker = json.loads((out / MARKER).read_text())
    assert marker["kind"] == "run" and set(marker["wrote"]) == {p.name for p in out.iterdir()} - {MARKER}
    # a file an older run wrote (its marker says so) that this one does not write: replaced
    (out / "stale.txt").write_text("from an older run")
    (out / MARKER).write_text(json.dumps({**marker, "wrote": [*marker["wrote"], "stale.txt"]}))
    r = _run("--out", str(out), "--set", "seed=1")
    assert r.exit_code == 0, r.output
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "summary.json").read_text())["config"]["seed"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]  # no staging left beside it


def test_an_empty_folder_may_take_the_results(tmp_path):
    (tmp_path / "empty").mkdir()
    assert _run("--out", str(tmp_path / "empty")).exit_code == 0
    assert (tmp_path / "empty" / "summary.json").exists()


@pytest.mark.parametrize("case", ["file", "dot", "parent-file", "unwritable", "too-long"])
def test_path_problems_are_refused_before_the_replay(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("keep")
    out, expect = {
        "file": ("a-file", "exists and is not a folder"),
        "dot": (".", "is the current folder or holds it"),
        "parent-file": ("a-file/res", "a-file is not a folder"),
        "unwritable": ("/proc/kvsim-res", "cannot create a folder in /proc"),
        "too-long": ("x" * 300, "the folder name is 300 bytes long"),
    }[case]
    r = _run("--out", out, "--trace", str(tmp_path / "nope.jsonl"))
    assert r.exit_code == 2 and expect in r.output, r.output
    assert "Traceback" not in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    assert (tmp_path / "a-file").read_text() == "keep"


def test_a_killed_runs_staging_folder_is_removed_by_the_next_start(tmp_path):
    dead = tmp_path / f".res.kvsim-{2**22 + 7}-1-{scratch._host()}-abcdefgh"  # no such pid
    dead.mkdir()
    (dead / "summary.json").write_text("{half")
    other = tmp_path / ".res.0123"  # not a name kvsim gives: not touched
    other.mkdir()
    assert _run("--out", str(tmp_path / "res")).exit_code == 0
    assert not dead.exists() and other.exists()


def test_diff_out_replaces_only_its_own_report(tmp_path):
    a = tmp_path / "a"
    assert _run("--out", str(a)).exit_code == 0
    precious = tmp_path / "notes.json"
    precious.write_text('{"mine": 1}')
    r = runner.invoke(app, ["diff", str(a), str(a), "--out", str(precious)])
    assert r.exit_code == 2 and "exists and was not written by kvsim diff" in r.output
    assert precious.read_text() == '{"mine": 1}'
    rep = tmp_path / "d.json"
    for _ in range(2):
        assert runner.invoke(app, ["diff", str(a), str(a), "--out", str(rep)]).exit_code == 0
    assert json.loads(rep.read_text())["kvsim_report"] == "diff"


# -- inputs that crashed or were silently accepted ---------------------------------------------
def _config(tmp_path, text: bytes | str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


CONFIG = "cache:\n  tiers:\n    - {level: gpu, quota: 24GiB}\nworkload:\n  synthetic: {n_sessions: 2}\n"


@pytest.mark.parametrize("text, expect", [
    (b"name: x\n\xff\n" + CONFIG.encode(), r"c\.yaml:2: not UTF-8 text \(byte 0xff\)"),
    ("name: a\n" + CONFIG + "name: b\n", r"c\.yaml:7:1: .*duplicate key 'name' \(first given on line 1\)"),
    (CONFIG + "engine: {max_batch_tokens: true}\n",
     r"engine\.max_batch_tokens: expected a whole number, got the boolean True"),
    (CONFIG + "workload: {sessions_per_s: .inf}\n", r"duplicate key 'workload'"),
    (CONFIG.replace("n_sessions: 2}", "n_sessions: 2}\n  sessions_per_s: .inf"),
     r"workload\.sessions_per_s: Input should be a finite number"),
    (CONFIG + "engine: {gpu_free_watermark: .nan}\n", r"engine\.gpu_free_watermark: .*finite number"),
    (CONFIG + "output: {timeline_interval: 0}\n", r"output\.timeline_interval: Input should be greater than 0"),
    (CONFIG.replace("24GiB", ".inf"), r"cache\.tiers\[0\]\.quota: expected a size, got the non-finite inf"),
    (CONFIG.replace("24GiB", "lots"), r"cache\.tiers\[0\]\.quota: expected a size \(e\.g\. '160GiB'\), got 'lots'$"),
    # an alias inside its own anchor: a traceback (RecursionError), exit 1
    (CONFIG.replace("workload:\n", "workload: &w\n  x: *w\n"),
     r"c\.yaml:5:6: malformed YAML: the alias \*w lies inside the node its anchor &w names"),
    # an alias bomb (10^8 values): minutes and gigabytes of validation before it failed
    (CONFIG + "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 8)),
     r"c\.yaml:\d+:\d+: malformed YAML: its aliases expand it to more than 1,000,000 values"),
])
def test_bad_config_files_name_the_file_and_key(tmp_path, text, expect):
    cfg = _config(tmp_path, text)
    r = runner.invoke(app, ["run", str(cfg), "--no-progress", "--out", str(tmp_path / "res")])
    assert r.exit_code == 2, r.output
    assert re.search(expect, r.output.strip(), re.M), r.output
    assert "(got" not in r.output.split("got", 1)[-1] or r.output.count("(got") <= 1
    assert not (tmp_path / "res").exists()


def test_a_merge_key_is_read_as_yaml_reads_it(tmp_path):
    """``<<: *t`` (YAML 1.1's merge key, which PyYAML's safe loader reads) was refused as
    malformed YAML ("could not determine a constructor for the tag ...merge"): the
    duplicate-key check constructed it as a plain key."""
    cfg = _config(tmp_path, "workload: {synthetic: {n_sessions: 2}}\ncache:\n  tiers: [&t {level: gpu, "
                  "quota: 24GiB, eviction: lfu}, {<<: *t, level: host, quota: 48GiB}]\n")
    r = runner.invoke(app, ["run", str(cfg), "--no-progress", "--out", str(tmp_path / "res")])
    assert r.exit_code == 0, r.output
    tiers = json.loads((tmp_path / "res" / "summary.json").read_text())["config"]["cache"]["tiers"]
    assert [(t["level"], t["eviction"]) for t in tiers] == [("gpu", "lfu"), ("host", "lfu")]
    cfg.write_text(cfg.read_text().replace("quota: 48GiB}", "quota: 48GiB, level: disk}"))
    r = runner.invoke(app, ["run", str(cfg), "--no-progress", "--out", str(tmp_path / "res2")])
    assert r.exit_code == 2 and "duplicate key 'level'" in r.output, r.output


@pytest.mark.parametrize("tail, expect", [
    (b"name: twice\n", r"p\.yaml:\d+:1: malformed YAML: duplicate key 'name' \(first given on line \d+\)"),
    (b"\xff\n", r"p\.yaml:\d+: not UTF-8 text \(byte 0xff\)"),
    (b"x: &x [*x]\n", r"p\.yaml:\d+:\d+: malformed YAML: the alias \*x lies inside"),
])
def test_bad_profile_files_are_read_as_strictly_as_configs(tmp_path, tail, expect):
    """A hardware profile file took its last duplicate key silently and, not UTF-8, failed
    with the codec's message alone (no file named)."""
    prof = tmp_path / "p.yaml"
    prof.write_bytes((ROOT / "configs" / "hardware" / "h200-pcie.yaml").read_bytes() + tail)
    r = _run("--set", f"hardware={prof}", "--out", str(tmp_path / "res"))
    assert r.exit_code == 2 and re.search(expect, r.output), r.output
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("arg, expect", [
    ("seed=-5", "--set seed=-5: seed: Input should be greater than or equal to 0"),
    ("cache.tiers[0].quota=99999999TiB", "--set cache.tiers[0].quota=99999999TiB: cache.tiers[0].quota: "
                                         "size '99999999TiB' is more than 1 EiB"),
    ("cache.tiers[0].quota=1e30", "size '1e30' is more than 1 EiB"),
    ("engine.max_batch_tokens=true", "--set engine.max_batch_tokens=true: engine.max_batch_tokens: "
                                     "expected a whole number, got the boolean True"),
    ("output.timeline_interval=0", "--set output.timeline_interval=0: output.timeline_interval"),
    ("workload.sessions_per_s=.inf", "--set workload.sessions_per_s=.inf: workload.sessions_per_s"),
    ("cache.tiers[0].quota=2048TiB", "cache.tiers[0].quota: 429,496,729 pages of 5,242,880 bytes; "
                                    "kvsim handles at most"),
])
def test_set_errors_name_the_set_argument(tmp_path, arg, expect):
    r = _run("--set", arg, "--out", str(tmp_path / "res"))
    assert r.exit_code == 2 and expect in r.output, r.output
    assert "invalid configuration" not in r.output
    assert not (tmp_path / "res").exists()


def test_size_errors_say_what_was_given_once():
    from kvsim.config import ConfigFileError, load_config

    with pytest.raises(ConfigFileError) as e:
        load_config("configs/default.yaml", ["cache.tiers[1].quota=lots"])
    assert str(e.value).count("'lots'") == 1


@pytest.mark.parametrize("line, expect", [
    (b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [9223372036854775808]}',
     "t.jsonl:1: hash id 9223372036854775808 is out of range; expected 0 <= id < 2**63"),
    (b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-1]}',
     "t.jsonl:1: hash id -1 is out of range"),
    (b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n\xff\xfe',
     "t.jsonl:2: not UTF-8 text (byte 0xff at column 1)"),
    (b"\n\n", "t.jsonl: no requests to replay"),
    (b"", "t.jsonl: no requests to replay"),
])
def test_bad_traces_name_the_file_and_line(tmp_path, line, expect):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(line + b"\n")
    r = runner.invoke(app, ["run", MOONCAKE, "--trace", str(trace), "--no-progress",
                            "--out", str(tmp_path / "res")])
    assert r.exit_code == 2 and expect in r.output, r.output
    assert not (tmp_path / "res").exists()


def test_summary_records_how_the_run_ran(tmp_path):
    out = tmp_path / "res"
    assert _run("--out", str(out)).exit_code == 0
    s = json.loads((out / "summary.json").read_text())
    run = s["run"]
    assert run["backend"] == "sim" and run["device"] == "simulated" and run["time_scale"] is None
    assert run["kvsim_version"] == s["kvsim"] == version("kvsim")
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert run["git_commit"].removesuffix("-dirty") == head.stdout.strip()
    assert "Infinity" not in (out / "summary.json").read_text()


def test_hw_summary_names_device_and_time_scale(tmp_path):
    out = tmp_path / "res"
    r = _run("--backend", "hw", "--device", "cpu", "--time-scale", "50", "--out", str(out),
             "--set", "workload.synthetic.n_sessions=1", "--set", "cache.page_bytes=4KiB",
             "--set", "cache.tiers=[{level: gpu, quota: 4MiB}, {level: host, quota: 2MiB}]")
    assert r.exit_code == 0, r.output
    run = json.loads((out / "summary.json").read_text())["run"]
    assert run["backend"] == "hw" and run["device"] == "cpu" and run["time_scale"] == 50.0


def test_off_a_terminal_progress_is_logged(tmp_path, monkeypatch):
    monkeypatch.setattr(kvsim.console, "LOG_EVERY_S", 0.0)
    r = runner.invoke(app, ["run", "configs/default.yaml", "--set", "workload.synthetic.n_sessions=2",
                            "--out", str(tmp_path / "res")])
    assert r.exit_code == 0
    lines = [ln for ln in r.output.splitlines() if ln.startswith("replay: ")]
    assert lines and re.match(r"replay: \d+/\d+ requests, simulated [\d.]+ s, wall \d+ s", lines[-1])
    quiet = runner.invoke(app, ["run", "configs/default.yaml", *SMALL, "--out", str(tmp_path / "q")])
    assert "replay: " not in quiet.output


def test_calibrate_replaces_only_a_profile_it_wrote(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("link: {h2d: 1}\n")
    r = runner.invoke(app, ["calibrate", "--out", str(mine), "--from-report",
                            str(ROOT / "configs/hardware/h200-pcie-calibrated.yaml.report.json")])
    assert r.exit_code == 2 and "exists and was not written by kvsim calibrate" in r.output, r.output
    assert mine.read_text() == "link: {h2d: 1}\n" and not Path(str(mine) + ".report.json").exists()
    ours = tmp_path / "p.yaml"
    for _ in range(2):  # a profile it wrote may be written again
        r = runner.invoke(app, ["calibrate", "--out", str(ours), "--from-report",
                                str(ROOT / "configs/hardware/h200-pcie-calibrated.yaml.report.json")])
        assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, expect", [
    (["default", "--set", "workload.sessions_per_s=1e-20"], "workload.sessions_per_s: the last arrival would come at"),
    ([MOONCAKE, "--trace", str(ROOT / "traces/fixtures/mooncake_ok.jsonl"), "--set", "workload.time_scale=1e12"],
     "workload.time_scale: the last arrival would come at"),
])
def test_arrivals_beyond_the_clocks_range_are_refused(tmp_path, args, expect):
    """Found by the fuzz test: arrivals some 1e23 s away left the replay spinning forever
    (the float clock no longer moved by a step)."""
    r = runner.invoke(app, ["run", *args, "--no-progress", "--out", str(tmp_path / "res")])
    assert r.exit_code == 2 and expect in r.output, r.output


def _session_with_think(folder: Path, think_s: float) -> Path:
    """A one-session agentic trace: a turn, then a second one ``think_s`` later."""
    folder.mkdir()
    turns = [{"t": 0, "in": 128, "out": 4, "hash_ids": [1, 2]},
             {"t": 1, "in": 192, "out": 4, "hash_ids": [1, 2, 3], "think_time": think_s}]
    (folder / "s.json").write_text(json.dumps({"id": "s1", "block_size": 64, "tool_tokens": 0,
                                               "system_tokens": 0, "requests": turns}))
    return folder


@pytest.mark.parametrize("think_s", [1e300, 2**53 / 1e9 * 2])
def test_think_times_beyond_the_clocks_range_are_refused(tmp_path, think_s):
    """A session's second turn comes ``think_s`` after its first ends: at 1e300 s the clock
    overflowed (OverflowError, a traceback, exit 1); past 2**53 ns it is no longer exact."""
    trace = _session_with_think(tmp_path / "sessions", think_s)
    r = runner.invoke(app, ["run", "configs/agentic-slice.yaml", "--no-progress", "--trace", str(trace),
                            "--set", "workload.max_think=null", "--out", str(tmp_path / "res")])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {trace}: session s1: its last turn would come at "
                               f"{think_s:.3g} s"), r.output
    assert not (tmp_path / "res").exists()
    # capped below the range, the same trace runs
    r = runner.invoke(app, ["run", "configs/agentic-slice.yaml", "--no-progress", "--trace", str(trace),
                            "--set", "workload.max_think=5s", "--out", str(tmp_path / "res")])
    assert r.exit_code == 0, r.output


def test_synthetic_think_times_beyond_the_clocks_range_are_refused(tmp_path):
    r = _run("--set", "workload.synthetic.think_s=1e300", "--out", str(tmp_path / "res"))
    assert r.exit_code == 2 and r.output.startswith(
        "error: --set workload.synthetic.think_s=1e300: workload.synthetic.think_s: session "), r.output
    assert not (tmp_path / "res").exists()


def _one_turn_session(folder: Path, tokens: int, block_size: int) -> Path:
    folder.mkdir()
    turns = [{"t": 0, "in": tokens, "out": 4, "hash_ids": list(range(1, -(-tokens // block_size) + 1))}]
    (folder / "s.json").write_text(json.dumps({"id": "s1", "block_size": block_size, "tool_tokens": 0,
                                               "system_tokens": 0, "requests": turns}))
    return folder


def test_a_request_whose_cache_blocks_cannot_fit_in_memory_is_refused(tmp_path):
    """A few bytes of JSON may ask for 1e30 input tokens: their cache blocks (one key each
    32 tokens) would fill memory before the request could fail, so the run is refused
    before it starts, naming the trace and the session."""
    trace = _one_turn_session(tmp_path / "sessions", 10**30, 10**30)
    r = runner.invoke(app, ["run", "configs/agentic-slice.yaml", "--no-progress", "--trace", str(trace),
                            "--out", str(tmp_path / "res")])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {trace}: session s1: a request of {10**30:,} input tokens "
                               "would take about"), r.output
    assert not (tmp_path / "res").exists()


def test_a_trace_block_far_larger_than_its_request_runs(tmp_path):
    """A trace block of 1e30 tokens holding a request of 128: the request's cache blocks
    are the four of 32 tokens it fills, not a trace block's worth (which never ended)."""
    trace = _one_turn_session(tmp_path / "sessions", 128, 10**30)
    r = runner.invoke(app, ["run", "configs/agentic-slice.yaml", "--no-progress", "--trace", str(trace),
                            "--out", str(tmp_path / "res")])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert summary["metrics"]["input_tokens"] == 128


# -- the --set grammar, and every error naming its source -------------------------------------
@pytest.mark.parametrize("arg, expect", [
    ("=3", "--set =3: the key is empty"),
    (".=3", "--set .=3: an empty part at column 1"),
    (" =3", "--set  =3: the key is empty"),
    ("cache..quota=3", "--set cache..quota=3: an empty part at column 7"),
    ("cache.tiers[x].quota=1GiB", "--set cache.tiers[x].quota=1GiB: bad list index [x] at column 12"),
    ("cache.tiers[-1].quota=1GiB", "--set cache.tiers[-1].quota=1GiB: bad list index [-1]"),
    ("cache.tiers[].quota=1GiB", "--set cache.tiers[].quota=1GiB: bad list index []"),
    ("cache.tiers[0.quota=1GiB", "--set cache.tiers[0.quota=1GiB: bad list index [0.quota"),
    ("cache.tiers[9].quota=1GiB", "--set cache.tiers[9].quota=1GiB: no list item [9] there"),
    ("cache.tiers.quota=1GiB", "--set cache.tiers.quota=1GiB: cache.tiers is a list"),
    ("cache.tierz[0].quota=1GiB", "--set cache.tierz[0].quota=1GiB: cache.tierz: no such key in cache"),
    ("nonsense.key=1", "--set nonsense.key=1: nonsense: no such key in the configuration"),
    ("seed.low=1", "--set seed.low=1: seed is a value, not a section"),
    ("engine max_running=3", "--set engine max_running=3: ' ' at column 7 cannot be in a key"),
    ("cache.tiers[0].level=host", "--set cache.tiers[0].level=host: cache: tiers must be ordered"),
])
def test_set_paths_are_parsed_by_one_grammar_and_name_the_argument(tmp_path, arg, expect):
    r = _run("--set", arg, "--out", str(tmp_path / "res"))
    assert r.exit_code == 2, r.output
    assert r.output == f"error: {expect}" + r.output.split(expect, 1)[1], r.output
    assert r.output.count("\n") == 1 and "Traceback" not in r.output
    assert not (tmp_path / "res").exists()


def test_a_disk_tier_path_the_system_cannot_look_up_names_the_key(tmp_path):
    """A component over the file system's 255 bytes: the tier's check asked whether the
    path exists and the OSError escaped validation (``error: [Errno 36] ...``, no key)."""
    path = "/" + "v" * 300
    r = _run("--set", f"cache.tiers[2].path={path}", "--out", str(tmp_path / "res"))
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: --set cache.tiers[2].path={path}: cache.tiers[2]: path "
                               f"'{path}': File name too long"), r.output
    assert not (tmp_path / "res").exists()


def test_an_error_in_the_file_names_its_line_and_one_from_set_the_argument(tmp_path):
    cfg = _config(tmp_path, CONFIG + "engine:\n  max_running: 0\n")   # line 6
    r = runner.invoke(app, ["run", str(cfg), "--no-progress", "--out", str(tmp_path / "res")])
    assert r.exit_code == 2 and f"error: {cfg}:7: engine.max_running: Input should be greater than 0" \
        in r.output, r.output
    # the file is fine on its own; a --set breaks a rule across keys: the --set is named
    cfg = _config(tmp_path, CONFIG)
    r = runner.invoke(app, ["run", str(cfg), "--no-progress", "--out", str(tmp_path / "res"),
                            "--set", "cache.tiers=[{level: host, quota: 1GiB}]"])
    assert r.exit_code == 2 and r.output.startswith(
        "error: --set cache.tiers=[{level: host, quota: 1GiB}]: cache: tiers must be ordered"), r.output


# A rule across the workload's keys broken by --set arguments: the argument that breaks
# it is named, not the last one under workload; where only several together break it,
# they are named together.
@pytest.mark.parametrize("config, sets, names", [
    # the file's limit: 100 is a trace's key: kind=synthetic alone conflicts with it
    ("configs/agentic-coding.yaml", ["workload.kind=synthetic", "workload.path=null"],
     "--set workload.kind=synthetic: workload: workload.limit applies to traces only"),
    # a synthetic workload's limit conflicts with its kind whatever the path
    ("configs/default.yaml", ["workload.limit=5", "workload.path=null"],
     "--set workload.limit=5: workload: workload.limit applies to traces only"),
    ("configs/default.yaml", ["workload.time_scale=2", "workload.scope=session"],
     "--set workload.time_scale=2: workload: workload.time_scale applies to Mooncake traces only"),
    # mooncake alone keeps the file's path (its error: max_think); path=null alone leaves an
    # agentic workload without one: a mooncake workload without a path is both together
    ("configs/agentic-coding.yaml", ["workload.kind=mooncake", "workload.path=null"],
     "--set workload.kind=mooncake and --set workload.path=null (together): workload: a mooncake "
     "workload needs a path"),
    # synthetic alone or time_scale 2 alone is fine on the Mooncake config; scope is no part
    ("configs/mooncake-conversation.yaml",
     ["workload.kind=synthetic", "workload.time_scale=2", "workload.scope=session"],
     "--set workload.kind=synthetic and --set workload.time_scale=2 (together): workload: "
     "workload.time_scale applies to Mooncake traces only"),
])
def test_a_rule_across_workload_keys_names_the_set_arguments_that_break_it(tmp_path, config,
                                                                          sets, names):
    from kvsim.config import ConfigFileError, load_config

    with pytest.raises(ConfigFileError) as e:
        load_config(config, sets)
    assert str(e.value).startswith(names), str(e.value)
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", config, "--no-progress", "--out", str(out),
                            *sum((["--set", s] for s in sets), [])])
    assert r.exit_code == 2 and r.output.startswith(f"error: {names}"), r.output
    assert len(r.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("where, expect", [
    ("file", r"c\.yaml:7: workload\.synthetic\.burst\.input_tokens: the synthetic workload would take "
             r"about [\d,.]+ GiB of memory \(4 burst requests of 1,000,000,000,000 tokens\); this "
             r"machine has [\d,.]+ GiB available"),
    ("set", r"--set workload\.synthetic\.n_sessions=1000000000: workload\.synthetic\.n_sessions: the "
            r"synthetic workload would take about [\d,.]+ GiB"),
])
def test_a_workload_larger_than_memory_is_refused_from_an_estimate(tmp_path, where, expect):
    """Found by a new user: input_tokens 1e12 allocated for minutes, then a MemoryError."""
    import time

    text = CONFIG.replace("{n_sessions: 2}", "\n    n_sessions: 2\n    burst: {input_tokens: 1000000000000}")
    cfg = _config(tmp_path, text if where == "file" else CONFIG)
    extra = [] if where == "file" else ["--set", "workload.synthetic.n_sessions=1000000000"]
    t0 = time.monotonic()
    r = runner.invoke(app, ["run", str(cfg), "--no-progress", "--out", str(tmp_path / "res"), *extra])
    assert r.exit_code == 2 and re.search(expect, r.output), r.output
    assert time.monotonic() - t0 < 10 and not (tmp_path / "res").exists()


def test_the_workload_estimate_is_near_what_the_generator_holds():
    import tracemalloc

    from kvsim.config import load_config
    from kvsim.run import load_workload
    from kvsim.run.budget import check_workload_memory, synthetic_bytes

    for sets in (["workload.synthetic.n_sessions=300"],
                 ["workload.synthetic.n_sessions=100", "workload.synthetic.turns=[20, 40]",
                  "workload.synthetic.max_context_tokens=200000"],
                 ["workload.synthetic.burst={requests: 2, input_tokens: 2000000}"]):
        cfg = load_config("default", sets)
        tracemalloc.start()
        w = load_workload(cfg)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        est = synthetic_bytes(cfg)[0]
        assert 0.5 * est <= held <= est, (sets, held, est)
        assert w.request_count() > 0
        check_workload_memory(cfg, available=int(est) + 1)       # fits: no error
        with pytest.raises(ValueError, match="lower workload.synthetic"):
            check_workload_memory(cfg, available=int(est) - 1)


def test_tokens_per_block_too_large_names_its_own_key(tmp_path):
    r = _run("--set", "cache.tokens_per_block=1000000000", "--out", str(tmp_path / "res"))
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: --set cache.tokens_per_block=1000000000: cache.tokens_per_block: "
                               "1,000,000,000 tokens a block make pages of 163,840,000,000,000 bytes"), r.output


@pytest.mark.parametrize("args, expect", [
    (["--time-scale", "0"], "--time-scale 0: expected simulated seconds per wall second, a number > 0"),
    (["--time-scale", "-1"], "--time-scale -1: expected"),
    (["--time-scale", "nan"], "--time-scale nan: expected"),
    (["--device", "tpu"], "--device tpu: expected one of auto, cpu, gpu"),
])
def test_hw_options_are_checked_before_any_work(tmp_path, args, expect):
    r = _run("--backend", "hw", *args, "--out", str(tmp_path / "res"))
    assert r.exit_code == 2 and r.output == f"error: {expect}" + r.output.split(expect, 1)[1], r.output
    assert not (tmp_path / "res").exists()


def _line(text: str, n: int, edit) -> str:
    lines = text.splitlines(True)
    lines[n - 1] = edit(lines[n - 1])
    return "".join(lines)


@pytest.mark.parametrize("damage, says", [
    (lambda text: text[:len(text) * 2 // 3], r"requests\.csv line \d+: not the header's number of fields"),
    (lambda text: _line(text, 3, lambda row: "x,y,z\n" + row),
     r"requests\.csv line 3: not the header's number of fields"),
    (lambda text: _line(text, 2, lambda row: ",".join(v if i != 11 else "soon" for i, v in enumerate(row.split(",")))),
     r"requests\.csv line 2: ttft_s: expected a number, got 'soon'"),
])
def test_diff_names_the_line_of_a_damaged_requests_csv(tmp_path, damage, says):
    """A requests.csv cut short (a full disk, a copy interrupted) was compared on the rows
    that were left, exit 0; a row of other fields ended in a TypeError traceback, exit 1."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert _run("--set", "output.plots=false", "--out", str(a)).exit_code == 0
    shutil.copytree(a, b)
    text = (b / "requests.csv").read_text()
    (b / "requests.csv").write_text(damage(text))
    r = runner.invoke(app, ["diff", str(a), str(b)])
    assert r.exit_code == 2 and re.search(says, r.output) and str(b) in r.output, r.output
