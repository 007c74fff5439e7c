"""Transfers of the sim backend: one batch's way through the model, step by step, and
what its end writes (bytes, counters, tags, the timing log).

``Transfers`` is the backend's side of a transfer: the profile's per-transfer constants,
the resources a transfer takes (copy engines, call threads, copy-CTA slots, the disk pool,
the fluid) and the counters, tags and logs it updates. ``SimBackend`` is a ``Transfers``
and sets all of them in its constructor; a ``Transfer`` reads them through it (a base
class here, so that this module needs nothing from ``backend``).

Invariants: a transfer takes what its path needs before its bytes flow and gives it all
back before its fixed cost; its bytes, tags and timing-log row are written once, when it
completes (``_finish``, ``_log``), never at submit; a failed transfer writes garbage
(``GARBAGE``) into its destination slots' tags and completes with False.
"""

from __future__ import annotations

from typing import Any, Callable, Final

import simpy

from kvsim.core.datapath.copypath import CopyPath
from kvsim.core.datapath.diskio import io_class
from kvsim.core.datapath.pathcost import PathChooser
from kvsim.core.plan import Batch
from kvsim.core.spec import Level

from .diskpool import DiskJob, SimDiskPool
from .fluid import Fluid
from .pagecache import SimPageCache
from .routes import SM_RES
from .runtime import Clock
from .servers import Units

GARBAGE: Final = 0xDEAD


class Transfers:
    """What a transfer reads and updates on its backend (set by ``SimBackend.__init__``,
    whose comments say what each is)."""

    env: simpy.Environment
    clock: Clock
    fluid: Fluid
    disk_fluid: Fluid
    _split_disk: bool
    _link_bw: dict[str, float]
    _node_res: dict[tuple[Level, Level], tuple[str, ...]]
    refcheck: bool
    paths: dict[str, CopyPath]
    chooser: PathChooser
    _flowing: dict[str, list[int]]
    per_page: dict[str, float]
    busy_per_page: dict[str, float]
    issue_share: dict[str, float]
    ctas: dict[str, int]
    _cta_rate: dict[str, float]
    copy_engines: Units
    call_threads: Units | None
    cta_pool: simpy.Container
    disk_pool: SimDiskPool | None
    page_cache: SimPageCache | None  # the disk tier's writes: buffered (else None)
    _rank: int
    tags: dict[Level, list]
    timing_log: list | None
    on_traffic: Callable[[float, str, int], None] | None
    _bytes: dict[str, int]
    _counts: dict[str, int]
    _disk_written: bytearray | None
    _rewrite_cost: float
    _disk_latency: float
    _ce_per_call: float
    _sm_launch: float
    _busy_start: float
    _fixed: tuple[float, float]
    _lasting: float
    _lasting_after: int
    step_penalty_s: float
    step_penalty_since_s: float | None
    link_leg_s: float
    disk_leg_s: float

    def pick_path(self, d: str, pages: int) -> tuple[CopyPath, int]:
        """(path, SM CTAs) of a host-tier batch of ``pages`` in direction ``d`` now
        (``SimBackend``'s)."""
        raise NotImplementedError

    def _log(self, batch: Batch, link_dir, disk_dir, fail: bool, t0: float,
             link_path: CopyPath | None = None) -> None:
        if link_dir is None or link_path is None:
            path = "disk" if disk_dir else "gpu_copy"
        else:
            path = link_path.value
            if disk_dir:
                path = f"disk+{path}"
        self.timing_log.append({"t_s": t0,  # type: ignore[union-attr]  # only called when set
                                "src": batch.src.name.lower(), "dst": batch.dst.name.lower(),
                                "pages": int(batch.pages), "bytes": int(batch.nbytes), "path": path,
                                "seconds": self.env.now - t0, "ok": not fail})

    def _finish(self, batch: Batch, kinds: tuple[str, ...], fail: bool) -> None:
        nbytes = batch.nbytes
        for k in kinds:
            self._bytes[k] += nbytes
        self._counts["transfers"] += 1
        written = self._disk_written
        dsts: Any = batch.dst_slots  # (Any: as in fill)
        if not fail and written is not None and batch.dst == Level.DISK:
            for d in dsts:
                written[d] = 1
        if self.refcheck:
            dst = self.tags[batch.dst]
            if fail:
                for d in dsts:
                    dst[d] = GARBAGE
            else:  # (read all first: a GPU -> GPU copy reads and writes one list)
                src = self.tags[batch.src]
                srcs: Any = batch.src_slots
                for d, t in zip(dsts, [src[s] for s in srcs]):
                    dst[d] = t
        if fail:
            self._counts["failed_transfers"] += 1
        cb = self.on_traffic
        if cb is not None:
            now = self.clock.now
            for k in kinds:
                cb(now, k, nbytes)


