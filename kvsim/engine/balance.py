"""Seed 004's balancing statistics where a user reads them: each tier's evictable pages
(an eviction from it may pick them now) and, on the disk tier, its retained copies (slots
of pages that live in a warmer tier, reclaimable without losing a page's only copy) and
how much of the protected share (``protected_copy_fraction`` of the disk's slots) they
use. Pages and bytes at the end of the run, and the mean over the timeline's samples
(the engine samples each tier's evictable pages and the retained slots every
``timeline_interval_s``). A node of ranks sums its ranks'.
"""

from __future__ import annotations

from typing import Any, Sequence


def _mean(rows: Sequence[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return sum(vals) / len(vals) if vals else 0.0


def tier_balance(ranks: Sequence[tuple[Any, Sequence[dict]]], page_bytes: int) -> dict:
    """``ranks``: (manager, timeline rows) a rank -> {tier name: statistics}."""
    out: dict[str, dict] = {}
    for mgr, timeline in ranks:
        copies = bool(mgr.copies_on)
        for pos, t in enumerate(mgr.tiers):
            name = t.level.name.lower()
            disk = name == "disk"
            d = out.setdefault(name, {"evictable_pages": 0, "evictable_pages_mean": 0.0})
            d["evictable_pages"] += t.index_size()
            d["evictable_pages_mean"] += _mean(timeline, f"{name}_evictable_pages")
            if disk and copies:
                d["retained_pages"] = d.get("retained_pages", 0) + mgr.retained_slots()
                d["retained_pages_mean"] = d.get("retained_pages_mean", 0.0) + _mean(
                    timeline, "disk_retained_slots")
                d["protected_pages"] = d.get("protected_pages", 0) + mgr.protected_copies()
    for d in out.values():
        d["evictable_bytes"] = d["evictable_pages"] * page_bytes
        if "retained_pages" in d:
            d["retained_bytes"] = d["retained_pages"] * page_bytes
            prot = d["protected_pages"]
            d["protected_in_use"] = d["retained_pages"] / prot if prot else 0.0
            d["protected_in_use_mean"] = d["retained_pages_mean"] / prot if prot else 0.0
    return out
