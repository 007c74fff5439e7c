"""GPU <-> host copy bandwidth of the hw backend, both paths, per page size (run on a GPU).

For pages of 16 KiB .. 4 MiB: batches of about 1 GiB (at least 512 pages), host pages in
random order, pinned host memory, GPU pages in random order. Each cell is the median of
``--reps`` timed batches after one warm-up, timed from ``transfer()`` to the runtime seeing
the completion (so the copy engine's host time per call and the index upload count).
H2D, D2H and both at once (total of both directions). Every measured transfer is checked:
a sample of pages carries refcheck patterns, cleared at the destination before each run
and verified after it.

Prints a table of GB/s per path and the default path (``choose_copy_path``), then a
compute-interference probe; the LAST line is ``hw_copy_min_GBps: <lowest default cell>``.

``--rounds N`` measures every cell N times, a round over all sizes after the other (each
a fresh backend), reports each cell's median over the rounds and prints how far the
rounds of one cell part: ``(max - min) / median`` of its time, a cell by cell table, and
``hw_copy_cells_within_5pct_run_to_run: K of M``. That is the hw's own repeatability, the
floor under any prediction of a single run.

    python3 benchmarks/hw_copy.py [--reps 3] [--rounds 1] [--sizes 16KiB,...,4MiB] [--batch-bytes 1GiB]
                                  [--profile h200-pcie-calibrated]
                                  [--sweep 16,32,64 --sweep-sizes 16KiB,256KiB] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from backends.hw import HwBackend, RealtimeRuntime  # noqa: E402
from backends.hw import pattern  # noqa: E402
from kvsim.core.copypath import CopyPath  # noqa: E402
from kvsim.core.plan import Batch, BatchKind, Fill  # noqa: E402
from kvsim.core.spec import Level  # noqa: E402
from kvsim.units import parse_size  # noqa: E402

SAMPLE = 64
PROFILE = "h200-pcie-calibrated"  # the H200's own: its copy-path rule, CTAs and threads a CTA


def run_wait(rt, waitables):
    ev = rt.all_of(waitables)
    return list(rt.run(ev).values())


def measure(rt, be, cp, batches, path, checks, reps):
    """Median GB/s of running ``batches`` together on ``path``; checks the sample pages."""
    nbytes = sum(b.nbytes for b in batches)
    times = []
    for r in range(reps + 1):
        for lv, slots, _ in checks:  # clear the sample at the destination
            if lv == Level.GPU and cp is not None:
                be.gpu.view[cp.asarray(slots)] = 0
                cp.cuda.Device().synchronize()
            else:
                (be.gpu.view if lv == Level.GPU else be.host.view)[slots] = 0
        t0 = time.perf_counter()
        oks = run_wait(rt, [be.transfer(b, path=path) for b in batches])
        dt = time.perf_counter() - t0
        if not all(oks):
            raise SystemExit(f"a transfer failed on {path.value}: {list(be.errors)}")
        for lv, slots, tags in checks:
            got = be.read_tags(lv, slots)
            if not np.array_equal(got, tags):
                bad = int((got != tags).sum())
                raise SystemExit(f"{path.value}: {bad} of {len(slots)} sample pages wrong at {lv.name}")
        if r:
            times.append(dt)
    return nbytes / float(np.median(times)) / 1e9


def bench_size(pb, batch_bytes, reps, rng, device="gpu", sweep=(), cells=None, profile=PROFILE):
    """One page size: a row of GB/s per (path, direction); appends each cell to ``cells``
    (calibrate's report format). ``profile``: the hardware profile the backend decides the
    default path, the SM kernel's CTAs and threads a CTA from."""
    n = max(512, batch_bytes // pb)
    rt = RealtimeRuntime(poll_interval_s=5e-6)
    be = HwBackend(rt, pb, {Level.GPU: 2 * n, Level.HOST: 2 * n}, device=device, profile=profile)
    cp = be.cp
    try:
        host = rng.permutation(2 * n)
        gpu = rng.permutation(2 * n)
        h_in, h_out = host[:n], host[n:]   # H2D reads h_in; D2H writes h_out
        g_in, g_out = gpu[:n], gpu[n:]     # H2D writes g_in; D2H reads g_out
        k = rng.choice(n, SAMPLE, replace=False)
        t_h2d, t_d2h = pattern.splitmix64(rng.integers(1, 2**62, (2, SAMPLE)).astype(np.uint64))
        t_h2d |= np.uint64(1)
        t_d2h |= np.uint64(1)
        pattern.write_pages(be.host.view, h_in[k], t_h2d)
        be.fill(Fill(Level.GPU, g_out[k], t_d2h))
        mk = lambda s, d, ss, ds: Batch(BatchKind.EVICT, s, d, ss, ds, np.zeros(n, np.uint64), pb, 0)  # noqa: E731
        h2d = mk(Level.HOST, Level.GPU, h_in, g_in)
        d2h = mk(Level.GPU, Level.HOST, g_out, h_out)
        c_h2d = [(Level.GPU, g_in[k], t_h2d)]
        c_d2h = [(Level.HOST, h_out[k], t_d2h)]
        row = {"pages": n, "default": be.copy_path, "ctas": dict(be.ctas), "info": dict(be.info)}
        for path in (CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL):
            for d, bs, ch in (("h2d", [h2d], c_h2d), ("d2h", [d2h], c_d2h), ("both", [h2d, d2h], c_h2d + c_d2h)):
                row[path, d] = gbps = measure(rt, be, cp, bs, path, ch, reps)
                if cells is not None:
                    cells.append({"page": pb, "path": path.value, "dir": d, "pages": n * len(bs),
                                  "bytes": n * len(bs) * pb, "seconds": n * len(bs) * pb / (gbps * 1e9),
                                  "batches": [["h2d" if b.src == Level.HOST else "d2h", n] for b in bs],
                                  "ctas": dict(be.ctas) if path is CopyPath.SM_KERNEL else None})
        for c in sweep:
            be.ctas = {"h2d": c, "d2h": c}
            v = [measure(rt, be, cp, bs, CopyPath.SM_KERNEL, ch, 2)
                 for bs, ch in (([h2d], c_h2d), ([d2h], c_d2h), ([h2d, d2h], c_h2d + c_d2h))]
            print(f"# sweep {pb >> 10} KiB SM kernel {c} CTAs x {be.threads_per_cta} threads: "
                  f"h2d {v[0]:.1f} d2h {v[1]:.1f} both {v[2]:.1f} GB/s", flush=True)
        be.ctas = dict(row["ctas"])
        if pb == 64 << 10:
            row["interference"] = interference(rt, be, h2d, d2h)
        return row
    finally:
        be.close()


def interference(rt, be, h2d, d2h):
    """Wall time of a 20 ms compute alone and while each path copies both ways."""
    out = {}
    for name, path in (("alone", None), ("copy_engine", CopyPath.COPY_ENGINE), ("sm_kernel", CopyPath.SM_KERNEL)):
        took = []
        for _ in range(3):
            extra = [] if path is None else [be.transfer(h2d, path=path), be.transfer(d2h, path=path)]
            c = be.compute(0.02)
            vals = run_wait(rt, [c] + extra)
            took.append(vals[0])
        out[name] = float(np.median(took))
    return out


def median_rounds(rounds: list[list[dict]]) -> tuple[list[dict], list[dict]]:
    """Cells measured in several rounds -> (each cell with its median time over the rounds,
    each cell's run-to-run spread: ``(max - min) / median`` of its times)."""
    key = lambda c: (c["page"], c["path"], c["dir"])  # noqa: E731
    by: dict = {}
    for cells in rounds:
        for c in cells:
            by.setdefault(key(c), []).append(c)
    med, spread = [], []
    for k, cs in by.items():
        t = sorted(c["seconds"] for c in cs)
        m = float(np.median(t))
        med.append({**cs[0], "seconds": m})
        spread.append({"page": k[0], "path": k[1], "dir": k[2], "rounds": len(t), "spread": (t[-1] - t[0]) / m})
    return med, spread


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16KiB,64KiB,256KiB,1MiB,4MiB")
    ap.add_argument("--batch-bytes", default="1GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="measure every cell this many times, "
                    "a round after the other; report medians and the run-to-run spread")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", default="", help="SM kernel CTA counts to sweep (e.g. 16,32,64)")
    ap.add_argument("--sweep-sizes", default="16KiB,256KiB")
    ap.add_argument("--device", default="gpu", help="'cpu' only to smoke-test this script")
    ap.add_argument("--profile", default=PROFILE, help="hardware profile the backend decides from")
    ap.add_argument("--json", default=None, help="also write every cell (pages, bytes, median seconds) "
                    "here, in calibrate's report format: `kvsim calibrate --check CELLS --profile P` replays them")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds: got {a.rounds}; expected >= 1")
    rng = np.random.default_rng(a.seed)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    sweep_sizes = {parse_size(s) for s in a.sweep_sizes.split(",") if s}
    rounds: list[list[dict]] = []
    all_rows: list[dict] = []
    for i in range(a.rounds):
        cells: list[dict] = []
        rows = {}
        for pb in sizes:
            t0 = time.perf_counter()
            sweep = [int(c) for c in a.sweep.split(",") if c] if pb in sweep_sizes and i == 0 else []
            rows[pb] = bench_size(pb, parse_size(a.batch_bytes), a.reps, rng, a.device, sweep, cells,
                                  a.profile)
            r = rows[pb]
            print(f"# {'round %d, ' % (i + 1) if a.rounds > 1 else ''}{pb >> 10} KiB: {r['pages']} pages a batch, "
                  f"default {r['default'].value}, SM CTAs {r['ctas']}, {time.perf_counter() - t0:.1f} s; "
                  f"info {r['info']}", flush=True)
        rounds.append(cells)
        all_rows.append(rows)
    CE, SM = CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL
    med = {}  # (page, path, dir) -> median GB/s over the rounds
    for pb in sizes:
        for path in (CE, SM):
            for d in ("h2d", "d2h", "both"):
                med[pb, path, d] = float(np.median([rows[pb][path, d] for rows in all_rows]))
    print()
    print("GB/s (1e9 B/s); both = total of both directions at once"
          + (f"; median of {a.rounds} rounds" if a.rounds > 1 else ""))
    hdr = (f"{'page':>8} {'pages':>6} | {'CE h2d':>7} {'CE d2h':>7} {'CE both':>7} | "
           f"{'SM h2d':>7} {'SM d2h':>7} {'SM both':>7} | {'default':>11} {'h2d':>6} {'d2h':>6} {'both':>6}")
    print(hdr)
    print("-" * len(hdr))
    mins = []
    for pb in sizes:
        r = all_rows[0][pb]
        d = r["default"]
        dv = [med[pb, d, x] for x in ("h2d", "d2h", "both")]
        mins += dv
        label = f"{pb >> 20} MiB" if pb >= 1 << 20 else f"{pb >> 10} KiB"
        print(f"{label:>8} {r['pages']:>6} | {med[pb, CE, 'h2d']:7.1f} {med[pb, CE, 'd2h']:7.1f} {med[pb, CE, 'both']:7.1f} | "
              f"{med[pb, SM, 'h2d']:7.1f} {med[pb, SM, 'd2h']:7.1f} {med[pb, SM, 'both']:7.1f} | "
              f"{d.value:>11} {dv[0]:6.1f} {dv[1]:6.1f} {dv[2]:6.1f}")
    for pb, r in all_rows[0].items():  # the first round's probe
        if "interference" in r:
            i = r["interference"]
            print(f"\ncompute of 20 ms (busy kernel on all SMs) while 64 KiB pages copy both ways: "
                  f"alone {i['alone'] * 1e3:.2f} ms, with copy engine {i['copy_engine'] * 1e3:.2f} ms, "
                  f"with SM kernel {i['sm_kernel'] * 1e3:.2f} ms")
    cells, spread = median_rounds(rounds)
    if a.rounds > 1:
        print(f"\nrun to run: (max - min) / median of each cell's time over {a.rounds} rounds")
        print("| page | CE h2d | CE d2h | CE both | SM h2d | SM d2h | SM both |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        sp = {(c["page"], c["path"], c["dir"]): c["spread"] for c in spread}
        for pb in sizes:
            label = f"{pb >> 20} MiB" if pb >= 1 << 20 else f"{pb >> 10} KiB"
            print(f"| {label} | " + " | ".join(f"{sp[pb, p.value, d] * 100:.1f}%" for p in (CE, SM)
                                             for d in ("h2d", "d2h", "both")) + " |")
        print(f"hw_copy_cells_within_5pct_run_to_run: {sum(c['spread'] <= 0.05 for c in spread)} of {len(spread)}")
    if a.json:
        import json  # noqa: PLC0415
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "source": "benchmarks/hw_copy.py", "batch_bytes": parse_size(a.batch_bytes),
                       "copies": cells, "rounds": rounds if a.rounds > 1 else None,
                       "spread": spread if a.rounds > 1 else None, "min_default_GBps": min(mins)}, f, indent=1)
    print(f"hw_copy_min_GBps: {min(mins):.1f}")


if __name__ == "__main__":
    main()
