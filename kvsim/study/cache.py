"""The workloads a study's Dask worker loaded last, kept for its next points.

A study's points mostly differ in cache and engine keys over one trace: loading the trace
again for each point (about 0.15 s of CPU for the whole Mooncake conversation trace) is
work the worker has already done. Workloads are immutable, so a worker keeps the last
``size`` it loaded, keyed by what loading depends on (``kvsim.run.workload_key``: the
workload section, the seed, the trace file's path, size and modification time). The cache
is a Dask worker plugin: ``open_client`` registers a fresh one for each study or tune
(replacing the last one on a long-lived cluster), and it lives in the worker process,
not in a module.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from distributed.diagnostics.plugin import WorkerPlugin


class WorkloadCache(WorkerPlugin):
    name = "kvsim-workloads"

    def __init__(self, size: int = 2):
        self.size = size
        self._items: OrderedDict | None = None
        self._lock: threading.Lock | None = None

    def setup(self, worker) -> None:
        self._items = OrderedDict()
        self._lock = threading.Lock()

    def workload(self, cfg):
        """(the workload of ``cfg``, whether it was kept from an earlier point), or
        (None, False) when the trace cannot be read (``prepare_run`` then reports it)."""
        from kvsim.run import load_workload, workload_key

        try:
            key = workload_key(cfg)
        except OSError:
            return None, False
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key], True
        w = load_workload(cfg)
        with self._lock:
            self._items[key] = w
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return w, False


def worker_cache() -> WorkloadCache | None:
    """This Dask worker's cache; None outside a worker or where none is registered."""
    from distributed import get_worker

    try:
        return get_worker().plugins.get(WorkloadCache.name)
    except ValueError:  # not in a worker
        return None
