"""Burst resize in the engine, on the sim backend: a request that grows to a very long
context at once (200K tokens, 6,250 pages of 32 tokens) while the GPU tier is full of an
earlier request's cached pages makes one plan for that resize, whose evictions to host
are one batch of thousands of pages, never a plan or a batch per page.

Story: a 200K-token prompt is computed and cached (its session ends, its pages stay on
GPU, droppable); a second 200K-token prompt of another scope arrives later. Its prefill
needs all 6,250 GPU slots. With a step budget that holds the whole prompt it grows once:
one grow plan, one GPU -> host batch of 6,250 pages. With the default chunked prefill
it grows a chunk at a time: one plan per chunk, each one batch of the chunk's pages.
"""

from __future__ import annotations

import pytest

from kvsim.run.seam import settings_for
from kvsim.engine.compute import ComputeModel, load_model
from kvsim.core import Level, ManagerSpec, TierManager, TierSpec
from kvsim.core.plan import BatchKind
from kvsim.engine import Engine, EngineParams
from kvsim.config.hardware import load_profile
from kvsim.workload import Session, Turn, Workload
from kvsim_backends.sim import SimBackend, SimRuntime

B = 32
TOKENS = 200_000
PAGES = TOKENS // B  # 6,250
# The GPU tier holds PAGES + 1 pages (admission counts one more page than the prompt's,
# for a copy-on-write of the last): the first prompt leaves one free, so the second's
# grow takes that one and evicts PAGES - 1.
EVICTED = PAGES - 1


def _run(max_batch_tokens: int):
    shape = load_model("llama-3-8b")
    page = shape.kv_bytes_per_token * B
    mgr = TierManager(ManagerSpec(page_bytes=page, tokens_per_block=B, tiers=(
        TierSpec(Level.GPU, (PAGES + 1) * page), TierSpec(Level.HOST, 2 * PAGES * page))))
    profile = load_profile("h200-pcie")
    rt = SimRuntime()
    be = SimBackend(rt, settings_for(page, {t.level: t.max_slots for t in mgr.tiers}, profile))
    batches = []
    transfer = be.transfer

    def recording(batch):
        batches.append((rt.now, batch))
        return transfer(batch)

    be.transfer = recording  # type: ignore[method-assign]
    eng = Engine(rt, be, mgr, ComputeModel(shape, profile),
                 EngineParams(max_batch_tokens=max_batch_tokens))
    turns = [Turn(TOKENS, 1, tuple(range(k * PAGES, (k + 1) * PAGES)), arrival_s=t)
             for k, t in enumerate((0.0, 60.0))]
    eng.load(Workload("burst", B, False, tuple(
        Session(f"s{k}", f"scope{k}", (t,), start_s=t.arrival_s) for k, t in enumerate(turns))))
    rt.run(until=rt.process(eng.serve()))
    return mgr, eng, batches


def test_a_200k_token_prompt_grows_in_one_plan_of_one_batch():
    mgr, eng, batches = _run(max_batch_tokens=256 * 1024)
    first, second = eng.metrics.rows
    assert not first.failed and not second.failed
    assert second.computed_tokens == TOKENS and second.first_token_ns > 0
    # the first prompt fit in free slots: nothing moved; the second evicted it whole
    assert [(b.kind, b.src, b.dst, b.pages) for _, b in batches] == [
        (BatchKind.EVICT, Level.GPU, Level.HOST, EVICTED)]
    assert all(t >= 60.0 for t, _ in batches)
    assert mgr.counters.moved_pages[Level.GPU][Level.HOST] == EVICTED
    assert mgr.tier_stats(Level.HOST).used == EVICTED


