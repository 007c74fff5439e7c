"""``kvsim calibrate``: measure this machine, fit a hardware profile, write it and a report.

``calibrate`` runs the hw backend's measurements (``kvsim_backends.hw.microbench``, reached
through the backend registry: ``kvsim.run.measure_hardware``), fits them (``kvsim.tools.fit``)
onto a base profile for what it cannot measure, and writes the profile through its
pydantic model (``HardwareProfile``, in units: GB/s, us), with a header saying where
each fitted value came from, plus ``OUT.report.json``: the measurements and the fit check
(each measured batch replayed on the sim with the fitted profile).

``refit`` (``kvsim calibrate --from-report R --out P``) fits again, offline, from the
measurements a saved report holds, so a profile is reproducible from its report (and
redoes the check of any ``out_of_sample`` cells the report holds). ``check_against``
(``kvsim calibrate --check CELLS.json --profile P``) replays cells measured elsewhere
(``benchmarks/hw_copy.py --json``) on the sim with a profile: the out-of-sample check.

Invariant: a profile is written only after it validates (a temporary file, loaded back,
then renamed over ``out``).
"""

from __future__ import annotations

import json
import time
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel

from kvsim.tools.fit import check_cells, check_fit, check_small, fit
from kvsim.tools.fitboost import check_power_state
from kvsim.tools.fitkinds import KIND_MODEL, check_kind_terms, kind_works, share_works
from kvsim.tools.measured import Measured, measured_from_report, read_report
from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.config.units import parse_page_cost, parse_page_rate, parse_rate, parse_time


def _time(v: float) -> str:
    if 0.0 < abs(v) < 1e-6:  # (a per-page cost such as page_d2h: tens of ns)
        return f"{v * 1e9:.6g}ns"
    for unit, f in (("us", 1e6), ("ms", 1e3)):
        if abs(v) * f < 1000:
            return f"{v * f:.6g}{unit}"
    return f"{v:.6g}s"


def _size(n: int) -> str | int:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return n


def _parsers(annotation) -> set:
    """The BeforeValidator functions anywhere in a field's annotation (Optional included)."""
    out = set()
    for m in getattr(annotation, "__metadata__", ()):
        if getattr(m, "func", None) is not None:
            out.add(m.func)
    for a in typing.get_args(annotation):
        out |= _parsers(a)
    return out


def _in_units(model) -> dict:
    """A profile model's fields as YAML values in the units its files use (rates in GB/s,
    times in us/ms/s, per-page tables keyed by page size), six significant digits; the
    field's own parser reads each back (``kvsim.config.units``)."""
    out: dict = {}
    for name, field in type(model).model_fields.items():
        v = getattr(model, name)
        parsers = {getattr(m, "func", None) for m in field.metadata} | _parsers(field.annotation)
        if isinstance(v, BaseModel):
            out[name] = _in_units(v)
        elif v is None or isinstance(v, bool):
            out[name] = v
        elif parse_rate in parsers:
            out[name] = f"{v / 1e9:.6g}GB/s"
        elif parse_time in parsers:
            out[name] = _time(v)
        elif parse_page_cost in parsers:  # a time, or a table {page bytes: seconds}
            out[name] = ({_size(k): _time(t) for k, t in v.items()} if isinstance(v, dict)
                         else _time(v))
        elif parse_page_rate in parsers:  # a bandwidth, or a table {page bytes: B/s}
            out[name] = ({_size(k): f"{r / 1e9:.6g}GB/s" for k, r in v.items()}
                         if isinstance(v, dict) else f"{v / 1e9:.6g}GB/s")
        elif isinstance(v, float):
            out[name] = float(f"{v:.6g}")
        else:
            out[name] = v
    return out


def profile_text(d: dict, why: dict[str, str], base_name: str, header: str) -> str:
    """The profile ``d`` (a HardwareProfile's ``model_dump``) as YAML: validated through the
    model and written from it in units (``_in_units``), under a comment block of ``header``
    and, per fitted key, where its value came from (``why``); every other key is the base
    profile's."""
    data = _in_units(HardwareProfile.model_validate(d))
    lines = [*header.splitlines(), "", "Where each value comes from:",
             *(f"  {k}: {v}" for k, v in sorted(why.items())),
             f"  every other key: base: {base_name}"]
    return ("".join(f"# {x}".rstrip() + "\n" for x in lines)
            + yaml.safe_dump(data, sort_keys=False, width=100))


