"""The command line: ``kvsim run CONFIG [--backend sim|hw] [--trace PATH] [--set k=v] [--out DIR]``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from kvsim.console import (error, interrupted, named, pause_at, paused, policy_label, progress_reporter,
                           summary_table)
from kvsim.cli_studies import FORCE_HELP, register_studies
from kvsim.scratch import terminate_raises

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="kvsim: replay LLM request traces through a tiered KV cache.")



DEVICES = ("auto", "cpu", "gpu")


def _sweep(*cfgs) -> None:
    """At a command's start: what killed runs left in the temporary folder and in these
    configs' disk tier folders goes (kvsim.scratch.sweep_start: only scratch paths whose
    owner is gone)."""
    from kvsim.scratch import sweep_start

    sweep_start(*(c.cache.disk_tier.path for c in cfgs if c.cache.disk_tier is not None))


def _check_hw_options(time_scale: float, device: str) -> None:
    """The hw backend's options, before any work (ConfigFileError naming the option)."""
    import math

    from kvsim.config import ConfigFileError

    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ConfigFileError(f"--time-scale {time_scale:g}: expected simulated seconds per wall "
                              f"second, a number > 0")
    if device not in DEVICES:
        raise ConfigFileError(f"--device {device}: expected one of {', '.join(DEVICES)}")


# kvsim calibrate's --base and --model when not given (--from-report: the report's base); an
# option given at all, even at its default's value, is one a form that does not read it refuses
CAL_BASE = "h200-pcie"
CAL_MODEL = "llama-3-8b"


def _hw_options_given(time_scale: float, device: str, compute_graphs: bool) -> list[str]:
    """The hw backend's options given other values than their defaults (which a run that
    does not replay on hw would silently ignore)."""
    return [flag for flag, given in (("--time-scale", time_scale != 1.0), ("--device", device != "auto"),
                                     ("--no-compute-graphs", not compute_graphs)) if given]


@app.command()
def run(
    config: str = typer.Argument("default", help="config YAML (or a name under configs/)"),
    backend: str = typer.Option("sim", help="sim (SimPy model) or hw (real GPU; CPU mode without one)"),
    trace: Optional[str] = typer.Option(None, callback=named, help="trace file or folder (overrides workload.path)"),
    set_: List[str] = typer.Option([], "--set", help="override a config key: key.path=value"),
    out: Optional[str] = typer.Option(None, callback=named, help="results folder (default: output.dir)"),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    progress: bool = typer.Option(True, help="show a progress bar"),
    time_scale: float = typer.Option(1.0, "--time-scale", help="hw backend: sim seconds per wall second"),
    device: str = typer.Option("auto", help="hw backend: auto, cpu or gpu"),
    compute_graphs: bool = typer.Option(True, "--compute-graphs/--no-compute-graphs",
                                        help="hw backend: launch each step's compute as CUDA graphs "
                                             "(off: kernel by kernel)"),
):
    """Replay a trace through the tier manager and write a results folder."""
    from kvsim.backend import CapacityError
    from kvsim.config import ConfigFileError, blame, load_config
    from kvsim.engine.stages import RefcheckError
    from kvsim.run.results import Staging
    from kvsim.run import BACKENDS, output_dir, prepare_run, replay, write_files
    from kvsim.workload import TraceError

    console = Console(stderr=True)
    with terminate_raises():
        try:
            if backend not in BACKENDS:
                raise ConfigFileError(f"--backend: got {backend!r}; expected one of {', '.join(BACKENDS)}")
            if backend == "hw":
                _check_hw_options(time_scale, device)
            elif unread := _hw_options_given(time_scale, device, compute_graphs):
                raise ConfigFileError(f"{', '.join(unread)}: only with --backend hw (this run replays "
                                      "on the sim backend)")
            cfg = load_config(config, set_)
            _sweep(cfg)
            # the destination first: a path that cannot take the results fails now, not
            # after minutes of loading and replay
            stage = Staging.reserve(output_dir(cfg, out), what="--out" if out else "output.dir",
                                    force=force)
        except (ConfigFileError, ValueError, OSError) as e:
            error(console, str(e))
            raise typer.Exit(2)
        except KeyboardInterrupt as e:
            raise interrupted(console, e)
        with stage:
            try:
                pause_at("load")
                prep = prepare_run(cfg, trace)
            except ConfigFileError as e:
                error(console, blame(str(e), config, set_))
                raise typer.Exit(2)
            except (TraceError, ValueError, OSError) as e:
                error(console, str(e))
                raise typer.Exit(2)
            except KeyboardInterrupt as e:
                raise interrupted(console, e)
            opts = {"time_scale": time_scale, "device": device, "compute_graphs": compute_graphs} \
                if backend == "hw" else {}
            try:
                with progress_reporter(console, prep.workload.request_count(), progress) as report:
                    result = replay(prep, backend, backend_options=opts, progress=paused(report))
            except (MemoryError, CapacityError) as e:
                error(console, f"{backend} backend: {e or 'out of memory'}")
                raise typer.Exit(2)
            except ConfigFileError as e:  # a setting this backend cannot run (belady on hw)
                error(console, blame(str(e), config, set_))
                raise typer.Exit(2)
            except (ValueError, OSError, RuntimeError, RefcheckError) as e:
                # a backend that cannot start (no GPU, a bad disk folder, a full disk...) or a
                # refcheck failure: say what, write nothing
                error(console, f"replay on the {backend} backend failed: {type(e).__name__}: {e}")
                raise typer.Exit(1)
            except KeyboardInterrupt as e:
                raise interrupted(console, e)
            try:
                write_files(result, stage.path, plots=cfg.output.plots)
                pause_at("write")
                path = stage.commit()
            except (OSError, ValueError) as e:
                error(console, f"writing results to {stage.dest}: {e}")
                raise typer.Exit(1)
            except KeyboardInterrupt as e:
                raise interrupted(console, e)
    Console().print(summary_table(result.metrics, f"kvsim {cfg.name} ({backend})",
                                  policy_label(result.run_info)))
    Console().print(f"results: {path}")


