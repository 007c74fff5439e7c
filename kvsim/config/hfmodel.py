"""A model's shape from its Hugging Face ``config.json`` (no network, no weights).

``read_model`` takes what ``model:`` names: a preset under configs/models/ (a kvsim YAML,
either the older flat schema or an ``hf_config:`` mapping of the config.json fields with
its source named), a kvsim YAML path, a ``config.json`` path, or a folder holding one.
``shape_from_hf`` derives the shape of each supported architecture family:

- dense GQA (Llama, Qwen2/3, Mistral: ``sliding_window`` on every layer when set);
- MoE (Mixtral, Qwen2/3-MoE, gpt-oss): active parameters = routed top-k + shared
  experts + everything else; total = all experts;
- MLA (DeepSeek-V2/V3): ``kv_lora_rank + qk_rope_head_dim`` elements a token a layer;
- sliding window beside full attention (Gemma 2/3, gpt-oss): ``layer_types`` when given,
  else the family's pattern (``sliding_window_pattern``);
- hybrid (Jamba, Nemotron-H, Qwen3-Next): only attention layers keep KV; recurrent layers
  keep a fixed state per request (Mamba: conv + SSM state; Gated DeltaNet: conv +
  per-head key x value state).

Parameter counts are the weight matrices' (embeddings, attention, MLP/experts, recurrent
mixers; norms and biases left out); the active ones leave out an untied input embedding
(a lookup, no FLOPs), as DeepSeek's and OpenAI's published active counts do.
docs/models.md checks them against published figures.
Bad input raises ``ValueError`` naming the file and the field.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kvsim.config.hardware import CONFIG_DIR, load_yaml_model
from kvsim.config.modelshape import KV_DTYPES, ModelShape
from kvsim.config.yamlfile import read_strict

__all__ = ["ARCHITECTURES", "load_model", "read_model", "shape_from_hf"]

# architecture (config.json's ``architectures[0]``) -> family
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "dense", "MistralForCausalLM": "dense", "Qwen2ForCausalLM": "dense",
    "Qwen3ForCausalLM": "dense", "MixtralForCausalLM": "moe", "Qwen2MoeForCausalLM": "moe",
    "Qwen3MoeForCausalLM": "moe", "GptOssForCausalLM": "gpt_oss",
    "DeepseekV2ForCausalLM": "mla", "DeepseekV3ForCausalLM": "mla",
    "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3", "JambaForCausalLM": "jamba",
    "NemotronHForCausalLM": "nemotron_h", "Qwen3NextForCausalLM": "qwen3_next",
}
_WRAPPER_KEYS = {"name", "source", "revision", "licence", "notes", "tp", "kv_dtype", "hf_config"}
MAX_LAYERS = 100_000   # (published models have under 200)
_KINDS = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "recurrent",
          "mamba": "recurrent", "attention": "full"}


def _resolve(path_or_name: str | Path) -> Path:
    p = Path(path_or_name).expanduser()
    if p.suffix in (".yaml", ".yml", ".json") or p.exists() or len(p.parts) > 1:
        return p
    return CONFIG_DIR / "models" / f"{path_or_name}.yaml"


def load_model(path_or_name: str | Path, tp: int | None = None,
               kv_dtype: str | None = None) -> ModelShape:
    """A model shape from what ``model:`` names (``read_model``); ``tp`` and ``kv_dtype``
    override the file's."""
    shape = read_model(path_or_name)
    over: dict = {}
    if tp is not None:
        over["tp"] = tp
    if kv_dtype is not None:
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: unknown KV precision {kv_dtype!r}; expected one of "
                             f"{', '.join(KV_DTYPES)}")
        over["kv_dtype"] = kv_dtype
    if over:
        shape = ModelShape.model_validate({**shape.model_dump(), **over})
    return shape


def model_file(path_or_name: str | Path) -> Path:
    """The file ``model:`` names: a preset's YAML under configs/, a YAML or config.json as it
    is, a folder's config.json."""
    path = _resolve(path_or_name)
    return path / "config.json" if path.is_dir() else path


def read_model(path_or_name: str | Path) -> ModelShape:
    """The shape ``model:`` names (see the module's docstring)."""
    path = _resolve(path_or_name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path}: a folder without a config.json (expected a Hugging Face "
                             f"model folder, a config.json or a kvsim model YAML)")
        path = path / "config.json"
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except OSError as e:
            raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object at the top")
        return shape_from_hf(data, str(path), name=path.parent.name)
    if path.is_file():
        data = read_strict(path, ValueError)
        if isinstance(data, dict) and "hf_config" in data:
            return _from_wrapper(data, path)
    return load_yaml_model(ModelShape, path, "models")


