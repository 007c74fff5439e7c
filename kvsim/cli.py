"""The command line: ``kvsim run CONFIG [--backend sim|hw] [--trace PATH] [--set k=v] [--out DIR]``."""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvsim.scratch import terminate_raises

LOG_EVERY_S = 10.0  # progress lines off a terminal: at most this far apart (wall seconds)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kvsim: replay LLM request traces through a tiered KV cache.")


def _fmt(v) -> str:
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
    t.add_row("requests completed", _fmt(m["requests_completed"]))
    t.add_row("requests failed", _fmt(m["requests_failed"]))
    t.add_row("input tokens", _fmt(m["input_tokens"]))
    h = m["hit_tokens"]
    t.add_row("hit tokens gpu / host / disk", f"{h['gpu']} / {h['host']} / {h['disk']}")
    t.add_row("hit ratio", _fmt(m["hit_ratio"]))
    t.add_row("computed tokens", _fmt(m["computed_tokens"]))
    for key, label in (("ttft_s", "TTFT s"), ("tpot_s", "TPOT s"), ("e2e_s", "E2E s")):
        d = m[key]
        t.add_row(f"{label} mean / p50 / p90 / p99",
                  " / ".join(_fmt(d[k]) for k in ("mean", "p50", "p90", "p99")))
    t.add_row("requests/s", _fmt(m["throughput"]["requests_per_s"]))
    t.add_row("output tokens/s", _fmt(m["throughput"]["output_tokens_per_s"]))
    b = m["bytes"]
    t.add_row("GB host->gpu / gpu->host", f"{b['host_to_gpu'] / 1e9:.3f} / {b['gpu_to_host'] / 1e9:.3f}")
    t.add_row("GB disk read / write", f"{b['disk_read'] / 1e9:.3f} / {b['disk_write'] / 1e9:.3f}")
    t.add_row("evicted pages", ", ".join(f"{k} {v}" for k, v in m["evicted_pages"].items()))
    t.add_row("dropped pages", ", ".join(f"{k} {v}" for k, v in m["dropped_pages"].items()))
    t.add_row("simulated time s", _fmt(m["sim_time_s"]))
    t.add_row("wall time s", _fmt(m["wall_time_s"]))
    return t


def _policy_label(run_info: dict) -> str | None:
    """The eviction policy as the summary table shows it (a bound says so)."""
    name = run_info.get("policy")
    if name is None:
        return None
    return f"{name} (offline bound)" if run_info.get("policy_is_bound") else name


def _error(console: Console, msg: str) -> None:
    """An error exactly as written (no markup, no wrapping: paths and lines stay greppable)."""
    console.print("error:", style="red", end=" ")
    console.print(msg, markup=False, highlight=False, soft_wrap=True)


def _interrupted(console: Console, e: KeyboardInterrupt) -> typer.Exit:
    """SIGINT or SIGTERM: everything the run made is removed by now (context managers);
    say so and exit 130 (SIGINT) or 128 + the signal."""
    signum = getattr(e, "signum", 2)
    _error(console, f"interrupted ({'SIGINT' if signum == 2 else getattr(e, 'args', ['signal'])[0]}); "
                    f"nothing was written")
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


def _paused(report: Callable | None) -> Callable:
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
def _progress(console: Console, total: int | None, on: bool) -> Iterator[Callable | None]:
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


