"""Workload layer: loaders, validation, block mapping, synthetic sessions, ideal reuse.

Tiny fixtures live in traces/fixtures; the real public traces are read from
../shared/traces and their tests skip when that folder is absent.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import os
import tempfile
from pathlib import Path

import pytest

from kvsim.workload import (
    Session, TraceError, Turn, Workload, cache_blocks, ideal_reuse_ratio, ideal_reuse_tokens,
    load_agentic, load_mooncake, session_start_times, synthetic_agentic, write_jsonl_mooncake,
)
from kvsim.workload.agentic import PRIVATE_SPAN, TAIL_OFFSET

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "traces" / "fixtures"
REAL = ROOT.parent / "shared" / "traces"
CONVERSATION = REAL / "mooncake" / "conversation_trace.jsonl"
SESSIONS = REAL / "agentic-coding" / "sessions"
needs_real = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/traces not present")


# ---------------------------------------------------------------- Mooncake


def test_mooncake_fixture_loads_as_open_loop_sessions():
    w = load_mooncake(FIX / "mooncake_ok.jsonl", time_scale=2.0)
    assert not w.closed_loop and w.block_tokens == 512
    # the blank line 3 is skipped; sids keep physical line numbers
    assert [s.sid for s in w.sessions] == ["req-1", "req-2", "req-4", "req-5"]
    s = w.sessions[1]
    assert s.scope == "global" and s.start_s == 1.0  # 500 ms * 2 / 1000
    assert s.items == (Turn(1200, 20, (0, 1, 2), 0.0, 1.0),)


def test_mooncake_limit():
    assert len(load_mooncake(FIX / "mooncake_ok.jsonl", limit=2).sessions) == 2


@pytest.mark.parametrize("fixture, line, words", [
    ("mooncake_bad_json.jsonl", 2, "malformed JSON"),
    ("mooncake_missing_field.jsonl", 2, "missing field 'output_length'"),
    ("mooncake_wrong_type.jsonl", 1, "'input_length' must be an integer"),
    ("mooncake_negative_length.jsonl", 2, "negative output_length -3"),
    ("mooncake_short_hash_ids.jsonl", 2, "hash_ids has 2 blocks but input_length 1100"),
    ("mooncake_backwards.jsonl", 3, "goes backwards"),
])
def test_mooncake_validation_names_file_line_and_problem(fixture, line, words):
    path = FIX / fixture
    with pytest.raises(TraceError) as e:
        load_mooncake(path)
    msg = str(e.value)
    print(msg)
    assert msg.startswith(f"{path}:{line}: ")
    assert words in msg


@pytest.mark.parametrize("row, words", [
    ('[1, 2]', "expected a JSON object"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "not positive"),
    ('{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [0]}', "negative timestamp"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [true]}', "only integers"),
    ('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 7}', "must be a list"),
    ('{"timestamp": 0, "input_length": 513, "output_length": 1, "hash_ids": [0, 1, 2]}', "needs ceil(513/512) = 2"),
])
def test_mooncake_more_validation(tmp_path, row, words):
    p = tmp_path / "t.jsonl"
    p.write_text(row + "\n")
    with pytest.raises(TraceError) as e:
        load_mooncake(p)
    assert str(e.value).startswith(f"{p}:1: ") and words in str(e.value)


def test_mooncake_backwards_timestamps_sorted_on_request():
    w = load_mooncake(FIX / "mooncake_backwards.jsonl", sort=True)
    assert [s.sid for s in w.sessions] == ["req-1", "req-3", "req-2"]
    assert [s.start_s for s in w.sessions] == [0.0, 0.4, 0.9]


def test_mooncake_write_round_trip(tmp_path):
    w = load_mooncake(FIX / "mooncake_ok.jsonl")
    out = tmp_path / "copy.jsonl"
    assert write_jsonl_mooncake(w, out) == 4
    back = load_mooncake(out)
    assert [s.items for s in back.sessions] == [s.items for s in w.sessions]
    with pytest.raises(ValueError, match="closed loop"):
        write_jsonl_mooncake(synthetic_agentic(2), out)


def test_mooncake_gzipped_loads_as_the_plain_file(tmp_path):
    plain = FIX / "mooncake_ok.jsonl"
    gz = tmp_path / "trace.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    w, g = load_mooncake(plain), load_mooncake(gz)
    assert g.name == "trace" and g.sessions == w.sessions
    assert load_mooncake(gz, limit=2).sessions == w.sessions[:2]


def test_mooncake_gzip_that_cannot_be_read_names_the_line_it_reached(tmp_path):
    rows = "".join(json.dumps({"timestamp": i, "input_length": 10, "output_length": 1,
                               "hash_ids": [i]}) + "\n" for i in range(2000))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(rows.encode())[:-200])  # the stream ends early
    with pytest.raises(TraceError) as e:
        load_mooncake(cut)
    msg = str(e.value)
    assert msg.startswith(f"{cut}:") and "not readable as gzip" in msg
    assert int(msg.split(":")[1]) > 1  # the lines before the cut were read
    plain = tmp_path / "plain.gz"
    plain.write_bytes((FIX / "mooncake_ok.jsonl").read_bytes())  # not gzip at all
    with pytest.raises(TraceError, match=r"plain\.gz:1: not readable as gzip"):
        load_mooncake(plain)
    with pytest.raises(FileNotFoundError):
        load_mooncake(tmp_path / "none.jsonl.gz")


def test_ideal_reuse_counts_partial_last_block():
    w = load_mooncake(FIX / "mooncake_ok.jsonl")
    # req-2 matches [0, 1] -> 1024; req-4 (300 tokens) matches block 0 -> 300, not 512;
    # req-5 matches block 0 -> 512
    assert ideal_reuse_tokens(w) == (1024 + 300 + 512, 1000 + 1200 + 300 + 1100)


def test_ideal_reuse_separates_scopes():
    t = Turn(100, 1, (7,), 0.0, 0.0)
    a = Session("a", "x", (t,), 0.0)
    b = Session("b", "y", (Turn(100, 1, (7,), 0.0, 1.0),), 1.0)
    c = Session("c", "x", (Turn(100, 1, (7,), 0.0, 2.0),), 2.0)
    w = Workload("w", 128, False, (a, b, c))
    assert ideal_reuse_tokens(w) == (100, 300)


@needs_real
def test_real_conversation_trace_loads_with_plausible_reuse():
    w = load_mooncake(CONVERSATION)  # (its load time: benchmarks/load_speed.py)
    assert w.n_requests == 12_031
    assert all(len(t.hash_ids) == math.ceil(t.input_tokens / 512) for _, t in w.iter_turns())
    hit, total = ideal_reuse_tokens(w)
    ratio = hit / total
    print(f"conversation_trace: {w.n_requests} requests; ideal reuse "
          f"{hit}/{total} = {ratio:.4f}; last arrival {w.sessions[-1].start_s:.1f} s")
    assert total == 144_793_823
    assert 0.30 < ratio < 0.45


# ---------------------------------------------------------------- block mapping


def test_cache_blocks_equal_sizes_are_the_ids():
    assert cache_blocks((3, 4, 5), 64, 64) == [3, 4, 5]


def test_cache_blocks_split_larger_trace_blocks():
    assert cache_blocks((3, 4), 512, 256) == [(3, 0), (3, 1), (4, 0), (4, 1)]
    # a partial last trace block yields only the cache blocks that hold tokens
    assert cache_blocks((3, 4), 512, 256, input_tokens=600) == [(3, 0), (3, 1), (4, 0)]


def test_cache_blocks_of_a_trace_block_far_larger_than_the_request():
    """Only the cache blocks the request's tokens fill: the same keys as the plain split
    where that is small enough to make, and a few where a trace block holds 2**60 tokens."""
    for ids, bt, tokens in (((3, 4), 4096, 5000), ((7,), 4096, 100), ((3, 4, 5), 1024, 2100)):
        plain = [(h, j) for h in ids for j in range(bt // 256)][:-(-tokens // 256)]
        assert cache_blocks(ids, bt, 256, input_tokens=tokens) == plain
    assert cache_blocks((9,), 2**60, 32, input_tokens=100) == [(9, 0), (9, 1), (9, 2), (9, 3)]


def test_cache_blocks_group_smaller_trace_blocks():
    assert cache_blocks((1, 2, 3, 4, 5), 64, 128) == [(1, 2), (3, 4), (5,)]
    # equal id prefixes give equal block prefixes
    assert cache_blocks((1, 2, 3, 9), 64, 128)[:1] == cache_blocks((1, 2, 7), 64, 128)[:1]


def test_cache_blocks_rejects_other_ratios():
    with pytest.raises(ValueError, match="block_tokens=64 and cache tokens_per_block=96"):
        cache_blocks((1,), 64, 96)


# ---------------------------------------------------------------- agentic


def test_agentic_fixture_turns_subagent_and_think_times():
    w = load_agentic(FIX / "agentic_ok.json", concurrency=4, start="concurrency")
    assert w.closed_loop and w.block_tokens == 64 and w.start == "concurrency" and w.concurrency == 4
    (s,) = w.sessions
    assert s.sid == "tiny_0001" and s.scope == "session:tiny_0001" and s.start_s is None
    t0, t1, sub, t3, t4 = s.items
    # ids cover full blocks only: a synthetic negative id stands for the partial block
    assert t0 == Turn(200, 20, (1, 2, 3, -1), 0.0)
    assert t1 == Turn(300, 30, (1, 2, 3, 4, -2), 4.0)
    assert isinstance(sub, Session) and sub.sid == "tiny_0001/agent_001" and sub.scope == s.scope
    assert sub.items == (Turn(256, 10, (50, 51, 52, 53), 0.0), Turn(330, 10, (50, 51, 52, 53, 54, -3), 3.0))
    # recorded think 41 s includes the sub-agent's run; released 47 - 40 (sub-agent end) = 7 s after it
    assert t3.think_s == 7.0 and t3.hash_ids == (1, 2, 3, 4, 5, 6, -4)
    # missing think_time: 50 - (47 + no api_time) = 3 s
    assert t4.think_s == 3.0
    for _, t in w.iter_turns():
        assert len(t.hash_ids) == math.ceil(t.input_tokens / 64) and t.arrival_s is None
    assert w.request_count() == w.n_requests == 6
    capped = load_agentic(FIX / "agentic_ok.json", max_think_s=3.5)
    assert [t.think_s for _, t in capped.iter_turns()] == [0.0, 3.5, 0.0, 3.0, 3.5, 3.0]


def test_agentic_shared_prefix_remaps_exactly_the_prefix(tmp_path):
    doc = json.loads((FIX / "agentic_ok.json").read_text())
    other = copy.deepcopy(doc)
    other["id"] = "tiny_0002"
    (tmp_path / "a.json").write_text(json.dumps(doc))
    with gzip.open(tmp_path / "b.json.gz", "wt") as f:
        json.dump(other, f)
    w = load_agentic(tmp_path, shared_prefix=True)
    assert [s.sid for s in w.sessions] == ["tiny_0001", "tiny_0002"]
    assert {s.scope for s in w.sessions} == {"shared"}
    a, b = (s.items for s in w.sessions)
    base_a, base_b = PRIVATE_SPAN, 2 * PRIVATE_SPAN
    # P = (100 + 60) // 64 = 2 prefix blocks, shared across sessions; the rest private
    assert a[0].hash_ids == (0, 1, base_a + 3, base_a + TAIL_OFFSET + 1)
    assert b[0].hash_ids == (0, 1, base_b + 3, base_b + TAIL_OFFSET + 1)
    # sub-agents share their own prefix namespace (P = 2 blocks) across sessions
    assert a[2].items[0].hash_ids[:2] == b[2].items[0].hash_ids[:2] == (1 << 20, (1 << 20) + 1)
    assert a[2].items[0].hash_ids[2:] == (base_a + 52, base_a + 53)
    hit, total = ideal_reuse_tokens(w)
    unshared, _ = ideal_reuse_tokens(load_agentic(tmp_path))
    assert hit - unshared == 2 * 64 + 2 * 64  # session 2 reuses the main and sub-agent prefix


def _agentic_error(tmp_path, mutate, name="s.json"):
    doc = json.loads((FIX / "agentic_ok.json").read_text())
    mutate(doc)
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    with pytest.raises(TraceError) as e:
        load_agentic(p)
    print(e.value)
    return p, str(e.value)


def test_agentic_validation_length_in_subagent(tmp_path):
    def m(d):
        d["requests"][2]["requests"][1]["hash_ids"] = [50, 51]
    p, msg = _agentic_error(tmp_path, m)
    assert msg.startswith(f"{p}: requests[2].subagent.requests[1]: ")
    assert "hash_ids has 2 blocks but input of 330 tokens" in msg and "floor = 5" in msg


@pytest.mark.parametrize("mutate, where, words", [
    (lambda d: d["requests"][1].pop("in"), "requests[1]: ", "missing field 'in'"),
    (lambda d: d["requests"][0].update(out=-1), "requests[0]: ", "'out' is -1; expected >= 0"),
    (lambda d: d["requests"][0].update(hash_ids="x"), "requests[0]: ", "must be a list"),
    (lambda d: d["requests"][3].update(think_time=-2), "requests[3]: ", "'think_time' must be a number >= 0"),
    (lambda d: d["requests"][2].update(requests=[]), "requests[2]: ", "non-empty list"),
    (lambda d: d.update(block_size="64"), "", "'block_size' must be an integer"),
    (lambda d: d.update(hash_id_scope="global"), "", "hash_id_scope 'global' is not supported"),
    (lambda d: d.pop("tool_tokens"), "", "missing field 'tool_tokens'"),
])
def test_agentic_validation(tmp_path, mutate, where, words):
    p, msg = _agentic_error(tmp_path, mutate)
    assert msg.startswith(f"{p}: {where}") and words in msg


def test_agentic_malformed_json_and_directory_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"id": "x", ')
    with pytest.raises(TraceError, match=r"bad.json: malformed JSON"):
        load_agentic(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match="no session files"):
        load_agentic(empty)
    d = tmp_path / "dup"
    d.mkdir()
    text = (FIX / "agentic_ok.json").read_text()
    (d / "a.json").write_text(text)
    (d / "b.json").write_text(text)
    with pytest.raises(TraceError, match="b.json: session id 'tiny_0001' already used"):
        load_agentic(d)
    with pytest.raises(ValueError, match="sessions_per_s > 0"):
        load_agentic(FIX / "agentic_ok.json", sessions_per_s=0)


@needs_real
def test_real_agentic_session_with_subagents():
    path = SESSIONS / "trace_0003.json.gz"
    raw = json.load(gzip.open(path))
    w = load_agentic(path)
    (s,) = w.sessions
    subs = [i for i in s.items if isinstance(i, Session)]
    raw_subs = [r for r in raw["requests"] if r["type"] == "subagent"]
    assert len(subs) == len(raw_subs) == 2
    assert [len(x.items) for x in subs] == [len(r["requests"]) for r in raw_subs]
    assert all(x.scope == s.scope == "session:trace_0003" for x in subs)
    assert subs[0].sid == "trace_0003/agent_001"
    assert s.n_turns == sum(1 for r in raw["requests"] if r["type"] != "subagent") + sum(
        len(r["requests"]) for r in raw_subs)
    for _, t in w.iter_turns():
        assert len(t.hash_ids) == math.ceil(t.input_tokens / 64)
    hit, total = ideal_reuse_tokens(w)
    print(f"trace_0003: {s.n_turns} requests, ideal reuse {hit / total:.4f}")
    assert hit / total > 0.8


@needs_real
def test_real_shared_prefix_shares_exactly_the_prefix():
    files = [SESSIONS / "trace_0001.json.gz", SESSIONS / "trace_0003.json.gz"]
    # each file alone (per-session scope), then both together with the shared prefix
    ws = [load_agentic(f) for f in files]
    raws = [json.load(gzip.open(f)) for f in files]
    with tempfile.TemporaryDirectory() as d:
        for f in files:
            os.symlink(f, os.path.join(d, f.name))
        shared = load_agentic(d, shared_prefix=True)
    assert [s.sid for s in shared.sessions] == ["trace_0001", "trace_0003"]
    for k, (plain, sh, raw) in enumerate(zip(ws, shared.sessions, raws)):
        p = (raw["tool_tokens"] + raw["system_tokens"]) // 64
        base = PRIVATE_SPAN * (k + 1)
        top = [(t, u) for t, u in zip(plain.sessions[0].items, sh.items) if isinstance(t, Turn)]
        for t, u in top:
            full = t.input_tokens // 64
            cut = min(p, full)
            assert u.hash_ids[:cut] == tuple(range(cut))
            assert all(base <= h < base + PRIVATE_SPAN for h in u.hash_ids[cut:])
            assert u.hash_ids[cut:full] == tuple(base + h for h in t.hash_ids[cut:full])
    h_shared, total = ideal_reuse_tokens(shared)
    h_plain = sum(ideal_reuse_tokens(w)[0] for w in ws)
    p_min = min((r["tool_tokens"] + r["system_tokens"]) // 64 for r in raws)
    # the second session's first request now reuses the common prefix
    assert h_shared - h_plain >= p_min * 64


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic():
    a, b, c = synthetic_agentic(seed=7), synthetic_agentic(seed=7), synthetic_agentic(seed=8)
    assert a == b
    assert a != c


def test_synthetic_structure_and_default_size():
    w = synthetic_agentic()
    assert w.closed_loop and w.block_tokens == 64 and len(w.sessions) == 40
    assert 200 <= w.n_requests <= 600
    sizes = [t.input_tokens for s in w.sessions for t in s.items if isinstance(t, Turn)]
    assert min(sizes) >= 4_000 and max(sizes) <= 60_000
    n_subs = 0
    p = 4_000 // 64

    def check(items, prefix):
        prev = None
        for t in items:
            if isinstance(t, Session):
                continue
            assert len(t.hash_ids) == math.ceil(t.input_tokens / 64)
            assert t.hash_ids[:len(prefix)] == prefix
            if prev is None:
                assert t.think_s == 0.0
            else:
                # each turn extends the previous turn's full blocks with fresh ids
                full = prev.input_tokens // 64
                assert t.hash_ids[:full] == prev.hash_ids[:full]
                assert set(t.hash_ids[full:]).isdisjoint(prev.hash_ids)
                assert t.input_tokens > prev.input_tokens and t.think_s > 0
            prev = t

    for s in w.sessions:
        assert s.scope == "shared"
        check(s.items, tuple(range(p)))
        for sub in (i for i in s.items if isinstance(i, Session)):
            n_subs += 1
            assert sub.scope == s.scope
            check(sub.items, tuple(range(p, p + 2_000 // 64)))
    assert n_subs > 0
    print(f"synthetic default: {w.n_requests} requests, {n_subs} sub-agents, ideal reuse "
          f"{ideal_reuse_ratio(w):.3f}")


def test_synthetic_private_ids_never_collide_across_sessions():
    w = synthetic_agentic(n_sessions=10, seed=3, shared_prefix=False)
    p = 4_000 // 64 + 2_000 // 64
    seen: dict[int, str] = {}
    for s in w.sessions:
        assert s.scope == f"session:{s.sid}"
        for _, t in s.iter_turns():
            for h in t.hash_ids:
                if h >= p:
                    assert seen.setdefault(h, s.sid) == s.sid


def test_session_start_times_poisson_seeded():
    w = synthetic_agentic(n_sessions=5, sessions_per_s=2.0)
    a = session_start_times(w, 100, seed=1)
    assert a == session_start_times(w, 100, seed=1) != session_start_times(w, 100, seed=2)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert 30 < a[-1] < 70  # 99 gaps of mean 0.5 s
    assert len(session_start_times(w)) == 5
    with pytest.raises(ValueError, match="sessions_per_s > 0"):
        session_start_times(Workload("x", 64, True, (), start="concurrency", concurrency=2))


def test_first_turns_cuts_sessions_and_subagents_in_replay_order():
    from kvsim.workload import Session, Turn, first_turns

    t = lambda n: Turn(input_tokens=n, output_tokens=1, hash_ids=tuple(range(-(-n // 64))))  # noqa: E731
    sub = Session("s/sub", "s", (t(70), t(80), t(90)))
    s = Session("s", "s", (t(10), sub, t(200)))
    w = Workload("w", 64, True, (s,), start="poisson", sessions_per_s=1.0)
    two = first_turns(w, 2)
    (cut,) = two.sessions
    assert cut.items[0] == t(10) and isinstance(cut.items[1], Session)
    assert cut.items[1].items == (t(70),)
    assert two.n_requests == 2
    assert first_turns(w, 10) == w
    with pytest.raises(ValueError, match="positive"):
        first_turns(w, 0)


# ---------------------------------------------------------------- priorities


def test_mooncake_priority_is_optional_validated_and_written_back(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
                 '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0], '
                 '"priority": 3}\n')
    w = load_mooncake(p)
    assert [t.priority for _, t in w.iter_turns()] == [None, 3]
    out = tmp_path / "copy.jsonl"
    write_jsonl_mooncake(w, out)
    assert [t.priority for _, t in load_mooncake(out).iter_turns()] == [None, 3]
    assert '"priority"' not in out.read_text().splitlines()[0]  # absent stays absent


@pytest.mark.parametrize("value", ['"high"', "1.5", "true", str(1 << 31), "null, \"x\": 1"])
def test_mooncake_bad_priority_names_file_and_line(tmp_path, value):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n'
                 f'{{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0], '
                 f'"priority": {value}}}\n')
    if value.startswith("null"):  # null is the default, and other fields are ignored
        assert load_mooncake(p).sessions[1].items[0].priority is None
        return
    with pytest.raises(TraceError) as e:
        load_mooncake(p)
    assert str(e.value).startswith(f"{p}:2: ") and "'priority' must be an integer" in str(e.value)


def test_agentic_priorities_by_part_of_the_prompt():
    plain = load_agentic(FIX / "agentic_ok.json")
    assert all(t.priority is None and t.prefix_tokens == 0 for _, t in plain.iter_turns())
    w = load_agentic(FIX / "agentic_ok.json", priorities={"prefix": 5, "context": 2, "subagent": 1})
    (s,) = w.sessions
    main = [t for t in s.items if isinstance(t, Turn)]
    sub = [t for t in s.items if isinstance(t, Session)][0].items
    assert {t.priority for t in main} == {2} and {t.priority for t in sub} == {1}
    assert {t.prefix_priority for _, t in w.iter_turns()} == {5}
    # the tools + system prefix: 100 + 60 tokens in the main agent, 64 + 64 in the sub-agent:
    # 2 full 64-token blocks each
    assert {t.prefix_tokens for _, t in w.iter_turns()} == {128}
    with pytest.raises(ValueError, match="unknown class 'system'"):
        load_agentic(FIX / "agentic_ok.json", priorities={"system": 1})
    with pytest.raises(ValueError, match="priorities.context"):
        load_agentic(FIX / "agentic_ok.json", priorities={"context": "high"})
