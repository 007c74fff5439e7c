"""A model's shape, as far as step time and KV size go: the ``ModelShape`` schema of the
YAML files under configs/models/ (validated, immutable) and ``load_model`` to read one.
``kvsim.engine.compute`` turns a shape and a GPU profile into step times.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvsim.config.hardware import load_yaml_model

__all__ = ["ModelShape", "kv_bytes_per_token", "load_model"]

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
    # the MLP's width (config.json's intermediate_size); None: from params, as what is left
    # of a layer's share of them after its attention projections, over 3 x hidden
    intermediate: PosInt | None = None
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

    @property
    def intermediate_size(self) -> int:
        """The MLP's width: ``intermediate``, else derived from ``params`` (a layer's share
        less its attention projections, over gate, up and down, rounded to 256; the share
        holds the embeddings too, so this errs large for small models)."""
        if self.intermediate is not None:
            return self.intermediate
        attn = self.hidden * (2 * self.heads + 2 * self.kv_heads) * self.head_dim
        mlp = self.params / self.layers - attn
        return max(256, int(round(mlp / (3 * self.hidden) / 256)) * 256)

    def projections_per_gpu(self) -> tuple[tuple[int, int], ...]:
        """One layer's projection GEMMs on one GPU as (K, N): QKV, the attention output,
        gate and up (one GEMM), down; tensor parallel splits heads and the MLP's width
        (KV heads replicated where ``tp`` exceeds them)."""
        tp = self.tp
        q = self.heads // tp * self.head_dim
        qkv = q + 2 * self.kv_heads_per_gpu * self.head_dim
        ffn = max(1, self.intermediate_size // tp)
        return ((self.hidden, qkv), (q, self.hidden), (self.hidden, 2 * ffn), (ffn, self.hidden))


def kv_bytes_per_token(shape: ModelShape) -> int:
    return shape.kv_bytes_per_token


def load_model(path_or_name: str | Path, tp: int | None = None) -> ModelShape:
    """A model shape from a YAML path or a preset name under configs/models/ (e.g.
    ``'llama-3-70b'``); ``tp`` overrides the file's tensor-parallel degree."""
    shape = load_yaml_model(ModelShape, path_or_name, "models")
    if tp is not None:
        shape = ModelShape.model_validate({**shape.model_dump(), "tp": tp})
    return shape
