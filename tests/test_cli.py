"""``kvsim run`` as a user meets it: the default job, overrides, and bad input that fails
with the file, line or key and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import ConfigFileError, load_config

runner = CliRunner()
SMALL = ["--set", "workload.synthetic.n_sessions=4", "--set", "output.plots=false", "--no-progress"]


def test_run_default_writes_results(tmp_path):
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    m = summary["metrics"]
    for key in ("requests_completed", "input_tokens", "hit_tokens", "computed_tokens", "ttft_s",
                "tpot_s", "e2e_s", "throughput", "bytes", "evicted_pages", "dropped_pages",
                "sim_time_s", "wall_time_s"):
        assert key in m, key
    assert set(m["hit_tokens"]) >= {"gpu", "host", "disk"}
    assert set(m["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert m["requests_completed"] > 0
    assert summary["config"]["workload"]["synthetic"]["n_sessions"] == 4  # fully resolved
    rows = (out / "requests.csv").read_text().splitlines()
    assert len(rows) == m["requests_completed"] + 1
    assert (out / "timeline.csv").exists()
    assert "requests completed" in r.output


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_malformed_trace_line_fails_with_file_and_line_and_writes_nothing(tmp_path):
    trace = _write(tmp_path / "t.jsonl",
                   '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 5, "input_length": 10, "output_length": 1\n')
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", "configs/mooncake-conversation.yaml", "--trace", str(trace),
                            "--out", str(out), "--no-progress"])
    assert r.exit_code == 2
    assert f"{trace}:2:" in r.output and "malformed JSON" in r.output
    assert not out.exists()


@pytest.mark.parametrize("line, problem", [
    ('{"timestamp": 0, "input_length": -3, "output_length": 1, "hash_ids": []}', "not positive"),
    ('{"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2]}', "needs ceil"),
    ('{"timestamp": 0, "output_length": 1, "hash_ids": [1]}', "missing field 'input_length'"),
])
def test_bad_trace_rows_name_the_line(tmp_path, line, problem):
    trace = _write(tmp_path / "t.jsonl", line + "\n")
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", "configs/mooncake-conversation.yaml", "--trace", str(trace),
                            "--out", str(out), "--no-progress"])
    assert r.exit_code == 2
    assert f"{trace}:1:" in r.output and problem in r.output
    assert not out.exists()


def test_unknown_key_wrong_type_and_impossible_size_name_the_key(tmp_path):
    cfg = _write(tmp_path / "c.yaml", """
name: x
cache:
  tokens_per_block: 32
  tiers:
    - {level: gpu, quota: 0GiB}
    - {level: host, quota: lots}
engine: {max_batch_tokenz: 5}
""")
    with pytest.raises(ConfigFileError) as e:
        load_config(cfg)
    msg = str(e.value)
    assert str(cfg) in msg
    assert "cache.tiers[0].quota" in msg
    assert "cache.tiers[1].quota" in msg and "'lots'" in msg
    assert "engine.max_batch_tokenz" in msg


def test_tier_order_and_disk_path_that_is_a_file(tmp_path):
    f = _write(tmp_path / "file", "x")
    cfg = _write(tmp_path / "c.yaml", """
cache:
  tiers:
    - {level: host, quota: 1GiB}
    - {level: gpu, quota: 1GiB}
""")
    with pytest.raises(ConfigFileError, match="gpu -> host -> disk"):
        load_config(cfg)
    cfg2 = _write(tmp_path / "c2.yaml", f"""
cache:
  tiers:
    - {{level: gpu, quota: 1GiB}}
    - {{level: disk, quota: 1GiB, path: {f}}}
