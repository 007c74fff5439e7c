"""``kvsim compare``: one config and trace replayed on both backends, side by side.

Both replays use the same prepared run (config, model, profile, workload, start times);
each backend keeps a per-batch timing log (src, dst, pages, bytes, path, seconds). The sim
side predicts the hw replay, so it adds the hw backend's own host costs to the hardware
profile's times: a ``kvsim.tools.hwloop.HwLoopModel`` (``configs/hwloop/h200.yaml`` unless told
otherwise; the report names it). The report holds, for each metric, the sim value, the hw
value and the relative error ``(sim - hw) / hw`` (hw is the reference):

- transfers, per (src, dst, path): batches, bytes, median seconds a batch, median and
  aggregate GB/s (bytes over seconds);
- TTFT p50 / p90 (with a bootstrap 90% interval over hw's turns: how far a percentile
  of a few dozen turns moves with the turns near it), requests and output tokens per
  second, hit tokens by tier;
- turns (matched by session and turn) that found the same hit tokens by tier, and the
  turns whose TTFT is far apart with the races behind them (``turn_timing``);
- for a node of several ranks, each rank's TTFT, requests/s and bytes by kind (``ranks``,
  ``kvsim.tools.rankcmp``; absent for one rank).

``compare_saved`` replays the sim only and compares it with the hw side an earlier compare
saved (``kvsim compare --hw-from DIR``): a re-fitted profile re-predicts a GPU run offline.
``diff_runs`` (``kvsim diff A B``) puts any two finished replays' folders side by side with
the same metrics and per-turn agreement: two hw runs of one config give the GPU's own
run-to-run spread, the floor under any prediction.

Batches are matched by kind, not one to one: admission and eviction can depend on timing,
so the two replays need not move the same batches (their counts are in the report).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from kvsim.config import RunConfig
from kvsim.tools.computelog import HW_GEMM_COL, SIM_GEMM_COL, compute_summary
from kvsim.tools.hwloop import DEFAULT as DEFAULT_HW_LOOP, HwLoop, HwLoopModel, load_hw_loop
from kvsim.tools.rankcmp import per_rank, rank_count, rel_err
from kvsim.tools.reports import read_report, saved_call_logs
from kvsim.tools.sameworkload import one_workload, same_replay
from kvsim.run import Result, prepare_run, replay
from kvsim.run.clustermetrics import is_cluster

if TYPE_CHECKING:
    from kvsim.config.hardware import HardwareProfile


def transfer_table(log: Iterable[dict]) -> dict[str, dict]:
    """Per ``src->dst path``: batches, pages, bytes, seconds (sum and median), GB/s; for
    batches whose log rows time their disk I/O (the hw backend's), the medians of the wait
    before the first piece started, of the pieces' span, and of the time after the last
    ended until the batch was seen done."""
    groups: dict[str, list[dict]] = {}
    for r in log:
        if r.get("ok", True) and r["pages"]:
            groups.setdefault(f"{r['src']}->{r['dst']} {r['path']}", []).append(r)
    out = {}
    for key, rows in sorted(groups.items()):
        secs = [r["seconds"] for r in rows]
        total_s = sum(secs)
        nbytes = sum(r["bytes"] for r in rows)
        out[key] = {"batches": len(rows), "pages": sum(r["pages"] for r in rows), "bytes": nbytes,
                    "seconds_sum": total_s, "seconds_p50": statistics.median(secs),
                    "GBps": nbytes / total_s / 1e9 if total_s > 0 else None,
                    "GBps_p50": statistics.median(r["bytes"] / r["seconds"] / 1e9
                                                  for r in rows if r["seconds"] > 0)
                    if any(r["seconds"] > 0 for r in rows) else None,
                    "page_bytes": rows[0]["bytes"] // max(1, rows[0]["pages"])}
        io = [r for r in rows if "io_end_s" in r]
        if io:  # hw disk batches: the I/O pool's part of their time (medians)
            out[key].update(
                io_wait_s_p50=statistics.median(r["io_start_s"] for r in io),
                io_s_p50=statistics.median(r["io_end_s"] - r["io_start_s"] for r in io),
                after_io_s_p50=statistics.median(r["seconds"] - r["io_end_s"] for r in io))
    return out


def headline(m: dict) -> dict[str, float | None]:
    """The compared metrics out of a replay's ``metrics`` (summary.json's)."""
    out = {"ttft_p50_s": m["ttft_s"]["p50"], "ttft_p90_s": m["ttft_s"]["p90"],
           "requests_per_s": m["throughput"]["requests_per_s"],
           "output_tokens_per_s": m["throughput"]["output_tokens_per_s"],
           "requests_completed": m["requests_completed"], "requests_failed": m["requests_failed"]}
    for tier, v in m["hit_tokens"].items():
        out[f"hit_tokens_{tier}"] = v
    return out


def turn_hits(rows) -> dict[tuple[str, int], tuple[int, int, int]]:
    """Hit tokens (gpu, host, disk) of each turn, keyed by (session, turn): request ids
    follow release order, which timing can change, so turns are matched by name."""
    return {(str(r.session), int(r.turn)): (int(r.hit_gpu), int(r.hit_host), int(r.hit_disk))
            for r in rows}


def hits_agreement(sim_rows, hw_rows) -> dict:
    """How many turns found the same hit tokens by tier on both backends."""
    a, b = turn_hits(sim_rows), turn_hits(hw_rows)
    both = [k for k in a if k in b]
    same = sum(a[k] == b[k] for k in both)
    return {"turns": len(both), "same_hits_by_tier": same,
            "differ": sorted(f"{s} turn {t}" for s, t in both if a[(s, t)] != b[(s, t)])}


def turn_times(rows) -> dict[tuple[str, int], tuple[float, float | None]]:
    """(arrival s, TTFT s or None if it never got a token) of each turn, keyed as
    ``turn_hits``; rows are a replay's ``Row``s or a saved ``requests.csv``'s."""
    from kvsim.engine.metrics import Row  # noqa: PLC0415

    out = {}
    for r in rows:
        d = dict(zip(Row.COLUMNS, r.csv_values())) if isinstance(r, Row) else vars(r)
        ttft = d.get("ttft_s") or None
        out[(str(d["session"]), int(d["turn"]))] = (float(d["arrival_s"]), None if ttft is None else float(ttft))
    return out


APART_S = 1.0  # a turn's TTFT this far apart (and 2x) between the replays: listed
RACE_S = 1.0  # another session's turn that came back within this of it: a race candidate
APART_MAX = 5


def turn_timing(sim_rows, hw_rows) -> dict:
    """Per-turn timing agreement, steadier than the percentiles of a few dozen turns: the
    median and the 90th percentile of |.| of each turn's TTFT relative error, and how far
    the two replays' arrivals parted (closed-loop sessions carry each turn's error into
    the next turn's arrival).

    ``apart``: the turns (at most ``APART_MAX``, the largest first) whose TTFT differs by
    more than ``APART_S`` and by 2x, each with both sides' arrival and TTFT and
    ``flipped``: the other sessions' turns that came back within ``RACE_S`` of it on both
    sides, but in the other order. Such a pair is a race: whichever the engine admits first,
    the other may wait for KV, and which it is can turn on a fraction of a second."""
    a, b = turn_times(sim_rows), turn_times(hw_rows)
    errs, drift, apart = [], 0.0, []
    for k, (arr_s, ttft_s) in a.items():
        if k not in b:
            continue
        arr_h, ttft_h = b[k]
        drift = max(drift, abs(arr_s - arr_h))
        if ttft_s is not None and ttft_h:
            errs.append(ttft_s / ttft_h - 1)
            lo, hi = min(ttft_s, ttft_h), max(ttft_s, ttft_h)
            if hi - lo > APART_S and hi > 2 * lo:
                apart.append((k, arr_s, arr_h, ttft_s, ttft_h))
    out = []
    for k, arr_s, arr_h, ttft_s, ttft_h in sorted(apart, key=lambda x: -abs(x[3] - x[4]))[:APART_MAX]:
        flipped = []
        for o, (o_s, _) in a.items():
            if o[0] == k[0] or o not in b:
                continue
            o_h = b[o][0]
            if abs(o_s - arr_s) <= RACE_S and abs(o_h - arr_h) <= RACE_S and (o_s < arr_s) != (o_h < arr_h):
                flipped.append(f"{o[0]} turn {o[1]}")
        out.append({"turn": f"{k[0]} turn {k[1]}", "arrival_s": [arr_s, arr_h], "ttft_s": [ttft_s, ttft_h],
                    "flipped": sorted(flipped)})
    absd = sorted(abs(e) for e in errs)
    return {"ttft_rel_err_median": statistics.median(errs) if errs else None,
            "ttft_abs_rel_err_p90": absd[min(len(absd) - 1, int(0.9 * len(absd)))] if absd else None,
            "arrival_drift_max_s": drift, "apart": out}


def bootstrap_ci(values: Iterable[float], q: float, level: float = 0.9, n: int = 2000,
                 seed: int = 0) -> tuple[float, float] | None:
    """A percentile bootstrap interval of the ``q``-th percentile (numpy's, as the metrics
    use) of ``values``: resample them with replacement ``n`` times (a fixed seed: the same
    values give the same interval) and take the central ``level`` of the estimates. How far
    a TTFT percentile of a few dozen turns can move with which turns happen to land near
    it; turns of one session are not independent, so read it as a lower bound."""
    import numpy as np  # noqa: PLC0415

    a = np.asarray(list(values), dtype=np.float64)
    if a.size == 0:
        return None
    rng = np.random.default_rng(seed)
    est = np.percentile(a[rng.integers(0, a.size, (n, a.size))], q, axis=1)
    lo, hi = np.percentile(est, [50 * (1 - level), 50 * (1 + level)])
    return float(lo), float(hi)


def _ttft_ci(rows, metrics: dict, key: str) -> None:
    """Adds to ``metrics`` the reference side's bootstrap interval of TTFT p50 and p90."""
    ttft = [t for _, t in turn_times(rows).values() if t is not None]
    for k, q in (("ttft_p50_s", 50), ("ttft_p90_s", 90)):
        if k in metrics:
            ci = bootstrap_ci(ttft, q)
            metrics[k][key] = None if ci is None else list(ci)  # as it reads back from JSON


