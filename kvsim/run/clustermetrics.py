"""A cluster's figures: each instance's, and the cluster's own.

The cluster's summary is computed over all its requests (``kvsim.run.ranks.merge``: a
hit ratio is hit tokens over input tokens, never a mean over instances); beside it:

- ``instances``: each instance's (its node, its rank) requests, hit ratio by tier, TTFT,
  TPOT and queueing time (arrival to admission) percentiles;
- ``cluster``: its shape and router, requests per instance and the instances that served
  none, hit ratio by tier, and the load imbalance: at every ``output.timeline_interval``
  the instances' queued prefill tokens (each request's prompt tokens not found cached,
  from its arrival to its first token), max over mean, its mean and worst over the
  samples in which any instance had a queue; ``network_bytes``: bytes between nodes (none
  without a remote tier).

Each row and timeline row is marked with its instance, node and rank.
"""

from __future__ import annotations

from typing import Any, Sequence

from kvsim.engine.metrics import NS, Metrics, dist

LEVELS = ("gpu", "host", "disk")


def is_cluster(cfg) -> bool:
    """Whether a run reports as a cluster: several instances, on several nodes or behind a
    run-time router (a node of ranks split by session hash reports as a node)."""
    n = cfg.node.ranks * cfg.cluster.nodes
    return n > 1 and (cfg.cluster.nodes > 1 or cfg.router.policy != "session-hash")


def _levels(each: Sequence[dict]) -> tuple[str, ...]:
    """The tiers hits are counted in: gpu, host, disk, and remote where configured."""
    return LEVELS + ("remote",) if any("remote" in s["hit_tokens"] for s in each) else LEVELS


def _by_tier(s: dict, levels: tuple[str, ...]) -> dict:
    inp = s["input_tokens"]
    return {k: (s["hit_tokens"].get(k, 0) / inp if inp else 0.0) for k in levels}


def queue_samples(rows: Sequence[Any], n: int, interval_ns: int, end_ns: int) -> list[list[int]]:
    """Each instance's queued prefill tokens at each multiple of ``interval_ns`` up to
    ``end_ns``: a request counts its uncached prompt tokens from its arrival until its
    first token (or its end, if it failed)."""
    events: list[tuple[int, int, int]] = []
    for r in rows:
        w = r.input_tokens - r.hit_gpu - r.hit_host - r.hit_disk - max(0, r.hit_remote)
        if w <= 0:
            continue
        stop = r.first_token_ns if r.first_token_ns >= 0 else (r.done_ns if r.done_ns >= 0 else end_ns)
        events.append((r.arrival_ns, r.instance, w))
        events.append((stop, r.instance, -w))
    events.sort(key=lambda e: (e[0], e[2] > 0))  # at one time: leave before joining
    q = [0] * n
    out: list[list[int]] = []
    k = 0
    t = 0
    while t <= end_ns:
        while k < len(events) and events[k][0] <= t:
            q[events[k][1]] += events[k][2]
            k += 1
        out.append(list(q))
        t += interval_ns
    return out


def imbalance(samples: list[list[int]]) -> dict:
    """max/mean of the instances' queues: its mean and worst over the samples with any
    queue, and how many such samples there were."""
    ratios = []
    for q in samples:
        total = sum(q)
        if total > 0:
            ratios.append(max(q) * len(q) / total)
    return {"mean": sum(ratios) / len(ratios) if ratios else 1.0,
            "max": max(ratios) if ratios else 1.0, "samples": len(ratios)}


def cluster_metrics(cfg, merged: Metrics, each: list[dict], cluster: Any) -> dict:
    """The ``instances`` and ``cluster`` sections of a cluster's summary; marks the merged
    rows and timeline with instance, node and rank."""
    per_node = cfg.node.ranks
    n = len(each)
    for row in merged.rows:  # (merge marked each with its instance's index)
        row.instance = row.rank
        row.node, row.rank = divmod(row.instance, per_node)
    for t in merged.timeline:
        i = t.pop("rank")
        t.update(instance=i, node=i // per_node, rank=i % per_node)
    end = max((max(r.done_ns, r.first_token_ns, r.arrival_ns) for r in merged.rows), default=0)
    interval = max(1, round(cfg.output.timeline_interval * NS))
    samples = queue_samples(merged.rows, n, interval, end)
    queues: list[list[float]] = [[] for _ in range(n)]
    for r in merged.rows:
        if r.admitted_ns >= 0:
            queues[r.instance].append((r.admitted_ns - r.arrival_ns) / NS)
    instances = []
    levels = _levels(each)
    for i, s in enumerate(each):
        instances.append({
            "instance": i, "node": i // per_node, "rank": i % per_node,
            "requests": s["requests_completed"] + s["requests_failed"],
            "requests_completed": s["requests_completed"], "hit_ratio": s["hit_ratio"],
            "hit_ratio_by_tier": _by_tier(s, levels), "ttft_s": s["ttft_s"], "tpot_s": s["tpot_s"],
            "queue_s": dist(queues[i]), "input_tokens": s["input_tokens"],
            "hit_tokens": s["hit_tokens"]})
    served = [x["requests"] for x in instances]
    total_in = sum(s["input_tokens"] for s in each)
    hit = {k: sum(s["hit_tokens"].get(k, 0) for s in each) for k in levels}
    return {
        "instances": instances,
        "cluster": {
            "nodes": cfg.cluster.nodes, "ranks_per_node": per_node, "instances": n,
            "router": cfg.router.policy,
            "requests_per_instance": served,
            "idle_instances": sum(1 for x in served if x == 0),
            "requests_per_instance_min": min(served), "requests_per_instance_max": max(served),
            "requests_per_instance_max_over_mean": (max(served) * n / sum(served)) if sum(served) else 1.0,
            "hit_ratio": sum(hit.values()) / total_in if total_in else 0.0,
            "hit_ratio_by_tier": {k: (hit[k] / total_in if total_in else 0.0) for k in levels},
            "load_imbalance": imbalance(samples),
            "network_bytes": 0,
            "routed_at_arrival": cluster is not None,
        },
    }
