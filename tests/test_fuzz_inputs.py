"""Fuzzing the inputs a user hands kvsim: every config and every trace line either runs or
gets a clear error (exit code 2, a line starting ``error:``), never a traceback."""

from __future__ import annotations

import json

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
