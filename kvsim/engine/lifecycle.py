"""A turn's lifecycle in the engine, below its step loop (``Engine(Lifecycle)``).

Admission: a waiting turn is prepared (its prompt matched against the prefix tree; the
session's held request keeps its common prefix) and resumed when the GPU pages it will
hold at its end fit beside the admitted turns'; a prefix found in host or disk is
onboarded by a plan that runs in the background. Growing: a request's GPU pages are
extended a block at a time (a grow plan evicts others when no slot is free). Ending: a
finished turn commits its pages and its session's next turn is queued.

Between the turns of a session its request is suspended: its pages are held (evictable
to colder tiers, never dropped) and the next turn finds them by prefix match. When KV is
short, idle sessions' holds are released (least recently suspended first), then the most
recently admitted running request is preempted (suspended; its pages may move to host).
"""

from __future__ import annotations

from typing import Callable

from kvsim.backend import Backend, Runtime
from kvsim.engine.compute import ComputeModel
from kvsim.core import Level, RefusalReason, Request, TierManager
from kvsim.core.types import ReqState
from kvsim.engine.statemoves import StateMoves
from kvsim.engine.live import EngineParams, Live, TurnState
from kvsim.engine.stages import check_tags, run_plan, tags_equal
from kvsim.engine.sessions import Cursor, Frame


