"""Agentic coding sessions (callanjfox/kv-cache-tester, WEKA): load as a closed-loop Workload.

Input: one session file (``.json.gz`` or ``.json``) or a directory of them (sorted by
name; ``limit`` keeps the first ``limit`` files). Per session: ``id``, ``block_size``,
``hash_id_scope`` ("local"), ``tool_tokens``, ``system_tokens``, ``requests[]``; per
request ``t``, ``type``, ``in``, ``out``, ``hash_ids``, ``think_time`` (sometimes missing),
``api_time``; a ``type: subagent`` entry carries its own ``requests[]``.

What the loader does, and what the real data taught it:

- Each session becomes a Session ``<id>`` with scope ``session:<id>``; a sub-agent
  becomes a nested Session ``<id>/<agent_id>`` with its parent's scope (the trace puts
  sub-agents in the parent's id namespace). An optional top-level ``tenant`` (a tenant or
  user id: a string or an integer) puts the session's scope inside that tenant's
  namespace: sessions of two tenants never share KV, ``shared_prefix`` or not.
- Coverage: in the real files ``len(hash_ids) == floor(in / 64)`` on every request: ids
  cover *full* blocks only and the trailing partial block has no id. Both floor and ceil
  are accepted; with floor and a remainder the loader appends one synthetic id for the
  partial block, unique within the scope (``-1, -2, ...`` in trace-id space), so that the
  package invariant ``len(hash_ids) == ceil(input_tokens / block_tokens)`` holds. Any
  other length is a TraceError. (Such a partial block is never reusable, as in the trace:
  the next request's block at that position is full and has a new id.)
- Think times: a turn is released ``think_time`` after the previous item completes. The
  recorded ``think_time`` of the parent's request after sub-agents counts from the
  parent's previous response, so it *includes* the sub-agents' run time; since the
  replay simulates the sub-agents, the loader uses ``t_next - max(sub.t)`` instead (a
  sub-agent's ``t`` is its end time: ``t - duration_ms/1000`` equals the parent's
  previous response end). Consecutive sub-agents ran in parallel in the recording; this
  data model runs them one after another. A missing ``think_time`` (114 requests) is
  derived as ``t - (prev.t + prev.api_time)`` (``api_time`` 0 when missing), floored at 0.
- ``shared_prefix=True``: one scope ``shared`` for all sessions and ids remapped into one
  global namespace: position ``j < P`` of every request, with ``P = floor((tool_tokens +
  system_tokens) / block_size)`` of the (sub-)agent, becomes ``ns * 2**20 + j`` where
  ``ns`` is 0 for main agents and 1, 2, ... for each distinct sub-agent type (so all
  sessions share the main prefix and all sub-agents of one type share theirs); every other
  id ``h`` of the k-th loaded session becomes ``2**32 * (k + 1) + h`` (synthetic partial
  ids ``-n`` become ``2**32 * (k + 1) + 2**31 + n``): private to the session and its
  sub-agents, no collisions, all ids below 2**63. Trace ids must lie in ``[0, 2**31)``.

- ``priorities`` (a mapping of ``prefix``, ``context``, ``subagent`` to ints): each turn's
  priority in the cache: a main agent's turns get ``context``, a sub-agent's ``subagent``,
  and the first ``floor((tool_tokens + system_tokens) / block_size)`` blocks of every
  prompt (the tools + system prefix of its agent) ``prefix``. None: no priorities (0).

Validation errors are TraceError ``<path>: <request path>: <problem>``, with request
paths like ``requests[12].subagent.requests[3]``.
"""

from __future__ import annotations

import gzip
import json
import math
import os

from .model import (PRIORITY_MAX, PRIORITY_MIN, Session, TraceError, Turn, Workload, check_start_policy,
                    tenant_of, tenant_scope)

