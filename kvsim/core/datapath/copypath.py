"""Which path moves a batch of pages between GPU and host, and how many CTAs a copy kernel gets.

Pure (standard library only): both backends call these so they decide the same way.

Rules (FIELD.md section 1, plus the page-size rule of issue 4), first match wins:

1. an explicit ``force`` wins; forcing the copy engine while host registration is chunked
   is refused (a copy-engine copy may not straddle two registrations), a ``ValueError``;
2. chunked host registration forces the SM kernel (it handles pages that straddle);
   registration counts as chunked only where a page *could* straddle two registrations:
   ``registration_forces_kernel`` on the host tier's page offsets and unit size (units
   that are whole multiples of the page size, from a page-aligned base, never do);
3. on a coherent link (``link_kind`` ``c2c``, from the hardware profile) the SM kernel when
   ``kernel_on_coherent_link`` opts in (the seed's opt-in: the kernel had been the
   default there; the copy engine is now); on PCIe the opt-in changes nothing;
4. small pages go to the SM kernel: a batched copy-engine call costs about
   ``per_copy_host_s`` of host time per page, so when ``page_bytes / per_copy_host_s`` is
   below the link bandwidth the host, not the link, bounds the copy engine;
   with ``sm_bytes_per_s`` (the SM kernel's own ceiling in this direction) the rule
   compares time per page instead, host time then DMA as measured on the H200: the SM
   kernel when ``page / sm_bytes_per_s < per_copy_host_s + page / link_bytes_per_s``;
5. otherwise the copy engine, on PCIe and on a coherent C2C link alike (it uses no SMs;
   on C2C the seed measured the SM kernel leaving every later decode step slower).

Callers pass the direction's own ``per_copy_host_s`` (it differs host -> GPU and
GPU -> host), so each direction may get its own path.

``copy_ctas`` sizes a copy kernel by Little's law: enough CTAs that their summed
bandwidth covers the link (times a headroom >= 1: per-CTA rates measured with few CTAs
sag as the link fills), rounded up to an even number, at least 2, at most ``max_ctas``
(rounded down to even when that cap is below the need).

The run's settings (``engine.copy_path`` per direction, ``engine.sm_ctas``,
``engine.kernel_on_coherent_link``) reach both backends as given; ``force_per_direction``
and ``sm_ctas`` turn them into the path and the CTA count of each direction: ``auto``
applies the rules above, anything else is forced. ``direction_paths`` is each
direction's path by these rules alone (where the path of a batch moving alone with
nothing computing starts from: ``kvsim.core.datapath.pathcost.PathChooser.lone``);
``pinned_paths`` says which directions rules 1-3 pin, and on a coherent link all; the
others' batches go by what they cost (``kvsim.core.datapath.pathcost``).
"""

from __future__ import annotations

import enum
import math
from typing import Mapping

LINK_KINDS = ("pcie", "c2c")
DIRECTIONS = ("h2d", "d2h")
AUTO = "auto"


class CopyPath(enum.Enum):
    COPY_ENGINE = "copy_engine"
    SM_KERNEL = "sm_kernel"


def choose_copy_path(link_kind: str, page_bytes: int, per_copy_host_s: float,
                     link_bytes_per_s: float, force: CopyPath | None = None,
                     chunked_registration: bool = False, *,
                     sm_bytes_per_s: float | None = None,
                     kernel_on_coherent_link: bool = False) -> CopyPath:
    """The copy path for pages of ``page_bytes`` over a link of ``link_kind``."""
    if link_kind not in LINK_KINDS:
        raise ValueError(f"link_kind: got {link_kind!r}; expected one of {LINK_KINDS}")
    if page_bytes <= 0:
        raise ValueError(f"page_bytes: got {page_bytes!r}; expected a positive number of bytes")
    if link_bytes_per_s <= 0:
        raise ValueError(f"link_bytes_per_s: got {link_bytes_per_s!r}; expected a positive rate")
    if per_copy_host_s < 0:
        raise ValueError(f"per_copy_host_s: got {per_copy_host_s!r}; expected >= 0 seconds")
    if sm_bytes_per_s is not None and sm_bytes_per_s <= 0:
        raise ValueError(f"sm_bytes_per_s: got {sm_bytes_per_s!r}; expected a positive rate")
    if force is not None:
        force = CopyPath(force)
        if force is CopyPath.COPY_ENGINE and chunked_registration:
            raise ValueError("copy path: the copy engine was forced but host registration is "
                             "chunked (a page may straddle two registrations); use the SM kernel")
        return force
    if chunked_registration:
        return CopyPath.SM_KERNEL
    if kernel_on_coherent_link and link_kind == "c2c":
        return CopyPath.SM_KERNEL
    if sm_bytes_per_s is not None:  # time per page: SM kernel vs host time, then DMA
        if page_bytes / sm_bytes_per_s < per_copy_host_s + page_bytes / link_bytes_per_s:
            return CopyPath.SM_KERNEL
        return CopyPath.COPY_ENGINE
    if page_bytes < per_copy_host_s * link_bytes_per_s:  # page / host time < link rate
        return CopyPath.SM_KERNEL
    return CopyPath.COPY_ENGINE


