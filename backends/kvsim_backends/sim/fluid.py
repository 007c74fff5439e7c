"""A fluid (processor-sharing) model of the data paths and of compute under interference.

Flows are byte streams over named resources (``h2d``, ``d2h``, ``link`` for the
both-directions total, ``sm_h2d`` / ``sm_d2h`` / ``sm_both`` for the SM copy kernel's own
ceilings, ``disk_read``, ``disk_write``, ``hbm``), each a bandwidth. Rates are max-min
fair (progressive filling): every flow's rate rises equally until a resource it uses is
full or it reaches its own cap (an SM copy kernel's CTA rate).
A flow over several resources (disk -> host -> GPU) moves at one rate through all of them:
a pipeline in steady state.

Compute jobs progress at ``1 / (1 + slowdown)`` seconds of work per second. A job of a
step's work (a ``StepWork``) on a profile with the structural model (``kinds``: a
``kvsim.core.datapath.interference.MixTable``) runs its GEMMs, then its reads
(``kvsim_backends.sim.stepjob``), each at its own kind's slowdown against the
``CopyLoad`` the flows take (``kvsim.core.datapath.interference``) and the copy-engine
calls issuing their pages (``issue``). Any other job's slowdown (the older model, and a
compute of the SMs alone) sums ``per_cta_slowdown`` for every copy-kernel CTA moving
bytes and ``copy_engine_slowdown`` while any copy-engine flow moves bytes. While a
compute job runs, copy-kernel CTAs get ``busy_cta_efficiency`` of their idle rate (GPU
-> host ones ``busy_cta_efficiency_d2h`` where given; with ``busy_kinds``, a step's by
its kinds, the least over the jobs, GPU -> host's capped with ``busy_most``:
``busy_now``). A fluid of a GPU that several ranks share (``share_compute``:
``node.ranks_per_gpu`` > 1, one fluid for their links, SM pool and HBM) shares its SMs
by its jobs' kernel lengths (``kvsim_backends.sim.smshare``; equal kernels: 1 / n each,
processor sharing): a job's stretch is ``(1 + slowdown) x factor``; jobs are re-timed
whenever one starts or ends, or one's GEMM part ends while others run (its wake-up
there: ``Job.turn``). While a kernel that takes every SM runs (``hold``: the hw
refcheck's kernel, of a higher stream priority), jobs make no progress: each resumes
where it was when the last hold ends.

Invariants: rates (and so the load and every slowdown) change only when the set of flows
changes, or when compute starts or stops while an SM copy kernel moves bytes (the load
also when a copy-engine call starts or ends issuing); flows are brought up to date only
then (piecewise constant in between), so a compute job that starts and ends while
nothing else changes leaves the flows' arithmetic untouched. A job ends at ``start +
work * (1 + slowdown)`` when its slowdown stays constant over it: the same expression
``ahead`` evaluates for a compute run ahead of the clock, so running ahead and stepping
give the same floats. A job's slowdown is 0.0 exactly while no flow moves bytes and no
call issues; without ``kinds`` every job's is the older model's. Exactly one flow
wake-up is live (older ones are no longer ``_pending`` and do nothing; ``drop_stale``
takes those at the head of the clock's queue off it, so they do not stop a run ahead); a
flow completes at the wake-up that predicted its end, never earlier. A fluid on its
node's bus (``nodebus``: host DRAM, PCIe switches) takes its rates from the bus, set
with the node's other fluids'. Cost: O(1) SimPy events per flow or job plus one per
change.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Final

import simpy

from kvsim.core.datapath.interference import (IDLE, CopyLoad, MixTable, Most, Shares, busy_share,
                                              legacy_stretch, least_share)
from kvsim.core.datapath.work import StepWork

from .fairshare import flow_rates, flows_load
from .runtime import Clock, Wake
from .smshare import KernelLengths, factors
from .flow import Flow
from .stepjob import Job

_INF: Final = math.inf
_ALLOC_CACHE_MAX: Final = 4096  # distinct flow mixes remembered (a bound, never reached in practice)


class Fluid:
    """Shared bandwidths and SM interference on one SimPy clock."""

    def __init__(self, env: simpy.Environment, capacities: dict[str, float], *,
                 per_cta_slowdown: float, copy_engine_slowdown: float,
                 busy_cta_efficiency: float, kinds: MixTable | None = None,
                 busy_cta_efficiency_d2h: float | None = None,
                 busy_kinds: tuple[Shares, Shares] | None = None, busy_most: Most | None = None):
        self.env = env
        self.clock = Clock(env)  # (its queue, for the wake-ups and events below)
        self.cap = dict(capacities)
        self.per_cta = per_cta_slowdown
        self.ce_slow = copy_engine_slowdown
        self.busy_eff = (busy_cta_efficiency, busy_cta_efficiency if busy_cta_efficiency_d2h is None
                         else busy_cta_efficiency_d2h)  # (to the GPU, any other)
        self.busy_kinds = busy_kinds  # (GEMMs', reads') shares of a step's work (None: busy_eff)
        self.busy_most = busy_most  # (GEMMs', reads') most GPU -> host CTAs move together
        self.kinds = kinds  # the structural model (None: the older one for every job)
        self.share_compute: KernelLengths | None = None  # its jobs share the SMs (ranks on one GPU)
        self.held = 0  # kernels that take every SM now (``hold``): no job progresses
        self.flows: list[Flow] = []
        self.jobs: list[Job] = []
        self.busy_s = {r: 0.0 for r in self.cap}   # up to the last change of the flows
        self.compute_busy_s = 0.0                   # up to the last job's end
        self._slow = 0.0  # the older model's slowdown under the current flows
        self._load: CopyLoad = IDLE  # what the current flows take (with ``kinds`` only)
        self._t_flows = self.clock.now    # when the flows' ``remaining`` were last updated
        self._jobs_since = self.clock.now  # when compute last went from idle to busy
        self._busy_res: set[str] = set()  # resources the current flows use
        self._n_sm = 0                    # current flows that are SM copy kernels
        self._pending: Wake | None = None  # the one live flow wake-up
        # superseded wake-ups still queued (they do nothing when they fire): ``drop_stale``
        self._stale: set[Wake] = set()
        self._due_flows: list[Flow] = []  # what the live wake-up completes
        # (busy shares, issue, flows' signatures in order) -> (slowdown, load, rates): mixes
        # recur, an allocation is a pure function of its key; a signature is a small number
        # (its place in ``_sigs``), which hashes fast where nested tuples would not
        self._alloc_cache: dict[tuple, tuple[float, CopyLoad, tuple[float, ...]]] = {}
        # (time, load) at each change of the load while set (``kvsim.tools.fitkinds``)
        self.load_log: list[tuple[float, CopyLoad]] | None = None
        self._issuing: list[float] = []  # copy-engine calls issuing: each one's host-bound share
        self._issue = 0.0                # their sum (with ``kinds`` only)
        self._sigs: list[tuple] = []        # signature number -> (res, cap, ctas, ce)
        self._sig_of: dict[tuple, int] = {}  # (res, cap, ctas, ce) -> signature number
        self.bus: Any = None  # the node's bus it joined (None: its rates its own)
        self.bus_index = 0    # (its place among the bus's members)

    # -- entry points ---------------------------------------------------------------

    def add_flow(self, nbytes: float, res: tuple[str, ...], cap: float = 0.0, ctas: int = 0,
                 ce: bool = False) -> simpy.Event:
        """Start moving ``nbytes``; the event succeeds (value None) when they have moved."""
        done = self.clock.new_event()
        self.add_flow_then(done.succeed, nbytes, res, cap, ctas, ce)
        return done

    def add_flow_then(self, then: Callable[[], object], nbytes: float, res: tuple[str, ...],
                      cap: float = 0.0, ctas: int = 0, ce: bool = False) -> None:
        """``add_flow`` without an event: ``then()`` is called when the bytes have moved
        (by the flow's wake-up, once the rates of the flows left are set; at once for
        none)."""
        if nbytes <= 0:
            then()
            return
        self._sync_flows()
        sig = (res, cap, ctas, ce)
        num = self._sig_of.get(sig)
        if num is None:
            num = self._sig_of[sig] = len(self._sigs)
            self._sigs.append(sig)
        f = Flow(nbytes, res, cap, ctas, ce, then, num)
        self.flows.append(f)
        self._busy_res.update(res)
        self._n_sm += f.sm
        self._realloc()

    def add_job(self, work_s: float, work: StepWork | None = None) -> simpy.Event:
        """Start ``work_s`` seconds of compute (of ``work``: a step, or None: the SMs
        alone); succeeds with the seconds it really took."""
        done = self.clock.new_event()
        if work_s <= 0:
            self.clock.succeed(done, 0.0)
            return done
        now = self.clock.now
        share = self.share_compute
        job = Job(work_s, now, done, work, 0.0, self.kinds is not None or share is not None)
        before = self.busy_now()
        if share is not None:
            job.k_g, job.k_m = share.of(work)
        self._set_slow(job)
        job.held = self.held > 0
        if not self.jobs:
            self._jobs_since = now
        self.jobs.append(job)
        if self._n_sm and (len(self.jobs) == 1 or self._moved(before)):
            # compute starts: SM copy kernels drop to their busy rate
            self._sync_flows()
            self._realloc()
        if share is not None:
            self._reshare(job)
            return done
        if job.held:
            return done  # (timed when the hold ends)
        # (at its start, the very float ``ahead`` gives for a load that holds over it)
        left = work_s * (1.0 + self._slow_of(work))
        job.wake = self.clock.wake_after(left if left > 0.0 else 0.0, self._job_wake)
        return done

    def issue(self, share: float, start: bool) -> None:
        """A copy-engine call starts (``start``) or ends issuing its pages, of host-bound
        share ``share`` (``kvsim.core.datapath.interference.issue_share``): while it
        issues, the structural model's steps pay their kind's issue term. Nothing without
        ``kinds`` or for a share of 0."""
        if self.kinds is None or share <= 0.0:
            return
        self._sync_flows()
        if start:
            self._issuing.append(share)
        else:
            self._issuing.remove(share)
        self._issue = sum(self._issuing)
        self._realloc()

    def hold(self, start: bool) -> None:
        """A kernel that takes every SM starts (``start``) or ends: while any runs, jobs
        make no progress (each brought up to now and stopped); when the last ends, each
        goes on from where it stopped at its current slowdowns. SM copy kernels meanwhile
        run at their idle rate."""
        now = self.clock.now
        self.held += 1 if start else -1
        if self.held == (1 if start else 0):
            for j in self.jobs:
                j.advance(now, j.slow, j.slow_m)
                j.held = start
                self._time_job(j)
            if self._n_sm and self.jobs:  # (SM copy kernels: compute's SMs are theirs, or not)
                self._sync_flows()
                self._realloc()

    def ahead(self, start: float, work_s: float, horizon: float, tail: float = 0.0,
              work: StepWork | None = None) -> float | None:
        """Where a compute of ``work_s`` (of ``work``, as ``add_job``) started at ``start``
        would end, provided nothing changes before: no job runs, no SM copy kernel moves
        bytes (their rates depend on compute), and it ends, ``tail`` seconds later still,
        strictly before ``horizon`` (the next event that could change anything). None
        otherwise. Counted as compute time as a job would be."""
        if self.jobs or self._n_sm or self.held:
            return None
        end = start + work_s * (1.0 + self._slow_of(work))
        if not end + tail < horizon:
            return None
        self.compute_busy_s += end - start
        return end

    def drop_stale(self) -> None:
        """Take superseded flow wake-ups off the head of the clock's queue (each would do
        nothing when it fired), so that the next event there is one that can change
        something. Nothing else changes: the clock moves only when events are run."""
        if self._stale:
            self.clock.drop_head(self._stale)

    @property
    def slowdown(self) -> float:
        """Current compute stretch beyond 1 of a compute of the SMs alone (0.17: it runs
        at 1/1.17 speed)."""
        return self._slow

    @property
    def load(self) -> CopyLoad:
        """What the current flows take from compute (``IDLE`` without ``kinds``)."""
        return self._load

    def busy_now(self) -> Shares | None:
        """SM copy CTAs' shares of their idle rates beside the jobs (None: none, or held):
        ``busy_eff``; with ``busy_kinds`` each job's by its step's kinds, the least (with
        ``busy_most``, at the GPU -> host SM copy CTAs in flight)."""
        if not self.jobs or self.held:
            return None
        kinds = self.busy_kinds
        if kinds is None:
            return self.busy_eff
        most = self.busy_most
        idle = 0.0 if most is None else sum([f.cap for f in self.flows if f.sm and "sm_d2h" in f.res])
        return least_share([busy_share(self.busy_eff, kinds, j.work, most, idle) for j in self.jobs])

    def _moved(self, before: Shares | None) -> bool:
        """With ``busy_kinds``, whether the shares moved from ``before`` (a job came or went)."""
        return self.busy_kinds is not None and self.busy_now() != before

    def slowdown_of(self, work: StepWork | None) -> float:
        """The stretch beyond 1 a compute of ``work`` would run at under the current flows."""
        return self._slow_of(work)

    def _slow_of(self, work: StepWork | None) -> float:
        kinds = self.kinds
        if kinds is None or work is None:
            return self._slow
        load = self._load
        if load is IDLE:  # (no flow moves bytes: the allocation hands out IDLE itself)
            return 0.0
        return kinds.stretch(work, load)

    def _set_slow(self, job: Job) -> bool:
        """Set ``job``'s slowdowns for the current load; whether they changed."""
        kinds = self.kinds
        work = job.work
        if kinds is None or work is None or not job.mem_s:
            slow = self._slow_of(work)
            slow_m = slow
        elif self._load is IDLE:
            slow = slow_m = 0.0
        else:
            _, slow, slow_m = kinds.parts(work, self._load)
        if self.share_compute is not None and len(self.jobs) > 1:  # (smshare's factors)
            fg, fm = factors(job, self.jobs, self.clock.now, self.share_compute.overlap_s)
            slow, slow_m = (1.0 + slow) * fg - 1.0, (1.0 + slow_m) * fm - 1.0
        if slow == job.slow and slow_m == job.slow_m:
            return False
        job.slow, job.slow_m = slow, slow_m
        return True

    # -- mechanics ------------------------------------------------------------------

    def _sync_flows(self) -> None:
        """Bring the flows' remaining bytes and the busy seconds up to now."""
        now = self.clock.now
        dt = now - self._t_flows
        if dt <= 0:
            return
        self._t_flows = now
        flows = self.flows
        if flows:
            for f in flows:
                f.remaining -= f.rate * dt
            busy = self.busy_s
            for r in self._busy_res:
                busy[r] += dt

    def _time_job(self, job: Job) -> None:
        if job.held:  # (timed when the hold ends)
            job.wake = None
            return
        job.turn = (self.share_compute is not None and len(self.jobs) > 1
                    and job.mem_s > 0.0 and job.k_g != job.k_m and job.to_turn() > 0.0)
        left = job.to_turn() if job.turn else job.left()
        job.wake = self.clock.wake_after(left if left > 0.0 else 0.0, self._job_wake)

    def _job_wake(self, ev: Wake) -> None:
        for i, job in enumerate(self.jobs):
            if job.wake is ev:
                break
        else:
            return  # re-timed since: this wake-up is stale
        now = self.clock.now
        if job.turn:  # its GEMM part is done: its reads from now, the others' shares anew
            job.advance(now, job.slow, job.slow_m)
            job.remaining = job.mem_s
            self._reshare(job)
            return
        before = self.busy_now()
        del self.jobs[i]
        if not self.jobs:
            self.compute_busy_s += now - self._jobs_since
        if self._n_sm and (not self.jobs or self._moved(before)):
            self._sync_flows()  # (compute stops: SM copy kernels get their idle rate back)
            self._realloc()     # (which re-times the jobs left too)
        elif self.jobs and self.share_compute is not None:
            self._reshare(None)  # (the others' shares of the SMs grow)
        self.clock.succeed(job.done, now - job.start)

    def _reshare(self, new: Job | None) -> None:
        """The jobs' slowdowns for their number now (``share_compute``): each brought up to
        now at its old ones and re-timed where they changed; ``new``, just added, timed."""
        now = self.clock.now
        for j in self.jobs:
            old, old_m = j.slow, j.slow_m
            if self._set_slow(j) and j is not new:
                j.advance(now, old, old_m)
                self._time_job(j)
        if new is not None:
            self._time_job(new)

    def _realloc(self) -> None:
        """New rates for the current flows (already synced to now), the slowdown they
        cause, jobs re-timed if it changed, and the next flow wake-up."""
        if self.bus is not None:
            self.bus.realloc(self)  # (the node's rates at once: each member's take_rates)
            return
        self._apply(self._allocate())

    def take_rates(self, rates: tuple[float, ...]) -> None:
        """The bus's rates for the current flows (synced to now), in order: as ``_realloc``."""
        self._slow, self._load = self._loaded(tuple([self._sigs[f.sig] for f in self.flows]), rates)
        self._apply(rates)

    def _apply(self, rates: tuple[float, ...]) -> None:
        if self.load_log is not None:
            self.load_log.append((self.clock.now, self._load))
        if self.jobs:
            now = self.clock.now
            for j in self.jobs:  # (each job's slowdown: the older model's alike for all)
                old, old_m = j.slow, j.slow_m
                if self._set_slow(j):
                    j.advance(now, old, old_m)
                    self._time_job(j)
        if self._pending is not None:
            self._stale.add(self._pending)  # (a new wake-up, or none, replaces it)
        flows = self.flows
        if not flows:
            self._pending = None
            self._due_flows = []
            return
        f_left = []
        t_min = _INF
        for f, rate in zip(flows, rates):  # rates set and times left in one pass
            f.rate = rate
            t = f.remaining / rate if rate > 0 else _INF
            f_left.append(t)
            if t < t_min:
                t_min = t
        if t_min == _INF:
            self._pending = None
            self._due_flows = []
            return
        if t_min < 0.0:
            t_min = 0.0
        lim = t_min + (t_min * 1e-9 + 1e-15)
        self._due_flows = [f for f, t in zip(flows, f_left) if t <= lim]
        self._pending = self.clock.wake_after(t_min, self._flow_wake)

    def _flow_wake(self, ev: Wake) -> None:
        if ev is not self._pending:
            self._stale.discard(ev)
            return  # a later change rescheduled: this wake-up is stale
        self._pending = None  # (fired: not stale when the realloc below replaces it)
        self._sync_flows()
        finished = self._due_flows
        gone = set(finished)
        self.flows = [f for f in self.flows if f not in gone]
        self._busy_res = {r for f in self.flows for r in f.res}
        self._n_sm -= sum(f.sm for f in finished)
        self._realloc()
        for f in finished:
            f.done()

    def _allocate(self) -> tuple[float, ...]:
        """Set the compute slowdown and load for the current flows and return each one's
        rate, in order (the caller sets them). Memoised: the result depends only on the
        flows' signatures, in order, and on whether compute runs, and recomputing it gives
        the very same floats."""
        busy = self.busy_now()  # (held jobs take no SM from a copy)
        nums = [f.sig for f in self.flows]
        key = (busy, self._issue, *nums)
        cache = self._alloc_cache
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= _ALLOC_CACHE_MAX:
                cache.clear()
            sigs = self._sigs
            hit = cache[key] = self._allocation(busy, tuple([sigs[n] for n in nums]))
        self._slow, self._load, rates = hit
        return rates

    def _allocation(self, busy: Shares | None, sigs: tuple
                    ) -> tuple[float, CopyLoad, tuple[float, ...]]:
        """(slowdown, load, max-min fair rate of each flow) for flows with signatures
        ``sigs`` (``(res, cap, ctas, ce)`` each), beside compute of shares ``busy``."""
        rates = flow_rates(self.cap, sigs, busy)
        return (*self._loaded(sigs, rates), rates)

    def _loaded(self, sigs: tuple, rates: tuple[float, ...]) -> tuple[float, CopyLoad]:
        """(the older model's slowdown, the load) of flows ``sigs`` at ``rates``."""
        ctas = 0
        ce = False
        for _, _, c, e in sigs:
            ctas += c
            ce = ce or e
        slow = legacy_stretch(self.per_cta, self.ce_slow, CopyLoad(ctas, 0, ce))
        issue = self._issue
        if self.kinds is None or not (sigs or issue):
            return slow, IDLE
        return slow, flows_load(sigs, rates, ce, issue)
