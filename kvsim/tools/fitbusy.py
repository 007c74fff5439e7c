"""What copies take longer beside a prefill, fitted by ``kvsim calibrate`` from its busy
cells (``kvsim_backends.hw.interfere.busy_grid``: one-way batches on each path started
just after a 30 ms prefill's GEMMs, steps back to back as in a replay) against the same
page size's idle cells:

- ``copy_engine.busy_per_page_h2d`` / ``_d2h`` (``fit_busy_per_page``): a copy-engine
  page's time beyond the sim's under the compute;
- the SM kernel's ``busy_cta_efficiency`` (``_d2h`` GPU -> host's) (``fit_busy_sm``):
  its CTAs move bytes at a share of their idle per-CTA rate, per direction; its
  ``sm.interference.busy_start`` is written 0 (its CTAs start at once beside reads and
  small GEMMs, ``benchmarks/hw_copy_start.py``), what the cells leave beyond the shares
  reported;
- the most GPU -> host CTAs move together beside GEMMs (``fit_busy_most``), where the
  base has one;
- beside a step's reads, the GPU -> host share (``fit_reads_share``, from calibrate's
  reads cells of ``kvsim_backends.hw.interfere``, not the busy grid's).

Each busy cell's own machine's idle error (its idle cell's time beyond the sim's, scaled
to the busy batch's bytes or pages) is taken off first, so that a machine faster or
slower than the profile throughout does not count as interference. Pure of the hw
backend: cells come in as dicts.
"""

from __future__ import annotations

import statistics
from typing import Callable

from kvsim.config.hardware import HardwareProfile
from kvsim.tools.fitkinds import cell_work, sim_cell


def _busy_rows(rows: list[dict], copies: list[dict], path: str) -> tuple[list[dict], dict]:
    """The GPU rows one way on ``path`` under compute that have an idle cell of their page
    size and direction, and those idle cells by (page, direction)."""
    idle = {(c["page"], c["dir"]): c for c in copies if c["path"] == path}
    return [r for r in rows if r.get("device", "gpu") == "gpu" and r["path"] == path
            and r["dir"] in ("h2d", "d2h") and r.get("copy_s") and (r["page"], r["dir"]) in idle], idle


def fit_busy_per_page(rows: list[dict], copies: list[dict], d: dict, why: dict[str, str]) -> None:
    """``copy_engine.busy_per_page_h2d`` / ``_d2h`` into ``d`` (a profile's fields, fitted
    so far) from copy-engine cells one way under compute (``rows``: GPU rows of
    ``kvsim_backends.hw.interfere.busy_grid``): a page's time beyond the sim's under the
    same compute without the term, less the same page size's idle cell's (``copies``)
    own error a page, >= 0; by page size. Nothing without such rows (the base's kept)."""
    rows, idle = _busy_rows(rows, copies, "copy_engine")
    if not rows:
        return
    bare = dict(d, copy_engine={**d["copy_engine"], "busy_per_page_h2d": None, "busy_per_page_d2h": None})
    p = HardwareProfile.model_validate(bare)
    table: dict[str, dict[int, float]] = {"h2d": {}, "d2h": {}}
    for r in sorted(rows, key=lambda r: r["page"]):
        i = idle[r["page"], r["dir"]]
        busy = sim_cell(p, r, r["compute_s"], cell_work(r))[0]
        x = (r["copy_s"] - busy) / r["pages"] - (i["seconds"] - sim_cell(p, i)[0]) / i["pages"]
        table[r["dir"]][int(r["page"])] = max(0.0, x)
    for dr, t in table.items():
        if t:
            d["copy_engine"][f"busy_per_page_{dr}"] = t
            why[f"copy_engine.busy_per_page_{dr}"] = (
                f"measured: copy-engine batches under a prefill's GEMMs ({len(t)} page sizes, "
                "kvsim_backends.hw.interfere.busy_grid), a page's time beyond the sim's less "
                "the idle cell's own error, >= 0")


def least_share(loss: Callable[[float], float]) -> float:
    """The least share of a grid (0.05-1, then to 0.005 about the best) at the least
    ``loss``: where copy CTAs keep the link full, every share above the one that binds
    fits alike, and the least of them is a lower bound."""
    def best(grid: list[float]) -> float:
        fits = [(loss(e), e) for e in grid]
        least = min(f[0] for f in fits)
        return min(e for v, e in fits if v <= least * (1 + 1e-9) + 1e-18)

    e = best([k / 20 for k in range(1, 21)])
    return best([round(e + k / 200, 4) for k in range(-9, 10) if 0 < e + k / 200 <= 1.0])


