"""The fit of ``kvsim calibrate``: measurements (``Measured``) -> hardware-profile values.

Pure of the hw backend: the measurements come in as data (``kvsim_backends.hw.microbench``
takes them; a saved report holds them, ``measured_from_report``). What the fit produces
is checked on the sim backend (through the backend registry, ``kvsim.run.sim_backend``):
each measured batch replayed alone with the fitted profile, the relative error per cell.

Fitted into kvsim.config.hardware.HardwareProfile: link rates (the copy engine's), the SM
kernel's own ceilings (per direction and both at once), the copy engine's host time per
page per direction and page size, per-CTA rates (by page size: ``fit_cta_rate``), NVMe
rates/latency at the queue depth and piece size the hw backend runs at, host fill rate,
prefill/decode efficiencies, the copy engine's ``per_call`` (the batched call's host time
for one page), the backend's fixed cost per transfer (``transfer.latency``,
``transfer.latency_sm_kernel``: what small batches take beyond everything else the sim
models) and the structural interference terms per kind
of work (``sm.interference.gemm`` / ``.memory``, ``kvsim.tools.fitkinds``) and the page
cache's dirty limits where a throttle was seen (``kvsim.tools.fitpagecache``), how long two
ranks' kernels on one GPU overlap (``gpu.kernel_overlap``, ``kvsim.tools.fitoverlap``), the
link's total with one direction on each path (``link.mixed``) and what copies take longer
under a prefill (``copy_engine.busy_per_page_*``, the SM kernel's ``busy_cta_efficiency``,
its ``busy_start`` written 0: ``kvsim.tools.fitbusy``). Everything else (the older
interference terms of a compute of the SMs alone, launch, step overhead, public peaks) is
kept from a base profile. ``fit`` also says, per key, where its
value came from; its docstring says why each term has the form it has.
"""

from __future__ import annotations

import statistics

from kvsim.config.hardware import HardwareProfile
from kvsim.tools.fitboost import KEPT_BOOST, fit_replays, fit_trains, replay_runs
from kvsim.tools.fitbusy import fit_busy_most, fit_busy_per_page, fit_busy_sm, fit_reads_share
from kvsim.tools.fitdriver import fit_driver
from kvsim.tools.fitkinds import cell_work, fit_interference, sim_cell
from kvsim.tools.fitoverlap import fit_kernel_overlap
from kvsim.tools.fitpagecache import fit_page_cache
from kvsim.tools.measured import Measured

KiB, MiB = 1 << 10, 1 << 20
DIRS = ("h2d", "d2h", "both")


def _rate(c: dict) -> float:
    return c["bytes"] / c["seconds"]


def _size_key(b: int) -> str:
    return f"{b // MiB}MiB" if b % MiB == 0 else f"{b // KiB}KiB" if b % KiB == 0 else str(b)


def fit_compute(busy: list[dict]) -> tuple[dict, str]:
    """``compute.latency`` and ``compute.scale`` from timed ``compute(d)`` calls (rows of
    ``requested_s``, ``wall_s`` and, optionally, the step's ``kind``): wall - d = latency +
    (scale - 1) x d, least squares over the median of each (kind, duration) cell (calibrate
    times 2, 10 and 50 ms of each kind). Medians, because one call in ten of a 50 ms GEMM
    chain can run 8-13 ms long on the H200 (2026-12-03) and a least-squares line through
    the raw calls then gave 0.85% where the replay's own steps ran 0.13% over. With one
    duration only, or a fitted slope below 0 (noise), scale 1 and the median of wall - d."""
    cells: dict[tuple[str, float], list[float]] = {}
    for r in busy:
        cells.setdefault((str(r.get("kind")), r["requested_s"]), []).append(r["wall_s"] - r["requested_s"])
    d = [k[1] for k in cells]
    over = [statistics.median(v) for v in cells.values()]
    n = len(d)
    span = (f"{len(busy)} calls of {', '.join(f'{x * 1e3:g}' for x in sorted(set(d)))} ms, "
            f"{n} cells")
    if len(set(d)) > 1:
        md, mo = sum(d) / n, sum(over) / n
        slope = sum((x - md) * (y - mo) for x, y in zip(d, over)) / sum((x - md) ** 2 for x in d)
        if slope >= 0:
            lat = max(0.0, mo - slope * md)
            return ({"latency": lat, "scale": 1.0 + slope},
                    f"fitted: the hw backend's compute(d) calls, wall - d = {lat * 1e6:.0f} us + "
                    f"{slope * 100:.2f}% of d (least squares over each cell's median, {span})")
    allover = [r["wall_s"] - r["requested_s"] for r in busy]
    return ({"latency": max(0.0, statistics.median(allover)), "scale": 1.0},
            f"measured: the hw backend's compute(d) calls, wall - d, median of {span}")