def _fit(out: Path, m: Measured, base_p: HardwareProfile, name: str, header: str,
         notes: str, kind_terms: str = "fit", power_state: str = "keep"
         ) -> tuple[HardwareProfile, list[dict], dict[str, str], str]:
    """Fit ``m``: (the profile, its fit check, where each fitted key came from, the YAML
    text for ``out``, validated). ``kind_terms``: 'fit' or 'keep' (``check_kind_terms``);
    ``power_state``: 'keep', 'fit' or compare folders (``fitboost.check_power_state``)."""
    d, why = fit(m, base_p, keep_kinds=kind_terms == "keep", power_state=power_state)
    d["name"] = name
    d["notes"] = notes
    text = profile_text(d, why, base_p.name, header)
    fitted = load_profile_text(text, out)  # validate before it replaces anything
    return fitted, check_fit(m, fitted) + check_small(m, fitted), why, text


def load_profile_text(text: str, out: Path) -> HardwareProfile:
    """The profile ``text`` validated, as ``load_profile`` would read it from ``out``."""
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        return HardwareProfile.model_validate(yaml.safe_load(text))
    except ValidationError as e:
        raise ValueError(f"{out}: the fitted profile is not valid: {e}") from None


def _write_both(out: Path, report: dict, text: str) -> None:
    """The report (the measurements) first, then the profile, each written whole: a kill or
    a full disk between them keeps what was measured, and the profile can be refitted
    from it (``--from-report``); the other way round the measurements were lost."""
    from kvsim.run.outputs import write_whole  # noqa: PLC0415

    out.parent.mkdir(parents=True, exist_ok=True)
    write_whole(Path(str(out) + ".report.json"),
                (json.dumps(report, indent=2, default=str) + "\n").encode())
    write_whole(out, text.encode())


def check_fit_options(kind_terms: str, power_state: str, base: HardwareProfile) -> None:
    """ValueError unless calibrate's ``--kind-terms`` and ``--power-state`` can be met on
    ``base`` (``check_kind_terms``, ``check_power_state``): before anything is measured."""
    check_kind_terms(kind_terms, base)
    check_power_state(power_state)


def _check_yaml(out) -> None:
    """``out`` must be a .yaml name, and kvsim replaces only a profile (and report) that
    calibrate wrote: never another file (kvsim.run.outputs)."""
    from kvsim.run.outputs import check_file  # noqa: PLC0415

    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise ValueError(f"--out: got {str(out)!r}; expected a .yaml file")
    check_file(out, "profile")
    check_file(Path(str(out) + ".report.json"), "profile-report", f"--out {out}: its report")


def calibrate(out: str | Path, base: str = "h200-pcie", device: str = "auto",
              plan=None, name: str | None = None, disk_dir: str | None = None,
              model: str = KIND_MODEL, kind_terms: str = "fit", power_state: str = "keep") -> dict:
    """Measure, fit, write ``out`` (YAML) and ``out`` with ``.report.json``; returns the report.
    ``plan``: what to measure (``kvsim_backends.hw.microbench.Plan``; default the device's);
    ``model``: the model whose steps the compute calls and interference cells run
    (``kvsim.tools.fitkinds.kind_works``) and the rank-share cells of two ranks on one GPU
    (``share_works``; ``gpu.kernel_overlap``); ``kind_terms``: 'fit' the interference
    cells' structural terms per kind of step, or 'keep' the base's (checked before
    anything is measured); ``power_state``: 'keep' the base's ``compute.boost`` (fitted
    on replays) where it has one, 'fit' the GEMM trains measured here, or comma-separated
    ``kvsim compare`` folders: their hw replays on this machine (``fitboost.fit_replays``)."""
    from kvsim.run import measure_hardware  # noqa: PLC0415 (the backend registry)

    _check_yaml(out)
    out = Path(out)
    base_p = load_profile(base)
    check_fit_options(kind_terms, power_state, base_p)
    t0 = time.perf_counter()
    m, plan = measure_hardware(device, plan, disk_dir, base_p, model, kind_works(base_p, model),
                               share_works(base_p, model))
    name = name or out.stem
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    notes = (f"kvsim calibrate on {m.device} ({stamp}); base {base_p.name} for what was "
             "not measured" + ("; CPU mode: tiny sizes, not a GPU profile" if m.device == "cpu" else ""))
    header = (f"Written by `kvsim calibrate` on {stamp}, device {m.device}, on the base profile "
              f"{base_p.name}.\nThe measurements and the per-cell fit check: {out.name}.report.json")
    fitted, check, why, text = _fit(out, m, base_p, name, header, notes, kind_terms, power_state)
    report = {"device": m.device, "date": stamp, "base": base_p.name, "profile": str(out),
              "seconds": time.perf_counter() - t0, "plan": plan.__dict__, "copies": m.copies,
              "ctas": m.ctas, "disk": m.disk, "host_fill_Bps": m.host_fill_Bps,
              "host_fills": m.host_fills, "driver_call_s": m.driver_call_s,
              "compute": m.compute, "small": m.small, "disk_setting": m.disk_setting,
              "interference": m.interference, "busy_copies": m.busy_copies, "page_cache": m.page_cache,
              "rank_share": m.rank_share, "why": why, "fit_check": check,
              "fit_max_abs_err": max((abs(r["rel_err"]) for r in check), default=None)}
    _write_both(out, report, text)
    return report


