"""The state a turn's lifecycle keeps (``Lifecycle(LifeState)``): the engine's queues,
counts and flags, set up once; the lifecycle's methods (kvsim.engine.lifecycle) act on
them. Kept apart so that each module holds one job."""

from __future__ import annotations

from collections import deque
from itertools import count
from typing import Any, Callable

from kvsim.backend import Backend, Runtime
from kvsim.core import TierManager
from kvsim.engine.arrivals import Arrivals
from kvsim.engine.compute import ComputeModel
from kvsim.engine.decoders import Decoders
from kvsim.engine.live import EngineParams, Live
from kvsim.engine.managercost import cost_on
from kvsim.engine.metrics import Metrics
from kvsim.engine.sessions import Frame


class LifeState:
    def __init__(self, rt: Runtime, backend: Backend, mgr: TierManager, compute: ComputeModel,
                 params: EngineParams, *, on_progress: Callable[[int], None] | None = None,
                 on_resume: Callable[[int], None] | None = None):
        """``compute.step_work(prefill: [(new_tokens, context_before)], n_decode,
        decode_context_sum)`` gives a step's work and seconds, ``compute.decode_work(n_decode,
        decode_context_sum)`` the same for a step without prefill
        (kvsim.engine.compute.ComputeModel; typed, so the compiled build calls it natively).
        ``on_resume(pages)``: told of every resumed request, with the GPU pages it holds
        (before its pages are checked)."""
        self.rt = rt
        self.backend = backend
        self.mgr = mgr
        self.compute = compute
        self.p = params
        self.B = mgr.tokens_per_block
        self.metrics = Metrics()
        self.metrics.state_on = params.state_pages > 0
        self.on_progress = on_progress
        self.on_resume = on_resume
        self.t = 0                                   # engine clock, ns
        self.block_tokens = mgr.tokens_per_block     # the workload's hash block (load sets it)
        self.arrivals = Arrivals()                   # turns not yet arrived
        self._waiting: deque[Live] = deque()
        self._running: list[Live] = []               # admitted: onboarding/running/growing
        self._reserved_pages = 0                     # their final GPU pages, summed
        self._state_held = 0                         # GPU slots their state takes (below)
        self._with_state: set[int] = set()           # uids of the requests holding it
        self._state_leaving = 0                      # GPU slots of states moving to host
        self.dec = Decoders()                        # decoding requests, advanced lazily
        self._stalled: list[Live] = []               # decoders that must grow before a step
        self._prefilling: list[Live] = []            # admitted, prompt not fully computed
        self._idle: dict[int, Frame] = {}            # suspended sessions between turns
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
        self.cluster: Any = None  # a cluster's hooks (kvsim.run.cluster), or None: alone
        self.remote: Any = None   # the remote tier's port (kvsim.engine.remoteport), or None
        # told whenever queue_load's prefill tokens or decode blocks may have changed (a
        # cluster's load order, kvsim.run.routeindex), or None: alone
        self.on_load: Callable[[], None] | None = None
        self.queued_tokens = 0                       # prompt tokens queued, not yet computed or found
        self._handed: dict[int, None] = {}           # turns a router handed it, not yet released
        # write_through_take_back: each write-through in flight, by plan id: its batch and
        # the event its plan's completion triggers (an eviction taking back a pending
        # copy promotes the batch's queued pieces and waits for the event)
        self._wt_done: dict[int, tuple[Any, Any]] = {}
        self._waits: Any = None  # Lifecycle._takeback_waits where write-through takes back
        self._cost_on = cost_on(params)  # engine.manager_cost: bookkeeping owed the executor
        self._owed_ns = 0

    def _load_moved(self) -> None:
        """Tell a cluster's router that this engine's load may have moved."""
        if self.on_load is not None:
            self.on_load()
