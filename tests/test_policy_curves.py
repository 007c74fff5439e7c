"""The policy curves on the Mooncake conversation trace (benchmarks/policy_curves.py):
kvsim's LRU agrees with an independent LRU over the trace's hash ids, and the offline
optimum (belady) is never below LRU. Slow (a full replay per policy and budget): marked
``slow``; skipped without ../shared/traces."""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import policy_curves  # noqa: E402

TRACE = policy_curves.TRACE
PAGE_TOKENS = 512
PAGE_BYTES = 160 * 2**20  # Llama 3 70B at tp 1: 320 KiB a token x 512 tokens

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not TRACE.exists(), reason=f"no trace at {TRACE}")]


def independent_lru(trace: Path, budget_gib: int) -> float:
    """Hit ratio over the last half of the requests of a plain LRU cache of 512-token
    blocks, keyed by the trace's hash ids (prefix-unique in Mooncake), requests one after
    another. A request finds the longest cached prefix of its prompt's blocks (a block
    counts if it holds the tokens the prompt needs of it), then its blocks, prompt and
    output (never reused), are cached, the deepest least recent, and the least recently
    used blocks leave until the budget holds."""
    cap = budget_gib * 2**30 // PAGE_BYTES
    cache: OrderedDict = OrderedDict()  # block key -> tokens it holds
    reqs = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    hits = inputs = 0
    for i, r in enumerate(reqs):
        n_in, n_out = r["input_length"], r["output_length"]
        ids = r["hash_ids"][:-(-n_in // PAGE_TOKENS)]
        kv = n_in + max(0, n_out - 1)  # tokens with KV when the request finishes
        nblocks = -(-kv // PAGE_TOKENS)
        keys = list(ids) + [("out", i, j) for j in range(len(ids), nblocks)]
        hit = 0
        for j, k in enumerate(ids):
            need = min(PAGE_TOKENS, n_in - j * PAGE_TOKENS)
            if cache.get(k, 0) < need:
                break
            hit += need
        if i >= len(reqs) // 2:
            hits += hit
            inputs += n_in
        for j in reversed(range(nblocks)):  # deepest first: the root is the most recent
            k = keys[j]
            held = min(PAGE_TOKENS, kv - j * PAGE_TOKENS)
            cache[k] = max(cache.pop(k, 0), held)
        while len(cache) > cap:
            cache.popitem(last=False)
    return hits / inputs


@pytest.fixture(scope="module")
def curves():
    return {(p, b): policy_curves.hit_ratio(p, b)[0]
            for p in ("lru", "belady") for b in policy_curves.BUDGETS_GIB}


@pytest.mark.parametrize("budget", policy_curves.BUDGETS_GIB)
def test_lru_agrees_with_an_independent_lru(curves, budget):
    ref = independent_lru(TRACE, budget)
    assert abs(curves["lru", budget] - ref) <= 0.01, (curves["lru", budget], ref)


def test_belady_is_between_lru_and_the_unbounded_ideal(curves):
    ideal = independent_lru(TRACE, 10**7)  # a cache that never evicts: all reuse there is
    for b in policy_curves.BUDGETS_GIB:
        assert curves["lru", b] <= curves["belady", b] <= ideal + 1e-9, b
    bel = [curves["belady", b] for b in policy_curves.BUDGETS_GIB]
    assert bel == sorted(bel)
    # at the largest budget the optimum loses no reuse at all (LRU still does)
    top = policy_curves.BUDGETS_GIB[-1]
    assert abs(curves["belady", top] - ideal) <= 0.002
    assert curves["lru", top] < ideal - 0.01
