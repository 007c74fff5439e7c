"""``kvsim tune``: an Optuna search over config keys, its trials run on Dask, its best
configs evaluated on held-out sessions.

The client holds the Optuna study (ask / tell); each asked trial becomes a point (the
base config with the trial's values) run on the Dask cluster on the *train* part of a
seeded split of the workload's sessions, at most ``parallel`` at once. The objective is a
summary metric or a weighted sum of them; constraints (``metric <= max``, ``>= min``) go
to the sampler as Optuna constraints and a trial that breaks one never counts as best. A
trial that fails is told to Optuna as failed. The storage is SQLite in the tune folder by
default, so a tune that runs again continues its study up to the trial budget; with an
RDB URL several clients share one study.

After the search, the ``top`` best feasible trials are replayed on the *held-out*
sessions, and the base config (no search value applied) on both parts. The report gives
each trial's objective on both parts and its gain over the base config on each part (a
metric like requests/s depends on how many sessions a part has, so the parts are compared
through their gains: a gain on train that does not hold on held-out is overfitting),
writes the best config as a ready-to-run YAML, the top trials as a table (CSV, Parquet)
and Optuna's optimization-history and parameter-importance plots.

A tune that runs again continues the same Optuna study: its folder must be a tune folder
of the same config hash (``tune_hash``: the search, the objective, the split, the base
config and the content of its trace and files; not the trial budget), as
kvsim.run.outputs' rule says. Trials that were running when a tune stopped (Ctrl-C,
SIGTERM, or a kill that the next start finds) are marked
interrupted (Optuna's PRUNED state with the user attribute ``interrupted``; never FAIL,
and they do not count against the budget) and their parameters are asked again once
(``retry_of``). The sampler's seed moves on with the trials the study holds, so that a
resumed tune does not propose its first run's parameters again.

Folder: ``optuna.db``, ``trials/<number>/``, ``held_out/<number>/`` and
``base/{train,held_out}/`` (run folders),
``trials.csv``/``.parquet``, ``top.csv``/``.parquet``, ``best.yaml``, ``plots/``,
``report.html`` (a page to open: kvsim.study.html_report).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvsim.config import ConfigFileError, validate_config
from kvsim.run.outputs import Target, check_folder, write_whole
from kvsim.scratch import raise_pending, sweep_start
from kvsim.study.daskclient import open_client
from kvsim.study.execute import disk_dirs, is_complete, progress_bar, run_point, write_point
from kvsim.study.points import Point, apply, config_hash, overridden_base, inputs_digest
from kvsim.study.definition import Param, StudyFileError, TuneSpec, load_tune
from kvsim.study.table import metric, write_table
from kvsim.study.tuneplots import optuna_plots
from kvsim.study.tunecheck import TuneStopped, stop_if_the_file_is_wrong, stopped
from kvsim.study.trials import (check_storage, mark_interrupted, open_study, sampler_for,
                                storage_url, trial_state)
from kvsim.config.units import parse_size


@dataclass
class TuneReport:
    spec: TuneSpec
    folder: Path
    top: list[dict]
    n_complete: int
    n_failed: int
    n_run: int
    best_yaml: Path | None
    plots: list[Path] = field(default_factory=list)
    report: Path | None = None   # report.html (kvsim.study.html_report)
    problems: list[str] = field(default_factory=list)   # evaluations that failed
    n_interrupted: int = 0


def tune_folder(spec: TuneSpec, out: str | None) -> Path:
    return Path(out or spec.out or f"results/tune-{spec.name}")


def sample(trial, name: str, p: Param) -> dict[str, Any]:
    """The trial's value for one search dimension, as config overrides."""
    if p.type == "categorical":
        return {name: trial.suggest_categorical(name, p.choices)}
    if p.type == "split":
        f = trial.suggest_float(name, p.low, p.high, step=p.step)
        total = parse_size(p.total)
        page = 2**20   # whole MiB
        first = int(total * f) // page * page
        return {p.keys[0]: max(page, first), p.keys[1]: max(page, total - first)}
    if p.type == "int":
        v: Any = trial.suggest_int(name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
    else:
        v = trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)
    return {name: f"{v}{p.unit}" if p.unit else v}


def objective_value(spec: TuneSpec, metrics: dict) -> float:
    return sum(w * float(metric(metrics, m)) for m, w in spec.objective.weights.items())