@app.command()
def run(
    config: str = typer.Argument("default", help="config YAML (or a name under configs/)"),
    backend: str = typer.Option("sim", help="sim (SimPy model) or hw (real GPU; CPU mode without one)"),
    trace: Optional[str] = typer.Option(None, help="trace file or directory (overrides workload.path)"),
    set_: List[str] = typer.Option([], "--set", help="override a config key: key.path=value"),
    out: Optional[str] = typer.Option(None, help="results folder (default: output.dir)"),
    progress: bool = typer.Option(True, help="show a progress bar"),
    time_scale: float = typer.Option(1.0, "--time-scale", help="hw backend: sim seconds per wall second"),
    device: str = typer.Option("auto", help="hw backend: auto, cpu or gpu"),
    compute_graphs: bool = typer.Option(True, "--compute-graphs/--no-compute-graphs",
                                        help="hw backend: launch each step's compute as CUDA graphs "
                                             "(off: kernel by kernel)"),
):
    """Replay a trace through the tier manager and write a results folder."""
    from kvsim.backend import CapacityError
    from kvsim.config import ConfigFileError, load_config
    from kvsim.engine.plans import RefcheckError
    from kvsim.results import Staging
    from kvsim.run import BACKENDS, output_dir, prepare_run, replay, write_files
    from kvsim.workload import TraceError

    console = Console(stderr=True)
    with terminate_raises():
        try:
            if backend not in BACKENDS:
                raise ConfigFileError(f"--backend: got {backend!r}; expected one of {', '.join(BACKENDS)}")
            cfg = load_config(config, set_)
            # the destination first: a path that cannot take the results fails now, not
            # after minutes of loading and replay
            stage = Staging.reserve(output_dir(cfg, out), what="--out" if out else "output.dir")
        except (ConfigFileError, ValueError, OSError) as e:
            _error(console, str(e))
            raise typer.Exit(2)
        except KeyboardInterrupt as e:
            raise _interrupted(console, e)
        with stage:
            try:
                pause_at("load")
                prep = prepare_run(cfg, trace)
            except (ConfigFileError, TraceError, ValueError, OSError) as e:
                _error(console, str(e))
                raise typer.Exit(2)
            except KeyboardInterrupt as e:
                raise _interrupted(console, e)
            opts = {"time_scale": time_scale, "device": device, "compute_graphs": compute_graphs} \
                if backend == "hw" else {}
            try:
                with _progress(console, prep.workload.request_count(), progress) as report:
                    result = replay(prep, backend, backend_options=opts, progress=_paused(report))
            except (MemoryError, CapacityError) as e:
                _error(console, f"{backend} backend: {e or 'out of memory'}")
                raise typer.Exit(2)
            except ConfigFileError as e:  # a setting this backend cannot run (belady on hw)
                _error(console, str(e))
                raise typer.Exit(2)
            except (ValueError, OSError, RuntimeError, RefcheckError) as e:
                # a backend that cannot start (no GPU, a bad disk folder, a full disk...) or a
                # refcheck failure: say what, write nothing
                _error(console, f"replay on the {backend} backend failed: {type(e).__name__}: {e}")
                raise typer.Exit(1)
            except KeyboardInterrupt as e:
                raise _interrupted(console, e)
            try:
                write_files(result, stage.path, plots=cfg.output.plots)
                pause_at("write")
                path = stage.commit()
            except (OSError, ValueError) as e:
                _error(console, f"writing results to {stage.dest}: {e}")
                raise typer.Exit(1)
            except KeyboardInterrupt as e:
                raise _interrupted(console, e)
    Console().print(summary_table(result.metrics, f"kvsim {cfg.name} ({backend})",
                                  _policy_label(result.run_info)))
    Console().print(f"results: {path}")


@app.command()
def calibrate(
    out: Optional[str] = typer.Option(None, help="profile to write, e.g. configs/hardware/NAME.yaml "
                                      "(with --check: the check's JSON, optional)"),
    base: str = typer.Option("h200-pcie", help="base profile for what cannot be measured"),
    device: str = typer.Option("auto", help="auto, cpu or gpu"),
    from_report: Optional[str] = typer.Option(
        None, "--from-report", help="refit offline from a saved NAME.yaml.report.json (no benchmarks)"),
    check: Optional[str] = typer.Option(
        None, "--check", help="replay cells measured elsewhere (benchmarks/hw_copy.py --json) on the "
                              "sim with --profile"),
    profile: Optional[str] = typer.Option(None, "--profile", help="with --check: the profile to replay them with"),
):
    """Microbenchmark this machine and fit a hardware profile (plus OUT.report.json)."""
    from kvsim.calibrate import calibrate as run_calibration, check_against, refit

    console = Console(stderr=True)
    if check and not profile:
        _error(console, "--check: needs --profile")
        raise typer.Exit(2)
    if not check and not out:
        _error(console, "--out: give the profile to write")
        raise typer.Exit(2)
    try:
        if check:
            report = check_against(check, profile)
            if out:
                Path(out).write_text(json.dumps(report, indent=2) + "\n")
        elif from_report:
            report = refit(from_report, out, base=None if base == "h200-pcie" else base)
        else:
            report = run_calibration(out, base=base, device=device)
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        _error(console, f"{type(e).__name__}: {e}" if isinstance(e, KeyError) else str(e))
        raise typer.Exit(2)
    t = Table(title=f"calibrate ({report.get('device', 'sim')}): fit check, sim vs measured")
    for c in ("page", "path", "dir", "pages", "hw GB/s", "sim GB/s", "rel err"):
        t.add_column(c, justify="right")
    for r in report["fit_check"]:
        t.add_row(f"{r['page'] // 1024} KiB", r["path"], r["dir"], str(r["pages"]), f"{r['hw_GBps']:.2f}",
                  f"{r['sim_GBps']:.2f}", f"{r['rel_err'] * 100:+.1f}%")
    Console().print(t)
    worst = report.get("fit_max_abs_err")
    Console().print(f"max |rel err| {worst * 100:.1f}%" if worst is not None else "no cells")
    if not check:
        Console().print(f"profile: {out} ({report.get('seconds', 0.0):.1f} s)")


