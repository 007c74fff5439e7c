"""``report.html``: the page a ``kvsim study`` or ``kvsim tune`` writes into its folder,
for a person to open (kvsim.study.html_page builds its parts: self-contained, escaped,
sortable tables, written whole).

A study's page: its question (the comment block its file starts with), its base config
and axes, the headline table (one row per point: its parameters, status and metrics,
relative to the baseline where there is one; sortable by any column), the plots, and
each point's config against the base config (the study's ``set`` and ``--set`` applied),
with links to each point's run folder.

A tune's page: its question, search space, objective and split; the best config against
the base and its held-out gap (the gain over the base config on the train sessions
against the gain on the held-out ones: a gain that does not hold is overfitting); the top
trials and every trial (sortable, linked to their run folders); Optuna's optimization
history and parameter importances (matplotlib PNGs, kvsim.study.tune).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvsim.config.keypaths import config_diff
from kvsim.study.html_page import (cell, diff_table, esc, figures, fmt, href, leading_comment,
                                   page, prose, table, write_page)
from kvsim.study.labels import metric_label
from kvsim.study.points import Point

REPORT = "report.html"
BAD = {"failed": "bad", "missing": "bad", "requests failed": "warn"}


def _pct(v: Any) -> str:
    """A fraction as a signed percentage (no -0.00%)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "-"
    return f"{round(v * 100, 2) + 0.0:+.2f}%"


def _kv(items: dict) -> str:
    return ", ".join(f"<code>{esc(k)}</code> = {esc(json.dumps(v, default=str, ensure_ascii=False))}"
                     for k, v in items.items())


def _error(text: str, keep: int = 120) -> str:
    """An error cell: its first ``keep`` characters, the whole in a tooltip."""
    short = text if len(text) <= keep else text[:keep] + "\u2026"
    return cell(text, text=f'<span title="{esc(text)}">{esc(short)}</span>', cls="err")


def _status(status: str, error: str) -> str:
    """A point's status, with the start of its error (the whole in a tooltip)."""
    if not error:
        return cell(status)
    short = error if len(error) <= 100 else error[:100] + "\u2026"
    return cell(status, text=f'{esc(status)}: <span class="err" title="{esc(error)}">{esc(short)}</span>',
                cls="t status")


def _question(source: str) -> str:
    q = leading_comment(source)
    return f'<div class="question">{prose(q)}</div>' if q else ""


def _header(kind: str, name: str, source: str, extra: str) -> str:
    return (f"<h1>kvsim {esc(kind)} <code>{esc(name)}</code></h1>"
            f'<p class="meta">file: <code>{esc(source)}</code>{extra}</p>{_question(source)}')


# ------------------------------------------------------------------------------- study


def _axes(spec, overrides) -> str:
    items = [f"<li>base config: <code>{esc(spec.base)}</code>"
             + (f"; set: {_kv(spec.overrides)}" if spec.overrides else "") + "</li>"]
    if overrides:
        items.append("<li>--set: " + ", ".join(f"<code>{esc(o)}</code>" for o in overrides) + "</li>")
    for what, axes in (("grid", spec.grid), ("zip", spec.zipped)):
        for key, values in axes.items():
            label = spec.labels.get(key)
            items.append(f"<li>{what}: <code>{esc(key)}</code>{f' ({esc(label)})' if label else ''}: "
                         + ", ".join(esc(json.dumps(v, default=str)) for v in values) + "</li>")
    if spec.variants:
        items.append("<li>variants:<ul>" + "".join(
            f"<li><b>{esc(v.name)}</b>: {_kv(v.overrides) or 'the base config'}</li>" for v in spec.variants)
            + "</ul></li>")
    if spec.seeds:
        items.append("<li>seeds: " + esc(", ".join(str(s) for s in spec.seeds)) + "</li>")
    if spec.traces:
        items.append("<li>traces: " + ", ".join(f"<code>{esc(t)}</code>" for t in spec.traces) + "</li>")
    if spec.baseline:
        items.append(f"<li>baseline: <code>{esc(spec.baseline)}</code> (metrics also relative to it)</li>")
    items.append(f"<li>backend: {esc(spec.backend)}</li>")
    return f'<ul class="axes">{"".join(items)}</ul>'