def violations(spec: TuneSpec, metrics: dict) -> list[float]:
    """Optuna's constraint values: <= 0 is feasible."""
    out = []
    for c in spec.constraints:
        v = float(metric(metrics, c.metric))
        if c.max is not None:
            out.append(v - c.max)
        if c.min is not None:
            out.append(c.min - v)
    return out


def _point(base: dict, overrides: dict, spec: TuneSpec, source: str, label: str,
           part: str | None) -> Point:
    data = copy.deepcopy(base)
    apply(data, overrides, f"{source}: space")
    data["name"] = f"{spec.name}.{label}"
    try:
        cfg = validate_config(data, f"{source}: {label}")
    except ConfigFileError as e:
        raise StudyFileError(str(e)) from None
    resolved = cfg.model_dump(mode="json")
    split = None
    if spec.split is not None and part is not None:
        split = {"part": part, "held_out": spec.split.held_out, "seed": spec.split.seed}
    return Point(label, dict(overrides), {}, None, resolved, spec.backend,
                 config_hash(resolved, spec.backend, split), split)


def plan_tune(path: str, overrides: list[str] | tuple[str, ...] = ()) -> tuple[TuneSpec, dict]:
    """The tune and its base config's raw data (with ``set`` and ``--set``), validated; so
    is a trial's config at each end of each dimension (each choice), the others at their
    first: a value the config refuses fails here, naming it, not at a trial mid-search."""
    spec = load_tune(path)
    base = overridden_base(spec, path, overrides)
    import optuna

    ends = {n: (p.choices if p.type == "categorical" else [int(p.low), int(p.high)]
                if p.type == "int" else [p.low, p.high]) for n, p in spec.space.items()}
    for name, values in ends.items():
        for v in values:
            fixed, probe = optuna.trial.FixedTrial({**{n: e[0] for n, e in ends.items()}, name: v}), {}
            for n, p in spec.space.items():
                probe.update(sample(fixed, n, p))
            try:
                _point(base, probe, spec, path, "probe", "train")
            except StudyFileError as e:
                raise StudyFileError(f"{path}: space.{name} at {v!r}: "
                                     f"{str(e).removeprefix(f'{path}: probe: ')}") from None
    return spec, base


def tune_hash(spec: TuneSpec, base: dict) -> str:
    """The tune's config hash: what its trials' results depend on (the search space, the
    objective and constraints, the sampler and its seed, the split, the backend and the
    base config with every override, the content of the trace and the profile and model
    files it reads: ``inputs_digest``), not the trial budget or where things are written."""
    keep = spec.model_dump(mode="json", exclude={"trials", "parallel", "out", "storage", "top"})
    what = {"spec": keep, "base": base}
    inputs = inputs_digest(base, {})
    if inputs is not None:
        what["inputs"] = inputs
    blob = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tune_target(spec: TuneSpec, base: dict, out: str | None, force: bool = False,
                storage: str | None = None) -> Target:
    """The tune folder checked by the output rule, and the storage URL checked; nothing
    written."""
    if storage or spec.storage:
        check_storage(storage or spec.storage, "--storage" if storage else "storage")
    what = "--out" if out else ("out" if spec.out else "the default folder")
    return check_folder(tune_folder(spec, out), "tune", what, tune_hash(spec, base), force)


def run_tune(path: str, overrides: list[str] | tuple[str, ...] = (), *, workers: int | None = None,
             scheduler: str | None = None, out: str | None = None, storage: str | None = None,
             trials: int | None = None, progress: bool = True, force: bool = False,
             planned: tuple[TuneSpec, dict, Target] | None = None) -> TuneReport:
    """Run (or continue) the tune; ``planned``: ``plan_tune`` and ``tune_target``'s
    answers, if the caller has them. The folder is claimed before the storage opens and
    the cluster starts; a tune that could not start leaves nothing behind."""
    if planned is None:
        spec, base = plan_tune(path, overrides)
        target = tune_target(spec, base, out, force, storage)
    else:
        spec, base, target = planned
    target.claim()
    try:
        sweep_start(*disk_dirs([_point(base, {}, spec, path, "base", None).config]))
        return _tune(path, spec, base, target, workers, scheduler, storage, trials, progress,
                     tuple(overrides))
    except TuneStopped as e:  # wrong for every trial: what it wrote into a new folder goes
        cleared = target.abandon_new()
        raise stopped(e, cleared, target.path, storage or spec.storage) from None
    except BaseException:
        target.abandon_if_unused()
        raise
    finally:
        target.finish()


