"""The hw backend's counters and its three optional logs.

- counters: bytes moved by completed transfers per link, transfers and failed ones,
  compute calls and their seconds (``stats``: the names the engine's summary reads);
- ``timing_log``: a dict a batch (t_s, src, dst, pages, bytes, path, seconds, ok; a disk
  batch also io_start_s / io_end_s), seconds of wall time from the start of ``transfer()``
  (its own host time counts: the batched copy call, the slot upload) to the runtime
  seeing the completion;
- ``compute_log``: a row a compute call, [start s, nominal s, seconds it took, seconds
  until the loop saw it done, gpu gap s, host lag s, nominal GEMM s, rank]. took: on a
  GPU its time between two events on the compute stream, in sim seconds; in CPU mode the
  nominal time. seen - took is the time the stream waited before it started, plus the
  loop's lateness in seeing it end. gpu gap: the compute stream's GPU time from the previous compute's end to this
  one's start (None for the first call and in CPU mode). host lag: how far the wall clock
  was past the loop's ``now`` when compute() was called (the engine's host work between
  two steps, and any lateness in seeing the event that woke it); nominal GEMM s: the
  step's nominal seconds x its ``gemm_share`` (0 without a step), the step's kind for
  ``kvsim.tools.fitboost``; rank: the node's rank whose step it was (on a GPU that ranks
  share, what tells one rank's calls from another's);
- ``host_log``: the loop thread's own slow calls, [t s, what, seconds] for each of
  transfer() (its enqueue), fill(), compute() (its launch) and the reading of a GPU
  check's tags that held the loop ``HOST_LOG_MIN_S`` or more.

Invariant: a counter moves only when a transfer or compute completes (never at submit).
"""

from __future__ import annotations

from time import perf_counter as _clock
from typing import Callable

from kvsim.core.plan import Batch
from kvsim.core.spec import Level

HOST_LOG_MIN_S = 0.5e-3  # host_log: the loop thread's calls that held it this long or more

_TRAFFIC = {
    (Level.HOST, Level.GPU): ("host_to_gpu",), (Level.GPU, Level.HOST): ("gpu_to_host",),
    (Level.DISK, Level.HOST): ("disk_read",), (Level.HOST, Level.DISK): ("disk_write",),
    (Level.DISK, Level.GPU): ("disk_read", "host_to_gpu"),
    (Level.GPU, Level.DISK): ("gpu_to_host", "disk_write"),
}


class HwLogs:
    """Counters and logs of one backend. ``path_name(src, dst, path)`` names a batch's
    data path for the timing log."""

    def __init__(self, runtime, page_bytes: int, path_name: Callable, timing_log: list | None = None,
                 compute_log: list | None = None, host_log: list | None = None, rank: int = 0):
        self.runtime = runtime
        self.rank = rank  # (compute_log's last column)
        self.page_bytes = page_bytes
        self.path_name = path_name
        self.timing_log = timing_log
        self.compute_log = compute_log
        self.host_log = host_log
        self.last_compute_end = None  # (compute_log) the last compute's end event
        self._compute = {"compute_calls": 0, "compute_s": 0.0, "compute_nominal_s": 0.0}
        self._bytes = {"host_to_gpu": 0, "gpu_to_host": 0, "disk_read": 0, "disk_write": 0}
        self._counts = {"transfers": 0, "failed_transfers": 0}

    def account(self, batch: Batch, ev, path, t0: float, io: list) -> None:
        """Count ``batch`` (and log it) when ``ev`` completes; ``t0``: when transfer() began;
        ``io``: a disk batch's jobs' (start, end), filled in by then."""
        sim0 = self.runtime.now
        log = self.timing_log
        nbytes = int(batch.pages) * self.page_bytes

        def done(e):
            ok = bool(e.value) if e.ok else False
            self._counts["transfers"] += 1
            if not ok:
                self._counts["failed_transfers"] += 1
            else:
                for k in _TRAFFIC.get((batch.src, batch.dst), ()):
                    self._bytes[k] += nbytes
            if log is not None:
                row = {"t_s": sim0, "src": batch.src.name.lower(), "dst": batch.dst.name.lower(),
                       "pages": int(batch.pages), "bytes": nbytes,
                       "path": self.path_name(batch.src, batch.dst, path),
                       "seconds": _clock() - t0, "ok": ok}
                if io:  # a disk batch: when its first piece started and its last ended
                    row["io_start_s"] = min(a for a, _ in io) - t0
                    row["io_end_s"] = max(b for _, b in io) - t0
                log.append(row)

        if ev.callbacks is None:
            done(ev)
        else:
            ev.callbacks.append(done)

    def count_compute(self, t0: float, nominal_s: float, took_s: float, gap=None, lag: float = 0.0,
                      gemm_s: float = 0.0) -> None:
        c = self._compute
        c["compute_calls"] += 1
        c["compute_s"] += took_s
        c["compute_nominal_s"] += nominal_s
        if self.compute_log is not None:
            self.compute_log.append([t0, nominal_s, took_s, self.runtime.now - t0,
                                     gap() if gap is not None else None, lag, gemm_s, self.rank])

    def timed(self, fn, what: str):
        """``fn`` whose calls log their host time in ``host_log`` (as ``host_time``)."""
        def timed():
            t0 = _clock()
            out = fn()
            self.host_time(what, t0)
            return out
        return timed

    def host_time(self, what: str, t0: float) -> None:
        dt = _clock() - t0
        if dt >= HOST_LOG_MIN_S:
            self.host_log.append([self.runtime.now, what, dt])  # type: ignore[union-attr]

    def stats(self) -> dict:
        """Bytes moved by completed transfers, transfer and compute counts."""
        out: dict = dict(self._bytes)
        out.update(self._counts)
        c = self._compute
        out["compute_calls"] = c["compute_calls"]
        out["compute_s"] = c["compute_s"]
        out["compute_stretch_s"] = c["compute_s"] - c["compute_nominal_s"]
        return out


def transfer_path_name(src: Level, dst: Level, copy_path: str) -> str:
    """A batch's data path as both backends name it: ``copy_engine`` / ``sm_kernel`` for
    GPU <-> host, ``disk`` for host <-> disk, ``disk+<copy path>`` for GPU <-> disk (staged),
    ``gpu_copy`` for GPU -> GPU."""
    pair = {Level(src), Level(dst)}
    if pair == {Level.GPU}:
        return "gpu_copy"
    if pair == {Level.GPU, Level.HOST}:
        return copy_path
    if pair == {Level.HOST, Level.DISK}:
        return "disk"
    return f"disk+{copy_path}"