PREFIX_NS_BITS = 20
PRIVATE_SPAN = 1 << 32
TAIL_OFFSET = 1 << 31
ID_LIMIT = 1 << 63
SESSION_SUFFIXES = (".json.gz", ".json")
PRIORITY_CLASSES = ("prefix", "context", "subagent")
_INT = frozenset((int,))


def session_files(path_or_dir) -> list[str]:
    """The session files a path names: itself, or the sorted session files in a directory."""
    p = os.fspath(path_or_dir)
    if os.path.isdir(p):
        files = sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(SESSION_SUFFIXES))
        if not files:
            raise TraceError(f"{p}: no session files (*.json.gz, *.json) in this directory")
        return files
    if not os.path.exists(p):
        raise FileNotFoundError(p)
    return [p]


def load_agentic(path_or_dir, shared_prefix: bool = False, limit: int | None = None,
                 start: str = "poisson", sessions_per_s: float = 0.05, concurrency: int = 16,
                 seed: int = 0, *, name: str | None = None, max_think_s: float | None = None,
                 priorities: dict | None = None) -> Workload:
    """Load agentic coding sessions as a closed-loop Workload (see the module docstring).
    ``limit`` is a number of session files; ``max_think_s`` caps think times (the real
    data has pauses of up to ~22 hours; None keeps them as recorded); ``priorities``:
    the priority of each part of a prompt (``prefix``, ``context``, ``subagent``)."""
    if max_think_s is not None and not max_think_s >= 0:
        raise ValueError(f"max_think_s must be >= 0, got {max_think_s!r}")
    if priorities is not None:
        for k, v in priorities.items():
            if k not in PRIORITY_CLASSES:
                raise ValueError(f"priorities: unknown class {k!r}; expected {', '.join(PRIORITY_CLASSES)}")
            if type(v) is not int or not PRIORITY_MIN <= v <= PRIORITY_MAX:
                raise ValueError(f"priorities.{k}: must be an integer in [-2**31, 2**31), got {v!r}")
    check_start_policy(start, sessions_per_s, concurrency)
    files = session_files(path_or_dir)
    if limit is not None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit!r}")
        files = files[:limit]
    prefix_ns: dict[str, int] = {"main": 0}  # per call: sub-agent type -> namespace index
    seen: dict[str, str] = {}
    block_tokens = None
    sessions = []
    for k, fp in enumerate(files):
        doc = _read(fp)
        bs = _top_fields(fp, doc)
        if block_tokens is None:
            block_tokens = bs
        elif bs != block_tokens:
            raise TraceError(f"{fp}: block_size {bs} differs from {block_tokens} in {files[0]}; "
                             f"expected one block size for all sessions of a workload")
        sid = doc["id"]
        if sid in seen:
            raise TraceError(f"{fp}: session id {sid!r} already used by {seen[sid]}; expected unique ids")
        seen[sid] = fp
        b = _Builder(fp, bs, shared_prefix, k, prefix_ns, max_think_s, priorities)
        tenant = tenant_of(doc.get("tenant"), f"{fp}: ")
        scope = tenant_scope(tenant, "shared" if shared_prefix else f"session:{sid}")
        p = (doc["tool_tokens"] + doc["system_tokens"]) // bs
        sessions.append(Session(sid, scope, b.items(doc["requests"], "requests", p, sid, scope),
                                tenant=tenant))
    if name is None:
        name = os.path.basename(os.path.normpath(os.fspath(path_or_dir)))
    return Workload(name=name, block_tokens=block_tokens or 64, closed_loop=True,
                    sessions=tuple(sessions), start=start, sessions_per_s=float(sessions_per_s),
                    concurrency=int(concurrency), seed=seed)


