"""The page cache in front of the disk tier (``writes: buffered``), measured on this machine,
beside the sim's model of it (``kvsim_backends.sim.pagecache``).

Linux only (it reads ``/proc``). The measurement is ``kvsim_backends.hw.pagecacheprobe``'s,
which ``kvsim calibrate`` runs too (bounded, and fitted by ``kvsim.tools.fitpagecache``). Steps:

1. Reads ``vm.dirty_bytes`` / ``dirty_ratio``, ``dirty_background_bytes`` / ``_ratio``,
   ``dirty_expire_centisecs`` and ``MemTotal`` / ``MemAvailable``: the kernel's dirty limits
   in bytes (a ratio applied to MemAvailable, an estimate of the kernel's dirtyable memory).
2. Writes one file in ``--dir`` (default the temporary directory) with buffered pwrite in
   pieces of ``--piece`` bytes, one thread, timing each piece and sampling ``Dirty:`` in
   ``/proc/meminfo`` every 64 MiB: the memory-speed phase, where the throttle starts (the
   first 64 MiB window slower than halfway between the memory rate and the final rate,
   with the next three as slow), and the throttled rate (the last quarter's).
3. ``fsync``: the time to write back what was still dirty, and so the drive's rate.
4. Reads back the last ``--read`` bytes (clean, still cached): the cached read rate.
5. Prints the profile's ``page_cache`` keys it measured as YAML (each marked ``measured``
   or ``from /proc``), then the write timeline at each tenth of the file, measured and as
   the sim's model predicts it for the same pieces (its ``rate`` and ``dirty_*`` the
   measured ones, the drive writing back at the measured throttled rate in chunks of the
   profile's ``nvme.piece`` x ``queue_depth``), then its headline, the sim's relative
   error on the time to write the whole file: ``page_cache_sim_rel_err``.

The size (``--size``, default: the dirty limit plus a quarter, at least 1 GiB, at most 48
GiB and half the folder's free space) is meant to run in under 60 s on a 128 GiB machine
with a 2-3 GB/s NVMe drive: ~24 GiB of dirty limit at 20%, copied at >= 4 GB/s (~6 s),
6 GiB more throttled at ~2.5 GB/s (~3 s), then fsync writing back ~24 GiB (~10 s). On a
slower drive or a larger machine give ``--size``. The file is a kvsim scratch file: it is
removed on exit, Ctrl-C, SIGTERM or an error; one left by a killed run (SIGKILL) is removed
by the next run's sweep of the folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]

from kvsim_backends.hw.pagecacheprobe import (  # noqa: E402
    kernel_limits, phases, probe_size, run_probe)
from kvsim.tools.fitpagecache import measured_dirty  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20


def default_size(limits: dict, folder: str) -> int:
    return probe_size(limits, folder, 48 * GiB, floor=GiB)


def predict(pieces: int, piece: int, keys: dict, drive_rate: float, chunk: float) -> np.ndarray:
    """The sim's page cache (``SimPageCache``) writing the same pieces one after another:
    each piece's end, seconds from the first's start."""
    import simpy

    from kvsim_backends.sim.fluid import Fluid
    from kvsim_backends.sim.pagecache import SimPageCache

    env = simpy.Environment()
    fluid = Fluid(env, {"disk_cache": keys["rate"], "disk_write": drive_rate}, per_cta_slowdown=0.0,
                  copy_engine_slowdown=0.0, busy_cta_efficiency=1.0)
    cache = SimPageCache(fluid, keys["dirty_limit"], keys["dirty_background"], keys["dirty_expire"],
                         keys["capacity"], chunk, piece)
    ends = np.empty(pieces)

    def write(i: int) -> None:
        if i < pieces:
            cache.write(piece, ("disk_cache",), 0.0, False, lambda: done(i))

    def done(i: int) -> None:
        ends[i] = fluid.clock.now
        write(i + 1)
    write(0)
    env.run(until=env.now + ends.size * piece / min(keys["rate"], drive_rate) * 4 + keys["dirty_expire"] + 1)
    return ends


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="the folder to write in (default: temp)")
    ap.add_argument("--size", type=float, default=None, help="GiB to write (default: see the docstring)")
    ap.add_argument("--piece", type=float, default=4.0, help="MiB a pwrite (default 4: nvme.piece)")
    ap.add_argument("--read", type=float, default=4.0, help="GiB read back (default 4)")
    ap.add_argument("--profile", default="h200-pcie", help="the profile for the flusher's chunk")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = ap.parse_args(argv)
    if not os.path.exists("/proc/meminfo"):
        print("page_cache: needs Linux's /proc", file=sys.stderr)
        return 2
    if not os.path.isdir(a.dir):
        print(f"--dir: {a.dir!r} is not a folder", file=sys.stderr)
        return 2
    from kvsim.config.hardware import load_profile

    nv = load_profile(a.profile).nvme
    limits = kernel_limits()
    piece = max(4096, int(a.piece * MiB) // 4096 * 4096)
    size = int(a.size * GiB) if a.size else default_size(limits, a.dir)
    size = max(piece * 8, size // piece * piece)
    print(f"# /proc: dirty_limit {limits['dirty_limit'] / GiB:.2f} GiB, dirty_background "
          f"{limits['dirty_background'] / GiB:.2f} GiB, MemTotal {limits['mem_total'] / GiB:.1f} GiB, "
          f"MemAvailable {limits['mem_available'] / GiB:.1f} GiB; writing {size / GiB:.2f} GiB "
          f"in {piece / MiB:g} MiB pieces to {a.dir}", flush=True)
    run = run_probe(a.dir, size, piece, int(a.read * GiB))
    ends, dirty, fsync_s = run["ends"], run["dirty"], run["fsync_s"]
    dirty_left, read_rate = run["dirty_left"], run["read_rate"]
    ph = phases(ends, piece, dirty)
    measured = measured_dirty({"phases": ph, "limits": limits})
    measured_limit = measured[0] if measured else None
    keys = {"rate": ph["memory_rate"],
            "dirty_limit": measured[0] if measured else int(limits["dirty_limit"]),
            "dirty_background": (measured[1] if measured
                                 else int(min(limits["dirty_background"], limits["dirty_limit"]))),
            "dirty_expire": limits["dirty_expire"], "capacity": int(limits["mem_available"])}
    drive = ph["throttled_rate"] if ph["throttle_at"] is not None else nv.write
    sim = predict(len(ends), piece, keys, drive, nv.piece * nv.queue_depth)
    src = "measured: the throttle's onset" if measured_limit else "from /proc (no throttle seen)"
    print("page_cache:")
    print(f"  rate: {keys['rate'] / 1e9:.2f}GB/s  # measured: buffered pwrite of {piece / MiB:g} MiB "
          f"pieces, one thread (cached read back: {read_rate / 1e9:.2f} GB/s)")
    print(f"  dirty_limit: {keys['dirty_limit'] / MiB:.0f}MiB  # {src} (/proc: "
          f"{limits['dirty_limit'] / MiB:.0f} MiB)")
    print(f"  dirty_background: {keys['dirty_background'] / MiB:.0f}MiB  # from /proc (vm.dirty_background_*)")
    print(f"  dirty_expire: {keys['dirty_expire']:g}s  # from /proc (vm.dirty_expire_centisecs)")
    print(f"  capacity: {keys['capacity'] / MiB:.0f}MiB  # from /proc (MemAvailable)")
    what = "throttled rate" if ph["throttle_at"] is not None else "no throttle seen; last quarter's rate"
    print(f"# {what} {ph['throttled_rate'] / 1e9:.2f} GB/s (profile nvme.write "
          f"{nv.write / 1e9:.2f}); fsync {fsync_s:.2f} s with {dirty_left / GiB:.2f} GiB dirty "
          f"({dirty_left / max(fsync_s, 1e-9) / 1e9:.2f} GB/s)")
    print("# GiB written   measured_s   sim_s")
    for k in range(1, 11):
        i = max(0, len(ends) * k // 10 - 1)
        print(f"# {(i + 1) * piece / GiB:11.3f} {ends[i]:12.3f} {sim[i]:7.3f}")
    err = float(sim[-1] / ends[-1] - 1.0)
    if a.json:
        Path(a.json).write_text(json.dumps({"limits": limits, "keys": keys, "phases": ph, "fsync_s": fsync_s,
                                            "read_rate": read_rate, "size": size, "piece": piece,
                                            "measured_s": ends.tolist()[::max(1, len(ends) // 200)],
                                            "sim_s": sim.tolist()[::max(1, len(ends) // 200)],
                                            "sim_rel_err": err}, indent=1))
    print(f"page_cache_sim_rel_err: {err:+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
