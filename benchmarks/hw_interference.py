"""How much copies slow a step's compute on the hw backend, per kind of work, beside the sim.

Each cell is a step's compute (the hw backend's stand-in: ``kvsim_backends.hw.standin``)
of one kind and length, started just before a copy batch (or one each way) on one path,
against the same compute alone (``kvsim_backends.hw.interfere``: ``--reps`` reps after a
warm-up, alternating alone and with the copy, an equal idle gap of ``--gap`` seconds
before each: the GEMM chain is power-bound and runs faster after idle time). Kinds, steps
of ``--model`` on the profile's compute model (``kvsim.tools.fitkinds.kind_works``):

- ``gemm``: a 4096-token prefill chunk (GEMM share ~0.95): tensor-core GEMM chains;
- ``memory``: a decode step of 4 requests at 32K context (~0.02): HBM reads;
- ``mix``: a decode step of 256 requests at 512 (~0.4): both, one after the other.

The default grid: 48 cells, 16 copies (each path; one direction and both; 16 KiB-4 MiB
pages; 64 MiB-2 GiB a direction) under each kind, computes of 2-50 ms turning through
the cells so that each kind meets copies shorter and longer than itself (about 3
minutes on an H200). ``--full``: every copy, kind and length (192 cells, about 12
minutes): run it in parts (``--part 1/3`` ... ``3/3``, each with ``--json``) and merge
them with ``--sim-from A.json B.json C.json``. ``--sweep``: the SM kernel one way with
1 to 66 CTAs under each kind (54 cells of 40 ms computes, about 2 minutes): how a step
slows with the kernel's CTAs, not only with what they move (the default grid runs the
backend's CTAs, 36 host -> GPU and 14 back on an H200). ``--split``: the SM kernel both
ways with 4 and with 8 GPU -> host CTAs (the split both ways, a lone batch's count) at
16 KiB-4 MiB pages under each kind (24 cells of 20 ms computes, about a minute), each
direction's end recorded: what the default grid's both-ways cells (lone counts) miss at
small pages. ``--lengths``: three copies under each kind for 1 to 20 ms (45 cells, about
70 s): how the stretch grows with the step's length inside a copy and past its end.
``--sim-from`` also takes ``kvsim
calibrate``'s reports (``PROFILE.yaml.report.json``: the cells it measured).

Beside each cell, the sim's prediction of the same compute and copy on ``--profile``
(``kvsim.tools.fit.predict_cell``); a cell is *within* when the sim's stretch is within
10% of hw's, or within hw's own spread (half the range of its reps) where that is wider.
Each cell also saves each direction's batch from its call to its end (``copy_dir_s``);
below the table, the cells both ways list those beside the sim's, and how many of each
direction's ends the sim gets within 10%. A step of GEMMs then reads (the mix) also times
its GEMM part apart on the stand-in (runs from 2026-12-05 on): below those, each part's
stretch hw / sim and how many of each part are within (``kvsim.tools.fitparts``).
Saved runs may be gzipped (``.json.gz``). Last line:
``hw_interference_sim_within: K of N``.

    python3 benchmarks/hw_interference.py [--json OUT] [--full | --sweep | --split | --lengths]
        [--part K/N] [--reps 5] [--gap 0.1] [--model llama-3-8b] [--profile h200-pcie-calibrated]
        [--device auto|gpu|cpu]
    python3 benchmarks/hw_interference.py --sim-from RUN.json [RUN2.json ...] [--profile P] [--fit] [--loo]
        [--max-sweep-ctas N] [--leads-from RUN.json ...]

``--fit`` (with ``--sim-from``): the structural terms fitted to the cells
(``kvsim.tools.fitkinds``, as ``kvsim calibrate`` fits them), printed as the profile's
``sm.interference`` keys, and the table on them; then the check against overfitting: the
terms fitted to each half of the cells (alternate cells) predict the other half,
``hw_interference_heldout_within: K of N``.

With ``--sim-from`` of several runs that measured the same cells (e.g. calibrate reports
from several days), each kind's cells are also judged against hw's own repeatability: the
sim's mean distance from hw's median over the runs beside the runs' own mean distance, and
how often another run's stretch is *within* of a run's, and the median of the other runs'
stretches (the most a prediction of one figure a cell can expect), beside how often the
sim's is: for each kind, then over all; before them, the sim's and the other runs'
median's counts for each kind, path and direction (where the sim falls short of hw's own).
``--loo`` (with ``--sim-from`` of several runs): then each run's cells predicted by the
terms fitted to the other runs' (``--fit``'s fit, leaving one run out), judged the same
ways: ``hw_interference_loo_within: K of N``. ``--leads-from RUN ...``: each cell
measured before the harness recorded when its copy started (``copy_lead_s``, runs before
2026-12-04 19:21) takes the lead of those runs' cells of its kind and length (the sim
starts a cell's copy that long after its compute, as hw did). ``--max-sweep-ctas N`` leaves out the
cells of a ``--sweep`` run with more than N CTAs (the range the backend's own counts
reach: `h200-pcie-calibrated`'s terms were fitted with 14).

On a machine without a GPU (``--device cpu``, the default there) the cells run on numpy
(the compute a wait, the copies tiny): a smoke test of the plumbing, the hw columns n/a,
the sim's predictions of the full-size cells printed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim.config.hardware import ProfileError, load_profile  # noqa: E402
from kvsim.run.seam import settings_for  # noqa: E402
from kvsim.tools.fit import predict_cell  # noqa: E402
from kvsim.tools.fitkinds import KIND_MODEL, fit_interference, kind_works, part_rows  # noqa: E402
from kvsim.tools.fitparts import fill_leads, report_parts  # noqa: E402
from kvsim.tools.splitratio import split_ratios, split_text  # noqa: E402
from kvsim_backends.hw.interfere import (default_grid, full_grid, lengths_grid, measure_cells,  # noqa: E402
                                         split_grid, sweep_grid)

PROFILE = "h200-pcie-calibrated"
KINDS = ("gemm", "memory", "mix")


def within(hw: float, spread: float, sim: float) -> bool:
    """The sim's stretch within 10% of hw's, or within hw's own spread where wider."""
    return abs(sim - hw) <= max(0.10 * abs(hw), spread)


