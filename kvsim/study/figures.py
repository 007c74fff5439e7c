"""The plots across a study's points (PNG, matplotlib's Agg backend).

- ``axis-<label>.png``: each plot metric against each numeric axis with two or more
  values, one line per variant and per value of the other axes, in numeric order; a value
  averaged over seeds is drawn as the mean with a band from the lowest to the highest seed;
- ``ttft_cdf.png``: the TTFT CDFs of up to 12 points overlaid (the first 12 in order);
- ``variants.png``: one bar per named variant for each plot metric: the mean over the
  variant's points, with error bars from the lowest to the highest.

Every plot has a title, and every axis its name and unit (kvsim.study.labels). Series are
told apart by colour (ten) and then by line style and marker, so twelve lines never share
a look.
"""

from __future__ import annotations

import bisect
import csv
import math
from collections import defaultdict
from pathlib import Path

from kvsim.run.plots import save_png
from kvsim.study.points import Point
from kvsim.study.labels import axis_label, metric_label
from kvsim.study.tierbars import tier_bars

MAX_LINES = 12
MAX_TICKS = 10   # labels on an axis at most (1,000 of them took 17 s of CPU to draw)
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P")
DRAWN = ("ok", "requests failed")   # statuses of points whose folders can be plotted


def style(i: int) -> dict:
    """Series ``i``'s look: one of ten colours, then another line style and marker."""
    return {"color": f"C{i % 10}", "linestyle": LINESTYLES[(i // 10) % len(LINESTYLES)],
            "marker": MARKERS[(i // 10) % len(MARKERS)]}


def natural(v) -> tuple:
    """A sort key that puts numbers in numeric order (1, 2, 10) and text after them."""
    if isinstance(v, bool):
        return (1, str(v))
    if isinstance(v, (int, float)):
        return (0, float(v), "")
    try:
        return (0, float(v), "")
    except (TypeError, ValueError):
        pass
    from kvsim.config.units import parse_size

    try:
        return (0, float(parse_size(v)), str(v))
    except (TypeError, ValueError):
        return (1, str(v))


def _tick_values(values: list, log: bool = False) -> list:
    """``values`` (sorted, numbers) to label on an axis: all of them up to ``MAX_TICKS``,
    else for each of ``MAX_TICKS`` positions evenly spaced along the axis (in log space on
    a log axis) the value nearest to it, the first and the last included."""
    n = len(values)
    if n <= MAX_TICKS:
        return values
    f = math.log if log else float
    lo, hi = f(values[0]), f(values[-1])
    pos = [f(v) for v in values]
    out = []
    for i in range(MAX_TICKS):
        target = lo + (hi - lo) * i / (MAX_TICKS - 1)
        j = bisect.bisect_left(pos, target)
        near = min((k for k in (j - 1, j) if 0 <= k < n), key=lambda k: abs(pos[k] - target))
        if not out or values[near] != out[-1]:
            out.append(values[near])
    return out


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _numbers(vals: list) -> list[float]:
    return [float(v) for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)
            and not (isinstance(v, float) and math.isnan(v))]


def _mean(vals: list) -> float | None:
    vals = _numbers(vals)
    return sum(vals) / len(vals) if vals else None


def _fmt_tick(v: float) -> str:
    return f"{v:.4g}"


def axis_plots(points: list[Point], rows: list[dict], metrics: list[str], out: Path,
               axes: dict[str, str] | None = None, study: str = "") -> list[Path]:
    """``axes``: column label -> the config key behind it (for the axis' unit)."""
    plt = _plt()
    axes = axes or {}
    by_name = {r["point"]: r for r in rows}
    labels = [k for k in (points[0].numeric if points else {}) if k != "seed"]
    variants = list(dict.fromkeys(p.variant for p in points))
    n_seeds = len({p.params.get("seed") for p in points})
    written = []
    for x in labels:
        xs = {p.numeric.get(x) for p in points}
        if len(xs) < 2 or None in xs:
            continue
        xname, xscale = axis_label(axes.get(x), x)
        others = [k for k in points[0].params if k not in (x, "seed")]
        groups: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
        order: dict[tuple, tuple] = {}
        for p in points:
            key = (p.variant, *(str(p.params[k]) for k in others))
            groups[key][p.numeric[x]].append(by_name[p.name])
            order[key] = (variants.index(p.variant),
                          *(natural(p.numeric.get(k, p.params[k])) for k in others))
        series = sorted(groups.items(), key=lambda kv: order[kv[0]])
        shown = series[:MAX_LINES]
        n_names = sum(1 for key, _ in shown if key[0] or others)
        legend_rows = -(-n_names // 4)              # the legend's rows, above the plots
        fig, axs = plt.subplots(1, len(metrics), squeeze=False, figsize=(4.5 * len(metrics), 4.0))
        banded = False
        for ax, m in zip(axs[0], metrics):
            yname, yscale = metric_label(m)
            for n, (key, by_x) in enumerate(shown):
                xv = sorted(by_x)
                vals = [_numbers([r.get(m) for r in by_x[v]]) for v in xv]
                mean = [sum(v) / len(v) * yscale if v else float("nan") for v in vals]
                name = " ".join(s for s in ([key[0]] if key[0] else []) +
                                [f"{k}={v}" for k, v in zip(others, key[1:])])
                look = style(n)
                ax.plot([v * xscale for v in xv], mean, label=name or None, **look)
                if any(len(v) > 1 for v in vals):
                    banded = True
                    ax.fill_between([v * xscale for v in xv],
                                    [min(v) * yscale if v else float("nan") for v in vals],
                                    [max(v) * yscale if v else float("nan") for v in vals],
                                    color=look["color"], alpha=0.15, linewidth=0)
            ax.set_xlabel(xname)
            ax.set_ylabel(yname)
            ax.set_title(yname.rsplit(" (", 1)[0], fontsize="medium")
            ticks = sorted(xs)
            log = min(ticks) > 0 and max(ticks) / min(ticks) >= 8
            if log:
                ax.set_xscale("log")
            tv = _tick_values(ticks, log)
            ax.set_xticks([v * xscale for v in tv], [_fmt_tick(v * xscale) for v in tv], rotation=30)
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
        title = f"{study + ': ' if study else ''}{', '.join(metric_label(m)[0].rsplit(' (', 1)[0] for m in metrics)} " \
                f"against {x}"
        notes = []
        if banded:
            notes.append(f"lines: mean over {n_seeds} seeds; bands: lowest to highest seed")
        if len(series) > len(shown):
            notes.append(f"the first {len(shown)} of {len(series)} series")
        title_in = 0.3 + 0.2 * len(notes)
        head_in = title_in + (0.2 * legend_rows + 0.05 if legend_rows else 0.0)
        fig.set_figheight(3.4 + head_in)
        height = fig.get_figheight()
        handles, names = axs[0][0].get_legend_handles_labels()
        if any(names):
            fig.legend(handles, names, loc="upper center", ncol=min(4, len(names)), fontsize="small",
                       bbox_to_anchor=(0.5, 1 - title_in / height))
        fig.suptitle(title + ("\n" + "; ".join(notes) if notes else ""), fontsize="medium")
        fig.tight_layout()
        fig.subplots_adjust(top=(height - head_in - 0.3) / height)   # 0.3 in: the plots' titles
        path = out / f"axis-{x}.png"
        save_png(fig, path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written


def _ttfts(folder: Path) -> list[float]:
    vals = []
    try:
        with open(folder / "requests.csv", newline="") as f:
            for r in csv.DictReader(f):
                if r.get("failed") or not r.get("ttft_s"):
                    continue
                vals.append(float(r["ttft_s"]))
    except (OSError, KeyError, ValueError):
        return []
    return sorted(vals)


def cdf_points(points: list[Point], status: dict[str, str]) -> list[Point] | None:
    """The points ``ttft_cdf.png`` shows, the first ``MAX_LINES`` that ran (status 'ok' or
    'requests failed') in the study's order, once they are known: None while a point that
    could be among them has no status yet (a study draws the plot as soon as it is known,
    while its last points still run)."""
    shown = []
    for p in points:
        s = status.get(p.name)
        if s is None:
            return None
        if s in DRAWN:
            shown.append(p)
            if len(shown) == MAX_LINES:
                break
    return shown


def ttft_cdf(shown: list[Point], n_points: int, folder_of, out: Path, study: str = "") -> list[Path]:
    """``ttft_cdf.png``: the TTFT CDFs of ``shown`` overlaid (of a study of ``n_points``)."""
    if not shown:
        return []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for n, p in enumerate(shown):
        v = _ttfts(folder_of(p))
        if v:
            look = style(n)
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=p.name, color=look["color"],
                    linestyle=look["linestyle"])
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, log scale)")
    ax.set_ylabel("completed requests (cumulative fraction)")
    title = (f"{study + ': ' if study else ''}TTFT CDF, one line a point"
             + (f" (the first {len(shown)} of {n_points} points)" if n_points > len(shown) else ""))
    ax.set_title(title, fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    path = out / "ttft_cdf.png"
    save_png(fig, path, dpi=80)
    plt.close(fig)
    return [path]


def ttft_cdfs(points: list[Point], rows: list[dict], folder_of, out: Path, study: str = "") -> list[Path]:
    return ttft_cdf(cdf_points(points, {r["point"]: r["status"] for r in rows}) or [], len(points),
                    folder_of, out, study)


def variant_bars(points: list[Point], rows: list[dict], metrics: list[str], out: Path,
                 study: str = "") -> list[Path]:
    """A bar per variant: the mean over its points; error bars from the lowest to the
    highest of them, where a variant has several (seeds, other axes), and each point a dot."""
    variants = list(dict.fromkeys(p.variant for p in points if p.variant))
    if len(variants) < 2:
        return []
    plt = _plt()
    by_name = {r["point"]: r for r in rows}
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 4.2), squeeze=False)
    per = {v: [p for p in points if p.variant == v] for v in variants}
    several = any(len(ps) > 1 for ps in per.values())
    for ax, m in zip(axes[0], metrics):
        yname, yscale = metric_label(m)
        vals = [[x * yscale for x in _numbers([by_name[p.name].get(m) for p in per[v]])] for v in variants]
        mean = [sum(v) / len(v) if v else 0.0 for v in vals]
        err = [[mu - min(v) if v else 0.0 for mu, v in zip(mean, vals)],
               [max(v) - mu if v else 0.0 for mu, v in zip(mean, vals)]]
        ax.bar(range(len(variants)), mean, color=[style(i)["color"] for i in range(len(variants))],
               yerr=err if several else None, capsize=4 if several else 0)
        if several:
            for i, v in enumerate(vals):
                ax.plot([i] * len(v), v, linestyle="none", marker=".", color="black", markersize=4)
        ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right")
        ax.set_ylabel(yname)
        ax.set_title(yname.rsplit(" (", 1)[0], fontsize="medium")
        ax.grid(True, axis="y", alpha=0.3)
    n = max(len(ps) for ps in per.values())
    note = (f"\nbars: mean over each variant's {n} points; error bars: lowest to highest; dots: the points"
            if several else "")
    fig.suptitle(f"{study + ': ' if study else ''}variants{note}", fontsize="medium")
    fig.tight_layout()
    path = out / "variants.png"
    save_png(fig, path, dpi=80)
    plt.close(fig)
    return [path]


def write_study_plots(points: list[Point], rows: list[dict], folder_of, metrics: list[str],
                      out: Path, cdf: bool = True, axes: dict[str, str] | None = None,
                      study: str = "") -> list[Path]:
    """The study's plots; ``cdf=False``: all but ``ttft_cdf.png`` (drawn already).
    ``axes``: column label -> config key (the axes' units); ``study``: its name (titles)."""
    out.mkdir(parents=True, exist_ok=True)
    return [*axis_plots(points, rows, metrics, out, axes, study),
            *(ttft_cdfs(points, rows, folder_of, out, study) if cdf else []),
            *variant_bars(points, rows, metrics, out, study), *tier_bars(points, rows, out, study, _plt)]