def fit(m: Measured, base: HardwareProfile, keep_kinds: bool = False,
        power_state: str = "keep") -> tuple[dict, dict[str, str]]:
    """(profile as a dict of YAML values, comment per key). Raises nothing on missing
    cells: what was not measured stays the base's, and its comment says so.
    ``keep_kinds``: the base's ``sm.interference.gemm`` / ``.memory`` terms stay, not the
    interference cells' fit (``fitkinds.fit_interference``'s ``keep``). ``power_state``
    (``check_power_state``): 'keep' the base's ``compute.boost`` where it has one, else
    fit the trains; 'fit' the trains (``fitboost.fit_trains``) always; compare folders:
    their hw replays' compute-bound steps (``fitboost.fit_replays``).

    Copy paths: the link rates are the copy engine's at the largest page (one direction,
    both at once); the SM kernel gets its own ceilings (``sm.h2d`` / ``sm.d2h``: median of
    its single-direction cells, a plateau flat in page size; ``sm.both``: median of its
    both-directions cells). The copy engine's host time per page is fitted per direction
    and per page size: ``(time - per_call - bytes / link) / pages`` of each single-direction
    cell (>= 0), stored as a table that the sim interpolates in log2(page size). A table,
    because the measured cost is not monotone in the page size (H200 GPU -> host: 0.50 /
    0.72 / 0.37 / 0.60 us at 16 KiB / 64 KiB / 256 KiB / 1 MiB), so no one- or two-
    parameter model (a constant, a + b * page, a power law, or host time overlapping the
    DMA) puts every cell within 5%. ``call_threads: 1``: the hw backend makes every CUDA
    call on one thread, so two batched calls' host times take turns.
    """
    d = base.model_dump()
    why: dict[str, str] = {}
    cells = m.copies
    big = max(c["page"] for c in cells)
    ce_path = "copy_engine" if m.device == "gpu" else "cpu"

    def cell(page, path, dr):
        return next((c for c in cells if c["page"] == page and c["path"] == path and c["dir"] == dr), None)

    for dr in ("h2d", "d2h"):
        ce = cell(big, ce_path, dr)
        d["link"][dr] = _rate(ce)
        why[f"link.{dr}"] = f"measured: {ce_path} at {big // KiB} KiB pages"
    both = cell(big, ce_path, "both")
    d["link"]["both"] = max(_rate(both), d["link"]["h2d"], d["link"]["d2h"])
    why["link.both"] = f"measured: {ce_path} both directions at {big // KiB} KiB pages"
    for dr in DIRS:
        sm = [_rate(c) for c in cells if c["path"] == "sm_kernel" and c["dir"] == dr]
        if sm:
            d["sm"][dr] = statistics.median(sm)
            why[f"sm.{dr}"] = (f"fitted: SM kernel {'both directions at once' if dr == 'both' else dr}, "
                               f"median over {len(sm)} page sizes ({min(sm) / 1e9:.1f}-{max(sm) / 1e9:.1f} GB/s)")
    if d["sm"].get("both") is not None:
        d["sm"]["both"] = max(d["sm"]["both"], *(d["sm"][k] or d["link"][k] for k in ("h2d", "d2h")))
    per_call = base.copy_engine.per_call
    one = [c["call_s"] for c in m.small if c["path"] == ce_path and c["pages"] == 1 and c.get("call_s")]
    if one:
        per_call = d["copy_engine"]["per_call"] = statistics.median(one)
        why["copy_engine.per_call"] = (f"measured: host time of the batched call for one "
                                       f"{_size_key(m.small[0]['page'])} page, median of {len(one)} cells")
    every = []
    for dr in ("h2d", "d2h"):
        table = {}
        for c in sorted((c for c in cells if c["path"] == ce_path and c["dir"] == dr), key=lambda c: c["page"]):
            extra = c["seconds"] - per_call - c["bytes"] / d["link"][dr]
            table[c["page"]] = max(0.0, extra / c["pages"])
        if table:
            d["copy_engine"][f"per_page_{dr}"] = table
            every += list(table.values())
            why[f"copy_engine.per_page_{dr}"] = (f"fitted: {ce_path} {dr} batches per page size, "
                                                 "(time - per_call - bytes / link) / pages, >= 0")
    if every:
        d["copy_engine"]["per_page"] = max(1e-9, statistics.median(every))
        why["copy_engine.per_page"] = "fitted: median of the two tables (the default for a direction without one)"
        d["copy_engine"]["call_threads"] = 1
        why["copy_engine.call_threads"] = "the hw backend: every CUDA call on the runtime's thread"
    for dr, key in (("h2d", "cta_onboard"), ("d2h", "cta_offload")):
        rate, how = fit_cta_rate(m.ctas, dr)
        if rate is not None:
            d["sm"][key], why[f"sm.{key}"] = rate, how
    keys, said = fit_both_split(m.ctas)
    d["sm"].update(keys)
    why.update(said)
    if m.disk:
        # the sim predicts the hw backend, so the device is fitted as that backend drives it
        # (its I/O threads and piece size); the best cell only where those were not measured
        at = m.disk_setting or {}
        own = [r for r in m.disk if r["threads"] == at.get("queue_depth") and r["piece"] == at.get("piece")]
        best_r = own[0] if own else max(m.disk, key=lambda r: r["read_Bps"])
        best_w = own[0] if own else max(m.disk, key=lambda r: r["write_Bps"])
        d["nvme"]["read"], d["nvme"]["write"] = best_r["read_Bps"], best_w["write_Bps"]
        # (reports from before the rewrite pass have none: the rate of a first write then)
        d["nvme"]["rewrite"] = best_w.get("rewrite_Bps")
        d["nvme"]["queue_depth"] = int(best_r["threads"])
        d["nvme"]["piece"] = int(best_r["piece"])
        one = [r for r in m.disk if r["threads"] == 1 and r["piece"] == best_r["piece"]]
        if one:
            # a lone piece takes latency + piece / rate: one estimate from each pass (read,
            # write, rewrite), the median of them (the difference of two noisy rates alone
            # gave 18 us on one machine against 290-370 on others)
            p, o = best_r["piece"], one[0]
            ests = [p / o[k] - p / b[k] for k, b in (("read_Bps", best_r), ("write_Bps", best_w),
                                                     ("rewrite_Bps", best_w)) if o.get(k) and b.get(k)]
            d["nvme"]["latency"] = max(0.0, statistics.median(ests))
        how = "the hw backend's" if own else "best read"
        why["nvme"] = (f"measured: disk-tier file, {how} {best_r['threads']} threads x "
                       f"{best_r['piece'] // MiB} MiB pieces; latency: median over the passes of "
                       f"piece / 1-thread rate - piece / rate")
    fit_page_cache(m.page_cache, d, why)
    if m.host_fills or m.driver_call_s is not None:
        fit_driver(m.host_fills, m.driver_call_s, d, why)
    elif m.host_fill_Bps:  # CPU mode, or a report from before the fills per backing
        d["host"]["fill_rate"] = m.host_fill_Bps
        why["host.fill_rate"] = "measured: anonymous map, touch every page, register (GPU)"
    standin = m.compute.get("standin")
    if standin:
        # the rates the hw backend's compute stand-in runs at: its GEMM chains at the
        # largest M (a prefill chunk's), its reads (a decode step's)
        top = max(standin["gemm_flops"], key=int)
        d["gpu"]["prefill_efficiency"] = min(1.0, standin["gemm_flops"][top] / base.gpu.flops_bf16)
        d["gpu"]["decode_efficiency"] = min(1.0, standin["read_Bps"] / base.gpu.hbm)
        d["gpu"]["gemm_flops"] = {int(m): float(f) for m, f in standin["gemm_flops"].items()}
        why["gpu.gemm_flops"] = "measured: the compute stand-in's fp16 GEMM chains by M, FLOP/s"
        why["gpu.prefill_efficiency"] = (f"measured: the compute stand-in's fp16 GEMM chains at M = "
                                         f"{top} (the model's projections), FLOP/s over the base's peak")
        why["gpu.decode_efficiency"] = "measured: the compute stand-in's HBM reads, over the base's peak"
    elif "matmul_fp16_flops" in m.compute:
        d["gpu"]["prefill_efficiency"] = min(1.0, m.compute["matmul_fp16_flops"] / base.gpu.flops_bf16)
        d["gpu"]["decode_efficiency"] = min(1.0, m.compute["hbm_copy_Bps"] / base.gpu.hbm)
        why["gpu.prefill_efficiency"] = "measured: fp16 8192^3 matmul FLOP/s over the base's peak"
        why["gpu.decode_efficiency"] = "measured: 1 GiB device copy bandwidth over the base's peak"
    fit_kernel_overlap(m.rank_share, d, why)
    if m.compute.get("copy_ctas_per_sm") and d["sm"].get("interference") is not None:
        d["sm"]["interference"]["copy_ctas_per_sm"] = int(m.compute["copy_ctas_per_sm"])
        why["sm.interference.copy_ctas_per_sm"] = (
            "measured: the copy kernel's CTAs one SM holds (its registers and threads)")
    if m.device == "gpu":
        d["sm"]["threads_per_cta"] = 128
        why["sm.threads_per_cta"] = "the hw backend's copy kernel, as measured here"
    _fit_latency(m, d, why, ce_path)
    busy = m.compute.get("busy", [])
    if busy:
        fitted, why["compute.latency"] = fit_compute(busy)
        d["compute"].update(fitted)  # (the base's power state, ``compute.boost``, kept)
        why["compute.scale"] = "fitted with compute.latency, above"
    power = m.compute.get("power")
    replays = replay_runs(power_state)  # (earlier compares' hw replays on this machine)
    if replays:
        d["compute"]["boost"], why["compute.boost"] = fit_replays(replays)
    elif power and power.get("rows"):  # GEMM trains after idle (microbench.measure_power)
        boost, how = fit_trains(power["rows"])
        if power_state == "keep" and base.compute.boost is not None:
            why["compute.boost"] = f"kept: the base's ({base.name}); {KEPT_BOOST}; here {how}: " + \
                ", ".join(f"{k} {v:.4g}" for k, v in boost.items())
        else:
            d["compute"]["boost"], why["compute.boost"] = boost, how
    if both is not None:
        _fit_link_both(both, d, why, ce_path, big)
    _fit_link_mixed([c for c in cells if c["path"] == "mixed"], d, why)
    # last: each replays cells on the sim of everything above (the copy engine's busy cost
    # is part of the interference cells' copies)
    fit_busy_per_page(m.busy_copies, m.copies, d, why)
    g = (d["sm"].get("interference") or {}).get("gemm") or {}
    share = g.get("busy_cta_efficiency_d2h")  # (the base's, before the fit below)
    fit_busy_sm(m.busy_copies, m.copies, d, why)
    fit_busy_most(m.busy_copies, m.copies, d, why, share)
    fit_reads_share(m.interference, d, why)
    if m.interference:
        kinds, kinds_why = fit_interference(m.interference, HardwareProfile.model_validate(d),
                                            keep=keep_kinds)
        for kind, terms in kinds.items():  # (a kind's busy shares, fitted above, kept)
            d["sm"]["interference"][kind] = {**(d["sm"]["interference"].get(kind) or {}), **terms}
        why.update(kinds_why)
    return d, why


