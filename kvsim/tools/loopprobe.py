"""The hw loop's step terms measured on this machine, before a compare.

``kvsim compare``'s sim side predicts a hw replay with the hw backend's own host costs
(``kvsim.tools.hwloop``). Its ``step`` terms (the compute stream's idle gap before each
engine step, and the overrun of a memory-bound step's events beyond nominal: the loop's
launch inside them, ``kvsim.tools.fitgap``) differ between machines and between runs: the
shipped ``configs/hwloop/h200.yaml`` (a 2026-12-03 machine) has a gap of 79 us and 0.71% of
reads beyond 4.7 ms, two replays of the agentic slice on another H200 (2026-12-05) fitted
96-101 us and 2.3-2.6% beyond 3.1-3.9 ms. Memory-bound decode steps stretched that way
make hw's other turns wait longer behind them, so the sim with the shipped terms put that
machine's TTFT p90 11% low, and with the other run's fitted terms 6%.

The probe replays a short synthetic workload of its own (``PROBE``: three sessions of up
to three turns, long contexts, so that decode steps of 5-10 ms dominate) on the hw
backend, with the compared config's model, page size, engine and hardware profile, and fits
the step terms to its compute log as ``kvsim.tools.fitgap`` does. It never replays the
compared trace: the compare's hw run stays out of sample. On an H100 (2026-12-05) three
probes in a row fitted gaps of 48.6, 43.9 and 40.4 us before a replay of the agentic
slice's first 15 turns that ran 42.7 us (the shipped terms: 79.2), and overruns that put
1.41, 0.83 and 0.49 s on that replay's steps, which ran 0.84 s over (the shipped terms:
0.25 s). The gap is measured well; the overrun varies from run to run as hw's own does
(two slice replays on one H200: +3.41 and +2.55 s), so one probe gets it within about a
factor of 2 at best: on another H100 the probes before two replays measured +2.6 to +3.3%
and -3.1 to -3.5% a read second, where the replays' quiet steps ran x1.014 and x1.025
(docs/compute.md). ``kvsim compare --calibrate`` runs it after calibrating, on a GPU and unless
``--hw-loop`` names a model, and writes the model it used to ``OUT/hwloop.yaml``.

Its resumes of GPU pages (five, 248-3,476 with Llama 3 8B: the shared prefix, later turns;
the four past its first ``WARMUP_STEPS`` steps count) scale the model's host costs at a
resume (``fit_host``): the loop's Python work, which a host's speed moves. Fitted to the
resumes of whole slice replays (turns with GPU hits only, paired by their admission time):
an H100 machine's host x1.364 / x1.363 in two runs, the 15:40 H200's x1.139; with x1.36
and the power state fitted on the other run the H100 pair's per-turn TTFT median went from
-5.5 / -2.6% to -1.3 / +0.7% (docs/validation.md, 2026-12-05 18:03). Not yet run on a GPU
as a probe. The other terms are the base model's, kept.
"""

from __future__ import annotations

import bisect
import statistics
import time
from pathlib import Path
from typing import Sequence

import yaml

from kvsim.config import RunConfig
from kvsim.config.workload import SyntheticConfig, WorkloadConfig
from kvsim.tools.fitboost import compute_bound, steps_of
from kvsim.tools.fitgap import fit, ordinary
from kvsim.tools.hwloop import HwLoopModel, StepCost

# the probe's workload: decode-heavy sessions with contexts of 45-60k tokens: with Llama 3
# 8B its decode steps run 5.3-9.7 ms nominal (p5-p95; the agentic slice's 5.6-10.3 ms),
# 1,473 of them in 16.5 s simulated (the agentic slice's profile and cache)
PROBE = WorkloadConfig(kind="synthetic", start="poisson", sessions_per_s=1.0, synthetic=SyntheticConfig(
    n_sessions=3, seed=0, turns=(3, 3), prefix_tokens=4000, first_input_tokens=45000,
    step_input_tokens=1500, output_tokens=300, think_s=0.5, max_context_tokens=90000,
    subagent_prob=0.0))
