"""The serving engine: continuous batching with chunked prefill over the tier manager.

One generator process (``Engine.serve``) runs step after step. At each step boundary it
releases the arrivals that are due, admits waiting turns while KV allows (create/prepare
the core request, then resume it: a prefix found in host or disk is onboarded by a plan
that runs in the background, overlapped with the other requests' compute), builds a
batch (decodes first, then prefill chunks within the token budget), grows each request's
GPU pages for the tokens it is about to compute, and runs the step on the backend.

Clock: the engine keeps time in integer nanoseconds, read from the runtime after every
wait (``round(now * 1e9)``) and compared as integers, so a replay is reproducible to the
last digit. With ``fast_forward`` on, the engine saves work a step-by-step replay would
spend on what nothing can observe: it runs steps ahead of the runtime's clock, asking the
backend (``compute_ahead``) when each would end, as long as the backend can tell that
nothing it runs changes before then (no transfer in flight at all, or, on the sim, no
event due before the step ends and no SM copy kernel whose rate depends on compute); a run
of identical decode steps (no block boundary, no finish, no arrival before it ends) goes
ahead in one tight loop. The runtime catches up (``catch_up``) before any plan starts and
before any wait. Each step's end is the float a ``compute`` from the same start would end
at, rounded to a nanosecond, so decisions and metrics equal a step-by-step replay's (a test
and benchmarks/sim_speed.py check it). Every step goes to the backend with its
``StepWork`` (the compute model's record of what it computes), stepped or run ahead.

The turns' lifecycle (admission, plans, preemption, finishing) is ``Lifecycle``'s
(kvsim.engine.lifecycle); ``Engine`` adds the step loop and its clock.
"""

from __future__ import annotations

from typing import Iterable

from kvsim.core.datapath.work import StepWork
from kvsim.core.spec import Level
from kvsim.engine.lifecycle import Lifecycle
from kvsim.engine.live import EngineParams, Live, TurnState
from kvsim.engine.metrics import NS, Row
from kvsim.engine.sessions import Cursor, Frame
from kvsim.workload import Turn, Workload, cache_blocks

__all__ = ["Engine", "EngineParams", "TurnState"]