def _from_wrapper(data: dict, path: Path) -> ModelShape:
    extra = sorted(set(data) - _WRAPPER_KEYS)
    if extra:
        raise ValueError(f"{path}: unknown key(s) {', '.join(extra)}; a model file with hf_config "
                         f"takes {', '.join(sorted(_WRAPPER_KEYS))}")
    hf = data["hf_config"]
    if not isinstance(hf, dict):
        raise ValueError(f"{path}: hf_config: expected a mapping of config.json's fields")
    src = " @ ".join(str(data[k]) for k in ("source", "revision") if data.get(k))
    over = {k: data[k] for k in ("tp", "kv_dtype", "notes") if k in data}
    return shape_from_hf(hf, str(path), name=str(data.get("name", path.stem)), source=src, **over)


class _Cfg:
    """A config.json's fields, read with the file and field named on failure."""

    def __init__(self, data: dict, where: str, arch: str):
        self.d, self.where, self.arch = data, where, arch

    def need(self, key: str) -> Any:
        v = self.d.get(key)
        if v is None:
            raise ValueError(f"{self.where}: missing field {key!r} (a {self.arch} config needs it)")
        return v

    def int(self, key: str, default: int | None = None) -> int:
        v = self.d.get(key, default) if default is not None else self.need(key)
        if v is None:
            v = default
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{self.where}: {key}: expected a whole number >= 0, got {v!r}")
        return v

    def pos(self, key: str, default: builtins.int | None = None) -> builtins.int:
        """A whole number >= 1 (a period, an interval: each layer's kind is taken modulo it)."""
        v = self.int(key, default)
        if v < 1:
            raise ValueError(f"{self.where}: {key}: expected a whole number >= 1, got {v!r}")
        return v

    def get(self, key: str, default: Any = None) -> Any:
        v = self.d.get(key)
        return default if v is None else v

    def layer_list(self, key: str, n_layers: builtins.int) -> list[builtins.int]:
        """A list of layer indices (``mlp_only_layers``); absent: none."""
        v = self.get(key, [])
        if not isinstance(v, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
            raise ValueError(f"{self.where}: {key}: expected a list of layer indices "
                             f"(0 to {n_layers - 1}), got {v!r}")
        return v


def shape_from_hf(data: dict, where: str, name: str = "", source: str = "",
                  **over: Any) -> ModelShape:
    """The ``ModelShape`` of a config.json's fields ``data`` (``where``: its file, for
    messages); ``over``: kvsim's own settings (tp, kv_dtype, notes)."""
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch is None:
        what = "missing field 'architectures'" if archs is None else \
            f"architectures: expected a list of names, got {archs!r}"
        raise ValueError(f"{where}: {what} (supported: {', '.join(ARCHITECTURES)})")
    fam = ARCHITECTURES.get(arch)
    if fam is None:
        raise ValueError(f"{where}: architectures: {arch!r} is not supported; kvsim reads "
                         f"{', '.join(ARCHITECTURES)}")
    text = data.get("text_config")
    c = _Cfg({**data, **text} if isinstance(text, dict) else data, where, arch)
    L, hidden, heads = c.int("num_hidden_layers"), c.int("hidden_size"), c.int("num_attention_heads")
    if L > MAX_LAYERS:  # (each layer's kind is listed: 1e30 layers overflowed, 1e9 took minutes)
        raise ValueError(f"{where}: num_hidden_layers: expected at most {MAX_LAYERS:,}, got {L:,}")
    kv = c.int("num_key_value_heads", heads)
    hd = c.int("head_dim", hidden // heads) if heads else 0
    kinds = _layer_kinds(c, fam, L)
    f = dict(name=name, arch=arch, source=source, hidden=hidden, heads=heads, kv_heads=kv,
             head_dim=hd)
    state = 0
    if fam == "mla":
        rank, rope = c.int("kv_lora_rank"), c.int("qk_rope_head_dim")
        f.update(kv_lora_rank=rank, qk_rope_head_dim=rope, kv_heads=heads,
                 head_dim=c.int("qk_nope_head_dim") + rope, v_head_dim=c.int("v_head_dim"))
    if "recurrent" in kinds:
        state = _state_elements(c, fam, hidden)
    attn_p = _attn_params(c, fam, hidden, heads, kv, hd)
    rec_p = _recurrent_params(c, fam, hidden) if state else 0
    mlp_total, mlp_active, width, expert_p = _mlp_params(c, fam, hidden, kinds)
    tie = bool(c.get("tie_word_embeddings", fam.startswith("gemma")))
    vocab = c.int("vocab_size") * hidden
    emb = vocab * (1 if tie else 2)
    n_attn = sum(k != "recurrent" and k != "mlp" for k in kinds)
    n_rec = kinds.count("recurrent")
    rest = emb + n_attn * attn_p + n_rec * rec_p
    # active: what a token multiplies by; an untied input embedding is a lookup, not counted
    total, active = rest + mlp_total, rest + mlp_active - (0 if tie else vocab)
    f.update(layers=n_attn + n_rec, params=float(total), intermediate=max(1, width),
             attn_layers=kinds.count("full"), sliding_layers=kinds.count("sliding"),
             window=c.int("sliding_window") if "sliding" in kinds else 0,
             recurrent_layers=n_rec, recurrent_state=state)
    if active < total:
        f["active_params"] = float(active)
    q = c.get("quantization_config")
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method == "fp8":
        f.update(weight_bytes_per_param=1.0)
    elif method == "mxfp4":  # experts in 4-bit blocks of 32 with an 8-bit scale; the rest bf16
        f.update(weight_bytes_per_param=(expert_p * 4.25 / 8 + (total - expert_p) * 2) / total)
    f.update(over)
    try:
        return ModelShape.model_validate(f)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(x) for x in err["loc"])
            got = f" (got {err.get('input')!r})" if key else ""
            lines.append(f"{where}: {key or 'derived shape'}: {err['msg']}{got}")
        raise ValueError("\n".join(lines)) from None


def _layer_kinds(c: _Cfg, fam: str, L: int) -> list[str]:
    """Each layer's kind: full, sliding, recurrent (or mlp: Nemotron-H's MLP-only layers)."""
    types = c.get("layer_types")
    if fam == "jamba":
        period, off = c.pos("attn_layer_period"), c.int("attn_layer_offset")
        return ["full" if i % period == off else "recurrent" for i in range(L)]
    if fam == "nemotron_h":
        pat = str(c.need("hybrid_override_pattern"))
        kinds = {"M": "recurrent", "*": "full", "-": "mlp", "E": "mlp"}
        bad = sorted(set(pat) - set(kinds))
        if bad or len(pat) != L:
            raise ValueError(f"{c.where}: hybrid_override_pattern: expected {L} of M, *, -, E; got {pat!r}")
        return [kinds[ch] for ch in pat]
    if types is not None:
        if not isinstance(types, list) or len(types) != L or any(t not in _KINDS for t in types):
            raise ValueError(f"{c.where}: layer_types: expected {L} of {', '.join(_KINDS)}")
        return [_KINDS[t] for t in types]
    if fam == "qwen3_next":
        n = c.pos("full_attention_interval")
        return ["full" if (i + 1) % n == 0 else "recurrent" for i in range(L)]
    if fam in ("gemma2", "gemma3", "gpt_oss"):
        n = c.int("sliding_window_pattern", 6 if fam == "gemma3" else 2)
        return ["full" if n and (i + 1) % n == 0 else "sliding" for i in range(L)]
    if c.get("sliding_window") is not None:
        if c.arch.startswith("Qwen"):  # Qwen2/3: only with use_sliding_window, from a layer on
            if c.get("use_sliding_window", False):
                first = c.int("max_window_layers", 0)
                return ["sliding" if i >= first else "full" for i in range(L)]
        elif fam in ("dense", "moe"):  # Mistral, Mixtral: every layer
            return ["sliding"] * L
    return ["full"] * L


def _state_elements(c: _Cfg, fam: str, hidden: int) -> int:
    """Elements of state one recurrent layer keeps for a request."""
    if fam == "jamba":  # Mamba: conv (d_conv - 1) x d_inner, SSM d_inner x d_state
        d_inner = c.int("mamba_expand") * hidden
        return (c.int("mamba_d_conv") - 1) * d_inner + d_inner * c.int("mamba_d_state")
    if fam == "nemotron_h":  # Mamba-2: conv over x, B, C; SSM heads x head_dim x d_state
        d_inner = c.int("mamba_num_heads") * c.int("mamba_head_dim")
        n = c.int("ssm_state_size")
        conv = d_inner + 2 * c.int("n_groups") * n
        return (c.int("conv_kernel") - 1) * conv + d_inner * n
    # Gated DeltaNet (Qwen3-Next): conv over q, k, v; a key x value state per value head
    dk, dv = c.int("linear_key_head_dim"), c.int("linear_value_head_dim")
    nk, nv = c.int("linear_num_key_heads"), c.int("linear_num_value_heads")
    return (c.int("linear_conv_kernel_dim") - 1) * (2 * nk * dk + nv * dv) + nv * dk * dv


def _attn_params(c: _Cfg, fam: str, hidden: int, heads: int, kv: int, hd: int) -> int:
    if fam == "mla":
        nope, rope, vd = c.int("qk_nope_head_dim"), c.int("qk_rope_head_dim"), c.int("v_head_dim")
        rank, qr = c.int("kv_lora_rank"), c.int("q_lora_rank", 0)
        q = hidden * qr + qr * heads * (nope + rope) if qr else hidden * heads * (nope + rope)
        return q + hidden * (rank + rope) + rank * heads * (nope + vd) + heads * vd * hidden
    gate = heads * hd * hidden if fam == "qwen3_next" else 0  # its gated attention output
    return hidden * hd * (heads + 2 * kv) + heads * hd * hidden + gate


def _recurrent_params(c: _Cfg, fam: str, hidden: int) -> int:
    if fam == "jamba":
        d_in, n, r = c.int("mamba_expand") * hidden, c.int("mamba_d_state"), c.int("mamba_dt_rank")
        return (hidden * 2 * d_in + d_in * c.int("mamba_d_conv") + d_in * (r + 2 * n)
                + r * d_in + d_in * n + d_in * hidden)
    if fam == "nemotron_h":
        h = c.int("mamba_num_heads")
        d_in, n, g = h * c.int("mamba_head_dim"), c.int("ssm_state_size"), c.int("n_groups")
        conv = d_in + 2 * g * n
        return hidden * (2 * d_in + 2 * g * n + h) + conv * c.int("conv_kernel") + d_in * hidden
    dk, dv = c.int("linear_key_head_dim"), c.int("linear_value_head_dim")
    nk, nv = c.int("linear_num_key_heads"), c.int("linear_num_value_heads")
    key, val = nk * dk, nv * dv
    return (hidden * (2 * key + 2 * val) + hidden * 2 * nv
            + (2 * key + val) * c.int("linear_conv_kernel_dim") + val * hidden)


def _mlp_params(c: _Cfg, fam: str, hidden: int, kinds: list[str]) -> tuple[int, int, int, int]:
    """(total, active) MLP parameters over all layers, the MLP width a token computes in a
    layer (an MoE layer's where there is one), and the routed experts' parameters."""
    L = len(kinds)
    mats = 2 if fam == "nemotron_h" else 3  # Nemotron-H's MLP is not gated
    dense_w = c.int("intermediate_size")
    moe = [False] * L
    E = k = 0
    expert_w = shared_w = 0
    if fam in ("moe", "gpt_oss"):
        E = c.int("num_local_experts") if "num_local_experts" in c.d else c.int("num_experts")
        k = c.int("num_experts_per_tok") if "num_experts_per_tok" in c.d else c.int("experts_per_token")
        expert_w = c.int("moe_intermediate_size") if "moe_intermediate_size" in c.d else dense_w
        shared_w = c.int("shared_expert_intermediate_size", 0)
        step, only = c.int("decoder_sparse_step", 1), c.layer_list("mlp_only_layers", L)
        moe = [(i + 1) % max(1, step) == 0 and i not in only for i in range(L)]
    elif fam in ("mla", "qwen3_next"):
        E = c.int("n_routed_experts") if fam == "mla" else c.int("num_experts")
        k, expert_w = c.int("num_experts_per_tok"), c.int("moe_intermediate_size")
        if fam == "mla":
            shared_w = c.int("n_shared_experts", 0) * expert_w
            first, freq = c.int("first_k_dense_replace", 0), c.int("moe_layer_freq", 1)
            moe = [i >= first and i % max(1, freq) == 0 for i in range(L)]
        else:
            shared_w = c.int("shared_expert_intermediate_size", 0)
            step, only = c.int("decoder_sparse_step", 1), c.layer_list("mlp_only_layers", L)
            moe = [(i + 1) % max(1, step) == 0 and i not in only for i in range(L)]
    elif fam == "jamba":
        E, k, expert_w = c.int("num_experts"), c.int("num_experts_per_tok"), dense_w
        period, off = c.pos("expert_layer_period"), c.int("expert_layer_offset")
        moe = [E > 1 and i % period == off for i in range(L)]
    if k > E:
        raise ValueError(f"{c.where}: num_experts_per_tok: {k} of {E} experts; expected at most "
                         f"the experts there are")
    if fam == "nemotron_h":  # the MLP is a layer of its own ('-')
        n = kinds.count("mlp")
        p = n * mats * hidden * dense_w
        return p, p, dense_w, 0
    total = active = routed = 0
    for is_moe in moe:
        if is_moe:
            r = E * mats * hidden * expert_w
            base = mats * hidden * shared_w + hidden * E  # shared experts, router
            total += r + base
            active += k * mats * hidden * expert_w + base
            routed += r
        else:
            total += mats * hidden * dense_w
            active += mats * hidden * dense_w
    width = k * expert_w + shared_w if any(moe) else dense_w
    return total, active, width, routed
