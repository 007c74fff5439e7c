"""Counters and per-tier statistics.

Counters only grow; they are updated once per batch (not per page). They balance: for
every tier, the pages resident there equal pages created there + moved in - moved out -
dropped - freed (a property test checks this after every step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

N_LEVELS = 3


def _vec() -> list[int]:
    return [0] * N_LEVELS


def _mat() -> list[list[int]]:
    return [[0] * N_LEVELS for _ in range(N_LEVELS)]


@dataclass
class Counters:
    hit_tokens: list[int] = field(default_factory=_vec)      # by tier where the hit was found
    created_pages: list[int] = field(default_factory=_vec)   # new pages (always GPU)
    moved_pages: list[list[int]] = field(default_factory=_mat)  # [src][dst], committed moves
    moved_bytes: list[list[int]] = field(default_factory=_mat)
    evicted_pages: list[int] = field(default_factory=_vec)   # moved out of a tier to make room
    dropped_pages: list[int] = field(default_factory=_vec)   # by tier they were dropped from
    freed_pages: list[int] = field(default_factory=_vec)     # private pages released
    failed_batches: int = 0
    plans: int = 0
    refusals: int = 0
    # retained disk copies (kvsim.core.retained): kept at a restore, taken back by an
    # eviction to disk (no write), reclaimed for room; write-through copies written,
    # skipped (no free disk slot or past the protected share), failed, or given up (the
    # page left or was written to disk before its copy finished)
    copies_kept: int = 0
    copies_reused: int = 0
    copies_reused_pending: int = 0  # of those, copies whose write-through was still running
    copies_reclaimed: int = 0
    write_through_pages: int = 0
    write_through_skipped: int = 0
    write_through_failed: int = 0
    write_through_dropped: int = 0
    copies_on: bool = False  # snapshot reports the copy counters (an option is on)
    # a request's fixed state (kvsim.core.statepages): pages moved GPU -> host (stashed)
    # and host -> GPU (restored); not in moved_pages, which counts the pages of blocks
    state_out_pages: int = 0
    state_in_pages: int = 0

    @property
    def offloaded_pages(self) -> int:
        return sum(self.moved_pages[0][1:])

    @property
    def offloaded_bytes(self) -> int:
        return sum(self.moved_bytes[0][1:])

    @property
    def onboarded_pages(self) -> int:
        return sum(self.moved_pages[s][0] for s in range(1, N_LEVELS))

    @property
    def onboarded_bytes(self) -> int:
        return sum(self.moved_bytes[s][0] for s in range(1, N_LEVELS))

    def snapshot(self) -> dict:
        out = {
            "hit_tokens": list(self.hit_tokens),
            "created_pages": list(self.created_pages),
            "moved_pages": [list(r) for r in self.moved_pages],
            "moved_bytes": [list(r) for r in self.moved_bytes],
            "evicted_pages": list(self.evicted_pages),
            "dropped_pages": list(self.dropped_pages),
            "freed_pages": list(self.freed_pages),
            "offloaded_pages": self.offloaded_pages,
            "offloaded_bytes": self.offloaded_bytes,
            "onboarded_pages": self.onboarded_pages,
            "onboarded_bytes": self.onboarded_bytes,
            "failed_batches": self.failed_batches,
            "plans": self.plans,
            "refusals": self.refusals,
        }
        if self.state_out_pages or self.state_in_pages:
            out["state_out_pages"] = self.state_out_pages
            out["state_in_pages"] = self.state_in_pages
        if not self.copies_on:
            return out
        out.update({
            "copies_kept": self.copies_kept,
            "copies_reused": self.copies_reused,
            "copies_reused_pending": self.copies_reused_pending,
            "copies_reclaimed": self.copies_reclaimed,
            "write_through_pages": self.write_through_pages,
            "write_through_skipped": self.write_through_skipped,
            "write_through_failed": self.write_through_failed,
            "write_through_dropped": self.write_through_dropped,
        })
        return out


@dataclass(frozen=True, slots=True)
class TierStats:
    """Slots of one tier. total == used + free (free is 0 while over a shrunk quota);
    used == locked + held + droppable + reserved + retained + state."""

    level: int
    total: int
    used: int
    free: int
    locked: int
    held: int
    droppable: int
    reserved: int   # destinations of in-flight moves and slots of pending new pages
    moving: int     # pages pinned as sources of in-flight moves (counted in their state)
    evictable: int  # pages an eviction from this tier may pick now
    retained: int = 0  # disk: slots of retained copies (of pages in a warmer tier), not evictable
    state: int = 0     # slots of requests' fixed state (kvsim.core.statepages), moving or not