class Engine(Lifecycle):
    """The step loop and its clock, over the turn lifecycle (``Lifecycle``)."""

    # == the serving loop ===============================================================
    def load(self, workload: Workload, start_times_s: Iterable[float] | None = None) -> None:
        """Register a workload. Open loop: sessions start at their start_s (or their first
        turn's arrival_s). Closed loop: at ``start_times_s``, or ``workload.concurrency``
        sessions at a time when the start policy is 'concurrency'."""
        self.block_tokens = workload.block_tokens
        self.arrivals.load(workload, start_times_s)

    def pin_arrivals(self, arrivals_s: dict[tuple[str, int], float]) -> None:
        """Release each listed turn (keyed by session and turn, as the request rows) at the
        given time, or when its session's previous item completes if that is later, instead
        of ``think_s`` after it: a closed-loop replay on another run's arrivals (``kvsim
        compare --pin-arrivals``), so that the two differ by what the model predicts, not by
        how far each turn's error carried into the sessions' later arrivals."""
        self.arrivals.pin(arrivals_s)

    def serve(self):
        """Generator process: serve until every session is done."""
        rt = self.rt
        self._vnow = rt.now
        if self.p.host_serve_slots:
            yield from self._await_host(self.p.host_serve_slots)
        cluster = self.cluster
        while True:
            if cluster is not None and self._vnow > rt.now:
                nxt = cluster.next_ns()  # due by the engine's clock, not yet by the runtime's:
                if nxt is not None and nxt <= self.t:  # let the router hand it out first
                    yield from self._catch_up()
            self._process_due()
            self._release_arrivals()
            if self._dirty:
                self._dirty = False
                self._admit()
            self._sample()
            self._maybe_evict()
            if self.remote is not None:  # pages dropped since: offered to the remote tier
                self.remote.drain(self)
            batch = self._build_batch()
            if self._deferred or batch is None:
                yield from self._catch_up()
                self._start_deferred()
            if batch is None:
                arrival = self.arrivals.next_ns()
                if arrival is None and not self._waiting and not self._running:
                    if self.cluster is None or not self.cluster.open():
                        break  # (in a cluster: once no session anywhere may send it more)
                elif not self._running and not self._inflight and arrival is None:
                    self._fail_stuck()
                    continue
                self._wake = rt.event()
                waits = [self._wake]
                if arrival is not None:
                    waits.append(rt.timeout(max(0.0, arrival / NS - rt.now)))
                yield rt.any_of(waits)
                self._wake = None
                self._tick()
                continue
            if self._owed_ns:  # the manager's bookkeeping (engine.manager_cost) goes first
                yield from self._catch_up()
                owed, self._owed_ns = self._owed_ns, 0
                yield rt.timeout(owed / NS)
                self._tick()
            work = self._step_work(batch)
            first = round(work.seconds * NS)
            n = self._run_ahead(batch, first, work) if self.p.fast_forward else 0
            if not n:
                yield from self._catch_up()
                # ask for the time left to an absolute target: float error never accumulates
                left = (self.t + first) / NS - rt.now
                t0 = self.t
                yield self.backend.compute(left if left > 0.0 else 0.0, work)
                self._tick()
                if not batch:  # (a step of decodes only)
                    self.metrics.decode_step_ns.append(self.t - t0)
                n = 1
            self.metrics.steps += n
            if n > 1:
                self.metrics.fast_forwarded_steps += n - 1
            self._advance(batch, n)
        yield from self._catch_up()
        if self._checks_open:  # the last resume checks are still running (hw, or a sim modelling it)
            self._start_deferred()
        while self._checks_open:
            self._wake = rt.event()
            yield self._wake
            self._wake = None
        self._sample(force=True)

    def _await_host(self, n: int):
        """Serving starts once the host tier's first ``n`` slots exist (its fill's first
        unit, or all of it: ``kvsim.core.datapath.fill``), waited for through the backend as any
        plan's slots are; if they never will, the tier is capped at what was committed."""
        w = self.backend.slots_ready(Level.HOST, [n - 1])
        if w is not None:
            ok = yield w
            if not ok:
                limit = self.backend.slot_limit(Level.HOST)
                if limit is not None:
                    self.mgr.cap_tier(Level.HOST, limit)
            self._tick()
        self.metrics.serve_start_ns = self.t

    def _catch_up(self):
        """Bring the runtime's clock to where the engine ran ahead to."""
        if self._vnow > self.rt.now:
            yield self.backend.catch_up(self._vnow)
            self._tick()

    def _start_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for proc in deferred:
            self.rt.process(proc)

    def _tick(self) -> None:
        now = self.rt.now
        t = round(now * NS)
        if t > self.t:  # (max() through the builtin costs more, once per step)
            self.t = t
        self._vnow = now

    def _release_arrivals(self) -> None:
        heap = self.arrivals.heap
        if not heap or heap[0][0] > self.t:  # (checked here: once per step, most find none)
            return
        cluster = self.cluster
        for at, cur, frame, turn in self.arrivals.pop_due(self.t):
            if cluster is not None and id(turn) not in self._handed:
                # a session's next turn, due here: the router may send it elsewhere
                dest = cluster.reroute(self, at, cur, frame, turn)
                if dest is not self:
                    for f in cur.stack:  # its held pages here are released, as at its end
                        self._release_frame(f)
                    dest.hand(at, cur, frame, turn)
                    continue
            self._accept(at, cur, frame, turn)

    def hand(self, at: int, cur: Cursor, frame: Frame, turn: Turn) -> None:
        """A cluster's router hands this engine a turn due at ``at`` (ns, now): it joins the
        engine's arrivals, released at its next step boundary as its own are; its prompt
        counts in the engine's load from now (``queue_load``)."""
        self.arrivals.push(at, cur, frame, turn)
        self.queued_tokens += turn.input_tokens
        self._load_moved()
        self._handed[id(turn)] = None
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _accept(self, at: int, cur: Cursor, frame: Frame, turn: Turn) -> None:
        """A turn that arrived at ``at`` (ns) joins the queue."""
        uid = next(self._uids)
        row = Row(rid=uid, session=frame.session.sid, turn=cur.turn_index, arrival_ns=at,
                  input_tokens=turn.input_tokens, output_tokens=turn.output_tokens)
        self.metrics.rows.append(row)
        blocks = cache_blocks(turn.hash_ids, self.block_tokens, self.B, turn.input_tokens)
        self._waiting.append(Live(row, turn, frame, cur, blocks, uid))
        if self._handed and id(turn) in self._handed:
            del self._handed[id(turn)]  # (counted when handed)
        else:
            self.queued_tokens += turn.input_tokens
            self._load_moved()
        self._idle.pop(id(frame), None)
        self._dirty = True

    def wake(self) -> None:
        """Let a waiting engine look again (a cluster's last session ended)."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def queue_load(self) -> tuple[int, int, int, int]:
        """(prefill tokens queued, decode blocks, requests running, waiting) as of the last
        step boundary: what a cluster's router probes (``kvsim.core.routing.Load``)."""
        return (self.queued_tokens, -(-self.dec.dsum // self.B), len(self._running),
                len(self._waiting))

    # == batching =======================================================================
    def _build_batch(self) -> list[tuple[Live, int]] | None:
        """(prefill [(live, tokens)], decoders) for the next step, or None."""
        running = TurnState.RUNNING
        if self._stalled:
            stalled, self._stalled = self._stalled, []
            for lv in stalled:
                if lv.state is not running:
                    continue  # preempted, aborted, or its grow is running
                if self._ensure(lv, lv.kv + 1):
                    self.dec.join(lv)
                    self._load_moved()
                elif lv.state is running:
                    self._stalled.append(lv)  # waits for other requests' plans
        budget = self.p.max_batch_tokens - len(self.dec.members)
        prefill: list[tuple[Live, int]] = []
        for lv in list(self._prefilling):
            if budget <= 0:
                break
            if lv.state is not running:
                continue
            if lv.remote:  # its next blocks are fetched from the remote tier first
                self.remote.fetch(self, lv)  # (or a sibling rank's: node.host shared)
                if lv.remote:
                    continue  # (else nothing was left to fetch: it computes now)
            chunk = min(lv.prefill_left, budget)
            if self._ensure(lv, lv.kv + chunk):
                prefill.append((lv, chunk))
                budget -= chunk
        # a request preempted while the batch was built leaves it
        prefill = [(lv, n) for lv, n in prefill if lv.state is running]
        if not self.dec.members and not prefill:
            return None
        return prefill

    def _process_due(self) -> None:
        """Decoders whose turn is over finish; those that filled their pages must grow."""
        dec = self.dec
        if not dec.due or dec.due[0][0] > dec.S:  # (checked here: once per step)
            return
        due = dec.pop_due()
        self._load_moved()
        for lv in due:
            if lv.gen >= lv.out:
                self._finish(lv)
            else:
                self._stalled.append(lv)

    # == stepping =======================================================================
    def _step_work(self, prefill: list[tuple[Live, int]]) -> StepWork:
        """The next step's work; its ``seconds`` the duration at nominal speed."""
        return self.compute.step_work([(c, lv.kv) for lv, c in prefill],
                                      len(self.dec.members), self.dec.dsum)

    def _run_ahead(self, prefill: list[tuple[Live, int]], first: int, work: StepWork) -> int:
        """Run steps ahead of the runtime's clock while the backend can say when each ends
        and that nothing it runs changes before then: the first step, and after it, when
        nothing can change between them, the identical decode steps up to the next step at
        which a decoder finishes or must grow, or an arrival is due. Returns the steps run
        (0: the first could not be; compute it on the runtime). ``work``: the first's."""
        if not self._ahead(first, not prefill, work):
            return 0
        if prefill or self._dirty or self._stalled or self._evict_low():
            return 1  # (the next boundary admits, grows, or starts a background eviction)
        dec = self.dec
        nxt = dec.next_due()
        k = nxt - dec.S if nxt is not None else 1
        arr = self.arrivals.next_ns()
        if self.cluster is not None:  # nor past the cluster's next arrival: it may come here
            ext = self.cluster.next_ns()
            if ext is not None and (arr is None or ext < arr):
                arr = ext
        cm, nd, dsum = self.compute, len(dec.members), dec.dsum
        n = 1
        while n < k and (arr is None or self.t < arr):
            w = cm.decode_work(nd, dsum + nd * n)
            if not self._ahead(round(w.seconds * NS), True, w):
                break
            n += 1
        return n

    def _ahead(self, d: int, decode_only: bool, work: StepWork) -> bool:
        """Run one step of ``d`` ns ahead, asking the backend for its end (the same float a
        ``compute`` from the same start would end at); False if it cannot tell.
        ``decode_only``: a step of decodes only (its duration is recorded); ``work``: what
        the step computes."""
        v = self._vnow
        left = (self.t + d) / NS - v
        end = self.backend.compute_ahead(v, left if left > 0.0 else 0.0, not self._inflight, work)
        if end is None:
            return False
        if self._inflight:
            self.metrics.ahead_inflight_steps += 1
        self._vnow = end
        t = round(end * NS)
        t0 = self.t
        if t > t0:
            self.t = t
        if decode_only:
            self.metrics.decode_step_ns.append(self.t - t0)
        return True

    def _advance(self, prefill: list[tuple[Live, int]], k: int) -> None:
        self.dec.advance(k)
        self._load_moved()
        mgr, be = self.mgr, self.backend
        for lv, n in prefill:
            lv.kv += n
            lv.prefill_left -= n
            d = n if n < lv.queued else lv.queued
            lv.queued -= d
            self.queued_tokens -= d
            self._load_moved()  # (told at once: a request finishing below may route another)
            lv.row.computed_tokens += n
            fill = mgr.commit(lv.req, min(lv.kv, lv.prompt))
            if fill.pages:
                be.fill(fill)
            if not lv.prefill_left:
                self._prefilling.remove(lv)
                self.queued_tokens -= lv.queued
                self._load_moved()
                lv.queued = 0
                if not lv.gen:  # (else a decoder that recomputed its context: StateMoves)
                    lv.gen = 1
                    lv.row.first_token_ns = self.t
                if lv.gen >= lv.out:
                    self._finish(lv)
                else:
                    self._stalled.append(lv)  # decodes once its pages cover one more token
        if self.on_progress is not None and self.metrics.rows:
            self.on_progress(self.t)

    # == timeline =======================================================================
    def _sample(self, force: bool = False) -> None:
        if not force and self.t < self._next_sample:
            return
        interval = round(self.p.timeline_interval_s * NS)
        self._next_sample = (self.t // interval + 1) * interval
        row = {"t_s": self.t / NS, "running": len(self._running), "waiting": len(self._waiting)}
        for t in self.mgr.tiers:
            row[f"{t.level.name.lower()}_used_slots"] = t.used
            row[f"{t.level.name.lower()}_evictable_pages"] = t.index_size()
        if self.mgr.copies_on:  # retained disk copies, apart from evictable disk pages
            row["disk_retained_slots"] = self.mgr.retained_slots()
        for k, v in self.backend.stats().items():
            if isinstance(v, (int, float)):
                row[k] = v
        self.metrics.timeline.append(row)