class Lifecycle(StateMoves):
    def __init__(self, rt: Runtime, backend: Backend, mgr: TierManager, compute: ComputeModel,
                 params: EngineParams, *, on_progress: Callable[[int], None] | None = None,
                 on_resume: Callable[[int], None] | None = None):
        """See ``LifeState``."""
        super().__init__(rt, backend, mgr, compute, params, on_progress=on_progress, on_resume=on_resume)
        if mgr.wt_take_back:
            self._waits = self._takeback_waits

    def _schedule_next(self, cur: Cursor, done_ns: int) -> None:
        """Queue the session's next turn; close finished (sub-)sessions' requests."""
        for frame in self.arrivals.schedule_next(cur, done_ns):
            self._release_frame(frame)

    def _release_frame(self, frame: Frame) -> None:
        self._idle.pop(id(frame), None)
        req = frame.req
        frame.req = None
        if req is not None and req.state is not ReqState.CLOSED:
            self.mgr.close(req)
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
            full = gpu.capacity
            if need > full:
                self._waiting.popleft()
                self._fail(lv, f"needs {need} GPU pages; the GPU tier has {full}")
                continue
            if self._reserved_pages + self._state_leaving + need > full:
                return  # admitted requests (and states moving out) need that room: wait
            if not self._take_state(lv):
                return  # GPU pages are being evicted to make room for its state
            plan = mgr.resume(lv.req)
            if not plan:
                self._state_back(lv)
                if plan.reason is RefusalReason.NO_ROOM and self._release_hold():  # type: ignore[union-attr]
                    continue
                return
            self._waiting.popleft()
            lv.seq = next(self._admit_seq)
            if lv.row.admitted_ns < 0:
                lv.row.admitted_ns = self.t
            self._add_running(lv)
            self._state_admitted(lv)
            self._charge(plan, 0)
            state = lv.state_plan  # its state's way back to GPU, run first
            if plan.batches or state is not None:  # type: ignore[union-attr]
                lv.state = TurnState.ONBOARDING
                lv.row.onboard_bytes += plan.nbytes + (state.nbytes if state else 0)  # type: ignore[union-attr]
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
        """GPU pages the turn holds when it ends (one more for a copy-on-write), and its
        fixed state's (a windowed or recurrent model's, ``state_pages``)."""
        return -(-(lv.prompt + lv.out - 1) // self.B) + 1 + self.p.state_pages

    def _add_running(self, lv: Live) -> None:
        """Admit: the GPU pages the turn will hold at its end are counted against the GPU
        tier (admission keeps the sum within it, so admitted turns grow without preempting
        each other)."""
        self._running.append(lv)
        self._reserved_pages += self._final_pages(lv)

    def _remove_running(self, lv: Live) -> None:
        self._running.remove(lv)
        self._reserved_pages -= self._final_pages(lv)
        self._give_state(lv)

    def _take_state(self, lv: Live) -> bool:
        """Put the request's state (``state_pages``) on GPU while it runs (docs/models.md;
        ``StateMoves``); False while it waits: its state still moving to host, or GPU pages
        evicted to free the slots. Where none can be and nothing runs to free any, it runs
        without, its state only counted at admission."""
        mgr, gpu, sp = self.mgr, self.mgr.tiers[0], self.p.state_pages
        if not sp:
            return True
        if mgr.state_moving(lv.req):
            return False
        if sp > gpu.free:
            plan = None if self._evicting else mgr.evict(Level.GPU, sp - gpu.free)
            if plan:
                self._evicting = True
                self._launch(self._evict_proc(plan))
            elif not self._evicting and self._release_hold():
                return self._take_state(lv)
            return not self._evicting and not self._running and not self._inflight
        return self._state_in(lv) == 1

    def _prepare(self, lv: Live) -> None:
        """Match the turn's prompt: the session's held request keeps its common prefix."""
        mgr = self.mgr
        frame = lv.frame
        if frame.req is not None and frame.req.state is ReqState.SUSPENDED:
            req = frame.req
            mgr.prepare(req, lv.blocks, lv.prompt)
        else:
            t = lv.turn  # the workload's priorities (none given: 0, as the manager's default)
            req = mgr.create(frame.session.scope, lv.blocks, lv.prompt, t.priority or 0,
                             t.prefix_tokens // self.B, t.prefix_priority or 0)
            if self.p.hold_sessions and len(frame.session.items) > 1:
                frame.req = req
        lv.req = req
        hits = req.hit_by_level
        lv.row.hit_gpu, lv.row.hit_host, lv.row.hit_disk = hits[0], hits[1], hits[2]
        cached = req.tokens
        if self.remote is not None:  # the blocks after it found in the remote tier
            self.remote.match(self, lv)
        lv.prefill_left = max(1, lv.prompt - cached)
        lv.kv = lv.prompt - lv.prefill_left
        d = lv.kv if lv.kv < lv.queued else lv.queued  # (found cached: not queued work)
        lv.queued -= d
        self.queued_tokens -= d
        self._load_moved()

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
        ok = True
        state, lv.state_plan = lv.state_plan, None
        if state is not None:  # its state's way back to GPU first (StateMoves)
            ok = yield from run_plan(self.rt, self.backend, self.mgr, state, self.p.refcheck,
                                     self.p.refcheck_disk_writes, self._waits)
            self.metrics.state_restored += ok
        if ok:
            ok = yield from run_plan(self.rt, self.backend, self.mgr, plan, self.p.refcheck,
                                     self.p.refcheck_disk_writes, self._waits)
        else:
            self.mgr.complete(plan, False)
        self._inflight -= 1
        self._write_through()
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
            self._state_out(lv, True)
            if give_up:
                self._fail(lv, self._failure_reason(lv))
            else:  # back to the head of the queue, to retry
                lv.state = TurnState.WAITING
                self._waiting.appendleft(lv)
        self._notify()

    def _write_through(self) -> None:
        """With write-through on: start the background copy to disk of the pages evicted
        GPU -> host since the last one (``TierManager.write_through``)."""
        if not self.mgr.write_through_on:
            return
        plan = self.mgr.write_through()
        if plan is not None:
            self._charge(plan, 0)
            if self._waits is not None:
                self._wt_done[plan.pid] = (plan.batches[0], self.rt.event())
            self._launch(self._write_through_proc(plan))

    def _takeback_waits(self, batch) -> list:
        """(write-through batch, its plan's end) for each write a TAKEBACK batch waits for."""
        return [self._wt_done[pid] for pid in self.mgr.takeback_waits(batch) if pid in self._wt_done]

    def _write_through_proc(self, plan):
        """A background write: nobody waits for it (but an eviction that takes back one of
        its pending copies); a failed one only loses its copies."""
        ok = yield from run_plan(self.rt, self.backend, self.mgr, plan, self.p.refcheck,
                                 self.p.refcheck_disk_writes)
        done = self._wt_done.pop(plan.pid, None)
        if done is not None:
            done[1].succeed(ok)
        self._inflight -= 1
        self._write_through()  # pages that waited for the in-flight cap
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
        self._charge(plan, 0)
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
                                 self.p.refcheck_disk_writes, self._waits)
        self._inflight -= 1
        self._write_through()
        self._evicting = False
        self._evict_failures = 0 if ok else self._evict_failures + 1
        if self._evict_failures >= self.p.max_plan_failures:
            # the tier below keeps failing: stop evicting ahead of demand (grows still
            # evict for themselves, and give up the same way)
            self._evict_off = True
        self._notify()

    # == growing and preempting =========================================================
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
            self._charge(None, len(extra))
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
        self._charge(plan, len(extra))
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
        self.dec.leave(lv)
        self._load_moved()
        if lv in self._prefilling:
            self._prefilling.remove(lv)
        fill = self.mgr.commit(lv.req, lv.kv, final=True)
        if fill.pages:
            self.backend.fill(fill)
        self.mgr.suspend(lv.req)
        self._remove_running(lv)
        self._state_out(lv, True)
        lv.state = TurnState.WAITING
        lv.row.preemptions += 1
        self.metrics.preemptions += 1
        self._waiting.appendleft(lv)
        self._dirty = True

    # == ending a turn ==================================================================
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
        if self.remote is not None:
            self.remote.finished(self, req)
        if lv.frame.req is req:
            self.mgr.suspend(req)
            self._idle[id(lv.frame)] = lv.frame
        else:
            self.mgr.close(req)
        self._dirty = True
        self._schedule_next(lv.cursor, self.t)
        self._state_out(lv, True)  # (after: a session that ended closed its request)

    def _fail(self, lv: Live, why: str) -> None:
        lv.row.failed = why
        lv.state = TurnState.DONE
        self.queued_tokens -= lv.queued
        self._load_moved()
        lv.queued = 0
        self.metrics.requests_failed += 1
        if lv.req is not None and lv.frame.req is not lv.req and lv.req.state is ReqState.SUSPENDED:
            self.mgr.close(lv.req)
        self._dirty = True
        self._schedule_next(lv.cursor, self.t)

    def _abort(self, lv: Live, why: str) -> None:
        self.dec.leave(lv)
        self._load_moved()
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
