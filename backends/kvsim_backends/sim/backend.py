"""SimBackend: the Backend protocol over a SimPy model of one GPU's data paths.

The cost model it implements is the package's (``kvsim_backends.sim``'s docstring).

Content tags: one list of ints per level, a slot's tag at its index (the core hands slots
and tags as lists: indexing lists costs a fraction of building numpy arrays for a batch's
few pages); a completed transfer copies the source slots' tags to the destination slots,
a failed one writes garbage (0xDEAD) there and succeeds with False. Stats count bytes and
busy seconds per direction. Deterministic; the only per-page work is the tags' copy (and,
with ``nvme.rewrite``, which disk slots were written); O(1) SimPy events per transfer: a
transfer is a chain of callbacks (``transfer.Transfer``), each step run by the event it
waited for, not a process; copy engines and call threads are taken first come, first
served without events of their own (``Units``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Final, Sequence

import simpy

from kvsim.core.datapath.copypath import CopyPath, direction_ctas, direction_paths, pinned_paths
from kvsim.core.datapath.fill import FillLayout, registration_unit
from kvsim.core.datapath.interference import MixTable, issue_share
from kvsim.core.datapath.pathcost import other_path, path_chooser
from kvsim.core.datapath.powerstate import Boost, PowerState
from kvsim.core.datapath.work import StepWork, gemm_share
from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level
from kvsim.settings import BackendSettings

from .diskpool import SimDiskPool, disk_parts
from .pagecache import SimPageCache
from .driver import DriverLock
from .fluid import Fluid
from .gpushare import gpu_fluid, gpu_part, ranks_on_gpu
from .network import SimNetwork
from .nodebus import NodeBus, node_caps, node_routes
from .hostfill import SimHostFill
from .routes import DIRECTIONS, ROUTES
from .runtime import SimRuntime
from .transfer import GARBAGE, Transfer, Transfers
from .servers import Units

_INF: Final = math.inf


def mix_table(profile, model, page_bytes: int) -> MixTable | None:
    """The structural interference model for ``model``'s GEMMs (``ModelSettings``) on
    ``profile`` at pages of ``page_bytes``, or None where the profile has only the older terms."""
    structure = profile.interference_structure(page_bytes=page_bytes)
    if structure is None:
        return None
    return MixTable(structure, model.projections, model.min_rows, model.max_rows)


class SimBackend(Transfers):
    """Built from ``settings`` (``kvsim.settings.BackendSettings``) alone: ``slots``, how
    many slots each tier's tag array has (its reserved range); the profile's constants;
    a batch alone's copy path each direction (``PathChooser.lone``: forced, the SM kernel where
    host registration units, the fill's or the probe's, could split a page, else by rule); the
    SM kernel's CTAs by ``direction_ctas``; the disk tier's I/O settings; the host tier's fill."""

    name = "sim"

    def __init__(self, runtime: SimRuntime, settings: BackendSettings):
        self.runtime = runtime
        self.env = runtime.env
        self.settings = settings
        self.profile = p = settings.profile
        self.page_bytes = page_bytes = settings.page_bytes
        slots = settings.slots
        self.refcheck = settings.refcheck
        self.on_traffic = None
        probes = settings.probes
        # optional per-batch timing log: dicts (t_s, src, dst, pages, bytes, path, seconds)
        self.timing_log = probes.timing_log
        # optional per-compute log: [start s, nominal s, seconds it took, nominal GEMM s, rank]
        # (interference, the power state and step_tail's tail in it, the fixed latency not)
        self.compute_log = probes.compute_log
        # kvsim compare's hw loop: (nominal s, work) -> seconds a step ends after its work
        self.step_tail: Callable[[float, StepWork | None], float] | None = None
        link, sm, ce, nv = p.link, p.sm, p.copy_engine, p.nvme
        self.errors: list[str] = []  # what failed, newest last (injected failures here)
        # the node's driver lock (a profile with a ``driver``): fills hold it, executor
        # calls wait for it while any fill of the node is under way
        self.driver: DriverLock | None = None
        if p.driver is not None:
            call_s = p.driver.call
            self.driver = runtime.shared(settings.node_part("driver"), lambda: DriverLock(call_s))
        self.driver_wait_s = 0.0  # executor calls' waits for the lock, in all
        self.driver_waits = 0
        # the host tier's fill: when its slots exist (a tier without one: at once)
        self.host_fill = SimHostFill(runtime, p, page_bytes, settings.host_fill, slots,
                                     probes.fail_fill_at_unit, self.errors, self.driver,
                                     node=settings.node)
        unit = probes.registration_unit or registration_unit(settings.host_fill.backing,
                                                             self.host_fill.layout)
        c = settings.copy
        host_slots = int(slots.get(Level.HOST, 0))
        idle = direction_paths(p, page_bytes, c.force, unit, host_slots, c.kernel_on_coherent_link)
        self.per_page = {d: ce.per_page_for(d, page_bytes) for d in ("h2d", "d2h")}
        self.busy_per_page = {d: ce.busy_per_page_for(d, page_bytes) for d in ("h2d", "d2h")}
        # the host-bound share of a copy-engine call's issuing, by direction (the
        # structural interference model's issue term; nothing without it)
        self.issue_share = {d: (issue_share(self.per_page[d], page_bytes, getattr(link, d))
                                if p.interference_structure() is not None else 0.0)
                            for d in ("h2d", "d2h")}
        self.ctas = direction_ctas(c.sm_ctas, p, page_bytes)
        self._cta_rate = {d: sm.cta_rate(d, page_bytes) for d in ("h2d", "d2h")}
        op = min(page_bytes, nv.piece)
        self.ops_per_page = -(-page_bytes // nv.piece)
        disk_cfg = settings.disk
        io_workers = disk_cfg.io_workers if disk_cfg is not None else 0
        # io_mode serial: one worker, one first-in first-out queue (seed 004's baseline)
        serial = disk_cfg is not None and disk_cfg.io_mode == "serial"
        pooled = io_workers > 0 or serial

        def disk_rate(bw: float) -> float:
            if pooled:  # the pieces on the workers model the queue: the device's own rate
                return bw
            return min(bw, nv.queue_depth * op / (nv.latency + op / bw))
        disk = {"disk_read": disk_rate(nv.read), "disk_write": disk_rate(nv.write)}
        # writes: buffered: the page cache before the drive (kvsim_backends.sim.pagecache),
        # its copies in and out a resource of their own (the profile's page_cache.rate)
        pcs = p.page_cache if disk_cfg is not None and disk_cfg.writes == "buffered" else None
        if pcs is not None:
            disk["disk_cache"] = pcs.rate
        # nvme.rewrite: a write into disk slots written before moves at the rewrite rate (the
        # flow carries such bytes as write / rewrite of a first write's, its link leg alike);
        # which slots were written is kept only when the profile gives the rate
        self._rewrite_cost = 1.0  # (a rewritten byte's share of a first write's time)
        self._disk_written = None  # 1: the disk slot was written
        if nv.rewrite is not None and Level.DISK in slots:
            self._rewrite_cost = disk["disk_write"] / disk_rate(nv.rewrite)
            self._disk_written = bytearray(int(slots[Level.DISK]))
        # ranks on one GPU (``ranks_per_gpu``) share its fluid: links, SM pool, HBM, compute
        per = ranks_on_gpu(settings)
        self._gpu_shared = per > 1
        self.fluid = gpu_fluid(runtime, settings, disk, mix_table(p, settings.model, page_bytes))
        self.clock = self.fluid.clock  # (SimPy's queue, for the transfers' wake-ups and events)
        # each GPU <-> host batch's path by what it costs (kvsim.core.datapath.pathcost),
        # from the batches whose bytes are moving, by direction and path
        self.chooser = path_chooser(p, page_bytes, pinned_paths(p, page_bytes, c.force, unit, host_slots,
                                                                c.kernel_on_coherent_link),
                                    idle, c.sm_ctas, self.fluid.kinds)
        self.paths = self.chooser.lone  # (a batch alone: reported, and the staged legs')
        self._flowing = {d: [0, 0] for d in ("h2d", "d2h")}  # batches moving: [copy engine, SM kernel]
        # the node's disk drive: one rank's own fluid holds it; a node's ranks share one
        # (``Runtime.shared``), a GPU <-> disk flow bounded by its link leg's rate
        self._split_disk = settings.ranks > 1
        self._link_bw = {"h2d": link.h2d, "d2h": link.d2h}

        write_share = disk_cfg.io_write_share if disk_cfg is not None else 1.0
        # the node's host DRAM and PCIe switches (``nodebus``), where the profile names them:
        # every fluid of the node joins its bus, each route's flow adds what it draws on
        caps = node_caps(p, settings.gpus or -(-settings.ranks * settings.tp // per))
        bus: NodeBus | None = (runtime.shared(settings.node_part("bus"), lambda: NodeBus(caps))
                               if caps else None)
        self._node_res = node_routes(p, settings.gpu_index())
        if bus is not None and self.fluid.bus is None:  # (a shared GPU's fluid joins once)
            bus.join(self.fluid)

        def node_disk() -> tuple[Fluid, SimDiskPool | None, SimPageCache | None]:
            fluid = Fluid(self.env, disk, per_cta_slowdown=0.0, copy_engine_slowdown=0.0,
                          busy_cta_efficiency=1.0) if self._split_disk else self.fluid
            return disk_parts(fluid, bus, pcs, nv, io_workers if pooled else 0, write_share, serial)
        self.disk_fluid, self.disk_pool, self.page_cache = (
            runtime.shared(settings.node_part("disk"), node_disk) if self._split_disk else node_disk())
        self._rank = settings.rank
        self.copy_engines = gpu_part(runtime, settings, "ce", lambda: Units(ce.count))
        # the host side of copy-engine calls, when the profile gives its threads
        self.call_threads = Units(ce.call_threads) if ce.call_threads else None
        self.cta_pool = gpu_part(runtime, settings, "ctas", lambda: simpy.Container(
            self.env, capacity=sm.copy_cta_slots, init=sm.copy_cta_slots))
        # (0: no content; a list of n references to one int takes 8n bytes, as uint64s would)
        self.tags = {lv: [0] * int(n) for lv, n in slots.items()}
        self._fail = 0
        self._bytes = dict.fromkeys(DIRECTIONS, 0)
        self._counts = {"transfers": 0, "failed_transfers": 0, "copy_engine_calls": 0,
                        "sm_kernel_calls": 0, "compute_calls": 0}
        self._compute_s = 0.0
        self._compute_nominal_s = 0.0
        self.compute_latency = p.compute.latency  # the backend's fixed cost a compute call
        # the SM kernel's lasting cost a compute call: 0 until it has run enough batches
        self._lasting = (sm.interference.lasting_step_penalty
                         + sm.interference.lasting_gap_per_kernel * settings.kernels_per_step)
        self._lasting_after = sm.interference.lasting_after_batches
        self.step_penalty_s = 0.0
        self.step_penalty_since_s = None  # when it began (None: not yet)
        self._penalized_calls = 0
        self.compute_scale = p.compute.scale      # its work: the nominal seconds x this
        bs = p.compute.boost  # the GPU's power state (None: every step at the calibrated rate)
        self.power = (gpu_part(runtime, settings, "power", lambda: PowerState(
            Boost(bs.gain, bs.spend, bs.recover, bs.calibrated))) if bs is not None else None)
        # the profile's per-transfer constants, read once (a transfer reads them all)
        self._disk_latency = nv.latency
        self._ce_per_call = ce.per_call
        self._sm_launch = sm.launch
        self._busy_start = sm.interference.busy_start  # an SM kernel's later start under compute
        self._fixed = (p.transfer.latency_for(False), p.transfer.latency_for(True))  # by SM
        # a caller's addition to the fixed cost: a transfer with a GPU-link leg, one with a
        # disk leg (GPU <-> disk: both)
        self.link_leg_s = 0.0
        self.disk_leg_s = 0.0
        # the remote tier's network (``cache.remote``; kvsim_backends.sim.network), or None
        self.network = (SimNetwork(runtime, settings, self.fluid, self._bytes,
                                   self._node_res[(Level.HOST, Level.GPU)])
                        if settings.network is not None else None)

    def slots_ready(self, level: Level, slots: Sequence[int]) -> simpy.Event | None:
        return self.host_fill.slots_ready(slots) if level == Level.HOST else None

    def slot_limit(self, level: Level) -> int | None:
        return self.host_fill.slot_limit() if level == Level.HOST else None

    def fill_layout(self, level: Level) -> FillLayout | None:
        return self.host_fill.layout if level == Level.HOST else None

    # -- Backend protocol -------------------------------------------------------------

    def transfer(self, batch: Batch) -> simpy.Event:
        route = ROUTES.get((batch.src, batch.dst))
        if route is None:
            raise ValueError(f"sim backend: no data path {batch.src.name} -> {batch.dst.name}")
        if batch.page_bytes != self.page_bytes:
            raise ValueError(f"batch page_bytes {batch.page_bytes} != backend page_bytes {self.page_bytes}")
        if batch.kind is BatchKind.TAKEBACK:  # the retained disk copy is there: no bytes move
            return self._take_back(batch)
        fail = self._fail > 0
        if fail:
            self._fail -= 1
            self.errors.append(f"injected failure of a {batch.src.name}->{batch.dst.name} batch")
        if batch.pages == 0:
            return self.env.timeout(0, not fail)
        x = Transfer(self, batch, route, fail)
        wait = self.driver_call()
        if wait > 0:  # its copy call waits for the node's driver lock
            self.clock.wake_after(wait, lambda _w: x.start())
        else:
            x.start()
        return x.done

    def onboard_from(self, other: "SimBackend", batch: Batch) -> simpy.Event:
        """A batch from a sibling rank's host or disk tier into this GPU (``node.host:
        shared``), as this rank's own; its tags (refcheck) are the sibling's."""
        return self.env.process(self._onboard_from(other, batch))

    def _onboard_from(self, other: "SimBackend", batch: Batch):
        ok = yield self.transfer(batch)
        if self.refcheck:
            dst, src = self.tags[Level.GPU], other.tags[batch.src]
            srcs: Any = batch.src_slots
            for d, s in zip(batch.dst_slots, srcs):
                dst[d] = src[s] if ok else GARBAGE
        return ok

    def driver_call(self) -> float:
        """An executor call now: how long it waits for (and holds) the node's driver lock;
        0 without a lock or while no fill of the node holds it."""
        lock = self.driver
        if lock is None or not lock.fills:
            return 0.0
        wait = lock.call_delay(self.clock.now)
        self.driver_wait_s += wait
        self.driver_waits += 1
        return wait

    def pick_path(self, d: str, pages: int) -> tuple[CopyPath, int]:
        """(path, SM CTAs) of a batch of ``pages`` in direction ``d`` now: the chooser's,
        from the other direction's flows and the compute running (its first job's work)."""
        jobs = self.fluid.jobs
        return self.chooser.pick(d, pages, other_path(self._flowing["d2h" if d == "h2d" else "h2d"]),
                                 bool(jobs), jobs[0].work if jobs else None)

    def _take_back(self, batch: Batch) -> simpy.Event:
        """An eviction onto the pages' retained disk copies: done at once, nothing written
        (the tags stay those the copies' earlier writes left). Counted as
        ``takeback_pages`` (present once one happened)."""
        self._counts["takeback_pages"] = self._counts.get("takeback_pages", 0) + batch.pages
        return self.env.timeout(0, True)

    def compute(self, duration_s: float, work: StepWork | None = None) -> simpy.Event:
        wait = self.driver_call()
        if wait > 0:  # its launch waits for the node's driver lock
            return self.env.process(self._later(wait, duration_s, work))
        return self._compute(duration_s, work)

    def _later(self, wait: float, duration_s: float, work: StepWork | None):
        yield self.env.timeout(wait)
        return (yield self._compute(duration_s, work))

    def _compute(self, duration_s: float, work: StepWork | None = None) -> simpy.Event:
        self._counts["compute_calls"] += 1
        work_s = duration_s * self.compute_scale
        power = self.power
        if power is not None and work is not None:
            work_s, h, free_at = power.step(self.clock.now, work_s, work)
            power.commit(h, free_at)
        done = self.fluid.add_job(work_s, work)
        tail = self.step_tail(duration_s, work) if self.step_tail is not None else 0.0
        if tail > 0:  # (kvsim compare's hw loop: in the step's time, the SMs not held)
            done = self.env.process(self._after(done, tail))
        done.callbacks.append(lambda ev, d=duration_s, t0=self.clock.now, w=work:  # type: ignore[misc]
                              self._count_compute(ev.value, d, t0, w))
        lat = self.compute_latency
        if self.step_penalty_s > 0:
            lat += self.step_penalty_s
            self._penalized_calls += 1
        if lat > 0:
            return self.env.process(self._after(done, lat))
        return done

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool,
                      work: StepWork | None = None) -> float | None:
        if self.driver is not None and self.driver.fills:
            return None  # (its launch may wait for the lock: step on the clock)
        if quiet and not self._gpu_shared:  # (a sibling on the GPU may start a step)
            horizon = _INF
        else:
            self.fluid.drop_stale()  # (a superseded flow wake-up changes nothing)
            queue = self.clock.queue  # (what env.peek() reads: the next event's time)
            horizon = queue[0][0] if queue else _INF
        lat = self.compute_latency
        penalty = self.step_penalty_s
        if penalty > 0:
            lat += penalty
        work_s = seconds * self.compute_scale
        power = self.power
        stepped = power.step(start_s, work_s, work) if power is not None and work is not None else None
        if stepped is not None:
            work_s = stepped[0]
        end = self.fluid.ahead(start_s, work_s, horizon, lat, work)
        if end is None:
            return None  # (the state unchanged: the engine steps this compute on the clock)
        if power is not None and stepped is not None:
            power.commit(stepped[1], stepped[2])
        if penalty > 0:
            self._penalized_calls += 1
        self._counts["compute_calls"] += 1
        self._compute_s += end - start_s  # _count_compute, inline (once per engine step)
        self._compute_nominal_s += seconds
        if self.compute_log is not None:
            self.compute_log.append([start_s, seconds, end - start_s, _gemm_s(seconds, work), self._rank])
        return end + lat  # (+ 0.0 when there is none: the same float)

    def catch_up(self, until_s: float) -> simpy.Event:
        self.fluid.drop_stale()  # (a superseded flow wake-up at the head changes nothing)
        return self.runtime.advance_to(until_s)

    def fill(self, fill: Fill) -> None:
        # (slots and tags typed Any: any ints, numpy's included, where the compiled build
        # would check that each is a Python int)
        slots: Any = fill.slots
        if self.refcheck:
            store = self.tags[fill.level]
            tags: Any = fill.tags
            for s, t in zip(slots, tags):
                store[s] = t
        written = self._disk_written
        if written is not None and fill.level == Level.DISK:
            for s in slots:
                written[s] = 1  # (written into the file, as on hw)

    def read_tags(self, level: Level, slots: Sequence[Any]) -> list:
        """The tags in ``slots`` (a list of ints). (``Sequence[Any]``: numpy's ints too.)"""
        if not self.refcheck:
            raise RuntimeError("sim backend: read_tags needs refcheck=True (tags are not kept)")
        store = self.tags[level]
        return [store[s] for s in slots]

    def read_tags_later(self, level: Level, slots: Sequence[Any]) -> simpy.Event | None:
        """None: ``read_tags`` is immediate and free (tags, not bytes)."""
        return None

    def close(self) -> None:
        pass

    # -- test hooks and statistics ----------------------------------------------------

    def promote(self, batch: Batch) -> int:
        """A background write (a ``BatchKind.BACKGROUND`` batch to disk) that a required
        write came to depend on: its pieces still queued move to the required writes'
        queue (with ``io_workers`` > 0; else nothing to do). How many moved."""
        return self.disk_pool.promote(batch) if self.disk_pool is not None else 0

    def fail_next_transfer(self, n: int = 1) -> None:
        """The next ``n`` transfers (in submission order) fail: they take their time, leave
        garbage in their destination slots and succeed with False. With ``io_workers``
        > 0 a disk transfer fails at its first piece: its pieces still queued never run."""
        self._fail += n

    def stats(self) -> dict:
        busy, disk_busy = self.fluid.busy_s, self.disk_fluid.busy_s  # (the node's disk)
        out: dict = {f"{d}_bytes": self._bytes[d] for d in DIRECTIONS}
        for d, r in (("h2d", "h2d"), ("d2h", "d2h"), ("disk_read", "disk_read"),
                     ("disk_write", "disk_write"), ("gpu_copy", "hbm")):
            out[f"{d}_busy_s"] = (disk_busy if r.startswith("disk") else busy)[r]
        # the names the engine's metrics summary reads (bytes)
        out["host_to_gpu"] = self._bytes["h2d"]
        out["gpu_to_host"] = self._bytes["d2h"]
        out["disk_read"] = self._bytes["disk_read"]
        out["disk_write"] = self._bytes["disk_write"]
        out.update(self._counts)
        out["compute_s"] = self._compute_s
        out["compute_stretch_s"] = self._compute_s - self._compute_nominal_s
        out["copy_path_h2d"] = self.paths["h2d"].value
        out["copy_path_d2h"] = self.paths["d2h"].value
        if self.page_cache is not None:  # (writes: buffered only: other runs' columns unchanged)
            out.update(self.page_cache.stats())
        if self.disk_pool is not None:
            q = self.disk_pool.queues
            out["disk_pieces"] = self.disk_pool.pieces_run
            out["disk_pieces_dropped"] = self.disk_pool.pieces_dropped
            out["disk_jumps"] = q.jumps
        hf = self.host_fill
        if hf.layout is not None and hf.lock is not None:  # a fill that takes the driver's lock
            out["host_fill_done_s"] = hf.ends[-1] if len(hf.ends) >= hf.layout.units else -1.0
            out["driver_wait_s"] = self.driver_wait_s  # (other runs' columns unchanged)
            out["driver_waits"] = self.driver_waits
        if self._lasting > 0:  # (only where the profile has one: other runs' columns unchanged)
            out["step_penalty_s"] = self.step_penalty_s
            out["step_penalty_since_s"] = self.step_penalty_since_s
            out["penalized_compute_calls"] = self._penalized_calls
        if self.network is not None:  # (a remote tier only: other runs' columns unchanged)
            out.update(self.network.stats())
        return out

    # -- mechanics ------------------------------------------------------------------

    def _after(self, done: simpy.Event, latency: float):
        """A compute's completion ``latency`` after its work (``compute.latency``, a tail)."""
        took = yield done
        yield self.env.timeout(latency)
        return took + latency

    def _count_compute(self, took_s: float, nominal_s: float, t0: float,
                       work: StepWork | None = None) -> None:
        self._compute_s += took_s
        self._compute_nominal_s += nominal_s
        if self.compute_log is not None:
            self.compute_log.append([t0, nominal_s, took_s, _gemm_s(nominal_s, work), self._rank])


def _gemm_s(nominal_s: float, work: StepWork | None) -> float:
    """A compute log's 4th column: the step's nominal GEMM seconds (``gemm_share``; 0
    without a step), what ``kvsim.tools.fitboost`` reads a step's kind from."""
    return nominal_s * gemm_share(work) if work is not None else 0.0
