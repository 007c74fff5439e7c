"""The cluster-wide remote tier (``cache.remote``).

Scenarios:
- the store alone: offer/landed (a put in flight is not stored; a key is sent once), its
  capacity and its eviction order (lru, fifo), a match stops at its first miss, and
  reuse scopes hold (a tenant's chain keys never match another's);
- a put on a drop from the last tier, a get on another instance: a conversation's first
  turn computed on instance 0 is dropped there when a longer prompt needs its GPU
  slots; its next turn, routed to instance 1, finds its full blocks in the store (never
  its partial last page), fetches their bytes over the network and computes the rest;
- inert unless used: a store that never gets a page leaves the run's rows and timeline
  as without one (but the hit_remote column and the network counters);
- bad input: exit 2 naming the key (no network bandwidth; the hw backend).
"""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import load_config
from kvsim.core.keys import chain_key, scope_root
from kvsim.core.remotestore import RemoteStore
from kvsim.run import prepare_run, replay
from kvsim.run.results import write_results

B = 512               # the trace's block, and the cache's
PAGE = B * 128 << 10  # llama-3-8b at tp 1: 128 KiB of KV a token
BW = 25e9
REMOTE = f"cache.remote={{capacity: 64GiB, network: {{bandwidth: {BW:.0f}, latency: 10us}}}}"


def _chain(scope, ids):
    key, out = scope_root(scope), []
    for i in ids:
        key = chain_key(key, i)
        out.append(key)
    return out


# == the store ========================================================================
def test_a_put_is_stored_when_it_lands_and_sent_once():
    s = RemoteStore(4)
    a, b = _chain("t", [1, 2])
    assert s.offer([a, b, a]) == [a, b] and s.sent_pages == 2  # each key once
    assert s.match([a]) == 0                 # on its way: not there yet
    assert s.offer([a]) == []                # already on its way: not sent again
    s.landed([a, b])
    assert s.match([a, b]) == 2 and s.offer([b]) == []
    assert (s.puts, s.put_pages, s.gets, s.hit_pages) == (1, 2, 1, 2)


def test_capacity_and_eviction_order():
    keys = _chain("t", range(5))
    for policy, survivor in (("lru", keys[0]), ("fifo", keys[2])):
        s = RemoteStore(3, policy)
        s.offer(keys[:3])
        s.landed(keys[:3])
        assert s.match(keys[:1]) == 1        # lru: key 0 becomes the most recent
        s.offer(keys[3:])
        s.landed(keys[3:])                   # two more in a store of 3: two leave
        assert len(s) == 3 and s.evicted_pages == 2 and s.peak_pages == 3
        held = [k in s for k in keys]
        assert held[3] and held[4] and survivor in s, (policy, held)
        # lru evicted keys 1 and 2 (0 was used since); fifo the first two put
        gone = {"lru": [1, 2], "fifo": [0, 1]}[policy]
        assert [i for i in range(5) if not held[i]] == gone, policy


def test_a_match_stops_at_the_first_miss():
    k = _chain("t", range(4))
    s = RemoteStore(10)
    s.offer([k[0], k[1], k[3]])
    s.landed([k[0], k[1], k[3]])
    assert s.match(k) == 2                   # k[2] is missing: k[3] is no prefix hit


def test_reuse_scopes_hold_in_the_store():
    s = RemoteStore(10)
    mine = _chain("tenant-a", [7, 8, 9])
    s.offer(mine)
    s.landed(mine)
    assert s.match(_chain("tenant-b", [7, 8, 9])) == 0  # the same ids, another scope
    assert s.match(mine) == 3


# == a cluster with a remote tier =======================================================
def _write_trace(path, reqs):
    with open(path, "w") as f:
        for ts, ids, out in reqs:
            f.write(json.dumps({"timestamp": ts, "input_length": len(ids) * B - 100,
                                "output_length": out, "hash_ids": ids}) + "\n")


def _run(tmp_path, reqs, *more, out=None):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace, reqs)
    sets = [f"workload.path={trace}", "model=llama-3-8b", "tp=1", "cluster.nodes=2",
            "router.policy=round-robin", "engine.gpu_free_watermark=0", *more]
    res = replay(prepare_run(load_config("configs/mooncake-conversation.yaml", sets)))
    if out is not None:
        write_results(res, out, plots=False)
    return res


