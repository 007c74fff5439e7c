"""What a replay measures: per-request rows, a timeline, and the summary a user tunes by.

Times are kept in integer nanoseconds of simulated (or scaled wall) time, so the same
run gives the same numbers to the last digit, and a fast-forwarded replay the same as a
step-by-step one. Summary names are stable (see README); add freely, rename never.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Final

import numpy as np

NS: Final = 1_000_000_000


@dataclass
class Row:
    rid: int
    session: str
    turn: int
    arrival_ns: int
    input_tokens: int
    output_tokens: int
    hit_gpu: int = 0
    hit_host: int = 0
    hit_disk: int = 0
    computed_tokens: int = 0
    admitted_ns: int = -1
    first_token_ns: int = -1
    done_ns: int = -1
    onboard_bytes: int = 0
    preemptions: int = 0
    serve_start_ns: int = 0          # when serving started (after a host fill's first wait)
    failed: str = ""
    rank: int = 0                    # the node's rank that served it (kvsim.run.ranks)
    node: int = 0                    # in a cluster: its node, and its instance (of all nodes')
    instance: int = 0
    hit_remote: int = -1             # tokens found in the remote tier (-1: none configured)

    @property
    def ttft_s(self) -> float:
        return (self.first_token_ns - self.arrival_ns) / NS

    @property
    def e2e_s(self) -> float:
        return (self.done_ns - self.arrival_ns) / NS

    @property
    def tpot_s(self) -> float:
        if self.output_tokens <= 1:
            return 0.0
        return (self.done_ns - self.first_token_ns) / NS / (self.output_tokens - 1)

    COLUMNS = ("rid", "session", "turn", "arrival_s", "input_tokens", "output_tokens",
               "hit_gpu", "hit_host", "hit_disk", "computed_tokens", "queue_s", "ttft_s",
               "tpot_s", "e2e_s", "onboard_bytes", "preemptions", "failed")

    def csv_values(self) -> tuple:
        done = self.done_ns >= 0
        return (self.rid, self.session, self.turn, f"{self.arrival_ns / NS:.9f}",
                self.input_tokens, self.output_tokens, self.hit_gpu, self.hit_host,
                self.hit_disk, self.computed_tokens,
                f"{(self.admitted_ns - self.arrival_ns) / NS:.9f}" if self.admitted_ns >= 0 else "",
                f"{self.ttft_s:.9f}" if self.first_token_ns >= 0 else "",
                f"{self.tpot_s:.9f}" if done else "", f"{self.e2e_s:.9f}" if done else "",
                self.onboard_bytes, self.preemptions, self.failed)


#: a request whose prompt has at least this many tokens counts as long in the summary's
#: ``ttft_s_by_input`` (the synthetic sessions stay below it; a burst's requests do not)
LONG_INPUT_TOKENS = 100_000


def dist(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


@dataclass
class Metrics:
    rows: list[Row] = field(default_factory=list)
    timeline: list[dict] = field(default_factory=list)
    steps: int = 0
    fast_forwarded_steps: int = 0
    ahead_inflight_steps: int = 0    # steps run ahead of the clock with transfers in flight
    requests_failed: int = 0
    holds_released: int = 0
    preemptions: int = 0
    remote_on: bool = False          # a remote tier is configured (its hits counted, 0 or more)
    # a request's fixed state (engine.statemoves; reported where the model keeps one):
    # moves to host, back to GPU, states dropped, stashed ones that did not fit the next
    # turn's prefix, cached tokens computed again for it
    state_on: bool = False
    state_stashed: int = 0
    state_restored: int = 0
    state_dropped: int = 0
    state_stale: int = 0
    state_recomputed_tokens: int = 0
    serve_start_ns: int = 0          # when serving started (after a host fill's first wait)
    # each step of decodes only: its duration (ns), the penalties and stretches in it
    # included (8 bytes a step: a long replay runs millions of them)
    decode_step_ns: array = field(default_factory=lambda: array("q"))
    # engine.manager_cost: each plan's bookkeeping (ns), charged to the executor
    manager_ns: array = field(default_factory=lambda: array("q"))

    def summary(self, counters: dict, traffic: dict, end_ns: int, wall_s: float,
                levels: dict[int, str]) -> dict:
        done = [r for r in self.rows if r.done_ns >= 0 and not r.failed]
        inp = sum(r.input_tokens for r in done)
        out = sum(r.output_tokens for r in done)
        span = end_ns / NS
        hit = {"gpu": sum(r.hit_gpu for r in done), "host": sum(r.hit_host for r in done),
               "disk": sum(r.hit_disk for r in done)}
        if self.remote_on or any(r.hit_remote >= 0 for r in self.rows):  # cache.remote
            hit["remote"] = sum(r.hit_remote for r in done if r.hit_remote > 0)
        by_level = lambda vec: {levels[i]: int(vec[i]) for i in sorted(levels)}  # noqa: E731
        return {
            "requests_completed": len(done),
            "requests_failed": self.requests_failed,
            "input_tokens": inp,
            "output_tokens": out,
            "hit_tokens": {**hit, "total": sum(hit.values())},
            "hit_ratio": (sum(hit.values()) / inp) if inp else 0.0,
            "computed_tokens": sum(r.computed_tokens for r in done),
            "ttft_s": dist([r.ttft_s for r in done]),
            "ttft_s_by_input": {  # short prompts, and long ones (LONG_INPUT_TOKENS or more)
                "short": dist([r.ttft_s for r in done if r.input_tokens < LONG_INPUT_TOKENS]),
                "long": dist([r.ttft_s for r in done if r.input_tokens >= LONG_INPUT_TOKENS]),
            },
            # turns that found part of their prefix in the host tier (it was onboarded first)
            "ttft_host_hit_s": dist([r.ttft_s for r in done if r.hit_host > 0]),
            "tpot_s": dist([r.tpot_s for r in done if r.output_tokens > 1]),
            # steps of decodes only (no prefill chunk): their duration, mean and percentiles
            "decode_step_s": dist([t / NS for t in self.decode_step_ns]),
            "decode_steps": len(self.decode_step_ns),
            "e2e_s": dist([r.e2e_s for r in done]),
            "throughput": {
                "requests_per_s": len(done) / span if span > 0 else 0.0,
                "output_tokens_per_s": out / span if span > 0 else 0.0,
            },
            "bytes": {k: int(traffic.get(k, 0)) for k in
                      ("host_to_gpu", "gpu_to_host", "disk_read", "disk_write")},
            "evicted_pages": by_level(counters["evicted_pages"]),
            "dropped_pages": by_level(counters["dropped_pages"]),
            "offloaded_pages": counters["offloaded_pages"],
            "onboarded_pages": counters["onboarded_pages"],
            "failed_batches": counters["failed_batches"],
            "preemptions": self.preemptions,
            "holds_released": self.holds_released,
            "engine_steps": self.steps,
            "sim_time_s": span,
            "wall_time_s": wall_s,
            **_copies(counters),
            **_manager(self.manager_ns),
            **self._state(counters),
        }

    def _state(self, counters: dict) -> dict:
        """The fixed state's moves (a model that keeps one; else nothing): stashed to host
        and restored (times, pages), dropped, stale (stashed, then of no use to the next
        turn's prefix), and the cached tokens recomputed for it."""
        if not self.state_on:
            return {}
        return {"fixed_state": {
            "stashed": self.state_stashed, "restored": self.state_restored,
            "dropped": self.state_dropped, "stale": self.state_stale,
            "recomputed_tokens": self.state_recomputed_tokens,
            "out_pages": counters.get("state_out_pages", 0),
            "in_pages": counters.get("state_in_pages", 0)}}


def _manager(ns: array) -> dict:
    """engine.manager_cost (only where it charged anything): the plans charged, the
    executor's seconds blocked in all, and the longest single plan's."""
    if not len(ns):
        return {}
    return {"manager": {"plans": len(ns), "busy_s": sum(ns) / NS, "max_s": max(ns) / NS}}


def _copies(counters: dict) -> dict:
    """Retained disk copies (with keep-copy or write-through on; else nothing): copies
    kept at restores, reused by evictions (no write), reclaimed for room; write-through
    pages written, skipped, failed, given up; disk slots retained at the end."""
    if "copies_reused" not in counters:
        return {}
    return {"disk_copies": {
        "kept": counters["copies_kept"], "reused": counters["copies_reused"],
        "reused_pending": counters.get("copies_reused_pending", 0),
        "reclaimed": counters["copies_reclaimed"],
        "write_through_pages": counters["write_through_pages"],
        "write_through_skipped": counters["write_through_skipped"],
        "write_through_failed": counters["write_through_failed"],
        "write_through_dropped": counters["write_through_dropped"],
        "retained_slots": counters.get("retained_slots", 0)}}
