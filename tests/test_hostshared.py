"""A node's shared host tier (``node.host: shared``): a page one rank computed is
onboarded by another.

Scenario (two ranks on one node, requests routed round robin, GPU tiers of 8 pages,
host tiers with room for everything, the refcheck on):
- rank 0 computes a conversation's first turn (blocks 1 2 3; the last page partial);
  later prompts on rank 0 push its pages to host;
- rank 1 serves the conversation's next turn (blocks 1 2 3 4): with ``shared`` it
  finds blocks 1 and 2 in rank 0's host tier (block 3's page there is partial: not a
  whole block), copies them over its own PCIe link and computes the rest: 2 blocks of
  host hits, 2 pages more host -> GPU bytes, the node's ``host_shared`` count 2;
- with ``private`` (the default) or in another reuse scope it finds nothing;
- the hw backend (CPU mode; and a GPU test): the node's ranks share one host
  allocation, and rank 1's copy of rank 0's pages passes the refcheck (rank 0's bytes);
- bad input: ``shared`` with a host fill, beside a remote tier, or with an offline
  bound (belady): exit 2 naming the key.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpuskip import have_gpu
from kvsim.cli import app
from kvsim.config import load_config
from kvsim.run import prepare_run, replay

B = 512               # the trace's block, and the cache's
PAGE = B * 128 << 10  # llama-3-8b at tp 1: 128 KiB of KV a token

# requests in arrival order, 1 s apart, round robin (even: rank 0, odd: rank 1)
# 0 -> 0: blocks 1 2 3 (412 tokens in block 3's page)
# 1 -> 1, 2 -> 0, 3 -> 1, 4 -> 0: unrelated, 7 blocks each (rank 0's GPU of 8 pages
#         sends request 0's pages to host)
# 5 -> 1: blocks 1 2 3 4
CONVERSATION = [(0, [1, 2, 3], 1)] + [(k * 1000, list(range(100 * k, 100 * k + 7)), 1)
                                      for k in (1, 2, 3, 4)] + [(5000, [1, 2, 3, 4], 1)]
TIERS = "cache.tiers=[{level: gpu, quota: 512MiB}, {level: host, quota: 8GiB}]"


def _write_trace(path, reqs):
    with open(path, "w") as f:
        for ts, ids, out, *tenant in reqs:
            f.write(json.dumps({"timestamp": ts, "input_length": len(ids) * B - 100,
                                "output_length": out, "hash_ids": ids,
                                **({"tenant": tenant[0]} if tenant else {})}) + "\n")


def _sets(tmp_path, reqs):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace, reqs)
    return [f"workload.path={trace}", "model=llama-3-8b", "tp=1", "node.ranks=2",
            "router.policy=round-robin", "engine.gpu_free_watermark=0", "engine.refcheck=true",
            TIERS]


def _run(tmp_path, *more, reqs=CONVERSATION):
    cfg = load_config("configs/mooncake-conversation.yaml", [*_sets(tmp_path, reqs), *more])
    return replay(prepare_run(cfg))


def test_a_page_rank_0_evicted_to_host_is_onboarded_by_rank_1(tmp_path):
    shared = _run(tmp_path, "node.host=shared")
    private = _run(tmp_path)
    rows = sorted(shared.rows, key=lambda r: r.arrival_ns)
    assert [r.instance for r in rows] == [0, 1, 0, 1, 0, 1]
    last = rows[5]
    assert (last.hit_gpu, last.hit_host, last.hit_disk) == (0, 2 * B, 0)
    assert last.computed_tokens == last.input_tokens - 2 * B
    assert last.onboard_bytes == 2 * PAGE
    # rank 0's own rows are unchanged: the lender counts no hit
    before = sorted(private.rows, key=lambda r: r.arrival_ns)
    assert before[5].hit_host == 0 and before[5].computed_tokens == before[5].input_tokens
    assert [(r.hit_gpu, r.hit_host) for r in rows[:5]] == [(r.hit_gpu, r.hit_host)
                                                          for r in before[:5]]
    m, p = shared.metrics, private.metrics
    assert m["hit_tokens"]["host"] - p["hit_tokens"]["host"] == 2 * B
    # the bytes crossed a GPU link: 2 pages more host -> GPU in the node
    assert m["bytes"]["host_to_gpu"] - p["bytes"]["host_to_gpu"] == 2 * PAGE
    hs = m["node"]["host_shared"]
    assert (hs["pages"], hs["fetches"], hs["tokens"]) == (2, 1, {"host": 2 * B, "disk": 0})
    assert [r["pages"] for r in hs["by_rank"]] == [0, 2]      # rank 1 borrowed them
    assert "node" not in p


def test_another_reuse_scope_finds_nothing_on_a_sibling(tmp_path):
    """The conversation's next turn comes from another tenant: the same block ids, another
    scope, so other chain keys."""
    other = CONVERSATION[:5] + [(*CONVERSATION[5], "tenant-b")]
    res = _run(tmp_path, "node.host=shared", reqs=other)
    last = sorted(res.rows, key=lambda r: r.arrival_ns)[5]
    assert (last.hit_gpu, last.hit_host, last.hit_disk) == (0, 0, 0)
    assert res.metrics["node"]["host_shared"]["pages"] == 0


def test_a_sibling_page_in_disk_is_onboarded_through_the_disk(tmp_path):
    """A host tier of 2 pages beside a disk: rank 0's pages go on to disk; rank 1 reads
    them from there (disk -> GPU: disk-read bytes and host -> GPU bytes)."""
    tiers = ("cache.tiers=[{level: gpu, quota: 512MiB}, {level: host, quota: 128MiB}, "
             "{level: disk, quota: 8GiB}]")
    shared = _run(tmp_path, "node.host=shared", tiers)
    private = _run(tmp_path, tiers)
    last = sorted(shared.rows, key=lambda r: r.arrival_ns)[5]
    assert last.hit_gpu == 0 and last.hit_host + last.hit_disk == 2 * B and last.hit_disk > 0
    hs = shared.metrics["node"]["host_shared"]
    assert hs["pages"] == 2 and hs["tokens"]["disk"] == last.hit_disk
    m, p = shared.metrics, private.metrics
    assert m["bytes"]["disk_read"] - p["bytes"]["disk_read"] == last.hit_disk // B * PAGE


def test_the_host_quota_is_the_nodes_one_pool(tmp_path):
    """A host quota of 4 pages with a disk behind: private, each rank has 4 (the node's
    ranks hold 6 at once: 2 of rank 0's, 4 of rank 1's); shared, the node has 4 in all,
    whichever rank holds them: never more than 4 at once, per the pool and the ranks'
    own timelines. The conversation still finds its blocks on rank 0, in host or disk."""
    tiers = ("cache.tiers=[{level: gpu, quota: 512MiB}, {level: host, quota: 256MiB}, "
             "{level: disk, quota: 8GiB}]")
    shared = _run(tmp_path, "node.host=shared", tiers)
    private = _run(tmp_path, tiers)
    pool = shared.metrics["node"]["host_pool"]
    assert [(p["capacity_pages"], p["peak_pages"]) for p in pool] == [(4, 4)]
    assert shared.metrics["tiers_slots"]["host"] == 4
    def node_peak(res):  # the most host slots the ranks held at once (each rank's last
        now, most = {}, 0  # sample holds until its next)
        for row in res.timeline:
            now[row["rank"]] = row["host_used_slots"]
            most = max(most, sum(now.values()))
        return most
    assert node_peak(private) > 4 and node_peak(shared) == 4
    last = sorted(shared.rows, key=lambda r: r.arrival_ns)[5]
    assert last.hit_host + last.hit_disk == 2 * B


def test_shared_on_one_rank_changes_nothing(tmp_path):
    sets = [s for s in _sets(tmp_path, CONVERSATION) if not s.startswith(("node.", "router."))]
    a = replay(prepare_run(load_config("configs/mooncake-conversation.yaml", sets)))
    b = replay(prepare_run(load_config("configs/mooncake-conversation.yaml",
                                       [*sets, "node.host=shared"])))
    assert [r.csv_values() for r in a.rows] == [r.csv_values() for r in b.rows]
    assert a.timeline == b.timeline


def test_bad_shared_settings_exit_2_naming_the_key(tmp_path):
    runner = CliRunner()
    sets = [x for s in _sets(tmp_path, CONVERSATION) for x in ("--set", s)]
    base = ["run", "configs/mooncake-conversation.yaml", "--out", str(tmp_path / "o"), *sets,
            "--set", "node.host=shared"]
    remote = "cache.remote={capacity: 64GiB, network: {bandwidth: 25e9, latency: 10us}}"
    for more, key in [(["--set", "cache.tiers[1].fill={mode: progressive}"],
                       r"cache.tiers[1].fill"),
                      (["--set", remote], "node.host"),
                      (["--set", "cache.policy.eviction=belady"], "cache.policy.eviction"),
                      (["--set", "node.host=pooled"], "node.host")]:
        r = runner.invoke(app, [*base, *more])
        assert r.exit_code == 2, (more, r.output)
        assert key in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "o").exists()


# == the hw backend: one pinned host pool a node =========================================
# session-hash sends req-1, req-2, req-3 to rank 0 and req-4 to rank 1: rank 0 computes
# blocks 1 2 3 and pushes them to host with two unrelated prompts; rank 1's turn over
# blocks 1 2 3 4 copies blocks 1 and 2 out of the node's host pool (rank 0's bytes)
# (10 s apart: on hw each prompt's real compute ends well before the next arrives)
HASHED = [(0, [1, 2, 3], 1), (10_000, list(range(200, 207)), 1),
          (20_000, list(range(300, 307)), 1), (30_000, [1, 2, 3, 4], 1)]
SMALL_PAGES = ["cache.page_bytes=256KiB",
               "cache.tiers=[{level: gpu, quota: 2MiB}, {level: host, quota: 4MiB}]"]


def _hashed(tmp_path, backend="sim", device="cpu"):
    trace = tmp_path / "h.jsonl"
    _write_trace(trace, HASHED)
    sets = [f"workload.path={trace}", "model=llama-3-8b", "tp=1", "node.ranks=2",
            "engine.gpu_free_watermark=0", "engine.refcheck=true", "node.host=shared",
            *SMALL_PAGES]
    prep = prepare_run(load_config("configs/mooncake-conversation.yaml", sets))
    if backend == "sim":
        return replay(prep)
    return replay(prep, "hw", backend_options={"device": device, "time_scale": 200.0,
                                               "disk_dir": str(tmp_path)})


def _check_hashed(res):
    rows = sorted(res.rows, key=lambda r: r.arrival_ns)
    assert [r.rank for r in rows] == [0, 0, 0, 1]
    assert (rows[3].hit_gpu, rows[3].hit_host) == (0, 2 * B)
    assert res.metrics["node"]["host_shared"]["pages"] == 2
    assert res.metrics["requests_completed"] == 4 and res.metrics["requests_failed"] == 0


def test_hw_ranks_share_one_host_allocation(tmp_path):
    """Two hw backends of a node with a shared host: one host tier object (one pinned
    allocation of the node's slots), closed only when the last rank closes."""
    import dataclasses

    from kvsim.core.spec import Level
    from kvsim.run.seam import settings_for
    from kvsim_backends.hw import HwBackend, RealtimeRuntime

    rt = RealtimeRuntime()
    base = settings_for(1 << 16, {Level.GPU: 4, Level.HOST: 8}, device="cpu")
    bes = [HwBackend(rt, dataclasses.replace(base, rank=r, ranks=2, host_shared=True))
           for r in range(2)]
    try:
        host = bes[0].host
        assert host is not None and bes[1].host is host
        bes[0].close()
        assert bes[1].host is host and host.view is not None  # rank 1 still uses it
    finally:
        for be in bes:
            be.close()


def test_hw_cpu_mode_rank_1_onboards_rank_0s_host_page_refcheck_on(tmp_path):
    """The hw backend in CPU mode (numpy standing in for device memory), the refcheck on:
    rank 1's copy of rank 0's host pages carries rank 0's pattern (checked word by word
    after the copy); the sim's node finds the same."""
    _check_hashed(_hashed(tmp_path))
    _check_hashed(_hashed(tmp_path, "hw"))


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_hw_gpu_rank_1_onboards_rank_0s_host_page_refcheck_on(tmp_path):
    _check_hashed(_hashed(tmp_path, "hw", device="gpu"))


def test_the_lent_pages_survive_the_lenders_eviction_pressure_during_the_copy(
        tmp_path, monkeypatch):
    """While rank 1 copies rank 0's host pages, rank 0 is made to evict every host page
    it can (to disk): the lent ones are not among them. They are still in rank 0's host
    when the copy ends, and the refcheck after it (rank 0's bytes) passes."""
    from kvsim.core.spec import Level
    from kvsim.engine.siblingport import SiblingPort

    seen = []
    fetch = SiblingPort._fetch_proc

    def pressed(self, eng, lv, sib, lease, dst):
        mgr = sib.mgr
        n = mgr.tier_stats(Level.HOST).evictable
        if n:  # every host page rank 0 could evict now, to its disk, alongside the copy
            sib.engine._launch(sib.engine._evict_proc(mgr.evict(Level.HOST, n)))
            sib.engine._notify()  # (its bytes move while the copy's do)
        seen.append((n, mgr.tier_stats(Level.HOST).used, len(lease)))
        yield from fetch(self, eng, lv, sib, lease, dst)
        seen.append([(p.tier, p.slot) for p in lease.pages] == [(1, s) for s in lease.slots])

    monkeypatch.setattr(SiblingPort, "_fetch_proc", pressed)
    tiers = ("cache.tiers=[{level: gpu, quota: 512MiB}, {level: host, quota: 8GiB}, "
             "{level: disk, quota: 8GiB}]")
    res = _run(tmp_path, "node.host=shared", tiers)
    (evictable, used, lent), stayed = seen
    assert lent == 2 and evictable == used - lent > 0 and stayed
    last = sorted(res.rows, key=lambda r: r.arrival_ns)[5]
    assert last.hit_host == 2 * B and res.metrics["requests_failed"] == 0
