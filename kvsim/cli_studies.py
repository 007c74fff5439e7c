"""The ``kvsim study`` and ``kvsim tune`` commands (``register_studies`` adds them to the
CLI's app): plan first (the file, its points, the folder, the scheduler and storage
checked; nothing written), then run on Dask, and a command that continues an
interrupted one."""

from __future__ import annotations

from typing import Callable, List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvsim.console import error, fmt, interrupted, named
from kvsim.scratch import raise_pending, terminate_raises

FORCE_HELP = ("write into a folder kvsim did not write, beside the files there (never replacing "
              "one of them)")


def _plan_and_run(console: Console, kind: str, plan: Callable, run: Callable, kept: Callable):
    """A study's or tune's two steps: ``plan`` (the file, its points, the folder, the
    scheduler and storage checked; nothing written: a problem is exit 2), then ``run``
    (the folder claimed, the work on Dask: a cluster or storage it cannot reach, exit 1;
    SIGINT/SIGTERM: exit 130/143, saying ``kept(planned)``). Returns (plan's answer,
    report)."""
    from kvsim.run.outputs import OutputError
    from kvsim.study.definition import StudyFileError

    try:
        planned = plan()
    except (ValueError, OSError) as e:  # ConfigFileError, OutputError, the study file's errors
        error(console, str(e))
        raise typer.Exit(2)
    try:
        with terminate_raises():
            try:
                return planned, run(planned)
            except Exception:
                raise_pending()   # a signal that came out of C code it cut short as another error
                raise
    except OutputError as e:  # the folder changed since it was checked
        error(console, str(e))
        raise typer.Exit(2)
    except StudyFileError as e:  # what the file names, found wrong once runs came back
        error(console, str(e))
        raise typer.Exit(2)
    except (ConnectionError, TimeoutError, OSError) as e:
        error(console, f"{kind} {planned[0].name}: {type(e).__name__}: {e}")
        raise typer.Exit(1)
    except KeyboardInterrupt as e:
        raise interrupted(console, e, kept(planned))


def _again(kind: str, file: str, folder, set_: List[str], storage: Optional[str] = None) -> str:
    """The command that continues this study or tune, as a shell reads it (its folder,
    its --set and storage: the same config hash)."""
    import shlex

    words = ["kvsim", kind, file, "--out", str(folder)]
    for ov in set_:
        words += ["--set", ov]
    if storage:
        words += ["--storage", storage]
    return " ".join(shlex.quote(w) for w in words)


def _check_cluster(scheduler: Optional[str], workers: Optional[int]) -> None:
    if scheduler is not None:
        from kvsim.study.daskclient import check_scheduler

        if workers is not None:  # (the cluster's workers are its own: the count would be dropped)
            raise ValueError(f"--workers {workers}: not with --scheduler (the cluster at {scheduler} "
                             "has its own workers)")
        check_scheduler(scheduler)


def _wide() -> Console:
    return Console() if Console().is_terminal else Console(width=200)


def study(
    study_file: str = typer.Argument(..., metavar="STUDY.yaml", help="the study file"),
    set_: List[str] = typer.Option([], "--set", help="override a key of the base config: key.path=value"),
    workers: Optional[int] = typer.Option(None, min=1, help="local worker processes (default: the cores)"),
    scheduler: Optional[str] = typer.Option(None, callback=named, help="run on this Dask cluster (tcp://HOST:PORT)"),
    out: Optional[str] = typer.Option(None, callback=named, help="study folder (default: the study's out, or "
                                                   "results/study-NAME)"),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    progress: bool = typer.Option(True, help="show a progress bar"),
    plots: bool = typer.Option(True, help="draw the study's plots"),
):
    """Run a what-if study: every point of a grid / zip / variants / seeds / traces over a
    base config, on Dask; one run folder per point, a table (CSV, Parquet), plots and
    report.html (a page to open).
    Points already complete (same resolved config) are skipped."""
    from kvsim.study.study import plan_study, run_study, study_target
    from kvsim.study.table import rich_table

    console = Console(stderr=True)

    def plan():
        _check_cluster(scheduler, workers)
        spec, points = plan_study(study_file, set_)
        return spec, points, study_target(spec, points, out, force)

    (spec, _, _), rep = _plan_and_run(
        console, "study", plan,
        lambda planned: run_study(study_file, set_, workers=workers, scheduler=scheduler,
                                  progress=progress, plots=plots, planned=planned),
        lambda planned: (f"the points finished so far are kept; to continue: "
                         f"{_again('study', study_file, planned[2].path, set_)}"))
    params = list(dict.fromkeys(["variant"] * any(p.variant for p in rep.points)
                                + [k for p in rep.points for k in p.params]))
    _wide().print(rich_table(rep.rows, f"study {spec.name}: {len(rep.points)} points "
                                 f"({rep.outcome.ran} run, {rep.outcome.skipped} already done, "
                                 f"{len(rep.outcome.failures)} failed)", params, list(spec.metrics),
                                 rel=spec.baseline is not None))
    Console().print(f"table: {rep.table_paths[0]}  plots: {rep.folder / 'plots'}", markup=False, soft_wrap=True)
    if rep.report:
        Console().print(f"report: {rep.report}", markup=False, soft_wrap=True)
    if rep.outcome.failures:
        for name, err in rep.outcome.failures.items():
            error(console, f"point {name}: {err}")
        raise typer.Exit(1)


