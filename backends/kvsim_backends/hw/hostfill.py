"""The hw backend's host tier, made resident unit by unit by a worker thread.

``HostFill`` reserves the tier's whole range once (its base address never moves) and a
worker thread commits it in units (``kvsim.core.datapath.fill.FillLayout``: whole slots, at
most 512 MiB), publishing a watermark: how many slots exist. Backings
(``kvsim.core.datapath.fill.Backing``):

- ``register``: an anonymous mapping of the whole range (MAP_NORESERVE); each unit is
  faulted in (``madvise(MADV_POPULATE_WRITE)``, else a write to every page) and, on a
  GPU, registered (``cudaHostRegister``, portable + mapped). Progressive.
- ``pinned``: the driver allocates pinned memory (``cudaHostAlloc``, portable + mapped)
  for the whole range in one call: the range becomes usable at once. CPU mode: an
  anonymous mapping faulted in whole.
- ``cumem``: the driver allocates each unit's pinned memory (``cuMemCreate`` on the
  chosen NUMA node) and maps it into a range reserved once (``cuMemAddressReserve``;
  ``backends.hw.cumem``); units are also whole allocation granules. Progressive, like
  ``register``, through the driver's allocation path. CPU mode: as ``register`` without
  the registration.

``prefault=False`` (CPU mode only; a GPU registers every page anyway) commits units
without touching them: the mapping then grows as slots are written, as the hw backend's
CPU mode always did for a tier without a fill.

Huge pages (``huge_pages``, register only): ``MADV_HUGEPAGE`` on the range where the
kernel has transparent huge pages; off by default (``MADV_NOHUGEPAGE``: fill rate with
huge pages depends on how fragmented free memory is). NUMA (``numa``): ``auto`` places
the range on the GPU's node (``mbind`` MPOL_PREFERRED) and binds the worker to that
node's CPUs, where the machine has more than one node; an int names a node; ``off``
leaves placement to the kernel. What was applied is in ``info``.

Invariants: the watermark only grows, and every slot below it is resident (and
registered on a GPU); the worker is the only writer of it; waiters never see a slot that
is not resident. A worker that fails stops where it is: slots below the committed prefix
stay usable, ``error`` says why, ``failed`` is set and waiters for slots beyond the
prefix are told no. ``close`` stops and joins the worker, then unregisters and unmaps,
and is idempotent.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import threading
import time

import numpy as np

from kvsim.core.datapath.fill import Backing, layout_for

from .memory import HOST_REGISTER_MAPPED, HOST_REGISTER_PORTABLE, lazy_mmap, device_pointer

MADV_HUGEPAGE = 14
MADV_NOHUGEPAGE = 15
MADV_POPULATE_WRITE = 23  # Linux 5.14
MPOL_PREFERRED = 1
_SYS_MBIND = {"x86_64": 237, "aarch64": 235}
_PAGE = mmap.PAGESIZE


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def thp_mode(path: str = "/sys/kernel/mm/transparent_hugepage/enabled") -> str | None:
    """The kernel's transparent-huge-page mode (``always``, ``madvise``, ``never``), None
    where it has none."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def numa_nodes(root: str = "/sys/devices/system/node") -> list[int]:
    try:
        return sorted(int(d[4:]) for d in os.listdir(root) if d.startswith("node") and d[4:].isdigit())
    except OSError:
        return []


