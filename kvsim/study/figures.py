"""The plots across a study's points (PNG, matplotlib's Agg backend).

- ``axis-<label>.png``: each plot metric against each numeric axis with two or more
  values, one line per variant and per value of the other axes (seeds averaged);
- ``ttft_cdf.png``: the TTFT CDFs of up to 12 points overlaid (the first 12 in order);
- ``variants.png``: one bar per named variant for each plot metric (averaged over the
  variant's points).
"""

from __future__ import annotations

import bisect
import csv
import math
from collections import defaultdict
from pathlib import Path

from kvsim.study.points import Point

MAX_LINES = 12
MAX_TICKS = 10   # labels on an axis at most (1,000 of them took 17 s of CPU to draw)


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


def _mean(vals: list) -> float | None:
    vals = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(vals) / len(vals) if vals else None


def axis_plots(points: list[Point], rows: list[dict], metrics: list[str], out: Path) -> list[Path]:
    plt = _plt()
    by_name = {r["point"]: r for r in rows}
    labels = [k for k in (points[0].numeric if points else {}) if k != "seed"]
    written = []
    for x in labels:
        xs = {p.numeric.get(x) for p in points}
        if len(xs) < 2 or None in xs:
            continue
        others = [k for k in points[0].params if k not in (x, "seed")]
        groups: dict[tuple, dict] = defaultdict(lambda: defaultdict(list))
        ticks: dict[float, str] = {}
        for p in points:
            key = (p.variant, *(str(p.params[k]) for k in others))
            groups[key][p.numeric[x]].append(by_name[p.name])
            ticks[p.numeric[x]] = str(p.params[x])
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.8), squeeze=False)
        for ax, m in zip(axes[0], metrics):
            for n, (key, series) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
                if n >= MAX_LINES:
                    break
                xv = sorted(series)
                yv = [_mean([r.get(m) for r in series[v]]) for v in xv]
                name = " ".join(s for s in ([key[0]] if key[0] else []) +
                                [f"{k}={v}" for k, v in zip(others, key[1:])])
                ax.plot(xv, [float("nan") if y is None else y for y in yv], marker="o", label=name or None)
            ax.set_xlabel(x)
            ax.set_ylabel(m)
            log = min(ticks) > 0 and max(ticks) / min(ticks) >= 8
            if log:
                ax.set_xscale("log")
            shown = _tick_values(sorted(ticks), log)
            ax.set_xticks(shown, [ticks[v] for v in shown], rotation=30)
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
        handles, names = axes[0][0].get_legend_handles_labels()
        if any(names):
            fig.legend(handles, names, loc="upper center", ncol=min(4, len(names)), fontsize="small",
                       bbox_to_anchor=(0.5, 1.0))
            fig.tight_layout(rect=(0, 0, 1, 0.88))
        else:
            fig.tight_layout()
        path = out / f"axis-{x}.png"
        fig.savefig(path, dpi=100)
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
    """The points ``ttft_cdf.png`` shows, the first ``MAX_LINES`` with status 'ok' in the
    study's order, once they are known: None while a point that could be among them has
    no status yet (a study draws the plot as soon as it is known, while its last points
    still run)."""
    shown = []
    for p in points:
        s = status.get(p.name)
        if s is None:
            return None
        if s == "ok":
            shown.append(p)
            if len(shown) == MAX_LINES:
                break
    return shown


def ttft_cdf(shown: list[Point], n_points: int, folder_of, out: Path) -> list[Path]:
    """``ttft_cdf.png``: the TTFT CDFs of ``shown`` overlaid (of a study of ``n_points``)."""
    if not shown:
        return []
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in shown:
        v = _ttfts(folder_of(p))
        if v:
            ax.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=p.name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    title = "TTFT CDF" + (f" (the first {len(shown)} of {n_points} points)" if n_points > len(shown) else "")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    path = out / "ttft_cdf.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def ttft_cdfs(points: list[Point], rows: list[dict], folder_of, out: Path) -> list[Path]:
    return ttft_cdf(cdf_points(points, {r["point"]: r["status"] for r in rows}) or [], len(points),
                    folder_of, out)


def variant_bars(points: list[Point], rows: list[dict], metrics: list[str], out: Path) -> list[Path]:
    variants = list(dict.fromkeys(p.variant for p in points if p.variant))
    if len(variants) < 2:
        return []
    plt = _plt()
    by_name = {r["point"]: r for r in rows}
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.8), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        ys = [_mean([by_name[p.name].get(m) for p in points if p.variant == v]) for v in variants]
        ax.bar(range(len(variants)), [0 if y is None else y for y in ys])
        ax.set_xticks(range(len(variants)), variants, rotation=30, ha="right")
        ax.set_ylabel(m)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = out / "variants.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def write_study_plots(points: list[Point], rows: list[dict], folder_of, metrics: list[str],
                      out: Path, cdf: bool = True) -> list[Path]:
    """The study's plots; ``cdf=False``: all but ``ttft_cdf.png`` (drawn already)."""
    out.mkdir(parents=True, exist_ok=True)
    return [*axis_plots(points, rows, metrics, out),
            *(ttft_cdfs(points, rows, folder_of, out) if cdf else []),
            *variant_bars(points, rows, metrics, out)]
