"""benchmarks/cluster_speed.py: each replay in a child process, the 64-instance one between
the 8-instance ones, every 8-instance replay the same (the same build, the same rows), the
scaling figure last and equal to the walls it is made of."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import cluster_speed  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"


@pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces not present")
def test_the_big_replay_runs_between_the_small_ones_and_the_figure_comes_last(capsys):
    limit = 40
    assert cluster_speed.main(["--x8", "--repeat", "3", "--limit", str(limit),
                               "--trace", str(TRACE)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    runs = [x for x in lines if " requests, wall " in x]
    assert [x.split(":")[0] for x in runs] == [
        "8 instances", "8 instances", "trace x8 on 64 instances", "8 instances"]
    assert [int(re.search(r": (\d+) requests", x).group(1)) for x in runs] == [
        limit, limit, 8 * limit, limit]
    small = [x.split("wall")[0] + x.split("MB;")[1] for x in runs if x.startswith("8 ")]
    assert len(set(small)) == 1  # the same rows each time
    walls = [float(re.search(r"wall (\d+\.\d+) s", x).group(1)) for x in runs]
    med = sorted(walls[:2] + walls[3:])[1]
    figure = re.fullmatch(r"cluster_scaling_x: (\d+\.\d{3})", lines[-1])
    assert figure
    # the printed walls are rounded to 0.1 s: the figure within what that rounding allows
    lo, hi = max(walls[2] - 0.05, 0) / (8 * (med + 0.05)), (walls[2] + 0.05) / (8 * max(med - 0.05, 1e-3))
    assert lo <= float(figure.group(1)) <= hi
    assert lines[-2].startswith("cluster_scaling_cpu_x: ")


def test_a_missing_trace_is_refused(tmp_path, capsys):
    assert cluster_speed.main(["--trace", str(tmp_path / "none.jsonl")]) == 2
    assert "--trace" in capsys.readouterr().err


@pytest.mark.skipif(not TRACE.exists(), reason="../shared/traces not present")
def test_copies_kept_apart_replay_what_the_8_instances_do(capsys):
    assert cluster_speed.main(["--x8", "--apart", "--repeat", "1", "--limit", "60",
                               "--trace", str(TRACE)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    apart = [x for x in lines if "copies apart:" in x]
    hits = [re.search(r"hit ratio (\d\.\d+), TTFT p50 (\S+)", x).groups() for x in apart]
    plain8 = next(x for x in lines if x.startswith("8 instances: "))
    assert len(hits) == 2 and hits[0] == hits[1]  # every group of 8 as the 8 alone
    assert hits[0] == re.search(r"hit ratio (\d\.\d+), TTFT p50 (\S+)", plain8).groups()
    assert any(x.startswith("cluster_scaling_apart_x: ") for x in lines)
    assert lines[-1].startswith("cluster_scaling_x: ")