MIN_STEPS = 200  # fewer ordinary steps than this: too few to fit, refused
MIN_RESUMES = 4  # fewer resumes of GPU pages than this (the probe has five, four past the
# warm-up): host costs kept
# a hw replay's first steps lag 1-5 ms whatever precedes them (the first ten compute calls
# of four slice replays, two H100s and an H200, against medians of 13-67 us after): a resume
# before one of them is not told by its lag, and is left out of the host scale
WARMUP_STEPS = 10
# a host scale outside this is not a host's speed (a loop that fell behind for another
# reason: the CPU mode's on a 2-core VM came out x2621): host costs kept
HOST_SCALE_RANGE = (1 / 3, 3.0)
PROBE_GPU = "24GiB"  # the probe's one tier (its three sessions hold at most 20.3 GiB with Llama 3 8B)


def probe_config(cfg: RunConfig) -> RunConfig:
    """``cfg`` with the probe's workload in place of its own and one tier, the GPU's, of
    ``PROBE_GPU`` (its sessions fit: no transfer runs beside its steps); its model, page
    size, engine and hardware kept."""
    d = cfg.model_dump(mode="json")
    cache = {**d["cache"], "tiers": [{"level": "gpu", "quota": PROBE_GPU}]}
    return RunConfig.model_validate({**d, "name": f"{cfg.name}-loop-probe",
                                     "workload": PROBE.model_dump(mode="json"),
                                     "cache": cache})


def check(cfg: RunConfig) -> None:
    """ValueError unless the probe, replayed on the sim (a fraction of a second), completes
    every request and runs ``MIN_STEPS`` memory-bound steps or more with ``cfg``'s model
    and engine: before anything is measured."""
    from kvsim.run import prepare_run, replay  # noqa: PLC0415

    log: list = []
    res = replay(prepare_run(probe_config(cfg)), "sim", backend_options={"compute_log": log})
    steps = sum(1 for r in log if not compute_bound(r[1], r[3]))
    failed = res.metrics.get("requests_failed", 0)
    if failed or steps < MIN_STEPS:
        raise ValueError(f"hw loop probe: with model {cfg.model!r} its replay on the sim failed "
                         f"{failed} request(s) and ran {steps} memory-bound steps (needs "
                         f"{MIN_STEPS}); pass --hw-loop to compare with a model of your own")


def fit_steps(hw_compute: list, base: HwLoopModel) -> tuple[HwLoopModel, dict]:
    """``base`` with its ``step`` terms fitted to a hw compute log, and what was fitted:
    the ordinary steps' count and summed overrun, and the overrun a read second in each
    third of them (in order). ValueError with fewer than ``MIN_STEPS`` ordinary steps."""
    rows = ordinary(steps_of(hw_compute))
    if len(rows) < MIN_STEPS:
        raise ValueError(f"hw loop probe: {len(rows)} ordinary steps, fewer than {MIN_STEPS} "
                         "to fit the loop's step terms")
    t = fit([rows])
    step = StepCost(gap=t["gap"], overrun_rate=t["overrun_rate"], overrun_after=t["overrun_after"])
    name = f"{base.name}-probed" if base.name != "none" else "probed"
    model = base.model_copy(update={"step": step, "name": name})
    k = len(rows) // 3  # (whether the overrun settles as the probe runs: per read second, by third)
    thirds = [rows[:k], rows[k:2 * k], rows[2 * k:]]
    by_third = [sum(r[2] for r in p) / sum(r[1] for r in p) for p in thirds]
    return model, {"steps": len(rows), "overrun_s": sum(r[2] for r in rows), **t,
                   "overrun_per_read_s_by_third": by_third}


