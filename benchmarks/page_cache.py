"""The page cache in front of the disk tier (``writes: buffered``), measured on this machine,
beside the sim's model of it (``kvsim_backends.sim.pagecache``).

Linux only (it reads ``/proc``). Steps:

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
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]

from kvsim import scratch  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
WINDOW = 64 * MiB


def _read(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def meminfo() -> dict[str, int]:
    """``/proc/meminfo``'s fields, in bytes."""
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def kernel_limits() -> dict:
    """The kernel's dirty limits in bytes (a ``*_bytes`` key wins over its ratio, as in
    the kernel; a ratio of MemAvailable), the expiry, MemTotal and MemAvailable."""
    vm, mem = "/proc/sys/vm/", meminfo()
    avail = mem.get("MemAvailable", 0)

    def limit(name: str) -> int:
        b = _read(vm + f"{name}_bytes") or 0
        return b if b > 0 else (_read(vm + f"{name}_ratio") or 0) * avail // 100
    return {"dirty_limit": limit("dirty"), "dirty_background": limit("dirty_background"),
            "dirty_expire": (_read(vm + "dirty_expire_centisecs") or 3000) / 100.0,
            "mem_total": mem.get("MemTotal", 0), "mem_available": avail}


def default_size(limits: dict, folder: str) -> int:
    free = shutil.disk_usage(folder).free
    want = max(GiB, limits["dirty_limit"] * 5 // 4)
    return int(min(want, 48 * GiB, free // 2)) // MiB * MiB


def write_file(fd: int, size: int, piece: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Buffered pwrite of ``size`` bytes in pieces: each piece's end (seconds from the
    first's start), and (bytes written, Dirty bytes) every window."""
    buf = np.random.default_rng(0).integers(0, 255, piece, dtype=np.uint8)  # not zeros: no shortcut
    n = size // piece
    ends = np.empty(n)
    dirty: list[tuple[int, int]] = []
    every = max(1, WINDOW // piece)
    t0 = time.perf_counter()
    for i in range(n):
        off = i * piece
        done = 0
        while done < piece:
            done += os.pwrite(fd, memoryview(buf)[done:], off + done)
        ends[i] = time.perf_counter() - t0
        if i % every == every - 1:
            dirty.append(((i + 1) * piece, meminfo().get("Dirty", 0)))
    return ends, dirty


def phases(ends: np.ndarray, piece: int, dirty: list[tuple[int, int]]) -> dict:
    """The memory-speed rate, where the throttle starts (bytes, and Dirty then) and the
    throttled rate, from the pieces' ends in windows of WINDOW bytes."""
    per = max(1, WINDOW // piece)
    t = np.concatenate([[0.0], ends[per - 1::per]])
    rates = per * piece / np.maximum(np.diff(t), 1e-9)
    if len(rates) < 4:
        r = len(ends) * piece / ends[-1]
        return {"memory_rate": r, "throttled_rate": r, "throttle_at": None, "dirty_at_throttle": None}
    first = rates[: max(1, len(rates) // 10)]
    mem_rate = float(np.median(first))
    final = float(np.median(rates[-max(1, len(rates) // 4):]))
    cut = (mem_rate + final) / 2
    at = None
    if final < 0.8 * mem_rate:
        for k in range(len(rates) - 3):
            if (rates[k: k + 4] < cut).all():
                at = k
                break
    throttle_at = None if at is None else at * per * piece
    d_at = None
    if at is not None and dirty:
        d_at = min(dirty, key=lambda bd: abs(bd[0] - throttle_at))[1]
    return {"memory_rate": mem_rate, "throttled_rate": final, "throttle_at": throttle_at,
            "dirty_at_throttle": d_at}


def read_back(fd: int, size: int, nbytes: int, piece: int) -> float:
    """The rate of reading the file's last ``nbytes`` (cached, clean after fsync)."""
    nbytes = min(nbytes, size) // piece * piece
    buf = bytearray(piece)
    t0 = time.perf_counter()
    for off in range(size - nbytes, size, piece):
        os.preadv(fd, [buf], off)
    return nbytes / max(time.perf_counter() - t0, 1e-9)


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
    scratch.sweep(a.dir)  # a file a killed run left
    limits = kernel_limits()
    piece = max(4096, int(a.piece * MiB) // 4096 * 4096)
    size = int(a.size * GiB) if a.size else default_size(limits, a.dir)
    size = max(piece * 8, size // piece * piece)
    print(f"# /proc: dirty_limit {limits['dirty_limit'] / GiB:.2f} GiB, dirty_background "
          f"{limits['dirty_background'] / GiB:.2f} GiB, MemTotal {limits['mem_total'] / GiB:.1f} GiB, "
          f"MemAvailable {limits['mem_available'] / GiB:.1f} GiB; writing {size / GiB:.2f} GiB "
          f"in {piece / MiB:g} MiB pieces to {a.dir}", flush=True)
    with scratch.terminate_raises():
        path, fd = scratch.make_file(a.dir, "kvsim-pagecache", ".bin")
        try:
            ends, dirty = write_file(fd, size, piece)
            t0 = time.perf_counter()
            os.fsync(fd)
            fsync_s = time.perf_counter() - t0
            dirty_left = dirty[-1][1] if dirty else 0
            read_rate = read_back(fd, size, int(a.read * GiB), piece)
        finally:
            os.close(fd)
            scratch.remove(path)
    ph = phases(ends, piece, dirty)
    measured_limit = ph["dirty_at_throttle"] or ph["throttle_at"]
    keys = {"rate": ph["memory_rate"],
            "dirty_limit": int(measured_limit or limits["dirty_limit"]),
            "dirty_background": int(min(limits["dirty_background"], measured_limit or limits["dirty_limit"])),
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