def _label(row) -> str:
    pb, b = row["page"], row["dir_bytes"]
    size = f"{pb >> 20} MiB" if pb >= 1 << 20 else f"{pb >> 10} KiB"
    amount = f"{b / (1 << 30):g} GiB" if b >= 1 << 30 else f"{b >> 20} MiB"
    ctas = f", {row['sm_ctas']} CTAs" if row.get("sm_ctas") else ""
    ctas += f", {row['sm_ctas_d2h']} GPU -> host CTAs" if row.get("sm_ctas_d2h") else ""
    return f"{row['path']} {row['dir']} {amount} of {size}{ctas}"


def report(rows: list[dict], profile, out=print) -> tuple[int, int]:
    """The table (each cell: hw stretch and spread, the sim's, within), per kind counts;
    returns (within, cells) over the GPU cells."""
    on_gpu = all(r.get("device") == "gpu" for r in rows)
    out("\nstretch = the compute's GPU time with the copy over alone, less 1; spread = half "
        "the range of its reps; sim = the sim backend's prediction on " + profile.name)
    out("| kind | compute ms | copy | hw stretch | spread | sim stretch | within | hw copy ms | sim copy ms |")
    out("|" + " --- |" * 9)
    good = {k: 0 for k in KINDS}
    seen = {k: 0 for k in KINDS}
    copy_err: dict[str, list[float]] = {k: [] for k in KINDS}   # the sim's copy time / hw's - 1
    ends = []  # (row, the sim's end of each direction): cells both ways timed apart
    for r in rows:
        sim_dir: dict = {}
        sim, sim_copy = predict_cell(profile, r, nominal=not on_gpu, dir_s=sim_dir)
        if r["dir"] == "both" and r.get("copy_dir_s"):  # (runs from 2026-12-04 05:00 on)
            ends.append((r, sim_dir))
        if on_gpu:
            ok = within(r["stretch"], r["spread"], sim)
            seen[r["kind"]] += 1
            good[r["kind"]] += ok
            if r.get("copy_s"):
                copy_err[r["kind"]].append(sim_copy / r["copy_s"] - 1.0)
            hw = (f"{r['stretch'] * 100:+.1f}% | {r['spread'] * 100:.1f}% | {sim * 100:+.1f}% | "
                  f"{'yes' if ok else 'no'} | {r['copy_s'] * 1e3:.1f}")
        else:
            hw = f"n/a | n/a | {sim * 100:+.1f}% | n/a | n/a"
        out(f"| {r['kind']} | {r['compute_s'] * 1e3:g} | {_label(r)} | {hw} | {sim_copy * 1e3:.1f} |")
    if on_gpu:
        out("\n" + "; ".join(f"{k}: {good[k]} of {seen[k]} within" for k in KINDS if seen[k]))
        out("copy time, the sim's against hw's: " + "; ".join(
            f"{k}: {sum(abs(e) <= 0.1 for e in es)} of {len(es)} within 10% (median error "
            f"{statistics.median(abs(e) for e in es) * 100:.1f}%)" for k, es in copy_err.items() if es))
        if ends:
            out("\nboth ways, each direction's batch to its end, ms (hw / sim):")
            near = {d: [0, 0] for d in ("h2d", "d2h")}  # (the sim within 10% of hw, cells)
            for r, sim_dir in ends:
                hw_dir = r["copy_dir_s"]
                out(f"- {r['kind']} {r['compute_s'] * 1e3:g} ms | {_label(r)}: " + ", ".join(
                    f"{d} {hw_dir[d] * 1e3:.1f} / {sim_dir.get(d, float('nan')) * 1e3:.1f}"
                    for d in ("h2d", "d2h") if d in hw_dir))
                for d in near:
                    if d in hw_dir and d in sim_dir:
                        near[d][0] += abs(sim_dir[d] - hw_dir[d]) <= 0.1 * hw_dir[d]
                        near[d][1] += 1
            out("each direction's end both ways, the sim's against hw's: " + "; ".join(
                f"{d}: {a} of {b} within 10%" for d, (a, b) in near.items() if b))
    return sum(good.values()), sum(seen.values())


