"""Ranks on one GPU share its SMs by their steps' kernel lengths (``kvsim_backends.sim.smshare``).

Scenarios:
- a step's kernels: a compute-bound step's GEMMs are the model's mean projection at its M
  at the step's FLOP rate (or the profile's ``gpu.gemm_flops`` at that M), its reads
  kernels of ``engine.read_kernel``; a memory-bound step (a decode) and a compute without a
  step are reads throughout; a bad ``gpu.gemm_flops`` is refused naming the key;
- two ranks on one GPU, a prefill (GEMM kernels of 0.1 ms, then reads) and a decode (read
  kernels of 0.5 ms) launched at once: while the prefill's GEMMs run it gets 0.1 / 0.6 of
  the GPU and the decode 0.5 / 0.6; once in its reads, half each; then the decode alone.
  Every end worked out by hand below;
- equal kernels (two decodes; three ranks' decodes): 1 / n each, processor sharing, as before;
- with ``gpu.kernel_overlap`` O another rank's kernel delays one's by its length less O:
  two equal decodes each stretch by (2R - O) / R, a prefill's GEMMs beside a decode by
  (kg + R - O) / kg; an overlap longer than the other's kernel delays nothing; a bad value
  is refused naming the key;
- ``engine.read_kernel`` reaches the settings; a bad value exits 2 naming the key.
"""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import ConfigFileError, load_config
from kvsim.config.hardware import ProfileError, load_profile
from kvsim.config.paths import CONFIGS
from kvsim.core.datapath.work import READ_KERNEL_S, StepWork
from kvsim.core.spec import Level
from kvsim.run import prepare_run
from kvsim.run.seam import backend_settings, settings_for
from kvsim_backends.sim import SimBackend, SimRuntime
from kvsim_backends.sim.smshare import KernelLengths

PB = 2 << 20
PROFILE = load_profile("h200-pcie")  # (no power state, no node bus)
R = 0.5e-3  # the tests' read kernel (five of their 0.1 ms GEMM kernels), not the default


def _node(ranks, per_gpu=None, overlap=0.0):
    rt = SimRuntime()
    # (strict turns unless a test asks for an overlap, whatever the profile's)
    prof = PROFILE.model_copy(update={"gpu": PROFILE.gpu.model_copy(update={"kernel_overlap": overlap})})
    base = settings_for(PB, {Level.GPU: 64, Level.HOST: 64}, prof, model="llama-3-8b")
    per = ranks if per_gpu is None else per_gpu
    base = dataclasses.replace(base, read_kernel_s=R)
    return rt, [SimBackend(rt, dataclasses.replace(base, rank=r, ranks=ranks, tp=1, ranks_per_gpu=per))
                for r in range(ranks)], base


def _mean_kn(model):
    return sum(k * n for k, n in model.projections) / len(model.projections)


def _prefill(model, gemm_s, read_s, kernel_s, tokens=1024):
    """A compute-bound step of ``gemm_s`` + ``read_s`` nominal seconds whose GEMM kernels
    (M = ``tokens``, a power of two) last ``kernel_s`` each: its FLOPs set so that the mean
    projection at M takes ``kernel_s`` at the step's rate (FLOPs / ``gemm_s``)."""
    flops = 2.0 * tokens * _mean_kn(model) * gemm_s / kernel_s
    return StepWork(gemm_s + read_s, flops, 0.0, 0.0, 0.0, tokens, 0, gemm_s, read_s)


def _decode(seconds):
    """A memory-bound step (a decode) of ``seconds``: a sliver of FLOPs, the rest reads."""
    return StepWork(seconds, 1e9, 0.0, 1e9, 1e9, 0, 2, seconds * 0.01, seconds * 0.99)


def _took(rt, bes, steps):
    """Rank r launches ``steps[r]`` (at, work) on its backend: the seconds each took."""
    out = [None] * len(bes)

    def launch(r, at, work):
        yield rt.env.timeout(at)
        out[r] = (yield bes[r].compute(work.seconds, work)) - PROFILE.compute.latency
    for r, (at, work) in enumerate(steps):
        rt.env.process(launch(r, at, work))
    rt.env.run()
    return out


