"""The profile's ``gpu.kernel_overlap`` from rank-share cells (two ranks' steps on one GPU,
``kvsim_backends.hw.rankshareprobe``), for ``kvsim calibrate``'s fit and
``benchmarks/hw_rank_share.py``. Pure: plain rows in, the value and where it came from out.

A row is one step kind (``rank``) beside another (``other``) at one read-kernel length
(``chunk_ms``): its ``stretch`` (median GPU time beside the other over alone) and both
kinds' kernel lengths (``kernel_us``, ``other_kernel_us``: GPU time alone over kernels).
A cell's overlap is how much less than the other's kernel each of its own kernels waited,
k_other - (stretch - 1) x k_own (us); the fit is the median over the cells, at least 0
(a negative median: the kernels waited longer than strict turns would make them).

Invariant: the value written is at least 0 and in seconds (the rows are in us).
"""

from __future__ import annotations

import statistics


def overlap_of(row: dict) -> float:
    """A cell's overlap (us): how much less than the other's kernel each kernel waited."""
    return row["other_kernel_us"] - (row["stretch"] - 1.0) * row["kernel_us"]


def fit_overlap(rows: list[dict]) -> dict[float, float]:
    """The median cell overlap (us, at least 0) per read-kernel length (``chunk_ms``)."""
    by: dict[float, list[float]] = {}
    for r in rows:
        by.setdefault(r["chunk_ms"], []).append(overlap_of(r))
    return {c: max(0.0, statistics.median(v)) for c, v in sorted(by.items())}


def rule_stretch(row: dict, overlap_us: float) -> float:
    """A cell's stretch by the sim's rule with ``overlap_us``: (k + max(0, k_o - O)) / k."""
    return (row["kernel_us"] + max(0.0, row["other_kernel_us"] - overlap_us)) / row["kernel_us"]


def within(rows: list[dict], overlap_us: float, tol: float = 0.1) -> int:
    """The cells whose stretch the rule with ``overlap_us`` gives within ``tol``."""
    return sum(abs(rule_stretch(r, overlap_us) / r["stretch"] - 1) <= tol for r in rows)


def kernel_overlap(rows: list[dict]) -> tuple[float, str]:
    """(``gpu.kernel_overlap`` in seconds, why) from the cells of one read-kernel length."""
    lengths = sorted({r["chunk_ms"] for r in rows})
    if len(lengths) != 1:
        raise ValueError(f"rank_share: expected cells of one read-kernel length; got {lengths or 'none'}")
    med = statistics.median(overlap_of(r) for r in rows)
    ov = max(0.0, med)
    pairs = sorted({tuple(sorted((r["rank"], r["other"]))) for r in rows})
    clamped = f" (the median {med:+.2f} us, clamped to 0)" if med < 0 else ""
    why = (f"measured: median over {len(rows)} cells ({len(pairs)} pairs of step kinds) at read "
           f"kernels {lengths[0]:g} ms of k_other - (stretch - 1) x k_own, {ov:.2f} us{clamped}; "
           f"the rule with it within 10% in {within(rows, ov)} of {len(rows)}")
    return ov / 1e6, why


def fit_kernel_overlap(rs: dict | None, d: dict, why: dict[str, str]) -> None:
    """Set ``d["gpu"]["kernel_overlap"]`` (a profile's ``model_dump``) from calibrate's
    rank-share measurement ``rs`` (its ``rows``) and say where it came from. ``rs`` None (a
    report from before calibrate measured it): nothing changes; skipped or no cells: the
    base's value, and why."""
    if rs is None:
        return
    if rs.get("skipped"):
        why["gpu.kernel_overlap"] = f"base: {rs['skipped']}"
        return
    rows = rs.get("rows") or []
    if not rows:
        why["gpu.kernel_overlap"] = "base: no pair of steps ran together"
        return
    d["gpu"]["kernel_overlap"], why["gpu.kernel_overlap"] = kernel_overlap(rows)