def with_terms(profile, terms: dict):
    """``profile`` with ``sm.interference`` keys ``terms`` (``fit_interference``'s: each
    kind's fitted terms, set over the kind's other keys, such as its busy shares, which
    stay)."""
    d = profile.model_dump()
    i = d["sm"]["interference"]
    for kind, t in terms.items():
        i[kind] = {**(i.get(kind) or {}), **t}
    return type(profile).model_validate(d)


def fit_report(rows: list[dict], profile) -> tuple[object, int, int]:
    """The terms fitted to ``rows`` (printed), the profile with them; then each half of
    the cells predicted by the terms fitted to the other: (that profile, within, cells)
    of the held-out halves."""
    terms, why = fit_interference(rows, profile)
    if not terms:
        raise ValueError("--fit: too few cells of the gemm or memory kind")
    print("\n# sm.interference terms fitted to the cells")
    for kind, t in terms.items():
        print(f"    {kind}:  # {why['sm.interference.' + kind]}")
        for k, v in t.items():
            print(f"      {k}: {v:g}")
    good = seen = 0
    per: dict[str, list[int]] = {k: [0, 0] for k in KINDS}
    for test, train in ((rows[0::2], rows[1::2]), (rows[1::2], rows[0::2])):
        half = with_terms(profile, fit_interference(train, profile)[0])
        for r in test:
            ok = within(r["stretch"], r["spread"], predict_cell(half, r)[0])
            per[r["kind"]][0] += ok
            per[r["kind"]][1] += 1
            good += ok
            seen += 1
    print("held out (fitted to alternate cells, predicting the others): "
          + "; ".join(f"{k}: {a} of {b} within" for k, (a, b) in per.items() if b))
    print(f"hw_interference_heldout_within: {good} of {seen}")
    return with_terms(profile, terms), good, seen


