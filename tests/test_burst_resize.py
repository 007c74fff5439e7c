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

from kvsim.compute import ComputeModel, load_model
from kvsim.core import Level, ManagerSpec, TierManager, TierSpec
from kvsim.core.plan import BatchKind
from kvsim.engine import Engine, EngineParams
from kvsim.hardware import load_profile
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
    be = SimBackend(rt, profile, page, {t.level: t.max_slots for t in mgr.tiers})
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