def compare_results(sim: Result, hw: Result, sim_log: list[dict], hw_log: list[dict],
                    sim_compute: list | None = None, hw_compute: list | None = None) -> dict:
    """The side-by-side report of two finished replays and their timing logs (and compute
    logs: how much longer than nominal the steps ran on each side)."""
    hs, hh = headline(sim.metrics), headline(hw.metrics)
    metrics = {k: {"sim": hs.get(k), "hw": hh.get(k), "rel_err": rel_err(hs.get(k), hh.get(k))}
               for k in dict.fromkeys([*hs, *hh])}
    _ttft_ci(hw.rows, metrics, "hw_ci90")
    ts, th = transfer_table(sim_log), transfer_table(hw_log)
    transfers = {}
    for key in dict.fromkeys([*th, *ts]):
        a, b = ts.get(key, {}), th.get(key, {})
        transfers[key] = {
            "sim": a, "hw": b,
            "rel_err_seconds_p50": rel_err(a.get("seconds_p50"), b.get("seconds_p50")),
            "rel_err_GBps": rel_err(a.get("GBps"), b.get("GBps")),
        }
    report = {"config": sim.cfg.name, "metrics": metrics, "transfers": transfers,
              "compute": {"sim": compute_summary(sim_compute, SIM_GEMM_COL, sim_log),
                          "hw": compute_summary(hw_compute, HW_GEMM_COL, hw_log)},
              "turns": {**hits_agreement(sim.rows, hw.rows), **turn_timing(sim.rows, hw.rows)},
              "sim_wall_s": sim.metrics.get("wall_time_s"), "hw_wall_s": hw.metrics.get("wall_time_s")}
    ranks = per_rank(sim.metrics, hw.metrics)
    if ranks is not None:  # a node of several ranks (one rank: the report as it was)
        report["ranks"] = ranks
    return report