def _load(paths, max_ctas: int | None = None, flag: str = "--sim-from") -> list[dict]:
    """The cells of saved runs (``.json``, or gzipped ``.json.gz``; ``flag``: the option
    that named them, for the error); ``max_ctas``: a sweep's cells (a forced
    ``sm_ctas``) of more CTAs left out."""
    rows = []
    for p in paths:
        try:
            with (gzip.open(p, "rt") if str(p).endswith(".gz") else open(p)) as f:
                data = json.load(f)
            # (a saved run's cells, or a `kvsim calibrate` report's interference cells)
            cells = data["cells"] if "cells" in data else data["interference"]
            for c in cells:
                for k in ("kind", "compute_s", "path", "dir", "page", "stretch", "work", "batches"):
                    if k not in c:
                        raise KeyError(f"a cell without {k}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{flag} {p}: not a saved hw_interference.py run ({e})") from None
        rows += [c for c in cells if max_ctas is None or (c.get("sm_ctas") or 0) <= max_ctas]
    return rows


def _cell_key(r: dict) -> tuple:
    """What makes two runs' rows the same cell."""
    return (r["kind"], r["compute_s"], r["path"], r["dir"], r["page"], r.get("dir_bytes"),
            r.get("sm_ctas"), r.get("sm_ctas_d2h"))


def against_runs(rows: list[dict], profile, sims: list[float] | None = None
                 ) -> dict[str, tuple[float, float, int]]:
    """Where the same cell was measured in several runs (``--sim-from`` of several files):
    per kind, the sim's mean |stretch - hw's median over the runs| beside the runs' own
    mean |stretch - that median|, and how many such cells: (sim, hw, cells). ``sims``:
    the sim's stretch of each row (``--loo``: each run's by its own fold's terms), or
    None: ``profile``'s of each row (a run's own copy lead may differ from another's)."""
    by: dict[tuple, list[tuple[dict, float | None]]] = {}
    for i, r in enumerate(rows):
        if r.get("device", "gpu") == "gpu":
            by.setdefault(_cell_key(r), []).append((r, None if sims is None else sims[i]))
    out: dict[str, list[list[float]]] = {}
    for key, cs in by.items():
        if len(cs) < 2:
            continue
        s = [c["stretch"] for c, _ in cs]
        med = statistics.median(s)
        e = out.setdefault(key[0], [[], []])
        sim = [predict_cell(profile, c)[0] if p is None else p for c, p in cs]
        e[0].append(statistics.mean(abs(x - med) for x in sim))
        e[1].append(statistics.mean(abs(x - med) for x in s))
    return {k: (statistics.mean(a), statistics.mean(b), len(a)) for k, (a, b) in out.items()}


def repeat_within(rows: list[dict], profile) -> tuple[int, int, int, int, int]:
    """Over the cells measured in several runs: how often another run's hw stretch is
    *within* of a run's (every ordered pair of runs), how often the median of the other
    runs' stretches is (what a model that knew every cell's typical stretch on other
    machines would score: the most a prediction of one figure a cell can expect), and the
    sim's: (hw within, pairs, median within, sim within, cells). What the sim's count is
    to be read against: hw's own. ``repeat_within_kinds`` per kind of compute."""
    return _summed(repeat_within_kinds(rows, profile))


def _summed(kinds: dict[str, tuple[int, int, int, int, int]]) -> tuple[int, int, int, int, int]:
    hw, pairs, med, sim, cells = (sum(k[i] for k in kinds.values()) for i in range(5))
    return hw, pairs, med, sim, cells


