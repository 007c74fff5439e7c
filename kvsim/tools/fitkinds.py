"""The interference cells (``kvsim_backends.hw.interfere``): the steps they compute
(``kind_works``) and the fit of the structural model's terms per kind of work
(``sm.interference.gemm`` / ``.memory``, ``kvsim.core.datapath.interference``) that
``kvsim calibrate`` writes (the sim's prediction of a cell: ``kvsim.tools.fit.predict_cell``).

Pure of the hw backend: cells come in as dicts (a saved run's, or ``Measured``'s).

The fit: from each cell, the slowdown ``s`` compute ran at while the copy moved bytes
(the sim's fluid: compute progresses at ``1 / (1 + s)`` then). The window is the copy's
measured time from the compute's start: a copy that outlasts the compute stretched all of
it (``s`` = the stretch); a shorter one stretched its own time (``took = alone + copy x s
/ (1 + s)``). The load is the cell's: its SM copy CTAs per direction, whether the copy
engine moved bytes, its bytes over its time through HBM. A kind's terms are then the
least squares over its cells of ``s`` against the model's ``share x gemm + (1 - share) x
memory``: the SM shares of a copy CTA by direction on a grid (the waves make the model a
step function of them), the copy-engine and HBM terms by non-negative linear least
squares at each grid point. The HBM-bound cells fit ``memory`` first (their GEMM share is
small), then the GEMM cells fit ``gemm`` with it, twice round.
"""

from __future__ import annotations

import numpy as np

from kvsim.config.hardware import HardwareProfile
from kvsim.core.datapath.interference import CopyLoad, KindTerms, MixTable, Structure
from kvsim.core.datapath.work import StepWork, gemm_share
from kvsim.settings import ModelSettings

SHARES = tuple(round(0.025 * i, 4) for i in range(61))  # the grid of a copy CTA's SM share: 0-1.5
MIN_CELLS = 3  # a kind is fitted from at least this many cells


KIND_MODEL = "llama-3-8b"  # the model whose steps the cells compute (agentic-slice's)


def kind_works(profile: HardwareProfile, model: str = KIND_MODEL) -> dict[str, StepWork]:
    """A step of each kind of work for ``model`` on ``profile``'s compute model: ``gemm``,
    a 4096-token prefill chunk (GEMM share ~0.95 on an H200); ``memory``, a decode step of
    4 requests at 32K tokens of context (~0.02); ``mix``, a decode step of 256 requests
    at 512 (~0.4)."""
    from kvsim.engine.compute import ComputeModel, load_model  # noqa: PLC0415

    m = ComputeModel(load_model(model), profile)
    return {"gemm": m.step_work([(4096, 0)], 0, 0), "memory": m.decode_work(4, 4 * 32768),
            "mix": m.decode_work(256, 256 * 512)}


def cell_work(row: dict) -> StepWork:
    return StepWork(*row["work"])


def cell_load(row: dict) -> CopyLoad:
    """What the cell's copy took while it ran: SM copy CTAs per direction (the SM kernel's
    ``ctas`` for each of its batches), the copy engine, its bytes over its time."""
    h2d = d2h = 0
    sm = row["path"] == "sm_kernel"
    for d, _ in row["batches"]:
        if sm:
            n = int((row.get("ctas") or {}).get(d, 0))
            if d == "h2d":
                h2d += n
            else:
                d2h += n
    copy_s = row["copy_s"]
    return CopyLoad(h2d, d2h, not sm, row["bytes"] / copy_s if copy_s > 0 else 0.0)


def observed_slowdown(row: dict) -> float:
    """The slowdown the compute ran at while the copy moved bytes (see the module docstring)."""
    alone, took, copy_s = row["alone_s"], row["with_s"], row["copy_s"]
    if copy_s >= took or copy_s <= 0:
        return took / alone - 1.0
    x = (took - alone) / copy_s
    x = min(x, 0.9)
    return x / (1.0 - x)


def _mix(row: dict, structure: Structure):
    model = ModelSettings(tuple(tuple(x) for x in row["projections"]))
    t = MixTable(structure, model.projections, model.min_rows, model.max_rows)
    w = cell_work(row)
    return gemm_share(w), t.gemms_for(w)


def _with(structure: Structure, **kinds) -> Structure:
    return Structure(structure.sms, structure.hbm_Bps, structure.tile,
                     kinds.get("gemm", structure.gemm), kinds.get("memory", structure.memory))


