"""A turn inside the engine (``Live``), the states it passes through, and the engine's
parameters."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from kvsim.engine.metrics import Row
from kvsim.engine.sessions import Cursor, Frame
from kvsim.workload import Turn


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
    host_serve_slots: int = 0         # host slots that must exist before serving starts
    #                                   (a host tier filling: its first unit, or all of it)
    state_pages: int = 0              # GPU pages a running request's fixed state takes: its
    #                                   sliding layers' window, its recurrent state
    state_recurrent: bool = False     # a turn without its state recomputes its whole cached
    state_window: int = 0             # prefix (recurrent), or its last state_window tokens
    # the manager's bookkeeping a plan (engine.manager_cost), seconds: a plan, a new GPU
    # page, a moved page; statistics (0 off, 1 a commit a page, 2 a commit a batch): a
    # page's share and a commit's
    mgr_per_plan_s: float = 0.0
    mgr_per_page_s: float = 0.0
    mgr_per_moved_page_s: float = 0.0
    mgr_stats: int = 0
    mgr_stats_per_page_s: float = 0.0
    mgr_stats_per_commit_s: float = 0.0


class Live:
    """One turn inside the engine."""

    __slots__ = ("row", "turn", "frame", "cursor", "req", "blocks", "prompt", "out",
                 "prefill_left", "kv", "gen", "state", "seq", "uid", "s0", "due", "failures",
                 "queued", "remote", "state_plan", "fresh_state")

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
        self.queued = turn.input_tokens  # of its prompt: not yet computed nor found cached
        self.remote = 0        # of its prompt: found in the remote tier, not yet fetched
        self.state_plan: Any = None  # the plan bringing its fixed state back to GPU (StateMoves)
        self.fresh_state = False     # its state was taken fresh: a cached prefix is recomputed
