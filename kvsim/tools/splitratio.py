"""How a copy's GPU -> host CTAs weigh on the compute beside it: the split grid
(``benchmarks/hw_interference.py --split``) runs the SM kernel both ways with 4 and with 8
GPU -> host CTAs, the rest of each cell the same. The stretch with 8 over the stretch with
4, hw's against the sim's, says whether the sim's share taken per GPU -> host CTA grows
with the CTAs as hw's does, which a count of cells within 10% cannot tell (a cell can be
within at 4 CTAs and out at 8 for the same reason). Pure of the sim: the prediction comes
in as a function of a row.
"""

from __future__ import annotations

import statistics
from typing import Callable

PAIR = (4, 8)  # the split grid's GPU -> host CTAs


def split_ratios(rows: list[dict], predict: Callable[[dict], float]
                 ) -> dict[str, list[tuple[float, float]]]:
    """For each kind of compute, one ``(hw, sim)`` per copy measured with both of ``PAIR``'s
    GPU -> host CTAs (the same page, bytes, compute and host -> GPU CTAs): the stretch at 8
    over the stretch at 4, hw's the ratio of its runs' medians, the sim's of
    ``predict(row)``'s. Cells on the CPU and pairs whose stretch at 4 is not above 0 (no
    ratio) are left out."""
    by: dict[tuple, dict[int, list[dict]]] = {}
    for r in rows:
        if (r.get("device", "gpu") != "gpu" or r["path"] != "sm_kernel" or r["dir"] != "both"
                or r.get("sm_ctas_d2h") not in PAIR):
            continue
        key = (r["kind"], r["page"], r["dir_bytes"], float(r["compute_s"]), r.get("sm_ctas"))
        by.setdefault(key, {}).setdefault(r["sm_ctas_d2h"], []).append(r)
    out: dict[str, list[tuple[float, float]]] = {}
    for key, got in sorted(by.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        if set(got) != set(PAIR):
            continue
        hw = [statistics.median(x["stretch"] for x in got[c]) for c in PAIR]
        sim = [statistics.median(predict(x) for x in got[c]) for c in PAIR]
        if hw[0] > 0 and sim[0] > 0:
            out.setdefault(key[0], []).append((hw[1] / hw[0], sim[1] / sim[0]))
    return out


def split_text(got: dict[str, list[tuple[float, float]]]) -> str:
    """One line: per kind, the range of hw's ratios and of the sim's, over how many copies."""
    def span(xs: list[float]) -> str:
        return f"x{min(xs):.2f}" if len(xs) == 1 else f"x{min(xs):.2f}-{max(xs):.2f}"
    return (f"the stretch with {PAIR[1]} GPU -> host CTAs over that with {PAIR[0]} (split grid, "
            "SM kernel both ways): " + "; ".join(
                f"{k} hw {span([h for h, _ in v])}, the sim {span([s for _, s in v])} "
                f"({len(v)} copies)" for k, v in sorted(got.items())))