def node_cpus(node: int, root: str = "/sys/devices/system/node") -> set[int]:
    """The CPUs of NUMA node ``node`` (its ``cpulist``), empty if unknown."""
    try:
        with open(f"{root}/node{node}/cpulist", encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return set()
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def gpu_node(cuda) -> int | None:
    """The NUMA node the current GPU attaches to (sysfs of its PCI device), None if unknown."""
    try:
        bus = cuda.deviceGetPCIBusId(cuda.getDevice())
        bus = bus.decode() if isinstance(bus, bytes) else str(bus)
        with open(f"/sys/bus/pci/devices/{bus.lower()}/numa_node", encoding="ascii") as f:
            node = int(f.read().strip())
        return node if node >= 0 else None
    except Exception:
        return None


class HostFill:
    """The host tier: ``slots`` slots of ``slot_bytes``, committed unit by unit on a worker
    thread (``start``) in the layout of ``kvsim.core.datapath.fill.layout_for`` (units of
    ``unit_bytes``; with ``cumem`` on a GPU, also whole allocation granules of the
    driver's). ``cuda``: ``cupy.cuda.runtime`` on a GPU, None in
    CPU mode. ``prefault``: see the module docstring. ``fail_at_unit``: a test hook,
    the worker fails instead of committing that unit. ``unit_delay_s``: a test hook, the
    worker sleeps this long before each unit."""

    def __init__(self, slot_bytes: int, slots: int, unit_bytes: int, backing: Backing | str,
                 cuda=None, *,
                 huge_pages: bool = False, numa: str | int = "auto", prefault: bool = True,
                 fail_at_unit: int | None = None, unit_delay_s: float = 0.0,
                 register_chunk: int | None = None, turns=None):
        self.backing = Backing(backing)
        self._unit_bytes = unit_bytes
        # register: each unit in calls of at most ``register_chunk`` bytes (whole slots),
        # each call taken in turn with the node's other fills (``turns``: a lock the
        # node's fills share, threads' or processes'), so that a driver call of any rank
        # waits for one short registration at most, never for a queue of whole units
        self._chunk = (None if not register_chunk else
                       max(slot_bytes, register_chunk // slot_bytes * slot_bytes))
        self._turns = turns
        self.layout = layout = layout_for(self.backing, slot_bytes, slots, unit_bytes)
        self.slots = layout.slots
        self.page_bytes = layout.slot_bytes
        self.nbytes = layout.nbytes
        self._cuda = cuda
        self._device = cuda.getDevice() if cuda is not None else None
        self._prefault = bool(prefault or cuda is not None)
        self._fail_at = fail_at_unit
        self._delay = float(unit_delay_s)
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._registered: list[int] = []
        self._waiters: list[tuple[int, object]] = []  # (slots, callback) told by the worker
        self._pinned_ptr: int | None = None
        self._units = None  # cumem on a GPU: the driver's HostUnits
        self._mm = None
        self.watermark = 0      # slots that exist (written by the worker only)
        self.units_done = 0
        self.failed = False
        self.done = False       # the worker has finished (all committed, failed or stopped)
        self.error: str | None = None
        self.dev_ptr: int | None = None
        self.flat = self.view = None
        self.ptr = 0
        self.t_start = self.t_first = self.t_full = None  # perf_counter times
        self.register_s = 0.0   # seconds inside cudaHostRegister (the driver's lock held)
        self.info: dict = {"backing": self.backing.value, "unit_bytes": layout.unit_bytes,
                           "units": layout.units}
        self._node_cpus: set[int] = set()
        try:
            driver_units = self.backing is Backing.CUMEM and cuda is not None
            if self.backing is Backing.REGISTER or (self.backing is Backing.CUMEM and cuda is None):
                self._mm = lazy_mmap(self.nbytes)
                self._set_views(np.frombuffer(self._mm, dtype=np.uint8)[: self.nbytes])
                self._advise_huge_pages(bool(huge_pages) and self.backing is Backing.REGISTER)
            else:
                self.info["huge_pages"] = "n/a (driver allocation)" if huge_pages else False
            node = self._place(numa)
            if driver_units:
                self._reserve_units(node)
        except BaseException:
            self.close()
            raise

    def _reserve_units(self, node: int | None) -> None:
        """cumem on a GPU: reserve the range with the driver and lay units out on its
        allocation granules (whole slots each)."""
        from .cumem import HostUnits  # noqa: PLC0415 (needs cuda-bindings)

        self._units = u = HostUnits(self.nbytes, self._device, node)
        self.layout = layout_for(self.backing, self.page_bytes, self.slots, self._unit_bytes,
                                 u.granularity)
        self.info.update(unit_bytes=self.layout.unit_bytes, units=self.layout.units,
                         granularity=u.granularity, allocated_on_node=0 if node is None else node)
        arr = (ctypes.c_uint8 * self.nbytes).from_address(u.base)  # not touched until committed
        self._set_views(np.frombuffer(arr, dtype=np.uint8))
        self.dev_ptr = u.base  # one address for the CPU and the GPU

    # -- placement ----------------------------------------------------------------
    def _set_views(self, flat: np.ndarray) -> None:
        self.flat = flat
        self.view = flat.reshape(self.slots, self.page_bytes)
        self.ptr = int(flat.ctypes.data)

    def _madvise(self, advice: int) -> bool:
        libc = _libc()
        if libc is None or self._mm is None:
            return False
        return libc.madvise(ctypes.c_void_p(self.ptr), ctypes.c_size_t(self.nbytes), advice) == 0

    def _advise_huge_pages(self, want: bool) -> None:
        mode = thp_mode()
        if want and mode in ("always", "madvise"):
            self.info["huge_pages"] = self._madvise(MADV_HUGEPAGE)
        else:
            if mode is not None:
                self._madvise(MADV_NOHUGEPAGE)  # off unless asked for, whatever the default
            self.info["huge_pages"] = False
        self.info["thp_mode"] = mode

    def _place(self, numa) -> int | None:
        """Apply ``numa``; the node the tier goes on (None: the kernel's choice)."""
        nodes = numa_nodes()
        self.info["numa_nodes"] = len(nodes)
        if numa == "off":
            self.info["numa"] = "off"
            return None
        if isinstance(numa, bool) or not (numa == "auto" or isinstance(numa, int)):
            raise ValueError(f"numa: got {numa!r}; expected 'auto', 'off' or a node number")
        node = numa if isinstance(numa, int) else (gpu_node(self._cuda) if self._cuda is not None else None)
        if isinstance(numa, int) and numa not in nodes:
            raise ValueError(f"numa: node {numa} is not one of this machine's nodes {nodes}")
        if node is None or (numa == "auto" and len(nodes) < 2):
            self.info["numa"] = "one node" if len(nodes) < 2 else "GPU's node unknown"
            return None
        self._node_cpus = node_cpus(node) & set(os.sched_getaffinity(0))
        bound = False
        if self._mm is not None:
            bound = self._mbind(node)
        self.info["numa"] = {"node": node, "mbind": bound, "worker_cpus": len(self._node_cpus)}
        return node

    def _mbind(self, node: int) -> bool:
        nr = _SYS_MBIND.get(platform.machine())
        libc = _libc()
        if nr is None or libc is None or node >= 64:
            return False
        mask = ctypes.c_ulong(1 << node)
        return libc.syscall(nr, ctypes.c_void_p(self.ptr), ctypes.c_size_t(self.nbytes), MPOL_PREFERRED,
                            ctypes.byref(mask), ctypes.c_ulong(64), 0) == 0

    # -- the worker ---------------------------------------------------------------
    def start(self) -> "HostFill":
        if self._thread is None:
            self.t_start = time.perf_counter()
            self._thread = threading.Thread(target=self._run, name="kvsim-host-fill", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if self._node_cpus:
                try:
                    os.sched_setaffinity(0, self._node_cpus)  # this thread only
                except OSError:
                    pass
            if self._cuda is not None:
                self._cuda.setDevice(self._device)  # a new thread starts on device 0
            if self.backing is Backing.PINNED:
                self._commit_pinned()
            else:
                for u in range(self.layout.units):
                    if self._stop:
                        return
                    if self._delay:
                        time.sleep(self._delay)
                    if self._fail_at is not None and u >= self._fail_at:
                        raise RuntimeError(f"injected failure of unit {u}")
                    self._commit_unit(u)
        except BaseException as e:  # noqa: BLE001 (reported, never raised into the engine)
            with self._cond:
                self.failed = True
                self.error = (f"host fill stopped after {self.units_done} of {self.layout.units} "
                              f"units ({self.watermark} of {self.slots} slots usable): "
                              f"{type(e).__name__}: {e}")
                self._cond.notify_all()
        finally:
            with self._cond:
                self.done = True
                self._cond.notify_all()
                told, self._waiters = self._waiters, []
            for n, fn in told:  # the rest never come (or were all in: told already)
                fn(self.watermark >= n)

    def _commit_unit(self, u: int) -> None:
        off, n = self.layout.byte_span(u)
        addr = self.ptr + off
        if self._units is not None:  # cumem: the driver allocates, maps and zeroes it
            self._units.commit(off + n)
            self._publish(u + 1)
            return
        if self._prefault:
            self._populate(off, n)
        cuda = self._cuda
        if cuda is not None:
            step = self._chunk or n
            clock = time.perf_counter
            for o in range(0, n, step):
                if self._turns is not None:
                    with self._turns:
                        t0 = clock()
                        cuda.hostRegister(addr + o, min(step, n - o),
                                          HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED)
                        self.register_s += clock() - t0
                else:
                    t0 = clock()
                    cuda.hostRegister(addr + o, min(step, n - o),
                                      HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED)
                    self.register_s += clock() - t0
                self._registered.append(addr + o)
            dev = device_pointer(cuda, addr)
            if u == 0:
                self.dev_ptr = dev
            elif self.dev_ptr is not None and dev != self.dev_ptr + off:
                raise RuntimeError(f"unit {u}'s device address is not contiguous with unit 0's")
        self._publish(u + 1)

    def _populate(self, off: int, n: int) -> None:
        """Fault in ``n`` bytes at ``off``: one madvise (the kernel's prefault, without the
        GIL), else a write to every page."""
        libc = _libc()
        addr = ctypes.c_void_p(self.ptr + off)
        if libc is None or libc.madvise(addr, ctypes.c_size_t(n), MADV_POPULATE_WRITE) != 0:
            self.flat[off: off + n: _PAGE] = 0

    def _commit_pinned(self) -> None:
        cuda = self._cuda
        if cuda is None:  # CPU mode: a mapping faulted in whole
            self._mm = lazy_mmap(self.nbytes)
            self._set_views(np.frombuffer(self._mm, dtype=np.uint8)[: self.nbytes])
            if self._prefault:
                self._populate(0, self.nbytes)
        else:
            ptr = int(cuda.hostAlloc(self.nbytes, HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED))
            self._pinned_ptr = ptr
            arr = (ctypes.c_uint8 * self.nbytes).from_address(ptr)
            self._set_views(np.frombuffer(arr, dtype=np.uint8))
            self.dev_ptr = device_pointer(cuda, ptr)
        self._publish(self.layout.units)

    def _publish(self, units: int) -> None:
        now = time.perf_counter()
        with self._cond:
            self.units_done = units
            self.watermark = self.layout.watermark(units)
            if self.t_first is None:
                self.t_first = now
            if self.watermark >= self.slots:
                self.t_full = now
            self._cond.notify_all()
            w = self.watermark
            told = [x for x in self._waiters if x[0] <= w]
            if told:
                self._waiters = [x for x in self._waiters if x[0] > w]
        for _, fn in told:
            fn(True)

    # -- waiting ------------------------------------------------------------------
    def ready(self, n: int) -> bool | None:
        """True if ``n`` slots exist, False if they never will (the fill failed or was
        stopped below them), None while the worker may still commit them."""
        if self.watermark >= n:
            return True
        return False if self.done else None

    def notify_when(self, n: int, fn) -> None:
        """Call ``fn(True)`` once ``n`` slots exist, ``fn(False)`` if they never will: at
        once if that is known, else from the worker thread (``fn`` must be thread-safe)."""
        with self._cond:
            r = self.ready(n)
            if r is None:
                self._waiters.append((n, fn))
                return
        fn(r)

    def wait(self, n: int, timeout_s: float | None = None) -> bool:
        """Block until ``n`` slots exist (True) or never will (False); False on timeout."""
        with self._cond:
            self._cond.wait_for(lambda: self.watermark >= n or self.done, timeout_s)
            return self.watermark >= n

    @property
    def limit(self) -> int | None:
        """The slots that will ever exist, where the fill failed; None otherwise."""
        return self.watermark if self.failed else None

    def timings(self) -> dict:
        """Seconds from the start to the first unit and to the last (None: not yet), and
        the seconds spent inside ``cudaHostRegister`` (0.0 without one)."""
        t0 = self.t_start
        return {"first_unit_s": None if t0 is None or self.t_first is None else self.t_first - t0,
                "full_s": None if t0 is None or self.t_full is None else self.t_full - t0,
                "register_s": self.register_s}

    def close(self) -> None:
        self._stop = True
        t, self._thread = self._thread, None
        if t is not None:
            t.join()
        cuda = self._cuda
        for p in reversed(self._registered):
            try:
                cuda.hostUnregister(p)
            except Exception:
                pass
        self._registered.clear()
        self.flat = self.view = None
        units, self._units = self._units, None
        if units is not None:
            units.close()
        p, self._pinned_ptr = self._pinned_ptr, None
        if p is not None:
            try:
                cuda.freeHost(p)
            except Exception:
                pass
        mm, self._mm = self._mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a caller still holds a view: the mapping goes with it
                pass
