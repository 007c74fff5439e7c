"""How copies slow compute on this machine, measured through the hw backend: one cell is a
step's compute of one kind and length started just before a copy batch (or one each way)
on one path, against the same compute alone.

Used by ``benchmarks/hw_interference.py`` (its grid, the sim's prediction beside each
cell) and by ``kvsim calibrate`` (``microbench``, whose fit reads the cells:
``kvsim.tools.fit.fit_interference``).

A cell (``Cell``): the compute's ``kind`` (a key of the ``works`` the caller gives:
``StepWork`` records of a GEMM-bound prefill, an HBM-bound decode, a decode-like mix) and
seconds; the copy's path (``copy_engine`` or ``sm_kernel``), direction (``h2d``, ``d2h``
or ``both``: a batch each way at once), page size and bytes a direction. Measured,
``reps`` times after a warm-up, alternating: the compute alone, then the compute with the
copy submitted right after it; an equal idle gap (``gap_s``) before each, because a GEMM
chain is power-bound and runs faster after idle time. The compute's time is its GPU time
(its events, as ``compute()`` reports it); the copy's from ``transfer()`` to the runtime
seeing it done. A cell's stretch is the median with-copy time over the median alone
time, less 1; its spread, half the range of each rep's with-copy time over that median
alone time.

Backends are built per page size (random slots, the largest batch of the grid at that
size; pinned host memory) with the caller's ``settings_for``, so a cell runs the hw
backend's own copy machinery and compute stand-in. In CPU mode the same runs on numpy
with batches of at most ``cpu_bytes`` (a smoke test: its times mean nothing).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Mapping

import numpy as np

from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.datapath.work import StepWork
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level

from .backend import HwBackend
from .gpu import load_cupy
from .runtime import RealtimeRuntime
from .standin import plan

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@dataclass(frozen=True)
class Cell:
    """One cell: ``kind`` of compute for ``compute_s`` seconds; a copy of ``dir_bytes`` a
    direction in pages of ``page`` on ``path`` in ``dir``; ``sm_ctas``, the SM kernel's
    CTAs each direction (None: the backend's, Little's law on the profile);
    ``sm_ctas_d2h``, its GPU -> host CTAs where they differ (host -> GPU keeps
    ``sm_ctas``, or the backend's)."""

    kind: str
    compute_s: float
    path: str
    dir: str
    page: int
    dir_bytes: int
    sm_ctas: int | None = None
    sm_ctas_d2h: int | None = None

    @property
    def name(self) -> str:
        size = f"{self.page // MiB} MiB" if self.page >= MiB else f"{self.page // KiB} KiB"
        b = self.dir_bytes
        amount = f"{b / GiB:g} GiB" if b >= GiB else f"{b // MiB} MiB"
        ctas = f", {self.sm_ctas} CTAs" if self.sm_ctas else ""
        ctas += f", {self.sm_ctas_d2h} GPU -> host CTAs" if self.sm_ctas_d2h else ""
        return (f"{self.kind} {self.compute_s * 1e3:g} ms | {self.path} {self.dir} "
                f"{amount} of {size}{ctas}")


#: the copies of the default grid: (path, dir, page, bytes a direction)
COPIES = (
    ("sm_kernel", "both", 64 * KiB, 1 * GiB), ("copy_engine", "both", 64 * KiB, 1 * GiB),
    ("sm_kernel", "h2d", 1 * MiB, 2 * GiB), ("copy_engine", "h2d", 1 * MiB, 2 * GiB),
    ("sm_kernel", "both", 16 * KiB, 256 * MiB), ("copy_engine", "both", 16 * KiB, 256 * MiB),
    ("sm_kernel", "d2h", 4 * MiB, 512 * MiB), ("copy_engine", "d2h", 4 * MiB, 512 * MiB),
    ("sm_kernel", "h2d", 16 * KiB, 64 * MiB), ("sm_kernel", "both", 1 * MiB, 64 * MiB),
    ("copy_engine", "both", 4 * MiB, 2 * GiB), ("sm_kernel", "h2d", 4 * MiB, 1 * GiB),
    ("sm_kernel", "d2h", 64 * KiB, 256 * MiB), ("copy_engine", "h2d", 16 * KiB, 64 * MiB),
    ("sm_kernel", "both", 4 * MiB, 1 * GiB), ("copy_engine", "d2h", 64 * KiB, 1 * GiB),
)
KINDS = ("gemm", "memory", "mix")
DURATIONS = (0.020, 0.002, 0.050, 0.010)


def default_grid() -> list[Cell]:
    """48 cells: every copy of ``COPIES`` under each kind of compute, the compute's length
    turning through 20, 2, 50 and 10 ms so that every kind meets copies shorter and longer
    than itself."""
    out = []
    for i, (path, d, page, nbytes) in enumerate(COPIES):
        for j, kind in enumerate(KINDS):
            out.append(Cell(kind, DURATIONS[(i + j) % len(DURATIONS)], path, d, page, nbytes))
    return out


def full_grid() -> list[Cell]:
    """Every copy of ``COPIES`` under every kind at every length: 192 cells."""
    return [Cell(kind, t, path, d, page, nbytes) for path, d, page, nbytes in COPIES
            for kind in KINDS for t in sorted(DURATIONS)]


def calibrate_grid() -> list[Cell]:
    """A short grid for ``kvsim calibrate``: each kind for 20 ms under both paths both
    ways at 64 KiB, the SM kernel one way each at 1 MiB, and the copy engine at 16 KiB;
    then HBM reads for 40 ms beside the SM kernel GPU -> host with 4 and with 36 CTAs
    (the backend's own is 14 on an H200): the CTAs the link leaves waiting, which the
    backend's own count cannot tell from the bytes they move (``backlog_d2h``)."""
    copies = (("sm_kernel", "both", 64 * KiB, 1 * GiB), ("copy_engine", "both", 64 * KiB, 1 * GiB),
              ("sm_kernel", "h2d", 1 * MiB, 1 * GiB), ("sm_kernel", "d2h", 1 * MiB, 1 * GiB),
              ("copy_engine", "both", 16 * KiB, 256 * MiB))
    return ([Cell(kind, 0.020, *c) for c in copies for kind in KINDS]
            + [Cell("memory", 0.040, "sm_kernel", "d2h", 1 * MiB, nbytes, ctas)
               for ctas, nbytes in ((4, 2 * GiB), (36, 3 * GiB))])


def busy_grid() -> list[Cell]:
    """``kvsim calibrate``'s copies under a prefill's GEMMs (30 ms, each copy shorter than
    it), one direction at a time: the copy engine at 16 KiB (32 MiB), 64 KiB (128 MiB),
    256 KiB and 1 MiB (256 MiB), what a page takes more under compute
    (``copy_engine.busy_per_page_*``); the SM kernel at 256 KiB (256 MiB) and 1 MiB (64
    and 256 MiB: two sizes tell a later start from a lower rate), its later start and
    per-CTA share (``sm.interference.busy_start``, ``busy_cta_efficiency``; both fits:
    ``kvsim.tools.fitbusy``), and at 1 MiB with CTAs too few to fill the link
    (``FEW_CTAS``: the backend's own fill it, so their cells only bound the share from
    below; on H200s 4 GPU -> host CTAs beside GEMMs moved 0.88 of their idle rate where
    the bound was 0.485, docs/validation.md 2026-12-05). Measured without an idle gap
    (steps back to back, as in a replay)."""
    sizes = ((16 * KiB, 32 * MiB), (64 * KiB, 128 * MiB), (256 * KiB, 256 * MiB), (1 * MiB, 256 * MiB))
    sm = ((256 * KiB, 256 * MiB), (1 * MiB, 64 * MiB), (1 * MiB, 256 * MiB))
    return ([Cell("gemm", 0.030, "copy_engine", d, page, nbytes) for page, nbytes in sizes
             for d in ("h2d", "d2h")]
            + [Cell("gemm", 0.030, "sm_kernel", d, page, nbytes) for page, nbytes in sm
               for d in ("h2d", "d2h")]
            + [Cell("gemm", 0.030, "sm_kernel", d, 1 * MiB, nbytes, sm_ctas=n)
               for d, (n, nbytes) in FEW_CTAS.items()])


#: ``busy_grid``'s SM-kernel cells of few CTAs one way at 1 MiB: (CTAs, bytes) by
#: direction, each well under the link at its idle per-CTA rate (an H200's: 4 x 10.8 GB/s
#: GPU -> host, 8 x 3.3 host -> GPU) and done within the 30 ms compute at a share of 0.3
FEW_CTAS = {"h2d": (8, 64 * MiB), "d2h": (4, 128 * MiB)}


SWEEP_CTAS = (1, 2, 4, 8, 14, 24, 36, 50, 66)


def sweep_grid() -> list[Cell]:
    """54 cells: the SM kernel one way under each kind of compute (40 ms), with 1 to 66
    CTAs (``SWEEP_CTAS``), 1 MiB pages, 512 MiB a CTA up to 5 GiB (the copy outlasts the
    compute): how the stretch grows with the CTAs, which the default grid (the backend's
    CTAs) cannot tell from the bytes they move."""
    return [Cell(kind, 0.040, "sm_kernel", d, 1 * MiB, min(5 * GiB, c * 512 * MiB), c)
            for kind in KINDS for d in ("h2d", "d2h") for c in SWEEP_CTAS]


SPLIT_D2H_CTAS = (4, 8)  # an H200's measured split both ways (sm.both_ctas_d2h), a lone batch's


def split_grid() -> list[Cell]:
    """24 cells: the SM kernel both ways, host -> GPU at the backend's CTAs and GPU -> host
    at 4 (the split an H200 measures both ways idle) and 8 (a lone batch's count at small
    pages: a GPU -> host batch that started first), at 16 KiB (256 MiB a direction), 64 KiB,
    1 MiB and 4 MiB (1 GiB), under each kind for 20 ms: whether the reads and steps the
    default grid's both-ways cells (the lone counts) slow more than the sim says are
    slowed by the pages, by the GPU -> host CTAs the link leaves waiting, or by the pair;
    each direction's end is recorded (``copy_dir_s``)."""
    copies = ((16 * KiB, 256 * MiB), (64 * KiB, 1 * GiB), (1 * MiB, 1 * GiB), (4 * MiB, 1 * GiB))
    return [Cell(kind, 0.020, "sm_kernel", "both", page, nbytes, None, d2h)
            for page, nbytes in copies for d2h in SPLIT_D2H_CTAS for kind in KINDS]


LENGTHS = (0.001, 0.002, 0.005, 0.010, 0.020)


def lengths_grid() -> list[Cell]:
    """45 cells: three copies of about 6-90 ms (the SM kernel both ways at 16 KiB, 256 MiB
    a direction; GPU -> host at 64 KiB, 256 MiB; the copy engine both ways at 16 KiB) under
    each kind for 1, 2, 5, 10 and 20 ms (``LENGTHS``): how a step's stretch grows with its
    length inside a copy and past its end, which tells a cost at the copy's start, a rate
    while it runs and a change as it ends apart (the default grid meets each copy at one
    length)."""
    copies = (("sm_kernel", "both", 16 * KiB, 256 * MiB), ("sm_kernel", "d2h", 64 * KiB, 256 * MiB),
              ("copy_engine", "both", 16 * KiB, 256 * MiB))
    return [Cell(kind, t, *c) for c in copies for kind in ("memory", "mix", "gemm") for t in LENGTHS]


def _batch(src, dst, ss, ds, pb) -> Batch:
    ss, ds = np.asarray(ss, np.int64), np.asarray(ds, np.int64)
    return Batch(BatchKind.EVICT, src, dst, ss, ds, np.zeros(len(ss), np.uint64), pb, 0)


def _wait(rt, waitables) -> list:
    return list(rt.run(rt.all_of(waitables)).values())


def _done_at(ev):
    """A process: ``ev``'s value and the wall time the runtime saw it done."""
    ok = yield ev
    return ok, time.perf_counter()


def _one(rt, be, work, compute_s, batches, path, gap_s
         ) -> tuple[float, float | None, list[float], float | None, float | None]:
    """(the compute's seconds, the copy's seconds or None, each batch's seconds, the host
    seconds from the compute's first kernel to the copies' call or None, the seconds of
    the compute's GEMM part where it had one and reads after it, else None) of one rep
    after ``gap_s`` idle."""
    time.sleep(gap_s)
    tc = time.perf_counter()
    job = be.compute(compute_s, work)
    copy_s, each, lead = None, [], None
    if batches:
        t0 = time.perf_counter()
        # from the compute's first kernel (the stand-in's, else the call's start) to the
        # copies' call: the GPU was idle, so that kernel ran as it was enqueued
        si = be.standin
        lead = t0 - (si.launched_at if si is not None and si.launched_at >= tc else tc)
        got = _wait(rt, [rt.process(_done_at(be.transfer(b, path=path))) for b in batches])
        each = [t - t0 for _, t in got]
        copy_s = max(each)
        if not all(ok for ok, _ in got):
            raise RuntimeError(f"a transfer failed on {path.value}: {list(be.errors)}")
    took = float(_wait(rt, [job])[0])
    part = be.standin.gemm_part_s() if be.standin is not None else None
    return took, copy_s, each, lead, (None if part is None else rt.wall_to_sim(part))


def _parts(alone: list[float], with_: list[float], ga: list, gw: list) -> dict:
    """A cell's parts (a step of GEMMs, then reads): the GEMM part's seconds each rep alone
    (``ga``) and with the copy (``gw``), and each part's stretch and spread as the whole
    step's (the medians' ratio less 1; half the range of each rep's over the median alone;
    the reads' part is a rep's time less its GEMM part's); empty where a rep had no GEMM
    part's time (a step of one part, CPU mode)."""
    if not ga or any(x is None for x in ga + gw):
        return {}
    reads_a = [t - g for t, g in zip(alone, ga)]
    reads_w = [t - g for t, g in zip(with_, gw)]
    out: dict = {"gemm_part_alone_reps": ga, "gemm_part_with_reps": gw}
    for part, a, w in (("gemm", ga, gw), ("reads", reads_a, reads_w)):
        base = statistics.median(a)
        if base <= 0:
            continue
        each = [x / base - 1.0 for x in w]
        out[f"{part}_part_stretch"] = statistics.median(w) / base - 1.0
        out[f"{part}_part_spread"] = (max(each) - min(each)) / 2
    return out


def _plan(be, seconds: float, work: StepWork) -> dict | None:
    """The stand-in's plan for ``seconds`` of ``work`` (``standin.plan``), or None."""
    si = be.standin
    if si is None:
        return None
    _, gemms, read_s = plan(seconds, work, be.settings.model, si.chain_s)
    return {"gemms": [[m, k] for m, k in gemms], "read_s": read_s,
            "chain_s": {str(m): s for m, s in si.chain_s.items()}}


def measure_cells(settings_for: Callable, cells: list[Cell], works: Mapping[str, StepWork],
                  device: str = "auto", reps: int = 5, gap_s: float = 0.1,
                  cpu_bytes: int = 4 * MiB, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> list[dict]:
    """Each cell measured (see the module docstring): a dict of the cell's fields and
    ``alone_s`` / ``with_s`` (median GPU seconds of the compute), ``stretch``, ``spread``,
    ``copy_s`` (median; ``copy_dir_s``: each direction's, from its call to its end),
    ``copy_lead_s`` (median host seconds from the compute's first kernel to the copies'
    call),
    ``pages`` and ``bytes`` in all, ``batches`` ([direction, pages]
    each, as ``hw_copy.py``'s cells), ``ctas`` (the SM kernel's per direction),
    ``work`` (the StepWork's fields), ``projections`` (the stand-in's GEMMs), ``plan``
    (what the stand-in ran for the compute: its GEMM chains ``[M, chains]`` and read
    seconds, by the chains' calibrated seconds ``chain_s``; None without the stand-in),
    ``device``; for a step of GEMMs then reads on the stand-in, each part's stretch
    (``_parts``: ``gemm_part_stretch``, ``reads_part_stretch``, and the GEMM part's
    seconds each rep). ``settings_for(page_bytes, slots,
    **options)``: settings on the profile being measured (``kvsim.run.seam.settings_for``
    with it)."""
    rng = np.random.default_rng(seed)
    on_gpu = device != "cpu" and load_cupy() is not None
    if device == "gpu" and not on_gpu:
        raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
    out = []
    for page in sorted({c.page for c in cells}):
        at = [c for c in cells if c.page == page]
        rt = RealtimeRuntime()
        be = None
        try:
            n = max(1, max(c.dir_bytes for c in at) // page)
            if not on_gpu:
                n = max(1, min(n, cpu_bytes // page))
            be = HwBackend(rt, settings_for(page, {Level.GPU: 2 * n, Level.HOST: 2 * n},
                                            device="gpu" if on_gpu else "cpu", refcheck=False))
            hs, gs = rng.permutation(2 * n), rng.permutation(2 * n)
            own = dict(be.ctas)
            for c in at:
                be.ctas = {"h2d": c.sm_ctas, "d2h": c.sm_ctas} if c.sm_ctas else dict(own)
                if c.sm_ctas_d2h:
                    be.ctas["d2h"] = c.sm_ctas_d2h
                k = max(1, min(n, c.dir_bytes // page))
                h2d = _batch(Level.HOST, Level.GPU, hs[:k], gs[:k], page)
                d2h = _batch(Level.GPU, Level.HOST, gs[n:n + k], hs[n:n + k], page)
                batches = {"h2d": [h2d], "d2h": [d2h], "both": [h2d, d2h]}[c.dir]
                path = CopyPath(c.path) if on_gpu else CopyPath.COPY_ENGINE
                work = works[c.kind]
                alone, with_, copies, dirs, leads, ga, gw = [], [], [], [], [], [], []
                for r in range(reps + 1):
                    a, _, _, _, pa = _one(rt, be, work, c.compute_s, [], path, gap_s)
                    w, cs, ends, lead, pw = _one(rt, be, work, c.compute_s, batches, path, gap_s)
                    if r:
                        alone.append(a)
                        with_.append(w)
                        copies.append(cs)
                        dirs.append(ends)
                        leads.append(lead)
                        ga.append(pa)
                        gw.append(pw)
                base = statistics.median(alone)
                each = [x / base - 1.0 for x in with_]
                row = {**asdict(c), "alone_s": base, "with_s": statistics.median(with_),
                       "stretch": statistics.median(with_) / base - 1.0,
                       "spread": (max(each) - min(each)) / 2, "copy_s": statistics.median(copies),
                       # each direction's batch from its call to the runtime seeing it done
                       # (median over the reps): both ways, when each direction finished
                       "copy_dir_s": {("h2d" if b.src == Level.HOST else "d2h"):
                                      statistics.median(d[i] for d in dirs)
                                      for i, b in enumerate(batches)},
                       # the host seconds from the compute's first kernel to the copies'
                       # call (median): the copies start that much after the compute (its
                       # kernels are enqueued first: a long step's GEMMs take milliseconds)
                       "copy_lead_s": statistics.median(leads),
                       "alone_reps": alone, "with_reps": with_, "copy_reps": copies,
                       "pages": k * len(batches), "bytes": k * len(batches) * page,
                       "batches": [["h2d" if b.src == Level.HOST else "d2h", k] for b in batches],
                       "ctas": dict(be.ctas) if c.path == "sm_kernel" else None,
                       "work": list(work), "projections": [list(x) for x in be.settings.model.projections],
                       "plan": _plan(be, c.compute_s, work),
                       "device": "gpu" if on_gpu else "cpu", **_parts(alone, with_, ga, gw)}
                out.append(row)
                if progress is not None:
                    progress(f"{c.name}: stretch {row['stretch'] * 100:+.1f}% "
                             f"(+-{row['spread'] * 100:.1f}), copy {row['copy_s'] * 1e3:.1f} ms")
        finally:
            if be is not None:
                be.close()
    return out


def median_rounds(rounds: list[list[dict]]) -> list[dict]:
    """Rows of the same cells measured in several rounds (each with backends built anew),
    one a cell: the round whose copy took the median time (the lower middle of an even
    count), with every round's ``copy_s`` as ``copy_rounds``. On the H200 a copy-engine
    cell under a prefill moved 27-38 GB/s at 64 KiB host -> GPU from one backend to the
    next on one machine, each steady within its reps."""
    out = []
    for cell in zip(*rounds):
        ranked = sorted(cell, key=lambda r: r["copy_s"])
        out.append({**ranked[(len(ranked) - 1) // 2], "copy_rounds": [r["copy_s"] for r in cell]})
    return out
