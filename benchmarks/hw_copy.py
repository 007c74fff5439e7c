"""GPU <-> host copy rates of the hw backend, both paths, idle and busy, beside the sim's.

Run on a GPU: each cell of both paths and page sizes, idle and while a compute kernel
occupies the SMs, beside the sim backend's prediction of it.

For pages of 16 KiB .. 4 MiB: batches of about ``--batch-bytes`` (at least 512 pages on a
GPU), host pages in random order, pinned host memory, GPU pages in random order. Each cell
is the median of ``--reps`` timed batches after one warm-up, timed from ``transfer()`` to
the runtime seeing the completion (so the copy engine's host time per call and the index
upload count). H2D, D2H and both at once (total of both directions), on the copy engine,
on the SM kernel and on the default path (``default``: each batch on the path the
backend's rule picks as it is submitted, ``kvsim.core.datapath.pathcost``: host -> GPU
first, then GPU -> host beside it). Every measured transfer is checked: a sample of pages
carries refcheck patterns, cleared at the destination before each run and verified after it.

*Busy* cells: the same copies of ``--busy-batch-bytes`` started right after a compute
long enough to outlast them (4x the idle cell's time + 10 ms): a prefill step's stand-in
(``--busy-work prefill``, the default: a 4096-token chunk of Llama 3 8B, GEMMs) or the SMs
alone (``sms``: the busy kernel on every SM). The copy's GB/s under compute and the
compute's stretch (its GPU time over its time alone, measured once a backend). Field
s.1: the copy engines are "1.2-4x faster when the SMs are busy".

Every cell is measured ``--rounds`` times (default 2), a round over all sizes after the
other (each a fresh backend); the table gives each cell's median over the rounds, how far
the rounds part (``(max - min) / median`` of its time: the hw's own repeatability, the
floor under any prediction of one run), the sim backend's prediction of the same batches
on ``--profile`` (``kvsim.tools.fit.sim_cell``; busy cells with the same compute started first)
and sim / hw. Then, with ``--busy-work sms``, the older interference terms the busy cells
imply (``sm.interference`` of a profile), and the summary lines

    hw_copy_default_both_min_GBps (pages from 256 KiB): <the default path both ways>
    hw_copy_default_64KiB_both_over_better: <its GB/s over the better path's at 64 KiB>
    hw_copy_default_busy_cost_within_5pct: K of M (copy + compute stretch, against the
        cheaper of the two paths, under the busy compute)
    hw_copy_default_busy_cost_within_spread: K of M (the same within 5% or the cost's
        own spread across the rounds, whichever is wider; two rounds or more)
    hw_copy_cells_within_5pct_run_to_run: K of M
    hw_copy_sim_within_5pct: K of M (cells whose hw repeats within 5%)
    hw_copy_min_GBps: <lowest idle cell on a batch's path alone>   (the LAST line)

On a machine without a GPU (``--device cpu``, the default there) the hw backend runs on
numpy: the measured cells are only a smoke test of this script and print as n/a (batches
of ``--cpu-pages`` pages), the sim's predictions are printed for the full-size batches.

    python3 benchmarks/hw_copy.py [--reps 3] [--rounds 2] [--sizes 16KiB,...,4MiB]
        [--batch-bytes 1GiB] [--busy-batch-bytes 256MiB] [--profile h200-pcie-calibrated]
        [--sweep 16,32,64 --sweep-sizes 16KiB,256KiB] [--json PATH] [--device auto|gpu|cpu]
        [--busy-work prefill|sms]

``--sim-from RUN.json [RUN2.json ...]`` measures nothing: it prints each saved run's table
with the sim's column recomputed on ``--profile``, ``hw_copy_rule_busy_pick_within: K of
M`` (the cost rule's path on ``--profile`` under the run's compute, judged by the run's own
cells of both paths) and, given several runs, the copy engine's ``busy_per_page`` terms
they imply and LAST ``hw_copy_sim_within_5pct_across_runs: K of M``: of the M cells whose
hw figure moves at most 5% across the runs, how many the sim predicts within 5% of their
median.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim.run.seam import settings_for
from kvsim_backends.hw import HwBackend, RealtimeRuntime  # noqa: E402
from kvsim_backends.hw import pattern  # noqa: E402
from kvsim.core.datapath.copypath import CopyPath  # noqa: E402
from kvsim.core.datapath.work import StepWork  # noqa: E402
from kvsim.core.plan import Batch, BatchKind, Fill  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402
from kvsim.config.units import parse_size  # noqa: E402

SAMPLE = 64
PROFILE = "h200-pcie-calibrated"  # the H200's own: its copy-path rule, CTAs and threads a CTA
DIRS = ("h2d", "d2h", "both")
CE, SM = CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL
DEFAULT = "default"  # the backend's own choice, batch by batch (kvsim.core.datapath.pathcost)
PATHS = (CE, SM, None)  # None: the default path


def run_wait(rt, waitables):
    ev = rt.all_of(waitables)
    return list(rt.run(ev).values())


def measure(rt, be, cp, batches, path, checks, reps, busy_s=0.0, work=None):
    """Median seconds of running ``batches`` together on ``path`` (None: the backend's own
    choice, batch by batch) (and, with ``busy_s``, the median GPU seconds of a compute of
    ``busy_s`` of ``work`` started just before them, else None); checks the sample pages."""
    times, took = [], []
    for r in range(reps + 1):
        for lv, slots, _ in checks:  # clear the sample at the destination
            if lv == Level.GPU and cp is not None:
                be.gpu.view[cp.asarray(slots)] = 0
                cp.cuda.Device().synchronize()
            else:
                (be.gpu.view if lv == Level.GPU else be.host.view)[slots] = 0
        job = be.compute(busy_s, work) if busy_s > 0 else None
        t0 = time.perf_counter()
        oks = run_wait(rt, [be.transfer(b, path=path) for b in batches])
        dt = time.perf_counter() - t0
        c_s = run_wait(rt, [job])[0] if job is not None else None
        name = path.value if path is not None else "default"
        if not all(oks):
            raise SystemExit(f"a transfer failed on {name}: {list(be.errors)}")
        for lv, slots, tags in checks:
            got = be.read_tags(lv, slots)
            if not np.array_equal(got, tags):
                bad = int((got != tags).sum())
                raise SystemExit(f"{name}: {bad} of {len(slots)} sample pages wrong at {lv.name}")
        if r:
            times.append(dt)
            took.append(c_s)
    return float(np.median(times)), (float(np.median(took)) if busy_s > 0 else None)


def _cell(pb, path, d, n, bs, seconds, ctas, **extra):
    return {"page": pb, "path": path.value if path is not None else DEFAULT, "dir": d,
            "pages": n * len(bs), "bytes": n * len(bs) * pb,
            "seconds": seconds, "batches": [["h2d" if b.src == Level.HOST else "d2h", n] for b in bs],
            "ctas": dict(ctas) if path is SM else None, **extra}


def bench_size(pb, batch_bytes, reps, rng, device="gpu", sweep=(), cells=None, profile=PROFILE,
               busy_cells=None, busy_bytes=256 << 20, min_pages=512, work=None):
    """One page size: the default path, CTAs and info; appends each idle cell to ``cells``
    (calibrate's report format: page, path, dir, pages, bytes, seconds, batches, ctas) and
    each busy cell to ``busy_cells`` (the same, plus ``busy_s``: the compute asked for,
    ``compute_s``: its GPU time, ``alone_ratio``: a compute's GPU time over its nominal one
    with nothing copying). ``profile``: the hardware profile the backend decides the
    default path, the SM kernel's CTAs and threads a CTA from; ``work``: the busy cells'
    step (None: the SMs alone, the busy kernel)."""
    n = max(min_pages, batch_bytes // pb)
    nb = max(min_pages, min(n, busy_bytes // pb))  # pages a busy cell's batch
    rt = RealtimeRuntime(poll_interval_s=5e-6)
    be = HwBackend(rt, settings_for(pb, {Level.GPU: 2 * n, Level.HOST: 2 * n}, device=device, profile=profile))
    cp = be.cp
    try:
        host = rng.permutation(2 * n)
        gpu = rng.permutation(2 * n)
        h_in, h_out = host[:n], host[n:]   # H2D reads h_in; D2H writes h_out
        g_in, g_out = gpu[:n], gpu[n:]     # H2D writes g_in; D2H reads g_out
        k = rng.choice(nb, min(SAMPLE, nb), replace=False)  # (in every batch, busy ones too)
        t_h2d, t_d2h = pattern.splitmix64(rng.integers(1, 2**62, (2, len(k))).astype(np.uint64))
        t_h2d |= np.uint64(1)
        t_d2h |= np.uint64(1)
        pattern.write_pages(be.host.view, h_in[k], t_h2d)
        be.fill(Fill(Level.GPU, g_out[k], t_d2h))
        mk = lambda s, d, ss, ds: Batch(BatchKind.EVICT, s, d, ss, ds, np.zeros(len(ss), np.uint64), pb, 0)  # noqa: E731
        c_h2d = [(Level.GPU, g_in[k], t_h2d)]
        c_d2h = [(Level.HOST, h_out[k], t_d2h)]

        def cases(m):
            h2d = mk(Level.HOST, Level.GPU, h_in[:m], g_in[:m])
            d2h = mk(Level.GPU, Level.HOST, g_out[:m], h_out[:m])
            return (("h2d", [h2d], c_h2d), ("d2h", [d2h], c_d2h), ("both", [h2d, d2h], c_h2d + c_d2h))

        row = {"pages": n, "busy_pages": nb, "default": be.copy_path, "ctas": dict(be.ctas),
               "info": dict(be.info)}
        idle_s = {}
        for path in PATHS:
            for d, bs, ch in cases(n):
                idle_s[path, d] = sec = measure(rt, be, cp, bs, path, ch, reps)[0]
                if cells is not None:
                    cells.append(_cell(pb, path, d, n, bs, sec, be.ctas))
        if busy_cells is not None:
            alone = [run_wait(rt, [be.compute(0.02, work)])[0] / 0.02 for _ in range(4)][1:]
            ratio = float(np.median(alone))
            for path in PATHS:
                for d, bs, ch in cases(nb):
                    busy = round(4 * idle_s[path, d] * nb / n + 0.01, 4)  # outlasts the copy
                    sec, took = measure(rt, be, cp, bs, path, ch, reps, busy_s=busy, work=work)
                    busy_cells.append(_cell(pb, path, d, nb, bs, sec, be.ctas, busy_s=busy,
                                            compute_s=took, alone_ratio=ratio,
                                            work=list(work) if work is not None else None))
        for c in sweep:
            be.ctas = {"h2d": c, "d2h": c}
            v = [nbytes / measure(rt, be, cp, bs, SM, ch, 2)[0] / 1e9
                 for (_, bs, ch), nbytes in zip(cases(n), (n * pb, n * pb, 2 * n * pb))]
            print(f"# sweep {pb >> 10} KiB SM kernel {c} CTAs x {be.threads_per_cta} threads: "
                  f"h2d {v[0]:.1f} d2h {v[1]:.1f} both {v[2]:.1f} GB/s", flush=True)
        be.ctas = dict(row["ctas"])
        return row
    finally:
        be.close()


def _key(c):
    return c["page"], c["path"], c["dir"]


def median_rounds(rounds: list[list[dict]]) -> tuple[list[dict], list[dict]]:
    """Cells measured in several rounds -> (each cell with its median time over the rounds,
    and its median ``compute_s`` where it has one; each cell's run-to-run spread:
    ``(max - min) / median`` of its times, ``compute_spread`` that of its compute's)."""
    by: dict = {}
    for cells in rounds:
        for c in cells:
            by.setdefault(_key(c), []).append(c)
    med, spread = [], []
    for k, cs in by.items():
        t = sorted(c["seconds"] for c in cs)
        m = float(np.median(t))
        out = {**cs[0], "seconds": m}
        sp = {"page": k[0], "path": k[1], "dir": k[2], "rounds": len(t), "spread": (t[-1] - t[0]) / m}
        if cs[0].get("compute_s") is not None:
            ct = sorted(c["compute_s"] for c in cs)
            out["compute_s"] = float(np.median(ct))
            sp["compute_spread"] = (ct[-1] - ct[0]) / out["compute_s"]
        med.append(out)
        spread.append(sp)
    return med, spread


def _label(pb):
    return f"{pb >> 20} MiB" if pb >= 1 << 20 else f"{pb >> 10} KiB"


def predict(profile, cells, pages=None):
    """The sim's (copy seconds, compute seconds or None) of each cell, by key; ``pages``
    (page -> pages a batch) replaces each cell's batch size (the cpu smoke test predicts
    the full-size batches)."""
    from kvsim.tools.fit import sim_cell  # noqa: PLC0415

    out = {}
    for c in cells:
        if pages is not None:
            m = pages[c["page"]]
            bs = [[d, m] for d, _ in c["batches"]]
            c = {**c, "batches": bs, "pages": m * len(bs), "bytes": m * len(bs) * c["page"]}
        work = StepWork(*c["work"]) if c.get("work") else None
        out[_key(c)] = (c["bytes"],) + sim_cell(profile, c, c.get("busy_s") or 0.0, work)
    return out


def interference_fit(busy_cells, profile, idle_cells=()):
    """What the busy cells imply for ``sm.interference`` (None where they cannot tell):

    - ``busy_start``: how much later an SM-kernel copy under compute ends than the sim has
      it without the term (with the share below), less what the same cell idle
      (``idle_cells``, where given) took beyond the sim's, scaled to the busy batch's
      bytes (so a run faster or slower than the profile throughout does not count as
      interference); the median over the SM-kernel cells, >= 0. On the H200 a fixed 0.2-0.3 ms, seen as 4-7% of a 256 MiB
      batch and within the noise of a 2 GiB one;
    - ``busy_cta_efficiency``: a lower bound, the smallest per-CTA share under compute
      that still gives every single-direction SM-kernel cell its measured rate (bytes over
      its time less the fixed costs and ``busy_start``, over its CTAs times the per-CTA
      rate; at most 1). The kernel's CTAs are sized for twice the link, so its busy cells
      stay at the link and show no lower share (where one shows, it is that share);
    - ``sm_kernel_slowdown`` at the profile's ``sm_kernel_ctas``, and
      ``copy_engine_slowdown``: from the compute's stretch, ``took = busy x compute.scale +
      copy x s / (1 + s)`` (the sim's fluid: compute runs at 1 / (1 + s) while the copy
      moves bytes, so ``copy`` leaves out the copy engines' per-page host cost), medians
      over the cells."""
    from kvsim.tools.fit import sim_cell  # noqa: PLC0415
    from kvsim.config.hardware import HardwareProfile  # noqa: PLC0415

    sm = profile.sm
    med = lambda v: float(np.median(v)) if v else None  # noqa: E731
    smc = [c for c in busy_cells if c["path"] == "sm_kernel" and c["seconds"] > 0]
    idle = {_key(c): c for c in idle_cells}

    def least_share(start):  # the busy_cta_efficiency bound, with the later start given
        fixed = sm.launch + profile.transfer.latency_for(True) + start
        eff = []
        for c in smc:
            rate = sm.cta_rate(c["dir"], c["page"]) if c["dir"] in ("h2d", "d2h") else 0.0
            cap = (c["ctas"] or {}).get(c["dir"], 0) * rate
            if c["dir"] != "both" and cap > 0 and c["seconds"] > fixed:
                eff.append(min(1.0, c["bytes"] / (c["seconds"] - fixed) / cap))
        return max(eff) if eff else None

    def with_(eff, start):
        d = profile.model_dump()
        d["sm"]["interference"].update(busy_cta_efficiency=eff, busy_start=start)
        return HardwareProfile.model_validate(d)

    def beyond(c, p):  # what the same cell idle took beyond the sim, at this cell's bytes
        i = idle.get(_key(c))
        return 0.0 if i is None else (i["seconds"] - sim_cell(p, i)[0]) * c["bytes"] / i["bytes"]

    # each from the other, from a later start of 0 (a few rounds: where the CTAs bound the
    # rate, a start taken for a lower rate gives a share a little low, and back)
    eff, start = least_share(0.0), None
    for _ in range(50):  # (to 0.1 us)
        p0 = with_(eff or profile.sm.interference.busy_cta_efficiency, 0.0)
        was = start
        start = med([c["seconds"] - sim_cell(p0, c, c["busy_s"])[0] - beyond(c, p0) for c in smc])
        start = None if start is None else max(0.0, start)
        eff = least_share(start or 0.0)
        if start is None or (was is not None and abs(start - was) < 1e-7):
            break
    per_cta, ce = [], []
    for c in busy_cells:
        took, busy, copy = c.get("compute_s"), c["busy_s"], c["seconds"]
        if c["path"] == "sm_kernel":  # (its bytes move, and slow compute, after its start)
            copy -= start or 0.0
        else:  # (the engines' host-side cost a page moves no bytes: compute runs at full speed)
            copy -= sum(n * profile.copy_engine.per_page_for(dr, c["page"]) for dr, n in c["batches"])
        if took is None or copy <= 0:
            continue
        x = (took - busy * profile.compute.scale) / copy
        s = x / (1 - x) if 0 <= x < 1 else None
        if c["path"] == "sm_kernel":
            n = sum((c["ctas"] or {}).get(dr, 0) for dr, _ in c["batches"])
            if s is not None and n:
                per_cta.append(s / n)
        elif s is not None:
            ce.append(s)
    pc = med(per_cta)
    return {"busy_cta_efficiency": eff, "busy_start": start,
            "sm_kernel_slowdown": None if pc is None else pc * sm.interference.sm_kernel_ctas,
            "copy_engine_slowdown": med(ce)}


def _fmt(v, spec, na="n/a"):
    return na if v is None else format(v, spec)


def print_table(sizes, idle, busy, spread, pred, on_gpu, scale=1.0):
    """The cells: hw GB/s (median over the rounds), run-to-run spread, sim GB/s, sim / hw;
    busy cells also the compute's stretch (GPU time over its time alone, - 1; the sim's
    alone: the time asked for x ``scale``, the profile's ``compute.scale``)."""
    print("\nGB/s (1e9 B/s); both = total of both directions at once; spread = (max - min) / median "
          "of the rounds; sim = the sim backend's prediction on the profile; ratio = sim / hw of GB/s")
    hdr = ("| page | path | dir | idle hw | spread | sim | ratio | busy hw | spread | sim | ratio "
           "| compute stretch hw | sim |")
    print(hdr)
    print("|" + " --- |" * 13)
    for pb in sizes:
        for path in (CE.value, SM.value, DEFAULT):
            for d in DIRS:
                k = (pb, path, d)
                cols = []
                for cells in (idle, busy):
                    c = cells.get(k)
                    p = pred.get((cells is busy, k))
                    hw = c["bytes"] / c["seconds"] / 1e9 if (c and on_gpu) else None
                    sim = p[0] / p[1] / 1e9 if p else None
                    sp = spread.get((cells is busy, k), {}).get("spread") if on_gpu else None
                    cols += [_fmt(hw, ".1f"), _fmt(None if sp is None else sp * 100, ".1f") + ("%" if sp is not None else ""),
                             _fmt(sim, ".1f"), _fmt(sim / hw if (sim and hw) else None, ".3f")]
                c, p = busy.get(k), pred.get((True, k))
                st_hw = (c["compute_s"] / (c["busy_s"] * c.get("alone_ratio", 1.0)) - 1) * 100 \
                    if (c and on_gpu and c.get("compute_s")) else None
                st_sim = (p[2] / (c["busy_s"] * scale) - 1) * 100 if (p and c and p[2] is not None) else None
                cols += [_fmt(st_hw, "+.1f") + ("%" if st_hw is not None else ""),
                         _fmt(st_sim, "+.1f") + ("%" if st_sim is not None else "")]
                print(f"| {_label(pb)} | {path} | {d} | " + " | ".join(cols) + " |")


def summarize(sizes, idle_med, busy_med, idle_spread, busy_spread, multi_round, profile, on_gpu,
              defaults, batch_bytes, busy_bytes, busy_rounds=None):
    """Everything after the measurement: the sim's prediction of each cell, the table, the
    default paths, the interference the busy cells imply and the summary lines; returns
    the default path's idle GB/s of every size and direction (for ``hw_copy_min_GBps``).
    ``defaults``: page size -> the default CopyPath; ``multi_round``: the cells are medians
    over rounds (their spreads tell which repeat within 5%)."""
    # the sim's prediction of every cell, at the full-size batches (a GPU's) even on the cpu
    full = {pb: max(512, batch_bytes // pb) for pb in sizes}
    full_busy = {pb: max(512, min(full[pb], busy_bytes // pb)) for pb in sizes}
    if not on_gpu:  # the compute a busy cell asks for: from the sim's idle prediction
        pidle = predict(profile, idle_med, full)
        busy_med = [{**c, "busy_s": round(4 * pidle[_key(c)][1] * full_busy[c["page"]] / full[c["page"]] + 0.01, 4)}
                    for c in busy_med]
    pred = {(False, k): v for k, v in predict(profile, idle_med, None if on_gpu else full).items()}
    pred.update({(True, k): v for k, v in predict(profile, busy_med, None if on_gpu else full_busy).items()})
    idle = {_key(c): c for c in idle_med}
    busy_by = {_key(c): c for c in busy_med}
    spread = {(False, _key(c)): c for c in idle_spread}
    spread.update({(True, _key(c)): c for c in busy_spread})
    print_table(sizes, idle, busy_by, spread, pred, on_gpu, profile.compute.scale)
    print("\nthe default path of a batch alone (the profile's rule): " + ", ".join(
        f"{_label(pb)} {defaults[pb].value}" for pb in sizes) + "; rows 'default': each batch "
        "on the backend's own choice (kvsim.core.datapath.pathcost)")
    mins = [idle[pb, defaults[pb].value, d]["bytes"] / idle[pb, defaults[pb].value, d]["seconds"] / 1e9
            for pb in sizes for d in DIRS if (pb, defaults[pb].value, d) in idle]
    if on_gpu:
        default_figures(sizes, idle, busy_by, busy_rounds)
    if on_gpu and busy_med and all(c.get("work") is None for c in busy_med):
        fit_ = interference_fit(busy_med, profile, idle_med)
        print("interference the busy cells imply (profile now: "
              + ", ".join(f"{k} {getattr(profile.sm.interference, k):g}" for k in fit_) + "): "
              + ", ".join(f"{k} {_fmt(v, '.3g')}" for k, v in fit_.items()))
    if on_gpu:
        allsp = idle_spread + busy_spread
        print(f"hw_copy_cells_within_5pct_run_to_run: {sum(c['spread'] <= 0.05 for c in allsp)} of {len(allsp)}"
              + ("" if multi_round else " (one round: no spread)"))
        steady = [(b, _key(c)) for b, cs in ((False, idle_spread), (True, busy_spread))
                  for c in cs if multi_round and c["spread"] <= 0.05]
        good = 0
        for b, k in steady:
            c = (busy_by if b else idle)[k]
            good += abs(pred[b, k][1] / c["seconds"] - 1) <= 0.05
        print(f"hw_copy_sim_within_5pct: {good} of {len(steady)} (cells whose hw repeats within 5%; "
              f"{len(allsp)} cells in all)")
    else:
        print("hw cells n/a on the cpu (numpy stands in for the GPU: a smoke test of the measurement)")
    return mins


def busy_cost(c) -> float:
    """A busy cell's copy-plus-stretch cost: its copy's seconds and the seconds its compute
    took beyond its time alone."""
    return c["seconds"] + c["compute_s"] - c["busy_s"] * c.get("alone_ratio", 1.0)


def cost_spread(busy_rounds, k) -> float:
    """How far a busy cell's copy-plus-stretch cost moves across the rounds (``(max -
    min) / median``; 0 with fewer than two)."""
    costs = [busy_cost(c) for r in (busy_rounds or []) for c in r if _key(c) == k]
    if len(costs) < 2:
        return 0.0
    return (max(costs) - min(costs)) / float(np.median(costs))


def default_figures(sizes, idle, busy, busy_rounds=None) -> None:
    """The default path's goals, from the measured cells (hw): both ways, its GB/s at every
    page size from 256 KiB (the lowest of them) and at 64 KiB against the better path's;
    under a prefill, its copy-plus-stretch cost within 5% of the cheaper path's, and (with
    ``busy_rounds``, two rounds or more) within 5% or the cost's own spread across the
    rounds in the default's cell or the cheaper one's, whichever is wider."""
    rate = lambda c: c["bytes"] / c["seconds"] / 1e9  # noqa: E731
    big = [rate(idle[pb, DEFAULT, "both"]) for pb in sizes if pb >= 256 << 10 and (pb, DEFAULT, "both") in idle]
    if big:
        print(f"hw_copy_default_both_min_GBps (pages from 256 KiB): {min(big):.1f}")
    k = (64 << 10, DEFAULT, "both")
    if k in idle and (64 << 10, CE.value, "both") in idle and (64 << 10, SM.value, "both") in idle:
        best = max(rate(idle[64 << 10, p, "both"]) for p in (CE.value, SM.value))
        print(f"hw_copy_default_64KiB_both_over_better: {rate(idle[k]) / best:.3f}")
    good = n = held = 0
    for pb in sizes:
        for d in DIRS:
            cs = [busy.get((pb, p, d)) for p in (CE.value, SM.value, DEFAULT)]
            if all(c is not None and c.get("compute_s") is not None for c in cs):
                n += 1
                best = min((busy_cost(cs[0]), CE.value), (busy_cost(cs[1]), SM.value))
                mine = busy_cost(cs[2])
                good += mine <= 1.05 * best[0]
                tol = max(0.05, cost_spread(busy_rounds, (pb, DEFAULT, d)),
                          cost_spread(busy_rounds, (pb, best[1], d)))
                held += mine <= (1 + tol) * best[0]
    if n:
        print(f"hw_copy_default_busy_cost_within_5pct: {good} of {n}")
        if busy_rounds and len(busy_rounds) > 1:
            print(f"hw_copy_default_busy_cost_within_spread: {held} of {n} (within 5% or the "
                  "cells' own spread of that cost across the rounds)")


def print_min(mins, on_gpu):
    print(f"hw_copy_min_GBps: {min(mins):.1f}" if (on_gpu and mins) else "hw_copy_min_GBps: n/a (cpu)")


def default_paths(profile, sizes):
    """Page size -> the copy path the profile's rule gives (the host -> GPU direction's, as
    the hw backend reports it)."""
    from kvsim.core.datapath.copypath import choose_copy_path  # noqa: PLC0415

    return {pb: choose_copy_path(**profile.copy_path_args("h2d", pb)) for pb in sizes}


def _load_run(path) -> dict:
    """A run saved with ``--json``; ValueError naming the file if it is not one."""
    import json  # noqa: PLC0415

    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data["copies"], list) or not isinstance(data.get("busy_copies") or [], list):
            raise TypeError("copies is not a list of cells")
        for c in data["copies"] + (data.get("busy_copies") or []):
            missing = [k for k in ("page", "path", "dir", "bytes", "seconds", "batches") if k not in c]
            if missing:
                raise KeyError(f"a cell without {', '.join(missing)}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--sim-from {path}: not a saved hw_copy.py run ({e})") from None
    return data


def busy_picks(data, profile) -> tuple[int, int, list[str]]:
    """The cost rule's path on ``profile`` for each busy cell of a saved run (under the
    run's compute; both ways: host -> GPU first, then GPU -> host beside it), judged by the
    run's own cells of that path and the other: its copy-plus-stretch cost within 5% of
    the cheaper one's, or within their spread across the rounds. Free of the default
    cells' own noise: a judgement of the rule, not of one more measurement. (good, judged,
    the misses); a pair the rule mixes is not judged (no cell measured it)."""
    from kvsim.core.datapath.copypath import direction_paths, pinned_paths  # noqa: PLC0415
    from kvsim.core.datapath.pathcost import path_chooser  # noqa: PLC0415
    from kvsim.tools.fitkinds import KIND_MODEL  # noqa: PLC0415
    from kvsim_backends.sim.backend import mix_table  # noqa: PLC0415

    busy = {_key(c): c for c in data.get("busy_copies") or []}
    rounds = data.get("busy_rounds")
    free = {"h2d": None, "d2h": None}
    good = n = 0
    misses = []
    for pb in sorted({k[0] for k in busy}):
        cs = {p: {d: busy.get((pb, p, d)) for d in DIRS} for p in (CE.value, SM.value)}
        one = cs[CE.value]["h2d"]
        if one is None or not one.get("work") or any(c is None or c.get("compute_s") is None
                                                     for v in cs.values() for c in v.values()):
            continue
        model = settings_for(pb, {}, profile, model=KIND_MODEL).model
        ch = path_chooser(profile, pb, pinned_paths(profile, pb, free, None, 0, False),
                          direction_paths(profile, pb, free, None, 0, False), None,
                          mix_table(profile, model, pb))
        work, pages = StepWork(*one["work"]), one["pages"]
        h2d = ch.pick("h2d", pages, None, True, work)[0]
        picks = {"h2d": h2d, "d2h": ch.pick("d2h", pages, None, True, work)[0],
                 "both": h2d if ch.pick("d2h", pages, h2d, True, work)[0] is h2d else None}
        for d in DIRS:
            if picks[d] is None:
                continue
            cost = {p: busy_cost(cs[p][d]) for p in cs}
            best, mine = min(cost, key=cost.get), picks[d].value
            tol = max(0.05, cost_spread(rounds, (pb, best, d)), cost_spread(rounds, (pb, mine, d)))
            n += 1
            if cost[mine] <= (1 + tol) * cost[best]:
                good += 1
            else:
                misses.append(f"{_label(pb)} {d}: the rule's {mine} {cost[mine] * 1e3:.1f} ms, "
                              f"{best} {cost[best] * 1e3:.1f} ms")
    return good, n, misses


def sim_from(path, profile) -> None:
    """The table and summary lines of a saved run (``--json``), the sim's column recomputed
    with ``profile``: no device needed."""
    data = _load_run(path)
    idle_med = data["copies"]
    busy_med = data.get("busy_copies") or []
    multi = data.get("spread") is not None
    idle_spread = data.get("spread") or [{**{k: c[k] for k in ("page", "path", "dir")}, "spread": 0.0}
                                         for c in idle_med]
    busy_spread = data.get("busy_spread") or [{**{k: c[k] for k in ("page", "path", "dir")}, "spread": 0.0}
                                              for c in busy_med]
    sizes = sorted({c["page"] for c in idle_med})
    on_gpu = data.get("device", "gpu") != "cpu"
    print(f"# {path}: measured {data.get('date', '?')} on {data.get('device', '?')}; the sim on "
          f"{profile.name}")
    mins = summarize(sizes, idle_med, busy_med, idle_spread, busy_spread, multi, profile, on_gpu,
                     default_paths(profile, sizes), data.get("batch_bytes", 1 << 30), 256 << 20,
                     data.get("busy_rounds"))
    good, n, misses = busy_picks(data, profile)
    if n:
        for m in misses:
            print(f"busy pick miss: {m}")
        print(f"hw_copy_rule_busy_pick_within: {good} of {n} (the rule's path on {profile.name} under "
              "the run's compute, its cell's cost within 5% or the cells' spread of the cheaper path's)")
    print_min(mins, on_gpu)


def busy_per_page_fit(runs, profile) -> dict[str, dict[int, float]]:
    """What the runs' busy copy-engine cells (one direction) imply for the profile's
    ``copy_engine.busy_per_page_h2d`` / ``_d2h``: per run, how much longer a page took
    under the compute than the sim has it without the term, less what the same cell idle
    took a page beyond the sim's (the idle model's own error); the median over the runs,
    >= 0; by direction and page size."""
    d = profile.model_dump()
    d["copy_engine"].update(busy_per_page_h2d=None, busy_per_page_d2h=None)
    bare = type(profile).model_validate(d)
    got: dict[tuple[str, int], list[float]] = {}
    for data in runs:
        idle = {_key(c): c for c in data["copies"]}
        busy = [c for c in data.get("busy_copies") or [] if c["path"] == CE.value
                and c["dir"] != "both" and _key(c) in idle and c.get("busy_s")]
        pb, pi = predict(bare, busy), predict(bare, [idle[_key(c)] for c in busy])
        for c in busy:
            i = idle[_key(c)]
            x = (c["seconds"] - pb[_key(c)][1]) / c["pages"] - (i["seconds"] - pi[_key(c)][1]) / i["pages"]
            got.setdefault((c["dir"], c["page"]), []).append(x)
    out: dict[str, dict[int, float]] = {"h2d": {}, "d2h": {}}
    for (dr, page), xs in sorted(got.items()):
        out[dr][page] = max(0.0, float(np.median(xs)))
    return out


def across_runs(paths, profile) -> None:
    """Over several saved runs: the cells whose GB/s moves at most 5% from run to run
    ((max - min) / median of the runs' figures), and how many of them the sim on
    ``profile`` predicts within 5% of that median. Prints the misses, then
    ``hw_copy_sim_within_5pct_across_runs: GOOD of STEADY``."""
    runs = [_load_run(p) for p in paths]
    by: dict = {}
    for data in runs:
        for busy, cells in ((False, data["copies"]), (True, data.get("busy_copies") or [])):
            for c in cells:
                by.setdefault((busy, _key(c)), []).append(c)
    good, steady = 0, 0
    print(f"\n# across {len(runs)} runs: {', '.join(map(str, paths))}; the sim on {profile.name}")
    for (busy, k), cs in sorted(by.items()):
        rates = [c["bytes"] / c["seconds"] for c in cs]
        med = float(np.median(rates))
        if len(cs) < len(runs) or (max(rates) - min(rates)) / med > 0.05:
            continue
        steady += 1
        c = cs[-1]
        ratio = c["bytes"] / predict(profile, [c])[k][1] / med
        if abs(ratio - 1) <= 0.05:
            good += 1
        else:
            print(f"miss: {_label(k[0])} {k[1]} {k[2]} {'busy' if busy else 'idle'}: hw {med / 1e9:.1f} "
                  f"GB/s (runs {min(rates) / 1e9:.1f}-{max(rates) / 1e9:.1f}), sim / hw {ratio:.3f}")
    fit_ = busy_per_page_fit(runs, profile)
    for dr, by_page in fit_.items():
        if by_page:
            print(f"copy_engine.busy_per_page_{dr} the busy cells imply (median over the runs): {{"
                  + ", ".join(f"{_label(p).replace(' ', '')}: {v * 1e6:.2f}us" for p, v in by_page.items())
                  + "}")
    print(f"hw_copy_sim_within_5pct_across_runs: {good} of {steady} (cells whose hw moves at most 5% "
          f"across the {len(runs)} runs; {len(by)} cells in all)")


def main(argv=None) -> None:
    from kvsim.config.hardware import load_profile  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16KiB,64KiB,256KiB,1MiB,4MiB")
    ap.add_argument("--batch-bytes", default="1GiB")
    ap.add_argument("--busy-batch-bytes", default="256MiB", help="bytes a direction of a busy cell's batch")
    ap.add_argument("--no-busy", action="store_true", help="idle cells only")
    ap.add_argument("--busy-work", default="prefill", choices=("prefill", "sms"),
                    help="the busy cells' compute: a prefill step's stand-in (GEMMs, the "
                    "default) or the SMs alone (the busy kernel; the older interference terms "
                    "are fitted from those)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="measure every cell this many times, "
                    "a round after the other; report medians and the run-to-run spread")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", default="", help="SM kernel CTA counts to sweep (e.g. 16,32,64)")
    ap.add_argument("--sweep-sizes", default="16KiB,256KiB")
    ap.add_argument("--device", default="auto", help="gpu, cpu (numpy: a smoke test of this "
                    "script, hw cells n/a) or auto (the GPU where there is one)")
    ap.add_argument("--cpu-pages", type=int, default=8, help="pages a batch on --device cpu")
    ap.add_argument("--profile", default=PROFILE, help="hardware profile the backend decides from "
                    "and the sim predicts with")
    ap.add_argument("--json", default=None, help="also write every cell (pages, bytes, median seconds) "
                    "here, in calibrate's report format: `kvsim calibrate --check CELLS --profile P` replays them")
    ap.add_argument("--sim-from", default=None, nargs="+", metavar="JSON", help="measure nothing: "
                    "print the table of a run saved with --json, the sim column recomputed on "
                    "--profile; with several runs, each one's, then the cells that repeat across them")
    a = ap.parse_args(argv)
    if a.sim_from:
        from kvsim.config.hardware import ProfileError  # noqa: PLC0415
        try:
            prof = load_profile(a.profile)
            for path in a.sim_from:
                sim_from(path, prof)
            if len(a.sim_from) > 1:
                across_runs(a.sim_from, prof)
        except ProfileError as e:
            ap.error(f"--profile: {e}")
        except ValueError as e:
            ap.error(str(e))
        return
    if a.rounds < 1:
        ap.error(f"--rounds: got {a.rounds}; expected >= 1")
    if a.reps < 1:
        ap.error(f"--reps: got {a.reps}; expected >= 1")
    t_start = time.perf_counter()
    device = a.device
    if device == "auto":
        from kvsim_backends.hw.gpu import load_cupy  # noqa: PLC0415
        device = "gpu" if load_cupy() is not None else "cpu"
    on_gpu = device != "cpu"
    profile = load_profile(a.profile)
    rng = np.random.default_rng(a.seed)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    sweep_sizes = {parse_size(s) for s in a.sweep_sizes.split(",") if s}
    batch_bytes, busy_bytes = parse_size(a.batch_bytes), parse_size(a.busy_batch_bytes)
    min_pages = 512 if on_gpu else a.cpu_pages
    work = None
    if a.busy_work == "prefill":
        from kvsim.tools.fitkinds import kind_works  # noqa: PLC0415

        work = kind_works(profile)["gemm"]
    rounds: list[list[dict]] = []
    busy_rounds: list[list[dict]] = []
    first: dict = {}
    for i in range(a.rounds):
        cells: list[dict] = []
        busy: list[dict] | None = None if a.no_busy else []
        for pb in sizes:
            t0 = time.perf_counter()
            sweep = [int(c) for c in a.sweep.split(",") if c] if pb in sweep_sizes and i == 0 else []
            r = bench_size(pb, batch_bytes if on_gpu else 0, a.reps, rng, device, sweep, cells,
                           a.profile, busy, busy_bytes if on_gpu else 0, min_pages, work)
            first.setdefault(pb, r)
            print(f"# round {i + 1}, {_label(pb)}: {r['pages']} pages a batch ({r['busy_pages']} busy), "
                  f"default {r['default'].value}, SM CTAs {r['ctas']}, {time.perf_counter() - t0:.1f} s; "
                  f"info {r['info']}", flush=True)
        rounds.append(cells)
        busy_rounds.append(busy or [])
    idle_med, idle_spread = median_rounds(rounds)
    busy_med, busy_spread = median_rounds(busy_rounds) if not a.no_busy else ([], [])
    defaults = {pb: first[pb]["default"] for pb in sizes}
    mins = summarize(sizes, idle_med, busy_med, idle_spread, busy_spread, a.rounds > 1, profile,
                     on_gpu, defaults, batch_bytes, busy_bytes, busy_rounds if a.rounds > 1 else None)
    print(f"# {time.perf_counter() - t_start:.1f} s in all", flush=True)
    if a.json:
        import json  # noqa: PLC0415
        with open(a.json, "w") as f:
            json.dump({"device": device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "source": "benchmarks/hw_copy.py", "batch_bytes": batch_bytes,
                       "copies": idle_med, "busy_copies": busy_med, "rounds": rounds if a.rounds > 1 else None,
                       "busy_rounds": busy_rounds if a.rounds > 1 and busy_med else None,
                       "spread": idle_spread if a.rounds > 1 else None,
                       "busy_spread": busy_spread if a.rounds > 1 and busy_med else None,
                       "min_default_GBps": min(mins) if on_gpu else None}, f, indent=1)
    print_min(mins, on_gpu)


if __name__ == "__main__":
    main()
