"""The study table: one row per point, its parameters and headline metrics, written as
CSV and Parquet and printed with rich.

Rows are read back from the points' folders (``summary.json``), so points skipped as
complete and points run now are tabulated alike. ``status``: ``ok``; ``requests failed``
for a point that ran but failed some of its requests (its ``error`` says how many and
why: a point is ``ok`` only when every request completed); ``failed`` (the point did not
run: its error) or ``missing``. ``same_as``: the first earlier point whose
``requests.csv`` is byte for byte this one's (an axis value or variant that changed
nothing shows as such). With a baseline, ``rel.<metric>`` columns hold (value - baseline)
/ baseline. A ``disk_copies.*`` metric of a point without retained copies (no option on)
is 0.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from kvsim.study.points import Point, get_key


# metrics a summary has only with an option on (retained disk copies): 0 without it
OFF_MEANS_ZERO = ("disk_copies.",)
RAN = ("ok", "requests failed")   # statuses of a point that ran (its folder is complete)


def failed_requests(folder: Path, n_failed: int, n_done: int) -> str:
    """``N of M requests failed (reason: count, ...)``, from the point's requests.csv (the
    reasons with their numbers taken out, most frequent first)."""
    reasons: Counter = Counter()
    try:
        with open(folder / "requests.csv", newline="") as f:
            for r in csv.DictReader(f):
                if r.get("failed"):
                    reasons[re.sub(r"\d+", "N", r["failed"])] += 1
    except (OSError, csv.Error):
        pass
    why = "; ".join(f"{k}: {v}" for k, v in reasons.most_common(3))
    return f"{n_failed:,} of {n_failed + n_done:,} requests failed" + (f" ({why})" if why else "")


def _digest(folder: Path) -> str | None:
    try:
        return hashlib.sha256((folder / "requests.csv").read_bytes()).hexdigest()
    except OSError:
        return None


def metric(metrics: dict, path: str) -> Any:
    """A summary metric by dotted path; KeyError names the path."""
    try:
        return get_key(metrics, path)
    except (KeyError, IndexError, TypeError):
        raise KeyError(f"no metric {path!r} in the summary") from None


def _column(values: list) -> list:
    """A column Parquet can store: numbers stay numbers when all are; else text."""
    present = [v for v in values if v is not None]
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return values
    if all(isinstance(v, bool) for v in present):
        return values
    return [None if v is None else str(v) for v in values]


def build_rows(points: list[Point], folder_of, metrics: list[str], failures: dict[str, str],
               baseline: str | None = None) -> list[dict]:
    rows = []
    summaries: dict[str, dict] = {}
    seen: dict[str, str] = {}   # requests.csv digest -> the first point that had it
    for p in points:
        row: dict[str, Any] = {"point": p.name}
        if any(q.variant for q in points):
            row["variant"] = p.variant
        row.update(p.params)
        for label, v in p.numeric.items():
            if label in p.params and p.params[label] != v:
                row[f"{label}_value"] = v
        folder = folder_of(p)
        summary = None
        try:
            summary = json.loads((folder / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        if p.name in failures or summary is None:
            row["status"] = "failed" if p.name in failures else "missing"
            row["error"] = failures.get(p.name, "")
            for m in metrics:
                row[m] = None
        else:
            summaries[p.name] = summary["metrics"]
            n_failed = summary["metrics"].get("requests_failed") or 0
            row["status"] = "requests failed" if n_failed else "ok"
            row["error"] = failed_requests(folder, n_failed, summary["metrics"].get(
                "requests_completed") or 0) if n_failed else ""
            for m in metrics:
                try:
                    row[m] = metric(summary["metrics"], m)
                except KeyError:  # (no retained-copy option on: no copies, not unknown)
                    row[m] = 0 if m.startswith(OFF_MEANS_ZERO) else None
        row["hash"] = p.hash
        row["same_as"] = ""
        if row["status"] in RAN:
            d = _digest(folder)
            if d is not None:
                first = seen.setdefault(d, p.name)
                row["same_as"] = "" if first == p.name else first
        rows.append(row)
    if baseline is not None:
        base = summaries.get(baseline)
        for row in rows:
            for m in metrics:
                b = None if base is None else _num(base, m)
                v = row.get(m)
                ok = isinstance(v, (int, float)) and isinstance(b, (int, float)) and b != 0
                row[f"rel.{m}"] = (v - b) / abs(b) if ok else None
    return rows


def _num(metrics: dict, path: str):
    try:
        v = metric(metrics, path)
    except KeyError:
        return None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def write_table(rows: list[dict], out: Path, stem: str = "study") -> tuple[Path, Path]:
    """``stem.csv`` and ``stem.parquet`` in ``out``, each written whole (kvsim.run.outputs)."""
    import csv
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvsim.run.outputs import write_whole

    cols = list(dict.fromkeys(k for r in rows for k in r))
    data = {c: _column([r.get(c) for r in rows]) for c in cols}
    csv_path, pq_path = out / f"{stem}.csv", out / f"{stem}.parquet"
    text = io.StringIO(newline="")
    w = csv.writer(text)
    w.writerow(cols)
    for i in range(len(rows)):
        w.writerow(["" if data[c][i] is None else data[c][i] for c in cols])
    write_whole(csv_path, text.getvalue().encode())
    buf = pa.BufferOutputStream()
    pq.write_table(pa.table({c: pa.array(v) for c, v in data.items()}), buf)
    write_whole(pq_path, buf.getvalue().to_pybytes())
    return csv_path, pq_path


def fmt(v: Any) -> str:
    """A value as the study's tables show it (terminal and report.html): numbers to 4
    significant digits (3 for large integers), booleans on/off, missing ``-``."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int) and abs(v) >= 10**7:
        return f"{v:.3g}"
    return str(v)


def rich_table(rows: list[dict], title: str, params: list[str], metrics: list[str],
               rel: bool = False, max_metrics: int = 7, max_rows: int = 60):
    """The first ``max_metrics`` metrics of the first ``max_rows`` points (the rest are in
    the CSV and Parquet tables)."""
    from rich.table import Table
    from rich.text import Text

    shown = metrics[:max_metrics]
    t = Table(title=title, show_header=True, header_style="bold")
    for c in params:
        t.add_column(c)
    for m in shown:
        t.add_column(m, justify="right")
    t.add_column("status")
    if len(rows) > max_rows:
        t.caption = f"the first {max_rows} of {len(rows)} points; all of them in study.csv"
    for r in rows[:max_rows]:
        cells = [Text(fmt(r.get(c))) for c in params]
        for m in shown:
            v = fmt(r.get(m))
            if rel and isinstance(r.get(f"rel.{m}"), float) and r["status"] in RAN:
                v += f" ({r[f'rel.{m}'] * 100:+.1f}%)"
            cells.append(Text(v))
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['error'][:80]}"
        if r.get("same_as"):
            status += f"; same requests.csv as {r['same_as']}"
        t.add_row(*cells, Text(status))
    return t
