"""What hw's interference cells time beside the whole step: when the copy started after
the compute (``copy_lead_s``; ``fill_leads`` for runs that did not record it), and a step
of both parts judged part by part. The hw stand-in runs a step's GEMMs, then its
reads (``kvsim_backends.hw.standin``), and its interference cells time the GEMM part
apart (``kvsim_backends.hw.interfere``: ``gemm_part_stretch``, ``reads_part_stretch``
and their spreads, runs from 2026-12-05 on). The sim runs the same two parts one after
the other (``kvsim.tools.fitkinds.Cell.parts``: the fluid's reading of the cell's loads,
the same floats as the sim backend's whole step).

A whole step's stretch mixes its parts: on the decode-like mix (GEMM share ~0.4) a
copy that starts in the GEMM part and ends in the reads shows only their sum, so one
kind's term wrong can be hidden by the other's. A cell with parts tells them apart: the
fit (``kvsim.tools.fitkinds.loss``) weighs its two parts' errors in place of the
whole step's, and ``benchmarks/hw_interference.py`` counts each part within (pure of
the sim: the rows' parts and the sim's come in).
"""

from __future__ import annotations

import numpy as np

PARTS = ("gemm", "reads")


def hw_parts(row: dict) -> dict[str, tuple[float, float]]:
    """{part: (hw's stretch, its spread)} of a measured cell's parts; empty for a cell
    without (a step of one part, a run before parts were timed, CPU mode)."""
    out = {}
    for p in PARTS:
        st = row.get(f"{p}_part_stretch")
        if st is not None:
            out[p] = (float(st), float(row.get(f"{p}_part_spread") or 0.0))
    return out if len(out) == len(PARTS) else {}


def part_tolerance(hw: float, spread: float) -> float:
    """A part's tolerance, as a whole step's: 10% of hw's stretch or its spread, the wider."""
    return max(0.10 * abs(hw), spread)


def report_parts(got: list[tuple[dict, dict[str, tuple[float, float, float]]]], out=print
                 ) -> dict[str, tuple[int, int]]:
    """The cells with parts (``kvsim.tools.fitkinds.part_rows``: each row and {part:
    (hw's stretch, spread, the sim's)}), each part's stretch hw / sim, and per part how
    many are within (10% of hw's or its spread): {part: (within, cells)} (empty without
    such cells: nothing is printed)."""
    if not got:
        return {}
    count = {p: [0, 0] for p in PARTS}
    out("\na step's two parts apart, stretch (hw / sim):")
    for r, parts in got:
        line = []
        for p, (hw, spread, sim) in parts.items():
            count[p][0] += abs(sim - hw) <= part_tolerance(hw, spread)
            count[p][1] += 1
            line.append(f"{p} {hw * 100:+.1f}% / {sim * 100:+.1f}%")
        out(f"- {r['kind']} {r['compute_s'] * 1e3:g} ms | {r['path']} {r['dir']} "
            f"{r['page'] >> 10} KiB: " + ", ".join(line))
    res = {p: (a, b) for p, (a, b) in count.items() if b}
    out("each part within 10% of hw's or its spread: "
        + "; ".join(f"{p} part: {a} of {b}" for p, (a, b) in res.items()))
    return res


def fill_leads(rows: list[dict], ref: list[dict]) -> int:
    """Give each of ``rows`` without a ``copy_lead_s`` (a run measured before hw's harness
    recorded it) the lead of ``ref``'s cells of its kind at its compute's length: their
    median at each length, linear between lengths, the nearest beyond them (the lead is the
    host time the compute's kernels take to enqueue: it grows with the step's GEMM calls).
    Rows of a kind ``ref`` lacks keep none. Returns how many rows were given one."""
    by: dict[str, dict[float, list[float]]] = {}
    for r in ref:
        if r.get("copy_lead_s") is not None:
            by.setdefault(r["kind"], {}).setdefault(float(r["compute_s"]), []).append(float(r["copy_lead_s"]))
    n = 0
    for r in rows:
        if r.get("copy_lead_s") is not None or r["kind"] not in by:
            continue
        at = sorted(by[r["kind"]].items())
        xs = [t for t, _ in at]
        ys = [float(np.median(v)) for _, v in at]
        r["copy_lead_s"] = float(np.interp(float(r["compute_s"]), xs, ys))
        n += 1
    return n