def _point_link(folder: Path, name: str, text: str) -> str:
    """A link to the point's run folder; a point that did not run has none."""
    rel = f"points/{name}/"
    return f'<a href="{href(rel)}">{esc(text)}</a>' if (folder / rel).is_dir() else esc(text)


def study_table(folder: Path, points: list[Point], rows: list[dict], metrics: list[str],
                rel: bool) -> str:
    """The headline table: a row per point (linked to its folder and its config diff)."""
    params = list(dict.fromkeys(k for p in points for k in p.params))
    variant = any(p.variant for p in points)
    by_name = {p.name: (i, p) for i, p in enumerate(points)}
    header = [("point", "the point's run folder"), *([("variant", "")] if variant else []),
              *[(k, "study axis") for k in params], ("status", ""),
              *[(m, metric_label(m)[0]) for m in metrics],
              ("same_as", "the first earlier point with the same requests.csv"),
              ("config", "what differs from the base config")]
    body = []
    for r in rows:
        i, p = by_name[r["point"]]
        cells = [cell(p.name, text=_point_link(folder, p.name, p.name))]
        if variant:
            cells.append(cell(p.variant or ""))
        for k in params:
            v = p.params.get(k)
            cells.append(cell(v, text=esc(fmt(v)), sort=p.numeric.get(k, v)))
        cells.append(_status(r.get("status", ""), r.get("error") or ""))
        for m in metrics:
            v = r.get(m)
            extra = ""
            if rel and isinstance(r.get(f"rel.{m}"), float):
                extra = f' <span class="rel">({_pct(r[f"rel.{m}"])})</span>'
            cells.append(cell(v, extra=extra))
        cells.append(cell(r.get("same_as") or ""))
        cells.append(cell(i, text=f'<a href="#diff-{i}">diff</a>', cls="t"))
        body.append((BAD.get(r.get("status", ""), ""), cells))
    return table(header, body, "headline")


def _point_diffs(folder: Path, points: list[Point], base: dict | None) -> str:
    if base is None:
        return ('<p class="meta">the base config with the study\'s set is not a valid config on its '
                "own (a variant or an axis completes it): no diffs shown</p>")
    out = []
    for i, p in enumerate(points):
        d = config_diff(base, p.config)
        where = _point_link(folder, p.name, "run folder") if (folder / "points" / p.name).is_dir() \
            else "did not run"
        out.append(f'<details id="diff-{i}"><summary><b>{esc(p.name)}</b>: {len(d)} '
                   f'key{"s" if len(d) != 1 else ""} differ{"s" if len(d) == 1 else ""} from the base'
                   f" &middot; {where}</summary>"
                   f"{diff_table(d, 'this point')}</details>")
    return "\n".join(out)


def write_study_report(folder: Path, source: str, spec, points: list[Point], rows: list[dict],
                       plots: list[Path], base: dict | None, overrides=(), ran: int | None = None,
                       skipped: int | None = None) -> Path:
    """``folder/report.html`` for a study (``base``: the resolved base config the points
    are compared with)."""
    statuses = [r.get("status") for r in rows]
    counts = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    this = f" ({ran} run now, {skipped} already done)" if ran is not None else ""
    links = " &middot; ".join(f'<a href="{href(n)}">{esc(n)}</a>'
                              for n in ("study.csv", "study.parquet", "study.yaml", "failures.json"))
    body = [_header("study", spec.name, source, f" &middot; {len(points)} points: {esc(counts)}{esc(this)}"),
            "<h2>Axes</h2>", _axes(spec, overrides),
            "<h2>Results</h2>",
            '<p class="meta">one row per point; click a column header to sort by it (again to '
            f"reverse). Tables: {links}</p>",
            study_table(folder, points, rows, list(spec.metrics), spec.baseline is not None),
            "<h2>Plots</h2>", figures(plots, folder),
            "<h2>Each point's config against the base</h2>",
            '<p class="meta">the base: the study\'s base config with its <code>set</code> and '
            "--set; each key the point changes (the variant's set, its axis values, its seed "
            "and trace)</p>",
            _point_diffs(folder, points, base)]
    return write_page(folder / REPORT, page(f"kvsim study {spec.name}", "\n".join(body)))


# -------------------------------------------------------------------------------- tune