def test_a_steps_kernels_from_its_work_and_the_model():
    _, _, base = _node(1)
    k = KernelLengths(base.model, R)
    pre = _prefill(base.model, 0.006, 0.002, 1e-4, tokens=1024)
    g, m = k.of(pre)
    assert g == pytest.approx(1e-4, rel=1e-12) and m == R
    # M is the step's tokens rounded down to a power of two: 1500 tokens run at M 1024
    more = pre._replace(prefill_tokens=1500)
    assert k.of(more)[0] == pytest.approx(1e-4, rel=1e-12)
    assert k.of(_decode(0.01)) == (R, R)   # memory-bound: reads throughout
    assert k.of(None) == (R, R)            # the SMs alone: the busy kernel's chunks
    assert KernelLengths(base.model, 2e-3).of(pre)[1] == 2e-3


def test_gemm_kernels_at_the_profiles_rates_by_m():
    _, _, base = _node(1)
    kn = _mean_kn(base.model)
    k = KernelLengths(base.model, R, {128: 3e14, 1024: 6e14, 8192: 6.5e14})
    pre = _prefill(base.model, 0.006, 0.002, 1e-4, tokens=2048)  # M 2048: the 1024 entry
    assert k.of(pre)[0] == pytest.approx(2 * 2048 * kn / 6e14, rel=1e-12)
    assert k.of(pre._replace(prefill_tokens=200))[0] == pytest.approx(2 * 128 * kn / 3e14, rel=1e-12)
    assert k.of(pre._replace(prefill_tokens=9000))[0] == pytest.approx(2 * 8192 * kn / 6.5e14, rel=1e-12)
    assert KernelLengths(base.model, R, {1024: 6e14}).rate_at(128) == 6e14  # (below the table)
    assert k.of(_decode(0.01)) == (R, R)