@app.command()
def calibrate(
    out: Optional[str] = typer.Option(None, callback=named, help="profile to write, e.g. configs/hardware/NAME.yaml "
                                      "(with --check: the check's JSON, optional)"),
    base: Optional[str] = typer.Option(None, callback=named, help=f"base profile for what cannot be measured (default: "
                                       f"{CAL_BASE}; with --from-report, the report's)"),
    device: Optional[str] = typer.Option(None, help="auto, cpu or gpu (default: auto)"),
    from_report: Optional[str] = typer.Option(
        None, "--from-report", callback=named, help="refit offline from a saved NAME.yaml.report.json (no benchmarks)"),
    check: Optional[str] = typer.Option(
        None, "--check", callback=named, help="replay cells measured elsewhere (benchmarks/hw_copy.py --json) on the "
                              "sim with --profile"),
    profile: Optional[str] = typer.Option(None, "--profile", callback=named,
                                          help="with --check: the profile to replay them with"),
    model: Optional[str] = typer.Option(None, callback=named, help="the model whose steps the compute calls and the "
                                        f"interference cells run (a preset or a YAML path; default: {CAL_MODEL})"),
    kind_terms: str = typer.Option("fit", "--kind-terms", help="how copies slow each kind of step "
                                   "(sm.interference.gemm / .memory): fit them to this machine's "
                                   "interference cells, or keep the base's"),
    power_state: str = typer.Option("keep", "--power-state", help="compute.boost: keep the base's (else "
                                    "fit the GEMM trains here), fit the trains, or DIR[,DIR]: fit the hw "
                                    "replays of earlier `kvsim compare` folders on this machine"),
):
    """Microbenchmark this machine and fit a hardware profile (plus OUT.report.json)."""
    from kvsim.run.outputs import check_file, write_whole
    from kvsim.tools.calibrate import calibrate as run_calibration, check_against, refit

    console = Console(stderr=True)
    _sweep()
    if check and not profile:
        error(console, "--check: needs --profile")
        raise typer.Exit(2)
    if not check and not out:
        error(console, "--out: give the profile to write")
        raise typer.Exit(2)
    for flag, v, default in (("--kind-terms", kind_terms, "fit"), ("--power-state", power_state, "keep")):
        if check and v != default:
            error(console, f"{flag}: not with --check (it fits nothing)")
            raise typer.Exit(2)
    # an option the chosen mode does not read is refused, not dropped
    given = {"--device": device is not None, "--model": model is not None, "--base": base is not None,
             "--from-report": from_report is not None, "--profile": profile is not None}
    mode, unread = (("--check", ("--device", "--model", "--base", "--from-report")) if check else
                    ("--from-report", ("--device", "--model", "--profile")) if from_report else
                    (None, ("--profile",)))
    if any(given[o] for o in unread):
        flags = ", ".join(o for o in unread if given[o])
        error(console, f"{flags}: not with {mode} (it measures nothing: the cells it reads ran as "
                       "they are recorded)" if mode else f"{flags}: only with --check")
        raise typer.Exit(2)
    try:
        if check and out:
            check_file(out, "calibrate-check")
        if check:
            report = check_against(check, profile)
            if out:
                Path(out).parent.mkdir(parents=True, exist_ok=True)
                write_whole(Path(out), (json.dumps({"kvsim_report": "calibrate-check", **report},
                                                   indent=2) + "\n").encode())
        elif from_report:
            report = refit(from_report, out, base=base, kind_terms=kind_terms, power_state=power_state)
        else:
            report = run_calibration(out, base=base or CAL_BASE, device=device or "auto",
                                     model=model or CAL_MODEL, kind_terms=kind_terms,
                                     power_state=power_state)
    except (ValueError, OSError, RuntimeError, KeyError) as e:
        error(console, f"{type(e).__name__}: {e}" if isinstance(e, KeyError) else str(e))
        raise typer.Exit(2)
    t = Table(title=f"calibrate ({report.get('device', 'sim')}): fit check, sim vs measured")
    for c in ("page", "path", "dir", "pages", "hw GB/s", "sim GB/s", "rel err"):
        t.add_column(c, justify="right")
    for r in report["fit_check"]:
        t.add_row(f"{r['page'] // 1024} KiB", r["path"], r["dir"], str(r["pages"]), f"{r['hw_GBps']:.2f}",
                  f"{r['sim_GBps']:.2f}", f"{r['rel_err'] * 100:+.1f}%")
    Console().print(t)
    worst = report.get("fit_max_abs_err")
    Console().print(f"max |rel err| {worst * 100:.1f}%" if worst is not None else "no cells")
    if not check:
        for k, v in report.get("why", {}).items():
            if k.startswith("page_cache") or k == "gpu.kernel_overlap":
                Console().print(f"{k}: {v}", highlight=False)
        Console().print(f"profile: {out} ({report.get('seconds', 0.0):.1f} s)")


