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

    python3 benchmarks/hw_copy.py [--reps 3] [--sizes 16KiB,...,4MiB] [--batch-bytes 1GiB]
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
CELLS: list[dict] = []  # every measured cell, for --json (the sim's out-of-sample check)


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


def bench_size(pb, batch_bytes, reps, rng, device="gpu", sweep=()):
    n = max(512, batch_bytes // pb)
    rt = RealtimeRuntime(poll_interval_s=5e-6)
    be = HwBackend(rt, pb, {Level.GPU: 2 * n, Level.HOST: 2 * n}, device=device)
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
                CELLS.append({"page": pb, "path": path.value, "dir": d, "pages": n * len(bs),
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16KiB,64KiB,256KiB,1MiB,4MiB")
    ap.add_argument("--batch-bytes", default="1GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", default="", help="SM kernel CTA counts to sweep (e.g. 16,32,64)")
    ap.add_argument("--sweep-sizes", default="16KiB,256KiB")
    ap.add_argument("--device", default="gpu", help="'cpu' only to smoke-test this script")
    ap.add_argument("--json", default=None, help="also write every cell (pages, bytes, median seconds) "
                    "here, in calibrate's report format: `python3 -m kvsim.calibrate --check` replays them")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    rows = {}
    sweep_sizes = {parse_size(s) for s in a.sweep_sizes.split(",") if s}
    for pb in sizes:
        t0 = time.perf_counter()
        sweep = [int(c) for c in a.sweep.split(",") if c] if pb in sweep_sizes else []
        rows[pb] = bench_size(pb, parse_size(a.batch_bytes), a.reps, rng, a.device, sweep)
        r = rows[pb]
        print(f"# {pb >> 10} KiB: {r['pages']} pages a batch, default {r['default'].value}, "
              f"SM CTAs {r['ctas']}, {time.perf_counter() - t0:.1f} s; info {r['info']}", flush=True)
    CE, SM = CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL
    print()
    print("GB/s (1e9 B/s); both = total of both directions at once")
    hdr = (f"{'page':>8} {'pages':>6} | {'CE h2d':>7} {'CE d2h':>7} {'CE both':>7} | "
           f"{'SM h2d':>7} {'SM d2h':>7} {'SM both':>7} | {'default':>11} {'h2d':>6} {'d2h':>6} {'both':>6}")
    print(hdr)
    print("-" * len(hdr))
    cells = []
    for pb, r in rows.items():
        d = r["default"]
        dv = [r[d, x] for x in ("h2d", "d2h", "both")]
        cells += dv
        label = f"{pb >> 20} MiB" if pb >= 1 << 20 else f"{pb >> 10} KiB"
        print(f"{label:>8} {r['pages']:>6} | {r[CE, 'h2d']:7.1f} {r[CE, 'd2h']:7.1f} {r[CE, 'both']:7.1f} | "
              f"{r[SM, 'h2d']:7.1f} {r[SM, 'd2h']:7.1f} {r[SM, 'both']:7.1f} | "
              f"{d.value:>11} {dv[0]:6.1f} {dv[1]:6.1f} {dv[2]:6.1f}")
    for pb, r in rows.items():
        if "interference" in r:
            i = r["interference"]
            print(f"\ncompute of 20 ms (busy kernel on all SMs) while 64 KiB pages copy both ways: "
                  f"alone {i['alone'] * 1e3:.2f} ms, with copy engine {i['copy_engine'] * 1e3:.2f} ms, "
                  f"with SM kernel {i['sm_kernel'] * 1e3:.2f} ms")
    if a.json:
        import json  # noqa: PLC0415
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "source": "benchmarks/hw_copy.py", "batch_bytes": parse_size(a.batch_bytes),
                       "copies": CELLS, "min_default_GBps": min(cells)}, f, indent=1)
    print(f"hw_copy_min_GBps: {min(cells):.1f}")


if __name__ == "__main__":
    main()