def kept_or_least(loss: Callable[[float], float], base: float | None) -> tuple[float, bool]:
    """(the share, whether it is ``base``'s): ``least_share``'s lower bound, or ``base``
    (the profile's own, measured elsewhere: e.g. CTAs too few to fill the link) where it
    lies above that bound and fits the cells as well (they cannot tell the two apart)."""
    lo = least_share(loss)
    if base is not None and lo < base <= 1.0 and loss(base) <= loss(lo) * (1 + 1e-9) + 1e-18:
        return float(base), True
    return lo, False


def _spread(res: list[float]) -> float:
    """The squared distance of busy cells' residuals from their median (>= 0): the loss
    of a rate term, a fixed cost a batch left out (``fit_busy_sm``, ``fit_busy_most``)."""
    fixed = max(0.0, statistics.median(res))
    return sum((v - fixed) ** 2 for v in res)


def fit_busy_sm(rows: list[dict], copies: list[dict], d: dict, why: dict[str, str]) -> None:
    """The SM kernel's per-CTA shares (``busy_cta_efficiency``, host -> GPU;
    ``busy_cta_efficiency_d2h``) into ``d`` (a profile's fields, fitted so far) from its
    one-way cells under compute (``rows``: GPU rows of ``busy_grid``, batches of two
    sizes, so that a fixed cost a batch and a lower rate tell apart). Each cell's residual
    is its time less the sim's (with a share, no start) less the same page size's idle
    cell's own error scaled to its bytes. Per direction, for a share, the fixed cost is its
    cells' residuals' median and the loss their squared distance from it; the
    share is the least of a grid (0.05-1, to 0.005) at the least loss: where the CTAs
    keep the link full under compute (sized for twice it), every share above the one
    that binds fits alike, and the least of them is a lower bound (the base's own share is
    kept where above it and fitting alike: ``kept_or_least``); cells of CTAs too few to
    fill the link (``busy_grid``'s) show the share itself. ``busy_start``: 0, the CTAs
    measured starting at once beside reads and small GEMMs and within one GEMM kernel
    beside a prefill's (``benchmarks/hw_copy_start.py``); the median
    of every cell's residual at its direction's share goes into ``why`` only (the
    interference grids, idle between steps, show no such cost). A direction without
    cells keeps the other's share. On a profile with the structural model's kinds the
    shares are the GEMM kind's (``sm.interference.gemm``; the reads' kept from the base:
    the cells run a prefill, a step of GEMMs), else the one for every compute. Nothing
    without such rows (the base's kept)."""
    rows, idle = _busy_rows(rows, copies, "sm_kernel")
    if not rows:
        return
    inter = d["sm"]["interference"]
    at, where = (("gemm", "sm.interference.gemm.") if inter.get("gemm") and inter.get("memory")
                 else (None, "sm.interference."))

    def with_shares(x: dict, **keys: float | None) -> dict:  # ``x``'s interference with the shares
        i = dict(x["sm"]["interference"])
        if at is None:
            i.update(keys)
        else:
            i[at] = {**i[at], **keys}
        return i
    base = HardwareProfile.model_validate(d)
    own = []  # each cell's idle error at its bytes (no compute: the share plays no part)
    for r in rows:
        i = idle[r["page"], r["dir"]]
        own.append((i["seconds"] - sim_cell(base, i)[0]) * r["bytes"] / i["bytes"])

    def residuals(eff: float, dr: str) -> list[float]:  # the cells of ``dr`` at share ``eff``
        key = "busy_cta_efficiency" if dr == "h2d" else "busy_cta_efficiency_d2h"
        x = dict(d, sm={**d["sm"], "interference": {**with_shares(d, **{key: eff}),
                                                    "busy_start": 0.0}})
        p = HardwareProfile.model_validate(x)
        return [r["copy_s"] - sim_cell(p, r, r["compute_s"], cell_work(r))[0] - e
                for r, e in zip(rows, own) if r["dir"] == dr]

    def loss(eff: float, dr: str) -> float:
        return _spread(residuals(eff, dr))

    before = inter if at is None else inter[at]  # (the base's shares)
    kept: dict[str, bool] = {}
    eff: dict[str, float] = {}
    for dr in sorted({r["dir"] for r in rows}):
        key = "busy_cta_efficiency" if dr == "h2d" else "busy_cta_efficiency_d2h"
        base_share = before.get(key) if before.get(key) is not None else before.get("busy_cta_efficiency")
        eff[dr], kept[dr] = kept_or_least(lambda e, dr=dr: loss(e, dr), base_share)
    h2d = eff.get("h2d", eff.get("d2h"))
    d2h = eff.get("d2h", h2d)
    d["sm"]["interference"] = with_shares(d, busy_cta_efficiency=h2d, busy_cta_efficiency_d2h=d2h)
    res = [v for dr in eff for v in residuals(eff[dr], dr)]
    left = statistics.median(res)
    d["sm"]["interference"]["busy_start"] = 0.0
    sizes = sorted({(r["page"], r["bytes"]) for r in rows})
    what = (f"SM-kernel batches one way under a prefill's GEMMs ({len(rows)} cells: "
            f"{', '.join(f'{b >> 20} MiB of {pg >> 10} KiB' for pg, b in sizes)}; "
            "kvsim_backends.hw.interfere.busy_grid), each less its idle cell's own error")
    why["sm.interference.busy_start"] = (
        "measured elsewhere (benchmarks/hw_copy_start.py): an SM copy kernel's first CTA "
        "starts at once beside a step's reads and small GEMMs, and at most a running GEMM "
        "kernel's end later beside a prefill's (0.2-0.4 ms at M = 4096, an H100 and an H200); "
        + what + f": their time beyond the sim's at the shares below, median {left * 1e3:.3f} ms a "
        "batch, is not written as a later start (the interference grids' copies, with idle "
        "between steps, fit 0 better)")
    for key, dr in (("busy_cta_efficiency", "h2d"), ("busy_cta_efficiency_d2h", "d2h")):
        if kept.get(dr):
            why[where + key] = (f"kept: the base's, which {what} fit as well as their lower "
                                f"bound (their CTAs keep the link full: the share does not show)")
            continue
        why[where + key] = (
            f"fitted: {what}: the least per-CTA share {dr} at the least squared spread of "
            "that time beyond the sim's (a lower bound where the CTAs keep the link full)"
            + ("" if dr in eff else f"; no {dr} cells: the other direction's"))


