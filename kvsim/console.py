"""What the command line shows: the summary table, errors, progress (a bar on a terminal,
log lines elsewhere), interruptions, and the kill tests' pause points."""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import typer
from rich.console import Console
from rich.table import Table

LOG_EVERY_S = 10.0  # progress lines off a terminal: at most this far apart (wall seconds)


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summary_table(metrics: dict, title: str, policy: str | None = None) -> Table:
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    m = metrics
    if policy is not None:
        t.add_row("policy", policy)
    t.add_row("requests completed", fmt(m["requests_completed"]))
    t.add_row("requests failed", fmt(m["requests_failed"]))
    t.add_row("input tokens", fmt(m["input_tokens"]))
    h = m["hit_tokens"]
    tiers = ("gpu", "host", "disk", "remote") if "remote" in h else ("gpu", "host", "disk")
    t.add_row(f"hit tokens {' / '.join(tiers)}", " / ".join(str(h[k]) for k in tiers))
    t.add_row("hit ratio", fmt(m["hit_ratio"]))
    t.add_row("computed tokens", fmt(m["computed_tokens"]))
    for key, label in (("ttft_s", "TTFT s"), ("tpot_s", "TPOT s"), ("e2e_s", "E2E s")):
        d = m[key]
        t.add_row(f"{label} mean / p50 / p90 / p99",
                  " / ".join(fmt(d[k]) for k in ("mean", "p50", "p90", "p99")))
    t.add_row("requests/s", fmt(m["throughput"]["requests_per_s"]))
    t.add_row("output tokens/s", fmt(m["throughput"]["output_tokens_per_s"]))
    b = m["bytes"]
    t.add_row("GB host->gpu / gpu->host", f"{b['host_to_gpu'] / 1e9:.3f} / {b['gpu_to_host'] / 1e9:.3f}")
    t.add_row("GB disk read / write", f"{b['disk_read'] / 1e9:.3f} / {b['disk_write'] / 1e9:.3f}")
    t.add_row("evicted pages", ", ".join(f"{k} {v}" for k, v in m["evicted_pages"].items()))
    t.add_row("dropped pages", ", ".join(f"{k} {v}" for k, v in m["dropped_pages"].items()))
    bal = m.get("balance") or {}
    if bal:  # seed 004's balancing statistics: at the end, and the run's mean
        t.add_row("evictable pages at end (mean)", ", ".join(
            f"{k} {v['evictable_pages']} ({v['evictable_pages_mean']:.0f})" for k, v in bal.items()))
        d = bal.get("disk", {})
        if "retained_pages" in d:
            t.add_row("disk retained copies at end (mean)",
                      f"{d['retained_pages']} ({d['retained_pages_mean']:.0f}) pages, "
                      f"{d['retained_bytes'] / 1e9:.3f} GB")
            t.add_row("protected share in use at end (mean)",
                      f"{d['protected_in_use']:.1%} ({d['protected_in_use_mean']:.1%}) "
                      f"of {d['protected_pages']} pages")
    t.add_row("simulated time s", fmt(m["sim_time_s"]))
    t.add_row("wall time s", fmt(m["wall_time_s"]))
    return t


def policy_label(run_info: dict) -> str | None:
    """The eviction policy as the summary table shows it (an offline one says so), and the
    placement policy unless it is the default."""
    name = run_info.get("policy")
    if name is None:
        return None
    if run_info.get("policy_is_bound"):
        name = f"{name} (offline: reads the future)"
    tiers = run_info.get("tier_eviction") or {}
    if tiers:
        name += "".join(f", {level} {pol}" for level, pol in tiers.items())
    placement = run_info.get("placement", "cascade")
    return name if placement == "cascade" else f"{name}, placement {placement}"


def named(ctx: typer.Context, param: typer.CallbackParam, value):
    """A path option's check (``--out``, ``--trace``, ``--hw-from``, ...): an empty value
    (``--out "$DIR"`` with DIR unset) is refused, exit 2, not taken for the option left out
    (the default folder, whose earlier results would be replaced; the config's trace; a
    replay on the GPU instead of ``--hw-from``'s saved one)."""
    if value == "":
        raise typer.BadParameter(f"an empty value (an unset variable?); leave {param.opts[0]} out "
                                 "for its default")
    return value


def error(console: Console, msg: str) -> None:
    """An error exactly as written (no markup, no wrapping: paths and lines stay greppable)."""
    console.print("error:", style="red", end=" ")
    console.print(msg, markup=False, highlight=False, soft_wrap=True)


def interrupted(console: Console, e: KeyboardInterrupt, kept: str = "nothing was written") -> typer.Exit:
    """SIGINT or SIGTERM: what the command made is cleaned up by now (context managers);
    say what is ``kept`` and exit 130 (SIGINT) or 128 + the signal."""
    signum = getattr(e, "signum", 2)
    error(console, f"interrupted ({'SIGINT' if signum == 2 else getattr(e, 'args', ['signal'])[0]}); {kept}")
    return typer.Exit(128 + signum)


def pause_at(phase: str) -> None:
    """Fault injection for the kill tests: with ``KVSIM_PAUSE_AT=PHASE`` (load: before the
    trace loads; replay: at the replay's first step; write: results written, not yet in
    place) the run says so on stderr and waits up to 60 s, so a test can signal it there."""
    if os.environ.get("KVSIM_PAUSE_AT") == phase:
        print(f"kvsim: paused at {phase}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)


def paused(report: Callable | None) -> Callable:
    """The progress callback, with ``pause_at("replay")`` on its first call."""
    first = [True]

    def call(t: float, n: float) -> None:
        if first[0]:
            first[0] = False
            pause_at("replay")
        if report is not None:
            report(t, n)

    return call


@contextmanager
def progress_reporter(console: Console, total: int | None, on: bool) -> Iterator[Callable | None]:
    """A replay's progress: a bar on a terminal; elsewhere (a log, a pipe) a line at most
    every ``LOG_EVERY_S`` of wall time with requests done and simulated time, so that a
    long hw replay never sits silent. ``--no-progress``: neither."""
    if not on:
        yield None
        return
    if console.is_terminal:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]replay"), BarColumn(), TextColumn("{task.completed:.0f} requests"),
                      TextColumn("sim {task.fields[t]:.1f}s"), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("replay", total=total, t=0.0)
            yield lambda t, n: bar.update(task, completed=n, t=t)
        return
    t0 = time.monotonic()
    last = [t0]

    def log(t: float, n: float) -> None:
        now = time.monotonic()
        if now - last[0] >= LOG_EVERY_S:
            last[0] = now
            of = f"/{total}" if total else ""
            print(f"replay: {n:.0f}{of} requests, simulated {t:.1f} s, wall {now - t0:.0f} s",
                  file=sys.stderr, flush=True)

    yield log
