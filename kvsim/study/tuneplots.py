"""A tune's own plots: Optuna's optimisation history and parameter importances, drawn
with matplotlib and titled with the tune's objective in words and units."""

from __future__ import annotations

import warnings
from pathlib import Path

from kvsim.run.plots import save_png
from kvsim.study.definition import TuneSpec


def optuna_plots(study, out: Path, spec: TuneSpec) -> list[Path]:
    """Optuna's history and (with two trials or more) importance plots of ``study`` under
    ``out``, titled in words and units; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as ovm

    out.mkdir(parents=True, exist_ok=True)
    written = []
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    makers = [("history.png", ovm.plot_optimization_history, 1)]
    if len(complete) >= 2 and complete[0].params:
        makers.append(("importance.png", ovm.plot_param_importances, 2))
    for name, make, need in makers:
        if len(complete) < need:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                ax = make(study)
            except (ValueError, RuntimeError, ZeroDivisionError):
                plt.close("all")
                continue
        fig = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        _label(ax, name, spec)
        fig.tight_layout()
        save_png(fig, out / name, dpi=80)
        plt.close(fig)
        written.append(out / name)
    return written


def _label(ax, name: str, spec: TuneSpec) -> None:
    """Optuna's plots with the tune's title and axes in words and units."""
    from kvsim.study.labels import metric_label

    weights = spec.objective.weights
    if len(weights) == 1 and next(iter(weights.values())) == 1.0:
        objective = metric_label(next(iter(weights)))[0]
    else:
        objective = "objective: " + " + ".join(f"{w:g} x {metric_label(m)[0]}" for m, w in weights.items())
    fig = ax.figure
    if name == "history.png":
        title = f"tune {spec.name}: objective by trial ({spec.objective.sense}), train sessions"
        ax.set_xlabel("trial (number)")
        ax.set_ylabel(objective)
    else:
        title = f"tune {spec.name}: what the objective depends on"
        ax.set_xlabel("importance (fraction; all sum to 1)")
        ax.set_ylabel("search parameter")
    for loc in ("left", "center", "right"):   # Optuna titles its plots on the left
        ax.set_title("", loc=loc)
    if fig._suptitle is not None:   # Optuna's own title: replaced, not overlaid
        fig._suptitle.set_text("")
    fig.suptitle(title, fontsize="medium")
    fig.set_size_inches(max(7.0, fig.get_figwidth()), fig.get_figheight())
