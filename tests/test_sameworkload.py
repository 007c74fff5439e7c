"""kvsim.tools.sameworkload: a hw run is re-predicted only with the workload and model it
replayed (``kvsim compare --hw-from``), and ``kvsim diff`` sets only runs of one workload
side by side."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.tools.sameworkload import one_workload, same_replay

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "h200-agentic-slice"  # a saved hw run


def _cfg(**over):
    cfg = {"seed": 0, "model": "llama-3-8b", "tp": 1, "kv_dtype": None, "hardware": "h200-pcie",
           "engine": {"refcheck": False},
           "workload": {"kind": "agentic", "path": "a/sessions", "limit": 3,
                        "synthetic": {"n_sessions": 40, "seed": None}}}
    for k, v in over.items():
        d = cfg
        *head, last = k.split(".")
        for h in head:
            d = d[h]
        d[last] = v
    return cfg


def test_what_a_re_prediction_may_vary_and_what_it_may_not():
    saved = _cfg()
    same_replay(_cfg(), saved, "f")
    # the trace elsewhere, another profile, another engine setting: still the same replay
    same_replay(_cfg(**{"workload.path": "b/sessions", "hardware": "x.yaml", "engine.refcheck": True}), saved, "f")
    # a key the saved run lacks (saved before it existed) is not compared
    newer = _cfg()
    newer["workload"]["scope"] = "session"
    same_replay(newer, saved, "f")
    with pytest.raises(ValueError) as e:
        same_replay(_cfg(**{"workload.limit": 30, "model": "llama-3-70b"}), saved, "f")
    assert str(e.value) == ("--hw-from f: its hw run replayed another workload or model: model 'llama-3-8b' "
                            "there, 'llama-3-70b' here; workload.limit 3 there, 30 here; expected the "
                            "config it ran (the same --set)")
    with pytest.raises(ValueError, match=r"workload.synthetic.n_sessions 40 there, 2 here"):
        same_replay(_cfg(**{"workload.synthetic.n_sessions": 2}), saved, "f")


def _rows(*turns):
    return [SimpleNamespace(session=s, turn=t, input_tokens=n) for s, t, n in turns]


def test_one_workload_allows_a_subset_not_other_prompts_or_nothing_shared():
    a = _rows(("s", "1", "10"), ("s", "2", "20"))
    one_workload(a, _rows(("s", "1", "10")), "a", "b")  # fewer turns: still the workload
    with pytest.raises(ValueError, match="session s turn 2 has 20 input tokens in one and 25 in the other"):
        one_workload(a, _rows(("s", "2", "25")), "a", "b")
    with pytest.raises(ValueError, match="no turn .* is in both"):
        one_workload(a, _rows(("t", "1", "10")), "a", "b")


def test_compare_hw_from_refuses_another_workload_before_any_replay(tmp_path):
    out = tmp_path / "cmp"
    r = CliRunner().invoke(app, ["compare", "agentic-slice", "--hw-from", str(FIXTURE),
                                 "--set", "workload.max_turns=5", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "workload.max_turns 30 there, 5 here" in " ".join(r.output.split())
    assert not out.exists()
