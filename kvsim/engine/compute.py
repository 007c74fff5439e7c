"""The compute model: how long one engine step takes for a model shape on a GPU profile.

A step is a roofline over the whole batch (prefill chunks and decode tokens run in the
same kernels, sharing one read of the weights):

    flops = sum over tokens of 2 * active_params / tp                (the projections)
          + sum over requests of 2 * attn_layers * heads/tp * (d_qk + d_v) * new * (ctx + new/2)
          + the same over the sliding layers, their context capped at the window
    bytes = weights once (active_params x tokens, at most all params; x bytes a param / tp)
          + KV read: full-context KV a token * (context every request attends to)
          + sliding KV a token * (its context capped at the window)
          + recurrent state of every request in the step
    step  = max(flops / (flops_bf16 * prefill_efficiency),
                bytes / (hbm * decode_efficiency)) + step_overhead

For GQA d_qk = d_v = head_dim (4 * layers * heads * head_dim, as before); MLA prefills
as multi-head attention (d_qk = qk_nope + qk_rope head dims, d_v = v_head_dim) and decodes
absorbed (d_qk = kv_lora_rank + qk_rope_head_dim, d_v = kv_lora_rank). Decodes are
given as their count and summed context: their sliding-layer context is taken as
min(sum, count x window), exact when every context is on the same side of the window and
an upper bound otherwise (docs/models.md).

A prefill-heavy step is compute-bound, a decode-only step memory-bound; a mixed step costs
the larger of the two, not the sum (they overlap in one pass). An empty step costs 0.
KV writes and activations are left out. All per-GPU (tensor parallel degree ``tp``).
``step_time`` is plain float arithmetic: it runs once per engine step (and once per step
the engine runs ahead). ``step_work`` and ``decode_work`` give the same step time as the
``seconds`` of a ``StepWork`` (``kvsim.core.datapath.work``), with the FLOPs, bytes,
tokens and the two roofline times it came from: what the engine hands the backend with
each step, so that the hw backend computes like the step and the sim stretches it by the
kind of work it is. The model shape's schema is ``kvsim.config.modelshape`` (re-exported
here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from kvsim.config.hfmodel import load_model
from kvsim.config.modelshape import ModelShape, kv_bytes_per_token
from kvsim.core.datapath.work import EMPTY, StepWork

if TYPE_CHECKING:
    from kvsim.config.hardware import HardwareProfile

__all__ = ["ComputeModel", "ModelShape", "StepWork", "kv_bytes_per_token", "load_model"]


class ComputeModel:
    """Step times for ``shape`` on ``profile.gpu``; constants folded at construction."""

    __slots__ = ("shape", "profile", "_dense", "_attn", "_kv", "_weights", "_flops", "_bw",
                 "_overhead", "_active_w", "_swa", "_swkv", "_window", "_state", "_dec_extra")

    def __init__(self, shape: ModelShape, profile: HardwareProfile):
        self.shape = shape
        self.profile = profile
        g = profile.gpu
        tp = shape.tp
        heads = shape.heads // tp
        self._dense = 2.0 * shape.active / tp                           # FLOPs per token
        self._attn = 4.0 * shape.full_layers * heads * shape.head_dim
        self._dec_extra = 0.0  # what a decode's attention costs beyond a prefill's, a pair
        if shape.kv_lora_rank:
            # MLA: prefill as multi-head attention over up-projected K and V (scores over
            # nope + RoPE dims, values over v_head_dim); decode absorbed (scores over the
            # latent + RoPE key, values over the latent)
            pf = 2.0 * shape.full_layers * heads * (shape.head_dim + (shape.v_head_dim or shape.head_dim))
            dec = 2.0 * shape.full_layers * heads * (2 * shape.kv_lora_rank + shape.qk_rope_head_dim)
            self._attn, self._dec_extra = pf, dec - pf
        self._swa = 4.0 * shape.sliding_layers * heads * shape.head_dim
        self._window = float(shape.window)
        # sliding layers read their window (a model of sliding layers only too: it keeps
        # the whole context in its pages, but attends within the window)
        self._kv = float(shape.full_kv_bytes_per_token)
        self._swkv = float(shape.sliding_kv_bytes_per_token)
        self._state = float(shape.recurrent_state_bytes)
        self._weights = float(shape.weight_bytes_per_gpu)
        self._active_w = self._weights * (shape.active / shape.params)
        self._flops = g.flops_bf16 * g.prefill_efficiency
        self._bw = g.hbm * g.decode_efficiency
        self._overhead = g.step_overhead

    def _sliding(self, new: int, before: int) -> tuple[float, float]:
        """A prefill chunk's sliding-layer attention (token-context pairs) and the context
        it reads, each token's context capped at the window."""
        w = self._window
        a, b = float(before), float(before + new)
        if b <= w:
            pairs = new * (a + new * 0.5)
        elif a >= w:
            pairs = new * w
        else:
            pairs = (w - a) * (a + (w - a) * 0.5) + (b - w) * w
        return pairs, (b if b < w else w)

    def _parts(self, prefill: Sequence[tuple[int, int]], n_decode: int,
               decode_context_sum: int) -> tuple[int, float, float, float]:
        """(tokens, attention FLOPs, weight bytes, KV bytes) of a step."""
        tokens = 0
        attn = 0.0
        ctx = 0
        swa = 0.0
        swctx = 0.0
        sliding = self._swkv > 0.0
        for new, before in prefill:
            tokens += new
            attn += new * (before + new * 0.5)
            ctx += before + new
            if sliding:
                p, c = self._sliding(new, before)
                swa += p
                swctx += c
        tokens += n_decode
        attn += decode_context_sum
        ctx += decode_context_sum
        if sliding:
            cap = n_decode * self._window
            d = decode_context_sum if decode_context_sum < cap else cap
            swa += d
            swctx += d
        weights = self._active_w * tokens
        if weights > self._weights:
            weights = self._weights
        kv = self._kv * ctx + self._swkv * swctx + self._state * (len(prefill) + n_decode)
        return (tokens, self._attn * attn + self._dec_extra * decode_context_sum + self._swa * swa,
                weights, kv)

    def step_time(self, prefill: Sequence[tuple[int, int]], decode_contexts: Sequence[int]) -> float:
        """Seconds for one step: ``prefill`` holds (new_tokens, context_before) per prefill
        chunk; ``decode_contexts`` the context length of each decoding request."""
        return self.step_time_sum(prefill, len(decode_contexts), sum(decode_contexts))

    def step_time_sum(self, prefill: Sequence[tuple[int, int]], n_decode: int,
                      decode_context_sum: int) -> float:
        """``step_time`` with the decodes given as their count and summed context: a step's
        cost depends on nothing else of them, and the engine keeps both as running sums."""
        return self.step_work(prefill, n_decode, decode_context_sum).seconds

    def decode_step_time(self, n_decode: int, decode_context_sum: int) -> float:
        """``step_time_sum((), n_decode, decode_context_sum)``, the very same float, for a
        step of decodes only (the engine runs long stretches of them ahead of the clock)."""
        if not n_decode:
            return 0.0
        ctx = decode_context_sum
        swa = 0.0
        swctx = 0.0
        if self._swkv > 0.0:
            cap = n_decode * self._window
            swa = swctx = ctx if ctx < cap else cap
        weights = self._active_w * n_decode
        if weights > self._weights:
            weights = self._weights
        kv = self._kv * ctx + self._swkv * swctx + self._state * n_decode
        at = self._attn * (0.0 + ctx) + self._dec_extra * ctx + self._swa * swa
        compute = (self._dense * n_decode + at) / self._flops
        memory = (weights + kv) / self._bw
        return (memory if memory > compute else compute) + self._overhead  # max(), inline

    def step_work(self, prefill: Sequence[tuple[int, int]], n_decode: int,
                  decode_context_sum: int) -> StepWork:
        """``step_time_sum``'s step as a ``StepWork``: its ``seconds`` the very same float,
        beside the FLOPs, bytes, tokens and roofline times it came from."""
        tokens, at, weights, kv = self._parts(prefill, n_decode, decode_context_sum)
        if not tokens:
            return EMPTY
        dense = self._dense * tokens
        compute, memory = (dense + at) / self._flops, (weights + kv) / self._bw
        return StepWork((memory if memory > compute else compute) + self._overhead, dense, at,
                        weights, kv, tokens - n_decode, n_decode, compute, memory)

    def decode_work(self, n_decode: int, decode_context_sum: int) -> StepWork:
        """``decode_step_time``'s step as a ``StepWork`` (its ``seconds`` the same float)."""
        return self.step_work((), n_decode, decode_context_sum)

    def prefill_time(self, new_tokens: int, context_before: int = 0) -> float:
        return self.step_time(((new_tokens, context_before),), ())

    def decode_time(self, contexts: Sequence[int]) -> float:
        return self.step_time((), contexts)