def fit_host(hw_compute: list, resumes: list[tuple[int, int]], model: HwLoopModel,
             checked: bool, starts: Sequence[int] = (0,)) -> tuple[HwLoopModel, dict]:
    """``model`` with its host costs at a resume (``resume``, ``resume_per_page``,
    ``refcheck.launch_per_page``) scaled to this machine's host, and what was fitted.
    ``resumes``: (the index in ``hw_compute`` of the step launched next, the GPU pages)
    of each resumed request; that step's host lag (the log's 6th column) beyond the
    median step's is what the resumes before it cost the loop. The scale is the least-
    squares one over those steps (what ``model`` charges them, with the check's launch
    where ``checked``); fewer than ``MIN_RESUMES``, or a scale outside
    ``HOST_SCALE_RANGE``: ``model`` unchanged, ``host_scale`` None. Resumes within
    ``WARMUP_STEPS`` steps of a replay's first are not counted (``warmup_resumes``;
    ``starts``: the row each replay's log begins at, where ``hw_compute`` joins several,
    sorted). The terms came
    from a 2026-12-03 H200 machine; on slice replays of 2026-12-05 an H100 machine's host
    came out x1.364 / x1.363, another H200's x1.139 (``kvsim.tools.fithost``)."""
    lags = [r[5] for r in hw_compute if len(r) > 5 and r[5] is not None]
    owed: dict[int, float] = {}
    per_check = model.refcheck.launch_per_page if checked else 0.0
    early = 0
    for i, pages in resumes:
        if pages > 0 and i - starts[bisect.bisect_right(starts, i) - 1] < WARMUP_STEPS:
            early += 1
        elif pages > 0 and i < len(hw_compute):
            owed[i] = owed.get(i, 0.0) + model.resume_s(pages) + pages * per_check
    said = {"resumes": len(owed), **({"warmup_resumes": early} if early else {})}
    if len(owed) < MIN_RESUMES or not lags:
        return model, {**said, "host_scale": None}
    base = statistics.median(lags)
    pairs = [(hw_compute[i][5] - base, m) for i, m in sorted(owed.items())]
    k = sum(lag * m for lag, m in pairs) / sum(m * m for _, m in pairs)
    fitted = {**said, "host_lag_s": sum(p[0] for p in pairs), "host_model_s": sum(p[1] for p in pairs)}
    if not HOST_SCALE_RANGE[0] <= k <= HOST_SCALE_RANGE[1]:
        return model, {**fitted, "host_scale": None, "host_scale_refused": k}
    check = model.refcheck.model_copy(update={"launch_per_page": model.refcheck.launch_per_page * k})
    scaled = model.model_copy(update={"resume": model.resume * k, "resume_per_page": model.resume_per_page * k,
                                      "refcheck": check})
    return scaled, {**fitted, "host_scale": k}


def measure(cfg: RunConfig, base: HwLoopModel, hw_options: dict | None = None) -> tuple[HwLoopModel, dict]:
    """Replay the probe (``probe_config``) on the hw backend and fit the loop's step
    terms on top of ``base`` (``fit_steps``), then its host costs at a resume
    (``fit_host``); the report adds its wall seconds."""
    from kvsim.run import prepare_run, replay  # noqa: PLC0415 (the run package imports tools)

    t0 = time.perf_counter()
    hw_compute: list = []
    resumes: list[tuple[int, int]] = []  # (the next step's row, pages) of each resume
    replay(prepare_run(probe_config(cfg)), "hw",
           backend_options={**(hw_options or {}), "compute_log": hw_compute},
           on_resume=lambda pages: resumes.append((len(hw_compute), pages)))
    model, report = fit_steps(hw_compute, base)
    model, host = fit_host(hw_compute, resumes, model, cfg.engine.refcheck)
    report.update(host)
    report["seconds"] = time.perf_counter() - t0
    return model, report


def loop_yaml(model: HwLoopModel, report: dict, when: str) -> str:
    """The probed model as a ``configs/hwloop`` file (``load_hw_loop`` reads it back), its
    step terms under a comment that says how they were measured."""
    d = model.model_dump(mode="json")
    step = d.pop("step")
    head = {k: v for k, v in d.items() if k != "notes"}
    text = (f"# The hw loop's model for this compare (kvsim.tools.hwloop). The step terms were\n"
            f"# measured here ({when}): kvsim.tools.loopprobe's synthetic workload replayed on\n"
            f"# the hw backend, {report['steps']} ordinary steps (overrun {report['overrun_s']:+.3f} s;\n"
            f"# a read second's, by third of the run: {_thirds(report)}),\n"
            f"# fitted as kvsim.tools.fitgap fits them; {host_scale_text(report)};\n"
            f"# every other term is the base model's.\n")
    text += yaml.safe_dump(head, sort_keys=False)
    text += "step:\n" + "".join(f"  {k}: {_sec(k, v)}\n" for k, v in step.items())
    text += yaml.safe_dump({"notes": d.get("notes", "")}, sort_keys=False)
    return text


