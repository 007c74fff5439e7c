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
and benchmarks/sim_speed.py check it).

Between the turns of a session its request is suspended: its pages are held (evictable
to colder tiers, never dropped) and the next turn finds them by prefix match. When KV is
short, idle sessions' holds are released (least recently suspended first), then the most
recently admitted running request is preempted (suspended; its pages may move to host).
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from dataclasses import dataclass
from itertools import count
from typing import Any, Callable, Iterable

from kvsim.backend import Backend, Runtime
from kvsim.core import Level, RefusalReason, Request, TierManager
from kvsim.core.types import ReqState
from kvsim.engine.metrics import NS, Metrics, Row
from kvsim.engine.plans import check_tags, run_plan, tags_equal
from kvsim.engine.sessions import Cursor, Frame
from kvsim.compute import ComputeModel
from kvsim.workload import Session, Turn, Workload, cache_blocks


class TurnState(enum.IntEnum):
    """Where a turn is in the engine."""

    WAITING = 0     # queued for admission (or preempted, back at the head of the queue)
    ONBOARDING = 1  # admitted; a resume plan brings its pages to GPU
    RUNNING = 2     # computing: prefill chunks, then decode steps
    GROWING = 3     # a grow plan that moves pages is running for it
    DONE = 4        # finished or failed


@dataclass(frozen=True)
class EngineParams:
    max_batch_tokens: int = 8192      # token budget of one step (decodes count one each)
    max_running: int = 256            # requests in the running batch (onboarding included)
    fast_forward: bool = True         # batch identical decode steps (same results, faster)
    refcheck: bool = True             # verify every reused, restored and moved page
    refcheck_disk_writes: bool = True  # ... including pages written to disk, read back
    #                                   (off: they are verified when they come back; on
    #                                   the hw backend the read-back takes disk bandwidth)
    hold_sessions: bool = True        # keep a session's pages held between its turns
    gpu_free_watermark: float = 0.0   # evict in the background when free GPU slots fall
    #                                   below this share of the tier (refill to twice it)
    max_plan_failures: int = 3        # a request whose transfers fail this often in a row
    #                                   fails (reason in its row) instead of retrying forever
    timeline_interval_s: float = 1.0


class Live:
    """One turn inside the engine."""

    __slots__ = ("row", "turn", "frame", "cursor", "req", "blocks", "prompt", "out",
                 "prefill_left", "kv", "gen", "state", "seq", "uid", "s0", "due", "failures")

    def __init__(self, row: Row, turn: Turn, frame: Frame, cursor: Cursor, blocks: list,
                 uid: int):
        self.row = row
        self.turn = turn
        self.frame = frame
        self.cursor = cursor
        self.req: Any = None  # the core Request, once prepared
        self.blocks = blocks
        self.prompt = turn.input_tokens
        self.out = max(1, turn.output_tokens)  # a prefill always yields one token
        self.prefill_left = 0
        self.kv = 0            # tokens whose KV is computed (or found cached)
        self.gen = 0           # output tokens produced
        self.state = TurnState.WAITING
        self.seq = 0           # admission order (preemption picks the latest)
        self.uid = uid
        self.s0 = 0            # decoding: engine step at which kv and gen were last synced
        self.due = -1          # decoding: engine step at which it needs attention again
        self.failures = 0      # consecutive plans of this turn whose transfers failed


