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
    if len(tl) >= 2:
        t = [r["t_s"] for r in tl]
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
        for key in tl[0]:
            if key.endswith("_used_slots"):
                ax1.plot(t, [r.get(key, 0) for r in tl], label=key.removesuffix("_used_slots"))
        ax1.set_ylabel("slots used (pages)")
        ax1.legend(loc="upper left")
        # the cumulative bytes every backend reports (Backend.counters), per route
        for key in ("host_to_gpu", "gpu_to_host", "disk_read", "disk_write"):
            if key in tl[0]:
                vals = [r.get(key, 0) for r in tl]
                rate = [0.0] + [(b - a) / max(1e-9, t1 - t0) / 1e9
                                for a, b, t0, t1 in zip(vals, vals[1:], t, t[1:])]
                ax2.plot(t, rate, label=key.replace("_", " "))
        ax1.set_title(f"{name}: tier occupancy and link traffic over time", fontsize="medium")
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
