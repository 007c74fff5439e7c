"""``belady`` as a bound: what it is one request at a time, what concurrency does to it,
and the bound that holds whatever the concurrency.

Three parts (``--parts``, all by default):

``min``: one request at a time (``engine.max_running=1``), on the Mooncake conversation
trace with one GPU tier (the setup of benchmarks/policy_curves.py: 512-token pages of
Llama 3 70B at tp 1, 160 MiB; hit ratio over the last half of the requests), kvsim's
``belady`` against ``min_hits``, an independent MIN written here over the trace's raw hash
ids: a request's prompt finds the longest cached prefix of its blocks, then all its
blocks (prompt and output) are cached together, and the cache gives up the blocks of
other requests used again furthest in the future (deepest first on ties), as many as it
must. In kvsim's model a running request's pages are all resident at once; a textbook
MIN that serves a prompt's blocks one by one and may evict a block of the prompt it is
serving (the one the issue compared with: 0.1411 on the first 3,000 requests at 80 GiB)
does not, and is no bound for a model where a prefill attends to its whole prompt (the
last column, ``per_access_min_hits``).

``concurrency``: ``belady`` and ``lru`` on the first ``--limit`` requests at 80 GiB with
``engine.max_running`` 1, 2, 8 and the config's 128: the hit ratio, the share of the GPU
tier pinned (pages of running or waiting requests) at each eviction, and how far back the
hits reach (turns since the block was last used).

``bound``: on the shipped workloads (Mooncake at 80/400/1600/6400 GiB, one GPU tier, as
policy_curves; ``configs/default.yaml`` and the first 20 sessions of
``configs/agentic-coding.yaml``, three tiers),
every policy's hit ratio over the whole run against ``belady``'s and against
``reuse_bound``: the prompt tokens that any policy could find cached at all, whatever the
cache size and the concurrency (a block counts if an earlier turn of its session, or
another session's turn that can come first, holds it). Greedy ``belady`` is not a bound
with concurrency on (tests/test_belady_bound.py has a five-request case where ``gdsf``
beats it); ``reuse_bound`` is.

Prints each part's table, then ``belady_vs_min_max_gap: X`` last (the largest gap of the
``min`` part).

    python benchmarks/policy_bound.py [--parts min,concurrency,bound] [--trace PATH]
        [--budgets-min 80,400] [--limit 3000] [--policies lru,...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from bisect import bisect_left, bisect_right
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import policy_curves  # noqa: E402

import kvsim.run.pipeline  # noqa: E402
from kvsim.config import load_config  # noqa: E402
from kvsim.core import TierManager  # noqa: E402
from kvsim.core.keys import chain_key, scope_root  # noqa: E402
from kvsim.core.policy import POLICY_NAMES  # noqa: E402
from kvsim.run import prepare_run, replay  # noqa: E402
from kvsim.workload import Session, Turn  # noqa: E402
from kvsim.workload.blocks import cache_blocks  # noqa: E402

TRACE = policy_curves.TRACE
PAGE_TOKENS = 512
PAGE_BYTES = 160 * 2**20  # Llama 3 70B at tp 1: 320 KiB a token x 512 tokens
NEVER = float("inf")


# -- the independent MIN ------------------------------------------------------------------

def read_requests(path: Path, limit: int | None = None) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
                if limit is not None and len(out) >= limit:
                    break
    return out


def min_hits(requests: list[dict], pages: int) -> list[int]:
    """The prompt tokens each request finds cached under MIN, one request at a time, in a
    cache of ``pages`` 512-token blocks keyed by the trace's hash ids (prefix-unique in a
    Mooncake trace: an id names its whole prefix). A request's blocks (its prompt's, then
    its output's, never used again) are all in the cache when it ends; a block holds the
    tokens the request had there, and a later prompt finds it only if it holds as many as
    that prompt needs. Then the cache gives up, of the other requests' blocks, those used
    again furthest in the future (the next request whose prompt holds it; never: first),
    the deepest first on ties, until it holds ``pages``."""
    prompts = [r["hash_ids"][:-(-r["input_length"] // PAGE_TOKENS)] for r in requests]
    uses: dict = {}  # id -> the requests whose prompt holds it, ascending
    for i, ids in enumerate(prompts):
        for k in ids:
            uses.setdefault(k, []).append(i)

    def next_use(k, i):
        u = uses.get(k, ())
        j = bisect_right(u, i)
        return u[j] if j < len(u) else NEVER

    cache: dict = {}  # block -> (tokens held, depth)
    out = []
    for i, r in enumerate(requests):
        n_in, n_out = r["input_length"], r["output_length"]
        hit = 0
        for j, k in enumerate(prompts[i]):
            need = min(PAGE_TOKENS, n_in - j * PAGE_TOKENS)
            if k not in cache or cache[k][0] < need:
                break
            hit += need
        out.append(hit)
        kv = n_in + max(0, n_out - 1)  # tokens with KV when the request ends
        mine = list(prompts[i]) + [("out", i, j) for j in range(len(prompts[i]),
                                                                 -(-kv // PAGE_TOKENS))]
        for j, k in enumerate(mine):
            held = min(PAGE_TOKENS, kv - j * PAGE_TOKENS)
            cache[k] = (max(cache[k][0], held) if k in cache else held, j)
        over = len(cache) - pages
        if over > 0:
            keep = set(mine)
            others = [k for k in cache if k not in keep]
            others.sort(key=lambda k: (next_use(k, i), cache[k][1]), reverse=True)
            for k in others[:over]:
                del cache[k]
    return out


def per_access_min_hits(requests: list[dict], pages: int) -> list[int]:
    """The textbook MIN the issue compared with, for contrast: a prompt's blocks (then its
    output's) are accesses one after another, each cached on a miss, and the cache gives
    up the block whose next access is furthest, which may be a block of the prompt being
    served. A prompt finds its longest prefix of blocks cached (holding the tokens it
    needs) at their access. Not kvsim's model: a prefill attends to its whole prompt."""
    import heapq

    acc = []  # (request, block, tokens the prompt needs, tokens it holds)
    for i, r in enumerate(requests):
        n_in, n_out = r["input_length"], r["output_length"]
        ids = r["hash_ids"][:-(-n_in // PAGE_TOKENS)]
        kv = n_in + max(0, n_out - 1)
        for j in range(-(-kv // PAGE_TOKENS)):
            need = min(PAGE_TOKENS, n_in - j * PAGE_TOKENS) if j < len(ids) else 0
            acc.append((i, ids[j] if j < len(ids) else ("out", i, j), need,
                        min(PAGE_TOKENS, kv - j * PAGE_TOKENS)))
    nxt, seen = [0] * len(acc), {}
    for t in range(len(acc) - 1, -1, -1):
        nxt[t] = seen.get(acc[t][1], NEVER)
        seen[acc[t][1]] = t
    cache: dict = {}  # block -> (next access, tokens held)
    heap: list = []
    out = [0] * len(requests)
    cur, whole = -1, False  # the request served, and whether its prefix is cached so far
    for t, (i, k, need, held) in enumerate(acc):
        if i != cur:
            cur, whole = i, True
        hit = k in cache and cache[k][1] >= need
        if need:
            if not hit:
                whole = False
            elif whole:
                out[i] += need
        cache[k] = (nxt[t], max(held, cache[k][1] if k in cache else 0))
        heapq.heappush(heap, (-nxt[t], t, k))
        while len(cache) > pages:
            nu, _, kk = heapq.heappop(heap)
            if kk in cache and cache[kk][0] == -nu:
                del cache[kk]
    return out


def tail_ratio(hits: list[int], requests: list[dict]) -> float:
    """Hit tokens / prompt tokens over the last half of the requests."""
    h = len(requests) // 2
    return sum(hits[h:]) / max(1, sum(r["input_length"] for r in requests[h:]))


# -- the bound whatever the concurrency -----------------------------------------------------

def _turns(s: Session, sid: str = "") -> list[tuple[str, Turn]]:
    """A session's turns in the order it runs them (a sub-agent's where it starts), each
    with the id of the (sub-)session it belongs to."""
    out: list[tuple[str, Turn]] = []
    for item in s.items:
        out.extend([(s.sid, item)] if isinstance(item, Turn) else _turns(item))
    return out


def reuse_bound(workload, tokens_per_block: int) -> dict[tuple[str, int], int]:
    """The prompt tokens any policy could find cached, turn by turn, whatever the cache
    size and the concurrency: a turn can find a block only if a turn prepared before it
    computed the block (a page holds what a request computed, and a request computes
    only after its own prepare), and that turn is an earlier turn of the same session or
    another session's turn that can come first: one whose arrival is fixed and no later
    (open loop; admission is first come, first served), or any turn of another session
    when arrivals depend on the replay (closed loop). Counts the longest prefix of such
    blocks of each prompt, each block by the tokens the prompt needs of it. Keyed as a
    run's rows are: (the turn's (sub-)session id, its place in its top-level session's
    walk, from 1). (A request preempted part way is prepared again and may find its own
    pages: for such a row, count its whole prompt.)"""
    B, bt = tokens_per_block, workload.block_tokens
    per_session = []  # per top-level session: [(sid, turn, arrival or None, chain keys)]
    for s in workload.sessions:
        turns = []
        for sid, t in _turns(s):
            key, chain = scope_root(s.scope), []
            for ids in cache_blocks(t.hash_ids, bt, B, t.input_tokens):
                key = chain_key(key, ids)
                chain.append(key)
            turns.append((sid, t, t.arrival_s, chain))
        per_session.append(turns)
    open_loop = all(a is not None for turns in per_session for _, _, a, _ in turns)
    # key -> the two earliest turns holding it from two different sessions, as (arrival,
    # session) (arrivals all 0.0 in a closed loop: any order can happen)
    first: dict[bytes, list[tuple[float, int]]] = {}
    for si, turns in enumerate(per_session):
        for _, _, a, chain in turns:
            at = (a if open_loop else 0.0, si)
            for k in set(chain):
                two: list[tuple[float, int]] = []
                for cand in sorted(first.get(k, []) + [at]):
                    if all(cand[1] != s2 for _, s2 in two):
                        two.append(cand)
                first[k] = two[:2]
    out: dict[tuple[str, int], int] = {}
    for si, turns in enumerate(per_session):
        own: set[bytes] = set()  # the keys of this session's earlier turns
        for n, (sid, t, a, chain) in enumerate(turns, start=1):
            when = a if open_loop else 0.0
            total = 0
            for j, k in enumerate(chain):
                other = [at for at, s2 in first.get(k, ()) if s2 != si][:1]
                if not (k in own or (other and other[0] <= when)):
                    break
                total += min(B, t.input_tokens - j * B)
            out[sid, n] = total
            own.update(chain)
    return out


def bound_tokens(bound: dict[tuple[str, int], int], rows) -> int:
    """The bound over a run's rows: each turn's, or its whole prompt if it was preempted."""
    return sum(r.input_tokens if r.preemptions else bound[r.session, r.turn] for r in rows)


# -- replays ----------------------------------------------------------------------------------

def mooncake_config(policy: str, budget_gib: int, trace: Path, limit: int | None,
                    extra: list[str] = ()):
    sets = [f"cache.policy.eviction={policy}", "tp=1", f"cache.tokens_per_block={PAGE_TOKENS}",
            f"cache.tiers=[{{level: gpu, quota: {budget_gib}GiB}}]", f"workload.path={trace}",
            f"workload.time_scale={policy_curves.TIME_SCALE}", "engine.gpu_free_watermark=0",
            "output.plots=false", *extra]
    if limit is not None:
        sets.append(f"workload.limit={limit}")
    return load_config(ROOT / "configs" / "mooncake-conversation.yaml", sets)


class _Pinned(TierManager):
    """A TierManager that notes, at each eviction, the share of the GPU tier that pages
    of running or waiting requests (locked or held) take."""

    def _reserve(self, pos, n, sel, rec, batches, incoming=True):
        if pos == 0 and sel.victims[0] and getattr(self, "shares", None) is not None:
            pinned = sum(1 for p in self._pages.values() if p.tier == 0 and (p.locks or p.holds))
            self.shares.append(pinned / self.tiers[0].capacity)
        return super()._reserve(pos, n, sel, rec, batches, incoming)


def replay_noting_pins(cfg):
    """(result, the pinned shares at each GPU eviction)."""
    shares: list[float] = []

    class Noting(_Pinned):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.shares = shares

    real = kvsim.run.pipeline.TierManager
    kvsim.run.pipeline.TierManager = Noting  # replay() builds its managers through this name
    try:
        res = replay(prepare_run(cfg))
    finally:
        kvsim.run.pipeline.TierManager = real
    return res, shares


def reach(rows, requests: list[dict]) -> list[int]:
    """For each block a request of the last half found cached: the turns since a prompt
    last held it (by arrival order: the order the requests are prepared in)."""
    uses: dict = {}
    for i, r in enumerate(requests):
        for k in r["hash_ids"][:-(-r["input_length"] // PAGE_TOKENS)]:
            uses.setdefault(k, []).append(i)
    out = []
    for i, row in enumerate(rows):
        if i < len(rows) // 2:
            continue
        hit_blocks = -(-(row.hit_gpu + row.hit_host + row.hit_disk) // PAGE_TOKENS)
        for k in requests[i]["hash_ids"][:hit_blocks]:
            u = uses[k]
            j = bisect_left(u, i)
            if j > 0:
                out.append(i - u[j - 1])
    return out


def _q(xs: list, f: float):
    return sorted(xs)[int(f * (len(xs) - 1))] if xs else 0


# -- the parts ---------------------------------------------------------------------------------

def part_min(trace: Path, budgets: list[int], limit: int | None) -> float:
    requests = read_requests(trace, limit)
    print(f"one request at a time ({len(requests)} requests; hit ratio, last half)")
    print(f"{'budget':>8} {'belady':>8} {'MIN':>8} {'gap':>8} {'lru':>8} {'per-access MIN':>15}"
          f"  replay s")
    gap = 0.0
    for b in budgets:
        t0 = time.perf_counter()
        res = replay(prepare_run(mooncake_config("belady", b, trace, limit,
                                                 ["engine.max_running=1"])))
        wall = time.perf_counter() - t0
        rows = sorted(res.rows, key=lambda r: (r.arrival_ns, r.rid))
        bel = tail_ratio([r.hit_gpu for r in rows], requests)
        ref = tail_ratio(min_hits(requests, b * 2**30 // PAGE_BYTES), requests)
        lru_rows = sorted(replay(prepare_run(mooncake_config(
            "lru", b, trace, limit, ["engine.max_running=1"]))).rows,
            key=lambda r: (r.arrival_ns, r.rid))
        lru = tail_ratio([r.hit_gpu for r in lru_rows], requests)
        gap = max(gap, abs(bel - ref))
        textbook = tail_ratio(per_access_min_hits(requests, b * 2**30 // PAGE_BYTES), requests)
        print(f"{b:>5}GiB {bel:>8.4f} {ref:>8.4f} {bel - ref:>+8.4f} {lru:>8.4f} "
              f"{textbook:>15.4f}  {wall:.0f}", flush=True)
    return gap


def part_concurrency(trace: Path, limit: int, budget: int = 80) -> None:
    requests = read_requests(trace, limit)
    print(f"concurrency: the first {len(requests)} requests at {budget} GiB (hit ratio, last "
          f"half; pinned share of the GPU tier at each eviction; turns since a hit block was "
          f"last used)")
    print(f"{'policy':<8} {'max_running':>11} {'hit':>7} {'pinned mean':>12} {'p90':>6} "
          f"{'reach p50':>10} {'p90':>5}")
    for policy in ("lru", "belady"):
        for mr in (1, 2, 8, 128):
            res, shares = replay_noting_pins(mooncake_config(
                policy, budget, trace, limit, [f"engine.max_running={mr}"]))
            rows = sorted(res.rows, key=lambda r: (r.arrival_ns, r.rid))
            hit = tail_ratio([r.hit_gpu for r in rows], requests)
            far = reach(rows, requests)
            print(f"{policy:<8} {mr:>11} {hit:>7.4f} {statistics.mean(shares or [0]):>12.3f} "
                  f"{_q(shares, .9):>6.3f} {_q(far, .5):>10} {_q(far, .9):>5}", flush=True)


def _whole(rows) -> tuple[float, int, int, int]:
    """(hit ratio, hit tokens, preemptions, prompt tokens) over the whole run."""
    hits = sum(r.hit_gpu + r.hit_host + r.hit_disk for r in rows)
    total = sum(r.input_tokens for r in rows)
    return hits / max(1, total), hits, sum(r.preemptions for r in rows), total


def part_bound(trace: Path, policies: list[str]) -> bool:
    """Every policy against belady and the reuse bound on the shipped workloads; False if
    a policy found more than the bound (it must not)."""
    cases = [(f"mooncake {b} GiB", mooncake_config("lru", b, trace, None))
             for b in policy_curves.BUDGETS_GIB]
    cases += [("default (3 tiers)", load_config(ROOT / "configs" / "default.yaml",
                                                ["output.plots=false"])),
              ("agentic-coding, 20 sessions", load_config(
                  ROOT / "configs" / "agentic-coding.yaml",
                  ["output.plots=false", "workload.limit=20"]))]
    ok = True
    print("every policy over the whole run (hit ratio), belady and the reuse bound (a "
          "preempted turn's whole prompt counted)")
    print(f"{'workload':<26} {'bound':>7} {'belady':>7} {'best online':>20} "
          f"{'online > belady':>16} {'preempted':>9}")
    for name, base in cases:
        prep = prepare_run(base)
        per_turn = reuse_bound(prep.workload, base.cache.tokens_per_block)
        found = {}  # policy -> (hit ratio, hit tokens, its bound's tokens, preempted turns)
        for p in policies:
            cfg = base.model_copy(update={"cache": base.cache.model_copy(update={
                "policy": base.cache.policy.model_copy(update={"eviction": p})})})
            rows = replay(prepare_run(cfg)).rows
            ratio, hits, _, total = _whole(rows)
            found[p] = (ratio, hits, bound_tokens(per_turn, rows),
                        sum(1 for r in rows if r.preemptions), total)
        online = {p: v for p, v in found.items() if p != "belady"}
        best = max(online, key=lambda p: online[p][0])
        beats = [p for p, v in online.items() if "belady" in found and v[1] > found["belady"][1]]
        over = [p for p, v in found.items() if v[1] > v[2]]
        ok &= not over
        bound = max(v[2] / max(1, v[4]) for v in found.values())
        bel = found.get("belady", (float("nan"),))[0]
        pre = max(v[3] for v in found.values())
        print(f"{name:<26} {bound:>7.4f} {bel:>7.4f} {best + ' ' + format(online[best][0], '.4f'):>20} "
              f"{', '.join(beats) or '-':>16} {pre:>9}"
              f"{'  OVER THE BOUND: ' + ', '.join(over) if over else ''}", flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="min,concurrency,bound")
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--budgets-min", default="80,400", help="GiB each")
    ap.add_argument("--limit", type=int, default=3000, help="requests of the concurrency part")
    ap.add_argument("--min-limit", type=int, default=None, help="requests of the min part")
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    a = ap.parse_args(argv)
    if not a.trace.exists():
        print(f"{a.trace}: no such trace (pass --trace)", file=sys.stderr)
        return 2
    parts = a.parts.split(",")
    gap = None
    ok = True
    if "concurrency" in parts:
        part_concurrency(a.trace, a.limit)
    if "bound" in parts:
        ok = part_bound(a.trace, [p for p in a.policies.split(",") if p])
    if "min" in parts:
        gap = part_min(a.trace, [int(b) for b in a.budgets_min.split(",")], a.min_limit)
    if gap is not None:
        print(f"belady_vs_min_max_gap: {gap:.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
