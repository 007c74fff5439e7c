"""``kvsim compare`` and ``kvsim diff`` rank by rank, for a node of several ranks.

Scenario 1: two hand-made node summaries (two ranks each): each rank's TTFT p50 / p90,
requests/s and bytes by kind, side by side with (a - b) / b; one-rank summaries give no
per-rank part; different rank counts are refused naming both sides.
Scenario 2: a 2-rank compare in CPU mode prints the per-rank table and writes the same
figures as the two sides' summaries hold under ``ranks`` in compare.json; a re-prediction
with another rank count is refused before its replay; ``kvsim diff`` of the two sides puts
the ranks side by side, and of a 2-rank run against a 1-rank run is refused naming both.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.tools.rankcmp import BYTE_KINDS, per_rank, rank_count
from kvsim.tools.reports import rank_table, report_tables


def rank_summary(p50: float, p90: float, rps: float, nbytes: tuple[int, int, int, int]) -> dict:
    return {"ttft_s": {"mean": p50, "p50": p50, "p90": p90, "p99": p90},
            "throughput": {"requests_per_s": rps, "output_tokens_per_s": 100 * rps},
            "bytes": dict(zip(BYTE_KINDS, nbytes)), "hit_tokens": {"gpu": 1}}


def test_per_rank_puts_each_ranks_figures_side_by_side():
    a = {"ranks": [rank_summary(0.3, 4.0, 0.2, (10, 20, 0, 5)),
                   rank_summary(0.5, 6.0, 0.1, (30, 40, 8, 0))]}
    b = {"ranks": [rank_summary(0.25, 5.0, 0.25, (10, 16, 0, 4)),
                   rank_summary(0.4, 6.0, 0.2, (60, 40, 0, 0))]}
    rows = per_rank(a, b)
    assert [r["rank"] for r in rows] == [0, 1]
    for i, row in enumerate(rows):
        ra, rb = a["ranks"][i], b["ranks"][i]
        for k, q in (("ttft_p50_s", "p50"), ("ttft_p90_s", "p90")):
            x, y = ra["ttft_s"][q], rb["ttft_s"][q]
            assert row[k] == {"sim": x, "hw": y, "rel_err": pytest.approx((x - y) / y)}
        x, y = ra["throughput"]["requests_per_s"], rb["throughput"]["requests_per_s"]
        assert row["requests_per_s"]["rel_err"] == pytest.approx((x - y) / y)
        for kind in BYTE_KINDS:
            x, y = ra["bytes"][kind], rb["bytes"][kind]
            want = (x - y) / y if y else (0.0 if x == 0 else None)  # 0 of 0: agree; x of 0: none
            assert row[f"bytes_{kind}"] == {"sim": x, "hw": y, "rel_err": want}
    assert rows[1]["bytes_disk_read"]["rel_err"] is None and rows[0]["bytes_disk_read"]["rel_err"] == 0.0
    named = per_rank(a, b, ("a", "b"))
    assert set(named[0]["ttft_p50_s"]) == {"a", "b", "rel_err"}
    # a table row a rank and figure, bytes in GB
    table = rank_table(rows)
    assert table.row_count == 2 * len(rows[0]) - 2
    # one rank on both sides (no ranks list): no per-rank part, the reports as they were
    assert per_rank({"ttft_s": {}}, {"ttft_s": {}}) is None
    one = {"config": "c", "metrics": {}, "transfers": {}}
    assert len(report_tables(one)) == 2 and len(report_tables({**one, "ranks": rows})) == 3
    with pytest.raises(ValueError, match="left has 2 rank.*right has 1"):
        per_rank(a, {}, where=("left", "right"))
    assert rank_count({"run": {"ranks": 4}, "metrics": {}}) == 4
    assert rank_count({"metrics": a}) == 2 and rank_count({"metrics": {}}) == 1


# two ranks on the hw backend in CPU mode (tests/test_node.py's HW), small enough for seconds
HW2 = ["model=llama-3-8b", "cache.page_bytes=256KiB", "workload.synthetic.n_sessions=6",
       "workload.max_turns=4", "node.ranks=2",
       "cache.tiers=[{level: gpu, quota: 128MiB}, {level: host, quota: 64MiB}, "
       "{level: disk, quota: 256MiB, io_workers: 4}]"]


def sets(xs):
    return [y for x in xs for y in ("--set", x)]


def test_two_rank_compare_and_diff_report_each_rank(tmp_path):
    out = tmp_path / "cmp"
    r = CliRunner().invoke(app, ["compare", "default", *sets(HW2), "--device", "cpu",
                                 "--time-scale", "200", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "per rank" in r.output and "disk write GB" in r.output
    report = json.loads((out / "compare.json").read_text())
    side = {s: json.loads((out / s / "summary.json").read_text())["metrics"]["ranks"] for s in ("sim", "hw")}
    assert len(report["ranks"]) == len(side["sim"]) == len(side["hw"]) == 2
    for i, row in enumerate(report["ranks"]):
        s, h = side["sim"][i], side["hw"][i]
        assert row["rank"] == i
        assert (row["ttft_p90_s"]["sim"], row["ttft_p90_s"]["hw"]) == (s["ttft_s"]["p90"], h["ttft_s"]["p90"])
        for kind in BYTE_KINDS:
            x, y = s["bytes"][kind], h["bytes"][kind]
            assert (row[f"bytes_{kind}"]["sim"], row[f"bytes_{kind}"]["hw"]) == (x, y)
            if y:
                assert row[f"bytes_{kind}"]["rel_err"] == pytest.approx((x - y) / y)
    assert sum(side["hw"][i]["bytes"]["disk_write"] for i in range(2)) > 0  # the node reached disk
    # a re-prediction of this node with one rank: refused before its replay, naming the key
    again = tmp_path / "again"
    r = CliRunner().invoke(app, ["compare", "default", *sets([*HW2, "node.ranks=1"]),
                                 "--hw-from", str(out), "--out", str(again)])
    assert r.exit_code == 2 and "2 rank(s)" in r.output and "node.ranks=1" in r.output, r.output
    assert "Traceback" not in r.output and not again.exists()
    # diff of the two sides: the same rows, named a and b
    r = CliRunner().invoke(app, ["diff", str(out / "sim"), str(out / "hw"), "--out", str(tmp_path / "d.json")])
    assert r.exit_code == 0, r.output
    assert "per rank (rel err = (a - b) / b)" in r.output
    d = json.loads((tmp_path / "d.json").read_text())
    assert [row["bytes_host_to_gpu"]["a"] for row in d["ranks"]] == \
        [row["bytes_host_to_gpu"]["sim"] for row in report["ranks"]]
    # against a one-rank run: the node-wide table, and why no per-rank one
    one = tmp_path / "one"
    r = CliRunner().invoke(app, ["run", "default", *sets([*HW2, "node.ranks=1", "output.plots=false"]),
                                 "--no-progress", "--out", str(one)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["diff", str(out / "hw"), str(one), "--out", str(tmp_path / "d1.json")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # (rich wraps long lines)
    assert "ttft_p50_s" in text and "per rank" not in text
    assert f"{out / 'hw'} has 2 rank(s)" in text and f"{one} has 1" in text, r.output
    d1 = json.loads((tmp_path / "d1.json").read_text())
    assert "ranks" not in d1 and d1["ranks_differ"].endswith("no per-rank table")


def test_diff_of_a_node_routed_at_run_time_against_one_split_by_session_hash(tmp_path):
    """Two routers on one node of two ranks (what a routing change did): the run-time
    router's run reports its ranks as a cluster's instances, the session-hash run rank by
    rank. Both are of one workload and two ranks: the diff is the node-wide table, and
    says why there is no per-rank one (it is not refused as of different rank counts)."""
    base = ["workload.synthetic.n_sessions=4", "model=llama-3-8b", "cache.page_bytes=2MiB",
            "cache.tiers=[{level: gpu, quota: 4GiB}]", "node.ranks=2", "output.plots=false"]
    runs = {}
    for policy in ("session-hash", "round-robin"):
        runs[policy] = tmp_path / policy
        r = CliRunner().invoke(app, ["run", "default", *sets([*base, f"router.policy={policy}"]),
                                     "--no-progress", "--out", str(runs[policy])])
        assert r.exit_code == 0, r.output
    routed = runs["round-robin"]
    r = CliRunner().invoke(app, ["diff", str(routed), str(runs["session-hash"]),
                                 "--out", str(tmp_path / "d.json")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "ttft_p50_s" in text and "per rank" not in text
    d = json.loads((tmp_path / "d.json").read_text())
    assert "ranks" not in d and d["ranks_differ"].startswith(f"{routed} reports its 2 ranks")
    # (printed as written; the console may fold a long path anywhere, so compared without
    # whitespace)
    assert "round-robin" in d["ranks_differ"]
    assert "".join(d["ranks_differ"].split()) in "".join(r.output.split())
