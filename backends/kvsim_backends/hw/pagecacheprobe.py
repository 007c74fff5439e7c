"""The host's page cache in front of a file, measured on this machine (Linux: it reads
``/proc``): what ``benchmarks/page_cache.py`` prints and ``kvsim calibrate`` fits
(``kvsim.tools.fitpagecache``) into the profile's ``page_cache`` section.

- ``kernel_limits``: the kernel's dirty limits in bytes (a ``*_bytes`` key wins over its
  ratio, as in the kernel; a ratio applies to MemAvailable, an estimate of the kernel's
  dirtyable memory), the expiry, MemTotal and MemAvailable.
- ``run_probe``: one scratch file (``kvsim.scratch``, removed on every exit the process
  sees) written with buffered pwrite in pieces, one thread, each piece timed and ``Dirty:``
  sampled every 64 MiB; then ``fsync`` (the write-back of what was still dirty); then the
  file's last bytes read back (clean, cached).
- ``phases``: from the pieces' times, the memory-speed rate, where the throttle starts (the
  first 64 MiB window slower than halfway between the memory rate and the final rate, with
  the next three as slow; only when the final rate is below 0.8 x the memory rate) and the
  throttled rate (the last quarter's).
- ``measure_for_calibrate``: the bounded run ``kvsim calibrate`` makes, or why it made none.

Invariant: the scratch file is gone when ``run_probe`` returns or raises.
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np

from kvsim import scratch

GiB, MiB = 1 << 30, 1 << 20
WINDOW = 64 * MiB
#: file systems whose pages are never dirty in the kernel's sense (no write-back)
NO_WRITEBACK = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})


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


def fs_type(folder: str) -> str | None:
    """The file system type of the mount that holds ``folder`` (``/proc/mounts``'s longest
    mount point above it), None where it cannot be told."""
    real = os.path.realpath(folder)
    best, kind = "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mnt = parts[1].replace("\\040", " ")
                inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) >= len(best):
                    best, kind = mnt, parts[2]
    except OSError:
        return None
    return kind


def probe_size(limits: dict, folder: str, cap: int, floor: int = 0) -> int:
    """Bytes to write: the kernel's dirty limit plus a quarter (at least ``floor``), at most
    ``cap`` and half the folder's free space, in whole MiB."""
    free = shutil.disk_usage(folder).free
    want = max(floor, limits["dirty_limit"] * 5 // 4)
    return int(min(want, cap, free // 2)) // MiB * MiB


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
        r = float(len(ends) * piece / ends[-1])
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
    if throttle_at is not None and dirty:
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


def run_probe(folder: str, size: int, piece: int, read_bytes: int) -> dict:
    """Write ``size`` bytes in ``piece``-byte pwrites to a scratch file in ``folder``, fsync,
    read the last ``read_bytes`` back; the file is removed on every exit (SIGTERM included).
    Returns ``ends`` (each piece's end, s), ``dirty`` (samples), ``fsync_s``, ``dirty_left``
    (Dirty at the last sample) and ``read_rate``."""
    scratch.sweep(folder)  # a file a killed run left
    with scratch.terminate_raises():
        path, fd = scratch.make_file(folder, "kvsim-pagecache", ".bin")
        try:
            ends, dirty = write_file(fd, size, piece)
            t0 = time.perf_counter()
            os.fsync(fd)
            fsync_s = time.perf_counter() - t0
            read_rate = read_back(fd, size, read_bytes, piece)
        finally:
            os.close(fd)
            scratch.remove(path)
    return {"ends": ends, "dirty": dirty, "fsync_s": fsync_s,
            "dirty_left": dirty[-1][1] if dirty else 0, "read_rate": read_rate}


def measure_for_calibrate(folder: str, cap: int, piece: int, read_bytes: int = GiB) -> dict:
    """``kvsim calibrate``'s page-cache measurement in ``folder``: at most ``cap`` bytes
    (``probe_size``), or ``skipped`` with the reason (not Linux, a folder without
    write-back, too little to write). Plain data for the report: the kernel's limits, the
    phases, the fsync and the cached read, the size and why it is that size."""
    if not os.path.exists("/proc/meminfo"):
        return {"skipped": "needs Linux's /proc"}
    kind = fs_type(folder)
    if kind in NO_WRITEBACK:
        return {"skipped": f"the folder {folder} is on {kind}, which has no write-back", "folder": folder}
    limits = kernel_limits()
    size = probe_size(limits, folder, cap)
    size = size // piece * piece
    bound = ("the kernel's dirty limit x 1.25" if size >= (limits["dirty_limit"] * 5 // 4) // MiB * MiB
             else f"the cap, {cap / MiB:.0f} MiB" if size >= cap // MiB * MiB // piece * piece
             else "half the folder's free space")
    out: dict = {"folder": folder, "fs": kind, "limits": limits, "cap": cap, "piece": piece,
                 "size": size, "size_bound": bound}
    if size < 8 * piece:
        out["skipped"] = f"{size} bytes to write ({bound}): under 8 pieces of {piece}"
        return out
    t0 = time.perf_counter()
    run = run_probe(folder, size, piece, read_bytes)
    out.update({"phases": phases(run["ends"], piece, run["dirty"]), "fsync_s": run["fsync_s"],
                "dirty_left": run["dirty_left"], "read_rate": run["read_rate"],
                "write_s": float(run["ends"][-1]), "seconds": time.perf_counter() - t0})
    return out
