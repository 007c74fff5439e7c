"""The sim's data paths: for each (source, destination) tier, the link and disk directions
a batch takes, the fluid resources its flow shares, and the byte counters it adds to."""

from __future__ import annotations

from typing import Final

from kvsim.core.spec import Level

DIRECTIONS: Final = ("h2d", "d2h", "disk_read", "disk_write", "gpu_copy")

# (src, dst) -> (link direction or None, disk direction or None, fluid resources, the
# byte counters a completed batch adds to, in the order the bytes go through them)
# (an SM-kernel flow adds the SM ceilings of its direction: SM_RES)
ROUTES: Final[dict[tuple[Level, Level],
                    tuple[str | None, str | None, tuple[str, ...], tuple[str, ...]]]] = {
    (Level.HOST, Level.GPU): ("h2d", None, ("h2d", "link"), ("h2d",)),
    (Level.GPU, Level.HOST): ("d2h", None, ("d2h", "link"), ("d2h",)),
    (Level.DISK, Level.GPU): ("h2d", "disk_read", ("disk_read", "h2d", "link"),
                              ("disk_read", "h2d")),
    (Level.GPU, Level.DISK): ("d2h", "disk_write", ("d2h", "link", "disk_write"),
                              ("d2h", "disk_write")),
    (Level.DISK, Level.HOST): (None, "disk_read", ("disk_read",), ("disk_read",)),
    (Level.HOST, Level.DISK): (None, "disk_write", ("disk_write",), ("disk_write",)),
    (Level.GPU, Level.GPU): (None, None, ("hbm",), ("gpu_copy",)),
}
SM_RES: Final = {"h2d": ("sm_h2d", "sm_both"), "d2h": ("sm_d2h", "sm_both")}