def refit(report_path: str | Path, out: str | Path, base: str | None = None,
          name: str | None = None, kind_terms: str = "fit", power_state: str = "keep") -> dict:
    """Fit a profile offline from the measurements in a saved report (no device needed):
    writes ``out`` and ``out.report.json`` (the same measurements, this fit's check; an
    earlier fit check of the same report is kept under ``previous_fit_checks``)."""
    _check_yaml(out)
    out, report_path = Path(out), Path(report_path)
    old = read_report(report_path)
    base_p = load_profile(base or old["base"])
    check_fit_options(kind_terms, power_state, base_p)
    m = measured_from_report(old)
    name = name or out.stem
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    src = report_path.name
    notes = (f"kvsim calibrate on {m.device} ({old['date']}), re-fitted offline from {src} "
             f"({stamp}); base {base_p.name} for what was not measured")
    header = (f"Re-fitted by `kvsim calibrate --from-report {src}` on {stamp} from the\n"
              f"measurements of `kvsim calibrate` on {old['date']}, device {m.device}, on the base "
              f"profile {base_p.name}.\nThe measurements and the per-cell fit check: {out.name}.report.json")
    fitted, check, why, text = _fit(out, m, base_p, name, header, notes, kind_terms, power_state)
    previous = list(old.get("previous_fit_checks", []))
    if old.get("fit_check"):
        previous.append({"date": old.get("refit_date", old["date"]), "fit_check": old["fit_check"],
                         "fit_max_abs_err": old.get("fit_max_abs_err")})
    report = {k: v for k, v in old.items() if k not in ("fit_check", "fit_max_abs_err", "previous_fit_checks")}
    report.update({"profile": str(out), "refit_from": str(report_path), "refit_date": stamp,
                   "why": why, "fit_check": check,
                   "fit_max_abs_err": max((abs(r["rel_err"]) for r in check), default=None),
                   "previous_fit_checks": previous})
    # cells measured elsewhere (benchmarks/hw_copy.py --json), kept in the report: their
    # out-of-sample check is redone with this fit
    oos = []
    for entry in old.get("out_of_sample", []):
        c = check_cells(entry["copies"], fitted)
        oos.append({**entry, "fit_check": c, "fit_max_abs_err": max((abs(r["rel_err"]) for r in c), default=None)})
    if oos:
        report["out_of_sample"] = oos
    _write_both(out, report, text)
    return report


def check_against(cells_path: str | Path, profile: str | Path) -> dict:
    """Replay cells measured elsewhere (a JSON with ``copies``, as ``benchmarks/hw_copy.py
    --json`` writes) on the sim with ``profile``: the fit's out-of-sample check."""
    data = json.loads(Path(cells_path).read_text())
    prof = load_profile(profile)
    check = check_cells(data["copies"], prof)
    return {"cells": str(cells_path), "cells_date": data.get("date"), "profile": str(profile),
            "fit_check": check, "fit_max_abs_err": max((abs(r["rel_err"]) for r in check), default=None)}
