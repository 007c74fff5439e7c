"""``kvsim study``: expand a study file into points, run them on Dask, tabulate and plot.

The study folder holds ``study.yaml`` (the study as run), ``points/<name>/`` (one run
folder per point), ``study.csv`` and ``study.parquet`` (one row per point), ``failures.json``
(the points that failed this time, with their errors), ``plots/`` and ``report.html`` (a
page to open: kvsim.study.html_report). Which folder a study may write into is
kvsim.run.outputs' rule: a study resumes only a folder of its own whose config hash
(``study_hash``: every point's name and resolved config) is its own.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from kvsim.run.outputs import Target, check_folder, write_whole
from kvsim.scratch import raise_pending, sweep_start

from kvsim.study.daskclient import open_client
from kvsim.study.execute import Outcome, disk_dirs, is_complete, progress_bar, run_points
from kvsim.study.points import Point, axis_keys, config_hash, expand
from kvsim.study.definition import StudyFileError, StudySpec, load_study, missing_metric


@dataclass
class StudyReport:
    spec: StudySpec
    points: list[Point]
    rows: list[dict]
    outcome: Outcome
    folder: Path
    table_paths: tuple
    plots: list
    timings: dict   # seconds: plan, cluster start, points, cluster close, table, plots, report
    report: Path | None = None   # report.html (kvsim.study.html_report)


def _preload(plots: bool) -> None:
    """Load the table's and the plots' libraries and pay their first-call costs (the
    Parquet writer's set-up, matplotlib's fonts) off the study's critical path: while
    the workers replay the first points, in this thread. (Not in a thread of its own: a
    Ctrl-C that lands inside the import system can leave its lock held, and a thread
    importing would then never end, nor the command that waits for it.) Only a head
    start: what fails here fails again, and is reported, where the table and the plots
    are drawn; but a Ctrl-C that matplotlib's renderer turned into another error is
    raised as the KeyboardInterrupt it was."""
    try:
        _warm_libraries(plots)
    except Exception:
        raise_pending()


def _warm_libraries(plots: bool) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": pa.array([1.0, None]), "s": pa.array(["a", None])}),
                   pa.BufferOutputStream())
    if plots:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure

        fig = Figure(figsize=(2, 2))
        ax = fig.subplots()
        ax.plot([1, 2], [1, 2], label="x")
        ax.set_xlabel("x")
        ax.legend()
        fig.tight_layout()
        fig.savefig(io.BytesIO(), format="png", dpi=50)


def study_folder(spec: StudySpec, out: str | None) -> Path:
    return Path(out or spec.out or f"results/study-{spec.name}")


def plan_study(path: str, overrides: list[str] | tuple[str, ...] = ()) -> tuple[StudySpec, list[Point]]:
    """The study and its points, validated; nothing written."""
    spec = load_study(path)
    return spec, expand(spec, str(path), overrides)


def study_hash(points: list[Point]) -> str:
    """The study's config hash: its points, by name and resolved config (and backend). Not
    their traces' content: a trace rewritten since (or put in place since) changes the
    points that replay it (``Point.hash``), which run again in the same folder."""
    blob = json.dumps([[p.name, config_hash(p.config, p.backend, p.split)] for p in points])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def study_target(spec: StudySpec, points: list[Point], out: str | None,
                 force: bool = False) -> Target:
    """The study folder, checked by the output rule (``--out``, else the study's ``out``,
    else results/study-NAME); nothing written."""
    what = "--out" if out else ("out" if spec.out else "the default folder")
    return check_folder(study_folder(spec, out), "study", what, study_hash(points), force)


def run_study(path: str, overrides: list[str] | tuple[str, ...] = (), *, workers: int | None = None,
              scheduler: str | None = None, out: str | None = None, progress: bool = True,
              plots: bool = True, force: bool = False,
              planned: tuple[StudySpec, list[Point], Target] | None = None) -> StudyReport:
    """Run the study (``planned``: ``plan_study`` and ``study_target``'s answers, if the
    caller has them). Its folder is claimed before the cluster starts; a study that could
    not start leaves nothing behind."""
    t0 = time.perf_counter()
    if planned is None:
        spec, points = plan_study(path, overrides)
        target = study_target(spec, points, out, force)
    else:
        spec, points, target = planned
    target.claim()
    try:
        sweep_start(*disk_dirs(p.config for p in points))
        rep = _run(path, spec, points, target, t0, workers, scheduler, progress, plots)
        t1 = time.perf_counter()
        from kvsim.study.html_report import resolved_base, write_study_report

        rep.report = write_study_report(rep.folder, path, spec, points, rep.rows, rep.plots,
                                        resolved_base(spec, path, overrides), overrides,
                                        rep.outcome.ran, rep.outcome.skipped)
        rep.timings["report"] = time.perf_counter() - t1
        return rep
    except BaseException:
        target.abandon_if_unused()
        raise
    finally:
        target.finish()


def _summaries(points: list[Point], folder_of, status: dict[str, str]) -> list[dict]:
    """The ``metrics`` of the points that ran to the end (their saved summaries)."""
    out = []
    for p in points:
        if status.get(p.name) == "ok":
            try:
                out.append(json.loads((folder_of(p) / "summary.json").read_text())["metrics"])
            except (OSError, ValueError, KeyError):
                pass
    return out


def _run(path: str, spec: StudySpec, points: list[Point], target: Target, t0: float,
         workers: int | None, scheduler: str | None, progress: bool, plots: bool) -> StudyReport:
    from kvsim.study.table import build_rows, write_table

    folder = target.path
    pdir, plots_dir = folder / "points", folder / "plots"

    def folder_of(p: Point) -> Path:
        return pdir / p.name

    status = {p.name: "ok" for p in points if is_complete(folder_of(p), p.hash)}
    timings = {"plan": time.perf_counter() - t0, "start": 0.0, "points": 0.0, "close": 0.0}
    t0 = time.perf_counter()
    early: list = []   # ttft_cdf.png, drawn as soon as its points are done
    if len(status) == len(points):  # nothing to run: no cluster
        outcome = Outcome(skipped=len(points))
    else:
        def on_done(p: Point, payload: dict) -> None:
            status[p.name] = "ok" if is_complete(folder_of(p), p.hash) else "failed"  # (drawn or not)
            if plots and not early:
                from kvsim.study.figures import cdf_points, ttft_cdf

                shown = cdf_points(points, status)
                if shown is not None:
                    try:
                        plots_dir.mkdir(parents=True, exist_ok=True)
                        early.append(ttft_cdf(shown, len(points), folder_of, plots_dir, spec.name))
                    except Exception:  # the points go on; the plot is tried again at the end
                        early.append(None)

        with open_client(workers, scheduler) as client, \
                progress_bar(len(points), spec.name, progress) as bar:
            timings["start"] = time.perf_counter() - t0
            # the table's and the plots' libraries load while the workers replay
            outcome = run_points(client, points, folder_of, progress=bar, on_done=on_done,
                                 meanwhile=lambda: _preload(plots))
            t0 = time.perf_counter()
        timings["close"] = time.perf_counter() - t0
    timings["points"] = outcome.wall_s
    t1 = time.perf_counter()
    write_whole(folder / "study.yaml", Path(path).read_bytes())   # the study as run
    write_whole(folder / "failures.json",
                (json.dumps(outcome.failures, indent=2, sort_keys=True) + "\n").encode())
    wanted = list(dict.fromkeys([*spec.metrics, *spec.plot_metrics]))
    summaries = _summaries(points, folder_of, status)
    bad = [w for w in (missing_metric(summaries, m) for m in wanted) if w]
    if bad:  # a misspelt name: no column of dashes, the points kept for the corrected study
        raise StudyFileError(f"{path}: metrics: {'; '.join(bad)} (the points are kept: run the "
                             "corrected study again and they are skipped)")
    rows = build_rows(points, folder_of, list(spec.metrics), outcome.failures, spec.baseline)
    paths = write_table(rows, folder)
    t2 = time.perf_counter()
    timings["table"] = t2 - t1
    written = []
    if plots:
        from kvsim.study.figures import write_study_plots

        drawn = early[0] if early else None
        written = write_study_plots(points, rows, folder_of, list(spec.plot_metrics), plots_dir,
                                    cdf=drawn is None, axes=axis_keys(spec),
                                    study=spec.name) + (drawn or [])
    timings["plots"] = time.perf_counter() - t2
    return StudyReport(spec, points, rows, outcome, folder, paths, written, timings)
