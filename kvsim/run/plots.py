"""PNG plots of a replay: tier occupancy and link traffic over time, TTFT distribution."""

from __future__ import annotations

from pathlib import Path


def write_plots(result, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    name = getattr(getattr(result, "cfg", None), "name", "run")
    tl = result.timeline
    ranks = sorted({r["rank"] for r in tl}) if tl and "rank" in tl[0] else [None]
    if len(tl) >= 2:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        tiers = [k for k in tl[0] if k.endswith("_used_slots")]
        colours = {k: f"C{i}" for i, k in enumerate(tiers)}
        node: dict[float, dict[str, float]] = {}  # the node's traffic: ranks' rates by interval
        step = getattr(getattr(getattr(result, "cfg", None), "output", None), "timeline_interval", 1.0)
        for rank in ranks:
            rows = [r for r in tl if r.get("rank") == rank] if rank is not None else tl
            t = [r["t_s"] for r in rows]
            for key in tiers:
                tier = key.removesuffix("_used_slots")
                ax1.plot(t, [r.get(key, 0) for r in rows], color=colours[key],
                         alpha=1.0 if rank is None else 0.6, linewidth=1.0 if rank is None else 0.8,
                         label=tier if rank in (None, ranks[0]) else None)
            # the cumulative bytes every backend reports (Backend.stats), per route
            for key in ("host_to_gpu", "gpu_to_host", "disk_read", "disk_write"):
                if key in rows[0]:
                    vals = [r.get(key, 0) for r in rows]
                    for a, b, t0, t1 in zip(vals, vals[1:], t, t[1:]):
                        slot = node.setdefault(round(t1 / step) * step, {})
                        slot[key] = slot.get(key, 0.0) + (b - a) / max(1e-9, t1 - t0) / 1e9
        times = sorted(node)
        for key in ("host_to_gpu", "gpu_to_host", "disk_read", "disk_write"):
            if any(key in node[x] for x in times):
                ax2.plot(times, [node[x].get(key, 0.0) for x in times], label=key.replace("_", " "))
        who = "" if ranks == [None] else f" ({len(ranks)} ranks: a line a rank; traffic the node's)"
        ax1.set_title(f"{name}: tier occupancy and link traffic over time{who}", fontsize="medium")
        ax1.set_ylabel("slots used (pages)")
        ax1.legend(loc="upper left")
        ax2.set_ylabel("traffic (GB/s)")
        ax2.set_xlabel("simulated time (s)")
        if ax2.lines:
            ax2.legend(loc="upper left")
        fig.tight_layout()
        p = out / "timeline.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    ttft = sorted(r.ttft_s for r in result.rows if r.done_ns >= 0 and not r.failed)
    if ttft:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))])
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s, log scale)")
        ax.set_ylabel("completed requests (cumulative fraction)")
        ax.set_title(f"{name}: TTFT CDF ({len(ttft)} requests)", fontsize="medium")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        p = out / "ttft_cdf.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    return written
