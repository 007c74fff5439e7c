"""benchmarks/policy_speed.py: each replay in a child process (the default) or all in one,
the same replays either way (the requests each completed), the ratio line last."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import policy_speed  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces not present")
@pytest.mark.parametrize("where", [[], ["--in-process"]])
def test_replays_alternate_and_the_ratio_comes_last(capsys, where):
    assert policy_speed.main(["--budgets", "80", "--repeats", "2", "--limit", "150",
                              "--trace", str(TRACE), *where]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    runs = [x for x in lines if " GiB run " in x]
    assert [x.split(":")[0] + x.split(":")[1].split()[0] for x in runs] == [
        "80 GiB run 1lru", "80 GiB run 1belady", "80 GiB run 2belady", "80 GiB run 2lru"]
    assert {re.search(r"(\d+) requests", x).group(1) for x in runs} == {"150"}
    assert ("each in its own process" in lines[-7]) == (not where)
    assert re.fullmatch(r"belady_over_lru_x: \d+\.\d\d", lines[-1])