# requests in arrival order, 1 s apart, routed round robin (even: instance 0, odd: 1),
# on GPU tiers of 8 pages (the last tier: a page evicted there drops):
# 0 -> 0: a conversation's first turn, blocks 1 2 3 (its last page partial: 412 tokens)
# 1 -> 1: unrelated, 7 blocks
# 2 -> 0: unrelated, 7 blocks: 7 pages, 2 of request 0's drop (leaves first: 3, 2)
# 3 -> 1: unrelated, 7 blocks
# 4 -> 0: unrelated, 7 blocks: request 0's block 1 drops too (the least recently used)
# 5 -> 1: the conversation's next turn, blocks 1 2 3 4: its first two blocks are in the
#         store (block 3's page was partial: never put); the rest computed
CONVERSATION = [(0, [1, 2, 3], 1)] + [(k * 1000, list(range(100 * k, 100 * k + 7)), 1)
                                      for k in (1, 2, 3, 4)] + [(5000, [1, 2, 3, 4], 1)]
GPU8 = "cache.tiers=[{level: gpu, quota: 512MiB}]"


def test_a_page_dropped_on_one_instance_is_a_remote_hit_on_another(tmp_path):
    res = _run(tmp_path, CONVERSATION, GPU8, REMOTE, out=tmp_path / "o")
    rows = sorted(res.rows, key=lambda r: r.arrival_ns)
    assert [r.instance for r in rows] == [0, 1, 0, 1, 0, 1]
    assert [r.hit_remote for r in rows] == [0, 0, 0, 0, 0, 2 * B]
    last = rows[5]
    assert last.hit_gpu == 0 and last.computed_tokens == last.input_tokens - 2 * B
    m = res.metrics
    assert m["hit_tokens"]["remote"] == 2 * B
    assert m["hit_tokens"]["total"] == sum(r.hit_gpu + r.hit_host + r.hit_disk + r.hit_remote
                                           for r in rows)
    assert m["cluster"]["hit_ratio_by_tier"]["remote"] == 2 * B / sum(r.input_tokens for r in rows)
    r = m["remote"]
    assert r["get_bytes"] == 2 * PAGE and r["hit_pages"] == 2
    # put: request 0's two full pages (its partial one is never sent), and whatever
    # instance 0 dropped besides: every put page is a full page of a finished request
    assert r["put_pages"] >= 2 and r["put_bytes"] == r["put_pages"] * PAGE
    assert m["cluster"]["network_bytes"] == r["get_bytes"] + r["put_bytes"]
    # without GPUDirect a get also crosses the instance's PCIe link: 2 pages more h2d
    direct = _run(tmp_path, CONVERSATION, GPU8, REMOTE.replace("}}", "}, gpudirect: true}"))
    assert m["bytes"]["host_to_gpu"] - direct.metrics["bytes"]["host_to_gpu"] == 2 * PAGE
    # the fetch takes at least its bytes over the link: the TTFT is no shorter than that
    assert last.ttft_s >= 2 * PAGE / BW
    with open(tmp_path / "o" / "requests.csv") as f:
        table = list(csv.DictReader(f))
    assert [int(x["hit_remote"]) for x in table] == [x.hit_remote for x in res.rows]


def test_write_through_puts_a_turns_pages_without_a_drop(tmp_path):
    """Instances with room for everything: nothing drops, so only write-through fills the
    store; the conversation's next turn, on the other instance, finds blocks 1 and 2."""
    two = [CONVERSATION[0], (1000, [1, 2, 3, 4], 1)]
    big = "cache.tiers=[{level: gpu, quota: 8GiB}]"
    assert [r.hit_remote for r in _run(tmp_path, two, big, REMOTE).rows] == [0, 0]
    res = _run(tmp_path, two, big, REMOTE.replace("}}", "}, write_through: true}"))
    assert [r.hit_remote for r in res.rows] == [0, 2 * B]
    assert res.metrics["dropped_pages"]["gpu"] == 0
    # every finished turn's full pages are sent once: request 0's 2, and request 1's
    # block 3, computed (its blocks 1, 2 are there; its block 4 is partial); the last
    # is still on its way when the replay ends: sent, never stored
    r = res.metrics["remote"]
    assert (r["sent_pages"], r["put_pages"], r["put_bytes"]) == (3, 2, 2 * PAGE)


