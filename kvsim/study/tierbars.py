"""The study's hit ratio by tier: a stacked bar a point (``hit_ratio_by_tier.png``).

Drawn when the study's table has the cluster's hit ratio of at least two tiers
(``cluster.hit_ratio_by_tier.<tier>``, e.g. gpu, host, disk, remote): each point's bar
stacks its tiers' shares of the input tokens, the bars grouped by the point's other
parameters (a group per variant and cluster size, say, a bar per routing policy). A tier
a point does not have (no remote tier) counts 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from kvsim.run.plots import save_png
from kvsim.study.points import Point

PREFIX = "cluster.hit_ratio_by_tier."
COLORS = {"gpu": "#1f77b4", "host": "#ff7f0e", "disk": "#2ca02c", "remote": "#d62728"}


def tier_bars(points: list[Point], rows: list[dict], out: Path, study: str,
              pyplot: Callable[[], Any]) -> list[Path]:
    """``pyplot``: returns matplotlib's pyplot (loaded only when there is a plot to draw)."""
    tiers = list(dict.fromkeys(k[len(PREFIX):] for r in rows for k in r if k.startswith(PREFIX)))
    if len(tiers) < 2 or not points:
        return []
    plt = pyplot()
    by_name = {r["point"]: r for r in rows}
    labels = [p.name.replace("__", "\n") for p in points]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(points) + 3), 4.6))
    bottom = [0.0] * len(points)
    for t in tiers:
        vals = [float(by_name[p.name].get(PREFIX + t) or 0.0) for p in points]
        ax.bar(range(len(points)), vals, bottom=bottom, label=t, color=COLORS.get(t))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(points)), labels, rotation=90, fontsize="x-small")
    ax.set_ylabel("hit ratio (hit tokens / input tokens)")
    handles, names = ax.get_legend_handles_labels()  # warmest tier on top, as stacked
    ax.legend(handles[::-1], names[::-1], title="tier", fontsize="small", loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(f"{study + ': ' if study else ''}hit ratio by tier", fontsize="medium")
    fig.tight_layout()
    path = out / "hit_ratio_by_tier.png"
    save_png(fig, path, dpi=80)
    plt.close(fig)
    return [path]
