"""Models from their Hugging Face configs (issue 38): each preset's KV bytes a token,
window, recurrent state and parameters against figures computed by hand from the model's
published architecture; config.json files and folders; bad input refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpuskip import have_gpu
from kvsim.cli import app
from kvsim.config.hardware import CONFIG_DIR, load_profile
from kvsim.config.hfmodel import ARCHITECTURES, load_model
from kvsim.engine.compute import ComputeModel
from kvsim.run.pipeline import state_pages

BF16 = 2
# name -> (per token, whole model at tp 1, bf16): full-context KV bytes, sliding KV bytes,
# from the published architecture: layers of each kind x KV heads x head size x 2 (K, V)
# x 2 bytes; MLA: layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes
KV = {
    "llama-3.1-8b": (32 * 2 * 8 * 128 * BF16, 0),        # 131072 = 128 KiB
    "llama-3.1-70b": (80 * 2 * 8 * 128 * BF16, 0),       # 320 KiB
    "llama-3.1-405b": (126 * 2 * 8 * 128 * BF16, 0),     # 504 KiB
    "qwen3-8b": (36 * 2 * 8 * 128 * BF16, 0),            # 144 KiB
    "qwen3-30b-a3b": (48 * 2 * 4 * 128 * BF16, 0),       # 96 KiB
    "mixtral-8x7b": (32 * 2 * 8 * 128 * BF16, 0),        # 128 KiB
    "deepseek-v3": (61 * (512 + 64) * BF16, 0),          # 70272 (MLA latent + RoPE key)
    "gemma-3-27b": (10 * 2 * 16 * 128 * BF16, 52 * 2 * 16 * 128 * BF16),  # 62 = 10 global + 52 local
    "mistral-7b": (0, 32 * 2 * 8 * 128 * BF16),          # every layer sliding (4096)
    "gpt-oss-120b": (18 * 2 * 8 * 64 * BF16, 18 * 2 * 8 * 64 * BF16),     # alternating
    "qwen3-next-80b-a3b": (12 * 2 * 2 * 256 * BF16, 0),  # 1 in 4 of 48 layers attend
    "jamba-v0.1": (4 * 2 * 8 * 128 * BF16, 0),           # 1 in 8 of 32 layers attend
}
WINDOW = {"gemma-3-27b": 1024, "mistral-7b": 4096, "gpt-oss-120b": 128}
# recurrent state a request, whole model, bf16: layers x elements
STATE = {
    # Mamba: d_inner = 2 x 4096; conv (4 - 1) x d_inner + SSM d_inner x 16, 28 layers
    "jamba-v0.1": 28 * (3 * 8192 + 8192 * 16) * BF16,
    # Gated DeltaNet: conv (4 - 1) x (2 x 16 x 128 + 32 x 128) + 32 heads x 128 x 128, 36 layers
    "qwen3-next-80b-a3b": 36 * (3 * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128) * BF16,
}
# published totals (model cards) and active counts where a precise figure is published
PARAMS = {"llama-3.1-8b": 8.03e9, "llama-3.1-70b": 70.6e9, "llama-3.1-405b": 405e9,
          "qwen3-8b": 8.2e9, "qwen3-30b-a3b": 30.5e9, "mixtral-8x7b": 46.7e9,
          "deepseek-v3": 671e9, "gemma-3-27b": 27e9, "mistral-7b": 7.24e9,
          "gpt-oss-120b": 116.83e9, "qwen3-next-80b-a3b": 80e9, "jamba-v0.1": 52e9}
ACTIVE = {"mixtral-8x7b": 12.9e9, "deepseek-v3": 36.6e9, "gpt-oss-120b": 5.13e9}


@pytest.mark.parametrize("name", sorted(KV))
def test_preset_kv_bytes_a_token_match_the_published_architecture(name):
    s = load_model(name, tp=1)
    full, sliding = KV[name]
    assert (s.full_kv_bytes_per_token, s.sliding_kv_bytes_per_token) == (full, sliding)
    assert s.kv_bytes_per_token == full + sliding
    assert s.page_bytes_per_token == (full or sliding)
    assert s.window == WINDOW.get(name, 0)
    assert s.recurrent_state_bytes == STATE.get(name, 0)
    assert s.params == pytest.approx(PARAMS[name], rel=0.02)
    if name in ACTIVE:
        assert s.active == pytest.approx(ACTIVE[name], rel=0.02)
    assert s.source.startswith("https://huggingface.co/")


def test_tp_splits_kv_heads_and_state_but_not_the_mla_latent():
    assert load_model("llama-3.1-70b").full_kv_bytes_per_token == 80 * 2 * 4 * 128 * BF16  # tp 2
    assert load_model("llama-3.1-405b").full_kv_bytes_per_token == 126 * 2 * 1 * 128 * BF16
    assert load_model("deepseek-v3").full_kv_bytes_per_token == 61 * 576 * BF16  # tp 8
    q = load_model("qwen3-next-80b-a3b")  # tp 2
    assert q.recurrent_state_bytes == STATE["qwen3-next-80b-a3b"] // 2


@pytest.mark.parametrize("dtype, bits", [("bf16", 16), ("fp8", 8), ("fp4", 4)])
def test_kv_precision_scales_kv_but_not_weights(dtype, bits):
    base = load_model("gemma-3-27b")
    s = load_model("gemma-3-27b", kv_dtype=dtype)
    assert s.kv_bytes_per_token == base.kv_bytes_per_token * bits // 16
    assert s.weight_bytes_per_gpu == base.weight_bytes_per_gpu


def test_windowed_state_is_whole_blocks_of_the_window_and_counts_in_pages():
    g = load_model("gemma-3-27b")
    # a 1024-token window can start inside a block: ceil(1024 / 32) + 1 = 33 blocks of 32
    assert g.window_tokens(32) == 33 * 32
    assert g.state_bytes(32) == 33 * 32 * 52 * 2 * 16 * 128 * BF16
    page = 32 * g.page_bytes_per_token
    assert state_pages(g, page, 32) == -(-g.state_bytes(32) // page)
    m = load_model("mistral-7b")  # sliding layers only: kept whole, no per-request window
    assert m.window_tokens(32) == 0 and state_pages(m, 32 * m.page_bytes_per_token, 32) == 0
    j = load_model("jamba-v0.1")
    assert state_pages(j, 32 * 16384, 32) == -(-STATE["jamba-v0.1"] // (32 * 16384))


def _hf(name: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / "models" / f"{name}.yaml").read_text())["hf_config"]


def test_config_json_and_its_folder_load_like_the_preset(tmp_path):
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_hf("qwen3-30b-a3b")))
    preset = load_model("qwen3-30b-a3b")
    for where in (folder, folder / "config.json"):
        s = load_model(str(where))
        assert s.name == "Qwen3-30B-A3B"
        for key in ("kv_bytes_per_token", "params", "active", "intermediate_size"):
            assert getattr(s, key) == getattr(preset, key), key


def test_moe_computes_with_active_params():
    prof = load_profile("h200-pcie")
    s = load_model("mixtral-8x7b")
    assert s.active < s.params / 3
    w = ComputeModel(s, prof).step_work(((1024, 0),), 0, 0)
    assert w.dense_flops == pytest.approx(2 * s.active * 1024)
    one = ComputeModel(s, prof).decode_work(1, 100)  # one token reads its experts only
    assert one.weight_bytes == pytest.approx(s.weight_bytes_per_gpu * s.active / s.params)


def test_sliding_layers_attend_and_read_within_their_window():
    prof = load_profile("h200-pcie")
    g = load_model("gemma-3-27b")
    cm = ComputeModel(g, prof)
    heads = g.heads // g.tp
    a = cm.step_work(((4096, 0),), 0, 0)  # the chunk's tokens see min(position, 1024)
    full = 4096 * (0 + 4096 / 2)
    sliding = 1024 * (1024 / 2) + (4096 - 1024) * 1024
    assert a.attn_flops == pytest.approx(4 * heads * 128 * (10 * full + 52 * sliding))
    d = cm.decode_work(3, 3 * 5000)  # every context beyond the window
    assert d.kv_bytes == pytest.approx(g.full_kv_bytes_per_token * 15000
                                       + g.sliding_kv_bytes_per_token * 3 * 1024)
    for n, ctx in ((1, 10), (3, 900), (4, 10_000), (7, 7 * 1024)):
        assert cm.decode_step_time(n, ctx) == cm.step_time_sum((), n, ctx)
    m = load_model("mistral-7b")  # sliding layers only: pages keep all, attention the window
    d = ComputeModel(m, prof).decode_work(2, 2 * 8000)
    assert d.kv_bytes == pytest.approx(m.sliding_kv_bytes_per_token * 2 * 4096)
    assert d.attn_flops == pytest.approx(4 * 32 * 32 * 128 * 2 * 4096)


def test_recurrent_state_is_read_once_a_request_a_step():
    prof = load_profile("h200-pcie")
    j = load_model("jamba-v0.1")
    d = ComputeModel(j, prof).decode_work(5, 5000)
    assert d.kv_bytes == pytest.approx(j.full_kv_bytes_per_token * 5000 + 5 * j.recurrent_state_bytes)


def test_every_supported_family_has_a_parser():
    assert {"dense", "moe", "mla", "gemma3", "gpt_oss", "jamba", "nemotron_h",
            "qwen3_next"} <= set(ARCHITECTURES.values())


def test_nemotron_h_pattern_counts_only_mixer_layers(tmp_path):
    cfg = {"architectures": ["NemotronHForCausalLM"], "hidden_size": 1024, "num_attention_heads": 8,
           "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 6,
           "hybrid_override_pattern": "M-M*-M", "intermediate_size": 4096, "vocab_size": 1000,
           "mamba_num_heads": 16, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 2,
           "conv_kernel": 4}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    s = load_model(str(p))
    assert (s.layers, s.full_layers, s.recurrent_layers) == (4, 1, 3)
    assert s.recurrent_state == 3 * (16 * 64 + 2 * 2 * 128) + 16 * 64 * 128
    assert s.full_kv_bytes_per_token == 1 * 2 * 2 * 128 * BF16


runner = CliRunner()
SMALL = ["--set", "workload.synthetic.n_sessions=2", "--set", "output.plots=false", "--no-progress"]


def _run(tmp_path: Path, *sets: str):
    out = tmp_path / "res"
    args = ["run", "configs/default.yaml", "--out", str(out), *SMALL]
    for s in sets:
        args += ["--set", s]
    return runner.invoke(app, args), out


def test_bad_model_input_exits_2_naming_the_file_and_field(tmp_path):
    hf = _hf("llama-3.1-8b")
    del hf["intermediate_size"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(hf))
    r, out = _run(tmp_path, f"model={tmp_path / 'm'}")
    assert r.exit_code == 2 and "config.json: missing field 'intermediate_size'" in r.output
    assert not out.exists()
    (tmp_path / "a.json").write_text(json.dumps({**hf, "architectures": ["FooForCausalLM"]}))
    r, out = _run(tmp_path, f"model={tmp_path / 'a.json'}")
    assert r.exit_code == 2 and "'FooForCausalLM' is not supported" in r.output
    assert "DeepseekV3ForCausalLM" in r.output and not out.exists()
    r, out = _run(tmp_path, "model=gemma-3-27b", "kv_dtype=fp6")
    assert r.exit_code == 2 and "kv_dtype" in r.output and "fp4" in r.output
    (tmp_path / "empty").mkdir()
    r, out = _run(tmp_path, f"model={tmp_path / 'empty'}")
    assert r.exit_code == 2 and "without a config.json" in r.output


@pytest.mark.parametrize("model", ["gemma-3-27b", "qwen3-next-80b-a3b"])
def test_a_windowed_or_hybrid_model_runs(tmp_path, model):
    r, out = _run(tmp_path, f"model={model}", "kv_dtype=fp8")
    assert r.exit_code == 0, r.output
    s = json.loads((out / "summary.json").read_text())
    shape = load_model(model, kv_dtype="fp8")
    assert s["metrics"]["page_bytes"] == 32 * shape.page_bytes_per_token
    assert s["run"]["model"]["state_bytes"] == shape.state_bytes(32) > 0
    assert s["metrics"]["requests_completed"] > 0


def _engine(state_pages: int, gpu_pages: int = 64) -> tuple:
    from kvsim.core import Level, ManagerSpec, TierManager, TierSpec
    from kvsim.engine import Engine, EngineParams
    from kvsim.run.seam import settings_for
    from kvsim_backends.sim import SimBackend, SimRuntime

    shape, profile = load_model("llama-3-8b"), load_profile("h200-pcie")
    page = shape.page_bytes_per_token * 32
    mgr = TierManager(ManagerSpec(page_bytes=page, tokens_per_block=32, tiers=(
        TierSpec(Level.GPU, gpu_pages * page), TierSpec(Level.HOST, 256 * page))))
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(page, {t.level: t.max_slots for t in mgr.tiers}, profile))
    return rt, Engine(rt, be, mgr, ComputeModel(shape, profile), EngineParams(state_pages=state_pages)), mgr


@pytest.mark.parametrize("state, together", [(0, True), (30, False)])
def test_a_running_requests_state_pages_count_at_admission(state, together):
    """Two 4-block requests arriving together: 5 final pages each fit 64 GPU pages side by
    side; with 30 pages of state each (35 a request) only one runs at a time."""
    from kvsim.workload import Session, Turn, Workload

    rt, eng, mgr = _engine(state)
    turns = [Turn(input_tokens=128, output_tokens=2, hash_ids=(10 * i + 1, 10 * i + 2, 10 * i + 3,
                                                                 10 * i + 4), arrival_s=1.0)
             for i in range(2)]
    eng.load(Workload("t", 32, False, tuple(Session(f"r{i}", "global", (t,), start_s=1.0)
                                           for i, t in enumerate(turns))))
    rt.run(until=rt.process(eng.serve()))
    a, b = sorted(eng.metrics.rows, key=lambda r: r.admitted_ns)
    assert (b.admitted_ns < a.done_ns) is together
    gpu_pages = sum(1 for p in mgr.pages() if p.tier == 0)
    assert mgr.tiers[0].used == gpu_pages  # every request's state freed (closed requests)


def _serial(n: int, blocks: int, gap_s: float = 5.0):
    from kvsim.workload import Session, Turn, Workload

    turns = [Turn(input_tokens=32 * blocks, output_tokens=2, arrival_s=1.0 + gap_s * i,
                  hash_ids=tuple(1000 * (i + 1) + j for j in range(blocks))) for i in range(n)]
    return Workload("t", 32, False, tuple(Session(f"r{i}", "global", (t,), start_s=t.arrival_s)
                                         for i, t in enumerate(turns)))


@pytest.mark.parametrize("state", [0, 55])
def test_a_running_requests_state_takes_gpu_slots_from_cached_pages(state):
    """Three requests of 10 blocks (+ 2 output tokens: 11 pages) one after another on 70
    GPU pages: without state their 33 cached pages all stay on GPU; with 55 pages of state
    the tier has 15 slots while one runs, so its 11 pages leave room for 4 cached ones and
    the others go to host (7 of the first's, then 11 more)."""
    rt, eng, mgr = _engine(state, gpu_pages=70)
    seen: list[int] = []  # GPU slots left to pages of blocks while each request runs
    eng.on_resume = lambda pages: seen.append(70 - sum(len(r.fixed) for r in mgr.requests()))
    eng.load(_serial(3, 10))
    rt.run(until=rt.process(eng.serve()))
    assert len(eng.metrics.rows) == 3 and all(r.done_ns > 0 for r in eng.metrics.rows)
    assert seen == [70 - state] * 3
    assert mgr.tiers[0].used == sum(1 for p in mgr.pages() if p.tier == 0)  # states freed
    own = -(-(32 * 10 + 2 - 1) // 32)
    keep, cached, moved = 70 - state - own, 0, 0
    for _ in range(3):
        moved += max(0, cached - keep)
        cached = min(cached, keep) + own
    assert mgr.tiers[1].used == moved == (18 if state else 0)


def test_the_models_study_plans_five_models_of_different_kinds():
    from kvsim.study.study import plan_study

    _, points = plan_study("studies/models.yaml")
    models = [load_model(p.config["model"]) for p in points]
    assert len(models) == 5
    kinds = {("mla" if m.kv_lora_rank else "recurrent" if m.recurrent_layers else
              "window" if m.windowed else "moe" if m.active < m.params / 2 else "dense")
             for m in models}
    assert kinds == {"mla", "recurrent", "window", "moe", "dense"}


@pytest.mark.parametrize("state", [0, 55])
def test_admission_waits_while_cached_pages_leave_for_a_requests_state(state):
    """40 cached pages fill 70 GPU slots; a request of 10 blocks with 55 pages of state
    finds 30 free: 25 cached pages are evicted to host first, and it is admitted when they
    have left (at once without state)."""
    rt, eng, mgr = _engine(state, gpu_pages=70)

    def prelude():
        req = mgr.create("global", list(range(1, 41)), 40 * 32)
        mgr.complete(mgr.resume(req))
        mgr.complete(mgr.grow(req, 40 * 32))
        eng.backend.fill(mgr.commit(req, 40 * 32))
        mgr.close(req)
        yield rt.timeout(0)

    rt.run(until=rt.process(prelude()))
    eng.load(_serial(1, 10))
    rt.run(until=rt.process(eng.serve()))
    row = eng.metrics.rows[0]
    assert row.done_ns > 0 and mgr.tiers[0].capacity == 70
    assert mgr.tiers[1].used == (55 - 30 + max(0, 40 - 25 - (70 - 55 - 11)) if state else 0)
    assert (row.admitted_ns > row.arrival_ns) is bool(state)


def test_the_hw_stand_in_gemms_are_as_wide_as_a_token_computes():
    """Qwen3-30B-A3B: QKV 32 x 128 + 2 x 4 x 128, the MLP 8 experts x 768 wide (not 128)."""
    from kvsim.core.spec import Level
    from kvsim.run.seam import settings_for

    st = settings_for(1 << 16, {Level.GPU: 4}, model="qwen3-30b-a3b")
    assert st.model.projections == ((2048, 4096 + 1024), (4096, 2048), (2048, 2 * 8 * 768),
                                    (8 * 768, 2048))


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "gemma-3-27b"])
def test_gpu_an_moe_or_windowed_models_step_lasts_what_it_was_asked_for(model):
    """The compute model's own prefill and decode steps of an MoE and a windowed model, run
    by the hw stand-in with that model's GEMMs: within 10% (+ 0.3 ms) of their time."""
    from kvsim.core.spec import Level
    from kvsim.run.seam import settings_for
    from kvsim_backends.hw import HwBackend, RealtimeRuntime

    cm = ComputeModel(load_model(model), load_profile("h200-pcie"))
    rt = RealtimeRuntime()
    be = HwBackend(rt, settings_for(1 << 16, {Level.GPU: 4}, device="gpu", model=model))
    try:
        for work in (cm.step_work(((4096, 8192),), 0, 0), cm.decode_work(64, 64 * 20000)):
            for _ in range(2):
                took = rt.run(rt.process((lambda: (yield be.compute(work.seconds, work)))()))
            assert abs(took - work.seconds) < 0.10 * work.seconds + 3e-4, (model, work)
    finally:
        be.close()


