"""Stream order on the GPU between fills, checks and copies (hw backend, GPU mode).

Invariants:
- ``fill`` happens-before every later transfer and ``read_tags``: a stream that copies
  waits on the last fill's event (once per stream and fill; stream order keeps the rest);
- a write into GPU slots that a check the loop has not yet seen finish still reads (a
  resumed request's pages, which the engine does not wait for) waits for the last check
  enqueued; writes into other slots do not wait;
- a fill's upload buffers live until the GPU has passed the fill's kernel.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np


class StreamOrder:
    """The fill and check events streams must wait on. ``gpu_slots``: the GPU tier's
    slot count; ``host_log`` (optional) gets a row when a stream waits for a check."""

    def __init__(self, runtime, streams: dict, gpu_slots: int, host_log: list | None = None):
        self.runtime = runtime
        self.streams = streams
        self.host_log = host_log
        self.fill_event = None
        self._fill_keep: collections.deque = collections.deque()  # (event, upload buffers) of fills the GPU may not have run
        self._fill_waited: dict[int, Any] = {}  # stream ptr -> the fill event it last waited on
        self.check_event = None  # the last GPU-page check enqueued (all on the misc stream)
        self.check_waited: dict[int, Any] = {}
        # GPU slots under a check the loop has not yet seen finish (a count a slot: checks
        # of a shared prefix overlap). Only a write into one of these waits for the checks.
        self.checking = np.zeros(gpu_slots, dtype=np.int32)

    def wait_fill(self, stream) -> None:
        ev = self.fill_event
        if ev is not None and self._fill_waited.get(stream.ptr) is not ev:
            stream.wait_event(ev)  # once per stream and fill: stream order keeps it after
            self._fill_waited[stream.ptr] = ev

    def wait_checks(self, stream, slots) -> None:
        """Before ``stream`` writes into GPU ``slots``: if a check the loop has not seen
        finish covers one of them, wait for the last check enqueued, so it reads them first."""
        ev = self.check_event
        if ev is not None and self.check_waited.get(stream.ptr) is not ev and self.checking[slots].any():
            stream.wait_event(ev)
            self.check_waited[stream.ptr] = ev
            if self.host_log is not None:
                name = next((k for k, v in self.streams.items() if v is stream), "other")
                self.host_log.append([self.runtime.now, f"{name} stream waits for a check", 0.0])

    def filled(self, ev, keep) -> None:
        """A fill was enqueued, ``ev`` recorded after it; ``keep`` lives until it passed."""
        self.fill_event = ev
        kept = self._fill_keep
        while kept and kept[0][0].done:
            kept.popleft()
        kept.append((ev, keep))
