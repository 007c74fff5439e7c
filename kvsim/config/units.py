"""Sizes and times with units, as YAML and the command line write them.

``parse_size("160GiB") == 160 * 2**30``; ``parse_size("4MB") == 4 * 10**6``;
``parse_time("10ms") == 0.01``; ``parse_rate("55.5GB/s") == 55.5e9`` (bytes per second).
Plain numbers pass through (bytes, seconds, bytes per second). Errors say what was expected.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_SIZE = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
         "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_TIME = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}
_NUM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z/]*)\s*$")


_EXAMPLE = {"a size": "'160GiB'", "a duration": "'10ms'", "a bandwidth": "'55GB/s'"}


def _split(value: object, what: str) -> tuple[float, str]:
    if isinstance(value, bool):
        raise ValueError(f"expected {what}, got the boolean {value!r}")
    if isinstance(value, (int, float)):
        num, unit = float(value), ""
    elif isinstance(value, str):
        m = _NUM.match(value)
        if not m:
            raise ValueError(f"expected {what} (e.g. {_EXAMPLE[what]}), got {value!r}")
        num, unit = float(m.group(1)), m.group(2)
    else:
        raise ValueError(f"expected {what}, got {type(value).__name__} {value!r}")
    if not math.isfinite(num):
        raise ValueError(f"expected {what}, got the non-finite {value!r}")
    return num, unit


def parse_size(value: object) -> int:
    """Bytes, from a number or a string like '4MiB' (binary) or '4MB' (decimal)."""
    num, unit = _split(value, "a size")
    factor = _SIZE.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {value!r}; use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB")
    out = num * factor
    if not math.isfinite(out):
        raise ValueError(f"size {value!r} is beyond any machine")
    if out != int(out):
        raise ValueError(f"size {value!r} is not a whole number of bytes")
    return int(out)


def parse_time(value: object) -> float:
    """Seconds, from a number or a string like '10ms', '2us', '1.5s', '5min'."""
    num, unit = _split(value, "a duration")
    factor = _TIME.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown time unit {unit!r} in {value!r}; use ns, us, ms, s, min, h")
    if not math.isfinite(num * factor):
        raise ValueError(f"duration {value!r} is beyond any replay")
    return num * factor


def parse_rate(value: object) -> float:
    """Bytes per second, from a number or a string like '55.5GB/s' or '40GiB/s'."""
    num, unit = _split(value, "a bandwidth")
    if unit and not unit.lower().endswith("/s"):
        raise ValueError(f"expected a bandwidth like '55GB/s', got {value!r}")
    factor = _SIZE.get(unit[:-2].lower() if unit else "")
    if factor is None:
        raise ValueError(f"unknown bandwidth unit {unit!r} in {value!r}; use GB/s, GiB/s, MB/s")
    return num * factor


def _page_table(value, parse, what: str, ok):
    """A scalar by ``parse``, or a table {page size: scalar} normalised to {bytes: value}
    (sorted by page size); ``ok`` each value must pass, ``what`` names it in errors."""
    if value is None:
        return None
    if isinstance(value, dict):
        if not value:
            raise ValueError(f"expected {what} or a non-empty table {{page size: {what}}}")
        out = {}
        for k, v in value.items():
            size, x = parse_size(k), parse(v)
            if size <= 0 or not ok(x):
                raise ValueError(f"table entry {k!r}: {v!r}: expected a positive size and {what}")
            out[size] = x
        return dict(sorted(out.items()))
    x = parse(value)
    if not ok(x):
        raise ValueError(f"expected {what}, got {value!r}")
    return x


def parse_page_cost(value):
    """A per-page time, or a table {page size: time} normalised to {bytes: seconds}."""
    return _page_table(value, parse_time, "a time >= 0", lambda t: t >= 0)


PageCost = Annotated[float | dict[int, float] | None, BeforeValidator(parse_page_cost)]


def parse_page_rate(value):
    """A bandwidth, or a table {page size: bandwidth} normalised to {bytes: bytes/s}."""
    return _page_table(value, parse_rate, "a bandwidth > 0", lambda r: r > 0)


#: a bandwidth or a table by page size (read with ``page_cost_at``: linear in log2 size)
PageRate = Annotated[float | dict[int, float] | None, BeforeValidator(parse_page_rate)]
#: the same, required (a key without a default: ``sm.cta_offload`` / ``sm.cta_onboard``)
PageRateRequired = Annotated[float | dict[int, float], BeforeValidator(parse_page_rate)]


def page_cost_at(cost: float | dict[int, float], page_bytes: int) -> float:
    """``cost`` at ``page_bytes``: a scalar as is; a table linear in log2(page size)
    between its two nearest points, its end value beyond either end."""
    if not isinstance(cost, dict):
        return float(cost)
    pts = list(cost.items())
    if page_bytes <= pts[0][0]:
        return pts[0][1]
    for (p0, t0), (p1, t1) in zip(pts, pts[1:]):
        if page_bytes <= p1:
            w = math.log2(page_bytes / p0) / math.log2(p1 / p0)
            return t0 + w * (t1 - t0)
    return pts[-1][1]