def replay_sim_side(prep, sim_log: list[dict], pinned: dict | None = None,
                    compute_log: list | None = None, hw_loop: HwLoopModel | None = None) -> Result:
    """The sim side of a compare: it predicts the hw run, so the sim backend carries the hw
    backend's own host costs (``hw_loop``; None: the default model): turns wait for their
    refchecks, which take the hw check's time, the engine loop's host time at a resume
    holds the next step, and transfers complete as late as the hw loop sees them."""
    loop = HwLoop(hw_loop if hw_loop is not None else load_hw_loop(DEFAULT_HW_LOOP))
    return replay(prep, "sim", backend_options={"timing_log": sim_log, "compute_log": compute_log,
                                                "hw_loop": loop},
                  pinned_arrivals=pinned, on_resume=loop.resumed)


def arrivals_of(rows) -> dict[tuple[str, int], float]:
    """(session, turn) -> arrival s of a replay's request rows (or a saved requests.csv's)."""
    return {k: arr for k, (arr, _) in turn_times(rows).items()}


def compare(cfg: RunConfig, trace: str | None = None, hw_options: dict | None = None,
            hw_loop: HwLoopModel | None = None) -> tuple[dict, Result, Result]:
    """Replay ``cfg`` (and ``trace``) on the sim backend, then on the hw backend;
    ``hw_loop``: the sim side's model of the hw backend's host costs (None: the default)."""
    prep = prepare_run(cfg, trace)
    hw_loop = hw_loop if hw_loop is not None else load_hw_loop(DEFAULT_HW_LOOP)
    sim_log: list[dict] = []
    hw_log: list[dict] = []
    sim_compute: list = []
    hw_compute: list = []
    hw_host: list = []
    sim = replay_sim_side(prep, sim_log, compute_log=sim_compute, hw_loop=hw_loop)
    hw = replay(prep, "hw", backend_options={**(hw_options or {}), "timing_log": hw_log,
                                             "compute_log": hw_compute, "host_log": hw_host})
    report = compare_results(sim, hw, sim_log, hw_log, sim_compute, hw_compute)
    report["hw_options"] = {k: v for k, v in (hw_options or {}).items()
                            if k not in ("timing_log", "compute_log", "host_log")}
    report["hw_loop"] = hw_loop.model_dump(mode="json")
    report["logs"] = {"sim": sim_log, "hw": hw_log, "sim_compute": sim_compute,
                      "hw_compute": hw_compute, "hw_host": hw_host}
    return report, sim, hw


