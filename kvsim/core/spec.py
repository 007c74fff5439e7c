"""Validated, immutable specifications of the manager and its tiers.

Invariants checked at construction (each error names the field and the value):
positive sizes, a tier order of GPU then host then disk (each optional after GPU), a
slot no bigger than its tier, a maximum quota no smaller than the quota.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvsim.core.errors import ConfigError


class Level(enum.IntEnum):
    """Tier levels, warmest first. The enum value orders the tiers."""

    GPU = 0
    HOST = 1
    DISK = 2


@dataclass(frozen=True, slots=True)
class TierSpec:
    level: Level
    quota_bytes: int
    max_quota_bytes: int = 0  # 0: same as quota_bytes (the address range reserved)

    @property
    def reserve_bytes(self) -> int:
        return self.max_quota_bytes or self.quota_bytes


@dataclass(frozen=True, slots=True)
class ManagerSpec:
    page_bytes: int
    tokens_per_block: int
    tiers: tuple[TierSpec, ...]
    # retained disk copies (kvsim.core.retained): keep a restored page's disk copy; write a
    # page evicted GPU -> host to disk in the background too (needs host and disk tiers),
    # at most ``write_through_inflight_bytes`` in flight; the share of the disk retained
    # copies may hold ahead of disk-only pages
    keep_copy: bool = False
    write_through: bool = False
    write_through_inflight_bytes: int = 1 << 30
    protected_copy_fraction: float = 1.0
    # seed 004's rule: a host page whose write-through is still running may be evicted to
    # disk; the eviction takes the pending copy back and waits for its write (promoted to
    # the required writes). False: such a page is no host eviction candidate
    write_through_take_back: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.page_bytes, int) or self.page_bytes <= 0:
            raise ConfigError("page_bytes", self.page_bytes, "a positive number of bytes")
        if not isinstance(self.tokens_per_block, int) or self.tokens_per_block <= 0:
            raise ConfigError("tokens_per_block", self.tokens_per_block, "a positive integer")
        if not self.tiers:
            raise ConfigError("tiers", self.tiers, "at least a GPU tier")
        levels = [t.level for t in self.tiers]
        if levels[0] != Level.GPU or any(b <= a for a, b in zip(levels, levels[1:])):
            names = [lv.name.lower() for lv in levels]
            raise ConfigError("tiers", names, "the order gpu -> host -> disk (host and disk optional)")
        for i, t in enumerate(self.tiers):
            where = f"tiers[{i}] ({t.level.name.lower()})"
            if not isinstance(t.quota_bytes, int) or t.quota_bytes <= 0:
                raise ConfigError(f"{where}.quota_bytes", t.quota_bytes, "a positive number of bytes")
            if t.max_quota_bytes and t.max_quota_bytes < t.quota_bytes:
                raise ConfigError(f"{where}.max_quota_bytes", t.max_quota_bytes,
                                  f"at least quota_bytes ({t.quota_bytes})")
            if t.quota_bytes < self.page_bytes:
                raise ConfigError(f"{where}.quota_bytes", t.quota_bytes,
                                  f"at least one slot of page_bytes ({self.page_bytes})")
        f = self.protected_copy_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= f <= 1.0:
            raise ConfigError("protected_copy_fraction", f, "a number in [0, 1]")
        if (self.keep_copy or self.write_through) and Level.DISK not in levels:
            raise ConfigError("keep_copy" if self.keep_copy else "write_through", True,
                              "a disk tier")
        if self.write_through and Level.HOST not in levels:
            raise ConfigError("write_through", True, "a host tier above the disk tier")
        w = self.write_through_inflight_bytes
        if isinstance(w, bool) or not isinstance(w, int) or w < self.page_bytes:
            raise ConfigError("write_through_inflight_bytes", w,
                              f"at least one page ({self.page_bytes} bytes)")