def fit_busy_most(rows: list[dict], copies: list[dict], d: dict, why: dict[str, str],
                  share: float | None = None) -> None:
    """The GEMM kind's ``busy_rate_d2h`` (the most the SM kernel's GPU -> host CTAs move
    together beside GEMMs) into ``d`` (a profile's fields, its shares fitted:
    ``fit_busy_sm``) from the GPU -> host SM-kernel cells under compute of ``busy_grid``
    (``rows``; ``copies``, the idle cells whose own error each takes off, as
    ``fit_busy_sm``): the most of a grid (5-60 GB/s, then to 0.1 GB/s about the best) at
    the least squared spread of the residuals about their median (a fixed cost a batch,
    left out as ``fit_busy_sm`` leaves it: ``_spread``). Cells of one CTA count cannot
    tell a lower share from a most: with ``share`` (the base's GPU -> host share beside
    GEMMs, measured where the most does not bind) the most is fitted at it too, and that
    pair is taken where it fits the cells as well (their residuals' RMS within 2% of their
    mean time: the share kept, the most fitted). Only on a profile with the kinds whose
    GEMM kind has a most (the base's): one without keeps none. Kept where no most fits
    better than 60 GB/s (above the link: none of the cells moved it)."""
    inter = d["sm"]["interference"]
    gemm = inter.get("gemm")
    if not (gemm and inter.get("memory")) or gemm.get("busy_rate_d2h") is None:
        return
    rows, idle = _busy_rows(rows, copies, "sm_kernel")
    rows = [r for r in rows if r["dir"] == "d2h"]
    if not rows:
        return
    base = HardwareProfile.model_validate(d)
    own = [(idle[r["page"], "d2h"]["seconds"] - sim_cell(base, idle[r["page"], "d2h"])[0])
           * r["bytes"] / idle[r["page"], "d2h"]["bytes"] for r in rows]

    def loss(most: float, eff: float) -> float:
        g = {**gemm, "busy_rate_d2h": most, "busy_cta_efficiency_d2h": eff}
        p = HardwareProfile.model_validate(dict(d, sm={**d["sm"], "interference": {**inter, "gemm": g}}))
        return _spread([r["copy_s"] - sim_cell(p, r, r["compute_s"], cell_work(r))[0] - e
                        for r, e in zip(rows, own)])

    def fitted(eff: float) -> tuple[float, float]:  # (least loss, most in GB/s) at share ``eff``
        _, best = min((loss(g * 1e9, eff), g) for g in range(5, 61))
        return min((loss(g * 1e9, eff), g) for g in (round(best + k / 10, 1) for k in range(-9, 10)))

    own_share = gemm["busy_cta_efficiency_d2h"]
    got, eff = fitted(own_share), own_share
    if share is not None and share != own_share:
        at = fitted(share)
        # as well: the residuals' RMS within 2% of the cells' mean time of the share's own
        # (run to run a copy's time moves that much: docs/validation.md)
        tol = 0.02 * statistics.fmean(r["copy_s"] for r in rows)
        if (at[0] / len(rows)) ** 0.5 <= (got[0] / len(rows)) ** 0.5 + tol:
            got, eff = at, share
    what = (f"calibrate's {len(rows)} GPU -> host SM-kernel cells under a prefill's GEMMs "
            "(kvsim_backends.hw.interfere.busy_grid), each less its idle cell's own error")
    if got[0] >= loss(60e9, eff) * (1 - 1e-9) - 1e-18:  # (no most fits better than none)
        why["sm.interference.gemm.busy_rate_d2h"] = (
            f"kept: the base's; {what} fit every most above their rates alike")
        return
    gemm.update(busy_rate_d2h=got[1] * 1e9, busy_cta_efficiency_d2h=eff)
    why["sm.interference.gemm.busy_rate_d2h"] = (
        f"fitted: {what}: the most at the least squared spread of their time beyond the sim's, "
        f"at a GPU -> host share of {eff:g}")
    if eff == share:
        why["sm.interference.gemm.busy_cta_efficiency_d2h"] = (
            f"kept: the base's, at which the most above fits {what} as well as at the share "
            f"they alone give ({own_share:g}: cells of one CTA count cannot tell the two apart)")


