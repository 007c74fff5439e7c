"""Workload analysis that needs no engine: the ideal (infinite-cache) prefix reuse.

``ideal_reuse_tokens`` replays a workload against an infinite cache keyed by (scope, id
prefix) and counts, for each request, the tokens covered by the longest prefix of its
hash ids that appeared as a prefix of some earlier request in the same scope. A matched
block at position ``i`` contributes ``min(block_tokens, input_tokens - i * block_tokens)``
tokens, so a partial last block counts only its own tokens. A request may match its
whole input (a real engine would still recompute at least one token; this does not).

Order: open loop, by arrival time (stable: ties keep file order); closed loop, sessions in
order, items depth first. With per-session scopes the closed-loop result does not depend on
the interleaving; with a shared scope only which session first misses a shared block does.
Pure function; the trie lives in local variables only.
"""

from __future__ import annotations

from .model import Workload


def _requests_in_order(workload: Workload) -> list:
    pairs = list(workload.iter_turns())
    if not workload.closed_loop:
        pairs.sort(key=lambda st: st[1].arrival_s if st[1].arrival_s is not None else st[0].start_s or 0.0)
    return pairs


def ideal_reuse_tokens(workload: Workload) -> tuple[int, int]:
    """(hit_tokens, input_tokens) under an infinite prefix cache (see module docstring)."""
    bt = workload.block_tokens
    roots: dict[str, dict] = {}
    hit = total = 0
    for session, turn in _requests_in_order(workload):
        node = roots.setdefault(session.scope, {})
        n_in = turn.input_tokens
        total += n_in
        ids = turn.hash_ids
        i = 0
        n = len(ids)
        while i < n:  # walk the matched part
            child = node.get(ids[i])
            if child is None:
                break
            node = child
            i += 1
        if i:
            hit += min(n_in, i * bt)  # blocks 0..i-1: full ones plus a possibly partial last
        while i < n:  # insert the rest
            child = {}
            node[ids[i]] = child
            node = child
            i += 1
    return hit, total


def ideal_reuse_ratio(workload: Workload) -> float:
    """hit_tokens / input_tokens of :func:`ideal_reuse_tokens` (0.0 for an empty workload)."""
    hit, total = ideal_reuse_tokens(workload)
    return hit / total if total else 0.0