def fit_cta_rate(rows: list[dict], dr: str) -> tuple[float | dict[int, float] | None, str]:
    """(``sm.cta_onboard`` for ``dr`` 'h2d', ``cta_offload`` for 'd2h', a comment) from
    calibrate's ``ctas`` rows of that direction: one SM copy CTA's rate, per page size the
    row of fewest CTAs, rate / CTAs (the rate sags as more CTAs fill the link); a table
    by page size where rows of several page sizes exist, else a rate (a row without
    ``page``: 64 KiB, as older reports have them). None without rows."""
    fewest: dict[int, dict] = {}
    for r in rows:
        pb = r.get("page", 64 * KiB)
        if r["dir"] == dr and (pb not in fewest or r["ctas"] < fewest[pb]["ctas"]):
            fewest[pb] = r
    if not fewest:
        return None, ""
    what = "measured: one SM copy CTA's rate " + ("GPU -> host" if dr == "d2h" else "host -> GPU")
    rate = {pb: r["GBps"] * 1e9 / r["ctas"] for pb, r in sorted(fewest.items())}
    if len(rate) == 1:
        (pb, r0), = fewest.items()
        return rate[pb], f"{what}: the SM kernel with {r0['ctas']} CTAs, {pb // KiB} KiB pages, rate / CTAs"
    return rate, (f"{what} by page size: the SM kernel with the fewest CTAs at each, rate / CTAs ("
                  + ", ".join(f"{pb // KiB} KiB {fewest[pb]['ctas']} CTAs: {x / 1e9:.2f} GB/s"
                              for pb, x in rate.items()) + ")")


