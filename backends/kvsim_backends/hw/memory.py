"""Memory regions of the hw backend: the GPU tier's arena and pinned host regions.

- ``DeviceArena``: one allocation carved into equal slots (CuPy on a GPU; a numpy array
  standing in for device memory in CPU mode). Zeroed, so an unwritten slot reads as no tag.
- ``HostRegion``: an anonymous mmap (page-aligned, so O_DIRECT can use it) carved into
  slots; on a GPU it is pinned with cudaHostRegister (portable + mapped) in units of whole
  slots of at most ``unit_bytes`` (512 MiB), so no slot straddles two registrations, and
  its device-side address (zero-copy, for the SM kernel) is recorded when the units map
  to one contiguous device range (always, with unified addressing).
- ``StagingPool``: reusable pinned regions for GPU <-> disk transfers.

Invariant: a region's numpy view, pointer and registration live exactly as long as the
region; ``close`` undoes them in reverse order and is idempotent.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

from kvsim.core.datapath.fill import UNIT_BYTES

HOST_REGISTER_PORTABLE = 1
HOST_REGISTER_MAPPED = 2


class DeviceArena:
    """``slots`` slots of ``page_bytes`` in device memory (``xp`` is cupy or numpy)."""

    def __init__(self, xp, slots: int, page_bytes: int):
        self.xp = xp
        self.slots = slots
        self.page_bytes = page_bytes
        self._mm = None
        try:
            if xp is np:  # CPU mode: a lazily committed mapping (only touched slots cost RAM)
                self._mm = lazy_mmap(slots * page_bytes)
                self.flat = np.frombuffer(self._mm, dtype=np.uint8)[: slots * page_bytes]
            else:
                self.flat = xp.zeros(slots * page_bytes, dtype=xp.uint8)
        except Exception as e:  # cupy OutOfMemoryError, numpy MemoryError
            raise MemoryError(f"slots[GPU]: {slots} slots of {page_bytes} bytes "
                              f"({slots * page_bytes} bytes) could not be allocated: {e}") from None
        self.view = self.flat.reshape(slots, page_bytes)

    @property
    def ptr(self) -> int:
        return int(self.flat.data.ptr) if hasattr(self.flat, "device") else int(self.flat.ctypes.data)

    def close(self) -> None:
        self.flat = self.view = None
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass


def lazy_mmap(nbytes: int) -> mmap.mmap:
    """An anonymous private mapping of ``nbytes`` (rounded up to a page), MAP_NORESERVE
    where the platform has it: memory is committed page by page on first touch."""
    size = max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
    noreserve = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | noreserve
    try:
        return mmap.mmap(-1, size, flags=flags)
    except OSError as e:
        raise MemoryError(f"{nbytes} bytes could not be mapped: {e}") from None


class HostRegion:
    """``slots`` slots of ``page_bytes`` in an anonymous mmap, pinned when ``cuda`` is given.

    ``cuda``: the CuPy runtime module (``cupy.cuda.runtime``) or None (CPU mode).
    """

    def __init__(self, slots: int, page_bytes: int, cuda=None, unit_bytes: int = UNIT_BYTES):
        self.slots = slots
        self.page_bytes = page_bytes
        self.nbytes = slots * page_bytes
        self._cuda = cuda
        self._registered: list[int] = []
        self.dev_ptr: int | None = None
        # CPU mode maps lazily (MAP_NORESERVE); on a GPU every page is pinned anyway
        self._mm = lazy_mmap(self.nbytes)
        self.flat = np.frombuffer(self._mm, dtype=np.uint8)[: self.nbytes]
        self.view = self.flat.reshape(slots, page_bytes)
        self.ptr = int(self.flat.ctypes.data)
        if cuda is not None:
            try:
                self._register(unit_bytes)
            except BaseException:
                self.close()
                raise

    def _register(self, unit_bytes: int) -> None:
        cuda = self._cuda
        unit = max(self.page_bytes, (unit_bytes // self.page_bytes) * self.page_bytes)
        flags = HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED
        dev = []
        for off in range(0, self.nbytes, unit):
            n = min(unit, self.nbytes - off)
            cuda.hostRegister(self.ptr + off, n, flags)
            self._registered.append(self.ptr + off)
            dev.append(device_pointer(cuda, self.ptr + off))
        if all(d is not None and d == dev[0] + i * unit for i, d in enumerate(dev)):
            self.dev_ptr = dev[0]

    def close(self) -> None:
        for p in reversed(self._registered):
            try:
                self._cuda.hostUnregister(p)
            except Exception:
                pass
        self._registered.clear()
        self.flat = self.view = None
        mm, self._mm = getattr(self, "_mm", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a caller still holds a view: the mapping goes with it
                pass


def device_pointer(cuda, host_ptr: int) -> int | None:
    """The device address of registered host memory (equal to it under unified addressing)."""
    fn = getattr(cuda, "hostGetDevicePointer", None)
    if fn is not None:
        try:
            return int(fn(host_ptr, 0))
        except Exception:
            pass
    try:
        from cuda.bindings import runtime as cudart  # noqa: PLC0415
        err, dptr = cudart.cudaHostGetDevicePointer(host_ptr, 0)
        if int(err) == 0:
            return int(dptr)
    except Exception:
        pass
    try:
        if cuda.getDeviceProperties(cuda.getDevice())["unifiedAddressing"]:
            return host_ptr
    except Exception:
        pass
    return None


class StagingPool:
    """Pinned (GPU) or plain (CPU mode) host buffers of ``slots`` pages, reused."""

    def __init__(self, slots: int, page_bytes: int, cuda=None):
        self.slots = slots
        self.page_bytes = page_bytes
        self._cuda = cuda
        self._free: list[HostRegion] = []
        self._all: list[HostRegion] = []

    def get(self) -> HostRegion:
        if self._free:
            return self._free.pop()
        r = HostRegion(self.slots, self.page_bytes, self._cuda)
        self._all.append(r)
        return r

    def put(self, region: HostRegion) -> None:
        self._free.append(region)

    def close(self) -> None:
        for r in self._all:
            r.close()
        self._all.clear()
        self._free.clear()
