"""Decoding requests, advanced lazily.

A decode step adds one token to every decoding request; doing that one request at a time
would cost O(batch) per step. Instead a global step counter ``S`` runs, each request's kv
and gen are synced to it on demand (``sync``: they grew by ``S - s0`` since), the summed
context is kept as steps go (``advance``), and a heap holds the steps at which a request
needs attention again (it finishes, or its pages must grow): ``pop_due``.
"""

from __future__ import annotations

import heapq
from itertools import count

from kvsim.core import Request
from kvsim.engine.live import Live


class Decoders:
    def __init__(self) -> None:
        self.S = 0                               # decode steps run so far
        self.members: dict[Live, None] = {}      # decoding now, in join order
        self.dsum = 0                            # their contexts (tokens), summed
        self.due: list[tuple[int, int, Live]] = []  # heap of (step, seq, live)
        self._seq = count()

    def sync(self, lv: Live) -> None:
        d = self.S - lv.s0
        lv.kv += d
        lv.gen += d
        lv.s0 = self.S

    def join(self, lv: Live) -> None:
        """Start decoding ``lv`` from the next step (its pages cover kv + 1 tokens)."""
        lv.s0 = self.S
        req: Request = lv.req
        lv.due = self.S + min(lv.out - lv.gen, req.tokens - lv.kv)
        heapq.heappush(self.due, (lv.due, next(self._seq), lv))
        self.members[lv] = None
        self.dsum += lv.kv

    def leave(self, lv: Live) -> None:
        if lv in self.members:
            self.sync(lv)
            del self.members[lv]
            self.dsum -= lv.kv
            lv.due = -1

    def advance(self, k: int) -> None:
        """``k`` decode steps ran."""
        self.S += k
        self.dsum += len(self.members) * k

    def next_due(self) -> int | None:
        """The next step at which a member needs attention, or None."""
        due = self.due
        while due and due[0][2].due != due[0][0]:
            heapq.heappop(due)  # stale: the request left or joined again since
        return due[0][0] if due else None

    def pop_due(self) -> list[Live]:
        """The members whose step has come, synced and removed (they finish or must grow)."""
        due = self.due
        out = []
        while due and due[0][0] <= self.S:
            step, _, lv = heapq.heappop(due)
            if lv.due != step:
                continue
            self.leave(lv)
            out.append(lv)
        return out
