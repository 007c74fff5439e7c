"""How ranks on one GPU share its SMs in the sim (``node.ranks_per_gpu`` > 1): by the
lengths of their steps' kernels.

Two ranks' streams on one GPU take turns kernel by kernel: a kernel that fills the SMs
with CTAs runs before the other stream's next kernel gets them, so while steps run at
once each progresses at its current kernel's length over the sum of all their current
kernels' (kernels ``k_i``: a share ``k_i / sum k``). A prefill's GEMMs (short kernels at
small M) beside a decode's reads (long ones) slow several times while the decode barely
slows; equal kernels share 1 / n each, plain processor sharing. On the H200, steps of two
ranks of one process (the hw backend's threads, each its streams) overlapping each other
shared the GPU this way: decodes beside decodes 0.51 each, a prefill's GEMMs at M 256
beside a decode's reads 0.10-0.13 (docs/validation.md, 2026-12-03).

Turns are not quite exclusive: the other stream's next kernel starts on the SMs that the
current one's last CTAs leave free while they drain, so another rank's kernel delays this
one's by its length less the profile's ``gpu.kernel_overlap`` (at least 0); two equal
kernels then share by (2k - overlap) / k, a little under 2 (``benchmarks/hw_rank_share.py``
fits it: the median over its pairs of k_other less the delay it measured).

A step's kernels (``KernelLengths.of``), in the order the stand-in
(``kvsim_backends.hw.standin``) runs them: its GEMM part (``gemm_share``) as the model's
layer projections at its M (``gemm_rows``), each kernel the mean projection's FLOPs at the
step's own FLOP rate (the compute model's), or at the profile's ``gpu.gemm_flops`` at that M
where it has them (the rate the GPU runs such GEMMs at); its reads part as kernels of
``engine.read_kernel`` (the stand-in's read kernels). A memory-bound step (``memory_s >=
flop_s``: a decode) runs as reads throughout: its projections, at its few rows, read
weights (the stand-in runs such a step's GEMM share, less than one chain of them, as
reads). A compute without a ``StepWork`` (the SMs alone: the busy kernel) is reads too.

Invariants: pure arithmetic (no clock, no state but the model's constants); without
overlap a job's factor is exactly ``n`` (as processor sharing's) whenever every current
kernel equals its own; with one job running every factor is 1.0; a factor is never below
1.0.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.core.datapath.work import StepWork, gemm_rate, gemm_rows


class KernelLengths:
    """Kernel lengths of a step's two parts for a model's layer projections
    (``ModelSettings``: ``projections`` (K, N), ``min_rows``, ``max_rows``), a read kernel
    of ``read_kernel_s``, the GPU's GEMM rates by M (``gemm_flops``; None: each step's
    own) and the time two streams' consecutive kernels overlap (``overlap_s``)."""

    def __init__(self, model: Any, read_kernel_s: float, gemm_flops: dict[int, float] | None = None,
                 overlap_s: float = 0.0):
        self.rates = sorted(gemm_flops.items()) if gemm_flops else []
        self.overlap_s = overlap_s
        proj = model.projections
        self.mean_kn = sum(float(k) * n for k, n in proj) / len(proj) if proj else 0.0
        self.min_rows = model.min_rows
        self.max_rows = model.max_rows
        self.read_s = read_kernel_s

    def of(self, work: StepWork | None) -> tuple[float, float]:
        """(a GEMM kernel's seconds, a read kernel's) for a step of ``work``."""
        r = self.read_s
        if work is None or work.flop_s <= work.memory_s or self.mean_kn <= 0.0:
            return r, r
        m = gemm_rows(work.tokens, self.min_rows, self.max_rows)
        if self.rates:
            return 2.0 * m * self.mean_kn / self.rate_at(m), r
        flops = work.dense_flops + work.attn_flops
        if flops <= 0.0:
            return r, r
        return 2.0 * m * self.mean_kn * (work.flop_s / flops), r

    def rate_at(self, m: int) -> float:
        """The GPU's GEMM FLOP/s at M = ``m``: its entry at the largest rows <= ``m``, else
        its smallest rows' (``kvsim.core.datapath.work.gemm_rate``)."""
        return gemm_rate(self.rates, m)


def factors(job: Any, jobs: Sequence[Any], now: float, overlap_s: float = 0.0) -> tuple[float, float]:
    """How many times longer ``job``'s GEMM part and reads part take beside the other
    ``jobs`` running (each at its current kernel at ``now``: ``Job.kernel_at``) than
    alone: (its kernel + theirs, each less ``overlap_s``) / its kernel; ``len(jobs)``
    exactly where all are equal and nothing overlaps."""
    n = len(jobs)
    if n < 2:
        return 1.0, 1.0
    own_g, own_m = job.k_g, job.k_m
    others = 0.0
    same_g = same_m = overlap_s <= 0.0
    for j in jobs:
        if j is job:
            continue
        k = j.kernel_at(now)
        others += k - overlap_s if k > overlap_s else 0.0
        same_g = same_g and k == own_g
        same_m = same_m and k == own_m
    fg = float(n) if same_g else (own_g + others) / own_g
    fm = float(n) if same_m else (own_m + others) / own_m
    return fg, fm