@app.command()
def compare(
    config: str = typer.Argument("default", help="config YAML (or a name under configs/)"),
    trace: Optional[str] = typer.Option(None, help="trace file or directory (overrides workload.path)"),
    set_: List[str] = typer.Option([], "--set", help="override a config key: key.path=value"),
    out: Optional[str] = typer.Option(None, help="folder for compare.json (default: output.dir + '-compare')"),
    time_scale: float = typer.Option(1.0, "--time-scale", help="hw backend: sim seconds per wall second"),
    device: str = typer.Option("auto", help="hw backend: auto, cpu or gpu"),
    compute_graphs: bool = typer.Option(True, "--compute-graphs/--no-compute-graphs",
                                        help="hw backend: launch each step's compute as CUDA graphs "
                                             "(off: kernel by kernel)"),
    hw_from: Optional[str] = typer.Option(None, "--hw-from", help="an earlier compare's folder: "
                                          "replay the sim only and compare with its hw side"),
    saved_profile: bool = typer.Option(False, "--saved-profile", help="with --hw-from: the sim uses "
                                       "the hardware profile that hw run recorded, not the config's"),
    pin_arrivals: bool = typer.Option(False, "--pin-arrivals", help="with --hw-from: the sim releases "
                                      "each turn when hw did (closed-loop sessions do not drift apart)"),
    calibrate_first: bool = typer.Option(False, "--calibrate", help="run `kvsim calibrate` on this "
                                         "machine first, into OUT/hardware.yaml, and compare with that "
                                         "profile on both sides"),
    hw_loop: Optional[str] = typer.Option(None, "--hw-loop", help="the sim side's model of the hw "
                                          "backend's own host costs: a YAML or a name under "
                                          "configs/hwloop/, or none (default: h200; with "
                                          "--saved-profile, the one that run's compare used)"),
):
    """Replay one config and trace on the sim and the hw backends; report both side by side."""
    from kvsim.compare import compare as run_compare, compare_saved
    from kvsim.reports import report_tables, write_report
    from kvsim.config import ConfigFileError, load_config
    from kvsim.hwloop import load_hw_loop
    from kvsim.results import Staging
    from kvsim.run import prepare_run, write_files
    from kvsim.workload import TraceError

    console = Console(stderr=True)
    for flag, on in (("--saved-profile", saved_profile), ("--pin-arrivals", pin_arrivals)):
        if on and not hw_from:
            _error(console, f"{flag}: only with --hw-from")
            raise typer.Exit(2)
    if calibrate_first and hw_from:
        _error(console, "--calibrate: not with --hw-from (the hw side is already measured)")
        raise typer.Exit(2)
    try:
        cfg = load_config(config, set_)
        loop = load_hw_loop(hw_loop) if hw_loop else None
    except (ConfigFileError, ValueError, OSError) as e:
        _error(console, str(e))
        raise typer.Exit(2)
    dest = Path(out or (cfg.output.dir.format(name=cfg.name) + "-compare"))
    if hw_from and dest.resolve() == Path(hw_from).resolve():
        _error(console, f"--out {dest}: is the --hw-from folder; write the new report elsewhere")
        raise typer.Exit(2)
    with terminate_raises():
        try:  # before minutes of replay, not after
            stage = Staging.reserve(dest, kind="compare")
        except ValueError as e:
            _error(console, str(e))
            raise typer.Exit(2)
        with stage:
            try:
                if hw_from:
                    report, sim_res = compare_saved(cfg, hw_from, trace, saved_profile=saved_profile,
                                                    pin_arrivals=pin_arrivals, hw_loop=loop)
                    results = (("sim", sim_res),)
                else:
                    if calibrate_first:
                        from kvsim.calibrate import calibrate as run_calibration

                        prepare_run(cfg, trace)  # bad config or trace: fail before measuring
                        prof = stage.path / "hardware.yaml"
                        cal = run_calibration(prof, base=cfg.hardware, device=device)
                        console.print(f"calibrated: {dest / prof.name} ({cal['seconds']:.1f} s; the "
                                      f"fit check in {prof.name}.report.json)")
                        cfg = load_config(config, [*set_, f"hardware={prof}"])
                    report, sim_res, hw_res = run_compare(cfg, trace, {
                        "time_scale": time_scale, "device": device, "compute_graphs": compute_graphs},
                        hw_loop=loop)
                    results = (("sim", sim_res), ("hw", hw_res))
                    if calibrate_first:  # the profile's path once the folder is in place
                        final = {"hardware": str(dest / "hardware.yaml")}
                        for _, res in results:
                            res.cfg = res.cfg.model_copy(update=final)
            except (ConfigFileError, TraceError, ValueError, OSError, RuntimeError) as e:
                _error(console, str(e))
                raise typer.Exit(2)
            except KeyboardInterrupt as e:
                raise _interrupted(console, e)
            write_report(report, stage.path)
            for name, res in results:  # each replay's own results folder
                write_files(res, stage.path / name, plots=False)
            path = stage.commit() / "compare.json"
    for t in report_tables(report):
        Console().print(t)
    Console().print(f"report: {path}")


