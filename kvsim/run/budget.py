"""What a run's workload will hold in memory, estimated from its config before anything is
allocated, and the check that refuses one this machine cannot hold.

A trace on disk bounds its own workload (its hash ids are in the file), but the synthetic
generator makes whatever its keys ask for: ``n_sessions: 1e9`` or a burst of
``input_tokens: 1e12`` would allocate for minutes and end in a MemoryError. The estimate
follows the generator's expected shape (``kvsim.workload.synthetic``: lognormal sizes
with sigma 0.8, so a mean 1.377 x the median; contexts growing by a step input and an
output a turn up to ``max_context_tokens``), in closed form, so that it costs nothing
whatever the keys say. It counts the block ids (a tuple slot each, a Python int for each
fresh id) and a fixed cost a request; a measured workload of the default shape holds
0.5-1x the estimate (``tests/test_reliability.py``).

A trace's own requests may still ask for more than its file holds: a request's cache
blocks are built from its tokens (``kvsim.workload.blocks.cache_blocks``), so an input
of 1e30 tokens in a few bytes of JSON would fill memory. ``check_requests`` refuses a
workload whose largest request's cache blocks (``KEY_BYTES`` each) are more than the
memory available, naming the trace and the session.

It also refuses a workload whose arrivals lie beyond what the engine's clock counts
(``check_span``): an open loop's last arrival, a closed loop's last session start or the
think times a session adds up (a session's last turn comes at least that long after it
starts; a think time of 1e300 s overflowed the clock with a traceback).
"""

from __future__ import annotations

import math
import os

from kvsim.config import ConfigFileError, RunConfig
from kvsim.workload import Session, TraceError, Workload

SIGMA = 0.8                      # the generator's lognormal sigma
MEAN_OVER_MEDIAN = math.exp(SIGMA ** 2 / 2)
BLOCK_TOKENS = 64                # the synthetic generator's trace block
SLOT_BYTES = 8                   # a tuple slot
ID_BYTES = 32                    # a fresh int id (a Python int object)
REQUEST_BYTES = 1024             # a Turn, its tuple, its result row
DEFAULTS = {"n_sessions": 40, "prefix_tokens": 4_000, "first_input_tokens": 1_500,
            "step_input_tokens": 1_500, "output_tokens": 250, "max_context_tokens": 60_000,
            "turns": (4, 14), "subagent_prob": 0.05}


def _session(n0: float, inc: float, ctx: float, turns: float) -> tuple[float, float, float]:
    """(ids held, fresh ids, requests) of one session: turn k reads min(n0 + k * inc, ctx)
    tokens, the session ends after ``turns`` or once a context passes ``ctx``."""
    cap = turns if inc <= 0 else min(turns, max(1.0, math.floor((ctx - n0) / inc) + 2))
    last = min(n0 + (cap - 1) * inc, ctx)
    ids = (cap * n0 + inc * cap * (cap - 1) / 2) / BLOCK_TOKENS
    ids = min(ids, cap * ctx / BLOCK_TOKENS)
    return ids, last / BLOCK_TOKENS + cap, cap


def synthetic_bytes(cfg: RunConfig) -> tuple[float, str, str]:
    """(estimated bytes, the key most to blame, what the estimate counts)."""
    syn = cfg.workload.synthetic
    get = {k: (getattr(syn, k) if getattr(syn, k) is not None else d) for k, d in DEFAULTS.items()}
    t0, t1 = get["turns"]
    f = MEAN_OVER_MEDIAN
    n0 = get["prefix_tokens"] + get["first_input_tokens"] * f
    inc = (get["step_input_tokens"] + get["output_tokens"]) * f
    ids, fresh, reqs = _session(n0, inc, get["max_context_tokens"], (t0 + t1) / 2)
    subs = get["subagent_prob"] * reqs
    s_ids, s_fresh, s_reqs = _session(2_000 + get["first_input_tokens"] * f / 2, inc,
                                      get["max_context_tokens"], 3.5)
    per = (ids + subs * s_ids) * SLOT_BYTES + (fresh + subs * s_fresh) * ID_BYTES \
        + (reqs + subs * s_reqs) * REQUEST_BYTES
    sessions = per * syn.n_sessions
    burst = 0.0
    if syn.burst is not None:
        blocks = math.ceil(syn.burst.input_tokens / BLOCK_TOKENS)
        burst = syn.burst.requests * (blocks * (SLOT_BYTES + ID_BYTES) + REQUEST_BYTES)
    if burst > sessions:
        b = syn.burst
        key = "workload.synthetic.burst." + ("requests" if b.requests > b.input_tokens // BLOCK_TOKENS
                                             else "input_tokens")
        what = f"{b.requests:,} burst requests of {b.input_tokens:,} tokens"
    else:
        ratios = {"n_sessions": syn.n_sessions / DEFAULTS["n_sessions"],
                  "turns": t1 / DEFAULTS["turns"][1],
                  "max_context_tokens": get["max_context_tokens"] / DEFAULTS["max_context_tokens"],
                  "prefix_tokens": get["prefix_tokens"] / DEFAULTS["prefix_tokens"],
                  "first_input_tokens": get["first_input_tokens"] / DEFAULTS["first_input_tokens"],
                  "step_input_tokens": get["step_input_tokens"] / DEFAULTS["step_input_tokens"]}
        key = "workload.synthetic." + max(ratios, key=ratios.get)
        what = (f"{syn.n_sessions:,} sessions of about {reqs + subs * s_reqs:,.0f} requests and "
                f"{ids + subs * s_ids:,.0f} blocks of {BLOCK_TOKENS} tokens")
    return sessions + burst, key, what


