"""A model's shape, as far as step time and KV size go: the ``ModelShape`` schema of the
model files under configs/models/ (validated, immutable). ``kvsim.config.hfmodel`` reads
one (``load_model``), deriving it from a Hugging Face ``config.json`` where given one;
``kvsim.engine.compute`` turns a shape and a GPU profile into step times.

Layer kinds (docs/models.md): of ``layers``, ``attn_layers`` keep KV for the whole
context (GQA heads, or MLA's compressed latent when ``kv_lora_rank`` is set),
``sliding_layers`` keep KV for their last ``window`` tokens, ``recurrent_layers`` keep a
fixed state per request (``recurrent_state`` elements a layer). A page holds one block's
KV of the layers that keep it for the whole context (``page_bytes_per_token``); the
sliding layers' window and the recurrent state are a fixed amount per request
(``state_bytes``), held on GPU while the request runs.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["KV_DTYPES", "ModelShape", "kv_bytes_per_token"]

PosInt = Annotated[int, Field(gt=0)]
NonNeg = Annotated[int, Field(ge=0)]
KvDtype = Literal["bf16", "fp16", "fp8", "fp4"]
# bits an element of the KV cache takes (fp8 and fp4 scales left out: docs/models.md)
KV_DTYPES: dict[str, int] = {"bf16": 16, "fp16": 16, "fp8": 8, "fp4": 4}


class ModelShape(BaseModel):
    """A decoder-only model's shape, as far as time and KV size go."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    layers: PosInt
    hidden: PosInt
    heads: PosInt
    kv_heads: PosInt
    head_dim: PosInt
    dtype_bytes: PosInt = 2
    # at most 1e15 (the largest published models have about 2e12): a step's time grows with
    # them, and one of 1e44 parameters overflowed the engine's clock
    params: Annotated[float, Field(gt=0, le=1e15)]
    tp: PosInt = 1
    # the MLP's width (config.json's intermediate_size; an MoE's: the width a token
    # computes, its experts' and shared experts' together); None: from params, as what is
    # left of a layer's share of them after its attention projections, over 3 x hidden
    intermediate: PosInt | None = None
    notes: str = ""
    # -- layer kinds (docs/models.md); the defaults are a dense GQA model ----------------
    arch: str = ""                       # the Hugging Face architecture it came from
    source: str = ""                     # where its figures come from (URL, revision)
    kv_dtype: Optional[KvDtype] = None   # None: 2-byte dtype_bytes -> bf16, 1 -> fp8
    attn_layers: Optional[NonNeg] = None  # full-context attention layers (None: all)
    sliding_layers: NonNeg = 0
    window: NonNeg = 0                   # tokens a sliding layer keeps
    recurrent_layers: NonNeg = 0
    recurrent_state: NonNeg = 0          # elements of state a recurrent layer keeps
    kv_lora_rank: NonNeg = 0             # MLA: the latent kept a token a layer ...
    qk_rope_head_dim: NonNeg = 0         # ... beside its decoupled RoPE key
    v_head_dim: NonNeg = 0               # MLA: a value head's size (0: head_dim)
    active_params: Annotated[float, Field(gt=0)] | None = None  # None: params (dense)
    weight_bytes_per_param: Annotated[float, Field(gt=0)] | None = None  # None: dtype_bytes

    @model_validator(mode="after")
    def _check(self) -> "ModelShape":
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide heads ({self.heads})")
        kinds = self.full_layers + self.sliding_layers + self.recurrent_layers
        if kinds != self.layers:
            raise ValueError(f"attn_layers ({self.full_layers}) + sliding_layers ({self.sliding_layers}) "
                             f"+ recurrent_layers ({self.recurrent_layers}) must equal layers ({self.layers})")
        if self.sliding_layers and not self.window:
            raise ValueError("sliding_layers need a window (tokens a sliding layer keeps)")
        if self.recurrent_layers and not self.recurrent_state:
            raise ValueError("recurrent_layers need recurrent_state (elements a layer keeps)")
        if self.full_layers + self.sliding_layers == 0:
            raise ValueError("a model needs at least one attention layer (attn_layers or sliding_layers)")
        if self.active_params is not None and self.active_params > self.params:
            raise ValueError(f"active_params ({self.active_params:.4g}) exceed params ({self.params:.4g})")
        return self

    # -- kinds ---------------------------------------------------------------------------
    @property
    def full_layers(self) -> int:
        """Layers that keep KV for the whole context."""
        if self.attn_layers is None:
            return self.layers - self.sliding_layers - self.recurrent_layers
        return self.attn_layers

    @property
    def kv_bits(self) -> int:
        """Bits an element of the KV cache takes."""
        if self.kv_dtype is None:
            return 8 if self.dtype_bytes == 1 else 16
        return KV_DTYPES[self.kv_dtype]

    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads a GPU holds (replicated when tp exceeds kv_heads)."""
        return math.ceil(self.kv_heads / self.tp)

    def _bytes(self, elements: int) -> int:
        return -(-elements * self.kv_bits // 8)

    @property
    def full_layer_kv_elements(self) -> int:
        """Elements of KV one token keeps in one full-context layer on one GPU: K and V of
        its KV heads, or MLA's latent plus RoPE key (replicated on every GPU of a tp group)."""
        if self.kv_lora_rank:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_heads_per_gpu * self.head_dim

    @property
    def full_kv_bytes_per_token(self) -> int:
        """A token's KV in the full-context layers, on one GPU."""
        return self._bytes(self.full_layers * self.full_layer_kv_elements)

    @property
    def sliding_kv_bytes_per_token(self) -> int:
        """A token's KV in the sliding-window layers (while within their window), one GPU."""
        return self._bytes(self.sliding_layers * 2 * self.kv_heads_per_gpu * self.head_dim)

    @property
    def kv_bytes_per_token(self) -> int:
        """A token's KV in every layer that keeps it (full-context and sliding), one GPU."""
        return self.full_kv_bytes_per_token + self.sliding_kv_bytes_per_token

    @property
    def page_bytes_per_token(self) -> int:
        """What a token adds to a page: its KV in the full-context layers. A model of
        sliding layers only keeps theirs for the whole context (docs/models.md)."""
        return self.full_kv_bytes_per_token if self.full_layers else self.sliding_kv_bytes_per_token

    @property
    def windowed(self) -> bool:
        """Sliding layers beside full-context ones: their KV is a per-request window."""
        return bool(self.sliding_layers and self.full_layers)

    @property
    def recurrent_state_bytes(self) -> int:
        """The recurrent layers' state of one request on one GPU (split over tp)."""
        n = self.recurrent_layers * self.recurrent_state * self.dtype_bytes
        return -(-n // self.tp)

    def window_tokens(self, tokens_per_block: int) -> int:
        """Tokens a sliding layer's window spans in whole blocks: the window can start
        inside a block, so ceil(window / block) + 1 blocks (0 when not windowed)."""
        if not self.windowed:
            return 0
        return (-(-self.window // tokens_per_block) + 1) * tokens_per_block

    def state_bytes(self, tokens_per_block: int) -> int:
        """Bytes a running request keeps on GPU beside its pages: the sliding layers'
        window (whole blocks) and the recurrent state."""
        return (self.window_tokens(tokens_per_block) * self.sliding_kv_bytes_per_token
                + self.recurrent_state_bytes)

    def derived(self, tokens_per_block: int) -> dict:
        """What kvsim derived of the shape, for a run's summary (one GPU, bytes)."""
        return {"name": self.name, "arch": self.arch, "tp": self.tp, "kv_bits": self.kv_bits,
                "layers": {"full": self.full_layers, "sliding": self.sliding_layers,
                           "recurrent": self.recurrent_layers},
                "window": self.window, "page_bytes_per_token": self.page_bytes_per_token,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "state_bytes": self.state_bytes(tokens_per_block),
                "params": self.params, "active_params": self.active}

    # -- weights and compute -------------------------------------------------------------
    @property
    def active(self) -> float:
        """Parameters a token computes with (an MoE's routed and shared experts)."""
        return self.params if self.active_params is None else self.active_params

    @property
    def weight_bytes_per_gpu(self) -> int:
        per = self.dtype_bytes if self.weight_bytes_per_param is None else self.weight_bytes_per_param
        return int(self.params * per / self.tp)

    @property
    def intermediate_size(self) -> int:
        """The MLP's width: ``intermediate``, else derived from ``params`` (a layer's share
        less its attention projections, over gate, up and down, rounded to 256; the share
        holds the embeddings too, so this errs large for small models)."""
        if self.intermediate is not None:
            return self.intermediate
        attn = self.hidden * (2 * self.heads + 2 * self.kv_heads) * self.head_dim
        mlp = self.active / self.layers - attn
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