""")
    with pytest.raises(ConfigFileError, match="not a directory"):
        load_config(cfg2)


def test_malformed_yaml_names_file_and_line(tmp_path):
    cfg = _write(tmp_path / "c.yaml", "cache:\n  tiers: [\n    - x\n")
    with pytest.raises(ConfigFileError, match=r"c\.yaml:\d+:\d+: malformed YAML"):
        load_config(cfg)


def test_set_overrides_are_validated_like_the_file():
    cfg = load_config("configs/default.yaml", ["engine.max_running=3", "cache.tiers[0].quota=2GiB"])
    assert cfg.engine.max_running == 3 and cfg.cache.tiers[0].quota == 2 * 2**30
    with pytest.raises(ConfigFileError, match="engine.max_running"):
        load_config("configs/default.yaml", ["engine.max_running=-1"])
    with pytest.raises(ConfigFileError, match="key.path=value"):
        load_config("configs/default.yaml", ["engine.max_running"])


def test_page_bigger_than_tier_is_rejected_with_the_field(tmp_path):
    r = runner.invoke(app, ["run", "configs/default.yaml", "--set", "cache.tiers[0].quota=1MiB",
                            "--out", str(tmp_path / "res"), "--no-progress"])
    assert r.exit_code == 2
    assert "--set cache.tiers[0].quota=1MiB: cache.tiers[0].quota: 1,048,576 bytes hold no page of " \
        "5,242,880 bytes" in r.output, r.output
    assert not (tmp_path / "res").exists()


def test_a_backend_that_cannot_start_fails_cleanly(tmp_path):
    """Asking for the GPU where there is none: one line saying why, exit 1, nothing written."""
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
        pytest.skip("a GPU stack is installed here")
    except ImportError:
        pass
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", "configs/default.yaml", "--backend", "hw", "--device", "gpu",
                            "--out", str(out), *SMALL])
    assert r.exit_code == 1
    assert "replay on the hw backend failed" in r.output and "GPU" in r.output
    assert not out.exists()


def test_hw_backend_options_from_the_command_line(tmp_path):
    """--backend hw in CPU mode takes the hw options (--time-scale, --compute-graphs, which
    only a GPU uses) and writes the same results folder as the sim."""
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", "configs/default.yaml", "--backend", "hw", "--device", "cpu",
                            "--time-scale", "50", "--compute-graphs", "--out", str(out), *SMALL,
                            "--set", "workload.synthetic.n_sessions=1", "--set", "cache.page_bytes=4KiB",
                            # (the default tiers exceed a small machine's memory and disk: refused)
                            "--set", "cache.tiers=[{level: gpu, quota: 64MiB}, {level: host, quota: 64MiB}, "
                                     "{level: disk, quota: 256MiB}]"])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "summary.json").read_text())["metrics"]
    assert m["requests_completed"] > 0


def test_configs_are_found_in_a_checkout_or_an_installed_copy(tmp_path, monkeypatch):
    """The presets (``default``, ``h200-pcie``, ``llama-3-70b``) come from the checkout's
    configs/ (source tree, editable install), else from the copy a plain ``pip install .``
    puts in site-packages as ``kvsim_configs`` (the compiled build is such an install)."""
    from types import SimpleNamespace

    import kvsim.config.paths as P

    (tmp_path / "co" / "configs").mkdir(parents=True)
    assert P.find_configs(tmp_path / "co") == tmp_path / "co" / "configs"
    site = tmp_path / "site" / "kvsim_configs"
    site.mkdir(parents=True)
    monkeypatch.setattr(P.importlib.util, "find_spec", lambda name: SimpleNamespace(
        submodule_search_locations=[str(site)]) if name == "kvsim_configs" else None)
    assert P.find_configs(tmp_path / "bare") == site
    monkeypatch.setattr(P.importlib.util, "find_spec", lambda name: None)
    assert P.find_configs(tmp_path / "bare") == tmp_path / "bare" / "configs"  # what errors then name


def test_every_shipped_config_goes_into_the_wheel():
    """pyproject's package data covers every file under configs/ (as kvsim_configs)."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[1]
    st = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert st["package-dir"]["kvsim_configs"] == "configs"
    data = st["package-data"]
    files = [p.relative_to(root / "configs") for p in (root / "configs").rglob("*") if p.is_file()]
    assert len(files) >= 10
    for f in files:
        pkg = ".".join(["kvsim_configs", *f.parent.parts])
        assert pkg in st["packages"], pkg
        assert any(fnmatch.fnmatch(f.name, g) for g in data.get(pkg, [])), f