def available_bytes() -> int | None:
    """The memory this machine can give now (Linux: MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n < 2**40 * 1000 else f"{n:.3g} bytes"


def check_workload_memory(cfg: RunConfig, available: int | None = None) -> None:
    """Refuse a synthetic workload whose estimate is more than the memory available
    (ConfigFileError naming the key, the estimate and what is available)."""
    if cfg.workload.kind != "synthetic":
        return
    avail = available_bytes() if available is None else available
    if avail is None:
        return
    need, key, what = synthetic_bytes(cfg)
    if need > avail:
        raise ConfigFileError(f"{key}: the synthetic workload would take about {_gib(need)} of memory "
                              f"({what}); this machine has {_gib(avail)} available: lower {key}")


KEY_BYTES = 100                  # a cache block's key: a (hash id, part) tuple and its slot


def check_requests(cfg: RunConfig, workload: Workload, trace: str | None,
                   available: int | None = None) -> None:
    """Refuse a workload whose largest request's cache blocks would take more memory than
    this machine has available (TraceError naming the trace and session, or ConfigFileError
    naming the synthetic key)."""
    avail = available_bytes() if available is None else available
    if avail is None:
        return
    tpb = cfg.cache.tokens_per_block
    worst = max(((t.input_tokens, s) for s, t in workload.iter_turns()), key=lambda x: x[0],
                default=None)
    if worst is None or -(-worst[0] // tpb) * KEY_BYTES <= avail:
        return
    tokens, s = worst
    what = (f"session {s.sid}: a request of {tokens:,} input tokens would take about "
            f"{_gib(-(-tokens // tpb) * KEY_BYTES)} for its cache blocks of {tpb} tokens; this "
            f"machine has {_gib(avail)} available")
    if cfg.workload.kind == "synthetic":
        raise ConfigFileError(f"workload.synthetic: {what}: lower its token counts")
    raise TraceError(f"{trace or cfg.workload.path}: {what}; expected fewer input tokens")


# the engine's clock counts nanoseconds in a float's 53 bits of mantissa: beyond this many
# seconds a step no longer moves it exactly (about 104 days)
MAX_SIM_S = 2**53 / 1e9


def _thinks(session: Session, top: bool = True) -> float:
    """The think times a session waits in all (its sub-agents' too): the first turn of a
    session is released at its start, each later item its think time after the last."""
    return sum(_thinks(it, False) if isinstance(it, Session) else (0.0 if top and i == 0 else it.think_s)
               for i, it in enumerate(session.items))


def check_span(cfg: RunConfig, workload: Workload, starts: list[float] | None,
               trace: str | None) -> None:
    """Refuse a workload whose arrivals lie beyond what the engine's clock can count."""
    clock = f"kvsim's clock is exact up to {MAX_SIM_S:.3g} s (about 104 days)"
    if starts:
        last, key = max(starts), "workload.sessions_per_s"
    elif not workload.closed_loop:
        last = max((t.arrival_s or 0.0) for _, t in workload.iter_turns())
        key = "workload.time_scale" if cfg.workload.kind == "mooncake" else "the trace's arrival times"
    else:
        last, key = 0.0, ""
    if last > MAX_SIM_S:
        raise ConfigFileError(f"{key}: the last arrival would come at {last:.3g} s of simulated time; "
                              f"{clock}: raise the rate or lower the time scale")
    if not workload.closed_loop:
        return
    at = starts or [0.0] * len(workload.sessions)
    end, s = max(((a + _thinks(s), s) for a, s in zip(at, workload.sessions)), key=lambda x: x[0])
    if end <= MAX_SIM_S:
        return
    what = f"its last turn would come at {end:.3g} s of simulated time or later (its start and " \
           f"think times); {clock}"
    if cfg.workload.kind == "synthetic":
        raise ConfigFileError(f"workload.synthetic.think_s: session {s.sid}: {what}: lower "
                              "workload.synthetic.think_s")
    src = trace or cfg.workload.path
    raise TraceError(f"{src}: session {s.sid}: {what}; expected shorter think times (or cap them "
                     "with workload.max_think)")