def _read(fp: str):
    opener = gzip.open if fp.endswith(".gz") else open
    try:
        with opener(fp, "rt", encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise TraceError(f"{fp}: malformed JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                         f"expected one JSON session object") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise TraceError(f"{fp}: cannot read session file ({e})") from None


def _int_field(where: str, obj: dict, key: str, minimum: int) -> int:
    if key not in obj:
        raise TraceError(f"{where}missing field {key!r}")
    v = obj[key]
    if type(v) is not int:
        raise TraceError(f"{where}field {key!r} must be an integer, got {v!r}")
    if v < minimum:
        raise TraceError(f"{where}field {key!r} is {v}; expected >= {minimum}")
    return v


def _num(v) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)


def _top_fields(fp: str, doc) -> int:
    where = f"{fp}: "
    if type(doc) is not dict:
        raise TraceError(f"{where}expected a JSON object (one session), got {type(doc).__name__}")
    if type(doc.get("id")) is not str:
        raise TraceError(f"{where}field 'id' must be a string, got {doc.get('id')!r}")
    bs = _int_field(where, doc, "block_size", 1)
    scope = doc.get("hash_id_scope", "local")
    if scope != "local":
        raise TraceError(f"{where}hash_id_scope {scope!r} is not supported; expected 'local'")
    _int_field(where, doc, "tool_tokens", 0)
    _int_field(where, doc, "system_tokens", 0)
    reqs = doc.get("requests")
    if type(reqs) is not list or not reqs:
        raise TraceError(f"{where}field 'requests' must be a non-empty list")
    return bs


class _Builder:
    """Turns one session's request tree into Session items (one instance per session)."""

    def __init__(self, fp: str, bs: int, shared: bool, k: int, prefix_ns: dict, max_think_s,
                 priorities: dict | None = None):
        self.fp, self.bs, self.shared = fp, bs, shared
        self.priorities = priorities
        self.max_think_s = max_think_s
        self.prefix_ns = prefix_ns
        self.private_base = PRIVATE_SPAN * (k + 1)
        self.n_tails = 0
        self.sids: set[str] = set()

    def items(self, reqs: list, path: str, p: int, sid: str, scope: str, ns: int = 0) -> tuple:
        out = []
        if self.shared and (p >= 1 << PREFIX_NS_BITS or ns >= 1 << (32 - PREFIX_NS_BITS)):
            raise TraceError(f"{self.fp}: {path}: shared prefix of {p} blocks (namespace {ns}) is too large")
        prefix = tuple(range(ns << PREFIX_NS_BITS, (ns << PREFIX_NS_BITS) + p)) if self.shared else ()
        prev_raw: list = []  # previous turn's raw full-block ids, for sharing tuple storage
        prev_core: tuple = ()
        prev_req = None
        sub_end = None  # latest end time of the sub-agents since the previous turn
        after_sub = False
        for i, r in enumerate(reqs):
            rp = f"{path}[{i}]"
            where = f"{self.fp}: {rp}: "
            if type(r) is not dict:
                raise TraceError(f"{where}expected a request object, got {type(r).__name__}")
            if r.get("type") == "subagent":
                out.append(self._subagent(r, rp, where, sid, scope))
                t_end = r.get("t")
                if _num(t_end):
                    sub_end = t_end if sub_end is None else max(sub_end, t_end)
                after_sub = True
                continue
            n_in = _int_field(where, r, "in", 1)
            n_out = _int_field(where, r, "out", 0)
            ids = r.get("hash_ids")
            if type(ids) is not list:
                raise TraceError(f"{where}field 'hash_ids' must be a list of integers, got {type(ids).__name__}")
            # reuse the previous turn's tuple when this one extends it (the usual case:
            # saves memory and re-checking the shared part)
            n = len(prev_raw)
            extends = bool(n) and len(ids) >= n and ids[n - 1] == prev_raw[-1] and ids[:n] == prev_raw
            start = n if extends else 0
            if not set(map(type, ids[start:])) <= _INT:
                bad = next(h for h in ids if type(h) is not int)
                raise TraceError(f"{where}field 'hash_ids' must hold only integers, found {bad!r}")
            full, rem = divmod(n_in, self.bs)
            if len(ids) != full and len(ids) != full + (rem > 0):
                raise TraceError(
                    f"{where}hash_ids has {len(ids)} blocks but input of {n_in} tokens at {self.bs} "
                    f"tokens a block needs floor = {full} (full blocks) or ceil = {full + (rem > 0)}")
            if self.shared and len(ids) > start and (min(ids[start:]) < 0 or max(ids[start:]) >= TAIL_OFFSET):
                raise TraceError(f"{where}hash ids must lie in [0, 2**31) for shared_prefix remapping")
            if len(ids) > start and (min(ids[start:]) < 0 or max(ids[start:]) >= ID_LIMIT):
                raise TraceError(f"{where}hash ids must lie in [0, 2**63)")
            think = self._think(r, where, prev_req, sub_end if after_sub else None)
            if self.max_think_s is not None and think > self.max_think_s:
                think = float(self.max_think_s)
            core = (prev_core if extends else ()) + self._map(ids, start, p, prefix)
            prev_raw, prev_core = ids, core
            if len(ids) == full and rem:
                self.n_tails += 1
                tail = (self.private_base + TAIL_OFFSET + self.n_tails) if self.shared else -self.n_tails
                hids = core + (tail,)
            else:
                hids = core
            out.append(self._turn(n_in, n_out, hids, think, p, ns))
            prev_req, sub_end, after_sub = r, None, False
        return tuple(out)

    def _turn(self, n_in: int, n_out: int, hids: tuple, think: float, p: int, ns: int) -> Turn:
        pr = self.priorities
        if pr is None:
            return Turn(n_in, n_out, hids, think)
        own = pr.get("subagent" if ns else "context", 0)
        return Turn(n_in, n_out, hids, think, priority=own,
                    prefix_tokens=min(p * self.bs, n_in), prefix_priority=pr.get("prefix", 0))

    def _map(self, ids: list, start: int, p: int, prefix: tuple) -> tuple:
        if not self.shared:
            return tuple(ids[start:])
        base = self.private_base
        if start >= p:
            return tuple([base + h for h in ids[start:]])
        cut = min(p, len(ids))
        return prefix[start:cut] + tuple([base + h for h in ids[cut:]])

    def _think(self, r: dict, where: str, prev: dict | None, sub_end) -> float:
        tt = r.get("think_time")
        if tt is not None and (not _num(tt) or tt < 0):
            raise TraceError(f"{where}field 'think_time' must be a number >= 0, got {tt!r}")
        t = r.get("t")
        if sub_end is not None and _num(t):
            return max(0.0, float(t - sub_end))
        if tt is not None:
            return float(tt)
        if prev is not None and _num(t) and _num(prev.get("t")):
            api = prev.get("api_time")
            return max(0.0, float(t - prev["t"] - (api if _num(api) else 0.0)))
        return 0.0

    def _subagent(self, r: dict, rp: str, where: str, sid: str, scope: str) -> Session:
        sub_path = f"{rp}.subagent.requests"
        reqs = r.get("requests")
        if type(reqs) is not list or not reqs:
            raise TraceError(f"{where}subagent field 'requests' must be a non-empty list")
        tool = _int_field(where, r, "tool_tokens", 0) if "tool_tokens" in r else 0
        system = _int_field(where, r, "system_tokens", 0) if "system_tokens" in r else 0
        agent = r.get("agent_id")
        agent = agent if type(agent) is str and agent else rp
        sub_sid = f"{sid}/{agent}"
        if sub_sid in self.sids:
            sub_sid = f"{sid}/{rp}"
        self.sids.add(sub_sid)
        kind = r.get("subagent_type")
        kind = f"subagent:{kind}" if type(kind) is str else "subagent"
        ns = self.prefix_ns.setdefault(kind, len(self.prefix_ns))
        p = (tool + system) // self.bs
        return Session(sub_sid, scope, self.items(reqs, sub_path, p, sub_sid, scope, ns))