def fit_both_split(rows: list[dict]) -> tuple[dict, dict[str, str]]:
    """(``sm`` keys, comment per key) from the SM kernel both ways by GPU -> host CTAs
    (``rows``: calibrate's ``ctas`` rows, those of ``dir`` 'both'): ``both_ctas_d2h``, the
    count of the greatest total, median over page sizes (the lower); ``both_crowded``, the
    total at a lone batch's count where that is more. Empty without such rows."""
    best: dict[int, tuple[float, int]] = {}  # page -> (GB/s, GPU -> host CTAs)
    for r in rows:
        if r["dir"] == "both":
            best[r["page"]] = max(best.get(r["page"], (0.0, 0)), (r["GBps"], r["ctas"]))
    if not best:
        return {}, {}
    split = int(statistics.median_low(c for _, c in best.values()))
    out = {"both_ctas_d2h": split}
    why = {"sm.both_ctas_d2h": ("measured: SM kernel both ways, host -> GPU at its own CTAs, the "
                                "GPU -> host CTAs of the greatest total, median over pages (" +
                                ", ".join(f"{pb // KiB} KiB {c}: {g:.1f} GB/s"
                                          for pb, (g, c) in sorted(best.items())) + ")")}
    lone = [r for r in rows if r["dir"] == "both" and r.get("lone") and r["ctas"] > split]
    if lone:
        out["both_crowded"] = statistics.median(r["GBps"] for r in lone) * 1e9
        why["sm.both_crowded"] = (f"measured: SM kernel both ways, host -> GPU at its own CTAs, "
                                  f"GPU -> host at a lone batch's {lone[0]['ctas']}, median over "
                                  f"{len(lone)} page sizes")
    return out, why


