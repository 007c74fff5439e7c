"""The compute model: how long one engine step takes for a model shape on a GPU profile.

A step is a roofline over the whole batch (prefill chunks and decode tokens run in the
same kernels, sharing one read of the weights):

    flops = sum over tokens of 2 * params / tp                       (dense layers)
          + sum over requests of 4 * layers * heads/tp * head_dim * new * (ctx + new/2)
    bytes = weights once (params * dtype_bytes / tp)
          + KV read: kv_bytes_per_token * (context every request attends to)
    step  = max(flops / (flops_bf16 * prefill_efficiency),
                bytes / (hbm * decode_efficiency)) + step_overhead

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

from kvsim.config.modelshape import ModelShape, kv_bytes_per_token, load_model
from kvsim.core.datapath.work import EMPTY, StepWork

if TYPE_CHECKING:
    from kvsim.config.hardware import HardwareProfile

__all__ = ["ComputeModel", "ModelShape", "StepWork", "kv_bytes_per_token", "load_model"]


class ComputeModel:
    """Step times for ``shape`` on ``profile.gpu``; constants folded at construction."""

    __slots__ = ("shape", "profile", "_dense", "_attn", "_kv", "_weights", "_flops", "_bw",
                 "_overhead")

    def __init__(self, shape: ModelShape, profile: HardwareProfile):
        self.shape = shape
        self.profile = profile
        g = profile.gpu
        self._dense = 2.0 * shape.params / shape.tp                     # FLOPs per token
        self._attn = 4.0 * shape.layers * (shape.heads // shape.tp) * shape.head_dim
        self._kv = float(shape.kv_bytes_per_token)
        self._weights = float(shape.weight_bytes_per_gpu)
        self._flops = g.flops_bf16 * g.prefill_efficiency
        self._bw = g.hbm * g.decode_efficiency
        self._overhead = g.step_overhead

    def step_time(self, prefill: Sequence[tuple[int, int]], decode_contexts: Sequence[int]) -> float:
        """Seconds for one step: ``prefill`` holds (new_tokens, context_before) per prefill
        chunk; ``decode_contexts`` the context length of each decoding request."""
        return self.step_time_sum(prefill, len(decode_contexts), sum(decode_contexts))

    def step_time_sum(self, prefill: Sequence[tuple[int, int]], n_decode: int,
                      decode_context_sum: int) -> float:
        """``step_time`` with the decodes given as their count and summed context: a step's
        cost depends on nothing else of them, and the engine keeps both as running sums."""
        tokens = 0
        attn = 0.0
        ctx = 0
        for new, before in prefill:
            tokens += new
            attn += new * (before + new * 0.5)
            ctx += before + new
        if not tokens and not n_decode:
            return 0.0
        tokens += n_decode
        attn += decode_context_sum
        ctx += decode_context_sum
        flops = self._dense * tokens + self._attn * attn
        nbytes = self._weights + self._kv * ctx
        compute, memory = flops / self._flops, nbytes / self._bw
        return (memory if memory > compute else compute) + self._overhead  # max(), inline

    def decode_step_time(self, n_decode: int, decode_context_sum: int) -> float:
        """``step_time_sum((), n_decode, decode_context_sum)``, the very same float, for a
        step of decodes only (the engine runs long stretches of them ahead of the clock)."""
        if not n_decode:
            return 0.0
        flops = self._dense * n_decode + self._attn * (0.0 + decode_context_sum)
        nbytes = self._weights + self._kv * decode_context_sum
        compute, memory = flops / self._flops, nbytes / self._bw
        return (memory if memory > compute else compute) + self._overhead  # max(), inline

    def step_work(self, prefill: Sequence[tuple[int, int]], n_decode: int,
                  decode_context_sum: int) -> StepWork:
        """``step_time_sum``'s step as a ``StepWork``: its ``seconds`` the very same float,
        beside the FLOPs, bytes, tokens and roofline times it came from."""
        tokens = 0
        attn = 0.0
        ctx = 0
        for new, before in prefill:
            tokens += new
            attn += new * (before + new * 0.5)
            ctx += before + new
        if not tokens and not n_decode:
            return EMPTY
        prefill_tokens = tokens
        tokens += n_decode
        attn += decode_context_sum
        ctx += decode_context_sum
        dense = self._dense * tokens
        at = self._attn * attn
        kv = self._kv * ctx
        compute, memory = (dense + at) / self._flops, (self._weights + kv) / self._bw
        return StepWork((memory if memory > compute else compute) + self._overhead, dense, at,
                        self._weights, kv, prefill_tokens, n_decode, compute, memory)

    def decode_work(self, n_decode: int, decode_context_sum: int) -> StepWork:
        """``decode_step_time``'s step as a ``StepWork`` (its ``seconds`` the same float)."""
        if not n_decode:
            return EMPTY
        dense = self._dense * n_decode
        at = self._attn * (0.0 + decode_context_sum)
        kv = self._kv * decode_context_sum
        compute, memory = (dense + at) / self._flops, (self._weights + kv) / self._bw
        return StepWork((memory if memory > compute else compute) + self._overhead, dense, at,
                        self._weights, kv, 0, n_decode, compute, memory)

    def prefill_time(self, new_tokens: int, context_before: int = 0) -> float:
        return self.step_time(((new_tokens, context_before),), ())

    def decode_time(self, contexts: Sequence[int]) -> float:
        return self.step_time((), contexts)
