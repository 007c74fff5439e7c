"""A batch's slots as the hw backend's copies take them: two int64 arrays, checked against
the backend's tiers and page size before anything is enqueued.

Invariant: nothing is enqueued for a batch this refuses; the error names what is wrong
(its page size, its slot counts, a tier this backend lacks, a slot out of a tier's range).
"""

from __future__ import annotations

import numpy as np

from kvsim.core.plan import Batch
from kvsim.core.spec import Level

_SMALL = 32  # batches of at most this many pages: slot bounds checked in Python, not numpy


def batch_slots(batch: Batch, page_bytes: int, slots: dict[Level, int]) -> tuple[np.ndarray, np.ndarray]:
    """``batch``'s source and destination slots, for a backend of ``page_bytes`` pages and
    ``slots[level]`` slots a tier: ValueError or IndexError if it cannot take them."""
    if batch.page_bytes != page_bytes:
        raise ValueError(f"batch.page_bytes: got {batch.page_bytes}; this backend's pages "
                         f"are {page_bytes} bytes")
    src = np.asarray(batch.src_slots, dtype=np.int64)
    dst = np.asarray(batch.dst_slots, dtype=np.int64)
    if src.shape != dst.shape:
        raise ValueError(f"batch: {src.shape[0]} source slots but {dst.shape[0]} destination slots")
    small = src.size <= _SMALL
    for lv, s in ((batch.src, src), (batch.dst, dst)):
        n = slots.get(lv)
        if n is None:
            raise ValueError(f"batch: this backend has no {lv.name} tier")
        if not s.size:
            continue
        if small:
            v = s.tolist()
            bad = min(v) < 0 or max(v) >= n
        else:  # one pass: a negative slot seen as uint64 is >= 2**63 > n
            bad = int(s.view(np.uint64).max()) >= n
        if bad:
            raise IndexError(f"batch: a {lv.name} slot is outside 0..{n - 1}")
    return src, dst