def _check_report_path(dest: Path) -> None:
    """``kvsim diff --out`` replaces only an earlier diff report, never another file."""
    if dest.is_dir() or (dest.exists() and not dest.is_file()):
        raise ValueError(f"--out {dest}: is a folder; expected a JSON file name")
    if dest.exists():
        try:
            ok = json.loads(dest.read_text()).get("kvsim_report") == "diff"
        except (OSError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(f"--out {dest}: exists and is not a kvsim diff report; kvsim replaces "
                             f"only files it wrote: choose another --out")


@app.command()
def diff(
    a: str = typer.Argument(..., help="a results folder (kvsim run --out, or a compare's sim/ or hw/)"),
    b: str = typer.Argument(..., help="the reference results folder"),
    out: Optional[str] = typer.Option(None, help="also write the report here (JSON)"),
):
    """Two finished replays side by side (e.g. two hw runs, or two policies): headline
    metrics with (a - b) / b, and how many turns found the same hits by tier."""
    from kvsim.compare import diff_runs
    from kvsim.reports import diff_table, write_whole

    console = Console(stderr=True)
    try:
        if out:
            _check_report_path(Path(out))
        report = diff_runs(a, b)
    except ValueError as e:
        _error(console, str(e))
        raise typer.Exit(2)
    if out:
        dest = Path(out)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_whole(dest, (json.dumps({"kvsim_report": "diff", **report}, indent=2) + "\n").encode())
        except OSError as e:
            _error(console, f"--out {out}: cannot write ({e.strerror})")
            raise typer.Exit(2)
    Console().print(diff_table(report))


def _stopped(console: Console, e: KeyboardInterrupt, kept: str) -> typer.Exit:
    """A study or tune interrupted (SIGINT, SIGTERM): exit 130 or 128 + the signal."""
    signum = getattr(e, "signum", 2)
    _error(console, f"interrupted ({'SIGINT' if signum == 2 else getattr(e, 'args', ['signal'])[0]}); {kept}")
    return typer.Exit(128 + signum)


def _dask_errors() -> tuple:
    """The errors a Dask client raises for a cluster it cannot reach or start."""
    return (ConnectionError, TimeoutError, OSError)


@app.command()
def study(
    study_file: str = typer.Argument(..., metavar="STUDY.yaml", help="the study file"),
    set_: List[str] = typer.Option([], "--set", help="override a key of the base config: key.path=value"),
    workers: Optional[int] = typer.Option(None, min=1, help="local worker processes (default: the cores)"),
    scheduler: Optional[str] = typer.Option(None, help="run on this Dask cluster (tcp://HOST:PORT)"),
    out: Optional[str] = typer.Option(None, help="study folder (default: the study's out, or "
                                                   "results/study-NAME)"),
    progress: bool = typer.Option(True, help="show a progress bar"),
    plots: bool = typer.Option(True, help="draw the study's plots"),
):
    """Run a what-if study: every point of a grid / zip / variants / seeds / traces over a
    base config, on Dask; one run folder per point, a table (CSV, Parquet) and plots.
    Points already complete (same resolved config) are skipped."""
    from kvsim.config import ConfigFileError
    from kvsim.study.study import plan_study, run_study
    from kvsim.study.table import rich_table

    console = Console(stderr=True)
    try:
        spec, points = plan_study(study_file, set_)
    except (ConfigFileError, ValueError, OSError) as e:
        _error(console, str(e))
        raise typer.Exit(2)
    try:
        with terminate_raises():
            rep = run_study(study_file, set_, workers=workers, scheduler=scheduler, out=out,
                            progress=progress, plots=plots)
    except _dask_errors() as e:
        _error(console, f"study {spec.name}: {type(e).__name__}: {e}")
        raise typer.Exit(1)
    except KeyboardInterrupt as e:
        raise _stopped(console, e, f"the points finished so far are kept; run `kvsim study "
                                   f"{study_file}` again to continue")
    params = list(dict.fromkeys(["variant"] * any(p.variant for p in rep.points)
                                + [k for p in rep.points for k in p.params]))
    wide = Console() if Console().is_terminal else Console(width=200)
    wide.print(rich_table(rep.rows, f"study {spec.name}: {len(rep.points)} points "
                               f"({rep.outcome.ran} run, {rep.outcome.skipped} already done, "
                               f"{len(rep.outcome.failures)} failed)", params, list(spec.metrics),
                               rel=spec.baseline is not None))
    Console().print(f"table: {rep.table_paths[0]}  plots: {rep.folder / 'plots'}", markup=False, soft_wrap=True)
    if rep.outcome.failures:
        for name, err in rep.outcome.failures.items():
            _error(console, f"point {name}: {err}")
        raise typer.Exit(1)


@app.command()
def tune(
    tune_file: str = typer.Argument(..., metavar="TUNE.yaml", help="the tune file"),
    set_: List[str] = typer.Option([], "--set", help="override a key of the base config: key.path=value"),
    workers: Optional[int] = typer.Option(None, min=1, help="local worker processes (default: the cores)"),
    scheduler: Optional[str] = typer.Option(None, help="run on this Dask cluster (tcp://HOST:PORT)"),
    out: Optional[str] = typer.Option(None, help="tune folder (default: the file's out, or results/tune-NAME)"),
    storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: SQLite in the folder)"),
    trials: Optional[int] = typer.Option(None, min=1, help="trial budget (default: the file's trials)"),
    progress: bool = typer.Option(True, help="show a progress bar"),
):
    """Search config keys with Optuna (trials on Dask, on the train sessions), then replay
    the best configs on held-out sessions; writes best.yaml, the top trials and plots.
    Runs again continue the same study up to the trial budget."""
    from kvsim.config import ConfigFileError
    from kvsim.study.tune import plan_tune, run_tune

    console = Console(stderr=True)
    try:
        spec, _ = plan_tune(tune_file, set_)
    except (ConfigFileError, ValueError, OSError) as e:
        _error(console, str(e))
        raise typer.Exit(2)
    try:
        with terminate_raises():
            rep = run_tune(tune_file, set_, workers=workers, scheduler=scheduler, out=out,
                           storage=storage, trials=trials, progress=progress)
    except _dask_errors() as e:
        _error(console, f"tune {spec.name}: {type(e).__name__}: {e}")
        raise typer.Exit(1)
    except KeyboardInterrupt as e:
        raise _stopped(console, e, f"the finished trials are kept; run `kvsim tune {tune_file}` "
                                   f"again to continue")
    t = Table(title=f"tune {spec.name}: {rep.n_complete} trials complete, {rep.n_failed} failed "
                    f"({rep.n_run} run now); objective: {spec.objective.sense} "
                    + " + ".join(f"{w:g} x {m}" for m, w in spec.objective.weights.items()))
    cols = list(dict.fromkeys(k for r in rep.top for k in r))
    for c in cols:
        t.add_column(c, justify="right")
    for r in rep.top:
        t.add_row(*[_fmt(r.get(c)) for c in cols])
    wide = Console() if Console().is_terminal else Console(width=200)
    wide.print(t)
    for problem in rep.problems:
        _error(console, problem)
    if rep.best_yaml:
        Console().print(f"best config: {rep.best_yaml}  (kvsim run {rep.best_yaml})", markup=False,
                        soft_wrap=True)
    else:
        _error(console, "no trial completed within the constraints")
        raise typer.Exit(1)


@app.command()
def version():
    """Print the version."""
    from kvsim import __version__

    print(__version__)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