@pytest.mark.parametrize("change, problem", [
    ({"architectures": "LlamaForCausalLM"}, "architectures: expected a list of names"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers: expected a whole number"),
    ({"layer_types": ["full_attention"]}, "layer_types: expected 32 of"),
    ({"num_key_value_heads": 5}, "heads (32) must be a multiple of kv_heads (5)"),
])
def test_bad_config_fields_are_named_with_the_file(tmp_path, change, problem):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**_hf("llama-3.1-8b"), **change}))
    with pytest.raises(ValueError) as e:
        load_model(str(p))
    assert str(p) in str(e.value) and problem in str(e.value)


@pytest.mark.parametrize("preset, change, problem", [
    # each layer's kind is its index modulo these: 0 divided by zero (a traceback, exit 1)
    ("jamba-v0.1", {"attn_layer_period": 0}, "attn_layer_period: expected a whole number >= 1, got 0"),
    ("jamba-v0.1", {"expert_layer_period": 0}, "expert_layer_period: expected a whole number >= 1, got 0"),
    ("qwen3-next-80b-a3b", {"full_attention_interval": 0},
     "full_attention_interval: expected a whole number >= 1, got 0"),
    # a layer index looked up in a string (TypeError)
    ("qwen3-30b-a3b", {"mlp_only_layers": "3"}, "mlp_only_layers: expected a list of layer indices"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [1.5]}, "mlp_only_layers: expected a list of layer indices"),
    # a kind listed for each layer: 1e30 of them overflowed (OverflowError)
    ("llama-3.1-8b", {"num_hidden_layers": 10**30}, "num_hidden_layers: expected at most 100,000"),
])
def test_config_fields_that_crashed_the_reader_are_named_with_the_file(tmp_path, preset, change, problem):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**_hf(preset), **change}))
    with pytest.raises(ValueError) as e:
        load_model(str(p))
    assert str(e.value).startswith(f"{p}: {problem}"), str(e.value)
    r, out = _run(tmp_path, f"model={p}")
    assert r.exit_code == 2 and r.output.startswith(f"error: {p}: {problem}"), r.output
    assert not out.exists()


