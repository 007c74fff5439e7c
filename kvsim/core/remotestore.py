"""The cluster-wide remote KV store (``cache.remote``): which blocks it holds, nothing else.

One store for the whole cluster, outside every instance's tier manager. It is keyed by a
block's chain key (``kvsim.core.keys``), the key every instance computes for the same
prefix within the same reuse scope: a tenant's key never matches another's, and a page
one instance put is found by any other. It holds at most ``capacity`` pages and evicts
by its own order when a new one arrives at a full store (``ORDERS``: ``lru``, a get or a
repeated put makes the key the most recent; ``fifo``, insertion order only).

Two-phase, as the core's plans: ``offer(key)`` says whether a put must be sent (the key
is neither stored nor already on its way) and marks it pending; ``landed(keys)`` stores
the keys whose put completed. ``match(keys)`` counts the leading keys stored (a get; the
keys stay stored: the store is shared). No clock, no I/O: the engine moves the bytes.

Invariants: ``len(store) <= capacity``; a key is pending or stored, never both; the
counters only grow.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence

ORDERS = ("lru", "fifo")


class RemoteStore:
    """Chain keys of the pages in the cluster's remote tier, in eviction order."""

    __slots__ = ("capacity", "policy", "_keys", "_pending", "puts", "sent_pages", "put_pages",
                 "gets", "hit_pages", "evicted_pages", "peak_pages")

    def __init__(self, capacity_pages: int, policy: str = "lru"):
        if not isinstance(capacity_pages, int) or capacity_pages <= 0:
            raise ValueError(f"capacity_pages: expected a positive number of pages, "
                             f"got {capacity_pages!r}")
        if policy not in ORDERS:
            raise ValueError(f"policy: expected one of {', '.join(ORDERS)}, got {policy!r}")
        self.capacity = capacity_pages
        self.policy = policy
        self._keys: OrderedDict[bytes, None] = OrderedDict()  # oldest (next victim) first
        self._pending: set[bytes] = set()
        self.puts = 0           # put batches sent
        self.sent_pages = 0     # pages in them
        self.put_pages = 0      # pages stored by completed puts
        self.gets = 0           # matches that found at least one page
        self.hit_pages = 0      # pages found by them
        self.evicted_pages = 0  # pages the store evicted to make room
        self.peak_pages = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: bytes) -> bool:
        return key in self._keys

    def offer(self, keys: Iterable[bytes]) -> list[bytes]:
        """The keys (in order, each once) whose put must be sent: those neither stored nor
        pending. They become pending; a stored key offered again counts as a use (lru)."""
        out: list[bytes] = []
        stored, pending = self._keys, self._pending
        for k in keys:
            if k in stored:
                if self.policy == "lru":
                    stored.move_to_end(k)
            elif k not in pending:
                pending.add(k)
                out.append(k)
        if out:
            self.puts += 1
            self.sent_pages += len(out)
        return out

    def landed(self, keys: Sequence[bytes]) -> None:
        """The puts of ``keys`` completed: each is stored (the most recent), evicting the
        store's first keys in its order while it is full."""
        stored, pending = self._keys, self._pending
        for k in keys:
            pending.discard(k)
            if k in stored:
                continue
            while len(stored) >= self.capacity:
                stored.popitem(last=False)
                self.evicted_pages += 1
            stored[k] = None
            self.put_pages += 1
        if len(stored) > self.peak_pages:
            self.peak_pages = len(stored)

    def match(self, keys: Iterable[bytes]) -> int:
        """How many of ``keys``, from the first, the store holds (stopping at the first it
        does not); each found is used (lru: the most recent)."""
        stored = self._keys
        n = 0
        for k in keys:
            if k not in stored:
                break
            if self.policy == "lru":
                stored.move_to_end(k)
            n += 1
        if n:
            self.gets += 1
            self.hit_pages += n
        return n

    def stats(self) -> dict:
        return {"capacity_pages": self.capacity, "pages": len(self._keys),
                "peak_pages": self.peak_pages, "put_batches": self.puts,
                "sent_pages": self.sent_pages, "put_pages": self.put_pages, "gets": self.gets,
                "hit_pages": self.hit_pages,
                "evicted_pages": self.evicted_pages, "policy": self.policy}