def _tune(path: str, spec: TuneSpec, base: dict, target: Target, workers: int | None,
          scheduler: str | None, storage: str | None, trials: int | None,
          progress: bool, overrides: tuple = ()) -> TuneReport:
    import optuna
    from distributed import as_completed

    folder = target.path
    budget = trials or spec.trials
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    new_api = hasattr(optuna.trial.Trial, "set_constraint")
    own = not (storage or spec.storage)
    n_run = 0

    def folder_of(kind: str):
        return lambda p: folder / kind / p.name

    # the cluster first: a tune whose cluster cannot start leaves no storage behind
    with open_client(workers, scheduler) as client:
        study = open_study(spec, storage_url(spec, folder, storage), bool(storage), target.hash, own)
        if own:  # our own SQLite: trials left running by a tune that was killed
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                mark_interrupted(study, t._trial_id, t.number, t.params, t.user_attrs)
        study.sampler = sampler_for(spec, len(study.get_trials(deepcopy=False)))
        done_states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
        n_done = len(study.get_trials(deepcopy=False, states=done_states))
        width = spec.parallel or max(1, len(client.scheduler_info(n_workers=-1)["workers"]))
        running: dict = {}
        ac = as_completed()
        remaining = max(0, budget - n_done)

        def launch() -> None:
            nonlocal remaining
            while remaining > 0 and len(running) < width:
                trial = study.ask()
                ov: dict = {}
                for n, p in spec.space.items():
                    ov.update(sample(trial, n, p))
                pt = _point(base, ov, spec, path, f"{trial.number:04d}", "train")
                fut = client.submit(run_point, pt.config, pt.backend, pt.split, key=f"kvsim-trial-{pt.hash}-{pt.name}",
                                    pure=False)
                running[fut] = (trial, pt)
                ac.add(fut)
                remaining -= 1

        try:
            with progress_bar(remaining, f"tune {spec.name}", progress) as bar:
                launch()
                failed = 0
                for fut in ac:
                    raise_pending()  # (a Ctrl-C Python swallowed in a Dask callback)
                    trial, pt = running.pop(fut)
                    try:
                        payload = fut.result()
                    except Exception as e:
                        payload = {"error": f"{type(e).__name__}: {e}"}
                    fut.release()
                    n_run += 1
                    stop_if_the_file_is_wrong(spec, path, payload)
                    try:
                        if "error" in payload:
                            raise RuntimeError(payload["error"])
                        m = payload["metrics"]
                        value = objective_value(spec, m)
                        if math.isnan(value):
                            raise ValueError("the objective is NaN (no request completed?)")
                        trial.set_user_attr("constraints", violations(spec, m))
                        if new_api:
                            for i, v in enumerate(violations(spec, m)):
                                trial.set_constraint(f"c{i}", v)
                        trial.set_user_attr("point", pt.name)
                        trial.set_user_attr("overrides", json.loads(json.dumps(pt.params)))
                        write_point(folder_of("trials")(pt), pt, payload)
                        study.tell(trial, value)
                    except (RuntimeError, ValueError, KeyError, OSError) as e:
                        trial.set_user_attr("error", str(e)[:2000])
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                        failed += 1
                    if bar:
                        bar(n_run, len(running), failed)
                    launch()
        except KeyboardInterrupt:   # Ctrl-C or SIGTERM: the running trials were interrupted
            for trial, _ in running.values():
                try:
                    mark_interrupted(study, trial._trial_id, trial.number, trial.params,
                                 study._storage.get_trial(trial._trial_id).user_attrs)
                except Exception:  # noqa: BLE001 (what stays RUNNING, the next start marks)
                    pass
            raise

        # the held-out evaluation of the best feasible trials
        complete = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
                    if all(c <= 0 for c in t.user_attrs.get("constraints", []))]
        sign = -1 if spec.objective.sense == "maximize" else 1
        best = sorted(complete, key=lambda t: (sign * t.value, t.number))[:spec.top]
        evals: dict = {}
        if spec.split is not None and best:
            # each best trial on the held-out sessions, and the base config (no search
            # value applied) on both parts: the yardstick for each part
            jobs = {("trial", t.number): (folder / "held_out" / f"{t.number:04d}",
                                         _point(base, t.user_attrs["overrides"], spec, path,
                                                f"{t.number:04d}", "held_out"))
                    for t in best}
            for part in ("train", "held_out"):
                jobs[("base", part)] = (folder / "base" / part,
                                        _point(base, {}, spec, path, f"base-{part}", part))
            evals = _evaluate(client, jobs)

    problems = [f"the base config on the {key[1]} sessions: {ev['error']}"
                for key, ev in evals.items() if key[0] == "base" and "error" in ev]
    top = []
    base_train = evals.get(("base", "train"), {}).get("metrics")
    base_held = evals.get(("base", "held_out"), {}).get("metrics")
    for rank, t in enumerate(best, 1):
        row: dict[str, Any] = {"rank": rank, "trial": t.number, **t.params, "objective.train": t.value}
        ev = evals.get(("trial", t.number))
        if ev is not None and "metrics" in ev:
            row["objective.held_out"] = objective_value(spec, ev["metrics"])
            row["held_out_feasible"] = all(v <= 0 for v in violations(spec, ev["metrics"]))
            if base_train is not None and base_held is not None:
                row["gain.train"] = _gain(spec, t.value, objective_value(spec, base_train))
                row["gain.held_out"] = _gain(spec, row["objective.held_out"],
                                             objective_value(spec, base_held))
        elif ev is not None:
            row["objective.held_out"] = None
            row["error"] = ev["error"]
        top.append(row)
    all_rows = [{"trial": t.number, "state": trial_state(t), "value": t.value, **t.params,
                 "retry_of": t.user_attrs.get("retry_of"),
                 "feasible": all(c <= 0 for c in t.user_attrs.get("constraints", [])),
                 "error": t.user_attrs.get("error", "")} for t in study.get_trials(deepcopy=False)]
    if all_rows:
        write_table(all_rows, folder, "trials")
    if top:
        write_table(top, folder, "top")
    best_yaml, cfg = None, None
    if best:
        cfg = _point(base, best[0].user_attrs["overrides"], spec, path, "best", None).config
        cfg["name"] = f"{spec.name}-best"
        best_yaml = folder / "best.yaml"
        write_whole(best_yaml, (f"# kvsim tune {spec.name}: trial {best[0].number}, objective "
                                f"{best[0].value:.6g} ({spec.objective.sense}) on the train sessions\n"
                                + yaml.safe_dump(cfg, sort_keys=False)).encode())
    plots = optuna_plots(study, folder / "plots", spec)
    from kvsim.study.html_report import write_tune_report

    page = write_tune_report(folder, path, spec, _point(base, {}, spec, path, "base", None).config,
                             top, all_rows, cfg, plots, overrides)
    states = [trial_state(t) for t in study.get_trials(deepcopy=False)]
    return TuneReport(spec, folder, top, states.count("COMPLETE"), states.count("FAIL"), n_run,
                      best_yaml, plots, page, problems, states.count("INTERRUPTED"))