def _search(spec, overrides=()) -> str:
    items = []
    for name, p in spec.space.items():
        if p.type == "categorical":
            what = "one of " + ", ".join(esc(json.dumps(c)) for c in (p.choices or []))
        elif p.type == "split":
            what = (f"a fraction {p.low:g}..{p.high:g} of {esc(p.total)} to <code>{esc((p.keys or ['?'])[0])}"
                    f"</code>, the rest to <code>{esc((p.keys or ['?', '?'])[1])}</code>")
        else:
            what = f"{esc(p.type)} {p.low:g}..{p.high:g}{esc(p.unit or '')}{' (log)' if p.log else ''}"
        items.append(f"<li><code>{esc(name)}</code>: {what}</li>")
    obj = " + ".join(f"{w:g} x <code>{esc(m)}</code>" for m, w in spec.objective.weights.items())
    items.append(f"<li>objective: {esc(spec.objective.sense)} {obj}</li>")
    for c in spec.constraints:
        bound = " and ".join(b for b in ((f"&le; {c.max:g}" if c.max is not None else ""),
                                         (f"&ge; {c.min:g}" if c.min is not None else "")) if b)
        items.append(f"<li>constraint: <code>{esc(c.metric)}</code> {bound}</li>")
    split = (f"{spec.split.held_out:g} of the sessions held out (seed {spec.split.seed})"
             if spec.split is not None else "none (the best configs are not re-evaluated)")
    items.append(f"<li>split: {esc(split)}</li>")
    items.append(f"<li>sampler: {esc(spec.sampler)} (seed {spec.seed}); budget {spec.trials} trials; "
                 f"base config <code>{esc(spec.base)}</code>"
                 + (f"; set: {_kv(spec.overrides)}" if spec.overrides else "") + "</li>")
    if overrides:
        items.append("<li>--set: " + ", ".join(f"<code>{esc(o)}</code>" for o in overrides) + "</li>")
    return f'<ul class="axes">{"".join(items)}</ul>'


def _trial_link(folder: Path, part: str, number: Any) -> str:
    if not isinstance(number, int):
        return esc(fmt(number))
    rel = f"{part}/{number:04d}/"
    return f'<a href="{href(rel)}">{number:04d}</a>' if (folder / rel).is_dir() else f"{number:04d}"


def _best(folder: Path, spec, top: list[dict], best_config: dict | None, base: dict) -> str:
    if not top or best_config is None:
        return '<p class="err">no trial completed within the constraints</p>'
    b = top[0]
    parts = [f"trial {_trial_link(folder, 'trials', b['trial'])}: objective "
             f"{esc(fmt(b.get('objective.train')))} on the train sessions"]
    if "objective.held_out" in b:
        parts.append(f"{esc(fmt(b.get('objective.held_out')))} on the held-out ones "
                     f"({_trial_link(folder, 'held_out', b['trial'])})")
    gap = ""
    if isinstance(b.get("gain.train"), float) and isinstance(b.get("gain.held_out"), float):
        gap = (f"<p><b>held-out gap</b>: gain over the base config {_pct(b['gain.train'])} on the train "
               f"sessions, {_pct(b['gain.held_out'])} on the held-out ones (a gap of "
               f"{_pct(b['gain.held_out'] - b['gain.train'])[:-1]} points; a gain that does not "
               f"hold on held-out sessions is overfitting)</p>")
    elif spec.split is not None:
        gap = '<p class="meta">held-out gap: not measured (the base config\'s evaluation failed)</p>'
    return (f"<p>{'; '.join(parts)}.</p>{gap}"
            f'<p class="meta">ready to run: <a href="{href("best.yaml")}">best.yaml</a> '
            f"(<code>kvsim run {esc(folder / 'best.yaml')}</code>)</p>"
            f"{diff_table(config_diff(base, best_config), 'best')}")


