"""The compute model: hand-computed step times on a round-number GPU, and the presets."""

import pytest

from kvsim.engine.compute import ComputeModel, ModelShape, kv_bytes_per_token, load_model
from conftest import round_profile as shared_round_profile
from kvsim.config.hardware import ProfileError, load_profile

from kvsim.config.hardware import HardwareProfile


def round_profile() -> HardwareProfile:
    """Round numbers; only ``gpu`` matters to the compute model."""
    return shared_round_profile(gpu={"name": "round", "memory": "100GB", "flops_bf16": 100e12,
                                     "hbm": "1TB/s", "prefill_efficiency": 0.5,
                                     "decode_efficiency": 0.5, "step_overhead": "1ms"})


def tiny_shape(**kw):
    base = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, dtype_bytes=2,
                params=1e9, tp=1)
    base.update(kw)
    return ModelShape(**base)


# round profile: flops 100e12 at efficiency 0.5 -> 50e12 FLOP/s; hbm 1e12 at 0.5 -> 0.5e12 B/s;
# step overhead 1 ms
FLOPS = 50e12
BW = 0.5e12
OVH = 1e-3


def model():
    return ComputeModel(tiny_shape(), round_profile())


def test_kv_bytes_per_token():
    s = tiny_shape()
    assert s.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2 == 256
    assert kv_bytes_per_token(s) == 256
    seventy = load_model("llama-3-70b", tp=1)
    assert seventy.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert load_model("llama-3-70b").kv_bytes_per_token == 163_840   # shipped tp 2
    assert load_model("llama-3-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    # more GPUs than KV heads: heads are replicated, not split below one
    assert tiny_shape(heads=4, kv_heads=2, tp=4).kv_bytes_per_token == 2 * 2 * 1 * 16 * 2


def test_prefill_is_compute_bound():
    # 1000 new tokens, no context: dense 2e9*1000 = 2e12; attention 4*2*4*16*1000*500 = 2.56e8
    flops = 2e9 * 1000 + 4 * 2 * 4 * 16 * 1000 * (0 + 500)
    nbytes = 2e9 + 256 * 1000
    assert flops / FLOPS > nbytes / BW
    assert model().step_time([(1000, 0)], []) == pytest.approx(flops / FLOPS + OVH, rel=1e-12)


def test_prefill_with_context_pays_attention_over_it():
    flops = 2e9 * 100 + 4 * 2 * 4 * 16 * 100 * (5000 + 50)
    nbytes = 2e9 + 256 * 5100
    expect = max(flops / FLOPS, nbytes / BW) + OVH
    assert model().prefill_time(100, 5000) == pytest.approx(expect, rel=1e-12)


def test_decode_is_memory_bound():
    # 3 requests at contexts 1000, 2000, 3000: weights 2e9 B + KV 256 * 6000 B
    nbytes = 2e9 + 256 * 6000
    flops = 2e9 * 3 + 4 * 2 * 4 * 16 * 6000
    assert nbytes / BW > flops / FLOPS
    assert model().decode_time([1000, 2000, 3000]) == pytest.approx(nbytes / BW + OVH, rel=1e-12)


def test_mixed_step_is_the_roofline_max_not_the_sum():
    m = model()
    mixed = m.step_time([(1000, 0)], [1000, 2000, 3000])
    flops = 2e9 * 1003 + 4 * 2 * 4 * 16 * (1000 * 500 + 6000)
    nbytes = 2e9 + 256 * (1000 + 6000)
    assert mixed == pytest.approx(max(flops / FLOPS, nbytes / BW) + OVH, rel=1e-12)
    assert mixed < m.step_time([(1000, 0)], []) + m.decode_time([1000, 2000, 3000])


def test_empty_step_costs_nothing():
    assert model().step_time([], []) == 0.0


def test_decode_step_time_is_the_same_float_as_step_time_sum():
    # the engine runs decode-only steps ahead of the clock with decode_step_time; its float
    # must be the one step_time_sum gives, bit for bit, or a run-ahead replay would drift
    for m in (model(), ComputeModel(load_model("llama-3-70b"), load_profile("h200-pcie"))):
        for n, ctx in [(0, 0), (1, 1), (7, 12_345), (128, 1_234_567), (3, 2**40 + 17)]:
            assert m.decode_step_time(n, ctx) == m.step_time_sum((), n, ctx)
            assert m.decode_step_time(n, ctx).hex() == m.step_time_sum((), n, ctx).hex()


def test_tp_splits_weights_and_flops():
    one = ComputeModel(tiny_shape(tp=1), round_profile()).prefill_time(1000)
    two = ComputeModel(tiny_shape(tp=2), round_profile()).prefill_time(1000)
    assert (two - OVH) == pytest.approx((one - OVH) / 2, rel=1e-12)


def test_presets_give_plausible_h200_times():
    m = ComputeModel(load_model("llama-3-70b"), load_profile("h200-pcie"))
    decode = m.decode_time([4000] * 32)
    assert 0.015 < decode < 0.05          # weights 70.6 GB at ~3.6 TB/s -> ~20 ms + KV
    assert 0.1 < m.prefill_time(2048) < 1.0


def test_shape_validation_and_yaml_errors(tmp_path):
    with pytest.raises(ValueError):
        tiny_shape(heads=4, kv_heads=3)
    with pytest.raises(ValueError):
        tiny_shape(tp=3)
    bad = tmp_path / "m.yaml"
    bad.write_text("layers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\nhead_dim: 16\n"
                   "params: 1e9\nlayer_norm: yes\n")
    with pytest.raises(ProfileError, match=r"m\.yaml: layer_norm"):
        load_model(bad)
    with pytest.raises(ProfileError, match="no such file"):
        load_model("no-such-model")


def test_step_work_is_the_step_time_with_what_it_came_from():
    """A mixed step of one 1000-token prefill chunk over 500 tokens of context and three
    decodes (contexts 1000, 2000, 3000), by hand on the round profile: its ``seconds`` is
    step_time_sum's float, bit for bit, and its fields are the roofline's parts."""
    m = model()
    w = m.step_work([(1000, 500)], 3, 6000)
    assert w.seconds.hex() == m.step_time_sum([(1000, 500)], 3, 6000).hex()
    dense = 2e9 * 1003                                   # 2 x params a token, 1003 tokens
    attn = 4 * 2 * 4 * 16 * (1000 * (500 + 500) + 6000)  # 4 x layers x heads x head_dim x ...
    kv = 256 * (1500 + 6000)                             # KV bytes a token x context read
    weights = 1e9 * 2
    assert (w.dense_flops, w.attn_flops) == (pytest.approx(dense), pytest.approx(attn))
    assert (w.weight_bytes, w.kv_bytes) == (pytest.approx(weights), pytest.approx(kv))
    assert (w.prefill_tokens, w.decode_tokens, w.tokens) == (1000, 3, 1003)
    assert w.flop_s == pytest.approx((dense + attn) / FLOPS)
    assert w.memory_s == pytest.approx((weights + kv) / BW)
    assert w.seconds == pytest.approx(max(w.flop_s, w.memory_s) + OVH)
    assert m.step_work([], 0, 0).seconds == 0.0


def test_decode_work_is_the_same_float_as_step_work():
    for m in (model(), ComputeModel(load_model("llama-3-70b"), load_profile("h200-pcie"))):
        for n, ctx in [(0, 0), (1, 1), (7, 12_345), (128, 1_234_567), (3, 2**40 + 17)]:
            assert m.decode_work(n, ctx) == m.step_work((), n, ctx)
            assert m.decode_work(n, ctx).seconds.hex() == m.decode_step_time(n, ctx).hex()
