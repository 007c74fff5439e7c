"""``build_hw_backend``: the hw backend and its real-time runtime for one replay.

Called by ``kvsim.run`` (its BACKENDS registry) as ``build_hw_backend(prep, mgr, **options)``
and returns ``(runtime, backend)``. Tier sizes are the core's reserved slot ranges; the
copy-path rule and the link figures come from the run's hardware profile, so the hw
backend decides exactly as the sim backend does for the same config.

Options (all optional; each error names the option):
- ``time_scale``: sim seconds per wall second (> 0). Compute (a busy kernel, or a sleep in
  CPU mode) runs ``duration / time_scale`` of wall time; transfers move real bytes and so
  take their real time, which the clock sees multiplied by ``time_scale``: above 1 the
  links look ``time_scale`` times slower relative to compute. Use 1 to compare timings.
- ``device``: ``auto`` (the GPU if CuPy finds one, else CPU mode), ``cpu`` or ``gpu``.
- ``disk_dir``: where the disk tier's file goes; default the config's disk path, else a
  private temporary directory (removed on close).
- ``disk_preallocate``: ``True``/``False``/``None`` (default: preallocate when the
  directory has room for the whole tier, else a sparse file whose writes fail with ENOSPC
  once the disk is full: the transfer fails and the engine's plan rolls back).
- ``timing_log``: a list to append per-batch timing records to.
- anything else is passed to ``HwBackend`` (``compute_graphs``, ``staging_bytes``...).
  The copy path and the SM kernel's CTAs are the config's (``engine.copy_path``,
  ``engine.sm_ctas``); the I/O threads and piece size the profile's (``nvme``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

from kvsim.core.spec import Level

from .backend import HwBackend
from .runtime import RealtimeRuntime

DEVICES = ("auto", "cpu", "gpu")


def build_hw_backend(prep, mgr, *, time_scale: float = 1.0, device: str = "auto",
                     disk_dir: str | None = None, disk_preallocate: bool | None = None,
                     timing_log: list | None = None, **options):
    """(RealtimeRuntime, HwBackend) for the prepared run ``prep`` and tier manager ``mgr``."""
    try:
        time_scale = float(time_scale)
    except (TypeError, ValueError):
        raise ValueError(f"time_scale: got {time_scale!r}; expected a number > 0") from None
    if not time_scale > 0:
        raise ValueError(f"time_scale: got {time_scale!r}; expected sim seconds per wall second > 0")
    if device not in DEVICES:
        raise ValueError(f"device: got {device!r}; expected one of {', '.join(DEVICES)}")
    slots = {Level(t.level): int(t.max_slots) for t in mgr.tiers}
    page = int(mgr.page_bytes)
    tmp = None
    if Level.DISK in slots:
        disk_dir = disk_dir or prep.disk_dir
        if disk_dir is None:
            tmp = tempfile.mkdtemp(prefix="kvsim-hw-disk-")
            disk_dir = tmp
        disk_dir = os.path.expanduser(str(disk_dir))
        if disk_preallocate is None:
            need = slots[Level.DISK] * page
            try:
                disk_preallocate = shutil.disk_usage(disk_dir).free > need + (1 << 30)
            except OSError:
                disk_preallocate = True  # let DiskStore report the bad directory
    rt = RealtimeRuntime(time_scale=time_scale)
    try:
        be = HwBackend(rt, page, slots, disk_dir=disk_dir, device=device,
                       refcheck=prep.cfg.engine.refcheck, profile=prep.profile,
                       copy_path=prep.cfg.engine.copy_path.model_dump(), sm_ctas=prep.cfg.engine.sm_ctas,
                       disk_preallocate=bool(disk_preallocate), timing_log=timing_log, **options)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if tmp is not None:
        weakref.finalize(be, shutil.rmtree, tmp, True)
        be.info["disk_dir"] = tmp
    be.info["time_scale"] = time_scale
    be.info["disk_preallocated"] = bool(disk_preallocate) if Level.DISK in slots else None
    return rt, be