@app.command()
def compare(
    config: str = typer.Argument("default", help="config YAML (or a name under configs/)"),
    trace: Optional[str] = typer.Option(None, callback=named, help="trace file or folder (overrides workload.path)"),
    set_: List[str] = typer.Option([], "--set", help="override a config key: key.path=value"),
    out: Optional[str] = typer.Option(None, callback=named,
                                      help="folder for compare.json (default: output.dir + '-compare')"),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    time_scale: float = typer.Option(1.0, "--time-scale", help="hw backend: sim seconds per wall second"),
    device: str = typer.Option("auto", help="hw backend: auto, cpu or gpu"),
    compute_graphs: bool = typer.Option(True, "--compute-graphs/--no-compute-graphs",
                                        help="hw backend: launch each step's compute as CUDA graphs "
                                             "(off: kernel by kernel)"),
    hw_from: Optional[str] = typer.Option(None, "--hw-from", callback=named, help="an earlier compare's folder: "
                                          "replay the sim only and compare with its hw side"),
    saved_profile: bool = typer.Option(False, "--saved-profile", help="with --hw-from: the sim uses "
                                       "the hardware profile that hw run recorded, not the config's"),
    pin_arrivals: bool = typer.Option(False, "--pin-arrivals", help="with --hw-from: the sim releases "
                                      "each turn when hw did (closed-loop sessions do not drift apart)"),
    calibrate_first: bool = typer.Option(False, "--calibrate", help="run `kvsim calibrate` on this "
                                         "machine first, into OUT/hardware.yaml, and compare with that "
                                         "profile on both sides"),
    kind_terms: str = typer.Option("fit", "--kind-terms", help="with --calibrate: fit how copies "
                                   "slow each kind of step to this machine's cells, or keep the "
                                   "config's profile's (as `kvsim calibrate --kind-terms`)"),
    power_state: str = typer.Option("keep", "--power-state", help="with --calibrate: as `kvsim "
                                    "calibrate --power-state` (compute.boost: keep, fit or DIR[,DIR])"),
    hw_loop: Optional[str] = typer.Option(None, "--hw-loop", help="the sim side's model of the hw "
                                          "backend's own host costs: a YAML or a name under "
                                          "configs/hwloop/, or none (default: h200; with "
                                          "--calibrate, h200's with its step terms measured here; "
                                          "with --saved-profile, the one that run's compare used)"),
):
    """Replay one config and trace on the sim and the hw backends; report both side by side."""
    from kvsim.tools.compare import compare as run_compare, compare_saved
    from kvsim.tools.reports import report_tables, write_report
    from kvsim.config import ConfigFileError, blame, load_config
    from kvsim.tools.hwloop import load_hw_loop
    from kvsim.run.results import Staging
    from kvsim.run import prepare_run, write_files
    from kvsim.workload import TraceError

    console = Console(stderr=True)
    for flag, on in (("--saved-profile", saved_profile), ("--pin-arrivals", pin_arrivals)):
        if on and not hw_from:
            error(console, f"{flag}: only with --hw-from")
            raise typer.Exit(2)
    if calibrate_first and hw_from:
        error(console, "--calibrate: not with --hw-from (the hw side is already measured)")
        raise typer.Exit(2)
    unread = _hw_options_given(time_scale, device, compute_graphs) if hw_from else []
    if unread:
        error(console, f"{', '.join(unread)}: not with --hw-from (the hw side is already measured)")
        raise typer.Exit(2)
    for flag, v, default in (("--kind-terms", kind_terms, "fit"), ("--power-state", power_state, "keep")):
        if v != default and not calibrate_first:
            error(console, f"{flag}: only with --calibrate")
            raise typer.Exit(2)
    try:
        if not hw_from:
            _check_hw_options(time_scale, device)
        cfg = load_config(config, set_)
        _sweep(cfg)
        loop = load_hw_loop(hw_loop) if hw_loop else None
        if calibrate_first:
            from kvsim.config.hardware import load_profile as _load_profile
            from kvsim.tools.calibrate import check_fit_options

            check_fit_options(kind_terms, power_state, _load_profile(cfg.hardware))
    except (ConfigFileError, ValueError, OSError) as e:
        error(console, str(e))
        raise typer.Exit(2)
    dest = Path(out or (cfg.output.dir.format(name=cfg.name) + "-compare"))
    if hw_from and dest.resolve() == Path(hw_from).resolve():
        error(console, f"--out {dest}: is the --hw-from folder; write the new report elsewhere")
        raise typer.Exit(2)
    with terminate_raises():
        try:  # before minutes of replay, not after
            stage = Staging.reserve(dest, kind="compare", what="--out" if out else "output.dir",
                                    force=force)
        except ValueError as e:
            error(console, str(e))
            raise typer.Exit(2)
        with stage:
            try:
                if hw_from:
                    report, sim_res = compare_saved(cfg, hw_from, trace, saved_profile=saved_profile,
                                                    pin_arrivals=pin_arrivals, hw_loop=loop)
                    results = (("sim", sim_res),)
                else:
                    hw_opts = {"time_scale": time_scale, "device": device, "compute_graphs": compute_graphs}
                    if calibrate_first:  # the profile, then (unless --hw-loop) the loop's step terms
                        from kvsim.tools.loopprobe import calibrate_here

                        cfg, loop = calibrate_here(console, stage.path, dest, cfg, trace, hw_opts, loop,
                                                   config=config, set_=set_, kind_terms=kind_terms,
                                                   power_state=power_state)
                    report, sim_res, hw_res = run_compare(cfg, trace, hw_opts, hw_loop=loop)
                    results = (("sim", sim_res), ("hw", hw_res))
                    if calibrate_first:  # the profile's path once the folder is in place
                        final = {"hardware": str(dest / "hardware.yaml")}
                        for _, res in results:
                            res.cfg = res.cfg.model_copy(update=final)
            except ConfigFileError as e:
                error(console, blame(str(e), config, set_))
                raise typer.Exit(2)
            except (TraceError, ValueError, OSError, RuntimeError) as e:
                error(console, str(e))
                raise typer.Exit(2)
            except KeyboardInterrupt as e:
                raise interrupted(console, e)
            write_report(report, stage.path)
            for name, res in results:  # each replay's own results folder
                write_files(res, stage.path / name, plots=False)
            path = stage.commit() / "compare.json"
    for t in report_tables(report):
        Console().print(t)
    Console().print(f"report: {path}")