def load_run(folder: str | Path) -> tuple[dict, list]:
    """A finished replay's results folder (``kvsim run --out``, or one side of a ``kvsim
    compare``): its ``summary.json`` and ``requests.csv`` rows."""
    import csv  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415

    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder}: expected a results folder (summary.json, requests.csv)")
    try:
        summary = json.loads((folder / "summary.json").read_text())
        for k in ("ttft_s", "throughput", "hit_tokens", "requests_completed", "requests_failed"):  # headline()
            if k not in summary["metrics"]:
                raise KeyError(f"summary.json: metrics has no {k!r}")
        with open(folder / "requests.csv", newline="") as f:
            reader = csv.DictReader(f)
            rows = [SimpleNamespace(**_checked_row(r, reader.line_num)) for r in reader]
    except (OSError, KeyError, ValueError, TypeError) as e:
        raise ValueError(f"{folder}: expected a results folder (summary.json with metrics, "
                         f"requests.csv): {e}") from e
    return summary, rows


_ROW_NUMBERS = {"turn": int, "arrival_s": float, "ttft_s": float, "hit_gpu": int, "hit_host": int,
                "hit_disk": int}


def _checked_row(r: dict, line: int) -> dict:
    """A ``requests.csv`` row with all its fields, the compared ones numbers (ttft_s: or '')."""
    if None in r or None in r.values():
        raise ValueError(f"requests.csv line {line}: not the header's number of fields (a row cut short?)")
    for k, kind in (("session", str), *_ROW_NUMBERS.items()):
        if k not in r:
            raise KeyError(f"requests.csv line {line}: no column {k!r}")
        try:
            kind(r[k]) if r[k] or k != "ttft_s" else None
        except ValueError:
            raise ValueError(f"requests.csv line {line}: {k}: expected a number, got {r[k]!r}") from None
    return r


