"""Shared fixtures: small tier managers and a reference backend whose tag arrays match
their tiers' reserved ranges, plus helpers that run a plan the way the engine does and
then check the refcheck and the core's invariants.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvsim.core import Level, ManagerSpec, TierManager, TierSpec
from kvsim.core.audit import audit
from kvsim_backends.reference import ReferenceBackend

PAGE = 16          # bytes per page: small numbers keep the stories readable
TPB = 4            # tokens per block


def make_manager(gpu: int = 4, host: int | None = 4, disk: int | None = 4,
                 max_gpu: int = 0, max_host: int = 0, max_disk: int = 0,
                 page: int = PAGE, tpb: int = TPB, policy=None, placement=None,
                 tier_policies=None, **copies) -> TierManager:
    """A manager whose tiers hold ``gpu``/``host``/``disk`` pages (None: no such tier);
    ``max_*`` is the reserved range in pages (0: same as the quota); ``policy``: an
    eviction policy (default LRU); ``placement``: a placement policy (default: the
    cascade); ``tier_policies``: tier position -> its own eviction policy; ``copies``: ManagerSpec's retained-copy options
    (``keep_copy``, ``write_through``, ...)."""
    tiers = [TierSpec(Level.GPU, gpu * page, max_gpu * page)]
    if host is not None:
        tiers.append(TierSpec(Level.HOST, host * page, max_host * page))
    if disk is not None:
        tiers.append(TierSpec(Level.DISK, disk * page, max_disk * page))
    return TierManager(ManagerSpec(page_bytes=page, tokens_per_block=tpb, tiers=tuple(tiers),
                                   **copies), policy, placement, tier_policies)


def backend_for(m: TierManager) -> ReferenceBackend:
    """A reference backend with one tag per slot of each tier's reserved range."""
    return ReferenceBackend({t.level: t.max_slots for t in m.tiers})


def run(m: TierManager, be: ReferenceBackend, plan, fail_batches=frozenset()) -> list[bool]:
    """Execute a plan on the backend stage by stage and complete it; return the flags."""
    oks = be.run_plan(plan, fail_batches=frozenset(fail_batches))
    m.complete(plan, oks)
    return oks


def check(m: TierManager, be: ReferenceBackend | None = None) -> None:
    """The refcheck (every active request's GPU pages and every committed page hold the tag
    the manager expects) and every invariant of the core."""
    if be is not None:
        for req in m.requests():
            exp = m.expected(req)
            got = be.read_tags(exp.level, exp.slots)
            assert np.array_equal(got, exp.tags), f"refcheck failed for {req!r}"
    audit(m, be.read_tags if be is not None else None)


def blocks(n: int, family: int = 0, start: int = 0) -> list[int]:
    """``n`` trace block ids of a prompt family: equal families share their prefixes."""
    return [family * 1000 + i for i in range(start, start + n)]


def new_active(m: TierManager, be: ReferenceBackend, ntokens: int, family: int = 0,
               scope="s", priority: int = 0, commit: bool = True):
    """A request that computed ``ntokens`` tokens of ``family`` and committed them (the
    partial last block too): create, resume, grow, commit, write the fill."""
    nb = -(-ntokens // m.tokens_per_block)
    req = m.create(scope, blocks(nb, family), ntokens, priority=priority)
    plan = m.resume(req)
    assert plan, plan
    run(m, be, plan)
    if ntokens > req.tokens:
        plan = m.grow(req, ntokens)
        assert plan, plan
        run(m, be, plan)
    if commit:
        be.fill(m.commit(req, ntokens, final=True))
    return req


@pytest.fixture
def mgr() -> TierManager:
    return make_manager()


@pytest.fixture
def be(mgr) -> ReferenceBackend:
    return backend_for(mgr)


def round_profile(**over):
    """A hardware profile of round numbers for hand-computed timings; ``over`` replaces
    whole top-level sections."""
    from kvsim.config.hardware import HardwareProfile

    d = {
        "name": "round",
        "link": {"kind": "pcie", "h2d": "50GB/s", "d2h": "40GB/s", "both": "80GB/s"},
        "copy_engine": {"count": 2, "per_call": "10us", "per_page": "2us"},
        "sm": {"count": 8, "cta_onboard": "10GB/s", "cta_offload": "10GB/s",
               "threads_per_cta": 128, "copy_cta_slots": 8, "launch": "5us",
               "interference": {"sm_kernel_slowdown": 0.2, "sm_kernel_ctas": 4,
                                "copy_engine_slowdown": 0.1, "busy_cta_efficiency": 0.5}},
        "nvme": {"read": "2GB/s", "write": "1GB/s", "queue_depth": 4, "latency": "1ms",
                 "piece": "4MiB"},
        "host": {"fill_rate": "5GB/s"},
        "gpu": {"name": "round", "memory": "100GB", "flops_bf16": 100e12, "hbm": "4TB/s",
                "prefill_efficiency": 0.5, "decode_efficiency": 0.5, "step_overhead": "1ms"},
    }
    d.update(over)
    return HardwareProfile.model_validate(d)


def run_events(rt, evs: dict) -> dict:
    """Run the runtime to the end (write-back too); each named event's (time, value)."""
    out = {}

    def watch(name, ev):
        v = yield ev
        out[name] = (rt.now, v)
    for k, ev in evs.items():
        rt.process(watch(k, ev))
    rt.run()
    return out
