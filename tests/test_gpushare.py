"""Ranks that share a GPU (``node.ranks_per_gpu``): in the sim they share its compute,
its PCIe link and its copy resources.

Scenarios:
- two ranks on one GPU each launch a step at once: processor sharing, each at half the
  GPU while both run, so the shorter ends at twice its work and the longer at the sum;
  a step launched while the other is half done: worked out by hand below;
- their copies share one link: each of two batches at once moves at half the link's rate
  (on GPUs of their own: each at the full rate);
- ``ranks_per_gpu: 1`` is the node as before (its rows equal a run without the key), and
  sharing the GPU makes the same node's turns slower;
- the compute log names each call's rank (the steps of ranks on one GPU overlap);
- bad input: more ranks x tp than gpus x ranks_per_gpu, a bad value, or GPU tiers and
  weights of the ranks on one GPU beyond its memory: exit 2, naming the key.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config import ConfigFileError, load_config
from kvsim.config.hardware import load_profile
from kvsim.engine.compute import load_model
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
from kvsim.run import prepare_run, replay
from kvsim.run.seam import settings_for
from kvsim_backends.sim import SimBackend, SimRuntime

PB = 2 << 20     # 2 MiB pages
PAGES = 64       # 128 MiB a batch
PROFILE = load_profile("h200-pcie")  # (no node bus: a rank's link is its GPU's alone)
# strict turns (the ends below are worked out without it; tests/test_smshare.py has the overlap)
PROFILE = PROFILE.model_copy(update={"gpu": PROFILE.gpu.model_copy(update={"kernel_overlap": 0.0})})


def _node(ranks, per_gpu):
    rt = SimRuntime()
    base = settings_for(PB, {Level.GPU: PAGES, Level.HOST: PAGES}, PROFILE, copy_path="copy_engine")
    return rt, [SimBackend(rt, dataclasses.replace(base, rank=r, ranks=ranks, tp=1,
                                                   ranks_per_gpu=per_gpu)) for r in range(ranks)]


def _took(rt, bes, steps):
    """Each rank r launches a step of ``steps[r][1]`` seconds at ``steps[r][0]``: the
    seconds each took (without the profile's fixed latency a call)."""
    out = [None] * len(bes)

    def launch(r, at, secs):
        yield rt.env.timeout(at)
        out[r] = (yield bes[r].compute(secs)) - PROFILE.compute.latency
    for r, (at, secs) in enumerate(steps):
        rt.env.process(launch(r, at, secs))
    rt.env.run()
    return out


def test_two_ranks_on_one_gpu_share_its_compute():
    s = PROFILE.compute.scale
    a, b = 0.010, 0.030  # nominal seconds of the two steps
    rt, bes = _node(2, 2)
    assert bes[0].fluid is bes[1].fluid
    took = _took(rt, bes, [(0.0, a), (0.0, b)])
    # both at half rate until the shorter is done at 2a; the longer then alone: a + b
    assert took == pytest.approx([2 * a * s, (a + b) * s], rel=1e-9)
    # on GPUs of their own each takes its own work
    rt, bes = _node(2, 1)
    assert bes[0].fluid is not bes[1].fluid
    assert _took(rt, bes, [(0.0, a), (0.0, b)]) == pytest.approx([a * s, b * s], rel=1e-9)


def test_a_step_launched_midway_slows_the_one_running():
    s = PROFILE.compute.scale
    a, b = 0.020, 0.004
    t1 = a * s / 2  # rank 1 launches when rank 0's step is half done
    rt, bes = _node(2, 2)
    took = _took(rt, bes, [(0.0, a), (t1, b)])
    # rank 1's step (b s of work) at half rate: 2 b s; rank 0's did b s of work meanwhile,
    # and the rest (a s / 2 - b s) alone: t1 + 2 b s + (a s / 2 - b s)
    assert took[1] == pytest.approx(2 * b * s, rel=1e-9)
    assert took[0] == pytest.approx(t1 + 2 * b * s + (a * s / 2 - b * s), rel=1e-9)


def _batch():
    idx = np.arange(PAGES, dtype=np.int64)
    return Batch(BatchKind.ONBOARD, Level.HOST, Level.GPU, idx, idx, [0] * PAGES, PB, 0)


def _rates_midway(per_gpu):
    """Each rank submits one host -> GPU batch at t=0: the rates of the flows moving midway."""
    rt, bes = _node(2, per_gpu)
    done = [be.transfer(_batch()) for be in bes]
    rt.env.run(until=1e-3)  # (past the calls' host time, well before the bytes are in)
    flows = list({id(f): f for be in bes for f in be.fluid.flows}.values())
    rates = [f.rate for f in flows]
    rt.env.run(until=rt.env.all_of(done))
    assert all(ev.value for ev in done)
    return rates


def test_copies_of_ranks_on_one_gpu_share_its_link():
    own = _rates_midway(1)  # each rank its GPU and link: each batch at the full rate
    assert len(own) == 2 and own[0] == own[1] > 0
    shared = _rates_midway(2)  # one link: the same two flows on it, max-min fair: half each
    assert shared == pytest.approx([own[0] / 2] * 2, rel=1e-9)


SMALL = ["workload.synthetic.n_sessions=8", "workload.max_turns=4", "model=llama-3-8b",
         "cache.page_bytes=2MiB", "node.ranks=2",
         "cache.tiers=[{level: gpu, quota: 2GiB}, {level: host, quota: 4GiB}]"]


def _rows(sets):
    res = replay(prepare_run(load_config("default", [*SMALL, *sets])))
    return sorted((r.rank, r.session, r.turn, r.ttft_s, r.e2e_s) for r in res.rows)


def test_one_rank_a_gpu_is_the_node_as_before_and_sharing_is_slower():
    before = _rows([])
    assert _rows(["node.ranks_per_gpu=1"]) == before
    shared = _rows(["node.gpus=1", "node.ranks_per_gpu=2"])
    assert [r[:3] for r in shared] == [r[:3] for r in before]
    assert sum(r[4] for r in shared) > sum(r[4] for r in before)


def test_the_compute_log_names_each_calls_rank():
    """Two ranks on one GPU: their steps overlap in time, and each compute log row's last
    column says whose it was: a rank's own rows run one after another, and there are as
    many of them as that rank's compute calls."""
    log: list = []
    res = replay(prepare_run(load_config("default", [*SMALL, "node.gpus=1", "node.ranks_per_gpu=2"])),
                 "sim", backend_options={"compute_log": log})
    last = {row["rank"]: row["compute_calls"] for row in res.timeline}  # (each rank's last row)
    by_rank = {r: sorted(x[:3] for x in log if x[-1] == r) for r in (0, 1)}
    assert {x[-1] for x in log} == {0, 1}
    assert {r: len(rows) for r, rows in by_rank.items()} == last
    for rows in by_rank.values():
        assert all(b[0] >= a[0] + a[2] - 1e-9 for a, b in zip(rows, rows[1:]))
    # the two ranks' calls do overlap (so the time alone could not tell them apart)
    starts = [s for s, _, _ in by_rank[1]]
    assert any(np.searchsorted(starts, s + t) > np.searchsorted(starts, s, side="right")
               for s, _, t in by_rank[0])


def _gpu_quota_beyond_two():
    """A GPU quota that fits one rank beside its weights on a GPU, not two."""
    w = load_model("llama-3-8b").weight_bytes_per_gpu
    q = (PROFILE.gpu.memory - 2 * w) // 2 + (1 << 30)
    assert q + w <= PROFILE.gpu.memory < 2 * (q + w)
    return q


@pytest.mark.parametrize("sets, key", [
    (["node.ranks=3", "node.gpus=1", "node.ranks_per_gpu=2"], "node.ranks_per_gpu"),
    (["node.ranks_per_gpu=0"], "node.ranks_per_gpu"),
    (["node.ranks_per_gpu=two"], "node.ranks_per_gpu"),
    (["node.gpus=1", "node.ranks_per_gpu=2", f"cache.tiers[0].quota={_gpu_quota_beyond_two()}"],
     r"cache\.tiers\[0\]\.quota"),
])
def test_bad_gpu_sharing_is_refused_naming_the_key(sets, key):
    with pytest.raises(ConfigFileError, match=key):
        prepare_run(load_config("default", [*SMALL, *sets]))
    res = CliRunner().invoke(app, ["run", "default", "--no-progress",
                                   *[x for s in [*SMALL, *sets] for x in ("--set", s)]])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "node.ranks_per_gpu" in res.output or "quota" in res.output
