"""HwLoopSim: the sim backend with the hw backend's own host costs added (``kvsim.tools.hwloop``).

``kvsim compare``'s sim side predicts a hw replay, so it charges what the hw backend's own
software costs there: the backend registry wraps a ``SimBackend`` in this when a replay's
options carry a ``kvsim.tools.hwloop.HwLoop``. The wrapper is the Backend protocol over the sim
backend, which it drives only through its public hooks and state:

- a transfer with a GPU leg completes ``transfer`` later, one with a disk leg ``disk``
  later (the sim backend's ``link_leg_s`` / ``disk_leg_s``: added to the fixed cost of the
  transfer, holding nothing);
- a compute starts late by what the loop owes (``HwLoop.take``: the resumes and the check
  launches since the last compute) and the loop's gap before every step (``step.gap``);
  while anything is owed, or with a gap, the engine cannot run ahead;
- a compute's time holds its overrun (``step.overrun_s`` of its read seconds, the nominal
  seconds not in GEMMs) after its work, the SMs free (the sim backend's ``step_tail``);
- a check the engine waits for (``read_tags_later``) takes the hw check's time: after
  what is owed (or from its launch: ``refcheck.start``), ``refcheck.latency``, then the
  pages' bytes read as a fluid flow (GPU pages
  over HBM, host pages over the link toward the GPU, both as an SM kernel of at most
  ``refcheck.ctas`` CTAs: a CTA a 64 KiB part of a page, as the hw ``kv_check``; disk pages
  with the device's latency and read rate; with the disk tier's ``io_workers`` on, as read
  pieces on the sim's disk pool, where the hw backend reads them). The tags it finds are read when it is asked
  for: the hw backend orders a later write into a checked slot after the check. A check
  of the levels ``refcheck.holds_sms`` names holds every SM while it reads
  (``Fluid.hold``): compute makes no progress meanwhile, and a held check of host pages
  reads at the SM copy kernel's ceilings (``sm_h2d``, ``sm_both``) as well as the link's.
"""

from __future__ import annotations

from typing import Any, Sequence

import simpy

from kvsim.core.plan import Batch, Fill
from kvsim.core.spec import Level
from kvsim.tools.hwloop import HwLoop

from kvsim.core.datapath.diskio import IoClass
from kvsim.core.datapath.work import StepWork, gemm_share

from .backend import SimBackend
from .diskpool import DiskJob

CHECK_PART_BYTES = 64 << 10  # the hw backend's kv_check: a CTA a part of a page this size


class HwLoopSim:
    """``inner`` (a SimBackend) with ``loop``'s costs added (the module docstring)."""

    name = "sim"

    def __init__(self, inner: SimBackend, loop: HwLoop):
        self.inner = inner
        self.loop = loop
        self.runtime = inner.runtime
        self.env = inner.env
        self.errors = inner.errors
        self.checks_modeled = 0  # checks timed (not in stats: the columns stay the sim's)
        inner.link_leg_s = loop.model.transfer
        inner.disk_leg_s = loop.model.disk
        self.step = step = loop.model.step
        if step.overrun_rate > 0:
            inner.step_tail = self._tail

    def transfer(self, batch: Batch) -> simpy.Event:
        return self.inner.transfer(batch)

    def compute(self, duration_s: float, work: StepWork | None = None) -> simpy.Event:
        owed = self.loop.take() + self.step.gap
        if owed > 0.0:
            return self.env.process(self._held(owed, duration_s, work))
        return self.inner.compute(duration_s, work)

    def compute_ahead(self, start_s: float, seconds: float, quiet: bool,
                      work: StepWork | None = None) -> float | None:
        if self.loop.owed_s > 0.0 or self.step.gap > 0.0:
            return None  # (compute() starts it late)
        return self.inner.compute_ahead(start_s, seconds, quiet, work)

    def catch_up(self, until_s: float) -> simpy.Event:
        return self.inner.catch_up(until_s)

    def fill(self, fill: Fill) -> None:
        self.inner.fill(fill)

    def read_tags(self, level: Level, slots: Sequence[Any]) -> list:
        return self.inner.read_tags(level, slots)

    def read_tags_later(self, level: Level, slots: Sequence[Any]) -> simpy.Event | None:
        """An event with the tags once the hw check's time has passed (None without tags)."""
        if not self.inner.refcheck:
            return None
        level = Level(level)
        found = self.inner.read_tags(level, slots)  # (a copy)
        if level == Level.GPU:  # the loop's time to launch it
            self.loop.check_launched(len(slots))
        # refcheck.start: the check starts when the held compute would (hold_end), the two
        # then overlapping, or now (launch), reading while the hold keeps compute idle
        after = self.loop.owed_s if self.loop.model.refcheck.start == "hold_end" else 0.0
        return self.env.process(self._check(level, len(slots), found, after))

    def slots_ready(self, level: Level, slots: Sequence[Any]) -> simpy.Event | None:
        return self.inner.slots_ready(level, slots)

    def slot_limit(self, level: Level) -> int | None:
        return self.inner.slot_limit(level)

    def fill_layout(self, level: Level):
        return self.inner.fill_layout(level)

    def stats(self) -> dict:
        return self.inner.stats()

    def promote(self, batch: Batch) -> int:
        return self.inner.promote(batch)

    def close(self) -> None:
        self.inner.close()

    def _tail(self, duration_s: float, work: StepWork | None) -> float:
        """The step's overrun: ``step.overrun_s`` of its read seconds."""
        read_s = duration_s * (1.0 - gemm_share(work)) if work is not None else duration_s
        return self.step.overrun_s(read_s)

    def _held(self, owed: float, duration_s: float, work: StepWork | None):
        yield self.env.timeout(owed)
        took = yield self.inner.compute(duration_s, work)
        return took

    def _check(self, level: Level, pages: int, found: list, after: float):
        """The time of the hw backend's check of ``pages`` pages at ``level``, launched
        ``after`` seconds from now; then ``found``."""
        cost, be = self.loop.model.refcheck, self.inner
        fluid, page_bytes = be.fluid, be.page_bytes
        nbytes = pages * page_bytes
        if after + cost.latency > 0:
            yield self.env.timeout(after + cost.latency)
        if level == Level.DISK and be.disk_pool is not None:
            # read back on the hw disk pool's threads, as a restore: read pieces there
            done = be.clock.new_event()
            job = DiskJob(("disk_read",), 0.0, False, 1.0, False,
                          lambda ok: be.clock.succeed(done, ok), object())
            be.disk_pool.submit(job, IoClass.READ, page_bytes, pages)
            yield done
        elif level == Level.DISK:
            yield self.env.timeout(be.profile.nvme.latency)
            yield fluid.add_flow(nbytes, ("disk_read",))
        else:
            # "hbm" is a copy's rate (each byte read and written): a check only reads
            ctas = min(pages * -(-page_bytes // CHECK_PART_BYTES), cost.ctas)
            hold = cost.holds_sms == "all" or (cost.holds_sms == "host" and level == Level.HOST)
            if hold:
                fluid.hold(True)
            if level == Level.GPU:
                yield fluid.add_flow(nbytes / 2, ("hbm",), cap=fluid.cap["hbm"], ctas=ctas)
            else:  # (held: its SM loads through the mapped address at the SM kernel's ceilings)
                res = ("h2d", "link", "sm_h2d", "sm_both") if hold else ("h2d", "link")
                yield fluid.add_flow(nbytes, res, cap=fluid.cap["h2d"], ctas=ctas)
            if hold:
                fluid.hold(False)
        self.checks_modeled += 1
        return found
