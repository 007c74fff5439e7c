"""A seeded generator of agentic sessions shaped like the real agentic coding traces.

Each session: a tools+system prefix (``prefix_tokens``, the same text for every session),
then turns whose context grows: turn 1 reads the prefix plus a user prompt; turn k reads
turn k-1's input, its output and a new user/tool input. Think times, output and input
sizes are lognormal around the given medians; with probability ``subagent_prob`` a turn is
followed by a sub-agent (its own prefix, shared by all sub-agents, and its own growing
context; it shares the parent's scope); the parent's next input then also carries the
sub-agent's result. A session ends after its drawn number of turns or before its context
would pass ``max_context_tokens``.

Hash ids (``block_tokens`` a block) keep the trace conventions and the package invariant
``len(hash_ids) == ceil(input_tokens / block_tokens)``:

- the full prefix blocks have ids ``0 .. P-1`` (``P = prefix_tokens // block_tokens``), the
  sub-agent prefix blocks ``P .. P+Q-1``; every other block gets a fresh id from a counter
  local to the call, so ids never collide across sessions;
- turn k's ids are turn k-1's *full* blocks followed by fresh ids: a partial last block
  of turn k-1 is filled by new tokens in turn k, so its position gets a new id (as in the
  real traces, where only full blocks are reused).

``shared_prefix=True`` puts every session in scope ``shared`` (the prefix blocks are then
reusable across sessions); otherwise each session has scope ``session:<sid>``. The same
arguments give an identical Workload; the RNG is a fresh ``numpy`` Generator per call.

A burst (``burst_requests`` > 0): that many long-context requests arrive together at
``burst_at_s``, on top of the sessions: one-turn sessions ``burst-<k>``, each in its own
scope ``burst:<k>`` with ``burst_input_tokens`` fresh tokens (nothing cached to reuse) and
``burst_output_tokens`` to generate. They are pinned to that start time (``start_s``; the
Poisson starts of the other sessions are drawn as without them, so the sessions are the
same with and without a burst) and come after every other session, ids included.
"""

from __future__ import annotations

import numpy as np

from .model import Session, Turn, Workload, check_start_policy