def test_more_experts_a_token_than_there_are_is_refused(tmp_path):
    """Mixtral with 9 of its 8 experts a token: its active parameters came out above its
    total, so the shape silently dropped them and ran as a dense model of all 46.7 B."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**_hf("mixtral-8x7b"), "num_experts_per_tok": 9}))
    with pytest.raises(ValueError) as e:
        load_model(str(p))
    assert str(e.value).startswith(f"{p}: num_experts_per_tok: 9 of 8 experts"), str(e.value)
    p.write_text(json.dumps({**_hf("mixtral-8x7b"), "num_experts_per_tok": 8}))   # all of them
    s = load_model(str(p))
    assert s.active == s.params - _hf("mixtral-8x7b")["vocab_size"] * 4096  # less the input lookup


def test_a_model_of_more_parameters_than_a_step_can_time_is_refused(tmp_path):
    """A vocabulary of 1e40 makes 8e43 embedding parameters: the first step's time
    overflowed the engine's clock (OverflowError, a traceback, exit 1)."""
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**_hf("llama-3.1-8b"), "vocab_size": 10**40}))
    r, out = _run(tmp_path, f"model={p}")
    assert r.exit_code == 2 and r.output.startswith(f"error: {p}: params: Input should be less "
                                                    "than or equal to 1000000000000000 (got 8.192e+43)"), r.output
    assert not out.exists()


