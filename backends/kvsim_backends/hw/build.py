"""``build_hw_backend``: the hw backend and its real-time runtime for one replay.

Called by ``kvsim.run.pipeline`` (its BACKENDS registry) as ``build_hw_backend(settings)``
with the run's ``kvsim.settings.BackendSettings``, and returns ``(runtime, backend)``.
Tier sizes are the core's reserved slot ranges; the copy-path rule and the link figures
come from the settings' hardware profile, so the hw backend decides exactly as the sim
backend does for the same config.

What the hw backend's own options (``settings.hw``) do:
- ``time_scale``: sim seconds per wall second. Compute (the stand-in, or a sleep in CPU
  mode) runs ``duration / time_scale`` of wall time; transfers move real bytes and so take
  their real time, which the clock sees multiplied by ``time_scale``: above 1 the links
  look ``time_scale`` times slower relative to compute. Use 1 to compare timings.
- ``device``: ``auto`` (the GPU if CuPy finds one, else CPU mode), ``cpu`` or ``gpu``.
- ``check_capacity``: refuse tiers larger than what the machine can give
  (``resources.check_capacity``, the compute stand-in's device memory kept free beside the
  GPU tier) before anything is allocated.
- ``compute_standin``: each step's work runs as the compute stand-in (``standin``), else
  as the busy kernel.
The disk tier's folder is ``settings.disk.dir`` (the config's disk path, or a caller's),
else the temporary directory (``tempfile.gettempdir()``, i.e. $TMPDIR or /tmp); with
``settings.disk.preallocate`` False it is a sparse file whose writes fail with ENOSPC
once the disk is full (the transfer fails and the engine's plan rolls back); only then
may the tier exceed the folder's free space.

Leftovers: the disk tier's file is a scratch path (``kvsim.scratch``) named after its owner
and removed by ``close()`` (and at interpreter exit). Before creating it, the folder it goes
in is swept: files a SIGKILLed or OOM-killed run left there go, a live run's and anything
kvsim did not create stay.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

from kvsim import scratch
from kvsim.core.spec import Level
from kvsim.settings import BackendSettings

from .backend import HwBackend
from .gpu import load_cupy
from .resources import Tier, check_capacity as _check_capacity
from .runtime import RealtimeRuntime
from .standin import standin_bytes


def build_hw_backend(settings: BackendSettings, runtime: RealtimeRuntime | None = None):
    """(RealtimeRuntime, HwBackend) for ``settings``, on ``runtime`` (the node's; a new one
    when None)."""
    slots, page, hw = settings.slots, settings.page_bytes, settings.hw
    disk = settings.disk
    if Level.DISK in slots:
        where = os.path.expanduser(str(disk.dir or tempfile.gettempdir()))
        scratch.sweep(where)  # what killed runs left (their space counts as free below)
        settings = dataclasses.replace(settings, disk=dataclasses.replace(disk, dir=where))
        disk = settings.disk
    cp = load_cupy() if hw.device != "cpu" else None
    if hw.device == "gpu" and cp is None:  # (as HwBackend says it), before sizes are checked
        raise RuntimeError("device: 'gpu' was asked for but CuPy or a CUDA GPU is not available")
    seen = None
    if hw.check_capacity:
        tiers = [Tier(lv, n * page, settings.key(lv)) for lv, n in slots.items()
                 if lv != Level.DISK or disk.preallocate]
        extra = 0
        if cp is not None and hw.compute_standin:
            l2 = int(cp.cuda.Device().attributes.get("L2CacheSize", 0))
            extra = standin_bytes(settings.model, l2)
        seen = _check_capacity(tiers, on_gpu=cp is not None,
                               disk_dir=disk.dir if disk is not None else None,
                               cuda=cp.cuda.runtime if cp is not None else None, device_extra=extra)
    rt = runtime if runtime is not None else RealtimeRuntime(time_scale=hw.time_scale)
    be = HwBackend(rt, settings)
    if Level.DISK in slots:
        be.info["disk_dir"] = disk.dir
    be.info["time_scale"] = hw.time_scale
    be.info["disk_preallocated"] = disk.preallocate if Level.DISK in slots else None
    if seen is not None:
        be.info["capacity"] = seen
    return rt, be
