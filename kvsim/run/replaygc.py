"""The cyclic garbage collector around a replay: tuned for it, then restored. Changes
timing only, never results (nothing in kvsim has a finalizer or reads the collector).

A replay allocates short-lived events, plans and pages by the million; what lives through
it (the loaded trace, the configuration, then the instances once built) is made before the
serving loop and changes little. ``collector_for_replay`` covers the whole replay, from
building the instances to summing their metrics: young collections every ``young`` net
allocations rather than every 700 (each older one after ``older`` collections of the one
below, not 10), what existed before the replay frozen (no collection walks it).
``freeze_built`` freezes what has been made since (the cluster just built) before the
serving loop starts.

Why the whole replay: a full collection walks every tracked object it does not skip, and
the heap grows with the instances. Counted with ``gc.callbacks`` on the compiled build,
the whole Mooncake trace x8 on 64 instances (``benchmarks/cluster_speed.py --apart``,
2026-12-03): tuned around the serving loop only, ``replay()`` ran 4 full collections
(1.8 s; with the trace's first 4,000 requests 2: one as the 64 instances were built, one
over the whole unfrozen heap as their metrics were summed) and 1,386 young ones (4.2 s),
at 8 instances none and 169; tuned from start to end, with the built cluster frozen, none
and 111 (3.8 s), at 8 instances none and 10. The defaults come back when the replay
returns, by when its instances are garbage (freed by reference counts).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["collector_for_replay", "freeze_built"]


@contextmanager
def collector_for_replay(young: int = 20_000, older: int = 20) -> Iterator[None]:
    """Run a replay with the collector tuned for it (module docstring), then restore it."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(young, older, older)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def freeze_built() -> None:
    """Move what is tracked now (the instances just built) out of every collection until
    the replay ends (``collector_for_replay`` unfreezes it)."""
    gc.freeze()