def test_python_dash_m_kvsim_is_the_kvsim_command():
    """``python -m kvsim`` runs the same CLI as the installed ``kvsim`` script."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "kvsim", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    for command in ("run", "compare", "study", "tune", "calibrate"):
        assert command in r.stdout


@pytest.mark.parametrize("args, says", [
    (["calibrate", "--out", "{out}", "--kind-terms", "both"], "--kind-terms both: expected fit or keep"),
    (["calibrate", "--out", "{out}", "--power-state", "hot"], "--power-state hot: expected keep, fit or"),
    (["calibrate", "--out", "{out}", "--power-state", "{d}"], "no hw compute log"),
    (["calibrate", "--check", "cells.json", "--profile", "h200-pcie", "--kind-terms", "keep"],
     "--kind-terms: not with --check"),
    (["compare", "configs/agentic-slice.yaml", "--kind-terms", "keep", "--out", "{res}"],
     "--kind-terms: only with --calibrate"),
    (["compare", "configs/agentic-slice.yaml", "--power-state", "fit", "--out", "{res}"],
     "--power-state: only with --calibrate"),
    (["compare", "configs/agentic-slice.yaml", "--calibrate", "--kind-terms", "maybe", "--out", "{res}"],
     "--kind-terms maybe: expected fit or keep"),
    (["compare", "configs/agentic-slice.yaml", "--calibrate", "--power-state", "hot", "--out", "{res}"],
     "--power-state hot: expected keep, fit or"),
])
def test_fit_options_are_checked_before_anything_is_measured(tmp_path, args, says):
    """``--kind-terms`` (fit or keep) and ``--power-state`` (keep, fit or compare folders
    with hw replays); with compare only beside --calibrate: a bad value exits 2 naming it,
    having written nothing (a calibration runs minutes)."""
    out, res = tmp_path / "p.yaml", tmp_path / "cmp"
    r = runner.invoke(app, [a.format(out=out, res=res, d=tmp_path) for a in args])
    assert r.exit_code == 2 and says in r.output
    assert not out.exists() and not res.exists()


@pytest.mark.parametrize("args, says", [
    (["--device", "gpu"], "--device: only with --backend hw"),
    (["--time-scale", "5", "--no-compute-graphs"], "--time-scale, --no-compute-graphs: only with --backend hw"),
])
def test_hw_options_on_the_sim_backend_are_refused_not_ignored(tmp_path, args, says):
    """`kvsim run --device gpu` without `--backend hw` would replay on the sim and say so
    nowhere: refused, exit 2, nothing written."""
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", "configs/default.yaml", *args, "--out", str(out), *SMALL])
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output
    assert not out.exists()


def test_hw_options_with_hw_from_are_refused(tmp_path):
    r = runner.invoke(app, ["compare", "default", "--hw-from", str(tmp_path), "--time-scale", "10"])
    assert r.exit_code == 2 and "--time-scale: not with --hw-from" in r.output, r.output


@pytest.mark.parametrize("config, sets, says", [
    ("default", ["workload.limit=2"], "workload.limit applies to traces only"),
    ("default", ["workload.max_think=1s"], "workload.max_think applies to agentic traces only"),
    ("default", ["workload.shared_prefix=true"], "workload.shared_prefix applies to agentic traces only"),
    ("default", ["workload.time_scale=2"], "workload.time_scale applies to Mooncake traces only"),
    ("configs/mooncake-conversation.yaml", ["workload.start=concurrency"],
     "workload.start: concurrency applies to sessions in a closed loop"),
    # a trace's config turned synthetic: its trace-only keys are named, not ignored
    ("configs/agentic-slice.yaml", ["workload.kind=synthetic"], "workload.limit applies to traces only"),
])
def test_a_workload_key_that_does_nothing_for_the_kind_is_refused(tmp_path, config, sets, says):
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", config, *sum((["--set", s] for s in sets), []), "--out", str(out),
                            "--no-progress"])
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()) and "Traceback" not in r.output
    assert not out.exists()


def test_a_trace_config_turns_synthetic_once_its_trace_keys_are_null(tmp_path):
    sets = ["workload.kind=synthetic", "workload.limit=null", "workload.max_think=null",
            "workload.shared_prefix=false", "workload.synthetic.n_sessions=2", "output.plots=false"]
    r = runner.invoke(app, ["run", "configs/agentic-slice.yaml", *sum((["--set", s] for s in sets), []),
                            "--out", str(tmp_path / "res"), "--no-progress"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("args, says", [
    (["--from-report", "r.json", "--device", "gpu", "--model", "llama-3-70b"],
     "--device, --model: not with --from-report"),
    (["--check", "cells.json", "--profile", "h200-pcie", "--base", "gh200-c2c"], "--base: not with --check"),
    (["--profile", "h200-pcie"], "--profile: only with --check"),
    # given at their defaults' values they are still not read
    (["--from-report", "r.json", "--device", "auto"], "--device: not with --from-report"),
    (["--from-report", "r.json", "--model", "llama-3-8b"], "--model: not with --from-report"),
    (["--check", "cells.json", "--profile", "h200-pcie", "--base", "h200-pcie"], "--base: not with --check"),
])
def test_calibrate_refuses_an_option_its_mode_does_not_read(tmp_path, args, says):
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["calibrate", "--out", str(out), *args])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert not out.exists()


def test_calibrate_from_report_takes_the_base_given_even_h200_pcie(tmp_path):
    """--from-report refits on the report's base unless --base names another; the
    committed report's base is h200-pcie-calibrated, so --base h200-pcie (the measuring
    form's default) must be the base of the refit, not dropped for the report's."""
    from kvsim.config.hardware import CONFIG_DIR, load_profile

    report = str(CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml.report.json")
    for base, want in ((None, "h200-pcie-calibrated"), ("h200-pcie", "h200-pcie")):
        out = tmp_path / f"{want}.yaml"
        r = runner.invoke(app, ["calibrate", "--out", str(out), "--from-report", report,
                                *(["--base", base] if base else [])])
        assert r.exit_code == 0, r.output
        assert load_profile(out).notes.endswith(f"; base {want} for what was not measured")


def _report_cut(text: str) -> bytes:     # a copy cut short mid-transfer
    return text[:len(text) // 2].encode()


def _report_without(key: str):
    def edit(text: str) -> bytes:
        data = json.loads(text)
        data.pop(key)
        return json.dumps(data).encode()
    return edit


@pytest.mark.parametrize("edit, says", [
    (_report_cut, "not JSON ("),
    (lambda text: b"[1, 2]", "a JSON list; expected a calibrate report"),
    (lambda text: b"\xff\xfe{}", "not UTF-8 text"),
    (_report_without("copies"), "copies (missing)"),   # the cells the fit is made of
    (_report_without("base"), "base (missing)"),
    (lambda text: json.dumps({**json.loads(text), "compute": []}).encode(), "compute (not a mapping)"),
])
def test_calibrate_from_a_report_it_cannot_read_names_the_file(tmp_path, edit, says):
    """A saved report that is damaged or not a calibrate report is refused with the file
    and what is wrong (not a KeyError's bare key, nor a traceback), nothing written."""
    saved = Path(__file__).resolve().parents[1] / "configs/hardware/h200-pcie-calibrated.yaml.report.json"
    bad = tmp_path / "r.report.json"
    bad.write_bytes(edit(saved.read_text()))
    out = tmp_path / "p.yaml"
    r = runner.invoke(app, ["calibrate", "--out", str(out), "--from-report", str(bad)])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and f"--from-report {bad}: " in said and says in said, r.output
    assert "Traceback" not in said
    assert not out.exists() and not (tmp_path / "p.yaml.report.json").exists()


@pytest.mark.parametrize("args", [
    ["run", "default", "--out", ""],
    ["run", "default", "--trace", ""],
    ["compare", "agentic-slice", "--hw-from", ""],
    ["compare", "default", "--out", ""],
    ["diff", "a", "b", "--out", ""],
    ["fidelity", "a", "--out", ""],
    ["calibrate", "--out", ""],
    ["calibrate", "--from-report", "", "--out", "p.yaml"],
    ["study", "s.yaml", "--out", ""],
    ["tune", "t.yaml", "--storage", ""],
    ["tune", "t.yaml", "--scheduler", ""],
], ids=lambda a: " ".join(a[:1] + [x for x in a if x.startswith("--")]))
def test_an_empty_path_option_is_refused_not_taken_for_its_default(tmp_path, monkeypatch, args):
    """``--out "$DIR"`` with DIR unset: the empty value was taken for no --out (run: the
    default folder, its earlier results replaced; diff: no report written, exit 0), an
    empty --trace for the config's trace, an empty --hw-from for a replay on the GPU."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, args)
    opt = args[args.index("") - 1]
    assert r.exit_code == 2 and f"Invalid value for '{opt}'" in r.output, r.output
    assert "an empty value" in " ".join(r.output.split())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind, line", [("study", "grid: {seed: [0, 1]}"),
                                        ("tune", "space: {seed: {type: int, low: 0, high: 3}}\n"
                                                 "objective: {maximize: requests_completed}")])
def test_an_empty_out_in_a_study_file_is_refused(tmp_path, kind, line):
    """``out: ""`` in a study or tune file wrote into results/<kind>-NAME, as if not given."""
    f = _write(tmp_path / "s.yaml", f"name: s\nout: \"\"\n{line}\n")
    r = runner.invoke(app, [kind, str(f)])
    assert r.exit_code == 2 and "s.yaml:2: out: String should have at least 1 character" in r.output, r.output