class Transfer:
    """One batch on its way through the model, a step at a time: each step is the callback
    of the event it waited for (a generator process would cost two more events and a
    resume each step, a transfer at a time). The steps read the backend's profile
    constants and update its counters."""

    __slots__ = ("be", "batch", "route", "fail", "t0", "done", "res", "start_s", "cap",
                 "ctas", "ce", "host_s", "path", "drive")

    def __init__(self, be: Transfers, batch: Batch, route, fail: bool):
        self.be = be
        self.batch = batch
        self.route = route
        self.fail = fail
        self.t0 = be.clock.now
        self.done = be.clock.new_event()  # succeeds with True, or False for a failed batch
        self.res: tuple[str, ...] = route[2]
        self.start_s = 0.0
        self.cap = 0.0
        self.ctas = 0
        self.ce = False
        self.host_s = 0.0
        self.path: CopyPath | None = None  # its link leg's path (None: no link leg)
        self.drive = 1.0  # the share of its disk leg's bytes the drive moves (page cache: less)

    def after(self, delay: float, step: Callable[..., None]) -> None:
        """``step`` once ``delay`` seconds have passed (now, without an event, for none)."""
        if delay > 0:
            self.be.clock.wake_after(delay, step)
        else:
            step()

    # the steps, in order (an event's callback passes the event: unused)
    def start(self) -> None:
        """Take what the path needs (a copy engine, or copy-CTA slots), or, with no link
        leg, wait the start cost."""
        be = self.be
        link_dir, disk_dir, res, _ = self.route
        self.start_s = be._disk_latency if disk_dir and be.disk_pool is None else 0.0
        if disk_dir and be.page_cache is not None:
            self.cached_leg(be.page_cache, disk_dir)
            if self.drive == 0.0:  # (no device op: a copy in or out of memory)
                self.start_s = 0.0
        if link_dir is not None:
            if disk_dir:  # (a staged disk leg: the path a direction takes alone, as on hw)
                path, ctas = be.paths[link_dir], be.ctas[link_dir]
            else:
                path, ctas = be.pick_path(link_dir, self.batch.pages)
            self.path = path
            be._flowing[link_dir][int(path is CopyPath.SM_KERNEL)] += 1
            if path is CopyPath.COPY_ENGINE:
                be.copy_engines.take(self.ce_held)
            else:  # (its launch, a call on a call thread where the profile has them: it
                # waits while a copy-engine call issues its pages there; on the H200 an SM
                # kernel submitted after a 1 GiB copy-engine batch of 64 KiB pages started
                # 9-15 ms late)
                self.ctas = ctas
                if be.call_threads is None:
                    be.cta_pool.get(self.ctas).callbacks.append(self.sm_held)
                else:
                    be.call_threads.take(self.launch_call)
            return
        if res == ("hbm",):
            self.start_s += be._sm_launch
        self.after(self.start_s, self.flow)

    def cached_leg(self, pc: SimPageCache, disk_dir: str) -> None:
        """The page cache's part in a buffered disk leg: a write goes into it (the drive
        only through write-back); a read's pages found there skip the drive (``drive``:
        the share of pages that do not), the rest enter it."""
        batch, rank = self.batch, self.be._rank
        if disk_dir == "disk_write":
            pc.insert([(rank, int(d)) for d in batch.dst_slots], batch.page_bytes)
            self.drive = 0.0
            return
        keys = [(rank, int(s)) for s in batch.src_slots]
        hit = pc.hits(keys)
        pc.counts["page_cache_read_hits"] += hit
        pc.counts["page_cache_read_misses"] += len(keys) - hit
        if hit < len(keys):
            pc.insert(keys, batch.page_bytes)
        self.drive = (len(keys) - hit) / len(keys) if keys else 0.0

    def ce_held(self, _: object = None) -> None:
        """A copy engine is this transfer's: the disk leg's latency first (GPU <-> disk),
        then the batched call's host time."""
        if self.start_s > 0:
            start, self.start_s = self.start_s, 0.0
            self.after(start, self.ce_call)
            return
        self.ce_call()

    def ce_call(self, _: object = None) -> None:
        """The call's host time, on a call thread when the profile has them."""
        be = self.be
        be._counts["copy_engine_calls"] += 1
        self.ce = True
        d = self.route[0]
        self.host_s = be._ce_per_call + self.batch.pages * be.per_page[d]
        busy = be.busy_per_page[d]
        if busy > 0 and be.fluid.jobs:  # under compute a page takes longer (busy_per_page):
            pb = self.batch.page_bytes  # its flow capped at a page a (its DMA + that)
            self.cap = pb / (pb / be._link_bw[d] + busy)
        if be.call_threads is None:
            be.fluid.issue(be.issue_share[self.route[0]], True)
            self.after(self.host_s, self.issued)
        else:
            be.call_threads.take(self.thread_held)

    def issued(self, _: object = None) -> None:
        """The call's host time is over: its issuing ends (the interference model's
        issue term), its bytes move."""
        self.be.fluid.issue(self.be.issue_share[self.route[0]], False)
        self.flow()

    def thread_held(self) -> None:
        self.be.fluid.issue(self.be.issue_share[self.route[0]], True)
        self.after(self.host_s, self.thread_done)

    def thread_done(self, _: object = None) -> None:
        self.be.call_threads.give()  # type: ignore[union-attr]  # (only taken when set)
        self.issued()

    def launch_call(self) -> None:
        """The SM kernel's launch call has the call thread (its host time: none): it gives it
        back and waits for its copy-CTA slots."""
        be = self.be
        be.call_threads.give()  # type: ignore[union-attr]  # (only taken when set)
        be.cta_pool.get(self.ctas).callbacks.append(self.sm_held)

    def sm_held(self, _: object = None) -> None:
        """Copy-CTA slots are this transfer's: the kernel's launch (and, while compute
        runs, ``busy_start`` more: its CTAs wait for the compute's to retire), then its
        flow."""
        be = self.be
        link_dir = self.route[0]
        self.start_s += be._sm_launch
        if be.fluid.jobs:
            self.start_s += be._busy_start
        self.cap = self.ctas * be._cta_rate[link_dir]
        self.res = self.res + SM_RES[link_dir]
        n = be._counts["sm_kernel_calls"] = be._counts["sm_kernel_calls"] + 1
        if n == be._lasting_after and be._lasting > 0:  # from now on, every compute call
            be.step_penalty_s = be._lasting
            be.step_penalty_since_s = be.clock.now
        self.after(self.start_s, self.flow)

    def flow(self, _: object = None) -> None:
        """The bytes, as one fluid flow over the route's resources."""
        be, batch = self.be, self.batch
        nbytes = batch.nbytes
        flow_bytes = float(nbytes)
        written = be._disk_written
        if written is not None and self.route[1] == "disk_write":
            dsts: Any = batch.dst_slots  # (Any: as in fill)
            again = sum([written[d] for d in dsts])
            if again:
                flow_bytes = nbytes - again * batch.page_bytes * (1.0 - be._rewrite_cost)
        res, cap, fluid = self.res, self.cap, be.fluid
        if self.route[1]:
            fluid = be.disk_fluid
            if be._split_disk:  # the node's disk: the link leg bounds the pipeline's rate
                res = tuple([r for r in res if r.startswith("disk")])
                link = self.route[0]
                if link is not None and not cap:
                    cap = be._link_bw[link]
        node = be._node_res[(batch.src, batch.dst)]
        if node:  # the node's host DRAM and PCIe switch (``nodebus``)
            res = res + node
        pool = be.disk_pool
        pc = be.page_cache
        if pc is not None and self.route[1] and self.drive < 1.0:
            # a buffered leg: the page cache in the drive's place (a write; a read all found)
            mem = tuple(["disk_cache" if r.startswith("disk") else r for r in res])
            if self.route[1] == "disk_write":
                if pool is None:
                    pc.write(flow_bytes, mem, cap, self.ce, self.moved)
                    return
                job = DiskJob(mem, cap, self.ce, flow_bytes / nbytes, self.fail,
                              self.pieces_done, batch, pc)
                pool.submit(job, io_class(batch), batch.page_bytes, batch.pages)  # type: ignore[arg-type]
                return
            if self.drive == 0.0:
                fluid.add_flow_then(self.moved, flow_bytes, mem, cap, self.ctas, self.ce)
                return
            flow_bytes *= self.drive  # (a read partly found: the drive moves the rest)
        if pool is not None and self.route[1]:
            # the disk leg in pieces on the pool's workers (a GPU <-> disk piece also moves
            # over the link: the staged pipeline; its SM kernel's CTAs are not counted per
            # piece)
            job = DiskJob(res, cap, self.ce, flow_bytes / nbytes, self.fail,
                          self.pieces_done, batch)
            pool.submit(job, io_class(batch), batch.page_bytes, batch.pages)  # type: ignore[arg-type]
            return
        fluid.add_flow_then(self.moved, flow_bytes, res, cap, self.ctas, self.ce)

    def pieces_done(self, ok: bool) -> None:
        """The disk pool ran the last piece (``ok`` False: one failed, the rest dropped)."""
        self.moved()

    def moved(self) -> None:
        """The bytes have moved: give back what the path took, then the backend's fixed
        cost (it holds nothing), then the transfer completes."""
        be = self.be
        if self.ce:
            be.copy_engines.give()
        elif self.ctas:
            be.cta_pool.put(self.ctas)
        if self.path is not None:
            be._flowing[self.route[0]][int(self.path is CopyPath.SM_KERNEL)] -= 1
        fixed = be._fixed[self.ctas > 0]
        if self.route[0] is not None:
            fixed += be.link_leg_s
        if self.route[1]:
            fixed += be.disk_leg_s
        if fixed > 0:
            self.after(fixed, self.end)
            return
        self.end()

    def end(self, _: object = None) -> None:
        be, batch, fail = self.be, self.batch, self.fail
        be._finish(batch, self.route[3], fail)
        if be.timing_log is not None:
            be._log(batch, self.route[0], self.route[1], fail, self.t0, self.path)
        self.be.clock.succeed(self.done, not fail)
