"""Session start times for closed-loop replays (the ``poisson`` start policy).

Deterministic: a fresh ``numpy.random.Generator`` seeded per call, no global RNG. The
first session starts at 0 s; later starts follow exponential gaps of mean
``1 / workload.sessions_per_s``. A session pinned to a start time (``start_s`` set: the
synthetic workload's burst) starts then and takes no draw, so the others' starts are the
ones they would have without it.
"""

from __future__ import annotations

import numpy as np

from .model import Workload


def session_start_times(workload: Workload, n: int | None = None, seed: int | None = None) -> list[float]:
    """Start times (s) of the first ``n`` sessions (default: all) under a Poisson process of
    rate ``workload.sessions_per_s``; ``seed`` defaults to ``workload.seed``."""
    if n is None:
        n = len(workload.sessions)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rate = workload.sessions_per_s
    if not rate > 0:
        raise ValueError(f"Poisson session starts need workload.sessions_per_s > 0, got {rate!r}")
    if n == 0:
        return []
    # (n may exceed the sessions: the process goes on past them)
    pinned = [s.start_s for s in workload.sessions[:n]] + [None] * max(0, n - len(workload.sessions))
    free = pinned.count(None)
    rng = np.random.default_rng(workload.seed if seed is None else seed)
    gaps = rng.exponential(1.0 / rate, size=max(0, free - 1))
    drawn = iter([0.0] + np.cumsum(gaps).tolist())
    return [p if p is not None else next(drawn) for p in pinned]
