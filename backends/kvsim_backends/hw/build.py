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
- ``disk_dir``: the folder the disk tier's file goes in; default the config's disk path,
  else the temporary directory (``tempfile.gettempdir()``, i.e. $TMPDIR or /tmp).
- ``disk_preallocate``: ``True``/``False``/``None`` (default: preallocate). ``False``: a
  sparse file whose writes fail with ENOSPC once the disk is full (the transfer fails and
  the engine's plan rolls back); only then may the tier exceed the folder's free space.
- ``check_capacity``: ``True`` (default) refuses tiers larger than what the machine can
  give (``resources.check_capacity``) before anything is allocated.
- ``timing_log``: a list to append per-batch timing records to.
- anything else is passed to ``HwBackend`` (``compute_graphs``, ``staging_bytes``...);
  ``host_fill`` defaults to the config's host tier ``fill`` (``kvsim.config.host_fill``).
  The copy path and the SM kernel's CTAs are the config's (``engine.copy_path``,
  ``engine.sm_ctas``); the piece size the profile's (``nvme.piece``); the disk I/O
  threads the disk tier's ``io_workers`` (prioritised), else the profile's
  ``nvme.queue_depth`` (round robin).

Leftovers: the disk tier's file is a scratch path (``kvsim.scratch``) named after its owner
and removed by ``close()`` (and at interpreter exit). Before creating it, the folder it goes
in is swept: files a SIGKILLed or OOM-killed run left there go, a live run's and anything
kvsim did not create stay.
"""

from __future__ import annotations

import os
import tempfile

from kvsim import scratch
from kvsim.config import host_fill
from kvsim.core.spec import Level

from .backend import HwBackend
from .gpu import load_cupy
from .resources import Tier, check_capacity as _check_capacity
from .runtime import RealtimeRuntime

DEVICES = ("auto", "cpu", "gpu")


def build_hw_backend(prep, mgr, *, time_scale: float = 1.0, device: str = "auto",
                     disk_dir: str | None = None, disk_preallocate: bool | None = None,
                     timing_log: list | None = None, check_capacity: bool = True, **options):
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
    if Level.DISK in slots:
        disk_dir = os.path.expanduser(str(disk_dir or prep.disk_dir or tempfile.gettempdir()))
        scratch.sweep(disk_dir)  # what killed runs left (their space counts as free below)
    if disk_preallocate is None:
        disk_preallocate = True
    cp = load_cupy() if device != "cpu" else None
    if device == "gpu" and cp is None:  # (as HwBackend says it), before sizes are checked
        raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
    seen = None
    if check_capacity:
        tiers = [Tier(lv, n * page, tier_key(prep.cfg, lv)) for lv, n in slots.items()
                 if lv != Level.DISK or disk_preallocate]
        seen = _check_capacity(tiers, on_gpu=cp is not None, disk_dir=disk_dir,
                               cuda=cp.cuda.runtime if cp is not None else None)
    options.setdefault("host_fill", host_fill(prep.cfg).model_dump())
    rt = RealtimeRuntime(time_scale=time_scale)
    be = HwBackend(rt, page, slots, disk_dir=disk_dir, device=device,
                   refcheck=prep.cfg.engine.refcheck, profile=prep.profile,
                   copy_path=prep.cfg.engine.copy_path.model_dump(), sm_ctas=prep.cfg.engine.sm_ctas,
                   kernel_on_coherent_link=prep.cfg.engine.kernel_on_coherent_link,
                   disk_preallocate=bool(disk_preallocate), timing_log=timing_log,
                   disk_io_workers=prep.cfg.cache.disk_io_workers,
                   disk_io_write_share=prep.cfg.cache.disk_io_write_share, **options)
    if Level.DISK in slots:
        be.info["disk_dir"] = disk_dir
    be.info["time_scale"] = time_scale
    be.info["disk_preallocated"] = bool(disk_preallocate) if Level.DISK in slots else None
    if seen is not None:
        be.info["capacity"] = seen
    return rt, be


def tier_key(cfg, level: Level) -> str:
    """The config key that sets the size of the tier at ``level``: ``cache.tiers[i].quota``
    (``.max_quota`` where the config reserves more than its quota)."""
    for i, t in enumerate(cfg.cache.tiers):
        if t.level == level.name.lower():
            return f"cache.tiers[{i}].{'max_quota' if t.max_quota is not None else 'quota'}"
    return f"slots[{level.name}]"