def _fit_link_both(cell: dict, d: dict, why: dict[str, str], ce_path: str, big: int) -> None:
    """``link.both``: the total for which the sim reproduces the measured both-directions
    cell at the largest page (bisection between the faster direction and their sum). The
    cell's own rate is a little lower than the link's: the second direction's batched call
    starts only when the first returns (one calling thread), a start-up the sim models
    already, so the raw rate counted it twice. On the H200 that moved link.both
    from 90.32 to 91.45 GB/s only; hw_copy.py's 1 GiB each way measured 97.7-99.7 GB/s in
    the same call, a difference with the batch size this model does not explain."""
    lo = max(d["link"]["h2d"], d["link"]["d2h"])
    hi = d["link"]["h2d"] + d["link"]["d2h"]

    def sim_s(total):
        d["link"]["both"] = total
        return _sim_seconds(HardwareProfile.model_validate(d), cell)

    if sim_s(hi) > cell["seconds"]:  # even the sum of both directions is too slow
        d["link"]["both"] = hi
    elif sim_s(lo) <= cell["seconds"]:
        d["link"]["both"] = lo
    else:
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if sim_s(mid) > cell["seconds"] else (lo, mid)
        d["link"]["both"] = hi
    why["link.both"] = (f"fitted: the total for which the sim reproduces {ce_path} both directions "
                        f"at {big // KiB} KiB pages (measured {_rate(cell) / 1e9:.2f} GB/s)")


def _fit_link_mixed(cells: list[dict], d: dict, why: dict[str, str]) -> None:
    """``link.mixed`` (the copy engine GPU -> host) and ``link.mixed_ce_h2d`` (host ->
    GPU), the other direction on the SM kernel: tables by page size, each entry the total
    for which the sim reproduces that pairing's cell (bisection between 1 GB/s and
    ``link.both``: on the H200 the pair with the copy engine host -> GPU moved less than
    that engine alone at 64 KiB, the SM kernel's stores starved while its reads ran;
    ``link.both`` where even that is too slow: the total did not bind, e.g. 16 KiB pages,
    where the copy engine's host time bounds the pair). A pairing without cells keeps the
    base's value."""
    fitted: dict[str, dict[int, float]] = {}
    for ce_dir, key in (("d2h", "mixed"), ("h2d", "mixed_ce_h2d")):
        mine = sorted((c for c in cells if (c.get("paths") or {}).get(ce_dir) == "copy_engine"),
                      key=lambda c: c["page"])
        if not mine:
            continue
        table = fitted[key] = {}
        for c in mine:
            lo, hi = 1e9, d["link"]["both"]  # (a pair may move less than one direction alone)

            def sim_s(total: float, c: dict = c) -> float:  # (the cell has one pairing: both keys)
                x = dict(d, link={**d["link"], "mixed": total, "mixed_ce_h2d": total})
                return _sim_seconds(HardwareProfile.model_validate(x), c)

            if sim_s(hi) >= c["seconds"] * (1 - 1e-6):  # (also where no total binds)
                table[c["page"]] = hi
            elif sim_s(lo) <= c["seconds"]:
                table[c["page"]] = lo
            else:
                for _ in range(30):
                    mid = (lo + hi) / 2
                    lo, hi = (mid, hi) if sim_s(mid) > c["seconds"] else (lo, mid)
                table[c["page"]] = hi
        rates = ", ".join(f"{c['page'] // KiB} KiB {_rate(c) / 1e9:.1f}" for c in mine)
        why[f"link.{key}"] = (f"fitted: per page size, the total for which the sim reproduces "
                              f"one direction on each path, the copy engine {ce_dir} "
                              f"(measured GB/s: {rates})")
    d["link"].update(fitted)


