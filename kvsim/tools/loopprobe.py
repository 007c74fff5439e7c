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
factor of 2. ``kvsim compare --calibrate`` runs it after calibrating, on a GPU and unless
``--hw-loop`` names a model, and writes the model it used to ``OUT/hwloop.yaml`` (the
other terms are the base model's, kept).
"""

from __future__ import annotations

import time
from pathlib import Path

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


def measure(cfg: RunConfig, base: HwLoopModel, hw_options: dict | None = None) -> tuple[HwLoopModel, dict]:
    """Replay the probe (``probe_config``) on the hw backend and fit the loop's step
    terms on top of ``base`` (``fit_steps``); the report adds its wall seconds."""
    from kvsim.run import prepare_run, replay  # noqa: PLC0415 (the run package imports tools)

    t0 = time.perf_counter()
    hw_compute: list = []
    replay(prepare_run(probe_config(cfg)), "hw",
           backend_options={**(hw_options or {}), "compute_log": hw_compute})
    model, report = fit_steps(hw_compute, base)
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
            f"# fitted as kvsim.tools.fitgap fits them; every other term is the base model's.\n")
    text += yaml.safe_dump(head, sort_keys=False)
    text += "step:\n" + "".join(f"  {k}: {_sec(k, v)}\n" for k, v in step.items())
    text += yaml.safe_dump({"notes": d.get("notes", "")}, sort_keys=False)
    return text


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
                  f"{s.overrun_after * 1e3:.2f} ms; a read second's by third of the run: {_thirds(rep)})")
    return cfg, loop
