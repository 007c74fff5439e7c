"""Pinned host memory the driver allocates unit by unit into one reserved range (the
``cumem`` host-fill backing), through the driver's virtual memory management API
(cuda-bindings' ``cuda.bindings.driver``).

``HostUnits`` reserves a device-and-host address range once (``cuMemAddressReserve``; its
base never moves), then ``commit`` makes a span of it resident: ``cuMemCreate`` of pinned
host memory on a host NUMA node (node 0 where none is named), ``cuMemMap``
at its place in the range and ``cuMemSetAccess`` for the GPU and the CPU. Under unified
addressing the range's address is the same for the CPU and the GPU. The driver zeroes
what it allocates, so nothing is faulted in by the caller.

Commits are whole allocation granules (``granularity``: the driver's minimum for such an
allocation); the caller lays its units out so that each starts on a granule and holds
whole slots, so a slot never straddles two allocations. Reading or writing a part of the
range not yet committed faults the process: callers touch only committed spans.

Invariants: spans are committed in ascending, gap-free order from offset 0; ``close``
unmaps and releases every committed span, then frees the reservation, and is idempotent.
"""

from __future__ import annotations

import threading


def _round_up(n: int, g: int) -> int:
    return -(-n // g) * g


class HostUnits:
    """A reserved range of at least ``nbytes`` for pinned host memory, committed by
    ``commit`` (on any thread; ``device``: the GPU that maps it; ``node``: the host NUMA
    node to allocate on, None: node 0)."""

    def __init__(self, nbytes: int, device: int, node: int | None = None):
        from cuda.bindings import driver  # noqa: PLC0415 (GPU only; an optional package)

        self._d = driver
        self.device = int(device)
        self.node = node
        self._lock = threading.Lock()
        self._maps: list[tuple[int, int, object]] = []  # (address, bytes, handle)
        self.base = 0
        self.committed = 0  # bytes from base that are mapped
        self._check(driver.cuInit(0), "cuInit")
        self._ensure_context()
        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
        prop.location.id = 0 if node is None else int(node)
        self._prop = prop
        self.granularity = int(self._check(driver.cuMemGetAllocationGranularity(
            prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity"))
        self.reserved = _round_up(max(1, int(nbytes)), self.granularity)
        self.base = int(self._check(driver.cuMemAddressReserve(self.reserved, 0, 0, 0),
                                    "cuMemAddressReserve"))
        access = []
        for kind, ident in ((driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, self.device),
                            (driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA, 0)):
            a = driver.CUmemAccessDesc()
            a.location.type = kind
            a.location.id = ident
            a.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            access.append(a)
        self._access = access

    def _check(self, result, what: str):
        """The value of a cuda-bindings call's ``(err, value...)`` result; RuntimeError
        naming the call and the driver's error where ``err`` is not success."""
        err, rest = result[0], result[1:]
        if int(err) != 0:
            name = self._d.cuGetErrorName(err)
            label = name[1].decode() if int(name[0]) == 0 and name[1] else str(int(err))
            raise RuntimeError(f"{what} failed: {label}")
        return rest[0] if len(rest) == 1 else rest

    def _ensure_context(self) -> None:
        """Make the device's primary context current on this thread (the runtime's)."""
        d = self._d
        ctx = self._check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            dev = self._check(d.cuDeviceGet(self.device), "cuDeviceGet")
            ctx = self._check(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            self._check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def commit(self, upto: int) -> None:
        """Make the range resident from what is committed up to byte ``upto`` (rounded up
        to a granule, at most the reservation); one allocation per call."""
        d = self._d
        with self._lock:
            end = min(self.reserved, _round_up(int(upto), self.granularity))
            n = end - self.committed
            if n <= 0:
                return
            self._ensure_context()
            addr = self.base + self.committed
            handle = self._check(d.cuMemCreate(n, self._prop, 0), "cuMemCreate")
            try:
                self._check(d.cuMemMap(addr, n, 0, handle, 0), "cuMemMap")
            except BaseException:
                d.cuMemRelease(handle)
                raise
            self._maps.append((addr, n, handle))
            self.committed = end
            self._check(d.cuMemSetAccess(addr, n, self._access, len(self._access)), "cuMemSetAccess")

    def close(self) -> None:
        d = self._d
        with self._lock:
            maps, self._maps = self._maps, []
            for addr, n, handle in reversed(maps):
                d.cuMemUnmap(addr, n)
                d.cuMemRelease(handle)
            self.committed = 0
            base, self.base = self.base, 0
            if base:
                d.cuMemAddressFree(base, self.reserved)
