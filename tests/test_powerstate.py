"""The GPU's power state (``compute.boost``): its arithmetic against a plain numerical
integration of the model, the sim backend's steps under it, the profile keys, and the fit
that recovers the terms from a compute log (``kvsim.tools.fitboost``)."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest

from kvsim.config.hardware import ProfileError, load_profile
from kvsim.core.datapath.powerstate import Boost, PowerState, gemm_time, recovered
from kvsim.core.datapath.work import StepWork
from kvsim.core.spec import Level
from kvsim.run import sim_backend
from kvsim.run.seam import settings_for
from kvsim.tools import fitboost

B = Boost(gain=0.2, spend=0.1, recover=0.05, calibrated=0.25)
# a prefill chunk: 19 of its 20 ms FLOP-bound (GEMMs), 1 ms of reads; a decode step: reads
GEMM = StepWork(0.020, 1e13, 0.0, 1e9, 0.0, 2048, 0, 0.019, 0.001)
DECODE = StepWork(0.008, 1e10, 0.0, 1.6e10, 1e9, 0, 8, 0.0002, 0.0078)


def integrate(h0: float, gemm_s: float, b: Boost, n: int = 200_000) -> tuple[float, float]:
    """(wall seconds, headroom after) of ``gemm_s`` of GEMM work from ``h0``, the model
    stepped by hand: each slice of work dw takes dw x (1 + gain x calibrated) / (1 + gain
    x h) of wall time, and spends h by the factor exp(-dw / spend) (midpoint rule)."""
    dw, t, h = gemm_s / n, 0.0, h0
    for _ in range(n):
        mid = h * math.exp(-dw / (2 * b.spend))
        t += dw * (1 + b.gain * b.calibrated) / (1 + b.gain * mid)
        h *= math.exp(-dw / b.spend)
    return t, h


def test_a_gemm_after_idle_runs_faster_by_the_modelled_amount():
    # from full headroom: 20 ms of GEMM work as the stepped model gives it
    t, h = gemm_time(1.0, 0.020, B)
    t_ref, h_ref = integrate(1.0, 0.020, B)
    assert t == pytest.approx(t_ref, rel=1e-9) and h == pytest.approx(h_ref, rel=1e-9)
    # its first instant runs at (1 + 0.2 x 0.25) / (1 + 0.2) = 0.875 of the calibrated
    # time, and the headroom it spends makes the whole 20 ms a little slower than that
    assert gemm_time(1.0, 1e-7, B)[0] / 1e-7 == pytest.approx(1.05 / 1.2, rel=1e-6)
    assert 1.05 / 1.2 * 0.020 < t < 0.020
    assert h == pytest.approx(math.exp(-0.2))
    # after light time the missing headroom comes back by exp(-t / recover)
    assert recovered(0.4, 0.05, B) == pytest.approx(1 - 0.6 * math.exp(-1))
    assert recovered(0.4, 0.0, B) == 0.4 and recovered(0.4, -1.0, B) == 0.4


def test_continuous_gemms_converge_to_the_hot_rate():
    """GEMMs back to back spend the headroom: each next 10 ms takes longer, towards
    (1 + gain x calibrated) of its calibrated time, the rate GEMMs without end run at."""
    ps = PowerState(B)
    took, now = [], 0.0
    for _ in range(100):
        w, h, free_at = ps.step(now, 0.010, StepWork(0.010, 1, 0, 0, 0, 1024, 0, 0.010, 0.0))
        ps.commit(h, free_at)
        took.append(w)
        now += w
    assert all(a < b for a, b in zip(took, took[1:]))
    assert took[-1] / 0.010 == pytest.approx(1 + B.gain * B.calibrated, rel=1e-4)
    assert took[0] / 0.010 < 0.9  # the first one, from idle, short


def test_the_state_counts_only_compute_bound_steps():
    ps = PowerState(B)
    # a decode step is memory-bound: its work as given, the state untouched
    assert ps.step(0.0, 0.008, DECODE) == (0.008, 1.0, -math.inf)
    # a prefill chunk: its 1 ms of reads as given, its 19 ms of GEMMs from full headroom
    w, h, end = ps.step(0.0, 0.020, GEMM)
    t, h1 = integrate(1.0, 0.019, B)
    assert w == pytest.approx(0.001 + t, rel=1e-9) and h == pytest.approx(h1) and end == pytest.approx(t)


def _backend(profile):
    return sim_backend(settings_for(2 << 20, {Level.GPU: 4}, profile))


def _boosted(tmp_path, **terms):
    d = load_profile("h200-pcie").model_dump(mode="json")
    d["compute"]["boost"] = terms
    path = tmp_path / "boosted.yaml"
    path.write_text(json.dumps(d))  # (JSON is YAML)
    return load_profile(path)


def test_sim_steps_under_the_power_state(tmp_path):
    """A sim backend on a profile with compute.boost: a prefill chunk after idle runs short
    of nominal by the modelled amount; one right after it runs longer than the first
    (the headroom is spent); after 1 s of idle the first one's time again; a decode step
    at its nominal time throughout."""
    p = _boosted(tmp_path, gain=0.2, spend="100ms", recover="50ms", calibrated=0.25)
    rt, be = _backend(p)

    def run(work):
        ev = be.compute(work.seconds, work)
        rt.run(ev)
        return ev.value

    first = run(GEMM)
    assert first == pytest.approx(0.001 + integrate(1.0, 0.019, B)[0], rel=1e-9)
    second = run(GEMM)
    # the second starts where the first's GEMMs ended plus its 1 ms of reads: light time
    h = recovered(math.exp(-0.019 / 0.1), 0.001, B)
    assert second == pytest.approx(0.001 + integrate(h, 0.019, B)[0], rel=1e-9) and second > first
    assert run(DECODE) == 0.008
    rt.run(rt.timeout(1.0))
    assert run(GEMM) == pytest.approx(first, rel=1e-6)  # exp(-1 / 0.05): all back


def test_without_the_key_steps_run_at_the_calibrated_rate():
    rt, be = _backend("h200-pcie")
    assert be.power is None
    ev = be.compute(GEMM.seconds, GEMM)
    rt.run(ev)
    assert ev.value == GEMM.seconds * be.compute_scale  # (the same float as before the key)


def test_profile_keys_are_checked(tmp_path):
    assert _boosted(tmp_path, gain=0.1, spend="80ms", recover="0.2s").compute.boost.calibrated == 0.0
    for bad, key in (({"gain": -0.1, "spend": "80ms", "recover": "1s"}, "compute.boost.gain"),
                     ({"gain": 0.1, "spend": 0, "recover": "1s"}, "compute.boost.spend"),
                     ({"gain": 0.1, "spend": "80ms", "recover": "1s", "calibrated": 1.5},
                      "compute.boost.calibrated"),
                     ({"gain": 0.1, "spend": "80ms", "recover": "1s", "tau": 1}, "compute.boost.tau"),
                     ({"gain": 0.1, "recover": "1s"}, "compute.boost.spend")):
        with pytest.raises(ProfileError, match=key.replace(".", r"\.")):
            _boosted(tmp_path, **bad)


def test_the_cli_refuses_a_bad_boost_naming_the_key(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli import app

    d = load_profile("h200-pcie").model_dump(mode="json")
    d["compute"]["boost"] = {"gain": 0.1, "spend": "-5ms", "recover": "1s"}
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(d))
    out = tmp_path / "res"
    r = CliRunner().invoke(app, ["run", "default", "--set", f"hardware={path}", "--out", str(out),
                                 "--no-progress"])
    assert r.exit_code == 2 and "compute.boost.spend" in r.output and not out.exists()
    assert "Traceback" not in r.output


def _log(b: Boost) -> list[list]:
    """A hw compute log (7 columns) the model itself would give: turns of decode steps,
    each turn a few prefill chunks of 20-300 ms, idle gaps of 0-2 s between turns."""
    ps, rows, t = PowerState(b), [], 0.0
    for turn in range(40):
        gap = (0.0, 0.05, 0.2, 0.5, 2.0)[turn % 5]
        for k in range(1 + turn % 3):
            nominal = 0.02 + 0.04 * ((turn * 7 + k) % 8)
            work = StepWork(nominal, 1, 0, 0, 0, 4096, 0, 0.9 * nominal, 0.1 * nominal)
            w, h, end = ps.step(t + gap, nominal, work)
            ps.commit(h, end)
            rows.append([t + gap, nominal, w, 0.0, gap, 0.0, 0.9 * nominal])
            t += gap + w
            gap = 0.0
        for _ in range(10):
            rows.append([t, 0.008, 0.008, 0.0, 0.0, 0.0, 0.0002])
            t += 0.008
    return rows


def test_fit_recovers_the_terms_of_a_log_the_model_made():
    truth = Boost(0.18, 0.09, 0.2, 0.15)
    steps = fitboost.steps_of(_log(truth))
    assert fitboost.error([steps], truth) == pytest.approx(0.0, abs=1e-12)
    assert fitboost.error([steps], None) > 0.02  # (nominal times miss by a few %)
    b, err = fitboost.fit([steps])
    assert err < 0.002
    assert b.gain == pytest.approx(truth.gain, rel=0.15)
    assert b.spend == pytest.approx(truth.spend, rel=0.25)


def test_steps_of_places_steps_in_gpu_time_and_finds_their_gemm_seconds():
    # an older hw log (6 columns): the GEMM seconds from the sim's rows of the same
    # nominal time, or for a nominal the sim did not run, interpolated over its
    # compute-bound steps when longer than every memory-bound one
    hw = [[0.0, 0.1, 0.09, 0.0, None, 0.0], [0.5, 0.008, 0.008, 0.0, 0.002, 0.0],
          [0.6, 0.2, 0.19, 0.0, 0.3, 0.0], [0.9, 0.007, 0.007, 0.0, 0.0, 0.0]]
    sim = [[0.0, 0.1, 0.1, 0.08], [0.1, 0.008, 0.008, 0.0001], [0.2, 0.3, 0.3, 0.27]]
    steps = fitboost.steps_of(hw, sim)
    assert [s[0] for s in steps] == pytest.approx([0.0, 0.092, 0.4, 0.59])
    assert [s[3] for s in steps] == pytest.approx([0.08, 0.0001, 0.2 * 0.85, 0.0])


def _trains(b: Boost, step_s: float = 0.02) -> list[list]:
    """The rows ``measure_power`` logs, as a GPU with power state ``b`` would time them:
    its trains of GEMM steps after each idle spell, twice."""
    from kvsim_backends.hw.microbench import POWER_IDLE_S, POWER_TRAIN

    ps, rows, t = PowerState(b), [], 0.0
    work = StepWork(step_s, 1, 0, 0, 0, 4096, 0, 0.95 * step_s, 0.05 * step_s)
    for _ in range(2):
        for idle, n in zip(POWER_IDLE_S, POWER_TRAIN):
            gap = idle + 0.0005  # (the host's wait between trains)
            for _ in range(n):
                w, h, end = ps.step(t + gap, step_s, work)
                ps.commit(h, end)
                rows.append([t + gap, step_s, w, 0.0, gap, 0.0, 0.95 * step_s])
                t += gap + w
                gap = 0.0
    return rows


def test_calibrate_fits_the_power_state_from_its_gemm_trains():
    """``kvsim calibrate``'s fit: with the trains measured (``compute["power"]``), the
    profile gets ``compute.boost`` near the terms the trains were made with; without,
    the base's (here none) stays."""
    from kvsim.config.hardware import CONFIG_DIR
    from kvsim.tools.fit import fit as fit_profile
    from kvsim.tools.measured import measured_from_report

    truth = Boost(0.16, 0.086, 0.22, 0.12)
    base = load_profile("h200-pcie")
    report = json.loads((CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml.report.json").read_text())
    m = measured_from_report(report)  # (a calibration saved before the trains were measured)
    assert "power" not in m.compute
    d, _ = fit_profile(m, base)
    assert d["compute"]["boost"] is None
    m.compute["power"] = {"rows": _trains(truth)}
    d, why = fit_profile(m, base)
    got = Boost(**d["compute"]["boost"])
    assert got.gain == pytest.approx(truth.gain, rel=0.15) and got.spend == pytest.approx(truth.spend, rel=0.25)
    assert got.recover == pytest.approx(truth.recover, rel=0.5)
    assert "compute.boost" in why and "GEMM steps in trains" in why["compute.boost"]


def test_calibrate_keeps_a_base_power_state_unless_told_to_fit_the_trains():
    """A base with ``compute.boost`` (fitted on replays) keeps it by default: the trains'
    terms are in the comment, not the profile; ``power_state='fit'`` writes the trains'
    fit; a bad value is refused naming the option."""
    from kvsim.config.hardware import CONFIG_DIR
    from kvsim.tools.fit import fit as fit_profile
    from kvsim.tools.fitboost import check_power_state
    from kvsim.tools.measured import measured_from_report

    truth = Boost(0.28, 0.046, 0.05, 0.03)
    base = load_profile("h200-pcie-calibrated")
    assert base.compute.boost is not None and base.compute.boost.gain != pytest.approx(truth.gain, rel=0.3)
    report = json.loads((CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml.report.json").read_text())
    m = measured_from_report(report)
    m.compute["power"] = {"rows": _trains(truth)}
    d, why = fit_profile(m, base)
    assert Boost(**d["compute"]["boost"]) == Boost(*base.compute.boost.model_dump().values())
    assert why["compute.boost"].startswith("kept: the base's (h200-pcie-calibrated)")
    assert "gain 0.2" in why["compute.boost"]  # (the trains' fit, reported)
    d, why = fit_profile(m, base, power_state="fit")
    assert Boost(**d["compute"]["boost"]).gain == pytest.approx(truth.gain, rel=0.15)
    with pytest.raises(ValueError, match="--power-state hot: expected keep, fit or kvsim compare"):
        check_power_state("hot")


def _replay_rows(b: Boost, n_turns: int = 30) -> list[list]:
    """A hw compute log (``kvsim_backends.hw.logs`` rows) of a replay on a GPU with power
    state ``b``: turns of 1-5 prefill steps of 20-80 ms (GEMMs 85% of each) between runs of
    decode steps of 6-9 ms (light) lasting 0.05-3 s, each step timed as the state says."""
    import random

    rng, ps, rows, t = random.Random(7), PowerState(b), [], 0.0
    for _ in range(n_turns):
        for _ in range(rng.randint(1, 5)):
            step_s = rng.uniform(0.02, 0.08)
            work = StepWork(step_s, 1, 0, 0, 0, 4096, 0, 0.85 * step_s, 0.15 * step_s)
            w, h, end = ps.step(t, step_s, work)
            ps.commit(h, end)
            rows.append([t, step_s, w, w, 0.0001, 0.0, 0.85 * step_s, 0])
            t += w + 0.0001
        light = rng.uniform(0.05, 3.0)
        while light > 0:
            step_s = rng.uniform(0.006, 0.009)
            rows.append([t, step_s, step_s, step_s, 0.0001, 0.0, 0.0, 0])
            t += step_s + 0.0001
            light -= step_s
    return rows


def _compare_folder(path, rows) -> str:
    """A ``kvsim compare`` folder holding only the per-call logs, its hw compute log ``rows``."""
    import gzip

    from kvsim.tools.reports import CALL_LOGS_FILE

    path.mkdir()
    (path / CALL_LOGS_FILE).write_bytes(gzip.compress(json.dumps({"hw_compute": rows}).encode()))
    return str(path)


def test_calibrate_fits_the_power_state_to_earlier_compares_replays(tmp_path):
    """``power_state`` naming compare folders: ``compute.boost`` fitted to their hw replays'
    compute-bound steps, which it predicts far better than the base's terms; a folder
    without a hw compute log, or too few compute-bound steps, is refused naming it."""
    from kvsim.config.hardware import CONFIG_DIR
    from kvsim.tools.fit import fit as fit_profile
    from kvsim.tools.fitboost import MIN_REPLAY_STEPS, check_power_state, error, load_run
    from kvsim.tools.measured import measured_from_report

    truth = Boost(0.10, 0.042, 1.5, 0.0)  # (an H100's, 2026-12-05)
    a = _compare_folder(tmp_path / "a", _replay_rows(truth))
    b = _compare_folder(tmp_path / "b", _replay_rows(truth, 12))
    base = load_profile("h200-pcie-calibrated")
    report = json.loads((CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml.report.json").read_text())
    d, why = fit_profile(measured_from_report(report), base, power_state=f"{a},{b}")
    got = Boost(**d["compute"]["boost"])
    runs = [load_run(a), load_run(b)]
    kept = Boost(*base.compute.boost.model_dump().values())
    assert error(runs, got) < 0.002 < 0.01 < error(runs, kept)
    assert why["compute.boost"].startswith("fitted (kvsim.tools.fitboost): ") and a in why["compute.boost"]
    few = _compare_folder(tmp_path / "few", _replay_rows(truth, 4))
    n = sum(1 for r in load_run(few) if fitboost.compute_bound(r[1], r[3]))
    assert n < MIN_REPLAY_STEPS
    with pytest.raises(ValueError, match=f"{n} compute-bound steps in their hw replays, fewer than"):
        check_power_state(few)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty: no hw compute log"):
        check_power_state(f"{a},{tmp_path / 'empty'}")


@pytest.mark.gpu
def test_gpu_gemm_steps_after_idle_run_short_and_the_fit_says_so():
    """On a GPU (the lead runs it on the H200): calibrate's trains of a prefill chunk's
    steps after idle. The first step after 2 s of idle runs at least 3% short of nominal
    (the 2026-12-03 replays: -5 to -12%), the last steps of a train straight after others
    no shorter than its first (medians of 4, up to 1.5%), and the power state fitted to them
    predicts their GPU times better than the calibrated rate."""
    from kvsim.run.seam import settings_for as sf
    from kvsim.tools.fitkinds import kind_works
    from kvsim.tools.measured import Measured
    from kvsim_backends.hw.gpu import load_cupy
    from kvsim_backends.hw.microbench import POWER_TRAIN, measure_power

    if load_cupy() is None:
        pytest.skip("needs CuPy and a CUDA GPU")
    p = load_profile("h200-pcie-calibrated")
    m = Measured(device="gpu")
    measure_power(m, "gpu", lambda *a, **k: sf(*a, profile=p, **k), kind_works(p)["gemm"])
    rows = m.compute["power"]["rows"]
    assert len(rows) == 2 * sum(POWER_TRAIN)
    first = rows[0]
    assert first[2] < 0.97 * first[1], f"after 2 s idle: {first[2] * 1e3:.2f} ms of {first[1] * 1e3:.2f}"
    # a train straight after others runs at the hot rate: its last steps are no shorter than
    # its first, up to one step's noise (medians of 4 against 4, 1.5%: the boost is 6-8%;
    # single steps differed by -1.0% on the H200, 2026-12-03 10:15)
    last_train = [r[2] for r in rows[sum(POWER_TRAIN[:-1]):sum(POWER_TRAIN)]]
    head, tail = statistics.median(last_train[:4]), statistics.median(last_train[-4:])
    assert tail >= 0.985 * head, f"the hot train's last steps {tail * 1e3:.2f} ms, first {head * 1e3:.2f} ms"
    steps = fitboost.steps_of(rows)
    b, err = fitboost.fit([steps])
    print(f"compute.boost: {b}, mean |rel err| {fitboost.error([steps], None):.2%} -> {err:.2%}")
    assert b.gain > 0 and err < fitboost.error([steps], None)


def test_calibrate_cli_writes_the_replays_power_state(tmp_path):
    """``kvsim calibrate --from-report R --out P --power-state A,B`` writes the terms the
    replays fit (as ``fitboost.fit`` fits them) and says where they came from; every
    other key as without the option."""
    from typer.testing import CliRunner

    from kvsim.cli import app
    from kvsim.config.hardware import CONFIG_DIR
    from kvsim.tools.fitboost import fit, load_run

    truth = Boost(0.10, 0.042, 1.5, 0.0)
    a = _compare_folder(tmp_path / "a", _replay_rows(truth))
    b = _compare_folder(tmp_path / "b", _replay_rows(truth, 12))
    report = str(CONFIG_DIR / "hardware" / "h200-pcie-calibrated.yaml.report.json")
    out, plain = tmp_path / "p.yaml", tmp_path / "q" / "p.yaml"
    r = CliRunner().invoke(app, ["calibrate", "--from-report", report, "--out", str(out),
                                 "--power-state", f"{a},{b}"])
    assert r.exit_code == 0, r.output
    want, _ = fit([load_run(a), load_run(b)])
    got = load_profile(out).compute.boost
    assert (got.gain, got.spend, got.recover, got.calibrated) == pytest.approx(tuple(want), rel=1e-4)
    assert "compute.boost: fitted (kvsim.tools.fitboost): " in out.read_text()
    assert CliRunner().invoke(app, ["calibrate", "--from-report", report, "--out", str(plain)]).exit_code == 0
    p, q = load_profile(out).model_dump(), load_profile(plain).model_dump()
    assert p["compute"].pop("boost") != q["compute"].pop("boost")
    # the two runs may straddle a minute: the notes' re-fit time is theirs, the rest is equal
    when = re.compile(r"\(\d{4}-\d\d-\d\d \d\d:\d\d UTC\)")
    pn, qn = (when.sub("(T)", d.pop("notes")) for d in (p, q))
    assert pn == qn and "re-fitted offline from" in pn
    assert p == q
