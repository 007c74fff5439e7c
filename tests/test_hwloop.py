"""The hw backend's own host costs, as kvsim compare's sim side adds them (kvsim.tools.hwloop,
kvsim_backends.sim.loopcosts), on the round-number profile of test_sim_backend (timings by
hand); the hardware profile refusing those terms; and the guard of the move: a saved H200
run re-predicted as before.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import round_profile  # noqa: E402
from kvsim.run.seam import settings_for
from kvsim.backend import Backend
from kvsim.config import load_config
from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.plan import Fill
from kvsim.core.spec import Level
from kvsim.config.hardware import HardwareProfile, ProfileError, load_profile
from kvsim.tools.hwloop import HwLoop, HwLoopModel, StepCost, load_hw_loop
from test_sim_backend import DISK_LAT, H2D, batch, finish

from kvsim_backends.sim import SimBackend, SimRuntime
from kvsim_backends.sim.loopcosts import HwLoopSim

KiB = 2**10
CHECK = {"latency": "50us", "ctas": 4}
CHECK_LAT = 50e-6


def make(profile=None, page_bytes=256 * KiB, **model):
    """A SimBackend on ``profile`` (round) wrapped in a HwLoop of ``model``'s terms."""
    rt = SimRuntime()
    inner = SimBackend(rt, settings_for(page_bytes, {lv: 64 for lv in Level}, profile or round_profile(), copy_path=model.pop("copy_path", None)))
    loop = HwLoop(HwLoopModel.model_validate(model))
    return rt, HwLoopSim(inner, loop), loop


def test_the_wrapped_sim_is_a_backend_and_charges_nothing_by_default():
    rt, be, loop = make()
    assert isinstance(be, Backend) and be.name == "sim" and be.runtime is rt
    t, ok = finish(rt, be.transfer(batch(Level.HOST, Level.GPU, 4)))
    rt2 = SimRuntime()
    plain = SimBackend(rt2, settings_for(256 * KiB, {lv: 64 for lv in Level}, round_profile()))
    assert (t, ok) == finish(rt2, plain.transfer(batch(Level.HOST, Level.GPU, 4)))
    loop.resumed(100)
    assert loop.owed_s == 0.0  # the model "none" charges nothing
    assert load_hw_loop("none") == HwLoopModel()


def test_a_check_without_tags_is_immediate():
    rt = SimRuntime()
    inner = SimBackend(rt, settings_for(256 * KiB, {lv: 64 for lv in Level}, round_profile(), refcheck=False))
    be = HwLoopSim(inner, HwLoop(HwLoopModel(refcheck=CHECK)))
    assert be.read_tags_later(Level.HOST, np.arange(4)) is None


@pytest.mark.parametrize("level", [Level.GPU, Level.HOST, Level.DISK])
def test_a_check_takes_the_hw_checks_time(level):
    """refcheck.latency, then 8 pages of 256 KiB read: GPU from HBM (4 TB/s), host across
    the link toward the GPU (50 GB/s), disk with its latency at its read rate; the value
    is the tags."""
    rt, be, _ = make(refcheck=CHECK)
    slots = np.arange(8) * 3
    tags = np.arange(1, 9, dtype=np.uint64)
    be.fill(Fill(level, slots, tags))
    t, got = finish(rt, be.read_tags_later(level, slots))
    nbytes = 8 * 256 * KiB
    op = 256 * KiB
    want = {Level.GPU: nbytes / 4e12, Level.HOST: nbytes / H2D,
            Level.DISK: DISK_LAT + nbytes / min(2e9, 4 * op / (DISK_LAT + op / 2e9))}[level]
    assert t == pytest.approx(CHECK_LAT + want, rel=1e-9)
    assert (np.asarray(got) == tags).all()
    assert be.checks_modeled == 1