class _Gen:
    """Per-call generator state (RNG and the id counter)."""

    def __init__(self, seed: int, block_tokens: int, sigma: float, first_free_id: int):
        self.rng = np.random.default_rng(seed)
        self.bt = block_tokens
        self.sigma = sigma
        self.next_id = first_free_id

    def lognormal_int(self, median: float, lo: int = 1) -> int:
        return max(lo, int(round(median * float(np.exp(self.sigma * self.rng.standard_normal())))))

    def lognormal(self, median: float) -> float:
        return round(median * float(np.exp(self.sigma * self.rng.standard_normal())), 3)

    def extend(self, kept: tuple, n_tokens: int) -> tuple:
        """``kept`` (full blocks) followed by fresh ids up to ``ceil(n_tokens / bt)`` blocks."""
        need = -(-n_tokens // self.bt) - len(kept)
        fresh = tuple(range(self.next_id, self.next_id + need))
        self.next_id += need
        return kept + fresh


def synthetic_agentic(n_sessions: int = 40, seed: int = 0, turns: tuple[int, int] = (4, 14), *,
                      block_tokens: int = 64, prefix_tokens: int = 4_000,
                      first_input_tokens: float = 1_500, step_input_tokens: float = 1_500,
                      output_tokens: float = 250, think_s: float = 5.0, sigma: float = 0.8,
                      subagent_prob: float = 0.05, subagent_turns: tuple[int, int] = (2, 5),
                      subagent_prefix_tokens: int = 2_000, max_context_tokens: int = 60_000,
                      shared_prefix: bool = True, start: str = "poisson", sessions_per_s: float = 0.5,
                      concurrency: int = 8, name: str = "synthetic-agentic",
                      burst_requests: int = 0, burst_input_tokens: int = 200_000,
                      burst_output_tokens: int = 64, burst_at_s: float = 60.0) -> Workload:
    """Generate a closed-loop agentic workload (see the module docstring). Defaults give
    about 40 sessions, ~350 requests, contexts of ~5K to 60K tokens; no burst."""
    check_start_policy(start, sessions_per_s, concurrency)
    if burst_requests < 0 or burst_input_tokens < 1 or burst_output_tokens < 0 or burst_at_s < 0:
        raise ValueError("need burst_requests >= 0, burst_input_tokens >= 1, burst_output_tokens "
                         f">= 0 and burst_at_s >= 0, got {burst_requests}, {burst_input_tokens}, "
                         f"{burst_output_tokens}, {burst_at_s}")
    if burst_requests and start != "poisson":
        raise ValueError(f"a burst needs start='poisson' (its requests arrive at a set time), got {start!r}")
    if n_sessions < 0 or turns[0] < 1 or turns[1] < turns[0]:
        raise ValueError(f"need n_sessions >= 0 and 1 <= turns[0] <= turns[1], got {n_sessions}, {turns}")
    if subagent_turns[0] < 1 or subagent_turns[1] < subagent_turns[0]:
        raise ValueError(f"need 1 <= subagent_turns[0] <= subagent_turns[1], got {subagent_turns}")
    if max_context_tokens <= prefix_tokens:
        raise ValueError(f"max_context_tokens {max_context_tokens} must exceed prefix_tokens {prefix_tokens}")
    bt = block_tokens
    p, q = prefix_tokens // bt, subagent_prefix_tokens // bt
    main_prefix = tuple(range(p))
    sub_prefix = tuple(range(p, p + q))
    g = _Gen(seed, bt, sigma, p + q)
    sessions = []
    for s in range(n_sessions):
        sid = f"syn-{s:04d}"
        scope = "shared" if shared_prefix else f"session:{sid}"
        n_turns = int(g.rng.integers(turns[0], turns[1] + 1))
        items: list = []
        n_in = prefix_tokens + g.lognormal_int(first_input_tokens)
        kept = main_prefix
        think = 0.0
        n_subs = 0
        for k in range(n_turns):
            if k and n_in > max_context_tokens:
                break
            n_in = min(n_in, max_context_tokens)
            n_out = g.lognormal_int(output_tokens)
            items.append(Turn(n_in, n_out, g.extend(kept, n_in), think))
            kept = items[-1].hash_ids[: n_in // bt]
            extra = 0
            if k + 1 < n_turns and g.rng.random() < subagent_prob:
                n_subs += 1
                sub, extra = _subagent(g, f"{sid}/agent_{n_subs:03d}", scope, subagent_turns,
                                       subagent_prefix_tokens, sub_prefix, first_input_tokens,
                                       step_input_tokens, output_tokens, think_s, max_context_tokens)
                items.append(sub)
            n_in = n_in + n_out + extra + g.lognormal_int(step_input_tokens)
            think = g.lognormal(think_s)
        sessions.append(Session(sid, scope, tuple(items)))
    for k in range(burst_requests):
        turn = Turn(burst_input_tokens, burst_output_tokens, g.extend((), burst_input_tokens))
        sessions.append(Session(f"burst-{k:02d}", f"burst:{k}", (turn,), start_s=float(burst_at_s)))
    return Workload(name=name, block_tokens=bt, closed_loop=True, sessions=tuple(sessions),
                    start=start, sessions_per_s=float(sessions_per_s), concurrency=int(concurrency),
                    seed=seed)


def _subagent(g: _Gen, sid: str, scope: str, turns: tuple[int, int], prefix_tokens: int,
              prefix: tuple, first_input: float, step_input: float, output: float, think_s: float,
              max_context: int) -> tuple[Session, int]:
    """A sub-agent Session and the size of the result it hands back to its parent."""
    n_turns = int(g.rng.integers(turns[0], turns[1] + 1))
    items = []
    n_in = prefix_tokens + g.lognormal_int(first_input / 2)
    kept = prefix
    think = 0.0
    for k in range(n_turns):
        if k and n_in > max_context:
            break
        n_in = min(n_in, max_context)
        n_out = g.lognormal_int(output)
        items.append(Turn(n_in, n_out, g.extend(kept, n_in), think))
        kept = items[-1].hash_ids[: n_in // g.bt]
        n_in = n_in + n_out + g.lognormal_int(step_input)
        think = g.lognormal(think_s / 4)
    return Session(sid, scope, tuple(items)), items[-1].output_tokens