def tune(
    tune_file: str = typer.Argument(..., metavar="TUNE.yaml", help="the tune file"),
    set_: List[str] = typer.Option([], "--set", help="override a key of the base config: key.path=value"),
    workers: Optional[int] = typer.Option(None, min=1, help="local worker processes (default: the cores)"),
    scheduler: Optional[str] = typer.Option(None, callback=named, help="run on this Dask cluster (tcp://HOST:PORT)"),
    out: Optional[str] = typer.Option(None, callback=named,
                                      help="tune folder (default: the file's out, or results/tune-NAME)"),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    storage: Optional[str] = typer.Option(None, callback=named,
                                          help="Optuna storage URL (default: SQLite in the folder)"),
    trials: Optional[int] = typer.Option(None, min=1, help="trial budget (default: the file's trials)"),
    progress: bool = typer.Option(True, help="show a progress bar"),
):
    """Search config keys with Optuna (trials on Dask, on the train sessions), then replay
    the best configs on held-out sessions; writes best.yaml, the top trials, plots and
    report.html.
    Runs again continue the same study up to the trial budget."""
    from kvsim.study.tune import plan_tune, run_tune, tune_target

    console = Console(stderr=True)

    def plan():
        _check_cluster(scheduler, workers)
        spec, base = plan_tune(tune_file, set_)
        return spec, base, tune_target(spec, base, out, force, storage)

    (spec, _, _), rep = _plan_and_run(
        console, "tune", plan,
        lambda planned: run_tune(tune_file, set_, workers=workers, scheduler=scheduler,
                                 storage=storage, trials=trials, progress=progress, planned=planned),
        lambda planned: (f"the finished trials are kept; to continue: "
                         f"{_again('tune', tune_file, planned[2].path, set_, storage)}"))
    interrupted_ = f", {rep.n_interrupted} interrupted" if rep.n_interrupted else ""
    t = Table(title=f"tune {spec.name}: {rep.n_complete} trials complete, {rep.n_failed} failed"
                    f"{interrupted_} ({rep.n_run} run now); objective: {spec.objective.sense} "
                    + " + ".join(f"{w:g} x {m}" for m, w in spec.objective.weights.items()))
    cols = list(dict.fromkeys(k for r in rep.top for k in r))
    for c in cols:
        t.add_column(c, justify="right")
    for r in rep.top:
        t.add_row(*[fmt(r.get(c)) for c in cols])
    _wide().print(t)
    for problem in rep.problems:
        error(console, problem)
    if rep.report:
        Console().print(f"report: {rep.report}", markup=False, soft_wrap=True)
    if rep.best_yaml:
        Console().print(f"best config: {rep.best_yaml}  (kvsim run {rep.best_yaml})", markup=False,
                        soft_wrap=True)
    else:
        error(console, "no trial completed within the constraints")
        raise typer.Exit(1)


def register_studies(app: typer.Typer) -> None:
    """Add ``study`` and ``tune`` to ``app``."""
    app.command()(study)
    app.command()(tune)