def saved_hw(folder: str | Path, cfg: RunConfig) -> tuple[Result, list[dict], dict, HwLoopModel | None]:
    """The hw side of an earlier ``kvsim compare``'s folder (``compare.json`` and
    ``hw/summary.json`` + ``hw/requests.csv``): its result (with the hardware profile it
    ran with, when its summary records one), timing log, options, and the hw-loop model
    its sim side used (None if it records none): the report's ``hw_loop``, or, in runs
    saved while those terms were part of the hardware profile, the recorded profile's
    ``loop`` and ``refcheck``, split off into a ``HwLoopModel``."""
    folder = Path(folder)
    try:
        old = read_report(folder)
        summary, rows = load_run(folder / "hw")
    except (OSError, ValueError) as e:
        raise ValueError(f"--hw-from {folder}: expected an earlier compare's folder "
                         f"(compare.json or compare.json.gz, hw/summary.json, hw/requests.csv): "
                         f"{e}") from e
    metrics = summary["metrics"]
    if old.get("config") != cfg.name:
        raise ValueError(f"--hw-from {folder}: it compared config {old.get('config')!r}, not {cfg.name!r}")
    if isinstance(summary.get("config"), dict):  # (a run that records what it replayed)
        same_replay(cfg.model_dump(mode="json"), summary["config"], folder)
    profile, loop = None, None
    if "hw_loop" in old:
        try:
            loop = HwLoopModel.model_validate(old["hw_loop"])
        except ValueError as e:
            raise ValueError(f"--hw-from {folder}: compare.json: hw_loop: {e}") from e
    if "hardware_profile" in summary:
        from kvsim.config.hardware import MOVED_KEYS, HardwareProfile  # noqa: PLC0415
        saved = summary["hardware_profile"]
        where = f"--hw-from {folder}: hw/summary.json: hardware_profile"
        if isinstance(saved, dict) and any(k in saved for k in MOVED_KEYS):
            moved = {k: saved[k] for k in MOVED_KEYS if isinstance(saved.get(k), dict)}
            saved = {k: v for k, v in saved.items() if k not in MOVED_KEYS}
            try:
                loop = loop or HwLoopModel.model_validate(
                    {**moved.get("loop", {}), "refcheck": moved.get("refcheck", {}),
                     "name": f"{saved.get('name')} (recorded in its hardware profile)"})
            except ValueError as e:
                raise ValueError(f"{where}: loop/refcheck: {e}") from e
        try:
            profile = HardwareProfile.model_validate(saved)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
    return (Result(cfg, "hw", metrics, rows, [], profile=profile), old["logs"]["hw"],
            old.get("hw_options", {}), loop)


