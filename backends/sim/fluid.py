"""A fluid (processor-sharing) model of the data paths and of compute under interference.

Flows are byte streams over one or more named resources (``h2d``, ``d2h``, ``link`` for
the both-directions total, ``sm_h2d`` / ``sm_d2h`` / ``sm_both`` for the SM copy kernel's
own ceilings, which only SM-kernel flows use, ``disk_read``, ``disk_write``, ``hbm``), each
resource a bandwidth. Rates are max-min fair (progressive filling): every flow's rate rises equally
until a resource it uses is full or it reaches its own cap (an SM copy kernel's CTA rate).
A flow over several resources (disk -> host -> GPU) moves at one rate through all of them:
a pipeline in steady state.

Compute jobs progress at ``1 / (1 + slowdown)`` seconds of work per second, where the
slowdown sums ``per_cta_slowdown`` for every copy-kernel CTA moving bytes and
``copy_engine_slowdown`` while any copy-engine flow moves bytes. While a compute job runs,
copy-kernel CTAs get ``busy_cta_efficiency`` of their idle rate.

Invariants: rates are recomputed whenever a flow or job starts or ends, and only then
(piecewise constant in between); exactly one pending wake-up is live (older ones are no
longer ``_pending`` and do nothing); a flow or job completes at the wake-up that predicted
its end, never earlier. Cost: O(1) SimPy events per flow or job plus one per change.
"""

from __future__ import annotations

import math

import simpy

_INF = math.inf


class Flow:
    __slots__ = ("remaining", "res", "cap", "sm", "ctas", "ce", "rate", "done", "nbytes")

    def __init__(self, nbytes: float, res: tuple[str, ...], cap: float, ctas: int, ce: bool,
                 done: simpy.Event):
        self.nbytes = nbytes
        self.remaining = float(nbytes)
        self.res = res
        self.cap = cap          # idle cap in bytes/s (0: none)
        self.sm = ctas > 0
        self.ctas = ctas
        self.ce = ce
        self.rate = 0.0
        self.done = done


class Job:
    __slots__ = ("remaining", "start", "done")

    def __init__(self, work_s: float, start: float, done: simpy.Event):
        self.remaining = work_s
        self.start = start
        self.done = done


