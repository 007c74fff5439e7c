"""Per-rank comparison of two replays of a node of ranks (``kvsim compare``, ``kvsim diff``).

A node's run keeps, beside its node-wide metrics, one summary a rank (``metrics.ranks``,
only when the node has more than one). Issue 34's criterion judges a 2-rank compare rank by
rank: each rank's TTFT p50 / p90, requests per second and bytes moved by kind, within the
fidelity standard. ``per_rank`` puts the two sides' figures rank by rank with the relative
error ``(a - b) / b`` (``b``, hw or a diff's second run, is the reference).

Invariants: a one-rank run (no ``ranks`` list on either side) gives None, so the reports
that add ``ranks`` only when it is not None stay as they were; two sides with different
rank counts are an error (a ValueError naming both), never a partial table.
"""

from __future__ import annotations

from typing import Sequence

# metrics.ranks[i].bytes's keys: the bytes each direction moved
BYTE_KINDS = ("host_to_gpu", "gpu_to_host", "disk_read", "disk_write")


def rel_err(sim: float | None, hw: float | None) -> float | None:
    """(sim - hw) / hw, or None when either is missing or hw is 0 (0 when both are 0)."""
    if sim is None or hw is None:
        return None
    if hw == 0:
        return 0.0 if sim == 0 else None
    return (sim - hw) / hw


def rank_headline(m: dict) -> dict[str, float | None]:
    """The compared figures of one rank's summary (``metrics.ranks[i]``)."""
    nbytes = m.get("bytes") or {}
    out = {"ttft_p50_s": m["ttft_s"]["p50"], "ttft_p90_s": m["ttft_s"]["p90"],
           "requests_per_s": m["throughput"]["requests_per_s"]}
    for kind in BYTE_KINDS:
        out[f"bytes_{kind}"] = nbytes.get(kind)
    return out


def rank_count(summary: dict) -> int:
    """How many ranks a saved run's ``summary.json`` had: its run info's, else its
    ``metrics.ranks`` list's length, else one."""
    n = (summary.get("run") or {}).get("ranks")
    return int(n) if n else len(summary.get("metrics", {}).get("ranks") or ()) or 1


def per_rank(a: dict, b: dict, names: Sequence[str] = ("sim", "hw"),
             where: Sequence[str] = ("sim", "hw")) -> list[dict] | None:
    """The two sides' per-rank figures out of their ``metrics`` (summary.json's): a list,
    one dict a rank (``rank``, then for each figure ``{names[0]: a, names[1]: b,
    "rel_err": (a - b) / b}``); None when neither side has more than one rank. ``where``
    names the two sides in the error a different rank count raises."""
    ra, rb = a.get("ranks") or [], b.get("ranks") or []
    if not ra and not rb:
        return None
    if len(ra) != len(rb):
        raise ValueError(f"per-rank comparison: {where[0]} has {len(ra) or 1} rank(s), "
                         f"{where[1]} has {len(rb) or 1}; compare runs of the same node")
    out = []
    for i, (ma, mb) in enumerate(zip(ra, rb)):
        ha, hb = rank_headline(ma), rank_headline(mb)
        row: dict = {"rank": i}
        for k in ha:
            row[k] = {names[0]: ha[k], names[1]: hb[k], "rel_err": rel_err(ha[k], hb[k])}
        out.append(row)
    return out