@pytest.mark.parametrize("table", ["{128: -1.0}", "{0: 1.0e+14}", "fast"])
def test_a_bad_gemm_flops_table_is_refused_naming_the_key(tmp_path, table):
    src = (CONFIGS / "hardware" / "h200-pcie.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("\ngpu:\n", f"\ngpu:\n  gemm_flops: {table}\n", 1))
    assert "gemm_flops" in bad.read_text()
    with pytest.raises(ProfileError, match=r"gpu\.gemm_flops"):
        load_profile(bad)


def test_a_prefill_beside_a_decode_shares_by_kernel_length():
    rt, bes, base = _node(2)
    s = PROFILE.compute.scale
    kg = 1e-4
    G, Rd, D = 0.006, 0.002, 0.050  # the prefill's GEMM and read seconds, the decode's
    took = _took(rt, bes, [(0.0, _prefill(base.model, G, Rd, kg)), (0.0, _decode(D))])
    G, Rd, D = G * s, Rd * s, D * s  # (work as the fluid runs it)
    # the prefill's GEMMs at kg / (kg + R) of the GPU: done at t1; the decode meanwhile at
    # R / (kg + R): t1 x R / (kg + R) of its work
    t1 = G * (kg + R) / kg
    d1 = t1 * R / (kg + R)
    assert d1 + Rd < D  # (the decode outlasts the prefill's reads, as worked out here)
    # then both read: half each until the prefill's reads are done; the decode alone after
    t2 = t1 + 2 * Rd
    end_d = t2 + (D - d1 - Rd)
    assert took[0] == pytest.approx(t2, rel=1e-9)
    assert took[1] == pytest.approx(end_d, rel=1e-9)
    # the GPU never idles: the decode ends at the sum of both works, and the prefill far
    # later than processor sharing's 2 x its work
    assert end_d == pytest.approx(G + Rd + D, rel=1e-9)
    assert took[0] > 2.5 * (G + Rd)


def test_a_prefill_whose_reads_start_later_reshares_at_its_turn():
    """The decode launched while the prefill's GEMMs run: the turn to reads still re-times."""
    rt, bes, base = _node(2)
    s = PROFILE.compute.scale
    kg = 2.5e-4
    G, Rd, D = 0.004, 0.003, 0.040
    at = 0.001
    took = _took(rt, bes, [(0.0, _prefill(base.model, G, Rd, kg)), (at, _decode(D))])
    G, Rd, D = G * s, Rd * s, D * s
    f_g, f_d = (kg + R) / kg, (R + kg) / R
    t1 = at + (G - at) * f_g             # the prefill's GEMMs: alone until ``at``, then shared
    d1 = (t1 - at) / f_d                 # the decode's work by then
    t2 = t1 + 2 * Rd
    assert took[0] == pytest.approx(t2, rel=1e-9)
    assert took[1] == pytest.approx(t2 + (D - d1 - Rd) - at, rel=1e-9)


def test_a_step_of_gemms_only_beside_a_decode():
    rt, bes, base = _node(2)
    s = PROFILE.compute.scale
    kg, G, D = 2e-4, 0.003, 0.030
    took = _took(rt, bes, [(0.0, _prefill(base.model, G, 0.0, kg)), (0.0, _decode(D))])
    G, D = G * s, D * s
    t1 = G * (kg + R) / kg  # at kg / (kg + R) of the GPU throughout
    assert took[0] == pytest.approx(t1, rel=1e-9)
    assert took[1] == pytest.approx(t1 + (D - t1 * R / (kg + R)), rel=1e-9)


@pytest.mark.parametrize("n", [2, 3])
def test_equal_kernels_share_one_nth_each(n):
    rt, bes, _ = _node(n)
    s = PROFILE.compute.scale
    works = [0.010 * (r + 1) for r in range(n)]
    took = _took(rt, bes, [(0.0, _decode(w)) for w in works])
    # processor sharing: each of the n at 1 / n until the shortest ends, and so on
    a = [w * s for w in works]
    if n == 2:
        want = [2 * a[0], a[0] + a[1]]
    else:
        want = [3 * a[0], 3 * a[0] + 2 * (a[1] - a[0]), 3 * a[0] + 2 * (a[1] - a[0]) + (a[2] - a[1])]
    assert took == pytest.approx(want, rel=1e-9)
    # (one GPU each: every step its own time)
    rt, bes, _ = _node(n, 1)
    assert _took(rt, bes, [(0.0, _decode(w)) for w in works]) == pytest.approx(a, rel=1e-9)


def test_kernels_overlap_by_the_profiles_kernel_overlap():
    s = PROFILE.compute.scale
    O = 0.1e-3  # a fifth of R
    # two decodes of 10 and 20 ms at once: each stretched by (R + R - O) / R until the
    # first ends, then the second alone
    rt, bes, _ = _node(2, overlap=O)
    took = _took(rt, bes, [(0.0, _decode(0.010)), (0.0, _decode(0.020))])
    f = (2 * R - O) / R
    assert f < 2.0
    a0, a1 = 0.010 * s, 0.020 * s
    assert took == pytest.approx([a0 * f, a0 * f + (a1 - a0)], rel=1e-9)
    # a step of GEMMs only (kernels kg) beside a long decode: (kg + R - O) / kg while it runs
    rt, bes, base = _node(2, overlap=O)
    kg, G = 0.1e-3, 0.004
    took = _took(rt, bes, [(0.0, _prefill(base.model, G, 0.0, kg)), (0.0, _decode(0.5))])
    assert took[0] == pytest.approx(G * s * (kg + R - O) / kg, rel=1e-9)
    # an overlap as long as the other's kernel: no delay at all beside it
    rt, bes, _ = _node(2, overlap=R)
    took = _took(rt, bes, [(0.0, _decode(0.010)), (0.0, _decode(0.020))])
    assert took[0] == pytest.approx(a0, rel=1e-9)


@pytest.mark.parametrize("value", ["-1us", "fast"])
def test_a_bad_kernel_overlap_is_refused_naming_the_key(tmp_path, value):
    src = (CONFIGS / "hardware" / "h200-pcie.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    assert src.count("  kernel_overlap: 9.19us\n") == 1
    bad.write_text(src.replace("  kernel_overlap: 9.19us\n", f"  kernel_overlap: {value}\n"))
    with pytest.raises(ProfileError, match=r"gpu\.kernel_overlap"):
        load_profile(bad)


SMALL = ["workload.synthetic.n_sessions=2", "workload.max_turns=2", "model=llama-3-8b",
         "cache.page_bytes=2MiB", "cache.tiers=[{level: gpu, quota: 2GiB}]"]


def test_read_kernel_key_reaches_the_settings():
    cfg = load_config("default", [*SMALL, "engine.read_kernel=0.25ms"])
    prep = prepare_run(cfg)
    st = backend_settings(cfg, prep.profile, PB, {Level.GPU: 1}, shape=prep.shape)
    assert st.read_kernel_s == pytest.approx(0.25e-3)
    assert load_config("default", SMALL).engine.read_kernel == READ_KERNEL_S


@pytest.mark.parametrize("value", ["0", "-1ms", "fast"])
def test_a_bad_read_kernel_exits_2_naming_the_key(value):
    sets = [*SMALL, f"engine.read_kernel={value}"]
    with pytest.raises(ConfigFileError, match=r"engine\.read_kernel"):
        load_config("default", sets)
    res = CliRunner().invoke(app, ["run", "default", "--no-progress",
                                   *[x for s in sets for x in ("--set", s)]])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "engine.read_kernel" in res.output