def test_a_remote_tier_that_never_holds_a_page_changes_nothing(tmp_path):
    big = "cache.tiers=[{level: gpu, quota: 8GiB}]"  # nothing is ever dropped
    plain = _run(tmp_path, CONVERSATION, big, out=tmp_path / "a")
    with_remote = _run(tmp_path, CONVERSATION, big, REMOTE, out=tmp_path / "b")
    assert [r.csv_values() for r in plain.rows] == [r.csv_values() for r in with_remote.rows]
    net = ("remote_get_bytes", "remote_put_bytes")
    assert plain.timeline == [{k: v for k, v in t.items() if k not in net}
                              for t in with_remote.timeline]
    a = (tmp_path / "a" / "requests.csv").read_text().splitlines()
    b = (tmp_path / "b" / "requests.csv").read_text().splitlines()
    assert "hit_remote" not in a[0] and b[0] == a[0] + ",hit_remote"
    assert [x + ",0" for x in a[1:]] == b[1:]
    assert "remote" not in plain.metrics["hit_tokens"] and "remote" not in plain.metrics
    assert plain.metrics["cluster"]["network_bytes"] == 0


def test_bad_remote_settings_exit_2_naming_the_key(tmp_path):
    trace = tmp_path / "t.jsonl"
    _write_trace(trace, CONVERSATION)
    runner = CliRunner()
    base = ["run", "configs/mooncake-conversation.yaml", "--out", str(tmp_path / "o"),
            "--set", f"workload.path={trace}", "--set", "model=llama-3-8b", "--set", "tp=1"]
    for more, key in [(["--set", "cache.remote={capacity: 1TiB, network: {latency: 1us}}"],
                       "cache.remote.network.bandwidth"),
                      (["--set", REMOTE, "--backend", "hw"], "cache.remote"),
                      (["--set", REMOTE.replace("64GiB", "1MiB")], "cache.remote.capacity")]:
        r = runner.invoke(app, [*base, *more])
        assert r.exit_code == 2, (more, r.output)
        assert key in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "o").exists()


def test_an_instance_that_serves_nothing_counts_its_remote_hits_too(tmp_path):
    """Three instances, two requests routed round robin: instance 2 serves none. With a
    remote tier every instance's hit_tokens (and hit ratio by tier) has a remote count,
    the idle one's 0, as the busy ones' do: the same keys in every instance."""
    two = [(0, [1, 2, 3], 1), (1000, [7, 8], 1)]
    res = _run(tmp_path, two, REMOTE, "cluster.nodes=3")
    each = res.metrics["instances"]
    assert [x["requests"] for x in each] == [1, 1, 0]
    assert [x["hit_tokens"]["remote"] for x in each] == [0, 0, 0]
    assert all(set(x["hit_tokens"]) == set(each[0]["hit_tokens"]) for x in each)
    assert all("remote" in x["hit_ratio_by_tier"] for x in each)


def test_the_summary_table_shows_the_remote_hits_its_hit_ratio_counts(tmp_path):
    """The run's summary table: with a remote tier its hit tokens row has a remote
    count, so the tiers it shows add up to the hit ratio it prints beside them."""
    from kvsim.console import summary_table  # noqa: PLC0415

    m = _run(tmp_path, CONVERSATION, GPU8, REMOTE).metrics
    t = summary_table(m, "t")
    rows = dict(zip(t.columns[0].cells, t.columns[1].cells))
    shown = [int(x) for x in rows["hit tokens gpu / host / disk / remote"].split(" / ")]
    assert shown[3] == 2 * B                    # the last request's two blocks (above)
    assert sum(shown) / m["input_tokens"] == pytest.approx(m["hit_ratio"])
    plain = summary_table(_run(tmp_path, CONVERSATION, GPU8).metrics, "t")
    assert "hit tokens gpu / host / disk" in plain.columns[0].cells