def _fit_latency(m: Measured, d: dict, why: dict[str, str], ce_path: str) -> None:
    """``transfer.latency`` (copy-engine small batches) and ``latency_sm_kernel`` (SM-kernel
    ones): the median over a path's small-batch cells of (measured - sim without the
    term), >= 0; the sim's time already holds per_call, per_page, launch and the bytes."""
    if not m.small:
        return
    d["transfer"] = {"latency": 0.0, "latency_sm_kernel": None}
    prof = HardwareProfile.model_validate(d)
    for path, key in ((ce_path, "latency"), ("sm_kernel", "latency_sm_kernel")):
        cells = [c for c in m.small if c["path"] == path]
        if not cells:
            continue
        resid = [c["seconds"] - _sim_seconds(prof, c) for c in cells]
        d["transfer"][key] = max(0.0, statistics.median(resid))
        pages = sorted({c["pages"] for c in cells})
        why[f"transfer.{key}"] = (f"fitted: {path} batches of {'/'.join(map(str, pages))} pages of "
                                  f"{_size_key(cells[0]['page'])}, each direction: median of "
                                  "(measured - sim without it) over the cells")


def _sim_seconds(profile: HardwareProfile, c: dict) -> float:
    """Seconds the sim backend takes for a measured cell's batches, started together."""
    return sim_cell(profile, c)[0]


def predict_cell(profile: HardwareProfile, row: dict, nominal: bool = False,
                 dir_s: dict | None = None) -> tuple[float, float]:
    """The sim's (stretch, copy seconds) of a measured cell: its compute (its ``work``,
    for its ``compute_s``) and its copy started as hw's harness started them (the copy
    ``copy_lead_s`` after the compute: ``sim_cell``) on the sim backend with ``profile``;
    the stretch is the compute's time over its time alone, less 1.
    ``nominal``: the cell's full-size batches (``dir_bytes`` a direction), not the ones
    measured (the CPU mode's are cut short). ``dir_s``: gets each direction's batch's
    seconds to its end (``sim_cell``)."""
    c = dict(row)
    if nominal:
        k = max(1, row["dir_bytes"] // row["page"])
        c["batches"] = [[d, k] for d, _ in row["batches"]]
        c["pages"] = k * len(c["batches"])
        c["bytes"] = c["pages"] * row["page"]
    copy_s, took = sim_cell(profile, c, row["compute_s"], cell_work(row), dir_s=dir_s)
    alone = row["compute_s"] * profile.compute.scale
    return float(took) / alone - 1.0, copy_s


def check_cells(cells: list[dict], profile: HardwareProfile) -> list[dict]:
    """Each measured cell (page, path, dir, pages, bytes, seconds; optional ``batches``)
    replayed on the sim backend with ``profile``: rel err = (sim - hw) / hw of the time."""
    out = []
    for c in cells:
        sim_s = _sim_seconds(profile, c)
        out.append({"page": c["page"], "path": c["path"], "dir": c["dir"], "pages": c["pages"],
                    "hw_GBps": _rate(c) / 1e9, "sim_GBps": c["bytes"] / sim_s / 1e9,
                    "hw_s": c["seconds"], "sim_s": sim_s,
                    "rel_err": (sim_s - c["seconds"]) / c["seconds"]})
    return out


def check_fit(m: Measured, profile: HardwareProfile) -> list[dict]:
    """Each measured copy cell replayed alone on the sim backend with ``profile``."""
    return check_cells(m.copies, profile)


def check_small(m: Measured, profile: HardwareProfile) -> list[dict]:
    """Each small-batch cell replayed on the sim backend with ``profile`` (rows marked
    ``small``)."""
    return [{**r, "small": True} for r in check_cells(m.small, profile)]
