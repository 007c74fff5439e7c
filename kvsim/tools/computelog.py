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
"""

from __future__ import annotations

from typing import Iterable, Sequence

from kvsim.tools.fitboost import compute_bound

SIM_GEMM_COL = 3  # the sim backend's compute log: the step's nominal GEMM seconds
HW_GEMM_COL = 6   # the hw backend's


def compute_summary(log: Iterable[Sequence[float]] | None, gemm_col: int | None = None) -> dict:
    """A compute log's totals: calls, the nominal and the measured seconds, the stretch
    (measured - nominal) in all and per call (ms, p50 / p90), and measured / nominal per
    call of at least 1 ms nominal (p50 / p90); with ``gemm_col`` (the column of a step's
    nominal GEMM seconds) the compute-bound steps' calls, nominal seconds and stretch
    (``bound_*``) where the rows have it; from a hw log that has them (6th column), the
    loop's host lag before the calls (sum, ms p50 / p90 / max).
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
    lag = np.asarray([r[5] for r in rows if len(r) > 5], dtype=float)
    if lag.size:  # the hw loop's host time before each compute call (HwBackend.compute_log)
        out.update(host_lag_s=float(lag.sum()), host_lag_ms_p50=float(np.percentile(lag, 50) * 1e3),
                   host_lag_ms_p90=float(np.percentile(lag, 90) * 1e3),
                   host_lag_ms_max=float(lag.max() * 1e3))
    return out