def host_scale_text(report: dict) -> str:
    """What ``fit_host`` made of the host costs at a resume, in words (the probe's file and
    console line, ``kvsim.tools.fithost``'s lines)."""
    k = report.get("host_scale")
    lag = (f" ({report['host_lag_s']:.3f} s against {report['host_model_s']:.3f} s charged)"
           if "host_lag_s" in report else "")
    if report.get("warmup_resumes"):
        lag += f"; {report['warmup_resumes']} in the first {WARMUP_STEPS} steps left out"
    if k is None:
        why = (f"x{report['host_scale_refused']:.3g} is no host's speed" if "host_scale_refused" in report
               else "too few")
        return f"the host costs at a resume the base's ({report.get('resumes', 0)} resumes{lag}: {why})"
    return (f"the host costs at a resume (resume, resume_per_page, refcheck.launch_per_page) the "
            f"base's x{k:.3f}, fitted to {report['resumes']} resumes' host lag{lag}")


def _thirds(report: dict) -> str:
    return " / ".join(f"{x:.3%}" for x in report["overrun_per_read_s_by_third"])


def _sec(key: str, v: float) -> str:
    return f"{v:.6g}" if key == "overrun_rate" else f"{v * 1e6:.6g}us"


def write(path: Path, model: HwLoopModel, report: dict) -> None:
    """``loop_yaml`` written whole to ``path``."""
    from kvsim.run.outputs import write_whole  # noqa: PLC0415

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    write_whole(Path(path), loop_yaml(model, report, when).encode())


def calibrate_here(console, stage: Path, dest: Path, cfg: RunConfig, trace: str | None,
                   hw_options: dict, loop: HwLoopModel | None, *, config: str | None,
                   set_: list[str], kind_terms: str, power_state: str) -> tuple[RunConfig, HwLoopModel | None]:
    """``kvsim compare --calibrate``'s measuring before the replays: ``kvsim calibrate``
    into ``stage``/hardware.yaml (``dest`` is where the folder will be), then, unless a
    hw-loop model was given (``loop``) or there is no GPU, the loop probe on that profile
    into ``stage``/hwloop.yaml (checked on the sim first: ``check``). Returns the config
    on the new profile and the loop model (None: the default)."""
    from kvsim.config import load_config  # noqa: PLC0415
    from kvsim.run import prepare_run  # noqa: PLC0415
    from kvsim.tools.calibrate import calibrate as run_calibration  # noqa: PLC0415
    from kvsim.tools.hwloop import DEFAULT, load_hw_loop  # noqa: PLC0415

    prepare_run(cfg, trace)  # a bad config or trace fails before anything is measured
    if loop is None and hw_options.get("device") != "cpu":
        check(cfg)
    prof = stage / "hardware.yaml"
    cal = run_calibration(prof, base=cfg.hardware, device=hw_options.get("device", "auto"),
                          kind_terms=kind_terms, power_state=power_state)
    console.print(f"calibrated: {dest / prof.name} ({cal['seconds']:.1f} s; the fit check in "
                  f"{prof.name}.report.json)")
    cfg = load_config(config, [*set_, f"hardware={prof}"])
    if loop is not None:
        return cfg, loop
    if cal["device"] != "gpu":  # no GPU events: nothing of the loop's overrun to measure
        console.print(f"hw loop: {DEFAULT} kept (CPU mode: the probe times steps on a GPU)")
        return cfg, None
    loop, rep = measure(cfg, load_hw_loop(DEFAULT), hw_options)
    write(stage / "hwloop.yaml", loop, rep)
    s = loop.step
    console.print(f"hw loop probed: {dest / 'hwloop.yaml'} ({rep['seconds']:.1f} s; {rep['steps']} steps: "
                  f"gap {s.gap * 1e6:.1f} us, overrun {s.overrun_rate:.4f} of reads beyond "
                  f"{s.overrun_after * 1e3:.2f} ms; a read second's by third of the run: {_thirds(rep)}; "
                  f"{host_scale_text(rep)})")
    return cfg, loop
