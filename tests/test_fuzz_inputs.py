"""Fuzzing the inputs a user hands kvsim: every config, every trace line, every ``--set``
string and every study or tune file either runs or gets a clear error (exit code 2, a line
starting ``error:``), never a traceback and never exit 1; and nothing is made or changed
outside the test's own folder (the checkout, the folders beside it). Each test draws a
bounded number of examples (``SETTINGS``), derandomized, so CI runs the same cases."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings, strategies as st
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

BASE = {"name": "fuzz", "model": "llama-3-8b",
        "cache": {"tokens_per_block": 32, "page_bytes": "64KiB",
                  "tiers": [{"level": "gpu", "quota": "8MiB"}, {"level": "host", "quota": "8MiB"},
                            {"level": "disk", "quota": "32MiB"}]},
        "workload": {"kind": "synthetic", "synthetic": {"n_sessions": 2}}}
KEYS = ["seed", "tp", "model", "hardware", "cache.tokens_per_block", "cache.page_bytes",
        "cache.tiers[0].quota", "cache.tiers[1].quota", "cache.tiers[1].max_quota", "cache.tiers[2].level",
        "engine.max_batch_tokens", "engine.max_running", "engine.gpu_free_watermark",
        "engine.max_plan_failures", "engine.refcheck", "workload.kind", "workload.start",
        "workload.sessions_per_s", "workload.concurrency", "workload.max_turns", "workload.max_think",
        "workload.synthetic.n_sessions", "workload.synthetic.seed", "output.timeline_interval",
        "output.plots", "nonsense.key"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, 1, 2, 3, 64, 4096]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1e-9, 1e30]),
    st.sampled_from(["4MiB", "1TiB", "99999999TiB", "1e30", "-5", "10ms", "lots", "", "gpu", "disk",
                     "poisson", "concurrency", "agentic", "\x00", "ünï"]),
    st.text(max_size=8))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(st.text(max_size=4), SCALARS, max_size=2))


def _set(data: dict, dotted: str, value) -> None:
    node = data
    parts = dotted.replace("[", ".").replace("]", "").split(".")
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
    last = parts[-1]
    if last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


def _check(r) -> None:
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code in (0, 2), r.output
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert r.output.startswith("error: "), r.output


@SETTINGS
@example(changes=[("seed", 1)])  # and one that surely runs
@given(changes=st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3))
def test_any_config_runs_or_is_refused_clearly(tmp_path_factory, changes):
    data = json.loads(json.dumps(BASE))
    for key, value in changes:
        _set(data, key, value)
    d = tmp_path_factory.mktemp("cfg")
    cfg = d / "c.yaml"
    cfg.write_text(yaml.safe_dump(data, allow_unicode=True))
    r = runner.invoke(app, ["run", str(cfg), "--no-progress", "--out", str(d / "res")])
    _check(r)
    if changes == [("seed", 1)]:
        assert r.exit_code == 0, r.output
    if r.exit_code == 0:
        s = (d / "res" / "summary.json").read_text()
        assert "Infinity" not in s and "NaN" not in s
    else:
        assert not (d / "res").exists()


@SETTINGS
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_a_config_file(tmp_path_factory, raw):
    d = tmp_path_factory.mktemp("raw")
    (d / "c.yaml").write_bytes(raw)
    _check(runner.invoke(app, ["run", str(d / "c.yaml"), "--no-progress", "--out", str(d / "res")]))


FIELD = st.one_of(SCALARS, st.lists(st.one_of(st.integers(-2**70, 2**70), SCALARS), max_size=4))


@st.composite
def trace_lines(draw):
    row = {"timestamp": draw(st.one_of(st.integers(0, 10**6), FIELD)),
           "input_length": draw(st.one_of(st.integers(1, 2000), FIELD)),
           "output_length": draw(st.one_of(st.integers(0, 50), FIELD)),
           "hash_ids": draw(st.one_of(st.lists(st.integers(0, 2**64), min_size=1, max_size=4), FIELD))}
    if draw(st.booleans()):
        row.pop(draw(st.sampled_from(sorted(row))))
    text = json.dumps(row, allow_nan=True)
    return draw(st.one_of(st.just(text.encode()), st.binary(max_size=40),
                          st.just(text.encode()[: draw(st.integers(0, len(text)))])))


@SETTINGS
@example(lines=[b'{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}'])
@given(lines=st.lists(trace_lines(), min_size=0, max_size=4))
def test_any_trace_lines_run_or_are_refused_clearly(tmp_path_factory, lines):
    d = tmp_path_factory.mktemp("trace")
    (d / "t.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    r = runner.invoke(app, ["run", "configs/mooncake-conversation.yaml", "--trace", str(d / "t.jsonl"),
                            "--no-progress", "--out", str(d / "res"), "--set", "model=llama-3-8b",
                            "--set", "output.plots=false"])
    _check(r)
    if len(lines) == 1 and lines[0].startswith(b'{"timestamp": 0, "input_length": 600'):
        assert r.exit_code == 0, r.output
    if r.exit_code == 2:
        assert str(d / "t.jsonl") in r.output, r.output


# -- --set strings, study files and tune files, confined to the test's own folder ------------
ROOT = Path(__file__).resolve().parents[1]
SKIP = {".git", ".venv", ".hypothesis", ".pytest_cache", "__pycache__", "build", "dist"}


def _snapshot(folder: Path) -> dict[str, tuple]:
    """Every file and folder under the checkout (but the tools' own caches): size and mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in SKIP and not d.endswith(".egg-info")]
        for n in [*filenames, *dirnames]:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, folder)] = (st.st_size, st.st_mtime_ns) if n in filenames else ()
    return out