def test_a_host_check_beside_compute_slows_both():
    """A host-page check's 4 CTAs slow compute by 0.2 while they read (0.05 a CTA) and
    read at half rate while compute runs: 2 MiB at 25 GB/s after the 50 us latency."""
    rt, be, _ = make(refcheck=CHECK)
    be.fill(Fill(Level.HOST, np.arange(8), np.arange(1, 9, dtype=np.uint64)))
    done = be.compute(1e-3)
    t_check, _ = finish(rt, be.read_tags_later(Level.HOST, np.arange(8)))
    read = 8 * 256 * KiB / (H2D * 0.5)
    assert t_check == pytest.approx(CHECK_LAT + read, rel=1e-9)
    _, took = finish(rt, done)
    assert took == pytest.approx(1e-3 + read * 0.2 / 1.2, rel=1e-9)


def test_a_held_host_check_stops_the_step_beside_it():
    """refcheck.holds_sms: host: a check of 8 host pages (2 MiB) launched beside a 1 ms step
    holds every SM while it reads, at the SM copy kernel's ceiling (25 GB/s here, below the
    link's 50) and at that full rate (the held step takes no SM from it): the step makes no
    progress for those 84 us and ends that much later, not slowed otherwise."""
    sm = {"count": 8, "cta_onboard": "10GB/s", "cta_offload": "10GB/s", "threads_per_cta": 128,
          "copy_cta_slots": 8, "launch": "5us", "h2d": "25GB/s",
          "interference": {"sm_kernel_slowdown": 0.2, "sm_kernel_ctas": 4,
                           "copy_engine_slowdown": 0.1, "busy_cta_efficiency": 0.5}}
    rt, be, _ = make(round_profile(sm=sm), refcheck={**CHECK, "holds_sms": "host"})
    be.fill(Fill(Level.HOST, np.arange(8), np.arange(1, 9, dtype=np.uint64)))
    done = be.compute(1e-3)
    t_check, _ = finish(rt, be.read_tags_later(Level.HOST, np.arange(8)))
    read = 8 * 256 * KiB / 25e9
    assert t_check == pytest.approx(CHECK_LAT + read, rel=1e-9)
    _, took = finish(rt, done)
    assert took == pytest.approx(1e-3 + read, rel=1e-9)


@pytest.mark.parametrize("holds", ["none", "host", "all"])
def test_which_checks_hold_the_sms(holds):
    """A check of 8 GPU pages (2 MiB from HBM, 4 TB/s) beside a 1 ms step: held only with
    ``all`` (the step ends the read's time later), else its 4 CTAs slow the step as before
    (``none`` and ``host`` alike, by less than the read's time)."""
    def took(h):
        rt, be, _ = make(refcheck={**CHECK, "holds_sms": h})
        be.fill(Fill(Level.GPU, np.arange(8), np.arange(1, 9, dtype=np.uint64)))
        done = be.compute(1e-3)
        finish(rt, be.read_tags_later(Level.GPU, np.arange(8)))
        return finish(rt, done)[1]

    read = 8 * 256 * KiB / 4e12
    if holds == "all":
        assert took(holds) == pytest.approx(1e-3 + read, rel=1e-9)
    else:
        assert took(holds) == took("none") and 1e-3 < took(holds) < 1e-3 + read


def test_a_check_reads_the_tags_as_they_were_when_it_started():
    """As on hw (a later write into a checked slot waits for the check), a slot rewritten
    while its modelled check runs does not change what the check found."""
    rt, be, _ = make(refcheck=CHECK)
    old, new = np.arange(1, 9, dtype=np.uint64), np.arange(11, 19, dtype=np.uint64)
    be.fill(Fill(Level.GPU, np.arange(8), old))
    ev = be.read_tags_later(Level.GPU, np.arange(8))
    be.fill(Fill(Level.GPU, np.arange(8), new))  # before the check's time has passed
    _, got = finish(rt, ev)
    assert (np.asarray(got) == old).all()
    assert (np.asarray(be.read_tags(Level.GPU, np.arange(8))) == new).all()