def straddling_pages(page_bytes: int, unit_bytes: int, n_pages: int, base: int = 0) -> list[int]:
    """Indices of the pages that straddle two registrations: page ``i`` covers
    ``[base + i * page_bytes, base + (i + 1) * page_bytes)`` and registrations are the
    units ``[k * unit_bytes, (k + 1) * unit_bytes)``. A page straddles when a unit
    boundary falls strictly inside it. One look per unit boundary inside the pages, not
    per page (a page larger than the unit always straddles): a boundary ``X`` splits page ``(X - 1 - base) // page_bytes`` unless
    ``X - base`` is a multiple of the page size."""
    if page_bytes <= 0 or unit_bytes <= 0:
        raise ValueError(f"straddling_pages: page_bytes {page_bytes!r} and unit_bytes {unit_bytes!r} "
                         "must be positive")
    if n_pages < 0 or base < 0:
        raise ValueError(f"straddling_pages: n_pages {n_pages!r} and base {base!r} must be >= 0")
    if page_bytes > unit_bytes:  # every page holds a boundary strictly inside it
        return list(range(n_pages))
    end = base + n_pages * page_bytes
    out = []
    for x in range((base // unit_bytes + 1) * unit_bytes, end, unit_bytes):
        if (x - base) % page_bytes:
            out.append((x - 1 - base) // page_bytes)
    return out


def page_straddles(offset: int, page_bytes: int, unit_bytes: int) -> bool:
    """Whether the page at byte ``offset`` crosses a registration unit boundary."""
    if page_bytes <= 0 or unit_bytes <= 0 or offset < 0:
        raise ValueError(f"page_straddles: offset {offset!r} must be >= 0, page_bytes "
                         f"{page_bytes!r} and unit_bytes {unit_bytes!r} positive")
    return offset // unit_bytes != (offset + page_bytes - 1) // unit_bytes


def registration_forces_kernel(page_bytes: int, unit_bytes: int | None, n_pages: int,
                               base: int = 0) -> bool:
    """Whether host memory registered in units of ``unit_bytes`` (None: one registration)
    forces the SM kernel for ``n_pages`` pages laid out from ``base``: whether any of them
    could straddle two registrations."""
    if unit_bytes is None:
        return False
    if unit_bytes % page_bytes == 0 and (base % unit_bytes) % page_bytes == 0:
        return False  # (the common case, answered without a look at the boundaries)
    return bool(straddling_pages(page_bytes, unit_bytes, n_pages, base))


def copy_ctas(link_bytes_per_s: float, per_cta_bytes_per_s: float, max_ctas: int,
              headroom: float = 1.0) -> int:
    """CTAs a copy kernel needs to fill ``headroom`` times the link (Little's law), even,
    >= 2, <= max_ctas."""
    if not headroom >= 1:
        raise ValueError(f"headroom: got {headroom!r}; expected >= 1")
    link_bytes_per_s = link_bytes_per_s * headroom
    if link_bytes_per_s <= 0 or per_cta_bytes_per_s <= 0:
        raise ValueError(f"copy_ctas: rates must be positive, got link {link_bytes_per_s!r}, "
                         f"per CTA {per_cta_bytes_per_s!r}")
    if max_ctas < 2:
        raise ValueError(f"max_ctas: got {max_ctas!r}; expected at least 2")
    # a hair of tolerance so 55.5e9 / 2.775e9 = 20.000000000000004 stays 20
    need = math.ceil(link_bytes_per_s / per_cta_bytes_per_s * (1 - 1e-12))
    need = max(2, need + (need & 1))
    cap = max_ctas - (max_ctas & 1)
    return min(need, cap)


def force_per_direction(setting) -> dict[str, CopyPath | None]:
    """A copy-path setting as one forced path (or None: choose) per direction. ``setting``:
    None or ``'auto'`` (choose both), a path (both directions), or a mapping of
    direction -> None / ``'auto'`` / path (a direction left out: choose)."""
    def one(where: str, v) -> CopyPath | None:
        if v is None or v == AUTO:
            return None
        try:
            return CopyPath(v)
        except ValueError:
            names = ", ".join([AUTO, *(p.value for p in CopyPath)])
            raise ValueError(f"{where}: got {v!r}; expected one of {names}") from None

    if isinstance(setting, dict):
        extra = set(setting) - set(DIRECTIONS)
        if extra:
            raise ValueError(f"copy_path: unknown direction(s) {sorted(extra)}; expected {DIRECTIONS}")
        return {d: one(f"copy_path.{d}", setting.get(d)) for d in DIRECTIONS}
    return {d: one("copy_path", setting) for d in DIRECTIONS}


def sm_ctas(setting, link_bytes_per_s: float, per_cta_bytes_per_s: float, max_ctas: int,
            headroom: float = 1.0) -> int:
    """The SM copy kernel's CTAs in one direction: ``setting`` ``'auto'`` (or None) sizes
    it by ``copy_ctas``; a positive integer up to ``max_ctas`` is taken as it is."""
    if setting is None or setting == AUTO:
        return copy_ctas(link_bytes_per_s, per_cta_bytes_per_s, max_ctas, headroom)
    return setting  # (its range: the config model and kvsim.run.seam.check_profile_fit)


def direction_paths(profile, page_bytes: int, force: Mapping[str, CopyPath | None],
                    registration_unit: int | None, host_slots: int,
                    kernel_on_coherent_link: bool) -> dict[str, CopyPath]:
    """The copy path of each direction for pages of ``page_bytes``: ``choose_copy_path``
    on ``profile``'s arguments (a hardware profile: its ``copy_path_args``), ``force``'s
    path or None a direction, chunked registration where host memory registered in
    ``registration_unit`` bytes (None: one registration) could split one of
    ``host_slots`` pages. The one rule both backends build their paths by."""
    chunked = registration_forces_kernel(page_bytes, registration_unit, host_slots)
    return {d: choose_copy_path(**profile.copy_path_args(d, page_bytes), force=force.get(d),
                                chunked_registration=chunked,
                                kernel_on_coherent_link=kernel_on_coherent_link)
            for d in DIRECTIONS}


def pinned_paths(profile, page_bytes: int, force: Mapping[str, CopyPath | None],
                 registration_unit: int | None, host_slots: int,
                 kernel_on_coherent_link: bool) -> dict[str, CopyPath | None]:
    """The path each direction is pinned to, or None where it is chosen batch by batch by
    what it costs (``kvsim.core.datapath.pathcost``): pinned by a forced path, by chunked
    registration (the SM kernel), and on a coherent link (the copy engine, or the kernel
    with ``kernel_on_coherent_link``: the seed's rule, where the SM kernel leaves every
    later step slower, a cost no batch sees). On PCIe the rest is by cost."""
    chunked = registration_forces_kernel(page_bytes, registration_unit, host_slots)
    c2c = profile.link.kind == "c2c"
    return {d: choose_copy_path(**profile.copy_path_args(d, page_bytes), force=force.get(d),
                                chunked_registration=chunked,
                                kernel_on_coherent_link=kernel_on_coherent_link)
            if (force.get(d) is not None or chunked or c2c) else None
            for d in DIRECTIONS}


def direction_ctas(setting: int | Mapping[str, int] | None, profile, page_bytes: int) -> dict[str, int]:
    """The SM copy kernel's CTAs each direction: ``setting``, one count or one a direction
    (None: Little's law on ``profile``'s rates at pages of ``page_bytes``, ``cta_args``)."""
    if isinstance(setting, Mapping):
        return {d: int(setting[d]) for d in DIRECTIONS}
    return {d: sm_ctas(setting, **profile.cta_args(d, page_bytes)) for d in DIRECTIONS}