@app.command()
def diff(
    a: str = typer.Argument(..., help="a results folder (kvsim run --out, or a compare's sim/ or hw/)"),
    b: str = typer.Argument(..., help="the reference results folder"),
    out: Optional[str] = typer.Option(None, callback=named, help="also write the report here (JSON)"),
):
    """Two finished replays side by side (e.g. two hw runs, or two policies): headline
    metrics with (a - b) / b, and how many turns found the same hits by tier."""
    from kvsim.run.outputs import check_file, write_whole
    from kvsim.tools.compare import diff_runs
    from kvsim.tools.reports import diff_table, rank_table

    console = Console(stderr=True)
    _sweep()
    try:
        if out:
            check_file(out, "diff")
        report = diff_runs(a, b)
    except ValueError as e:
        error(console, str(e))
        raise typer.Exit(2)
    if out:
        dest = Path(out)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            write_whole(dest, (json.dumps({"kvsim_report": "diff", **report}, indent=2) + "\n").encode())
        except OSError as e:
            error(console, f"--out {out}: cannot write ({e.strerror})")
            raise typer.Exit(2)
    Console().print(diff_table(report))
    if report.get("ranks"):  # both runs a node of the same several ranks
        Console().print(rank_table(report["ranks"], ("a", "b")))
    elif report.get("ranks_differ"):
        Console().print(report["ranks_differ"], highlight=False)


