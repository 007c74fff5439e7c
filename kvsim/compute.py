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
``step_time`` is plain float arithmetic: it runs once per engine step.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvsim.hardware import HardwareProfile, load_yaml_model

PosInt = Annotated[int, Field(gt=0)]


class ModelShape(BaseModel):
    """A decoder-only transformer's shape, as far as time and KV size go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    layers: PosInt
    hidden: PosInt
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt
    dtype_bytes: PosInt = 2
    params: Annotated[float, Field(gt=0)]
    tp: PosInt = 1
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> "ModelShape":
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide heads ({self.heads})")
        return self

    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads a GPU holds (replicated when tp exceeds kv_heads)."""
        return math.ceil(self.kv_heads / self.tp)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token, all layers, on one GPU."""
        return 2 * self.layers * self.kv_heads_per_gpu * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes_per_gpu(self) -> int:
        return int(self.params * self.dtype_bytes / self.tp)


def kv_bytes_per_token(shape: ModelShape) -> int:
    return shape.kv_bytes_per_token


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

    def prefill_time(self, new_tokens: int, context_before: int = 0) -> float:
        return self.step_time(((new_tokens, context_before),), ())

    def decode_time(self, contexts: Sequence[int]) -> float:
        return self.step_time((), contexts)


def load_model(path_or_name: str | Path, tp: int | None = None) -> ModelShape:
    """A model shape from a YAML path or a preset name under configs/models/ (e.g.
    ``'llama-3-70b'``); ``tp`` overrides the file's tensor-parallel degree."""
    shape = load_yaml_model(ModelShape, path_or_name, "models")
    if tp is not None:
        shape = ModelShape.model_validate({**shape.model_dump(), "tp": tp})
    return shape