def repeat_within_kinds(rows: list[dict], profile, group=lambda key: key[0]
                        ) -> dict[str, tuple[int, int, int, int, int]]:
    """``repeat_within``'s counts for each kind of compute (only kinds with such cells), or
    for each ``group`` of a cell's key (``_cell_key``)."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("device", "gpu") == "gpu":
            by.setdefault(_cell_key(r), []).append(r)
    out: dict[str, list[int]] = {}
    for key, cs in by.items():
        if len(cs) < 2:
            continue
        e = out.setdefault(group(key), [0, 0, 0, 0, 0])
        for a in cs:
            others = [b["stretch"] for b in cs if b is not a]
            e[0] += sum(within(a["stretch"], a["spread"], b) for b in others)
            e[1] += len(others)
            e[2] += within(a["stretch"], a["spread"], statistics.median(others))
            e[3] += within(a["stretch"], a["spread"], predict_cell(profile, a)[0])
            e[4] += 1
    return {k: (e[0], e[1], e[2], e[3], e[4]) for k, e in out.items()}


def _print_against(got: dict[str, tuple[float, float, int]]) -> None:
    for kind, (sim, hw, cells) in got.items():
        print(f"{kind}: over {cells} cells measured in several runs, the sim {sim * 100:.2f} points of "
              f"stretch from hw's median, hw's runs {hw * 100:.2f} (x{sim / hw if hw else float('inf'):.2f})")


def leave_one_out(runs: list[list[dict]], profile) -> tuple[int, int]:
    """``--loo``: each run's cells predicted by the terms fitted to the other runs' cells
    (``fit_interference``, as ``--fit``); per kind, the cells within and the sim's distance
    from hw's median beside the runs' own (``against_runs``, each run by its fold's
    terms). Returns (within, cells)."""
    rows: list[dict] = []
    sims: list[float] = []
    per: dict[str, list[int]] = {k: [0, 0] for k in KINDS}
    for i, run in enumerate(runs):
        train = [r for j, other in enumerate(runs) if j != i for r in other]
        terms = fit_interference(train, profile)[0]
        if not terms:
            raise ValueError("--loo: too few cells of the gemm or memory kind without a run")
        fold = with_terms(profile, terms)
        for r in run:
            if r.get("device", "gpu") != "gpu":
                continue
            sim = predict_cell(fold, r)[0]
            rows.append(r)
            sims.append(sim)
            per[r["kind"]][0] += within(r["stretch"], r["spread"], sim)
            per[r["kind"]][1] += 1
    print(f"\nleft out by run ({len(runs)} folds: each run predicted by the terms fitted to "
          "the others): " + "; ".join(f"{k}: {a} of {b} within" for k, (a, b) in per.items() if b))
    _print_against(against_runs(rows, profile, sims))
    good, n = sum(a for a, _ in per.values()), sum(b for _, b in per.values())
    print(f"hw_interference_loo_within: {good} of {n}")
    return good, n


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every copy, kind and length (192 cells)")
    ap.add_argument("--sweep", action="store_true", help="the SM kernel one way with 1-66 CTAs "
                    "under each kind (54 cells)")
    ap.add_argument("--split", action="store_true", help="the SM kernel both ways with 4 and 8 "
                    "GPU -> host CTAs, 16 KiB-4 MiB pages, under each kind (24 cells)")
    ap.add_argument("--lengths", action="store_true", help="three copies under each kind for "
                    "1, 2, 5, 10 and 20 ms (45 cells)")
    ap.add_argument("--part", default=None, help="K/N: the K-th of N interleaved parts of the grid")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gap", type=float, default=0.1, help="idle seconds before each compute")
    ap.add_argument("--model", default=KIND_MODEL, help="the model whose steps the cells compute")
    ap.add_argument("--profile", default=PROFILE, help="the profile the backend decides from and "
                    "the sim predicts with")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="write every cell here")
    ap.add_argument("--sim-from", default=None, nargs="+", metavar="JSON",
                    help="measure nothing: the table of saved runs (merged), the sim on --profile")
    ap.add_argument("--fit", action="store_true", help="with --sim-from: fit the structural "
                    "terms to the cells, predict with them, and check them on held-out halves")
    ap.add_argument("--loo", action="store_true", help="with --sim-from of several runs: each "
                    "run predicted by the terms fitted to the others (leave one run out)")
    ap.add_argument("--max-sweep-ctas", type=int, default=None, metavar="N", help="with "
                    "--sim-from: leave out sweep cells of more than N CTAs")
    ap.add_argument("--leads-from", default=None, nargs="+", metavar="JSON", help="with "
                    "--sim-from: cells without a copy lead (runs before 2026-12-04 19:21) take "
                    "these runs' by kind and length")
    a = ap.parse_args(argv)
    if a.fit and not a.sim_from:
        ap.error("--fit: only with --sim-from (saved cells)")
    if a.loo and not (a.sim_from and len(a.sim_from) > 1):
        ap.error("--loo: only with --sim-from of two runs or more")
    if a.leads_from and not a.sim_from:
        ap.error("--leads-from: only with --sim-from (saved cells)")
    try:
        profile = load_profile(a.profile)
    except ProfileError as e:
        ap.error(f"--profile: {e}")
    if a.sim_from:
        try:
            ref = _load(a.leads_from, flag="--leads-from") if a.leads_from else []
            rows = _load(a.sim_from, a.max_sweep_ctas)
            fill_leads(rows, ref)
            if a.fit:
                profile = fit_report(rows, profile)[0]
        except ValueError as e:
            ap.error(str(e))
        good, n = report(rows, profile)
        report_parts(part_rows(rows, profile))
        groups = repeat_within_kinds(rows, profile, lambda k: f"{k[0]} {k[2]} {k[3]}")
        if groups:  # where the sim falls short of what hw's own runs reach
            print("by kind, path and direction, the sim within / the median of the other runs "
                  "within, of the cells measured in several runs: " + "; ".join(
                      f"{g} {s_} / {m} of {c}" for g, (_, _, m, s_, c) in sorted(groups.items())))
        _print_against(against_runs(rows, profile))
        if split := split_ratios(rows, lambda r: predict_cell(profile, r)[0]):
            print(split_text(split))
        kinds: dict[str, tuple[int, int, int, int, int]] = {}  # (the groups' counts by kind)
        for g, e in groups.items():
            k = g.split()[0]
            kinds[k] = tuple(x + y for x, y in zip(kinds.get(k, (0,) * 5), e))
        for kind, (hw, pairs, med, sim, cells) in kinds.items():
            print(f"{kind}: another run's hw within for {hw / pairs:.0%} of pairs, the median of the "
                  f"other runs {med / cells:.0%}, the sim {sim / cells:.0%} ({sim} of {cells} cells)")
        hw, pairs, med, sim, cells = _summed(kinds)
        if pairs:
            print(f"over the cells measured in several runs: another run's hw within {hw} of {pairs} "
                  f"({hw / pairs:.0%}), the median of the other runs within {med} of {cells} "
                  f"({med / cells:.0%}), the sim within {sim} of {cells} ({sim / cells:.0%})")
        print(f"hw_interference_sim_within: {good} of {n}" if n else "hw_interference_sim_within: n/a (cpu)")
        if a.loo:
            try:
                runs = [_load([p], a.max_sweep_ctas) for p in a.sim_from]
                for run in runs:
                    fill_leads(run, ref)
                leave_one_out(runs, load_profile(a.profile))
            except ValueError as e:
                ap.error(str(e))
        return
    if a.reps < 1:
        ap.error(f"--reps: got {a.reps}; expected >= 1")
    if a.full + a.sweep + a.split + a.lengths > 1:
        ap.error("--full, --sweep, --split and --lengths: one grid at a time")
    cells = (full_grid() if a.full else sweep_grid() if a.sweep else split_grid() if a.split
             else lengths_grid() if a.lengths else default_grid())
    if a.part:
        try:
            k, n = (int(x) for x in a.part.split("/"))
            if not 1 <= k <= n:
                raise ValueError
        except ValueError:
            ap.error(f"--part: got {a.part!r}; expected K/N with 1 <= K <= N")
        cells = cells[k - 1::n]
    t0 = time.perf_counter()
    works = kind_works(profile, a.model)
    rows = measure_cells(lambda pb, slots, **kw: settings_for(pb, slots, profile, model=a.model, **kw),
                         cells, works, a.device, reps=a.reps, gap_s=a.gap,
                         progress=lambda s: print(f"# {s}", flush=True))
    print(f"# {len(rows)} cells in {time.perf_counter() - t0:.1f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "source": "benchmarks/hw_interference.py", "model": a.model,
                       "profile": a.profile, "reps": a.reps, "gap_s": a.gap, "cells": rows}, f, indent=1)
    good, n = report(rows, profile)
    report_parts(part_rows(rows, profile))
    if rows and all(r["device"] == "gpu" for r in rows):
        print(f"hw_interference_sim_within: {good} of {n}")
    else:
        print("hw_interference_sim_within: n/a (cpu)")


if __name__ == "__main__":
    main()