@app.command()
def fidelity(
    compare_dir: str = typer.Argument(..., help="a kvsim compare folder (its sim/ and hw/)"),
    hw_runs: List[str] = typer.Argument(None, help="further hw runs of the same config: results "
                                        "folders or compare folders (their hw/)"),
    out: Optional[str] = typer.Option(None, callback=named, help="also write the rows here (JSON)"),
):
    """The fidelity standard, figure by figure: the sim no further from hw than hw runs of the
    same config are from each other, or within 10% (TTFT p50/p90) and 5% (bytes moved);
    node-wide and rank by rank."""
    from kvsim.run.outputs import check_file, write_whole
    from kvsim.tools.fidelity import judge, load_metrics, load_run, same_config, table

    console = Console(stderr=True)
    _sweep()
    try:
        if out:
            check_file(out, "fidelity")
        others = [load_run(h) for h in hw_runs or []]
        sim = load_metrics(compare_dir, "sim", own=False)
        hw = load_run(compare_dir, "hw", own=False)
        same_config(hw, others)
        rows = judge(sim, hw[1]["metrics"], [o[1]["metrics"] for o in others],
                     ["sim", f"{compare_dir}/hw", *(hw_runs or [])])
    except ValueError as e:
        error(console, str(e))
        raise typer.Exit(2)
    if out:
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            write_whole(Path(out), (json.dumps({"kvsim_report": "fidelity", "compare": compare_dir,
                                                "hw_runs": hw_runs or [], "rows": rows}, indent=2) + "\n").encode())
        except OSError as e:
            error(console, f"--out {out}: cannot write ({e.strerror})")
            raise typer.Exit(2)
    t = table(rows)
    t.caption = (f"hw spread: the largest error of the {len(hw_runs or [])} other hw run(s) against the "
                 f"compared one; within: |sim err| <= max(tol, hw spread)")
    Console().print(t)
    print(f"fidelity: {sum(r['within'] for r in rows)} of {len(rows)} figures within the standard")


register_studies(app)


@app.command()
def version():
    """Print the version."""
    from kvsim import __version__

    print(__version__)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