@pytest.mark.parametrize("path", [CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL])
def test_transfer_and_disk_are_added_to_batches_with_a_gpu_or_disk_leg(path):
    """``transfer`` and ``disk``: a batch with a GPU leg completes ``transfer`` later (on
    either copy path), one with a disk leg ``disk`` later, GPU <-> disk both, on top of the
    profile's transfer.latency; without them nothing is added."""
    def took(src, dst, **model):
        rt, be, _ = make(round_profile(transfer={"latency": "10us"}), copy_path=path, **model)
        t, ok = finish(rt, be.transfer(batch(src, dst, 4)))
        assert ok
        return t

    gpu, disk = 100e-6, 700e-6
    # (src, dst): (has a GPU leg, has a disk leg)
    legs = {(Level.GPU, Level.HOST): (1, 0), (Level.HOST, Level.GPU): (1, 0),
            (Level.GPU, Level.DISK): (1, 1), (Level.DISK, Level.GPU): (1, 1),
            (Level.HOST, Level.DISK): (0, 1), (Level.DISK, Level.HOST): (0, 1)}
    for (src, dst), (g, d) in legs.items():
        off = took(src, dst)
        assert off > 10e-6, (src, dst)
        on = took(src, dst, transfer="100us", disk="700us")
        assert on - off == pytest.approx(g * gpu + d * disk, rel=1e-9), (src, dst)
        only_gpu = took(src, dst, transfer="100us")
        assert only_gpu - off == pytest.approx(g * gpu, abs=1e-12), (src, dst)


def test_a_resume_holds_the_next_compute_start_by_the_loops_host_time():
    """resume + pages x resume_per_page: the compute after a resume starts that much later
    (once: the next compute is not held; two resumes before one compute add up; a resume
    of no pages adds nothing), and the engine cannot run ahead meanwhile."""
    rt, be, loop = make(resume="1ms", resume_per_page="2us")
    assert be.compute_ahead(0.0, 1e-3, True) == pytest.approx(1e-3)  # nothing owed yet
    t0 = rt.now
    loop.resumed(100)  # 1 ms + 100 x 2 us
    loop.resumed(1)    # + 1 ms + 2 us
    loop.resumed(0)    # + nothing
    assert be.compute_ahead(t0, 1e-3, True) is None  # the held start goes through compute()
    t, took = finish(rt, be.compute(1e-3))
    assert took == pytest.approx(1e-3, rel=1e-12)
    assert t - t0 == pytest.approx(1e-3 + 100 * 2e-6 + 1e-3 + 2e-6 + 1e-3, rel=1e-12)
    t0 = rt.now
    t, _ = finish(rt, be.compute(1e-3))  # the next one is not held
    assert t - t0 == pytest.approx(1e-3, rel=1e-12)


def test_a_check_of_gpu_pages_adds_its_launch_and_starts_when_the_hold_ends():
    """refcheck.launch_per_page a GPU page is added to the hold, and the check starts when
    the hold ends (the loop launches it last), beside the held step."""
    rt, be, loop = make(resume="1ms", resume_per_page="2us",
                        refcheck={"latency": "10us", "ctas": 4, "launch_per_page": "5us"})
    loop.resumed(4)
    chk = be.read_tags_later(Level.GPU, np.arange(4))
    comp = be.compute(1e-3)  # the engine's next step, at the same time
    ends = {}
    chk.callbacks.append(lambda e: ends.setdefault("check", rt.now))
    comp.callbacks.append(lambda e: ends.setdefault("compute", rt.now))
    rt.run()
    hold = 1e-3 + 4 * 2e-6 + 4 * 5e-6
    assert hold + 10e-6 < ends["check"] < hold + 1e-3  # launched at the hold's end: beside the step
    assert ends["compute"] == pytest.approx(hold + 1e-3, rel=0.05)  # (the check slows it a little)
    assert ends["compute"] > hold + 1e-3