def _top_table(folder: Path, spec, top: list[dict]) -> str:
    params = [k for k in dict.fromkeys(k for r in top for k in r)
              if k not in {"rank", "trial", "objective.train", "objective.held_out", "held_out_feasible",
                           "gain.train", "gain.held_out", "error"}]
    header = [("rank", ""), ("trial", "the trial's run folder (train sessions)"),
              *[(k, "search parameter") for k in params],
              ("objective.train", "on the train sessions"), ("objective.held_out", "on the held-out sessions"),
              ("gain.train", "over the base config, train"), ("gain.held_out", "over the base config, held-out"),
              ("gap", "gain.held_out - gain.train (points)"), ("held_out_feasible", ""), ("error", "")]
    body = []
    for r in top:
        g1, g2 = r.get("gain.train"), r.get("gain.held_out")
        gap = g2 - g1 if isinstance(g1, float) and isinstance(g2, float) else None
        cells = [cell(r.get("rank")), cell(r.get("trial"), text=_trial_link(folder, "trials", r.get("trial")),
                                           cls="t")]
        cells += [cell(r.get(k)) for k in params]
        cells += [cell(r.get("objective.train")),
                  cell(r.get("objective.held_out"),
                       extra=f' <span class="rel">({_trial_link(folder, "held_out", r.get("trial"))})</span>'
                       if r.get("objective.held_out") is not None else ""),
                  cell(g1, text=_pct(g1)), cell(g2, text=_pct(g2)),
                  cell(gap, text=_pct(gap)), cell(r.get("held_out_feasible")),
                  _error(r.get("error") or "")]
        body.append(("bad" if r.get("error") else "", cells))
    return table(header, body, "top")


def _trials_table(folder: Path, trials: list[dict]) -> str:
    cols = list(dict.fromkeys(k for r in trials for k in r))
    header = [(c, "the trial's run folder" if c == "trial" else "") for c in cols]
    body = []
    for r in trials:
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "trial":
                cells.append(cell(v, text=_trial_link(folder, "trials", v), cls="t"))
            elif c == "error":
                cells.append(_error(v or ""))
            else:
                cells.append(cell(v))
        state = r.get("state")
        body.append(("bad" if state == "FAIL" else ("warn" if state != "COMPLETE" else ""), cells))
    return table(header, body, "trials")


def write_tune_report(folder: Path, source: str, spec, base: dict, top: list[dict],
                      trials: list[dict], best_config: dict | None, plots: list[Path],
                      overrides=()) -> Path:
    """``folder/report.html`` for a tune (``base``: the resolved base config; ``top``
    and ``trials``: the rows of top.csv and trials.csv)."""
    states = [r.get("state") for r in trials]
    counts = ", ".join(f"{states.count(s)} {str(s).lower()}" for s in dict.fromkeys(states)) or "no trials"
    links = " &middot; ".join(f'<a href="{href(n)}">{esc(n)}</a>' for n in
                              ("best.yaml", "top.csv", "trials.csv") if (folder / n).exists())
    base_links = " &middot; ".join(f'<a href="{href(f"base/{p}/")}">{p}</a>' for p in ("train", "held_out")
                                   if (folder / "base" / p).is_dir())
    body = [_header("tune", spec.name, source, f" &middot; {len(trials)} trials: {esc(counts)}"),
            "<h2>Search</h2>", _search(spec, overrides),
            "<h2>Best config</h2>", _best(folder, spec, top, best_config, base),
            "<h2>Top trials, train and held-out</h2>",
            f'<p class="meta">click a column header to sort by it. Files: {links}'
            + (f"; the base config's runs: {base_links}" if base_links else "") + "</p>",
            _top_table(folder, spec, top),
            "<h2>Plots</h2>", figures(plots, folder),
            "<h2>Every trial</h2>", _trials_table(folder, trials)]
    if best_config is not None:
        import yaml

        body += ["<details><summary>best.yaml (the whole config)</summary><pre>"
                 + esc(yaml.safe_dump(best_config, sort_keys=False)) + "</pre></details>"]
    return write_page(folder / REPORT, page(f"kvsim tune {spec.name}", "\n".join(body)))


def resolved_base(spec, source: str, overrides=()) -> dict | None:
    """The study's or tune's base config with its ``set`` and ``--set``, resolved as a
    point's config is (None where the base on its own is not a valid config: a variant
    or an axis value may make it one)."""
    from kvsim.config import ConfigFileError, validate_config
    from kvsim.study.points import overridden_base

    data = overridden_base(spec, source, overrides)
    data["name"] = spec.name
    try:
        return validate_config(data, f"{source}: base").model_dump(mode="json")
    except ConfigFileError:
        return None
