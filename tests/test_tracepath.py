"""Which trace a run replays (``kvsim.run.tracepath``): a trace that is not there names the
key or option and the folder a relative path was taken from; a synthetic workload refuses a
``--trace`` rather than replaying its own sessions under the trace's name."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import ConfigFileError
from kvsim.run.tracepath import trace_path
from kvsim.workload import TraceError

runner = CliRunner()


def test_the_trace_is_the_option_else_the_key(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("")
    b.write_text("")
    assert trace_path("mooncake", str(a), None) == str(a)
    assert trace_path("mooncake", str(a), str(b)) == str(b)
    assert trace_path("agentic", None, str(tmp_path)) == str(tmp_path)
    assert trace_path("synthetic", None, None) is None
    assert trace_path("synthetic", "ignored/by/synthetic", None) is None


def test_a_missing_trace_names_its_source_and_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigFileError) as e:
        trace_path("agentic", "../no/sessions", None)
    assert str(e.value) == (f"workload.path: ../no/sessions: no such file or folder (a relative path "
                            f"is taken from the current folder, {tmp_path}); expected a session file "
                            "(.json, .json.gz) or a folder of them")
    with pytest.raises(TraceError) as e:
        trace_path("mooncake", "there.jsonl", str(tmp_path / "none.jsonl"))
    assert str(e.value) == (f"--trace {tmp_path / 'none.jsonl'}: no such file or folder; "
                            "expected a Mooncake JSONL file")
    with pytest.raises(ConfigFileError, match="workload.path: a mooncake workload needs a trace"):
        trace_path("mooncake", None, None)


def test_a_synthetic_workload_refuses_a_trace():
    with pytest.raises(ConfigFileError) as e:
        trace_path("synthetic", None, "t.jsonl")
    assert str(e.value).startswith("workload.kind: synthetic replays no trace, but --trace names t.jsonl")


@pytest.mark.parametrize("args, says", [
    (["configs/default.yaml", "--trace", "t.jsonl"],
     r"configs/default\.yaml:\d+: workload\.kind: synthetic replays no trace, but --trace names t\.jsonl"),
    (["configs/agentic-slice.yaml", "--set", "workload.path=no/such"],
     r"--set workload\.path=no/such: workload\.path: no/such: no such file or folder"),
])
def test_run_refuses_before_writing_naming_the_file_line_or_set(tmp_path, args, says):
    out = tmp_path / "res"
    r = runner.invoke(app, ["run", *args, "--out", str(out), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert re.search(says, " ".join(r.output.split())), r.output
    assert "Traceback" not in r.output
    assert not out.exists()
