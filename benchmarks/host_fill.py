"""Progressive host-tier fill of the hw backend, per backing and tier size (GPU or CPU mode).

For each backing (``register``: fault in + cudaHostRegister in 512 MiB units;
``pinned``: one cudaHostAlloc of the whole range; ``cumem``: cuMemCreate unit by unit into
one reserved range) and each host-tier size, builds the hw
backend's own host tier (``kvsim_backends.hw.hostfill.HostFill``) and times:

- ``first_serve_s``: from asking for the tier (reserve included) until its first unit is
  usable, i.e. until the first page could be served (goal: at most 1 s at every size);
- ``full_s`` and ``rate``: until the whole tier is resident, and its bytes over that time;
- a probe thread making a cheap driver call (``cudaMemGetInfo``; in CPU mode, where there
  is no driver, a tiny numpy copy, so it sees only the interpreter) every ``--probe-gap``
  throughout the fill: calls made, median and worst latency (the worst stall), and the
  share of the fill spent blocked in calls slower than ``--stall`` (default 1 ms).

A size larger than the host memory available (less 10%, at least 1 GiB kept free) is
skipped. The tiers are filled one after the other, each freed before the next (the first
fill of a size may also pay for the VM growing its memory on first touch).

Each row also gives the sim's time to full for that tier at ``--profile``'s rate for the
backing (``sim full``) and its ratio to the measured one (``sim/hw``; goal within 10%
with a calibrated profile). Prints one row per (backing, size), the fill rates as profile values (``host.fill_rate``
for register, ``host.pinned_fill_rate`` for pinned, ``host.cumem_fill_rate`` for cumem: feed
them to the hardware profile),
and LAST ``host_first_serve_s: X``, the worst first-serve time over the sizes for the
default backing (register).

    python3 benchmarks/host_fill.py [--sizes 1GiB] [--backings register,pinned,cumem]
        [--device auto|cpu|gpu] [--unit 512MiB] [--huge-pages] [--numa auto|off|N]
        [--probe-gap 1ms] [--stall 1ms] [--profile h200-pcie] [--json PATH]

On the H200 machine (128 GiB of RAM): ``--sizes 16GiB,64GiB,96GiB`` (about 3-4 min).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "backends")]  # the checkout, installed or not

from kvsim_backends.hw.gpu import load_cupy  # noqa: E402
from kvsim_backends.hw.driverprobe import SLOT, fill_probed  # noqa: E402
from kvsim_backends.hw.resources import _headroom_host, fmt_bytes, host_available  # noqa: E402
from kvsim.core.datapath.fill import Backing, layout_for  # noqa: E402
from kvsim.config.hardware import load_profile  # noqa: E402
from kvsim.config.units import parse_size, parse_time  # noqa: E402

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1GiB", help="host-tier sizes, comma-separated")
    ap.add_argument("--backings", default="register,pinned,cumem")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--unit", default="512MiB", help="the commit unit")
    ap.add_argument("--huge-pages", action="store_true")
    ap.add_argument("--numa", default="auto", help="auto, off or a node number")
    ap.add_argument("--probe-gap", default="1ms")
    ap.add_argument("--stall", default="1ms", help="a probe call slower than this counts as blocked")
    ap.add_argument("--profile", default="h200-pcie",
                    help="hardware profile whose fill rates the sim uses: its prediction of each row")
    ap.add_argument("--json", default=None)
    ap.add_argument("--ranks", default=None,
                    help="R[,R...]: R ranks fill at once, one process each (host_fill_ranks.py); "
                         "then --backings may name 'paced': register in 16 MiB calls, in turns")
    ap.add_argument("--rank-size", default=None, help="with --ranks: cap a rank's tier")
    a = ap.parse_args(argv)
    if a.ranks:
        return main_ranks(a)
    try:
        sizes = [parse_size(s) for s in a.sizes.split(",")]
        backings = [Backing(b) for b in a.backings.split(",")]
        unit, gap, stall = parse_size(a.unit), parse_time(a.probe_gap), parse_time(a.stall)
    except ValueError as e:
        print(f"host_fill.py: {e}", file=sys.stderr)
        return 2
    try:
        prof = load_profile(a.profile)
    except ValueError as e:
        print(f"host_fill.py: --profile: {e}", file=sys.stderr)
        return 2
    numa = int(a.numa) if a.numa.isdigit() else a.numa
    cp = load_cupy() if a.device != "cpu" else None
    if a.device == "gpu" and cp is None:
        print("host_fill.py: --device gpu: CuPy or a CUDA GPU is not available", file=sys.stderr)
        return 2
    mode = "gpu" if cp is not None else "cpu (no driver: the probe times a tiny numpy copy)"
    print(f"device: {mode}; page {fmt_bytes(SLOT)}, unit {fmt_bytes(unit)}, huge pages "
          f"{'on' if a.huge_pages else 'off'}, numa {a.numa}")
    rows = []
    hdr = (f"{'backing':<9} {'size':>10} {'first serve':>12} {'full':>9} {'rate':>11} "
           f"{'probe p50':>10} {'worst':>9} {'blocked':>8} {'sim full':>9} {'sim/hw':>7}  calls")
    print(hdr)
    for nbytes in sizes:
        for backing in backings:
            avail = host_available()
            if avail is not None and nbytes > avail - _headroom_host(avail):
                print(f"{backing.value:<9} {fmt_bytes(nbytes):>10}  skipped: "
                      f"{fmt_bytes(avail)} of host memory available")
                continue
            try:
                r = fill_probed(nbytes, backing, cp, unit, a.huge_pages, numa, gap, stall)
            except Exception as e:  # a backing this machine cannot give: say so, go on
                print(f"{backing.value:<9} {fmt_bytes(nbytes):>10}  FAILED: {type(e).__name__}: {e}")
                continue
            rows.append(r)
            granule = prof.host.cumem_granule if backing is Backing.CUMEM else None
            lay = layout_for(backing, SLOT, r["bytes"] // SLOT, unit, granule)  # the sim's fill of it
            r["sim_full_s"] = lay.seconds(lay.units, prof.host.fill_rate_for(backing.value))
            r["sim_first_serve_s"] = lay.seconds(1, prof.host.fill_rate_for(backing.value))
            rate = f"{r['rate_Bps'] / 1e9:.2f} GB/s" if r["rate_Bps"] else "-"
            ms = lambda v: f"{v * 1e3:.2f} ms" if v is not None else "-"  # noqa: E731
            print(f"{r['backing']:<9} {fmt_bytes(r['bytes']):>10} {r['first_serve_s']:>10.3f} s "
                  f"{r['full_s']:>7.2f} s {rate:>11} {ms(r['probe_p50_s']):>10} "
                  f"{ms(r['probe_worst_s']):>9} {r['probe_blocked_share'] or 0:>7.1%} "
                  f"{r['sim_full_s']:>7.2f} s {r['sim_full_s'] / r['full_s']:>7.2f}  "
                  f"{r['probe_calls']}" + ("" if r["ok"] else f"  FAILED: {r['error']}"))
            sys.stdout.flush()
    if rows:
        print("placement:", json.dumps(rows[-1]["info"]))
    for backing, key in ((Backing.REGISTER, "fill_rate"), (Backing.PINNED, "pinned_fill_rate"),
                         (Backing.CUMEM, "cumem_fill_rate")):
        rs = [r for r in rows if r["backing"] == backing.value and r["ok"] and r["rate_Bps"]]
        if rs:  # the largest tier's rate: the one a startup of that size sees
            big = max(rs, key=lambda r: r["bytes"])
            print(f"profile host.{key}: {big['rate_Bps'] / 1e9:.3g}GB/s  "
                  f"({backing.value}, {fmt_bytes(big['bytes'])})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": "gpu" if cp is not None else "cpu", "rows": rows}, f, indent=1)
    reg = [r["first_serve_s"] for r in rows if r["backing"] == Backing.REGISTER.value and r["ok"]]
    if not reg:
        print("host_first_serve_s: nan")
        return 1
    print(f"host_first_serve_s: {max(reg):.3f}")
    return 0


def main_ranks(a) -> int:
    """``--ranks``: seed 001's table, hw beside the sim (``host_fill_ranks``). Last line:
    ``host_fill_ranks_order_agrees: K of N`` (the (R, stat) cells whose backings come in
    the same order by probe-blocked share and by worst stall on hw and in the sim)."""
    from host_fill_ranks import hw_node, order_agrees, rank_size, sim_node  # noqa: PLC0415

    try:
        ranks = [int(r) for r in a.ranks.split(",")]
        backings = a.backings.split(",")
        for b in backings:
            if b != "paced":
                Backing(b)
        unit, gap, stall = parse_size(a.unit), parse_time(a.probe_gap), parse_time(a.stall)
        cap = parse_size(a.rank_size) if a.rank_size else None
        prof = load_profile(a.profile)
    except ValueError as e:
        print(f"host_fill.py: {e}", file=sys.stderr)
        return 2
    if prof.driver is None:
        print(f"host_fill.py: --profile {a.profile}: it has no driver section to predict with",
              file=sys.stderr)
        return 2
    cp = load_cupy() if a.device != "cpu" else None
    print(f"device: {'gpu' if cp is not None else 'cpu (no driver: hw rows time a numpy copy)'}; "
          f"page {fmt_bytes(SLOT)}, unit {fmt_bytes(unit)}; sim on {prof.name}")
    print(f"{'R':>3} {'backing':<9} {'per rank':>10} | {'rate':>10} {'first':>8} {'blocked':>8} "
          f"{'worst':>9} | sim: {'rate':>10} {'first':>8} {'blocked':>8} {'worst':>9}")
    agree = cells = 0
    out = []
    for r in ranks:
        nbytes = rank_size(r, host_available(), cap, SLOT)
        hw_rows, sim_rows = [], []
        for b in backings:
            hw = hw_node(r, nbytes, b, unit, SLOT, gap, stall)
            sim = sim_node(prof, r, nbytes, b, unit, SLOT, gap, stall)
            hw_rows.append(hw)
            sim_rows.append(sim)
            out.append({"hw": hw, "sim": sim})
            f = lambda x: (f"{x['rate_Bps'] / 1e9:>7.2f}GB/s {x['first_s']:>7.3f}s "  # noqa: E731
                           f"{x['blocked_share']:>7.1%} {x['worst_s'] * 1e3:>7.1f}ms")
            print(f"{r:>3} {b:<9} {fmt_bytes(nbytes):>10} | {f(hw)} | sim: {f(sim)}"
                  + ("" if hw["ok"] else f"  FAILED: {hw['error']}"), flush=True)
        for key in ("blocked_share", "worst_s"):
            cells += 1
            agree += order_agrees(hw_rows, sim_rows, key)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"device": "gpu" if cp is not None else "cpu", "rows": out}, fh, indent=1)
    print(f"host_fill_ranks_order_agrees: {agree} of {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