def compare_saved(cfg: RunConfig, folder: str | Path, trace: str | None = None,
                  saved_profile: bool = False, pin_arrivals: bool = False,
                  profile: HardwareProfile | None = None,
                  hw_loop: HwLoopModel | None = None) -> tuple[dict, Result]:
    """Replay ``cfg`` on the sim only and compare it with the hw replay an earlier compare
    saved in ``folder``: with the current profile (e.g. after re-fitting it, without a
    GPU) or, ``saved_profile``, with the one the hw replay recorded that it ran with (and,
    unless ``hw_loop`` is given, the hw-loop model recorded with it, if any).
    ``pin_arrivals``: the sim releases each turn when hw did (or when its previous item
    completes, if later), so closed-loop sessions do not drift apart and what differs is
    what the model predicts turn by turn. ``profile``: a HardwareProfile for the sim
    instead of either (e.g. the saved one with a term changed). ``hw_loop``: the sim's
    model of the hw backend's host costs (None: the default, or the recorded one)."""
    hw, hw_log, hw_options, saved_loop = saved_hw(folder, cfg)
    had = len(hw.metrics.get("ranks") or ()) or 1  # (a cluster's instances report apart)
    if not is_cluster(cfg) and had != cfg.node.ranks:  # before the replay, not after it
        raise ValueError(f"--hw-from {folder}: its hw run had {had} rank(s), the config has "
                         f"node.ranks={cfg.node.ranks}; compare runs of the same node")
    hw_compute = saved_call_logs(folder).get("hw_compute")  # (None for runs saved before)
    if saved_profile and hw.profile is None:
        raise ValueError(f"--saved-profile: {Path(folder) / 'hw' / 'summary.json'} records no "
                         f"hardware profile (older runs); pass --set hardware=PATH instead")
    if saved_profile:  # the sim's summary says where its profile came from, not the config's name
        cfg = cfg.model_copy(update={"hardware": f"{Path(folder) / 'hw' / 'summary.json'}: hardware_profile"})
        if hw_loop is None and saved_loop is not None:
            hw_loop = saved_loop
    hw_loop = hw_loop if hw_loop is not None else load_hw_loop(DEFAULT_HW_LOOP)
    sim_log: list[dict] = []
    sim_compute: list = []
    use = profile if profile is not None else (hw.profile if saved_profile else None)
    sim = replay_sim_side(prepare_run(cfg, trace, use), sim_log,
                          arrivals_of(hw.rows) if pin_arrivals else None, sim_compute, hw_loop)
    report = compare_results(sim, hw, sim_log, hw_log, sim_compute, hw_compute)
    report["hw_options"] = hw_options
    report["hw_loop"] = hw_loop.model_dump(mode="json")
    report["hw_from"] = str(folder)
    report["pinned_arrivals"] = pin_arrivals
    report["logs"] = {"sim": sim_log, "hw": hw_log, "sim_compute": sim_compute}
    if hw_compute is not None:
        report["logs"]["hw_compute"] = hw_compute
    return report, sim


def diff_runs(a: str | Path, b: str | Path) -> dict:
    """Two finished replays side by side, ``b`` the reference: the headline metrics with
    ``(a - b) / b`` and the per-turn agreement (turns matched by session and turn). Any two
    runs of one workload: hw against hw (how far the GPU repeats itself: the floor under
    any prediction), sim against hw, one policy against another."""
    (sa, ra), (sb, rb) = load_run(a), load_run(b)
    one_workload(ra, rb, a, b)
    ha, hb = headline(sa["metrics"]), headline(sb["metrics"])
    metrics = {k: {"a": ha.get(k), "b": hb.get(k), "rel_err": rel_err(ha.get(k), hb.get(k))}
               for k in dict.fromkeys([*ha, *hb])}
    _ttft_ci(rb, metrics, "b_ci90")
    na, nb = rank_count(sa), rank_count(sb)
    name = lambda s: s.get("config", {}).get("name")  # noqa: E731
    report = {"a": str(a), "b": str(b), "a_backend": sa.get("backend"), "b_backend": sb.get("backend"),
              "a_config": name(sa), "b_config": name(sb), "metrics": metrics,
              "turns": {**hits_agreement(ra, rb), **turn_timing(ra, rb)}}
    by_rank = [bool(s["metrics"].get("ranks")) for s in (sa, sb)]
    if na != nb:  # (node-wide figures still compare; rank by rank there is nothing to pair)
        report["ranks_differ"] = f"{a} has {na} rank(s), {b} has {nb}: no per-rank table"
    elif by_rank[0] != by_rank[1]:  # one routed at run time: a cluster's instances, no ranks
        routed = (a, sa) if by_rank[1] else (b, sb)
        policy = (routed[1].get("config") or {}).get("router", {}).get("policy")
        report["ranks_differ"] = (f"{routed[0]} reports its {na} ranks as a cluster's instances "
                                  f"(router.policy {policy}), the other rank by rank: no "
                                  f"per-rank table")
    else:
        ranks = per_rank(sa["metrics"], sb["metrics"], ("a", "b"), (str(a), str(b)))
        if ranks is not None:  # both a node of the same several ranks
            report["ranks"] = ranks
    return report