class Engine:
    def __init__(self, rt: Runtime, backend: Backend, mgr: TierManager, compute: ComputeModel,
                 params: EngineParams, *, on_progress: Callable[[int], None] | None = None,
                 on_resume: Callable[[int], None] | None = None):
        """``compute.step_time_sum(prefill: [(new_tokens, context_before)], n_decode,
        decode_context_sum)`` gives a step's seconds, ``compute.decode_step_time(n_decode,
        decode_context_sum)`` the same for a step without prefill
        (kvsim.compute.ComputeModel; typed, so the compiled build calls it natively).
        ``on_resume(pages)``: told of every resumed request, with the GPU pages it holds
        (before its pages are checked)."""
        self.rt = rt
        self.backend = backend
        self.mgr = mgr
        self.compute = compute
        self.p = params
        self.B = mgr.tokens_per_block
        self.metrics = Metrics()
        self.on_progress = on_progress
        self.on_resume = on_resume
        self.t = 0                                   # engine clock, ns
        self._arrivals: list = []                    # heap of (ns, seq, cursor, frame, turn)
        self._seq = count()
        self._waiting: deque[Live] = deque()
        self._running: list[Live] = []               # admitted: onboarding/running/growing
        self._reserved_pages = 0                     # their final GPU pages, summed
        # Decoding requests are advanced lazily: a global step counter S, each request's
        # kv/gen synced at step s0, and a heap of the steps at which one needs attention
        # (it finishes, or its pages must grow). The summed context is kept as it goes.
        self.S = 0
        self._decoding: dict[Live, None] = {}
        self._dsum = 0
        self._due: list[tuple[int, int, Live]] = []  # heap of (step, seq, live)
        self._stalled: list[Live] = []               # decoders that must grow before a step
        self._prefilling: list[Live] = []            # admitted, prompt not fully computed
        self._idle: dict[int, Frame] = {}            # suspended sessions between turns
        self._pending_sessions: deque[Session] = deque()
        self._inflight = 0                           # plans running on the backend
        self._checks_open = 0                        # resume refchecks still running (hw)
        self._evicting = False                       # a background eviction is running
        self._evict_failures = 0                     # consecutive failed background evictions
        self._evict_off = False
        self._deferred: list = []                    # plan processes to start at the boundary
        self._wake: Any = None  # the event serve() waits on (the runtime's), while it waits
        self._dirty = True
        self._admit_seq = count()
        self._uids = count()
        self._next_sample = 0
        self._vnow = 0.0                             # the runtime's time the engine ran ahead to
        self._pinned: dict[tuple[str, int], int] | None = None  # (session, turn) -> arrival ns

    def pin_arrivals(self, arrivals_s: dict[tuple[str, int], float]) -> None:
        """Release each listed turn (keyed by session and turn, as the request rows) at the
        given time, or when its session's previous item completes if that is later, instead
        of ``think_s`` after it: a closed-loop replay on another run's arrivals (``kvsim
        compare --pin-arrivals``), so that the two differ by what the model predicts, not by
        how far each turn's error carried into the sessions' later arrivals."""
        self._pinned = {(str(k[0]), int(k[1])): round(v * NS) for k, v in arrivals_s.items()}

    # == workload =======================================================================
    def load(self, workload: Workload, start_times_s: Iterable[float] | None = None) -> None:
        """Register a workload. Open loop: sessions start at their start_s (or their first
        turn's arrival_s). Closed loop: at ``start_times_s``, or ``workload.concurrency``
        sessions at a time when the start policy is 'concurrency'."""
        self.block_tokens = workload.block_tokens
        sessions = list(workload.sessions)
        if workload.closed_loop and workload.start == "concurrency":
            self._pending_sessions.extend(sessions)
            for _ in range(min(max(1, workload.concurrency), len(sessions))):
                self._start_session(self._pending_sessions.popleft(), 0)
            return
        if workload.closed_loop:
            times = list(start_times_s or [])
            if len(times) < len(sessions):
                raise ValueError(f"{len(sessions)} sessions but {len(times)} start times")
            for s, t in zip(sessions, times):
                self._start_session(s, round(t * NS))
            return
        for s in sessions:
            first = s.items[0]
            at = s.start_s if s.start_s is not None else (first.arrival_s or 0.0)
            self._start_session(s, round(at * NS))

    def _start_session(self, session: Session, at_ns: int) -> None:
        cur = Cursor(session, sid=next(self._seq))
        self._schedule_next(cur, at_ns, first=True)

    def _schedule_next(self, cur: Cursor, done_ns: int, first: bool = False) -> None:
        """Queue the session's next turn ``think_s`` after ``done_ns``; close finished
        (sub-)sessions' requests."""
        while True:
            nxt = cur.next_turn()
            if nxt is not None:
                frame, turn = nxt
                at = done_ns if first else done_ns + round(turn.think_s * NS)
                if self._pinned is not None:
                    pin = self._pinned.get((frame.session.sid, cur.turn_index))
                    if pin is not None:
                        at = max(done_ns, pin)
                heapq.heappush(self._arrivals, (at, next(self._seq), cur, frame, turn))
                return
            frame = cur.pop()
            self._release_frame(frame)
            if not cur.stack:
                if self._pending_sessions:
                    self._start_session(self._pending_sessions.popleft(), done_ns)
                return

    def _release_frame(self, frame: Frame) -> None:
        self._idle.pop(id(frame), None)
        req = frame.req
        frame.req = None
        if req is not None and req.state is not ReqState.CLOSED:
            self.mgr.close(req)
            self._dirty = True

    # == the serving loop ===============================================================
    def serve(self):
        """Generator process: serve until every session is done."""
        rt = self.rt
        self._vnow = rt.now
        while True:
            self._process_due()
            self._release_arrivals()
            if self._dirty:
                self._dirty = False
                self._admit()
            self._sample()
            self._maybe_evict()
            batch = self._build_batch()
            if self._deferred or batch is None:
                yield from self._catch_up()
                self._start_deferred()
            if batch is None:
                if not self._arrivals and not self._waiting and not self._running:
                    break
                if not self._running and not self._inflight and not self._arrivals:
                    self._fail_stuck()
                    continue
                self._wake = rt.event()
                waits = [self._wake]
                if self._arrivals:
                    waits.append(rt.timeout(max(0.0, self._arrivals[0][0] / NS - rt.now)))
                yield rt.any_of(waits)
                self._wake = None
                self._tick()
                continue
            first = self._step_ns(batch)
            n = self._run_ahead(batch, first) if self.p.fast_forward else 0
            if not n:
                yield from self._catch_up()
                # ask for the time left to an absolute target: float error never accumulates
                left = (self.t + first) / NS - rt.now
                yield self.backend.compute(left if left > 0.0 else 0.0)
                self._tick()
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

    def _catch_up(self):
        """Bring the runtime's clock to where the engine ran ahead to."""
        if self._vnow > self.rt.now:
            yield self.backend.catch_up(self._vnow)
            self._tick()

    def _launch(self, proc) -> None:
        """Start a plan's process once the runtime's clock has caught up with the engine's
        (at this step boundary, before the step's compute)."""
        self._inflight += 1
        self._deferred.append(proc)

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

    def _notify(self) -> None:
        self._dirty = True
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _release_arrivals(self) -> None:
        arr = self._arrivals
        while arr and arr[0][0] <= self.t:
            at, _, cur, frame, turn = heapq.heappop(arr)
            uid = next(self._uids)
            row = Row(rid=uid, session=frame.session.sid, turn=cur.turn_index, arrival_ns=at,
                      input_tokens=turn.input_tokens, output_tokens=turn.output_tokens)
            self.metrics.rows.append(row)
            blocks = cache_blocks(turn.hash_ids, self.block_tokens, self.B, turn.input_tokens)
            self._waiting.append(Live(row, turn, frame, cur, blocks, uid))
            self._idle.pop(id(frame), None)
            self._dirty = True

    # == admission ======================================================================
    def _admit(self) -> None:
        mgr = self.mgr
        gpu = mgr.tiers[0]
        while self._waiting and len(self._running) < self.p.max_running:
            lv = self._waiting[0]
            if lv.req is None:
                self._prepare(lv)
            need = self._final_pages(lv)
            if need > gpu.capacity:
                self._waiting.popleft()
                self._fail(lv, f"needs {need} GPU pages; the GPU tier has {gpu.capacity}")
                continue
            if self._reserved_pages + need > gpu.capacity:
                return  # admitted requests will need that room: wait for one to finish
            plan = mgr.resume(lv.req)
            if not plan:
                if plan.reason is RefusalReason.NO_ROOM and self._release_hold():  # type: ignore[union-attr]
                    continue
                return
            self._waiting.popleft()
            lv.seq = next(self._admit_seq)
            if lv.row.admitted_ns < 0:
                lv.row.admitted_ns = self.t
            self._add_running(lv)
            if plan.batches:  # type: ignore[union-attr]
                lv.state = TurnState.ONBOARDING
                lv.row.onboard_bytes += plan.nbytes  # type: ignore[union-attr]
                self._start_plan(plan, lv, TurnState.RUNNING)
            else:
                mgr.complete(plan)  # type: ignore[arg-type]
                self._on_resumed(lv)
                self._route(lv)

    def _route(self, lv: Live) -> None:
        """A request that just became RUNNING goes where its phase says."""
        if lv.prefill_left:
            if lv not in self._prefilling:
                self._prefilling.append(lv)
        else:
            self._stalled.append(lv)

    def _final_pages(self, lv: Live) -> int:
        """GPU pages the turn holds when it ends (one more for a copy-on-write)."""
        return -(-(lv.prompt + lv.out - 1) // self.B) + 1

    def _add_running(self, lv: Live) -> None:
        """Admit: the GPU pages the turn will hold at its end are counted against the GPU
        tier (admission keeps the sum within it, so admitted turns grow without preempting
        each other)."""
        self._running.append(lv)
        self._reserved_pages += self._final_pages(lv)

    def _remove_running(self, lv: Live) -> None:
        self._running.remove(lv)
        self._reserved_pages -= self._final_pages(lv)

    def _prepare(self, lv: Live) -> None:
        """Match the turn's prompt: the session's held request keeps its common prefix."""
        mgr = self.mgr
        frame = lv.frame
        if frame.req is not None and frame.req.state is ReqState.SUSPENDED:
            req = frame.req
            mgr.prepare(req, lv.blocks, lv.prompt)
        else:
            req = mgr.create(frame.session.scope, lv.blocks, lv.prompt)
            if self.p.hold_sessions and len(frame.session.items) > 1:
                frame.req = req
        lv.req = req
        hits = req.hit_by_level
        lv.row.hit_gpu, lv.row.hit_host, lv.row.hit_disk = hits[0], hits[1], hits[2]
        cached = req.tokens
        lv.prefill_left = max(1, lv.prompt - cached)
        lv.kv = lv.prompt - lv.prefill_left

    def _on_resumed(self, lv: Live) -> None:
        lv.state = TurnState.RUNNING
        if self.on_resume is not None:
            self.on_resume(len(lv.req.pages))
        if self.p.refcheck:
            exp = self.mgr.expected(lv.req)
            later = self.backend.read_tags_later(Level.GPU, exp.slots)
            if later is None:
                found = self.backend.read_tags(Level.GPU, exp.slots)
                if not tags_equal(found, exp.tags):  # (else all as expected)
                    check_tags(found, exp.tags, f"request {lv.uid}'s pages on GPU")
            else:  # checked while the request runs on (the hw backend orders a later
                #     write into one of these slots after the check, so they read as now)
                self._checks_open += 1
                self._launch(self._check_proc(later, exp.tags, f"request {lv.uid}'s pages on GPU"))

    def _check_proc(self, later, tags, what: str):
        found = yield later
        self._inflight -= 1
        self._checks_open -= 1
        check_tags(found, tags, what)
        self._notify()

    def _release_hold(self) -> bool:
        """Close the least recently suspended idle session's request (its pages stay in the
        prefix tree, droppable). False if there is none."""
        for key, frame in self._idle.items():
            if frame.req is not None and frame.req.state is ReqState.SUSPENDED:
                del self._idle[key]
                self.mgr.close(frame.req)
                frame.req = None
                self.metrics.holds_released += 1
                return True
        self._idle.clear()
        return False

    # == plans in the background ========================================================
    def _start_plan(self, plan, lv: Live, then: TurnState) -> None:
        self._launch(self._plan_proc(plan, lv, then))

    def _plan_proc(self, plan, lv: Live, then: TurnState):
        ok = yield from run_plan(self.rt, self.backend, self.mgr, plan, self.p.refcheck,
                                 self.p.refcheck_disk_writes)
        self._inflight -= 1
        lv.failures = 0 if ok else lv.failures + 1
        give_up = lv.failures >= self.p.max_plan_failures
        if lv.req.state is ReqState.ACTIVE:
            if lv.state is TurnState.ONBOARDING:
                self._on_resumed(lv)
            else:
                lv.state = then
            if give_up:  # its grow failed again and again: stop retrying
                self._remove_running(lv)
                self._abort(lv, self._failure_reason(lv))
            else:
                self._route(lv)
        else:  # the resume did not complete
            self._remove_running(lv)
            if give_up:
                self._fail(lv, self._failure_reason(lv))
            else:  # back to the head of the queue, to retry
                lv.state = TurnState.WAITING
                self._waiting.appendleft(lv)
        self._notify()

    def _failure_reason(self, lv: Live) -> str:
        errors = self.backend.errors
        last = f": {errors[-1]}" if errors else ""
        return f"transfers failed {lv.failures} times in a row{last}"

    def _maybe_evict(self) -> None:
        """Background eviction: keep free GPU slots above the watermark, so grows find room
        without waiting for a copy, and evictions move in few large batches."""
        low = self._evict_low()
        if not low:
            return
        gpu = self.mgr.tiers[0]
        n = min(gpu.index_size(), 2 * low - gpu.free)
        if n <= 0:
            return
        plan = self.mgr.evict(Level.GPU, n)
        if not plan:
            return
        self._evicting = True
        self._launch(self._evict_proc(plan))

    def _evict_low(self) -> int:
        """The watermark in GPU slots if a background eviction is due (free slots below it,
        none running), else 0."""
        w = self.p.gpu_free_watermark
        if w <= 0 or self._evicting or self._evict_off:
            return 0
        gpu = self.mgr.tiers[0]
        low = max(1, int(w * gpu.capacity))
        return low if gpu.free < low else 0

    def _evict_proc(self, plan):
        ok = yield from run_plan(self.rt, self.backend, self.mgr, plan, self.p.refcheck,
                                 self.p.refcheck_disk_writes)
        self._inflight -= 1
        self._evicting = False
        self._evict_failures = 0 if ok else self._evict_failures + 1
        if self._evict_failures >= self.p.max_plan_failures:
            # the tier below keeps failing: stop evicting ahead of demand (grows still
            # evict for themselves, and give up the same way)
            self._evict_off = True
        self._notify()

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
                    self._join(lv)
                elif lv.state is running:
                    self._stalled.append(lv)  # waits for other requests' plans
        budget = self.p.max_batch_tokens - len(self._decoding)
        prefill: list[tuple[Live, int]] = []
        for lv in list(self._prefilling):
            if budget <= 0:
                break
            if lv.state is not running:
                continue
            chunk = min(lv.prefill_left, budget)
            if self._ensure(lv, lv.kv + chunk):
                prefill.append((lv, chunk))
                budget -= chunk
        # a request preempted while the batch was built leaves it
        prefill = [(lv, n) for lv, n in prefill if lv.state is running]
        if not self._decoding and not prefill:
            return None
        return prefill

    # == decoders, advanced lazily ======================================================
    def _sync(self, lv: Live) -> None:
        d = self.S - lv.s0
        lv.kv += d
        lv.gen += d
        lv.s0 = self.S

    def _join(self, lv: Live) -> None:
        """Start decoding ``lv`` from the next step (its pages cover kv + 1 tokens)."""
        lv.s0 = self.S
        req: Request = lv.req
        lv.due = self.S + min(lv.out - lv.gen, req.tokens - lv.kv)
        heapq.heappush(self._due, (lv.due, next(self._seq), lv))
        self._decoding[lv] = None
        self._dsum += lv.kv

    def _leave(self, lv: Live) -> None:
        if lv in self._decoding:
            self._sync(lv)
            del self._decoding[lv]
            self._dsum -= lv.kv
            lv.due = -1

    def _next_due(self) -> int | None:
        due = self._due
        while due and due[0][2].due != due[0][0]:
            heapq.heappop(due)
        return due[0][0] if due else None

    def _process_due(self) -> None:
        """Decoders whose turn is over finish; those that filled their pages must grow."""
        due = self._due
        while due and due[0][0] <= self.S:
            step, _, lv = heapq.heappop(due)
            if lv.due != step:
                continue
            self._leave(lv)
            if lv.gen >= lv.out:
                self._finish(lv)
            else:
                self._stalled.append(lv)

    def _ensure(self, lv: Live, tokens: int) -> bool:
        """Make the request's GPU pages cover ``tokens`` (a block at a time for decode).
        True if it can compute now; otherwise a grow is running, it waits, or it was
        preempted."""
        req: Request = lv.req
        if tokens <= req.tokens:
            return True
        if lv.prefill_left:
            target = tokens
        else:
            target = max(tokens, min(lv.prompt + lv.out - 1, -(-tokens // self.B) * self.B))
        nb = -(-target // self.B)
        extra = [(-1, lv.uid, j) for j in range(len(req.blocks), nb)]
        if self.mgr.extend(req, target, extra):  # free slots, nothing to move: done now
            # (not dirty: taking free slots cannot let a waiting turn in that could not be
            # admitted before, so admission need not run again for it)
            return True
        while True:
            plan = self.mgr.grow(req, target, extra)
            if plan:
                break
            if self._release_hold():
                continue
            victim = self._preempt_victim()
            if victim is None or (victim is lv and len(self._running) == 1):
                if len(self._running) == 1:  # alone and still too big: it can never run
                    self._remove_running(lv)
                    self._abort(lv, f"cannot grow to {target} tokens: KV tiers are full")
                return False  # others are moving pages: try again when they are done
            self._preempt(victim)
            if victim is lv:
                return False
        self._dirty = True
        if plan.batches:  # type: ignore[union-attr]
            lv.state = TurnState.GROWING
            self._start_plan(plan, lv, TurnState.RUNNING)
            return False
        self.mgr.complete(plan)  # type: ignore[arg-type]
        return True

    def _preempt_victim(self) -> Live | None:
        """The most recently admitted request that is running (not moving pages)."""
        best = None
        for lv in self._running:
            if lv.state is TurnState.RUNNING and (best is None or lv.seq > best.seq):
                best = lv
        return best

    def _preempt(self, lv: Live) -> None:
        """Suspend a running request: its pages become held and may move colder; it waits
        at the head of the queue and resumes where it stopped."""
        self._leave(lv)
        if lv in self._prefilling:
            self._prefilling.remove(lv)
        fill = self.mgr.commit(lv.req, lv.kv, final=True)
        if fill.pages:
            self.backend.fill(fill)
        self.mgr.suspend(lv.req)
        self._remove_running(lv)
        lv.state = TurnState.WAITING
        lv.row.preemptions += 1
        self.metrics.preemptions += 1
        self._waiting.appendleft(lv)
        self._dirty = True

    # == stepping =======================================================================
    def _step_ns(self, prefill: list[tuple[Live, int]]) -> int:
        """The next step's duration (ns) at nominal speed."""
        return round(self.compute.step_time_sum([(c, lv.kv) for lv, c in prefill],
                                                len(self._decoding), self._dsum) * NS)

    def _run_ahead(self, prefill: list[tuple[Live, int]], first: int) -> int:
        """Run steps ahead of the runtime's clock while the backend can say when each ends
        and that nothing it runs changes before then: the first step, and after it, when
        nothing can change between them, the identical decode steps up to the next step at
        which a decoder finishes or must grow, or an arrival is due. Returns the steps run
        (0: the first could not be; compute it on the runtime)."""
        if not self._ahead(first):
            return 0
        if prefill or self._dirty or self._stalled or self._evict_low():
            return 1  # (the next boundary admits, grows, or starts a background eviction)
        nxt = self._next_due()
        k = nxt - self.S if nxt is not None else 1
        arr = self._arrivals[0][0] if self._arrivals else None
        cm, nd, dsum = self.compute, len(self._decoding), self._dsum
        n = 1
        while n < k and (arr is None or self.t < arr):
            if not self._ahead(round(cm.decode_step_time(nd, dsum + nd * n) * NS)):
                break
            n += 1
        return n

    def _ahead(self, d: int) -> bool:
        """Run one step of ``d`` ns ahead, asking the backend for its end (the same float a
        ``compute`` from the same start would end at); False if it cannot tell."""
        v = self._vnow
        left = (self.t + d) / NS - v
        end = self.backend.compute_ahead(v, left if left > 0.0 else 0.0, not self._inflight)
        if end is None:
            return False
        if self._inflight:
            self.metrics.ahead_inflight_steps += 1
        self._vnow = end
        t = round(end * NS)
        if t > self.t:
            self.t = t
        return True

    def _advance(self, prefill: list[tuple[Live, int]], k: int) -> None:
        self.S += k
        self._dsum += len(self._decoding) * k
        mgr, be = self.mgr, self.backend
        for lv, n in prefill:
            lv.kv += n
            lv.prefill_left -= n
            lv.row.computed_tokens += n
            fill = mgr.commit(lv.req, min(lv.kv, lv.prompt))
            if fill.pages:
                be.fill(fill)
            if not lv.prefill_left:
                self._prefilling.remove(lv)
                lv.gen = 1
                lv.row.first_token_ns = self.t
                if lv.gen >= lv.out:
                    self._finish(lv)
                else:
                    self._stalled.append(lv)  # decodes once its pages cover one more token
        if self.on_progress is not None and self.metrics.rows:
            self.on_progress(self.t)

    def _finish(self, lv: Live) -> None:
        if lv.row.first_token_ns < 0:
            lv.row.first_token_ns = self.t
        lv.row.done_ns = self.t
        lv.state = TurnState.DONE
        self._remove_running(lv)
        req = lv.req
        fill = self.mgr.commit(req, lv.kv, final=True)
        if fill.pages:
            self.backend.fill(fill)
        if lv.frame.req is req:
            self.mgr.suspend(req)
            self._idle[id(lv.frame)] = lv.frame
        else:
            self.mgr.close(req)
        self._dirty = True
        self._schedule_next(lv.cursor, self.t)

    def _fail(self, lv: Live, why: str) -> None:
        lv.row.failed = why
        lv.state = TurnState.DONE
        self.metrics.requests_failed += 1
        if lv.req is not None and lv.frame.req is not lv.req and lv.req.state is ReqState.SUSPENDED:
            self.mgr.close(lv.req)
        self._dirty = True
        self._schedule_next(lv.cursor, self.t)

    def _abort(self, lv: Live, why: str) -> None:
        self._leave(lv)
        if lv in self._prefilling:
            self._prefilling.remove(lv)
        if lv.req.state is ReqState.ACTIVE:
            if lv.frame.req is lv.req:
                lv.frame.req = None
            self.mgr.close(lv.req)
        self._fail(lv, why)

    def _fail_stuck(self) -> None:
        """Nothing runs, nothing is in flight, nothing will arrive, yet turns wait: the head
        cannot be admitted even with every hold released. Fail it rather than hang."""
        while self._release_hold():
            pass
        self._dirty = True
        lv = self._waiting.popleft()
        self._fail(lv, "could not be admitted: KV tiers full of held pages")

    # == timeline =======================================================================
    def _sample(self, force: bool = False) -> None:
        if not force and self.t < self._next_sample:
            return
        interval = round(self.p.timeline_interval_s * NS)
        self._next_sample = (self.t // interval + 1) * interval
        row = {"t_s": self.t / NS, "running": len(self._running), "waiting": len(self._waiting)}
        for t in self.mgr.tiers:
            row[f"{t.level.name.lower()}_used_slots"] = t.used
        for k, v in self.backend.stats().items():
            if isinstance(v, (int, float)):
                row[k] = v
        self.metrics.timeline.append(row)
