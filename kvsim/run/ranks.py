"""A node of ranks: the run's ranks built on one runtime, and their results as one.

Each rank is a single-instance replay (its own tier manager, policies, backend and
engine) over the sessions the router sends it (``router.policy: session-hash``: a stable
hash of the session id, so a session's turns stay on one rank); all ranks' engines run
as processes of one runtime, so one clock orders the node, and the backends share the
node's parts through it (``Runtime.shared``: the disk drive and its I/O workers, the
driver's lock). One rank is a plain replay: its workload, start times and objects are
the run's own, built in the same order, so its outputs are those of a replay without a
node.

``merge`` makes one ``Metrics`` of the ranks' (rows, timeline, step counts), so the
node's summary is computed over all its requests (a hit ratio is hit tokens over input
tokens, never a mean over ranks); ``sum_counts`` adds the ranks' core counters and
backend counters.

Cost: building and merging is linear in the ranks and their requests; nothing polls the
ranks while they run.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

from kvsim.engine.metrics import Metrics
from kvsim.workload import Workload


def check_node_fit(cfg, shape, profile, page_bytes: int) -> None:
    """What the node section cannot check alone, with the model and the hardware: the
    ranks' GPUs within the node's, and, for a node of several ranks, each rank's GPU tier
    beside its weights within a GPU's memory and its host partition at least one fill
    unit. ConfigFileError naming the key. (A single instance may be given any GPU quota:
    a what-if beyond one GPU, as the policies' hit-ratio curves use.)"""
    from kvsim.config import ConfigFileError  # noqa: PLC0415
    from kvsim.config.node import check_node  # noqa: PLC0415

    node = cfg.node
    try:
        check_node(node, shape.tp)
    except ValueError as e:
        raise ConfigFileError(str(e)) from None
    if node.ranks == 1:
        return
    per = min(node.ranks_per_gpu, node.ranks)  # (ranks on one GPU, each its tier and weights)
    for i, t in enumerate(cfg.cache.tiers):
        if t.level == "gpu" and per * (t.quota + shape.weight_bytes_per_gpu) > profile.gpu.memory:
            where = ("each rank's tier is on its own GPUs" if per == 1 else
                     f"node.ranks_per_gpu {per}: that many ranks' tiers and weights on each GPU")
            raise ConfigFileError(
                f"cache.tiers[{i}].quota: {per} x ({t.quota:,} bytes of KV beside "
                f"{shape.weight_bytes_per_gpu:,} of weights) a GPU exceed the "
                f"{profile.gpu.memory:,} bytes of a {profile.gpu.name} (node.ranks {node.ranks}: {where})"
                if per > 1 else
                f"cache.tiers[{i}].quota: {t.quota:,} bytes of KV beside {shape.weight_bytes_per_gpu:,} "
                f"of weights a GPU exceed the {profile.gpu.memory:,} bytes of a {profile.gpu.name} "
                f"(node.ranks {node.ranks}: {where})")
        if t.level == "host" and t.fill is not None and t.fill.mode != "none" \
                and (t.max_quota or t.quota) < max(t.fill.unit, page_bytes):
            raise ConfigFileError(
                f"cache.tiers[{i}].quota: a rank's host partition of {t.max_quota or t.quota:,} bytes "
                f"is smaller than one fill unit ({t.fill.unit:,} bytes, cache.tiers[{i}].fill.unit)")


def rank_of(sid: str, ranks: int) -> int:
    """The rank ``session-hash`` sends the session ``sid`` to: a stable hash (SHA-256 of the
    id, not Python's per-process ``hash``), the same on every run and machine."""
    if ranks == 1:
        return 0
    return int.from_bytes(hashlib.sha256(sid.encode()).digest()[:8], "little") % ranks


def split(workload: Workload, starts: list[float] | None, ranks: int
          ) -> list[tuple[Workload, list[float] | None]]:
    """Each rank's workload (its sessions, in the trace's order) and its sessions' start
    times. A closed loop that starts ``concurrency`` sessions at a time keeps that many a
    rank (at least one). One rank: the workload and starts as they are."""
    if ranks == 1:
        return [(workload, starts)]
    picks: list[list[int]] = [[] for _ in range(ranks)]
    for i, s in enumerate(workload.sessions):
        picks[rank_of(s.sid, ranks)].append(i)
    out = []
    for idx in picks:
        sessions = tuple(workload.sessions[i] for i in idx)
        conc = max(1, -(-workload.concurrency // ranks)) if workload.concurrency else 0
        w = dataclasses.replace(workload, sessions=sessions, concurrency=conc)
        out.append((w, [starts[i] for i in idx] if starts is not None else None))
    return out


@dataclass
class RankRun:
    """One rank's replay: what ``kvsim.run.pipeline`` builds for it."""

    rank: int
    workload: Workload
    starts: list[float] | None
    policy: Any
    placement: Any
    tier_policies: dict
    mgr: Any
    settings: Any = None
    backend: Any = None
    engine: Any = None


def merge(metrics: Sequence[Metrics], ranks: int) -> Metrics:
    """The node's metrics: the ranks' rows (each marked with its rank), timelines (a
    ``rank`` column when there are several) and counts together. One rank: its own."""
    if ranks == 1:
        return metrics[0]
    out = Metrics()
    for r, m in enumerate(metrics):
        for row in m.rows:
            row.rank = r
        out.rows.extend(m.rows)
        out.timeline.extend({"rank": r, **row} for row in m.timeline)
        out.steps += m.steps
        out.fast_forwarded_steps += m.fast_forwarded_steps
        out.ahead_inflight_steps += m.ahead_inflight_steps
        out.requests_failed += m.requests_failed
        out.holds_released += m.holds_released
        out.preemptions += m.preemptions
        out.state_on |= m.state_on
        out.remote_on |= m.remote_on
        out.state_stashed += m.state_stashed
        out.state_restored += m.state_restored
        out.state_dropped += m.state_dropped
        out.state_stale += m.state_stale
        out.state_recomputed_tokens += m.state_recomputed_tokens
        out.decode_step_ns.extend(m.decode_step_ns)
        out.manager_ns.extend(m.manager_ns)
    out.serve_start_ns = max(m.serve_start_ns for m in metrics)
    out.rows.sort(key=lambda row: (row.arrival_ns, row.rank, row.rid))
    out.timeline.sort(key=lambda row: (row["t_s"], row["rank"]))
    return out


def sum_counts(dicts: Sequence[dict]) -> dict:
    """The ranks' counters added: numbers, and lists of them element by element (the
    core's per-level vectors); anything else as the first rank has it."""
    if len(dicts) == 1:
        return dicts[0]
    out: dict = {}
    for k, v in dicts[0].items():
        vals = [d.get(k) for d in dicts]
        if isinstance(v, bool) or not all(isinstance(x, (int, float, list)) for x in vals):
            out[k] = v
        elif isinstance(v, list):
            out[k] = _add_lists(vals)
        else:
            out[k] = sum(vals)
    return out


def _add_lists(vals: list) -> list:
    if vals and isinstance(vals[0], list) and vals[0] and isinstance(vals[0][0], list):
        return [_add_lists([v[i] for v in vals]) for i in range(len(vals[0]))]
    return [sum(x) for x in zip(*vals)]


__all__ = ["RankRun", "check_node_fit", "merge", "rank_of", "split", "sum_counts"]