def test_a_check_started_at_its_launch_reads_during_the_hold():
    """refcheck.start: launch: the check of 4 GPU pages starts when the engine launches it
    (its latency, then 1 MiB read at HBM's rate), inside the loop's 1 ms hold, so the step
    held behind it starts at the hold's end and is not slowed."""
    rt, be, loop = make(resume="1ms", resume_per_page="2us",
                        refcheck={"latency": "10us", "ctas": 4, "launch_per_page": "5us",
                                  "start": "launch"})
    loop.resumed(4)
    chk = be.read_tags_later(Level.GPU, np.arange(4))
    comp = be.compute(1e-3)
    ends = {}
    chk.callbacks.append(lambda e: ends.setdefault("check", rt.now))
    comp.callbacks.append(lambda e: ends.setdefault("compute", rt.now))
    rt.run()
    hold = 1e-3 + 4 * 2e-6 + 4 * 5e-6
    read = 4 * 256 * KiB / 4e12  # (read from HBM at 4 TB/s, as test_a_check_takes_the_hw_checks_time)
    assert ends["check"] == pytest.approx(10e-6 + read, rel=1e-6)
    assert ends["check"] < hold
    assert ends["compute"] == pytest.approx(hold + 1e-3, rel=1e-12)  # not slowed: done before


def test_the_shipped_model_starts_checks_at_their_launch_and_a_bad_start_is_refused(tmp_path):
    assert load_hw_loop("h200").refcheck.start == "launch"
    assert HwLoopModel().refcheck.start == "hold_end"  # (a model without the key: as before)
    bad = tmp_path / "bad.yaml"
    bad.write_text("refcheck: {start: later}\n")
    with pytest.raises(ProfileError) as e:
        load_hw_loop(bad)
    assert f"{bad}: refcheck.start" in str(e.value)


def test_the_shipped_model_holds_the_sms_for_host_checks_and_a_bad_value_is_refused(tmp_path):
    assert load_hw_loop("h200").refcheck.holds_sms == "host"
    assert HwLoopModel().refcheck.holds_sms == "none"  # (a model without the key: as before)
    bad = tmp_path / "bad.yaml"
    bad.write_text("refcheck: {holds_sms: gpu}\n")
    with pytest.raises(ProfileError) as e:
        load_hw_loop(bad)
    assert f"{bad}: refcheck.holds_sms" in str(e.value)


# -- the spec and the hardware profile ------------------------------------------------------


def test_the_shipped_model_loads_and_a_bad_one_is_refused_by_file_and_key(tmp_path):
    m = load_hw_loop("h200")
    assert m.resume > 0 and m.resume_per_page > 0 and m.transfer > 0 and m.disk > 0
    assert m.refcheck.latency > 0 and m.refcheck.launch_per_page > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("resume: -1ms\nrefcheck: {ctas: 0}\n")
    with pytest.raises(ProfileError) as e:
        load_hw_loop(bad)
    assert f"{bad}: resume" in str(e.value) and f"{bad}: refcheck.ctas" in str(e.value)


