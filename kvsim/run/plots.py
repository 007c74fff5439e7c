"""PNG plots of a replay: tier occupancy and link traffic over time, TTFT distribution."""

from __future__ import annotations

from pathlib import Path


def save_png(fig, path: Path, dpi: int) -> None:
    """``fig`` as a PNG at ``path``, written whole (kvsim.run.outputs.write_whole): a kill
    or a full disk while it is written leaves the earlier file, never a cut one. (A run's
    plots go into its staging folder; a study's and a tune's into the folder itself.)"""
    import io

    from kvsim.run.outputs import write_whole

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_whole(path, buf.getvalue())


def write_plots(result, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    name = getattr(getattr(result, "cfg", None), "name", "run")
    tl = result.timeline
    who_key = "instance" if tl and "instance" in tl[0] else "rank"  # (a cluster: by instance)
    ranks = sorted({r[who_key] for r in tl}) if tl and who_key in tl[0] else [None]
    if len(tl) >= 2:
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        tiers = [k for k in tl[0] if k.endswith("_used_slots")]
        colours = {k: f"C{i}" for i, k in enumerate(tiers)}
        node: dict[float, dict[str, float]] = {}  # the node's traffic: ranks' rates by interval
        step = getattr(getattr(getattr(result, "cfg", None), "output", None), "timeline_interval", 1.0)
        for rank in ranks:
            rows = [r for r in tl if r.get(who_key) == rank] if rank is not None else tl
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
        who = "" if ranks == [None] else \
            f" ({len(ranks)} {who_key}s: a line each; traffic the {'cluster' if who_key == 'instance' else 'node'}'s)"
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
    if getattr(result, "run_info", {}).get("cluster"):
        written.append(_cluster_load(result, out, name, plt))
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


def _cluster_load(result, out: Path, name: str, plt) -> Path:
    """cluster_load.png: each instance's queued prefill tokens over time (the samples the
    summary's load imbalance is computed from)."""
    from kvsim.run.clustermetrics import queue_samples  # noqa: PLC0415

    n = result.run_info["instances"]
    step = result.cfg.output.timeline_interval
    end = max((max(r.done_ns, r.first_token_ns, r.arrival_ns) for r in result.rows), default=0)
    samples = queue_samples(result.rows, n, max(1, round(step * 1e9)), end)
    t = [i * step for i in range(len(samples))]
    fig, ax = plt.subplots(figsize=(9, 4))
    for i in range(n):
        ax.plot(t, [q[i] for q in samples], linewidth=0.7, alpha=0.7)
    ax.set_title(f"{name}: queued prefill tokens by instance ({n} instances, a line each)",
                 fontsize="medium")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("queued prefill tokens")
    fig.tight_layout()
    p = out / "cluster_load.png"
    fig.savefig(p, dpi=100)
    plt.close(fig)
    return p