def test_mla_prefills_as_multi_head_attention_and_decodes_absorbed():
    s = load_model("deepseek-v3")  # tp 8: 16 heads a GPU
    cm = ComputeModel(s, load_profile("h200-pcie"))
    pf = cm.step_work(((1000, 3000),), 0, 0).attn_flops
    assert pf == pytest.approx(2 * 61 * 16 * ((128 + 64) + 128) * 1000 * (3000 + 500))
    dec = cm.decode_work(4, 40_000).attn_flops
    assert dec == pytest.approx(2 * 61 * 16 * ((512 + 64) + 512) * 40_000)
    both = cm.step_work(((1000, 3000),), 4, 40_000).attn_flops
    assert both == pytest.approx(pf + dec)


def test_the_docs_table_says_what_the_presets_derive():
    """docs/models.md's preset table: each row's KV, window, state, tp, page and state
    pages are what kvsim derives from the preset (so the table cannot drift)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    rows = [r for r in text.splitlines() if r.startswith("| `") and r.count("|") == 11]
    assert {r.split("`")[1] for r in rows} == set(KV)
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        name = cells[0].strip("`")
        s1, s = load_model(name, tp=1), load_model(name)
        kv = f"{s1.full_kv_bytes_per_token:,}"
        if s1.sliding_layers:
            kv += f" + {s1.sliding_kv_bytes_per_token:,}"
        assert cells[2] == kv, name
        assert cells[4] == (str(s1.window) if s1.window else "-"), name
        assert cells[5] == (f"{s1.recurrent_state_bytes:,}" if s1.recurrent_layers else "-"), name
        assert cells[6] == str(s.tp), name
        page = 32 * s.page_bytes_per_token
        assert cells[7] == f"{page / 2**20:.2f} MiB", name
        assert cells[8] == str(-(-s.state_bytes(32) // page)), name