@pytest.mark.parametrize("key", ["loop", "refcheck"])
def test_a_hardware_profile_with_the_loops_terms_is_refused_naming_the_key(tmp_path, key):
    """The hardware profile describes hardware: an older profile that still carries the
    hw backend's loop or refcheck costs is refused, naming the file and the key and where
    they went, by the loader and by kvsim run (exit code 2, nothing written)."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    src = load_profile("h200-pcie").model_dump(mode="json")
    src[key] = {"resume": 1e-3} if key == "loop" else {"latency": 1e-4, "ctas": 132}
    path = tmp_path / "old.yaml"
    path.write_text(json.dumps(src))  # (JSON is YAML)
    with pytest.raises(ProfileError, match=f"{path}: .*{key}: not a hardware term.*kvsim.tools.hwloop"):
        load_profile(path)
    out = tmp_path / "res"
    r = CliRunner().invoke(app, ["run", "default", "--set", f"hardware={path}", "--out", str(out),
                                 "--no-progress"])
    assert r.exit_code == 2 and f"{key}: not a hardware term" in r.output and not out.exists()


def test_a_saved_runs_recorded_profile_gives_up_its_loop_terms(tmp_path):
    """A run saved while the loop terms were part of the hardware profile recorded them
    there: --hw-from reads its profile without them and its hw-loop model from them (which
    --saved-profile then uses, unless told otherwise); one that records its compare's model
    gives that."""
    from kvsim.tools.compare import saved_hw
    from kvsim.tools.reports import read_report

    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder)
    summary = json.loads((folder / "hw" / "summary.json").read_text())
    prof = load_profile("h200-pcie-calibrated").model_dump(mode="json")
    summary["hardware_profile"] = {**prof, "loop": {"resume": 1e-3, "transfer": 2e-4},
                                   "refcheck": {"latency": 3e-4, "ctas": 64, "launch_per_page": 1e-7}}
    (folder / "hw" / "summary.json").write_text(json.dumps(summary))
    cfg = load_config("agentic-slice")
    hw, _, _, loop = saved_hw(folder, cfg)
    assert hw.profile == load_profile("h200-pcie-calibrated")
    assert (loop.resume, loop.resume_per_page, loop.transfer, loop.disk) == (1e-3, 0.0, 2e-4, 0.0)
    assert loop.refcheck.model_dump() == {"latency": 3e-4, "ctas": 64, "launch_per_page": 1e-7,
                                          "start": "hold_end", "holds_sms": "none"}  # (as then)
    summary["hardware_profile"]["refcheck"]["gpu_stall"] = 1.0  # not a term it knows
    (folder / "hw" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="(?s)hardware_profile: loop/refcheck: .*gpu_stall"):
        saved_hw(folder, cfg)
    del summary["hardware_profile"]["loop"], summary["hardware_profile"]["refcheck"]
    (folder / "hw" / "summary.json").write_text(json.dumps(summary))
    assert saved_hw(folder, cfg)[3] is None  # a profile without them, no model recorded
    report = read_report(folder)
    (folder / "compare.json").write_text(json.dumps({**report, "hw_loop": {"name": "x", "resume": 5e-3}}))
    assert saved_hw(folder, cfg)[3] == HwLoopModel(name="x", resume=5e-3)


# -- the guard: a saved hw run re-predicted as before the terms moved ------------------------

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "h200-agentic-slice"  # (refcheck off)
SESSIONS = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "agentic-coding" / "sessions"
SLICE = [SESSIONS / f"trace_000{i}.json.gz" for i in (1, 2, 3)]

# kvsim compare configs/agentic-slice.yaml --trace SLICE --set engine.fast_forward=false
#   [--set engine.refcheck=false] --hw-from FIXTURE, with the code before the move (the
#   terms in the h200-pcie-calibrated profile, SimBackend(model_loop, model_refcheck)): the
#   sim side's TTFT p50 / p90 and hit tokens by tier
BEFORE = {
    False: {"ttft_p50_s": 0.17636704749999998, "ttft_p90_s": 1.741165032200003,
            "hit_tokens_gpu": 5166688, "hit_tokens_host": 121232, "hit_tokens_disk": 55632},
    True: {"ttft_p50_s": 0.20432951700000002, "ttft_p90_s": 1.7236134298000036,
           "hit_tokens_gpu": 5155232, "hit_tokens_host": 134240, "hit_tokens_disk": 54080},
}


@pytest.mark.skipif(not all(p.exists() for p in SLICE), reason="../shared/traces not present")
@pytest.mark.parametrize("refcheck", [False, True])
def test_the_saved_h200_slice_run_is_predicted_as_before_the_move(tmp_path, refcheck):
    """The H200 replay of the agentic slice (refcheck off), re-predicted by the sim side
    with the default hw-loop model, as the run was (refcheck off: the resume, transfer and
    disk terms) and with the refcheck on (the check's terms too): the same TTFT p50 / p90
    and hit tokens by tier as the code gave before the terms left the hardware profile.
    Without the model the prediction differs: the terms are in play."""
    from kvsim.tools.compare import compare_saved

    trace = tmp_path / "slice"
    trace.mkdir()
    for p in SLICE:
        shutil.copy(p, trace / p.name)
    cfg = load_config("agentic-slice", ["engine.fast_forward=false", f"engine.refcheck={str(refcheck).lower()}"])
    # the config's profile as it was then (its 2026-11-29 calibration), with the busy SM
    # kernel's terms as they were then too (the check's kernel under compute runs at
    # busy_cta_efficiency of the link, so the later fitted share moves the refcheck-on
    # prediction: TTFT p50 0.2043 -> 0.1999 s)
    d = load_profile(FIXTURE / "h200-pcie-calibrated-2324.yaml").model_dump()
    d["sm"]["interference"].update(busy_cta_efficiency=0.4, busy_start=0.0)
    then = HardwareProfile.model_validate(d)
    # (and the check placed as it was then: at the hold's end, holding no SM; no step terms)
    model = load_hw_loop("h200")
    model = model.model_copy(update={"refcheck": model.refcheck.model_copy(
        update={"start": "hold_end", "holds_sms": "none"}), "step": StepCost()})
    report, _ = compare_saved(cfg, FIXTURE, str(trace), profile=then, hw_loop=model)
    got = {k: report["metrics"][k]["sim"] for k in BEFORE[refcheck]}
    assert got == pytest.approx(BEFORE[refcheck], rel=1e-12)
    assert report["hw_loop"]["name"] == "h200" and report["metrics"]["requests_completed"]["sim"] == 90
    if refcheck:
        bare, _ = compare_saved(cfg, FIXTURE, str(trace), hw_loop=HwLoopModel(), profile=then)
        assert bare["metrics"]["ttft_p50_s"]["sim"] != pytest.approx(BEFORE[True]["ttft_p50_s"], rel=1e-3)


@pytest.mark.skipif(not all(p.exists() for p in SLICE), reason="../shared/traces not present")
def test_the_saved_run_with_the_profile_it_ran_with_from_the_command_line(tmp_path):
    """The README's re-prediction of the saved run, with the profile it ran with and the
    hw-loop terms that went with it (``--hw-loop``: a file beside the profile): the same
    sim side as before the terms left the profile; the old profile itself is refused by
    name, nothing written."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    trace = tmp_path / "slice"
    trace.mkdir()
    for p in SLICE:
        shutil.copy(p, trace / p.name)
    args = ["compare", "agentic-slice", "--trace", str(trace), "--set", "engine.fast_forward=false",
            "--set", "engine.refcheck=false", "--hw-from", str(FIXTURE)]
    prof = FIXTURE / "h200-pcie-calibrated-1955.yaml"
    out = tmp_path / "cmp"
    r = CliRunner().invoke(app, [*args, "--set", f"hardware={prof}", "--hw-loop",
                                 str(FIXTURE / "hwloop-1955.yaml"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "compare.json").read_text())["metrics"]
    before = {"ttft_p50_s": 0.1434631025, "ttft_p90_s": 1.7931464368000007,
              "hit_tokens_gpu": 5134992, "hit_tokens_host": 153168, "hit_tokens_disk": 55392}
    assert {k: m[k]["sim"] for k in before} == pytest.approx(before, rel=1e-12)
    old = tmp_path / "old.yaml"
    old.write_text(prof.read_text() + "refcheck: {latency: 46.8us, ctas: 132}\n")
    r = CliRunner().invoke(app, [*args, "--set", f"hardware={old}", "--out", str(tmp_path / "no")])
    assert r.exit_code == 2 and "refcheck: not a hardware term" in r.output
    assert not (tmp_path / "no").exists()