def test_chunked_prefill_makes_one_batched_plan_per_chunk():
    chunk = 8192
    mgr, eng, batches = _run(max_batch_tokens=chunk)
    second = eng.metrics.rows[1]
    assert not second.failed and second.computed_tokens == TOKENS
    sizes = [b.pages for _, b in batches]
    assert all(b.src == Level.GPU and b.dst == Level.HOST for _, b in batches)
    assert sum(sizes) == EVICTED
    # each resize's plan moves a chunk's pages in one batch (the last chunk is shorter)
    assert len(sizes) == -(-TOKENS // chunk)
    assert max(sizes) == chunk // B


# == the synthetic workload's burst =======================================================
def test_a_burst_adds_pinned_long_requests_and_leaves_the_sessions_as_they_were():
    from kvsim.workload import session_start_times, synthetic_agentic

    plain = synthetic_agentic(12, seed=3)
    burst = synthetic_agentic(12, seed=3, burst_requests=3, burst_input_tokens=150_000,
                              burst_output_tokens=5, burst_at_s=42.0)
    assert burst.sessions[:12] == plain.sessions
    extra = burst.sessions[12:]
    assert [s.sid for s in extra] == ["burst-00", "burst-01", "burst-02"]
    assert len({s.scope for s in extra}) == 3  # each its own scope: nothing shared
    ids = {i for _, t in plain.iter_turns() for i in t.hash_ids}
    for s in extra:
        (turn,) = s.items
        assert (turn.input_tokens, turn.output_tokens, s.start_s) == (150_000, 5, 42.0)
        assert len(turn.hash_ids) == -(-150_000 // burst.block_tokens)
        assert not ids & set(turn.hash_ids)  # fresh ids: nothing cached to reuse
        ids |= set(turn.hash_ids)
    starts = session_start_times(burst, seed=3)
    assert starts[:12] == session_start_times(plain, seed=3) and starts[12:] == [42.0] * 3


def test_a_burst_needs_poisson_starts_and_the_synthetic_kind():
    from kvsim.config import ConfigFileError, validate_config
    from kvsim.workload import synthetic_agentic

    with pytest.raises(ValueError, match="start='poisson'"):
        synthetic_agentic(2, start="concurrency", burst_requests=1)
    with pytest.raises(ValueError, match="burst_requests"):
        synthetic_agentic(2, burst_requests=-1)
    base = {"cache": {"tiers": [{"level": "gpu", "quota": "56GiB"}]}}
    cfg = validate_config({**base, "workload": {"synthetic": {"burst": {"requests": 2, "at": "30s"}}}})
    assert cfg.workload.synthetic.burst.at == 30.0
    assert cfg.workload.synthetic.burst.input_tokens == 200_000
    for bad in ({"start": "concurrency", "synthetic": {"burst": {}}},
                {"kind": "mooncake", "path": "x.jsonl", "synthetic": {"burst": {}}},
                {"synthetic": {"burst": {"requests": 0}}}):
        with pytest.raises(ConfigFileError, match="workload"):
            validate_config({**base, "workload": bad})


def test_the_summary_splits_ttft_into_short_and_long_prompts():
    """A run with two 120K-token requests in a burst: the summary's long TTFTs are those
    two requests' own, the short ones every other request's."""
    from kvsim.config import load_config
    from kvsim.run import prepare_run, replay

    cfg = load_config("configs/default.yaml", [
        "workload.synthetic.n_sessions=4", "cache.tiers[0].quota=56GiB",
        "workload.synthetic.burst.requests=2", "workload.synthetic.burst.input_tokens=120000",
        "workload.synthetic.burst.at=5s", "output.plots=false"])
    res = replay(prepare_run(cfg))
    m = res.metrics
    rows = [r for r in res.rows if r.done_ns >= 0 and not r.failed]
    long_ = sorted(r.ttft_s for r in rows if r.input_tokens >= 100_000)
    short = [r.ttft_s for r in rows if r.input_tokens < 100_000]
    assert len(long_) == 2 and len(short) == m["requests_completed"] - 2 > 0
    by = m["ttft_s_by_input"]
    assert by["long"]["p50"] == pytest.approx(sum(long_) / 2)
    assert by["short"]["mean"] == pytest.approx(sum(short) / len(short))
    assert by["long"]["p50"] > by["short"]["p99"]  # 120K-token prefills take the longest
