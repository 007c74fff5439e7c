"""The hardware profile's ``page_cache`` section: the host's page cache in front of the
disk tier's file, for a disk tier with ``writes: buffered`` (docs/config.md).

Linux's terms (Documentation/admin-guide/sysctl/vm.rst): ``vm.dirty_background_bytes``
(or ``dirty_background_ratio`` of the dirtyable memory, default 10%) is the amount of
dirty memory at which the kernel's flusher threads start writing back;
``vm.dirty_bytes`` (or ``dirty_ratio``, default 20%) the amount at which a process that
writes is made to write back itself (``balance_dirty_pages`` throttles it to the
writeback rate); ``vm.dirty_expire_centisecs`` (default 3000: 30 s) the age at which dirty
data is written back at the flusher's next wake-up whatever the amount. Writing a
``*_bytes`` key zeroes its ``*_ratio`` counterpart: one of each pair is in force.

Invariants: ``dirty_background`` <= ``dirty_limit`` <= ``capacity`` (dirty pages are page
cache pages: the kernel cannot drop them before their write-back).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from kvsim.config.units import parse_rate, parse_size, parse_time

_Bytes = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
_Seconds = Annotated[float, BeforeValidator(parse_time), Field(ge=0)]
_Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]


class PageCacheSpec(BaseModel):
    """``rate``: the rate of copies between a process's buffer and the page cache, all
    threads together (a buffered write below the dirty limit; a read the cache holds);
    ``dirty_limit``: dirty bytes at which a writer is throttled to the write-back
    (``vm.dirty_bytes``); ``dirty_background``: dirty bytes at which write-back starts
    (``vm.dirty_background_bytes``); ``dirty_expire``: the age at which a dirty byte is
    written back whatever the amount (``vm.dirty_expire_centisecs``); ``capacity``: the
    bytes of the disk tier's file the page cache can hold (the host memory no one else
    uses), clean and dirty, least recently used first out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate: _Rate
    dirty_limit: _Bytes
    dirty_background: _Bytes
    dirty_expire: _Seconds = 30.0
    capacity: _Bytes

    @model_validator(mode="after")
    def _ordered(self) -> "PageCacheSpec":
        if self.dirty_background > self.dirty_limit:
            raise ValueError(f"dirty_background ({self.dirty_background}) is above dirty_limit "
                             f"({self.dirty_limit}): write-back starts at or below the limit")
        if self.dirty_limit > self.capacity:
            raise ValueError(f"dirty_limit ({self.dirty_limit}) is above capacity "
                             f"({self.capacity}): dirty pages are page cache pages")
        return self