def _gain(spec: TuneSpec, value: float, base: float) -> float | None:
    """How much better than the base config, relative (positive: better)."""
    if not base:
        return None
    d = (value - base) / abs(base)
    return d if spec.objective.sense == "maximize" else -d


def _evaluate(client, jobs: dict) -> dict:
    """Run each (folder, point) not complete yet; key -> {"metrics"} or {"error"}."""
    from distributed import as_completed

    out: dict = {}
    futs = {}
    for key, (folder, p) in jobs.items():
        if not is_complete(folder, p.hash):
            futs[client.submit(run_point, p.config, p.backend, p.split, pure=False,
                               key=f"kvsim-eval-{p.hash}")] = key
    for fut in as_completed(list(futs)):
        key = futs[fut]
        try:
            payload = fut.result()
        except Exception as e:
            payload = {"error": f"{type(e).__name__}: {e}"}
        if "error" in payload:
            out[key] = {"error": payload["error"]}
            continue
        try:
            write_point(jobs[key][0], jobs[key][1], payload)
        except (OSError, ValueError) as e:  # e.g. a folder kvsim did not write is in the way
            out[key] = {"error": f"writing {jobs[key][0]}: {e}"}
    for key, (folder, _) in jobs.items():
        if key not in out:
            out[key] = {"metrics": json.loads((folder / "summary.json").read_text())["metrics"]}
    return out