def _nnls2(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """min |c1 a + c2 b - y| with c1, c2 >= 0 (two columns: every active set tried)."""
    best, out = None, (0.0, 0.0)
    for cols in ((0, 1), (0,), (1,), ()):
        m = np.stack([(a, b)[c] for c in cols], axis=1) if cols else np.zeros((len(y), 0))
        coef = np.linalg.lstsq(m, y, rcond=None)[0] if cols else np.zeros(0)
        if (coef < 0).any():
            continue
        full = [0.0, 0.0]
        for c, v in zip(cols, coef):
            full[c] = float(v)
        err = float(np.sum((full[0] * a + full[1] * b - y) ** 2))
        if best is None or err < best:
            best, out = err, (full[0], full[1])
    return out


def _fit_kind(kind: str, rows: list[dict], structure: Structure) -> tuple[KindTerms, float]:
    """``kind``'s terms from ``rows`` with the other kind's as ``structure`` has them;
    (terms, root-mean-square error of the slowdown)."""
    obs = np.array([observed_slowdown(r) for r in rows])
    loads = [cell_load(r) for r in rows]
    mixes = [_mix(r, structure) for r in rows]
    own = np.array([g if kind == "gemm" else 1.0 - g for g, _ in mixes])
    zero = KindTerms(0.0, 0.0, 0.0, 0.0)
    ce = np.array([1.0 if ld.copy_engine else 0.0 for ld in loads]) * own
    best = None
    for sh in SHARES:
        for sd in SHARES:
            s = _with(structure, **{kind: KindTerms(float(sh), float(sd), 0.0, 0.0)})
            # one unit of HBM weight, small: its x / (1 - x) is linear to the precision here
            base = np.array([s.stretch(g, gm, ld) for (g, gm), ld in zip(mixes, loads)])
            hbm = np.array([ld.hbm_Bps / structure.hbm_Bps for ld in loads]) * own
            c_ce, c_hbm = _nnls2(ce, hbm, obs - base)
            err = float(np.sqrt(np.mean((base + c_ce * ce + c_hbm * hbm - obs) ** 2)))
            if best is None or err < best[0] - 1e-12:
                best = (err, KindTerms(float(sh), float(sd), c_ce, c_hbm))
    if best is None:
        return zero, float("nan")
    return best[1], best[0]


def fit_interference(rows: list[dict], base: HardwareProfile) -> tuple[dict, dict[str, str]]:
    """(``sm.interference`` keys to set: ``gemm``, ``memory``; a comment per key) from the
    measured cells ``rows`` (GPU cells of kinds ``gemm``, ``memory`` and ``mix``); {} where
    a kind has fewer than ``MIN_CELLS`` cells. The base profile's terms (or, without them,
    zero) start the alternation."""
    rows = [r for r in rows if r.get("device", "gpu") == "gpu" and r["alone_s"] > 0]
    by = {k: [r for r in rows if r["kind"] == k] for k in ("gemm", "memory", "mix")}
    if len(by["gemm"]) < MIN_CELLS or len(by["memory"]) < MIN_CELLS:
        return {}, {}
    s = base.interference_structure()
    if s is None:
        zero = KindTerms(0.0, 0.0, 0.0, 0.0)
        g = base.gpu
        s = Structure(base.sm.count, g.hbm * g.decode_efficiency,
                      tuple(base.sm.interference.gemm_tile), zero, zero)
    errs = {}
    for _ in range(2):
        mem, errs["memory"] = _fit_kind("memory", by["memory"], s)
        s = _with(s, memory=mem)
        gem, errs["gemm"] = _fit_kind("gemm", by["gemm"], s)
        s = _with(s, gemm=gem)
    mix = by["mix"]
    mix_err = (float(np.sqrt(np.mean([(s.stretch(*_mix(r, s), cell_load(r)) - observed_slowdown(r)) ** 2
                                       for r in mix]))) if mix else None)
    out = {}
    why = {}
    for kind, t in (("gemm", s.gemm), ("memory", s.memory)):
        out[kind] = {"cta_sm_share_h2d": t.cta_sm_share_h2d, "cta_sm_share_d2h": t.cta_sm_share_d2h,
                     "copy_engine_slowdown": t.copy_engine_slowdown, "hbm_weight": t.hbm_weight}
        why[f"sm.interference.{kind}"] = (
            f"fitted: {len(by[kind])} {kind} cells (compute with copies, "
            f"kvsim_backends.hw.interfere), rms error of the slowdown {errs[kind]:.4f}"
            + (f"; {len(mix)} mix cells {mix_err:.4f}" if mix_err is not None and kind == "gemm" else ""))
    return out, why
