"""Mooncake JSONL traces (FAST'25 release): load as an open-loop Workload, and write them.

Format: one JSON object a line with ``timestamp`` (ms from trace start), ``input_length``,
``output_length`` and ``hash_ids`` (prefix block ids, 512 tokens a block, global to the
file), and optionally ``priority`` (the request's priority in the cache: an integer in
``[-2**31, 2**31)``, higher kept longer by priority-aware eviction policies; absent: the
default) and ``tenant`` (a tenant or user id: a string or an integer; requests of two
tenants never share KV, whatever their hash ids; absent: one tenant). Blank lines are
skipped. A path ending in ``.gz`` is read through gzip (a stream that is not gzip, or ends
early, is a TraceError naming the line it reached).

The loader validates every line and raises TraceError with ``<path>:<line>: <problem>``:
text that is not UTF-8, malformed JSON, a line that is not an object, a missing field, a wrong type (bools are not
ints), a negative timestamp or output length, an input length < 1, hash ids that do not
cover the input (``len(hash_ids) != ceil(input_length / block_tokens)``), and timestamps
going backwards, hash ids outside ``[0, 2**63)``, a ``priority`` that is not such an
integer. Out-of-order timestamps are an error by default (a concatenated or
corrupted trace should not silently replay in a different order); ``sort=True`` accepts
them and stable-sorts requests by timestamp instead (sids keep their line numbers).

Each request becomes one Session ``req-<line>`` (1-based physical line) with one Turn,
scope ``global`` (the ids are global to the file) within its tenant's namespace
(``tenant_scope``), ``arrival_s = start_s = timestamp / 1000 * time_scale``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib

from .model import PRIORITY_MAX, PRIORITY_MIN, Session, TraceError, Turn, Workload, tenant_of, tenant_scope

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_INT = frozenset((int,))
ID_LIMIT = 1 << 63  # block keys hash ids as signed 64-bit integers


def _is_int(x) -> bool:
    return type(x) is int


def _is_num(x) -> bool:
    return type(x) is int or type(x) is float


def _lines(path: str):
    """(line number, raw bytes) of each line of ``path``, through gzip where it ends in
    ``.gz``: a stream that cannot be inflated raises TraceError at the line it reached."""
    if not path.endswith(".gz"):
        with open(path, "rb") as f:
            yield from enumerate(f, 1)
        return
    lineno = 0
    try:
        with gzip.open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                yield lineno, raw
    except (OSError, EOFError, zlib.error) as e:
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise TraceError(f"{path}:{lineno + 1}: not readable as gzip ({e or type(e).__name__}); "
                         "expected gzipped JSON lines") from None


def load_mooncake(path, time_scale: float = 1.0, limit: int | None = None, *,
                  block_tokens: int = 512, sort: bool = False, name: str | None = None) -> Workload:
    """Load a Mooncake JSONL trace as an open-loop Workload (see the module docstring)."""
    if not time_scale > 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit!r}")
    path = os.fspath(path)
    sessions = []
    scale = time_scale / 1000.0
    prev_ts = None
    prev_line = 0
    for lineno, raw in _lines(path):
        if limit is not None and len(sessions) >= limit:
            break
        where = f"{path}:{lineno}: "
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{where}not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                             f"{e.start + 1}); expected JSON lines in UTF-8") from None
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}malformed JSON ({e.msg} at column {e.colno}); "
                             f"expected one JSON object a line") from None
        if type(row) is not dict:
            raise TraceError(f"{where}expected a JSON object with fields {', '.join(FIELDS)}, "
                             f"got {type(row).__name__}")
        try:
            ts = row["timestamp"]
            n_in = row["input_length"]
            n_out = row["output_length"]
            ids = row["hash_ids"]
        except KeyError as e:
            raise TraceError(f"{where}missing field {e.args[0]!r} (expected fields "
                             f"{', '.join(FIELDS)})") from None
        if not _is_num(ts) or not math.isfinite(ts):
            raise TraceError(f"{where}field 'timestamp' must be a finite number of ms, got {ts!r}")
        if not _is_int(n_in):
            raise TraceError(f"{where}field 'input_length' must be an integer, got {n_in!r}")
        if not _is_int(n_out):
            raise TraceError(f"{where}field 'output_length' must be an integer, got {n_out!r}")
        if type(ids) is not list:
            raise TraceError(f"{where}field 'hash_ids' must be a list of integers, "
                             f"got {type(ids).__name__}")
        if ts < 0:
            raise TraceError(f"{where}negative timestamp {ts!r} ms; expected >= 0")
        if n_in < 1:
            raise TraceError(f"{where}input_length {n_in} is not positive; expected >= 1")
        if n_out < 0:
            raise TraceError(f"{where}negative output_length {n_out}; expected >= 0")
        if not set(map(type, ids)) <= _INT:
            bad = next(h for h in ids if type(h) is not int)
            raise TraceError(f"{where}field 'hash_ids' must hold only integers, found {bad!r}")
        if ids and (min(ids) < 0 or max(ids) >= ID_LIMIT):
            bad = next(h for h in ids if not 0 <= h < ID_LIMIT)
            raise TraceError(f"{where}hash id {bad} is out of range; expected 0 <= id < 2**63")
        need = -(-n_in // block_tokens)
        if len(ids) != need:
            raise TraceError(f"{where}hash_ids has {len(ids)} blocks but input_length {n_in} at "
                             f"{block_tokens} tokens a block needs ceil({n_in}/{block_tokens}) = {need}")
        if prev_ts is not None and ts < prev_ts and not sort:
            raise TraceError(f"{where}timestamp {ts} ms goes backwards (line {prev_line} has "
                             f"{prev_ts} ms); expected non-decreasing timestamps (or load with sort=True)")
        prio = row.get("priority")
        if prio is not None and (not _is_int(prio) or not PRIORITY_MIN <= prio <= PRIORITY_MAX):
            raise TraceError(f"{where}field 'priority' must be an integer in [-2**31, 2**31), "
                             f"got {prio!r}")
        tenant = tenant_of(row.get("tenant"), where)
        prev_ts, prev_line = ts, lineno
        t = ts * scale
        turn = Turn(n_in, n_out, tuple(ids), 0.0, t, prio)
        sessions.append(Session(f"req-{lineno}", tenant_scope(tenant, "global"), (turn,), t, tenant))
    if sort:
        sessions.sort(key=lambda s: s.start_s)  # stable: ties keep file order
    if name is None:
        base = os.path.basename(path)
        name = os.path.splitext(base[:-3] if base.endswith(".gz") else base)[0]
    return Workload(name=name, block_tokens=block_tokens, closed_loop=False, sessions=tuple(sessions))


def write_jsonl_mooncake(workload: Workload, path) -> int:
    """Write an open-loop workload as Mooncake JSONL, one line per turn in replay order;
    timestamps are ``round(arrival_s * 1000)`` ms. Returns the number of lines written.
    Hash ids must be ints (the Mooncake format has no tuples); the block size is not
    recorded in the format, so load it back with the same ``block_tokens``."""
    if workload.closed_loop:
        raise ValueError(f"workload {workload.name!r} is closed loop; Mooncake JSONL needs arrival times")
    rows = []
    for s, t in workload.iter_turns():
        if t.arrival_s is None:
            raise ValueError(f"session {s.sid!r} has a turn without arrival_s")
        if not all(type(h) is int for h in t.hash_ids):
            raise ValueError(f"session {s.sid!r}: Mooncake hash_ids must be ints")
        rows.append((t.arrival_s, t, s))
    rows.sort(key=lambda r: r[0])
    with open(os.fspath(path), "w", encoding="utf-8") as f:
        for arr, t, s in rows:
            row = {"timestamp": round(arr * 1000), "input_length": t.input_tokens,
                   "output_length": t.output_tokens, "hash_ids": list(t.hash_ids)}
            if t.priority is not None:
                row["priority"] = t.priority
            if s.tenant is not None:
                row["tenant"] = s.tenant
            f.write(json.dumps(row))
            f.write("\n")
    return len(rows)
