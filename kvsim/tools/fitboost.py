"""The profile's ``compute.boost`` (the GPU's power state,
``kvsim.core.datapath.powerstate``) from hw replays' compute logs.

A hw compute log (``kvsim_backends.hw.logs``) times every step on the GPU: its nominal
seconds, the seconds it took, and the GPU's idle gap before it. Replayed in GPU time
(each step starts at the previous one's end plus its gap), the power state predicts what
each compute-bound step takes: its non-GEMM part as nominal, its GEMM part from the
headroom the steps before left. The fit picks the four terms that minimise the mean
absolute relative error of those predictions over the compute-bound steps of all runs
(memory-bound steps are not predicted: the state only ages over them), by a coarse grid
then a coordinate search with shrinking steps: deterministic, numbers only.

A step's nominal GEMM seconds: the hw row's 7th column (logged from 2026-12-03); for
older logs the sim's row of the same nominal time in a re-prediction of that run
(``kvsim compare --hw-from``: its 4th column), and for a nominal time the sim did not
run (a turn the two backends computed differently) the GEMM share of the nearest
compute-bound sim steps (interpolated by nominal time) when it is longer than every
memory-bound step the sim ran, else none.

``python -m kvsim.tools.fitboost OUT [OUT ...] [--hold-out]``: OUT a ``kvsim compare``
output folder; prints the terms, each run's error before and after, and with
``--hold-out`` each run predicted from the terms fitted on the others. ``kvsim calibrate
--power-state OUT[,OUT]`` writes the same fit into the profile (``fit_replays``).

The terms differ by GPU: on an H100 (2026-12-05) two slice replays fitted gain 0.10,
spend 42 ms, recover 1.5 s, calibrated 0 together, against the H200's 0.16, 86 ms, 224 ms,
0.12; each run's steps predicted from the other's fit 2.94% / 3.39% off, from the H200's
4.10% / 3.78%, and the compare re-predicted with them put the per-turn TTFT median at
-2.8% / -1.0% against -5.5% / -2.6%. A probe's worth of steps does not fit them: the
first 15-36 compute-bound steps of one run predicted the other's 3.5-4.8% off.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Iterable, Sequence

from kvsim.core.datapath.powerstate import Boost, gemm_time, recovered

Step = tuple[float, float, float, float]  # (GPU start s, nominal s, took s, nominal GEMM s)

# the coarse grid: gain, spend s, recover s, calibrated headroom
GAINS = tuple(0.05 * i for i in range(9))
SPENDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
RECOVERS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
CALIBRATED = (0.0, 0.1, 0.2, 0.4, 0.7, 1.0)


def steps_of(hw_rows: Sequence[Sequence], sim_rows: Sequence[Sequence] = ()) -> list[Step]:
    """A hw compute log's steps in GPU time, with each one's nominal GEMM seconds (see the
    module docstring for where they come from)."""
    gemm: dict[float, float] = {}
    bound: list[tuple[float, float]] = []  # (nominal, GEMM share) of compute-bound sim steps
    light_max = 0.0
    for r in sim_rows:
        if len(r) > 3:
            gemm.setdefault(round(r[1], 7), r[3])
            if r[1] > 0 and r[3] >= 0.5 * r[1]:
                bound.append((r[1], r[3] / r[1]))
            else:
                light_max = max(light_max, r[1])
    bound.sort()
    out: list[Step] = []
    end = None
    for r in hw_rows:
        start, nominal, took = r[0], r[1], r[2]
        gap = r[4] if len(r) > 4 else None
        t = start if gap is None or end is None else end + gap
        if len(r) > 6:
            g = r[6]
        else:
            g = gemm.get(round(nominal, 7), -1.0)
            if g < 0:
                g = nominal * _share(bound, nominal) if bound and nominal > light_max else 0.0
        out.append((t, nominal, took, g))
        end = t + took
    return out


def _share(bound: list[tuple[float, float]], nominal: float) -> float:
    """The GEMM share at ``nominal``, linear between the nearest compute-bound steps."""
    lo = hi = bound[0]
    for p in bound:
        if p[0] <= nominal:
            lo = p
        else:
            hi = p
            break
    else:
        return bound[-1][1]
    if hi[0] == lo[0] or nominal <= lo[0]:
        return lo[1] if nominal >= lo[0] else hi[1]
    w = (nominal - lo[0]) / (hi[0] - lo[0])
    return lo[1] + w * (hi[1] - lo[1])


def predict(steps: Iterable[Step], b: Boost | None) -> list[tuple[float, float, float]]:
    """(nominal s, took s, predicted s) of each compute-bound step (GEMMs at least half its
    nominal time), replaying the power state over the log's GPU times; ``b`` None: the
    calibrated rate (predicted = nominal)."""
    out = []
    h, free_at = 1.0, -math.inf
    for t, nominal, took, g in steps:
        if not compute_bound(nominal, g):
            continue
        if b is None:
            out.append((nominal, took, nominal))
            continue
        h0 = recovered(h, t - free_at, b) if free_at > -math.inf else 1.0
        tg, h = gemm_time(h0, g, b)
        free_at = t + tg
        out.append((nominal, took, nominal - g + tg))
    return out


def compute_bound(nominal_s: float, gemm_s: float) -> bool:
    """Whether a step of ``nominal_s``, ``gemm_s`` of them its GEMMs', is compute-bound
    (``powerstate.power_gemm_s``'s rule on its GEMM share)."""
    return gemm_s > 0.0 and gemm_s >= 0.5 * nominal_s


def error(runs: Sequence[Sequence[Step]], b: Boost | None) -> float:
    """Mean absolute relative error of the predicted compute-bound steps of ``runs``."""
    n, s = 0, 0.0
    for steps in runs:
        for nominal, took, pred in predict(steps, b):
            s += abs(pred - took) / nominal
            n += 1
    return s / n if n else 0.0


def _boost(x: Sequence[float]) -> Boost:
    return Boost(x[0], x[1], x[2], x[3])


def fit(runs: Sequence[Sequence[Step]]) -> tuple[Boost, float]:
    """(the terms, their mean absolute relative error) for the compute-bound steps of
    ``runs``: the best point of the coarse grid, refined by a coordinate search (gain and
    calibrated headroom in steps that halve from 0.02 / 0.05, spend and recover by factors
    that shrink from 1.25) until the steps are 1/64 of their start."""
    runs = [[s for s in r if compute_bound(s[1], s[3])] for r in runs]  # (the state moves at these only)
    best = min(((error(runs, Boost(g, s, r, c)), (g, s, r, c)) for g in GAINS for s in SPENDS
                for r in RECOVERS for c in CALIBRATED), key=lambda e: e[0])
    err, x = best[0], list(best[1])
    steps = [0.02, 0.25, 0.25, 0.05]  # additive for 0 and 3, log factor for 1 and 2
    for _ in range(7):
        moved = True
        while moved:
            moved = False
            for i in range(4):
                for sign in (1.0, -1.0):
                    y = list(x)
                    y[i] = y[i] + sign * steps[i] if i in (0, 3) else y[i] * (1.0 + steps[i]) ** sign
                    if y[0] < 0.0 or not 0.0 <= y[3] <= 1.0:
                        continue
                    e = error(runs, _boost(y))
                    if e < err - 1e-12:
                        err, x, moved = e, y, True
        steps = [s / 2.0 for s in steps]
    return _boost(x), err


#: fewer compute-bound steps than this in the replays named: too few to fit the four terms
#: (an H100, 2026-12-05: one slice replay's first 54-57 predicted the other's 3.6-3.7% off,
#: the H200's terms 3.8-4.1%; its first 15-36, 3.5-4.8%)
MIN_REPLAY_STEPS = 50

# why ``kvsim calibrate`` keeps a base profile's terms by default (``--power-state keep``)
KEPT_BOOST = ("the trains' terms predicted the prefills of three H200 replays of two machines "
              "-0.67 to -0.70 s off nominal where hw ran -0.26 to -0.43 s, terms fitted on "
              "replays of a third machine -0.35 s (docs/compute.md)")
POWER_STATES = ("keep", "fit")


def check_power_state(power_state: str) -> None:
    """ValueError unless ``power_state`` is 'keep' (a base profile's ``compute.boost``
    where it has one, else the trains' fit), 'fit' (the trains' fit), or ``kvsim compare``
    output folders, comma-separated, whose hw replays hold ``MIN_REPLAY_STEPS``
    compute-bound steps or more together (``fit_replays``; they are read here, before
    anything is measured)."""
    replay_runs(power_state)


def replay_runs(power_state: str) -> dict[str, list[Step]] | None:
    """The hw steps of each folder ``power_state`` names (None: 'keep' or 'fit');
    ValueError naming the folder for one that is not a compare folder with a hw compute
    log, and for too few compute-bound steps together."""
    if power_state in POWER_STATES:
        return None
    folders = [f.strip() for f in power_state.split(",") if f.strip()]
    bad = next((f for f in folders if not os.path.isdir(f)), None)
    if not folders or bad is not None:
        raise ValueError(f"--power-state {power_state}: expected keep, fit or kvsim compare output "
                         f"folders, comma-separated" + (f" ({bad}: no such folder)" if bad else ""))
    try:
        runs = {f: load_run(f) for f in folders}
    except ValueError as e:
        raise ValueError(f"--power-state {power_state}: {e}") from e
    n = bound_steps(runs.values())
    if n < MIN_REPLAY_STEPS:
        raise ValueError(f"--power-state {power_state}: {n} compute-bound steps in their hw "
                         f"replays, fewer than {MIN_REPLAY_STEPS} to fit compute.boost")
    return runs


def bound_steps(runs: Iterable[Sequence[Step]]) -> int:
    """How many of ``runs``' steps are compute-bound (those the power state is fitted to)."""
    return sum(1 for steps in runs for s in steps if compute_bound(s[1], s[3]))


def fit_replays(runs: dict[str, list[Step]]) -> tuple[dict, str]:
    """``compute.boost`` (a profile dict's section) and where it came from, fitted to the
    compute-bound steps of hw replays on this machine (``replay_runs``)."""
    b, err = fit(list(runs.values()))
    n = bound_steps(runs.values())
    before = error(list(runs.values()), None)
    return ({"gain": b.gain, "spend": b.spend, "recover": b.recover, "calibrated": b.calibrated},
            f"fitted (kvsim.tools.fitboost): {n} compute-bound steps of the hw replays in "
            f"{', '.join(runs)}, mean |rel err| of their GPU times {before:.1%} at the calibrated "
            f"rate, {err:.1%} with the power state")


def fit_trains(rows: Sequence[Sequence]) -> tuple[dict, str]:
    """``compute.boost`` (a profile dict's section) and where it came from, fitted to
    ``kvsim calibrate``'s trains of GEMM steps after idle (hw compute log rows:
    ``kvsim_backends.hw.microbench.measure_power``)."""
    steps = steps_of(rows)
    b, err = fit([steps])
    n = len(predict(steps, None))
    return ({"gain": b.gain, "spend": b.spend, "recover": b.recover, "calibrated": b.calibrated},
            f"fitted (kvsim.tools.fitboost): {n} GEMM steps in trains after 0-2 s idle, mean "
            f"|rel err| of their GPU times {error([steps], None):.1%} at the calibrated rate, "
            f"{err:.1%} with the power state")


def load_run(folder: str) -> list[Step]:
    """A ``kvsim compare`` output folder's hw steps (its saved call logs)."""
    from kvsim.tools.reports import saved_call_logs  # noqa: PLC0415

    logs = saved_call_logs(folder)
    if not logs.get("hw_compute"):
        raise ValueError(f"{folder}: no hw compute log (expected a kvsim compare output folder "
                         "with compare-calls.json.gz; a compare saved before they were kept?)")
    return steps_of(logs["hw_compute"], logs.get("sim_compute") or ())


def main(argv: Sequence[str]) -> int:
    hold = "--hold-out" in argv
    folders = [a for a in argv if a != "--hold-out"]
    if not folders:
        print("usage: python -m kvsim.tools.fitboost OUT [OUT ...] [--hold-out]", file=sys.stderr)
        return 2
    try:
        runs = [load_run(f) for f in folders]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    b, err = fit(runs)
    print(f"compute.boost: gain {b.gain:.4g}, spend {b.spend * 1e3:.4g} ms, "
          f"recover {b.recover * 1e3:.4g} ms, calibrated {b.calibrated:.4g}")
    for f, steps in zip(folders, runs):
        n = len(predict(steps, None))
        print(f"{f}: {n} compute-bound steps, mean |rel err| {error([steps], None):.2%} -> "
              f"{error([steps], b):.2%}")
    if hold and len(runs) > 1:
        for i, f in enumerate(folders):
            bi, _ = fit([r for j, r in enumerate(runs) if j != i])
            print(f"{f} held out: terms of the others {tuple(round(v, 4) for v in bi)}, "
                  f"mean |rel err| {error([runs[i]], bi):.2%}")
    print(f"fitboost_mean_abs_err: {err:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
