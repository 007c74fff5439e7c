"""The reports of ``kvsim compare`` and ``kvsim diff``: their files (written whole or not at
all) and their rich tables. Formatting only: the comparisons themselves are
``kvsim.tools.compare``'s.
"""

from __future__ import annotations

import json
from pathlib import Path


def diff_table(report: dict):
    """The ``kvsim diff`` report as a rich table (its ``ranks``, if any: ``rank_table``)."""
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=f"kvsim diff: a ({report['a_backend']}) vs b ({report['b_backend']}), "
                    f"rel err = (a - b) / b")
    for c in ("metric", "a", "b", "rel err", "b 90% CI"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for k, v in report["metrics"].items():
        t.add_row(k, _num(v["a"]), _num(v["b"]), _pct(v["rel_err"]), _ci(v.get("b_ci90")))
    turns = report["turns"]
    t.caption = (f"a = {report['a']}, b = {report['b']}. {turns['same_hits_by_tier']} of {turns['turns']} "
                 f"turns (matched by session and turn) found the same hit tokens by tier; CI: a "
                 f"bootstrap over b's turns")
    t.caption += _timing_caption(turns, names=("a", "b"))
    return t


# per-call logs (a row a compute call; the hw loop's slow calls): written gzipped beside
# compare.json (some 30K rows a side for a 5-minute slice), not into it
CALL_LOGS = ("sim_compute", "hw_compute", "hw_host")
CALL_LOGS_FILE = "compare-calls.json.gz"


def read_report(folder: str | Path) -> dict:
    """The report ``write_report`` left in ``folder``: ``compare.json``, or, where that is
    absent, ``compare.json.gz`` (saved runs may be kept gzipped, as the test fixture is)."""
    import gzip  # noqa: PLC0415

    folder = Path(folder)
    plain = folder / "compare.json"
    if plain.exists() or not (folder / "compare.json.gz").exists():
        return json.loads(plain.read_text())
    return json.loads(gzip.decompress((folder / "compare.json.gz").read_bytes()))


def write_report(report: dict, out: Path) -> Path:
    """``compare.json`` (the report and the per-batch timing logs) and, when the report
    has them, the per-call logs in ``compare-calls.json.gz``; each file written whole or
    not at all (a temporary file renamed into place)."""
    import gzip  # noqa: PLC0415

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    logs = report.get("logs") or {}
    calls = {k: logs[k] for k in CALL_LOGS if k in logs}
    small = {**report, "logs": {k: v for k, v in logs.items() if k not in calls}} if logs else report
    if calls:
        write_whole(out / CALL_LOGS_FILE, gzip.compress(json.dumps(calls).encode(), mtime=0))
    write_whole(out / "compare.json", (json.dumps(small, indent=2, default=str) + "\n").encode())
    return out / "compare.json"


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (kvsim.run.outputs.write_whole)."""
    from kvsim.run.outputs import write_whole as whole  # noqa: PLC0415

    whole(path, data)


def saved_call_logs(folder: str | Path) -> dict:
    """The per-call logs an earlier compare saved in ``folder`` ({} if none: runs saved
    before they were kept)."""
    import gzip  # noqa: PLC0415

    path = Path(folder) / CALL_LOGS_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"{path}: expected gzipped JSON of per-call logs: {e}") from e


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def _timing_caption(turns: dict, names: tuple[str, str] = ("sim", "hw")) -> str:
    """The per-turn timing agreement, as the tables' captions end; ``names``: the two
    sides (``kvsim diff`` calls them a and b)."""
    if turns.get("ttft_rel_err_median") is None:
        return ""
    text = (f"; per turn, TTFT rel err median {_pct(turns['ttft_rel_err_median'])}, |rel err| p90 "
            f"{turns['ttft_abs_rel_err_p90'] * 100:.1f}%; arrivals parted by up to "
            f"{turns['arrival_drift_max_s']:.2f} s")
    for x in turns.get("apart") or []:  # (older reports have none)
        text += f"; {x['turn']} TTFT {x['ttft_s'][0]:.2f} s {names[0]} / {x['ttft_s'][1]:.2f} s {names[1]}"
        if x["flipped"]:
            text += f", its order with {', '.join(x['flipped'])} flipped"
    return text


def _ci(ci) -> str:
    return "" if not ci else f"{_num(ci[0])}-{_num(ci[1])}"


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def report_tables(report: dict):
    """Two rich tables: headline metrics and transfers; for a node of several ranks a
    third, its ``ranks`` (``rank_table``)."""
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=f"kvsim compare {report['config']}: sim vs hw (rel err = (sim - hw) / hw)")
    for c in ("metric", "sim", "hw", "rel err", "hw 90% CI"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for k, v in report["metrics"].items():
        t.add_row(k, _num(v["sim"]), _num(v["hw"]), _pct(v["rel_err"]), _ci(v.get("hw_ci90")))
    x = Table(title="transfers per batch kind")
    for c in ("src->dst path", "batches sim/hw", "p50 s sim", "p50 s hw", "err", "GB/s sim", "GB/s hw", "err"):
        x.add_column(c, justify="left" if c.startswith("src") else "right")
    for k, v in report["transfers"].items():
        a, b = v["sim"], v["hw"]
        x.add_row(k, f"{a.get('batches', 0)}/{b.get('batches', 0)}", _num(a.get("seconds_p50")),
                  _num(b.get("seconds_p50")), _pct(v["rel_err_seconds_p50"]), _num(a.get("GBps")),
                  _num(b.get("GBps")), _pct(v["rel_err_GBps"]))
    turns = report.get("turns")
    if turns:
        t.caption = (f"{turns['same_hits_by_tier']} of {turns['turns']} turns found the same "
                     f"hit tokens by tier on both backends; CI: a bootstrap over hw's turns")
        t.caption += _timing_caption(turns)
    comp = report.get("compute") or {}
    if comp.get("sim") and comp.get("hw"):
        x.caption = _compute_caption(comp["sim"], comp["hw"])
    if report.get("ranks"):  # a node of several ranks: a third table, rank by rank
        return t, x, rank_table(report["ranks"])
    return t, x


RANK_LABELS = {"ttft_p50_s": "TTFT p50 s", "ttft_p90_s": "TTFT p90 s", "requests_per_s": "requests/s",
               "bytes_host_to_gpu": "host->gpu GB", "bytes_gpu_to_host": "gpu->host GB",
               "bytes_disk_read": "disk read GB", "bytes_disk_write": "disk write GB"}


def rank_table(ranks: list[dict], names: tuple[str, str] = ("sim", "hw")):
    """A report's ``ranks`` (kvsim.tools.rankcmp.per_rank) as a rich table: a row a rank and
    figure, bytes shown in GB (1e9; the report keeps bytes)."""
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=f"per rank (rel err = ({names[0]} - {names[1]}) / {names[1]})")
    for c in ("rank", "metric", names[0], names[1], "rel err"):
        t.add_column(c, justify="left" if c == "metric" else "right")
    for row in ranks:
        for k, v in row.items():
            if k == "rank":
                continue
            gb = k.startswith("bytes_")
            a, b = ((None if x is None else x / 1e9) if gb else x for x in (v[names[0]], v[names[1]]))
            t.add_row(str(row["rank"]), RANK_LABELS.get(k, k), _num(a), _num(b), _pct(v["rel_err"]))
        t.add_section()
    return t


def _compute_caption(a: dict, b: dict) -> str:
    """One line: each side's compute, nominal and as it ran (the copies' interference)."""
    def side(c: dict) -> str:
        r = c.get("ratio_p50")
        bound = (f", compute-bound steps {c['bound_stretch_s']:+.3f} s of {c['bound_nominal_s']:.2f} s"
                 if "bound_stretch_s" in c else "")
        beside = ""
        if "beside_calls" in c:  # (computelog.beside_transfers)
            beside = (f"; the other steps beside transfers {c['beside_calls']} "
                      f"({c['beside_nominal_s']:.2f} s nominal) {c['beside_stretch_s']:+.3f} s")
            if c["quiet_ratio_p50"] is not None:
                beside += f", {c['beside_excess_s']:+.3f} s beyond the quiet ones' x{c['quiet_ratio_p50']:.4f}"
        return (f"{c['seconds']:.2f} s for {c['nominal_s']:.2f} s nominal in {c['calls']} calls "
                f"(stretch {c['stretch_s']:+.3f} s{bound}{beside}; per call p50 {c['stretch_ms_p50']:+.3f} ms, "
                f"p90 {c['stretch_ms_p90']:+.3f} ms" + (f"; x{r:.4f} p50 from 1 ms" if r else "") + ")")
    lag = (f"; hw's loop spent {b['host_lag_s']:.3f} s before its compute calls (p50 "
           f"{b['host_lag_ms_p50']:.3f} ms, p90 {b['host_lag_ms_p90']:.3f} ms, max {b['host_lag_ms_max']:.2f} ms)"
           if "host_lag_s" in b else "")
    return f"compute: sim {side(a)}; hw {side(b)}{lag}"
