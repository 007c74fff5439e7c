"""When turns arrive: sessions start (open loop at their start times, closed loop at given
times or a fixed number at a time), and each next turn is due ``think_s`` after its
session's previous item completed (or at a pinned time, for a replay on another run's
arrivals). A heap of due turns ordered by (time, sequence)."""

from __future__ import annotations

import heapq
from collections import deque
from itertools import count
from typing import Any, Iterable

from kvsim.engine.metrics import NS
from kvsim.engine.sessions import Cursor, Frame
from kvsim.workload import Session, Turn, Workload


class Arrivals:
    def __init__(self) -> None:
        self.heap: list[tuple[int, int, Cursor, Frame, Turn]] = []  # (ns, seq, cursor, frame, turn)
        self._seq = count()
        self._pending: deque[Session] = deque()  # closed loop by concurrency: not started yet
        self._pinned: dict[tuple[str, int], int] | None = None  # (session, turn) -> ns
        # a cluster's: told (the time, ns) when a session ends, instead of starting a
        # pending one here (the cluster's own arrivals hold those)
        self.on_end: Any = None

    def pin(self, arrivals_s: dict[tuple[str, int], float]) -> None:
        """Release each listed turn (keyed by session and turn) at the given time, or when
        its session's previous item completes if that is later."""
        self._pinned = {(str(k[0]), int(k[1])): round(v * NS) for k, v in arrivals_s.items()}

    def load(self, workload: Workload, start_times_s: Iterable[float] | None) -> None:
        """Open loop: sessions start at their start_s (or their first turn's arrival_s).
        Closed loop: at ``start_times_s``, or ``workload.concurrency`` sessions at a time
        when the start policy is 'concurrency'."""
        sessions = list(workload.sessions)
        if workload.closed_loop and workload.start == "concurrency":
            self._pending.extend(sessions)
            for _ in range(min(max(1, workload.concurrency), len(sessions))):
                self._start(self._pending.popleft(), 0)
            return
        if workload.closed_loop:
            times = list(start_times_s or [])
            if len(times) < len(sessions):
                raise ValueError(f"{len(sessions)} sessions but {len(times)} start times")
            for s, t in zip(sessions, times):
                self._start(s, round(t * NS))
            return
        for s in sessions:
            first = s.items[0]
            at = s.start_s if s.start_s is not None else (first.arrival_s or 0.0)
            self._start(s, round(at * NS))

    def _start(self, session: Session, at_ns: int) -> list[Frame]:
        cur = Cursor(session, sid=next(self._seq))
        return self.schedule_next(cur, at_ns, first=True)

    def schedule_next(self, cur: Cursor, done_ns: int, first: bool = False) -> list[Frame]:
        """Queue the session's next turn ``think_s`` after ``done_ns``. Returns the frames
        of the (sub-)sessions that finished on the way (their requests are to be closed)."""
        finished: list[Frame] = []
        while True:
            nxt = cur.next_turn()
            if nxt is not None:
                frame, turn = nxt
                at = done_ns if first else done_ns + round(turn.think_s * NS)
                if self._pinned is not None:
                    pin = self._pinned.get((frame.session.sid, cur.turn_index))
                    if pin is not None:
                        at = max(done_ns, pin)
                heapq.heappush(self.heap, (at, next(self._seq), cur, frame, turn))
                return finished
            finished.append(cur.pop())
            if not cur.stack:
                if self.on_end is not None:
                    self.on_end(done_ns)
                elif self._pending:
                    finished += self._start(self._pending.popleft(), done_ns)
                return finished

    def push(self, at_ns: int, cur: Cursor, frame: Frame, turn: Turn) -> None:
        """Queue a turn due at ``at_ns`` (a cluster's router hands it over)."""
        heapq.heappush(self.heap, (at_ns, next(self._seq), cur, frame, turn))

    def start_next(self, at_ns: int) -> bool:
        """Start the next session not yet started (a closed loop by concurrency) at
        ``at_ns``; False if none is left."""
        if not self._pending:
            return False
        self._start(self._pending.popleft(), at_ns)
        return True

    def next_ns(self) -> int | None:
        """When the next turn is due, or None if none is queued."""
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now_ns: int) -> list[tuple[int, Cursor, Frame, Turn]]:
        """The turns due at or before ``now_ns``, in order: (arrival ns, cursor, frame, turn)."""
        heap = self.heap
        out = []
        while heap and heap[0][0] <= now_ns:
            at, _, cur, frame, turn = heapq.heappop(heap)
            out.append((at, cur, frame, turn))
        return out