@contextmanager
def _confined(root: Path):
    """Run with the working folder and the temporary folder inside ``root``; afterwards,
    nothing in the checkout and nothing beside ``root`` may have been made or changed."""
    (root / "cwd").mkdir()
    (root / "tmp").mkdir()
    repo, beside = _snapshot(ROOT), sorted(os.listdir(root.parent))
    old_cwd, old_tmp = os.getcwd(), tempfile.tempdir
    os.chdir(root / "cwd")
    tempfile.tempdir = str(root / "tmp")
    try:
        yield root
    finally:
        os.chdir(old_cwd)
        tempfile.tempdir = old_tmp
    assert _snapshot(ROOT) == repo, "the checkout changed"
    assert sorted(os.listdir(root.parent)) == beside, "something was made beside the test's folder"


class _ReachedTheCluster(Exception):
    """A study or tune whose input was valid got as far as starting its cluster."""


@contextmanager
def _no_cluster(*_a, **_k):
    raise _ReachedTheCluster()
    yield  # pragma: no cover


def _check_cli(r, allow_reached: bool = False) -> None:
    if allow_reached and isinstance(r.exception, _ReachedTheCluster):
        return
    _check(r)


KEY_ALPHABET = "abcegiknoqrstuwy_.[]0123456789= -:{}'\"\\\x00é"
SET_STRINGS = st.one_of(
    st.text(alphabet=KEY_ALPHABET, max_size=24),
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEYS + ["", ".", "cache..tiers", "cache.tiers[]",
                                                               "cache.tiers[-1].quota", "[0]", "a.[1]"]),
              st.one_of(st.text(max_size=10), st.sampled_from(["1", "-1", "1e12", "[1", "{a: 1}", "null",
                                                               "4MiB", "true", "x: [", "'"]))),
)


