"""When a request's fixed state moves (``Lifecycle(StateMoves)``): the engine's side of
``kvsim.core.statepages``, for a model whose requests keep a sliding window or a
recurrent state (``EngineParams.state_pages`` > 0; with 0 nothing here runs).

- Admission: the state goes on GPU (``_state_in``) before the turn's pages are resumed:
  its stashed state comes back host -> GPU in a plan the turn's onboarding runs first
  (its TTFT pays it, its ``onboard_bytes`` count it); without one (a new request, its
  state was dropped, or it stands for a position the turn does not resume from:
  ``_state_fits``) fresh slots are taken and a cached prefix is of no use to the
  stateful layers: the turn recomputes it (``_recompute``).
- Suspend (a turn ends with its session held, or a preemption): the state is written and
  moved GPU -> host in the background (``_state_out``), occupying host slots until the
  next turn. No host room, or a failed move: the state is dropped.
- A turn that ends otherwise (closed, failed, aborted): its state is freed.

Also here, the small helpers every plan's launch uses (``_launch``, ``_notify``,
``_charge``).
"""

from __future__ import annotations

from typing import Any

from kvsim.core import Level, RefusalReason
from kvsim.core.types import ReqState
from kvsim.engine.lifestate import LifeState
from kvsim.engine.live import Live, TurnState
from kvsim.engine.managercost import plan_cost_s
from kvsim.engine.metrics import NS
from kvsim.engine.stages import run_plan


class StateMoves(LifeState):
    def _launch(self, proc) -> None:
        """Start a plan's process once the runtime's clock has caught up with the engine's
        (at this step boundary, before the step's compute)."""
        self._inflight += 1
        self._deferred.append(proc)

    def _notify(self) -> None:
        self._dirty = True
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _charge(self, plan: Any, new: int) -> None:
        """engine.manager_cost: a plan's bookkeeping (None: ``new`` pages taken from free
        slots, no plan), owed the executor: the next step starts after it."""
        if self._cost_on:
            ns = round(plan_cost_s(self.p, [b.pages for b in plan.batches] if plan else [], new) * NS)
            self._owed_ns += ns
            self.metrics.manager_ns.append(ns)

    # == the state in ===================================================================
    def _state_in(self, lv: Live) -> int:
        """Put the turn's state on GPU (free GPU slots: the caller made room). 1: done (a
        restore, if any, waits in ``lv.state_plan``); 0: its state is still moving out,
        wait; -1: not enough free slots."""
        mgr, sp = self.mgr, self.p.state_pages
        req = lv.req
        if mgr.state_level(req) is Level.HOST and not self._state_fits(lv):
            mgr.drop_state(req)  # of no use to this turn: not brought back
            self.metrics.state_stale += 1
        had = mgr.state_level(req) is not None
        plan = mgr.take_state(req, sp)
        if not plan:
            return 0 if plan.reason is RefusalReason.BUSY else -1  # type: ignore[union-attr]
        self._state_held += sp
        self._with_state.add(lv.uid)
        if plan.batches:  # type: ignore[union-attr]
            self._charge(plan, 0)
            lv.state_plan = plan
        else:
            mgr.complete(plan)  # type: ignore[arg-type]
            self._charge(None, sp)
        lv.fresh_state = not had
        return 1

    def _state_fits(self, lv: Live) -> bool:
        """Whether the request's stashed state is the one the turn resumes from: the state
        stands for the position its last turn reached, the end of that turn's prompt (its
        output blocks are its own: a later prompt never matches them), and the turn resumes
        where its cached prefix ends; it fits if that prefix reaches the last block boundary
        before that position (of the trace's hash blocks where they are the larger: a
        partial one is hashed anew when a prompt extends it), that is, if the prompt
        extends the last one; not if it diverged earlier (a context compacted or edited).
        A preempted turn resumes where it stopped."""
        frame = lv.frame
        if frame.req is not lv.req or frame.state_at < 0:
            return True  # (a preempted turn's own request)
        g = self.block_tokens if self.block_tokens > self.B else self.B
        return lv.kv >= frame.state_at // g * g

    def _state_back(self, lv: Live) -> None:
        """Admission did not go through after ``_state_in``: undo it (a restore not run is
        rolled back, the state stays on host; fresh slots are freed)."""
        self._give_state(lv)
        plan = lv.state_plan
        if plan is not None:
            lv.state_plan = None
            self.mgr.complete(plan, False)
        elif self.mgr.state_level(lv.req) is Level.GPU:
            self.mgr.drop_state(lv.req)

    def _state_admitted(self, lv: Live) -> None:
        """The turn is admitted: without a state of its own, a cached prefix must be
        recomputed for the stateful layers."""
        if lv.fresh_state:
            lv.fresh_state = False
            self._recompute(lv)

    def _recompute(self, lv: Live) -> None:
        """Tokens of a cached prefix that a turn without its state computes again: all of
        them for a recurrent model (its state at the prefix's end is a function of every
        token before it), the last ``window`` for a windowed one (its sliding layers' KV
        of them); the full-context pages found stay in use (computed again, not moved)."""
        r = lv.kv if self.p.state_recurrent else min(lv.kv, self.p.state_window)
        if r <= 0:
            return
        lv.kv -= r
        lv.prefill_left += r
        lv.queued += r
        self.queued_tokens += r
        self._load_moved()
        self.metrics.state_recomputed_tokens += r

    def _give_state(self, lv: Live) -> None:
        """The turn stops running: its state no longer counts against the running ones."""
        if lv.uid in self._with_state:
            self._with_state.discard(lv.uid)
            self._state_held -= self.p.state_pages

    # == the state out ==================================================================
    def _state_out(self, lv: Live, keep: bool) -> None:
        """The turn stopped running. ``keep`` (its request is suspended, held for the next
        turn): its state is written and moved to host, or dropped where there is no host
        room; else it is freed now (a closed request's state is freed by the core)."""
        mgr, req = self.mgr, lv.req
        if req is None or req.state is ReqState.CLOSED or mgr.state_level(req) is not Level.GPU:
            return
        if not keep:
            mgr.drop_state(req)
            return
        if lv.frame.req is req:  # (where the next turn will resume: _state_fits)
            lv.frame.state_at = lv.prompt if lv.state is TurnState.DONE else lv.kv
        fill = mgr.state_fill(req)
        self.backend.fill(fill)
        plan = mgr.stash_state(req)
        if not plan:
            mgr.drop_state(req)
            self.metrics.state_dropped += 1
            return
        self._charge(plan, 0)
        self.metrics.state_stashed += 1
        self._state_leaving += self.p.state_pages  # (GPU slots admission cannot give yet)
        self._launch(self._stash_proc(plan, req))

    def _stash_proc(self, plan, req):
        ok = yield from run_plan(self.rt, self.backend, self.mgr, plan, self.p.refcheck,
                                 self.p.refcheck_disk_writes, self._waits)
        self._inflight -= 1
        self._state_leaving -= self.p.state_pages
        if not ok and req.state is not ReqState.CLOSED and self.mgr.state_level(req) is Level.GPU:
            self.mgr.drop_state(req)  # (its move failed: the GPU slots go to the running)
            self.metrics.state_dropped += 1
        self._notify()