class Fluid:
    """Shared bandwidths and SM interference on one SimPy clock."""

    def __init__(self, env: simpy.Environment, capacities: dict[str, float], *,
                 per_cta_slowdown: float, copy_engine_slowdown: float,
                 busy_cta_efficiency: float):
        self.env = env
        self.cap = dict(capacities)
        self.per_cta = per_cta_slowdown
        self.ce_slow = copy_engine_slowdown
        self.busy_eff = busy_cta_efficiency
        self.flows: list[Flow] = []
        self.jobs: list[Job] = []
        self.busy_s = {r: 0.0 for r in self.cap}
        self.compute_busy_s = 0.0
        self._slow = 0.0
        self._last = env.now
        self._busy_res: set[str] = set()  # resources the current flows use
        self._n_sm = 0                    # current flows that are SM copy kernels
        self._pending: simpy.Event | None = None  # the one live wake-up
        self._due_flows: list[Flow] = []  # what the live wake-up completes
        self._due_jobs: list[Job] = []

    # -- entry points ---------------------------------------------------------------

    def add_flow(self, nbytes: float, res: tuple[str, ...], cap: float = 0.0, ctas: int = 0,
                 ce: bool = False) -> simpy.Event:
        """Start moving ``nbytes``; the event succeeds (value None) when they have moved."""
        done = self.env.event()
        if nbytes <= 0:
            done.succeed()
            return done
        self._advance()
        f = Flow(nbytes, res, cap, ctas, ce, done)
        self.flows.append(f)
        self._busy_res.update(res)
        self._n_sm += f.sm
        self._reschedule()
        return done

    def add_job(self, work_s: float) -> simpy.Event:
        """Start ``work_s`` seconds of compute; succeeds with the seconds it really took."""
        done = self.env.event()
        if work_s <= 0:
            done.succeed(0.0)
            return done
        self._advance()
        self.jobs.append(Job(work_s, self.env.now, done))
        self._reschedule(realloc=self._sm_flows())
        return done

    @property
    def slowdown(self) -> float:
        """Current compute stretch beyond 1 (0.17: compute runs at 1/1.17 speed)."""
        return self._slow

    # -- mechanics ------------------------------------------------------------------

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt <= 0:
            return
        self._last = now
        flows = self.flows
        if flows:
            for f in flows:
                f.remaining -= f.rate * dt
            busy = self.busy_s
            for r in self._busy_res:
                busy[r] += dt
        if self.jobs:
            self.compute_busy_s += dt
            prog = dt / (1.0 + self._slow)
            for j in self.jobs:
                j.remaining -= prog

    def _allocate(self) -> None:
        flows = self.flows
        jobs_running = bool(self.jobs)
        ctas = 0
        ce = False
        for f in flows:
            f.rate = 0.0
            ctas += f.ctas
            ce = ce or f.ce
        self._slow = self.per_cta * ctas + (self.ce_slow if ce else 0.0)
        if not flows:
            return
        caps = [(f.cap * self.busy_eff if (f.sm and jobs_running) else f.cap) for f in flows]
        if len(flows) == 1:  # the common case: no sharing
            f = flows[0]
            rate = min(self.cap[r] for r in f.res)
            f.rate = min(rate, caps[0]) if caps[0] else rate
            return
        # only the resources some flow uses take part (min and the per-resource updates
        # do not depend on the order they are visited in)
        cap = self.cap
        count: dict[str, int] = {}
        for f in flows:
            for r in f.res:
                count[r] = count.get(r, 0) + 1
        rem = {r: cap[r] for r in count}
        active = list(range(len(flows)))
        while active:
            inc = _INF
            for r, n in count.items():
                if n:
                    inc = min(inc, rem[r] / n)
            for i in active:
                if caps[i]:
                    inc = min(inc, caps[i] - flows[i].rate)
            for i in active:
                flows[i].rate += inc
            full = set()
            for r, n in count.items():
                if n:
                    rem[r] -= inc * n
                    if rem[r] <= 1e-12 * cap[r]:
                        full.add(r)
            still = []
            for i in active:
                f = flows[i]
                if (caps[i] and f.rate >= caps[i] * (1 - 1e-12)) or not full.isdisjoint(f.res):
                    for r in f.res:
                        count[r] -= 1
                else:
                    still.append(i)
            active = still

    def _sm_flows(self) -> bool:
        """Whether any flow's rate depends on compute running (an SM copy kernel's)."""
        return self._n_sm > 0

    def _reschedule(self, realloc: bool = True) -> None:
        # Rates depend on the set of flows, and on whether compute runs only through SM
        # copy kernels' caps: a job starting or ending with no such flow changes no rate.
        if realloc:
            self._allocate()
        flows, jobs = self.flows, self.jobs
        if not flows and not jobs:
            self._pending = None
            self._due_flows, self._due_jobs = [], []
            return
        # each flow's and job's time to its end, computed once (the same expressions as
        # the completion test below, so the earliest one is always due)
        f_left = [f.remaining / f.rate for f in flows]
        stretch = 1.0 + self._slow
        j_left = [j.remaining * stretch for j in jobs]
        t_min = min(f_left + j_left)
        if t_min == _INF:
            self._pending = None
            self._due_flows, self._due_jobs = [], []
            return
        t_min = max(t_min, 0.0)
        lim = t_min + (t_min * 1e-9 + 1e-15)
        self._due_flows = [f for f, t in zip(flows, f_left) if t <= lim]
        self._due_jobs = [j for j, t in zip(jobs, j_left) if t <= lim]
        ev = self.env.timeout(t_min)
        self._pending = ev
        ev.callbacks.append(self._wake)

    def _wake(self, ev: simpy.Event) -> None:
        if ev is not self._pending:
            return  # a later change rescheduled: this wake-up is stale
        self._advance()
        finished_flows, finished_jobs = self._due_flows, self._due_jobs
        if finished_flows:
            gone = set(finished_flows)
            self.flows = [f for f in self.flows if f not in gone]
            self._busy_res = {r for f in self.flows for r in f.res}
            self._n_sm -= sum(f.sm for f in finished_flows)
        if finished_jobs:
            gone_j = set(finished_jobs)
            self.jobs = [j for j in self.jobs if j not in gone_j]
        self._reschedule(realloc=bool(finished_flows) or self._sm_flows())
        now = self.env.now
        for f in finished_flows:
            f.done.succeed()
        for j in finished_jobs:
            j.done.succeed(now - j.start)