def test_any_set_string_runs_or_is_refused_clearly(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-set")
    seen = [0]

    @SETTINGS
    @example(text="=3")
    @example(text=".=3")
    @example(text=" =3")
    @example(text="seed=1")
    @given(text=SET_STRINGS)
    def check(text):
        seen[0] += 1
        out = root / f"res-{seen[0]}"
        r = runner.invoke(app, ["run", "default", "--no-progress", "--set", text,
                                "--set", "workload.synthetic.n_sessions=1", "--set", "workload.max_turns=2",
                                "--set", "output.plots=false", "--out", str(out)])
        _check_cli(r)
        if text == "seed=1":
            assert r.exit_code == 0, r.output
        if r.exit_code == 2:
            assert text in r.output or "--set" in r.output, r.output   # names the argument
            assert not out.exists()

    with _confined(root):
        check()


STUDY_KEYS = ["name", "base", "set", "grid", "zip", "variants", "seeds", "traces", "labels",
              "baseline", "metrics", "plot_metrics", "backend", "bogus"]
TUNE_KEYS = ["name", "base", "set", "space", "objective", "constraints", "trials", "parallel",
             "sampler", "seed", "split", "top", "storage", "bogus"]
CONFIG_KEYS = st.sampled_from(KEYS + ["cache.tiers[0].quota", "engine.max_running", "", "a..b", "x[1"])
PARAM = st.fixed_dictionaries({"type": st.sampled_from(["float", "int", "categorical", "split", "nope"])},
                              optional={"low": SCALARS, "high": SCALARS, "log": st.booleans(),
                                        "step": SCALARS, "unit": st.sampled_from(["GiB", "x", ""]),
                                        "choices": st.lists(SCALARS, max_size=3), "total": SCALARS,
                                        "keys": st.lists(CONFIG_KEYS, max_size=3)})
VALUE_FOR = {
    "name": st.one_of(st.just("f"), SCALARS), "base": st.sampled_from(["default", "nope", "", 3]),
    "set": st.one_of(st.dictionaries(CONFIG_KEYS, SCALARS, max_size=2), st.lists(st.text(max_size=8), max_size=2)),
    "grid": st.dictionaries(CONFIG_KEYS, st.one_of(st.lists(SCALARS, max_size=3), SCALARS), max_size=2),
    "zip": st.dictionaries(CONFIG_KEYS, st.lists(SCALARS, max_size=3), max_size=2),
    "variants": st.lists(st.one_of(st.fixed_dictionaries({"name": SCALARS}, optional={
        "set": st.dictionaries(CONFIG_KEYS, SCALARS, max_size=2)}), SCALARS), max_size=2),
    "seeds": st.lists(SCALARS, max_size=3), "traces": st.lists(SCALARS, max_size=2),
    "labels": st.dictionaries(CONFIG_KEYS, SCALARS, max_size=2), "baseline": SCALARS,
    "metrics": st.lists(st.sampled_from(["ttft_s.p90", "hit_ratio", "nope", ""]), max_size=2),
    "plot_metrics": st.lists(st.sampled_from(["ttft_s.p90", "nope"]), max_size=2),
    "backend": st.sampled_from(["sim", "hw", "x"]), "bogus": SCALARS,
    "space": st.dictionaries(CONFIG_KEYS, st.one_of(PARAM, SCALARS), max_size=2),
    "objective": st.one_of(st.fixed_dictionaries({}, optional={
        "minimize": st.sampled_from(["ttft_s.p90", "nope"]), "maximize": st.sampled_from(["hit_ratio"]),
        "direction": SCALARS, "terms": st.dictionaries(st.sampled_from(["hit_ratio", "x"]), SCALARS, max_size=2)}),
        SCALARS),
    "constraints": st.lists(st.fixed_dictionaries({"metric": st.sampled_from(["ttft_s.p90", "x"])},
                                                  optional={"max": SCALARS, "min": SCALARS}), max_size=2),
    "trials": SCALARS, "parallel": SCALARS, "sampler": st.sampled_from(["tpe", "random", "x"]),
    "seed": SCALARS, "split": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
        "held_out": SCALARS, "seed": SCALARS})), "top": SCALARS,
    "storage": st.sampled_from(["sqlite:///rel.db", "nonsense://x", "", "sqlite:///", 7]),
}


def _spec_files(keys: list[str], required: dict):
    """A study or tune file: valid keys with odd values, the required ones mostly present;
    or raw bytes."""
    mapping = st.fixed_dictionaries(required, optional={k: VALUE_FOR[k] for k in keys if k not in required})
    return st.one_of(mapping.map(lambda d: yaml.safe_dump(d, allow_unicode=True).encode()),
                     st.binary(max_size=120))


VALID_STUDY = b"name: ok\nbase: default\nset: {workload.synthetic.n_sessions: 1}\nseeds: [0]\n"
VALID_TUNE = (b"name: ok\nbase: default\nspace:\n  engine.max_running: {type: int, low: 1, high: 4}\n"
              b"objective: {minimize: ttft_s.p90}\ntrials: 1\n")


@pytest.mark.parametrize("kind", ["study", "tune"])
def test_any_study_or_tune_file_is_run_or_refused_clearly(tmp_path_factory, monkeypatch, kind):
    """A valid file gets as far as its cluster (here a stand-in that stops it, so that the
    fuzz stays fast: no point runs); anything else is exit 2 naming the file or key."""
    import kvsim.study.study
    import kvsim.study.tune

    monkeypatch.setattr(kvsim.study.study, "open_client", _no_cluster)
    monkeypatch.setattr(kvsim.study.tune, "open_client", _no_cluster)
    root = tmp_path_factory.mktemp(f"fuzz-{kind}")
    keys, required = (STUDY_KEYS, {"name": st.just("f")}) if kind == "study" else \
        (TUNE_KEYS, {"name": st.just("f"), "space": VALUE_FOR["space"], "objective": VALUE_FOR["objective"]})
    seen = [0]

    @SETTINGS
    @example(raw=VALID_STUDY if kind == "study" else VALID_TUNE)
    @given(raw=_spec_files(keys, required))
    def check(raw):
        seen[0] += 1
        ex = root / f"ex-{seen[0]}"
        ex.mkdir()
        (ex / "f.yaml").write_bytes(raw)
        r = runner.invoke(app, [kind, str(ex / "f.yaml"), "--out", str(ex / "out"), "--workers", "1",
                                "--no-progress"])
        _check_cli(r, allow_reached=True)
        if raw in (VALID_STUDY, VALID_TUNE):
            assert isinstance(r.exception, _ReachedTheCluster), r.output
        if r.exit_code == 2:
            assert str(ex / "f.yaml") in r.output or "--set" in r.output or "storage" in r.output, r.output
        assert not (ex / "out").exists(), "refused, or stopped before its cluster: no folder left"

    with _confined(root):
        check()
