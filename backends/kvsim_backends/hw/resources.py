"""What the machine can give the hw backend's tiers, checked before anything is allocated.

``check_capacity`` compares each tier with what it will occupy and refuses the whole
backend, naming every tier that does not fit, its config key, its size and what is
available (``kvsim.backend.CapacityError``, a ValueError, which the CLI reports as bad
input, exit code 2). It only reads figures; it allocates nothing.

Where each tier lives and what it is checked against:
- GPU tier on a GPU: device memory. Free device memory (``cudaMemGetInfo``) less
  ``DEVICE_HEADROOM`` (CuPy's pools, the kernels, the check arrays).
- HOST tier, and in CPU mode the GPU tier too (a mapping that stands in for device
  memory): host memory. Their sum against ``MemAvailable`` (``/proc/meminfo``) less a
  headroom of ``HOST_HEADROOM_FRACTION`` of it, at least ``HOST_HEADROOM_MIN`` (kvsim
  itself: the trace, staging buffers, numpy temporaries; and the rest of the system).
  The CPU-mode mappings are committed page by page as they are written, so they start
  small and grow to their size: the check is on the size they may reach.
- DISK tier: the free space of the folder its file goes in, less ``DISK_HEADROOM``. A
  folder on a RAM file system (tmpfs, ramfs) holds the file in host memory: the tier is
  then counted in host memory as well.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from kvsim.backend import CapacityError
from kvsim.core.spec import Level

GIB = 1 << 30
DEVICE_HEADROOM = GIB           # device memory kept free beside the GPU tier
HOST_HEADROOM_FRACTION = 0.10   # host memory kept free: this share of MemAvailable,
HOST_HEADROOM_MIN = GIB         # and at least this much
DISK_HEADROOM = GIB             # disk space kept free beside the tier's file
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})

__all__ = ["CapacityError", "Tier", "check_capacity", "fmt_bytes"]


@dataclass(frozen=True)
class Tier:
    level: Level
    nbytes: int   # what the backend allocates for it (its reserved slots x page bytes)
    key: str      # the config key that sets its size, e.g. ``cache.tiers[1].quota``

    @property
    def label(self) -> str:
        return f"{self.level.name.lower()} tier"


def fmt_bytes(n: float) -> str:
    """``1.0 TiB``, ``22.3 GiB``, ``512.0 MiB``, ``4.0 KiB``, ``100 B``."""
    for unit, size in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30),
                       ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def host_available(meminfo: str = "/proc/meminfo") -> int | None:
    """Bytes of host memory available to a new allocation without swapping
    (``MemAvailable``); None where the platform does not tell it."""
    try:
        with open(meminfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    parts = line.split()
                    return int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_free(cuda) -> int | None:
    """Free bytes of the current device (``cuda``: ``cupy.cuda.runtime``)."""
    try:
        return int(cuda.memGetInfo()[0])
    except Exception:
        return None


def disk_free(path: str) -> int | None:
    try:
        return int(shutil.disk_usage(path).free)
    except OSError:
        return None  # a missing or unreadable folder: the disk tier reports it by name


def filesystem_type(path: str, mounts: str = "/proc/self/mounts") -> str | None:
    """The type of the file system ``path`` lives on (Linux), None if unknown."""
    try:
        real = os.path.realpath(path)
        with open(mounts, encoding="utf-8", errors="replace") as f:
            rows = [line.split() for line in f]
    except OSError:
        return None
    best, kind = "", None
    for row in rows:
        if len(row) < 3:
            continue
        point = row[1].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, row[2]
    return kind


def _headroom_host(avail: int) -> int:
    return max(HOST_HEADROOM_MIN, int(avail * HOST_HEADROOM_FRACTION))


def _sum(tiers: list[Tier], why: dict[Level, str] | None = None) -> tuple[str, str]:
    """(the tiers' keys, their sizes): ``a + b``, ``x (gpu tier) + y (host tier) = z``."""
    why = why or {}
    keys = " + ".join(t.key for t in tiers)
    parts = " + ".join(f"{fmt_bytes(t.nbytes)} ({t.label}{why.get(t.level, '')})" for t in tiers)
    if len(tiers) > 1:
        parts += f" = {fmt_bytes(sum(t.nbytes for t in tiers))}"
    return keys, parts


def check_capacity(tiers: list[Tier], on_gpu: bool, disk_dir: str | None = None, cuda=None,
                   device_extra: int = 0) -> dict:
    """Refuse (``CapacityError``) if a tier exceeds what the machine can give; else a dict
    of the figures checked (bytes), for the run's record. ``disk_dir``: the folder the disk
    tier's file goes in; ``cuda``: ``cupy.cuda.runtime`` on a GPU; ``device_extra``: device
    bytes the backend allocates beside the GPU tier (the compute stand-in's), kept free
    with the headroom. A figure the platform does not give (no /proc/meminfo) is not
    checked."""
    problems: list[str] = []
    seen: dict = {}
    ram: list[Tier] = []
    why: dict[Level, str] = {}
    for t in tiers:
        if t.level == Level.GPU and on_gpu:
            free = device_free(cuda) if cuda is not None else None
            seen["device_free_bytes"] = free
            keep = DEVICE_HEADROOM + device_extra
            if free is not None and t.nbytes > free - keep:
                extra = f" and {fmt_bytes(device_extra)} of compute stand-in" if device_extra else ""
                problems.append(
                    f"{t.key}: {fmt_bytes(t.nbytes)} ({t.label}) exceeds the "
                    f"{fmt_bytes(max(0, free - keep))} of device memory it may use "
                    f"({fmt_bytes(free)} free less {fmt_bytes(DEVICE_HEADROOM)} kept free{extra})")
        elif t.level == Level.DISK:
            if disk_dir is None:
                continue
            where = f"{t.key.rsplit('.', 1)[0]}.path: {disk_dir}"  # (the folder's own key)
            if not os.path.isdir(disk_dir):
                problems.append(f"{where}: no such folder; expected the folder the disk tier's "
                                "file is made in")
                continue
            if not os.access(disk_dir, os.W_OK | os.X_OK):
                problems.append(f"{where}: this user cannot make a file there; expected a "
                                "writable folder")
                continue
            free = disk_free(disk_dir)
            seen["disk_free_bytes"] = free
            kind = filesystem_type(disk_dir)
            if kind in RAM_FILESYSTEMS:
                ram.append(t)
                why[t.level] = f", a file on {kind} at {disk_dir}"
            if free is not None and t.nbytes > free - DISK_HEADROOM:
                problems.append(
                    f"{t.key}: {fmt_bytes(t.nbytes)} ({t.label}) exceeds the "
                    f"{fmt_bytes(max(0, free - DISK_HEADROOM))} of disk space it may use in "
                    f"{disk_dir} ({fmt_bytes(free)} free less {fmt_bytes(DISK_HEADROOM)} kept free)")
        else:  # the host tier; the GPU tier in CPU mode
            ram.append(t)
            if t.level == Level.GPU:
                why[t.level] = ", in host memory in CPU mode"
    if ram:
        avail = host_available()
        seen["host_available_bytes"] = avail
        room = _headroom_host(avail) if avail is not None else 0
        if avail is not None and sum(t.nbytes for t in ram) > avail - room:
            # each tier too large alone, by its name; else all of them, as a sum
            alone = [t for t in ram if t.nbytes > avail - room]
            for group in ([[t] for t in alone] or [ram]):
                keys, parts = _sum(group, why)
                problems.append(
                    f"{keys}: {parts} {'exceed' if len(group) > 1 else 'exceeds'} the "
                    f"{fmt_bytes(max(0, avail - room))} of host memory the tiers may use "
                    f"({fmt_bytes(avail)} available less {fmt_bytes(room)} kept free: "
                    f"{HOST_HEADROOM_FRACTION:.0%} of it, at least {fmt_bytes(HOST_HEADROOM_MIN)})")
    if problems:
        sized = any(".quota" in x for x in problems)  # (a missing folder is no size to lower)
        raise CapacityError("; ".join(problems) + "; nothing was allocated" + (
            ": lower the quota (--set KEY=SIZE) or free the memory or space" if sized else ""))
    return seen