def fit_reads_share(rows: list[dict], d: dict, why: dict[str, str]) -> None:
    """The share of its idle rate a GPU -> host SM-kernel CTA keeps beside a step's reads
    (``sm.interference.busy_cta_efficiency_d2h``, and ``drain_cta_efficiency_d2h``, the
    rate the waiting CTAs are counted at) into ``d`` from the reads' interference cells
    (``rows``: calibrate's grid and CTA cells of kind 'memory', the SM kernel GPU -> host;
    the copy's time, the compute over part of it): the least share of a grid (0.05-1, to
    0.005) at the least squared distance of the cells' copy times from the sim's, as
    ``fit_busy_sm`` (cells whose CTAs keep the link full fit every share above the one
    that binds alike). Only on a profile with the structural model's kinds, where these
    keys are the reads' (a step's GEMMs have their own); nothing without such cells."""
    inter = d["sm"]["interference"]
    if not (inter.get("gemm") and inter.get("memory")):
        return
    rows = [r for r in rows if r.get("device", "gpu") == "gpu" and r["kind"] == "memory"
            and r["path"] == "sm_kernel" and r["dir"] == "d2h" and r.get("copy_s")]
    if not rows:
        return

    def loss(eff: float) -> float:
        x = dict(d, sm={**d["sm"], "interference": {**inter, "busy_cta_efficiency_d2h": eff,
                                                    "drain_cta_efficiency_d2h": eff}})
        p = HardwareProfile.model_validate(x)
        return sum((r["copy_s"] - sim_cell(p, r, r["compute_s"], cell_work(r))[0]) ** 2 for r in rows)

    e = least_share(loss)
    d["sm"]["interference"] = {**inter, "busy_cta_efficiency_d2h": e, "drain_cta_efficiency_d2h": e}
    ctas = sorted({(r.get("sm_ctas") or (r.get("ctas") or {}).get("d2h")) or 0 for r in rows})
    what = (f"fitted: SM-kernel batches GPU -> host beside a step's reads ({len(rows)} cells at "
            f"{', '.join(str(c) for c in ctas)} CTAs; kvsim_backends.hw.interfere), the least "
            "per-CTA share at the least squared distance of their copy times from the sim's")
    why["sm.interference.busy_cta_efficiency_d2h"] = what
    why["sm.interference.drain_cta_efficiency_d2h"] = what + " (the same share)"
