"""A replay's compute log summed up for ``kvsim compare``: how much longer than nominal
its steps ran, in all, per call, and for its compute-bound steps apart.

A row a compute call (``[start s, nominal s, seconds it took, ...]``): the sim backend's
(``kvsim_backends.sim.backend``) holds the step's nominal GEMM seconds in its 4th column,
the hw backend's (``kvsim_backends.hw.logs``) in its 7th and the loop's host lag before
the call in its 6th. A compute-bound step (GEMMs at least half its nominal time:
``kvsim.tools.fitboost.compute_bound``) runs faster or slower than nominal with the
GPU's power state, a memory-bound one with the copies beside it: their stretches apart
tell which model a gap between the two sides comes from (on H200 replays of the agentic slice, the
compute-bound steps' stretch was the gap: docs/compute.md).

Given the replay's transfer log, the other steps are split again: those no transfer ran
beside ("quiet") and those one did. A quiet step's stretch is the backend's own: on hw the
stand-in running over or under its calibrated time, in the sim the hw loop's model
(``kvsim.tools.hwloop``). The steps beside transfers stretch by that ratio and by the
copies' interference; what they take beyond their quiet ratio (``beside_excess_s``) is the
interference the sim's model is judged on, apart from how well a run's stand-in hit its
calibration (on the H200 two hw replays minutes apart ran their quiet steps x1.0128 and
x1.0092: 0.9 s apart over the slice, more than its interference).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from kvsim.tools.fitboost import compute_bound

SIM_GEMM_COL = 3  # the sim backend's compute log: the step's nominal GEMM seconds
HW_GEMM_COL = 6   # the hw backend's


def compute_summary(log: Iterable[Sequence[float]] | None, gemm_col: int | None = None,
                    transfers: Iterable[dict] | None = None) -> dict:
    """A compute log's totals: calls, the nominal and the measured seconds, the stretch
    (measured - nominal) in all and per call (ms, p50 / p90), and measured / nominal per
    call of at least 1 ms nominal (p50 / p90); with ``gemm_col`` (the column of a step's
    nominal GEMM seconds) the compute-bound steps' calls, nominal seconds and stretch
    (``bound_*``) where the rows have it; from a hw log that has them (6th column), the
    loop's host lag before the calls (sum, ms p50 / p90 / max); with both ``gemm_col`` and
    ``transfers`` (a timing log: rows with ``t_s``, ``seconds``, ``src``, ``dst``) the
    other steps split by whether a transfer ran beside them (``beside_transfers``).
    Empty for a run without one (saved before compute logs were kept)."""
    rows = list(log or ())
    if not rows:
        return {}
    import numpy as np  # noqa: PLC0415

    a = np.asarray([r[:3] for r in rows], dtype=float)
    nominal, took = a[:, 1], a[:, 2]
    stretch = took - nominal
    big = nominal >= 1e-3
    ratio = took[big] / nominal[big]
    out = {"calls": int(a.shape[0]), "nominal_s": float(nominal.sum()), "seconds": float(took.sum()),
           "stretch_s": float(stretch.sum()),
           "stretch_ms_p50": float(np.percentile(stretch, 50) * 1e3),
           "stretch_ms_p90": float(np.percentile(stretch, 90) * 1e3),
           "ratio_p50": float(np.percentile(ratio, 50)) if ratio.size else None,
           "ratio_p90": float(np.percentile(ratio, 90)) if ratio.size else None}
    if gemm_col is not None and all(len(r) > gemm_col and r[gemm_col] is not None for r in rows):
        bound = np.asarray([compute_bound(r[1], r[gemm_col]) for r in rows], dtype=bool)
        out.update(bound_calls=int(bound.sum()), bound_nominal_s=float(nominal[bound].sum()),
                   bound_stretch_s=float(stretch[bound].sum()))
        if transfers is not None:
            out.update(beside_transfers(a[~bound], transfers))
    lag = np.asarray([r[5] for r in rows if len(r) > 5], dtype=float)
    if lag.size:  # the hw loop's host time before each compute call (HwBackend.compute_log)
        out.update(host_lag_s=float(lag.sum()), host_lag_ms_p50=float(np.percentile(lag, 50) * 1e3),
                   host_lag_ms_p90=float(np.percentile(lag, 90) * 1e3),
                   host_lag_ms_max=float(lag.max() * 1e3))
    return out


def beside_transfers(calls, transfers: Iterable[dict]) -> dict:
    """``calls`` (an array of [start s, nominal s, took s] rows, the memory-bound steps)
    split by whether any transfer of ``transfers`` (between two tiers; ``t_s`` to ``t_s +
    seconds``) overlapped the call's run: the quiet ones' count, stretch and measured /
    nominal (p50 of those of at least 1 ms; None without any), and the others' count,
    nominal seconds, stretch and ``beside_excess_s``, their stretch beyond the quiet ratio
    (their nominal x (ratio - 1); with no quiet ratio, their whole stretch). On a node
    every rank's transfers count: the timing log does not say whose a transfer is."""
    import numpy as np  # noqa: PLC0415

    c = np.asarray(calls, dtype=float).reshape(-1, 3)
    spans = sorted((float(x["t_s"]), float(x["t_s"]) + float(x["seconds"]))
                   for x in transfers if x["src"] != x["dst"])
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    start, end = c[:, 0], c[:, 0] + c[:, 2]
    beside = np.zeros(len(c), dtype=bool)
    if merged:
        m = np.asarray(merged)
        last = np.searchsorted(m[:, 0], end, side="left") - 1  # the last span begun before the end
        has = last >= 0
        beside[has] = m[last[has], 1] > start[has]
    nominal, stretch = c[:, 1], c[:, 2] - c[:, 1]
    quiet = ~beside
    big = quiet & (nominal >= 1e-3)
    ratio = float(np.percentile(c[big, 2] / nominal[big], 50)) if big.any() else None
    excess = stretch[beside].sum()
    if ratio is not None:
        excess -= nominal[beside].sum() * (ratio - 1.0)
    return {"quiet_calls": int(quiet.sum()), "quiet_stretch_s": float(stretch[quiet].sum()),
            "quiet_ratio_p50": ratio, "beside_calls": int(beside.sum()),
            "beside_nominal_s": float(nominal[beside].sum()),
            "beside_stretch_s": float(stretch[beside].sum()), "beside_excess_s": float(excess)}
