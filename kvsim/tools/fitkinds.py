"""The interference cells (``kvsim_backends.hw.interfere``): the steps they compute
(``kind_works``) and the fit of the structural model's terms per kind of work
(``sm.interference.gemm`` / ``.memory``, ``kvsim.core.datapath.interference``) that
``kvsim calibrate`` writes (the sim's prediction of a cell: ``kvsim.tools.fit.predict_cell``).

Pure of the hw backend: cells come in as dicts (a saved run's, or ``Measured``'s).

The fit predicts each cell as the sim does, fast: the sim backend runs the cell's copy
once beside a compute that outlasts it (``sim_cell``'s ``load_log``: the ``CopyLoad``
the copies take, piece by piece: the copy-engine calls' issuing, then their bytes; the SM
kernel's CTAs from its busy start); the copies' timing does not depend on the terms. The
cell's step then runs through those pieces as the fluid runs it (its GEMMs first, then
its reads, each part at its own kind's stretch under each piece's load), for terms
``FITTED``; the rest of a kind's terms stay 0 (a GEMM's HBM read weight: compute-bound,
the share of its time its bytes take has the reads' HBM term, ``hbm_exposure``; a
read's straggle: no waves). A GEMM's straggle each way is fitted: the mixed step's
one-wave GEMMs (M = 256) lose it alone, a prefill's many waves the SMs taken, so the two
kinds' cells tell the terms apart. The terms minimise, over all cells of the three kinds
together (the mixed step is its two parts), a robust loss of the error in units of the
cell's tolerance (10% of hw's stretch, or hw's own spread where wider, as
``benchmarks/hw_interference.py`` counts a cell within): squared within 2 tolerances,
linear beyond, so that a few cells far off (power-bound GEMM chains, reps that
disagree) do not pull the rest; a cell whose two parts hw timed apart counts each part's
error, half each, in place of the whole step's (``kvsim.tools.fitparts``). Nelder-Mead from two flat starts and the base profile's
own terms (``fit_cells``), the terms kept >= 0.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kvsim.config.hardware import HardwareProfile
from kvsim.core.datapath.interference import IDLE, KindTerms, MixTable, Structure
from kvsim.core.datapath.work import StepWork, gemm_share
from kvsim.core.spec import Level
from kvsim.settings import ModelSettings
from kvsim.tools.fitparts import PARTS, hw_parts, part_tolerance
from kvsim.tools.measured import batch

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


def share_works(profile: HardwareProfile, model: str = KIND_MODEL) -> dict[str, StepWork]:
    """The step kinds two ranks on one GPU run beside each other (``gpu.kernel_overlap``'s
    cells, ``kvsim_backends.hw.rankshareprobe``) for ``model`` on ``profile``'s compute
    model: ``prefill-256`` / ``prefill-4096``, a prefill chunk of 256 / 4096 tokens;
    ``decode``, a decode step of 4 requests at 32K tokens of context."""
    from kvsim.engine.compute import ComputeModel, load_model  # noqa: PLC0415

    m = ComputeModel(load_model(model), profile)
    return {"prefill-256": m.step_work([(256, 0)], 0, 0), "prefill-4096": m.step_work([(4096, 0)], 0, 0),
            "decode": m.decode_work(4, 4 * 32768)}


def cell_work(row: dict) -> StepWork:
    return StepWork(*row["work"])


def _cell_batches(c: dict) -> list[tuple[str, int]]:
    """(direction, pages) of each batch a measured cell ran at once."""
    if c.get("batches"):
        return [(str(dr), int(k)) for dr, k in c["batches"]]
    if c["dir"] == "both":
        h = c["pages"] // 2
        return [("h2d", h), ("d2h", c["pages"] - h)]
    return [(c["dir"], c["pages"])]


def _ends_at(rt, ev, into: dict, key: str):
    """A process: waits for ``ev``, then notes the time in ``into[key]``."""
    yield ev
    into[key] = rt.now


def sim_cell(profile: HardwareProfile, c: dict, compute_s: float = 0.0,
             work: StepWork | None = None, load_log: list | None = None,
             dir_s: dict | None = None) -> tuple[float, float | None]:
    """(seconds the sim backend takes for a measured cell's batches, started together;
    seconds a compute of ``compute_s`` (of ``work``: a step's, or None: the SMs alone)
    started ``copy_lead_s`` (the cell's, or 0) before them took, None without one): the
    copy time counts from the batches' start to the last one's completion, the compute's
    as the hw backend's (its GPU time: the stretch of copies' interference, not the
    backend's fixed latency per call). A cell's ``projections`` (where it has them) are
    the GEMMs the hw stand-in ran. ``load_log``: gets each (time, ``CopyLoad``) the copies
    took from compute, as they changed (from the compute's start);
    ``dir_s``: gets each direction's batch's seconds to its completion (as hw's
    ``copy_dir_s``)."""
    from kvsim.run import sim_backend  # noqa: PLC0415 (the backend registry)
    from kvsim.run.seam import settings_for  # noqa: PLC0415

    if profile.compute.boost is not None:  # (hw's cells alternate alone and with copies:
        # the power state cancels in their ratio, so a cell is timed without it)
        profile = profile.model_copy(update={"compute": profile.compute.model_copy(update={"boost": None})})
    pb = c["page"]
    batches = _cell_batches(c)
    # a cell's path: one of the two, "default" (the rule's own choice, batch by batch), or
    # "mixed" with its ``paths`` (one a direction)
    path = c.get("paths") or {"sm_kernel": "sm_kernel", "default": None}.get(c["path"], "copy_engine")
    n = sum(k for _, k in batches)
    log: list = []
    # the SM kernel's CTAs as hw ran them: a sweep's count, else those the cell recorded
    # (a forced path's; the rule's own path picks its own)
    own = c.get("ctas") if c["path"] in ("sm_kernel", "mixed") and isinstance(c.get("ctas"), dict) else None
    st = settings_for(pb, {Level.GPU: n, Level.HOST: n}, profile, refcheck=False,
                      copy_path=path, sm_ctas=c.get("sm_ctas") or own, compute_log=log)
    if c.get("projections"):
        st = replace(st, model=replace(st.model, projections=tuple(tuple(x) for x in c["projections"])))
    rt, be = sim_backend(st)
    if load_log is not None:
        be.fluid.load_log = load_log
    job = be.compute(compute_s, work) if compute_s > 0 else None
    # the copies as hw's harness started them: after the compute's kernels were enqueued
    # (``copy_lead_s``, runs from 2026-12-04 19:21 on; 0 for a copy alone or older runs)
    lead = float(c.get("copy_lead_s") or 0.0) if job is not None else 0.0
    if lead > 0.0:
        rt.run(rt.timeout(lead))
    idx, a, evs = np.arange(n), 0, []
    for dr, k in batches:
        src, dst = (Level.HOST, Level.GPU) if dr == "h2d" else (Level.GPU, Level.HOST)
        ev = be.transfer(batch(src, dst, idx[a:a + k], idx[a:a + k], pb))
        evs.append(ev if dir_s is None else rt.process(_ends_at(rt, ev, dir_s, dr)))
        a += k
    rt.run(rt.all_of(evs))
    copy_s = rt.now - lead
    if dir_s is not None and lead > 0.0:
        for k in dir_s:
            dir_s[k] -= lead
    if job is None:
        return copy_s, None
    rt.run(job)
    return copy_s, float(log[-1][2])


# (a GEMM's ``backlog_d2h`` is fitted since a GEMM of one wave that fits beside the copy
# CTAs no longer straggles: five grids and two sweeps, each run left out, 161 of 300 cells
# within against 144 without either, 2026-12-04)
# (the reads' ``page_d2h`` since twelve runs of 2026-12-04, each left out, put 295 of 510
# cells within with it against 289 without; the GEMMs' own gave 294)
# (the reads' ``issue_slowdown`` since 2026-12-04 20:00: reads beside the copy engine
# both ways at 16 KiB ran +1.2-1.9% on six machines, the sim +0.3%; fitted to the twelve
# runs with it, six machines after put 350 of 657 cells within against 333 without)
FITTED = {"gemm": ("cta_sm_share_h2d", "cta_sm_share_d2h", "straggle_d2h", "issue_slowdown",
                  "hbm_write_weight", "straggle_h2d", "backlog_d2h"),
          "memory": ("cta_sm_share_h2d", "cta_sm_share_d2h", "hbm_weight", "hbm_write_weight",
                     "backlog_d2h", "page_d2h", "issue_slowdown")}
KEYS = ("cta_sm_share_h2d", "cta_sm_share_d2h", "copy_engine_slowdown", "hbm_weight",
        "straggle_h2d", "straggle_d2h", "hbm_write_weight", "issue_slowdown",
        "backlog_d2h", "page_d2h")  # KindTerms' order
#: a term's unit in the search (the simplex moves terms of about 0.01-1): ``page_d2h`` in
#: microseconds a page
SCALE = {"page_d2h": 1e-6}
LONG_S = 10.0  # the compute beside which a cell's loads are read: longer than any copy


class Cell:
    """A measured cell as the fit sees it: its step's nominal seconds and GEMM share,
    its GEMMs and the share of their time their bytes take, the loads its copy took (from,
    load) in order, hw's stretch and tolerance, the rates its waiting GPU -> host CTAs
    are told at (the reads' drain rate, beside GEMMs a CTA's idle rate) and its page size."""

    def __init__(self, profile: HardwareProfile, row: dict):
        structure = _structure(profile, ZERO, ZERO, row["page"])
        self.drain = structure.cta_d2h_Bps
        self.idle = structure.cta_d2h_idle_Bps
        self.page = structure.page_bytes
        w = cell_work(row)
        self.share, self.gemms, self.exposure = _mix(row, structure)
        self.seconds = row["compute_s"] * profile.compute.scale
        log: list = []
        sim_cell(profile, row, LONG_S, w, load_log=log)
        self.loads = log
        self.kind = row["kind"]
        self.hw = float(row["stretch"])
        self.tol = max(0.10 * abs(self.hw), float(row.get("spread", 0.0)))
        # (hw's parts where it timed them: (stretch, tolerance) of the GEMM part, the reads')
        self.hw_parts = tuple((h, part_tolerance(h, sp)) for h, sp in hw_parts(row).values())

    def stretch(self, s: Structure) -> float:
        """The step's stretch under the cell's loads with ``s``'s terms (as the fluid
        runs it: its GEMM part first, then its reads; unslowed before the first load), its
        GPU -> host CTAs draining at its page size's rate, their pages of its size."""
        return self._run(s)[0] / self.seconds - 1.0

    def parts(self, s: Structure) -> tuple[float | None, float | None]:
        """Each part's stretch, as ``stretch`` runs them (the GEMM part's, the reads'):
        what hw's cells of a step of both parts measure apart (``gemm_part_stretch``,
        ``reads_part_stretch``); None for a part the step has none of."""
        end, gemm_end = self._run(s)
        g = self.seconds * self.share
        m = self.seconds - g
        return (gemm_end / g - 1.0 if g > 0 else None,
                (end - gemm_end) / m - 1.0 if m > 0 else None)

    def _run(self, s: Structure) -> tuple[float, float]:
        """(the step's end, its GEMM part's end), seconds from its start (``stretch``)."""
        if s.cta_d2h_Bps != self.drain or s.page_bytes != self.page or s.cta_d2h_idle_Bps != self.idle:
            s = replace(s, cta_d2h_Bps=self.drain, page_bytes=self.page, cta_d2h_idle_Bps=self.idle)
        g_left = self.seconds * self.share
        m_left = self.seconds - g_left
        t = 0.0
        g_end = 0.0 if g_left <= 0 else math.inf
        segs = [(0.0, IDLE)] + self.loads
        for i, (_, ld) in enumerate(segs):
            end = segs[i + 1][0] if i + 1 < len(segs) else math.inf
            if end <= t:
                continue
            sg = sm = 0.0
            if not ld.idle:
                sg = s.gemm_stretch(self.gemms, ld, self.exposure) if g_left > 0 else 0.0
                sm = s.memory_stretch(ld) if m_left > 0 else 0.0
            span = end - t
            if g_left > 0:
                need = g_left * (1.0 + sg)
                if need >= span:
                    g_left -= span / (1.0 + sg)
                    t = end
                    continue
                t += need
                g_left = 0.0
                g_end = t
                span = end - t
            need = m_left * (1.0 + sm)
            if need >= span:
                m_left -= span / (1.0 + sm)
                t = end
                continue
            return t + need, g_end
        return t, g_end


ZERO = KindTerms(0.0, 0.0, 0.0, 0.0)


def _structure(profile: HardwareProfile, gemm: KindTerms, memory: KindTerms,
               page_bytes: int | None = None) -> Structure:
    s = profile.interference_structure(gemm, memory, page_bytes)
    assert s is not None  # (both kinds given)
    return s


def _mix(row: dict, structure: Structure):
    model = ModelSettings(tuple(tuple(x) for x in row["projections"]))
    t = MixTable(structure, model.projections, model.min_rows, model.max_rows)
    w = cell_work(row)
    return gemm_share(w), t.gemms_for(w), t.exposure_for(w)


def _terms(kind: str, x) -> KindTerms:
    d = dict.fromkeys(KEYS, 0.0)
    d.update({k: abs(float(v)) * SCALE.get(k, 1.0) for k, v in zip(FITTED[kind], x)})
    return KindTerms(*[d[k] for k in KEYS])


def _split(x):
    n = len(FITTED["gemm"])
    return _terms("gemm", x[:n]), _terms("memory", x[n:])


def _rho(z: float) -> float:
    return z * z if z < 1.0 else 2.0 * z - 1.0


def loss(cells: list[Cell], s: Structure) -> float:
    """The robust loss of ``s`` over ``cells`` (see the module docstring); a cell whose
    parts hw timed apart (``kvsim.tools.fitparts``) counts its two parts' errors, half
    each, in place of the whole step's."""
    out = 0.0
    for c in cells:
        if c.hw_parts:
            for (hw, tol), sim in zip(c.hw_parts, c.parts(s)):
                out += 0.5 * _rho(abs((sim or 0.0) - hw) / max(tol, 0.003))
            continue
        out += _rho(abs(c.stretch(s) - c.hw) / max(c.tol, 0.003))
    return out


def part_rows(rows: list[dict], profile: HardwareProfile
              ) -> list[tuple[dict, dict[str, tuple[float, float, float]]]]:
    """Each GPU row whose parts hw timed apart, and {part: (hw's stretch, its spread, the
    sim's on ``profile``)} (``kvsim.tools.fitparts.report_parts`` prints them)."""
    out = []
    for r in rows:
        hw = hw_parts(r)
        s = profile.interference_structure(page_bytes=r["page"])
        if not hw or s is None or r.get("device", "gpu") != "gpu":
            continue
        got = {}
        for p, x in zip(PARTS, Cell(profile, r).parts(s)):
            if x is not None:
                got[p] = (hw[p][0], hw[p][1], x)
        out.append((r, got))
    return out


def _nelder_mead(f, x0: np.ndarray, step: float, iters: int) -> tuple[np.ndarray, float]:
    n = len(x0)
    pts = [x0.copy()] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals, kind="stable")
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
                vals = [f(p) for p in pts]
    i = int(np.argmin(vals))
    return pts[i], vals[i]


def fit_cells(cells: list[Cell], profile: HardwareProfile) -> tuple[KindTerms, KindTerms, float]:
    """(GEMM terms, memory terms, loss) fitted to ``cells``: the least loss of searches
    from every term at 0.3, at 1.0 and (where ``profile`` has kind terms) at its own
    (a term it lacks at 0.05): the loss has many local minima, and a profile fitted to many
    cells of the same GPU is often nearer a good one than any flat start."""
    def f(x) -> float:
        return loss(cells, _structure(profile, *_split(x)))
    n = len(FITTED["gemm"]) + len(FITTED["memory"])
    starts = [np.full(n, 0.3), np.full(n, 1.0)]
    own = profile.interference_structure()
    if own is not None:
        def at(t: KindTerms, k: str) -> float:
            v = getattr(t, k)
            v = t.hbm_weight if v is None else v  # (no write weight: the read weight's)
            return v / SCALE.get(k, 1.0) or 0.05
        starts.append(np.array([at(t, k) for kind, t in (("gemm", own.gemm), ("memory", own.memory))
                                for k in FITTED[kind]]))
    best = None
    for x in starts:
        for step in (0.5, 0.1, 0.02):  # restarts, smaller: a simplex stalls
            x, v = _nelder_mead(f, x, step, 150 * n)
        if best is None or v < best[1]:
            best = (x, v)
    assert best is not None
    g, m = _split(best[0])
    return g, m, best[1]


def within(cells: list[Cell], s: Structure) -> dict[str, tuple[int, int]]:
    """Per kind, (cells the model puts within their tolerance, cells)."""
    out: dict[str, list[int]] = {}
    for c in cells:
        k = out.setdefault(c.kind, [0, 0])
        k[0] += abs(c.stretch(s) - c.hw) <= c.tol
        k[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def _usable(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("device", "gpu") == "gpu" and r["alone_s"] > 0]


def check_kind_terms(kind_terms: str, base: HardwareProfile) -> None:
    """ValueError unless ``kind_terms`` is 'fit' (the interference cells' fit of the
    structural terms per kind of step) or 'keep' (``base``'s own, which it must have:
    ``kvsim calibrate --kind-terms``)."""
    if kind_terms not in ("fit", "keep"):
        raise ValueError(f"--kind-terms {kind_terms}: expected fit or keep")
    if kind_terms == "keep" and base.interference_structure() is None:
        raise ValueError(f"--kind-terms keep: the base profile {base.name} has no "
                         "sm.interference.gemm and .memory terms to keep")


def fit_interference(rows: list[dict], base: HardwareProfile, keep: bool = False
                     ) -> tuple[dict, dict[str, str]]:
    """(``sm.interference`` keys to set: ``gemm``, ``memory``; a comment per key) from the
    measured cells ``rows`` (GPU cells of kinds ``gemm``, ``memory`` and ``mix``) on the
    sim of ``base`` (its links, per-page costs, busy start: the copies' timing); {} where
    the gemm or memory kind has fewer than ``MIN_CELLS`` cells. Each comment also counts
    the cells ``base``'s own terms put within. ``keep``: no keys (``base``'s terms stay),
    the comment says so with both counts (``kvsim calibrate --kind-terms keep``);
    ValueError where ``base`` has no such terms."""
    if keep:
        check_kind_terms("keep", base)
    own = base.interference_structure()  # (None: the base has no kind terms)
    rows = _usable(rows)
    n = {k: sum(r["kind"] == k for r in rows) for k in ("gemm", "memory", "mix")}
    if n["gemm"] < MIN_CELLS or n["memory"] < MIN_CELLS:
        return {}, {}
    cells = [Cell(base, r) for r in rows]
    g, m, _ = fit_cells(cells, base)

    def counted(s: Structure) -> str:
        return ", ".join(f"{k} {a} of {b}" for k, (a, b) in within(cells, s).items())
    fitted = counted(_structure(base, g, m))
    theirs = "" if own is None else f"{base.name}'s terms: {counted(own)}"
    cells_are = (f"{len(cells)} cells ({n['gemm']} gemm, {n['memory']} memory, {n['mix']} mix; "
                 "kvsim_backends.hw.interfere)")
    out, why = {}, {}
    for kind, t in (("gemm", g), ("memory", m)):
        if keep:
            why[f"sm.interference.{kind}"] = (
                f"base: {base.name}'s, kept (--kind-terms keep); on this machine's {cells_are}, "
                f"within 10% or hw's spread: {theirs}; a fit of {', '.join(FITTED[kind])}: {fitted}")
            continue
        out[kind] = {k: (float(f"{getattr(t, k):.4g}") if k in SCALE else round(getattr(t, k), 4))
                     for k in KEYS}
        why[f"sm.interference.{kind}"] = (
            f"fitted: {cells_are}, the terms {', '.join(FITTED[kind])}; within "
            f"10% or hw's spread: {fitted}" + (f"; {theirs}" if theirs else ""))
    return out, why
