"""What one engine step computes, as it crosses the seam (``StepWork``), and the compute
stand-in's shape rule both backends apply to it.

Pure (standard library only). The engine's compute model (``kvsim.engine.compute``)
builds a ``StepWork`` for every step next to its step time; the backends read it:

- the hw backend runs a stand-in for the step on the GPU: tensor-core GEMMs shaped like
  the model's layer projections for the step's FLOP-bound share of its time, and HBM
  reads for the memory-bound share (``kvsim_backends.hw.standin``);
- the sim backend stretches the step under copy interference by the kind of work it is
  (``kvsim.core.datapath.interference``): GEMM waves lose SMs to copy CTAs, HBM reads
  lose bandwidth to copies.

Both take the step's split and its GEMM shapes from here, so they model the same work:

- ``gemm_share``: the share of a step's time that is FLOP-bound, ``flop_s / (flop_s +
  memory_s)`` of the compute model's two roofline times (a prefill chunk ~1, a decode step
  of few tokens ~0, a large decode batch in between). The stand-in spends that share of
  the step as GEMMs and the rest as reads, one after the other, so the step lasts what the
  compute model says whatever the split;
- ``gemm_rows``: the GEMMs' M, the step's tokens rounded down to a power of two within
  the settings' bounds (a few shapes, each calibrated once);
- ``gemm_tiles``: a GEMM's CTAs for an output tile of the profile's size, the unit of
  its waves over the SMs.

Invariants: a ``StepWork`` is immutable (a tuple) and every field is >= 0; an empty step
(no tokens) has ``seconds`` 0; ``gemm_share`` is in [0, 1].
"""

from __future__ import annotations

from typing import NamedTuple, Sequence


#: one kernel of a step's HBM reads (its memory-bound part), in seconds: what the hw
#: backend's stand-in runs them as (``kv_read`` kernels, and the busy kernel's chunks), and
#: the default of ``engine.read_kernel``, by which ranks on one GPU take turns on its SMs.
#: 0.1 ms: with it two ranks' steps on an H200 followed the kernel-length rule in all 9
#: pairs of kinds in two runs (at 0.5 ms 6 of 9, ``benchmarks/hw_rank_share.py``), and the
#: single-rank agentic slice's two H200 compares held (per-turn TTFT median +1.2% / -0.4%;
#: docs/validation.md, 2026-12-03 13:25 / 13:55); a real decode's kernels are tens of us
READ_KERNEL_S = 0.1e-3


class StepWork(NamedTuple):
    """One engine step, per GPU: ``seconds`` the compute model's nominal step time (its
    per-step overhead included); ``dense_flops`` and ``attn_flops`` (the layer
    projections, attention); ``weight_bytes`` and ``kv_bytes`` read; the step's
    ``prefill_tokens`` and ``decode_tokens``; ``flop_s`` and ``memory_s``, the roofline's
    two times (FLOPs over the model's FLOP/s, bytes over its HBM rate), of which the step
    costs the larger plus the overhead."""

    seconds: float
    dense_flops: float
    attn_flops: float
    weight_bytes: float
    kv_bytes: float
    prefill_tokens: int
    decode_tokens: int
    flop_s: float
    memory_s: float

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens


EMPTY = StepWork(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0.0, 0.0)


def gemm_share(work: StepWork) -> float:
    """The share of the step's time the stand-in spends as GEMMs (0 for an empty step)."""
    total = work.flop_s + work.memory_s
    return work.flop_s / total if total > 0 else 0.0


def gemm_rows(tokens: int, min_rows: int, max_rows: int) -> int:
    """The stand-in GEMMs' M for a step of ``tokens``: the largest power of two at most
    ``tokens``, within [``min_rows``, ``max_rows``] (both powers of two)."""
    if tokens <= min_rows:
        return min_rows
    if tokens >= max_rows:
        return max_rows
    return 1 << (tokens.bit_length() - 1)


def row_buckets(min_rows: int, max_rows: int) -> list[int]:
    """Every M ``gemm_rows`` can give, smallest first."""
    out, m = [], min_rows
    while m <= max_rows:
        out.append(m)
        m <<= 1
    return out


def gemm_tiles(rows: int, cols: int, tile: Sequence[int]) -> int:
    """CTAs of a GEMM with an output of ``rows`` x ``cols`` in tiles of ``tile`` (rows,
    cols): one CTA a tile."""
    return -(-rows // tile[0]) * -(-cols // tile[1])


def gemm_rate(rates: Sequence[tuple[int, float]], rows: int) -> float:
    """The GEMM FLOP/s at M = ``rows`` from ``rates``, (M, FLOP/s) sorted by M (a
    profile's ``gpu.gemm_flops``): the entry at the largest M <= ``rows``, else the
    smallest M's."""
    rate = rates[0][1]
    for m, f in rates:
        if m > rows:
            break
        rate = f
    return rate


def merge(parts: Sequence[tuple[float, StepWork]]) -> StepWork:
    """Several steps' work as one span of their summed ``seconds`` (each part: the
    seconds it was given, its work): FLOPs, bytes and roofline times add up, weighted by
    the share of each step's nominal time it was given; the tokens are the largest step's
    (a GEMM's M stays that of one step, not of the span). For a span the engine ran ahead
    and the hw backend computes at once."""
    if not parts:
        return EMPTY
    secs = dense = attn = wb = kvb = fs = ms = 0.0
    pt = dt = 0
    for given, w in parts:
        k = given / w.seconds if w.seconds > 0 else 0.0
        secs += given
        dense += w.dense_flops * k
        attn += w.attn_flops * k
        wb += w.weight_bytes * k
        kvb += w.kv_bytes * k
        fs += w.flop_s * k
        ms += w.memory_s * k
        if w.tokens > pt + dt:
            pt, dt = w.prefill_tokens, w.decode_tokens
    return StepWork(secs, dense, attn, wb, kvb, pt, dt, fs, ms)
