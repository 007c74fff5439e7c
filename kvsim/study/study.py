"""``kvsim study``: expand a study file into points, run them on Dask, tabulate and plot.

The study folder holds ``study.yaml`` (the study as run), ``points/<name>/`` (one run
folder per point), ``study.csv`` and ``study.parquet`` (one row per point), ``failures.json``
(the points that failed this time, with their errors) and ``plots/``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from kvsim.study.execute import Outcome, is_complete, open_client, progress_bar, run_points
from kvsim.study.points import Point, expand
from kvsim.study.spec import StudySpec, load_study


@dataclass
class StudyReport:
    spec: StudySpec
    points: list[Point]
    rows: list[dict]
    outcome: Outcome
    folder: Path
    table_paths: tuple
    plots: list


def study_folder(spec: StudySpec, out: str | None) -> Path:
    return Path(out or spec.out or f"results/study-{spec.name}")


def plan_study(path: str, overrides: list[str] | tuple[str, ...] = ()) -> tuple[StudySpec, list[Point]]:
    """The study and its points, validated; nothing written."""
    spec = load_study(path)
    return spec, expand(spec, str(path), overrides)


def run_study(path: str, overrides: list[str] | tuple[str, ...] = (), *, workers: int | None = None,
              scheduler: str | None = None, out: str | None = None, progress: bool = True,
              plots: bool = True) -> StudyReport:
    from kvsim.study.table import build_rows, write_table

    spec, points = plan_study(path, overrides)
    folder = study_folder(spec, out)
    folder.mkdir(parents=True, exist_ok=True)
    if Path(path).resolve() != (folder / "study.yaml").resolve():
        shutil.copyfile(path, folder / "study.yaml")
    pdir = folder / "points"

    def folder_of(p: Point) -> Path:
        return pdir / p.name

    if all(is_complete(folder_of(p), p.hash) for p in points):  # nothing to run: no cluster
        outcome = Outcome(skipped=len(points))
    else:
        with open_client(workers, scheduler) as client, \
                progress_bar(len(points), spec.name, progress) as bar:
            outcome = run_points(client, points, folder_of, progress=bar)
    (folder / "failures.json").write_text(json.dumps(outcome.failures, indent=2, sort_keys=True) + "\n")
    rows = build_rows(points, folder_of, list(spec.metrics), outcome.failures, spec.baseline)
    paths = write_table(rows, folder)
    written = []
    if plots:
        from kvsim.study.plots import write_study_plots

        written = write_study_plots(points, rows, folder_of, list(spec.plot_metrics), folder / "plots")
    return StudyReport(spec, points, rows, outcome, folder, paths, written)
