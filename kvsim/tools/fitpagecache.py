"""The profile's ``page_cache`` keys from a page-cache measurement
(``kvsim_backends.hw.pagecacheprobe``: the kernel's limits and the write's phases), for
``kvsim calibrate``'s fit and ``benchmarks/page_cache.py``. Pure: plain data in, profile
values and their sources out.

What one writer can say: where the kernel starts to throttle it (``dirty_limit``: the
``Dirty:`` bytes at the throttle's onset, which on the lent H200 was 4.24 GiB though /proc
said 25 GiB) and so that write-back runs from there (``dirty_background``: the smaller of
/proc's and the onset); ``dirty_expire`` is the kernel's setting. What it cannot: ``rate``
is all threads' together (one thread's is a lower bound) and ``capacity`` the memory the
cache may use beside the host tier; those stay the base profile's. No throttle seen below
the size written: the base's dirty keys stay too.

Invariant: the keys written keep ``dirty_background <= dirty_limit <= capacity``.
"""

from __future__ import annotations

GiB, MiB = 1 << 30, 1 << 20


def _size(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def measured_dirty(pc: dict) -> tuple[int, int] | None:
    """(dirty_limit, dirty_background) where a throttle was seen: the Dirty bytes at its
    onset (else the bytes written then), and the smaller of the kernel's background limit
    and that; None where none was seen."""
    ph = pc.get("phases") or {}
    onset = ph.get("dirty_at_throttle") or ph.get("throttle_at")
    if not onset:
        return None
    return int(onset), int(min(pc["limits"]["dirty_background"], onset))


def _base_rest(why: dict[str, str], one: str, lim: dict) -> None:
    why["page_cache.rate"] = f"base: all threads' rate, which one thread cannot say ({one})"
    why["page_cache.capacity"] = (f"base: the memory the cache may use beside the host tier "
                                  f"(MemAvailable here {lim['mem_available'] / GiB:.1f} GiB)")


def fit_page_cache(pc: dict | None, d: dict, why: dict[str, str]) -> None:
    """Set ``d["page_cache"]`` (a profile's ``model_dump``) from the measurement ``pc`` and say
    per key where its value came from. ``pc`` None (a report from before calibrate measured
    the page cache): nothing changes."""
    if pc is None:
        return
    base = d.get("page_cache")
    if pc.get("skipped"):
        why["page_cache"] = f"base: not measured ({pc['skipped']})"
        return
    ph, lim = pc["phases"], pc["limits"]
    one = (f"one thread wrote {ph['memory_rate'] / 1e9:.2f} GB/s below the throttle and read "
           f"{pc['read_rate'] / 1e9:.2f} GB/s cached")
    written = f"{_size(pc['size'])} written in {pc['piece'] >> 20} MiB pieces ({pc['size_bound']})"
    dirty = measured_dirty(pc)
    if dirty is None:
        why["page_cache.dirty_*"] = (f"base: no throttle seen in {written}; /proc's dirty limit "
                                     f"{lim['dirty_limit'] / GiB:.2f} GiB")
        if base is not None:
            _base_rest(why, one, lim)
        return
    limit, background = dirty
    src = "Dirty: at the throttle's onset" if ph.get("dirty_at_throttle") else "bytes written at the throttle's onset"
    pc_new = dict(base) if base is not None else {
        "rate": ph["memory_rate"], "capacity": int(lim["mem_available"])}
    pc_new["dirty_limit"], pc_new["dirty_background"] = limit, background
    pc_new["dirty_expire"] = float(lim["dirty_expire"])
    why["page_cache.dirty_limit"] = (f"measured: {src}, {_size(limit)}, in {written}; then "
                                     f"{ph['throttled_rate'] / 1e9:.2f} GB/s (/proc's limit "
                                     f"{lim['dirty_limit'] / GiB:.2f} GiB)")
    why["page_cache.dirty_background"] = (f"measured: the smaller of the throttle's onset and /proc's "
                                          f"background limit ({lim['dirty_background'] / GiB:.2f} GiB)")
    why["page_cache.dirty_expire"] = "from /proc: vm.dirty_expire_centisecs"
    if base is not None:
        _base_rest(why, one, lim)
    else:
        why["page_cache.rate"] = f"measured: {one} (one thread: a lower bound of all threads')"
        why["page_cache.capacity"] = "from /proc: MemAvailable"
    if pc_new["capacity"] < limit:  # dirty pages are page cache pages
        pc_new["capacity"] = max(limit, int(lim["mem_available"]))
        why["page_cache.capacity"] = "from /proc: MemAvailable (the base's was below the measured dirty limit)"
    d["page_cache"] = pc_new
