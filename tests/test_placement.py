"""Placement policies, one story each: where a tier's victims go under each built-in, and
which pages restored from disk keep their copy, on hand-built cases small enough to name
every page; then that the manager refuses what would break its invariants whatever a
placement answers, and how a run picks its placement.

A "turn" computes a prompt of a family's blocks, commits it and closes: its pages stay in
the prefix tree, droppable, on GPU, the last block the least recently used (a turn's tail
enters the LRU first). ``m.evict(level, n)`` then pushes the ``n`` least recently used
pages of a tier out, where the placement says.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import TPB, backend_for, blocks, check, make_manager, new_active, run
from kvsim.core import CoreError, Level
from kvsim.core.policy import (DROP, PLACEMENT_NAMES, Cascade, PlacementPolicy,
                               RecomputeOverDisk, SkipHost, make_placement)
from kvsim.core.types import Phase

GPU, HOST, DISK = Level.GPU, Level.HOST, Level.DISK


def turn(m, be, family: int, nblocks: int = 1):
    """One turn over ``nblocks`` blocks of ``family``; returns its pages (depth order)."""
    req = new_active(m, be, nblocks * TPB, family=family)
    pages = list(req.pages)
    m.close(req)
    check(m, be)
    return pages


def evict(m, be, level: Level, n: int) -> None:
    plan = m.evict(level, n)
    assert plan, plan
    run(m, be, plan)
    check(m, be)


def where(m, pages) -> list:
    """Each page's tier, by name, or 'dropped'."""
    return ["dropped" if p.phase is Phase.DROPPED else m.tiers[p.tier].level.name.lower()
            for p in pages]


def three_tiers(placement, **copies):
    m = make_manager(gpu=4, host=4, disk=8, placement=placement, **copies)
    return m, backend_for(m)


def on_host(placement):
    """A one-block turn X and a three-block turn Y, all four pages pushed to host (X's
    page least recent, then Y's from its deepest)."""
    m, be = three_tiers(placement)
    x = turn(m, be, 1)
    y = turn(m, be, 2, nblocks=3)
    evict(m, be, GPU, 4)
    assert where(m, x + y) == ["host"] * 4
    return m, be, x, y


# -- the default ----------------------------------------------------------------------------

def test_cascade_is_the_default_and_moves_victims_one_tier_colder():
    m = make_manager()
    assert isinstance(m.placement, Cascade) and not m._placing
    m, be, x, y = on_host(None)
    evict(m, be, HOST, 4)
    assert where(m, x + y) == ["disk"] * 4
    assert m.counters.moved_pages[HOST][DISK] == 4 and m.counters.dropped_pages[HOST] == 0


# -- recompute ------------------------------------------------------------------------------

def test_recompute_drops_shallow_pages_bound_for_disk_and_writes_deep_ones():
    """With ``max_depth`` 2, X's page (depth 0, a leaf) is dropped rather than written to
    disk; Y's deepest page (depth 2) is written; Y's shallow pages go to disk too: they
    still have a child there, and a parent never goes before its child."""
    m, be, x, y = on_host(RecomputeOverDisk(max_depth=2))
    evict(m, be, HOST, 4)
    assert where(m, x) == ["dropped"]
    assert where(m, y) == ["disk", "disk", "disk"]
    assert m.counters.dropped_pages[HOST] == 1 and m.counters.moved_pages[HOST][DISK] == 3


def test_recompute_drops_a_whole_chain_children_first():
    """With ``max_depth`` 3 every page is cheaper to recompute: Y's chain goes deepest
    first (its order in the tier), each parent once its child is gone."""
    m, be, x, y = on_host(RecomputeOverDisk(max_depth=3))
    evict(m, be, HOST, 4)
    assert where(m, x + y) == ["dropped"] * 4
    assert m.counters.moved_pages[HOST][DISK] == 0


def test_recompute_leaves_moves_to_host_alone():
    m, be = three_tiers(RecomputeOverDisk(max_depth=100))
    x = turn(m, be, 1, nblocks=2)
    evict(m, be, GPU, 2)
    assert where(m, x) == ["host", "host"]


def test_recompute_never_drops_a_held_page():
    m, be, x, y = on_host(RecomputeOverDisk(max_depth=3))
    held = m.create("s", blocks(1, 1), TPB)  # a suspended turn holds X's page
    assert held.pages == x
    evict(m, be, HOST, 4)
    assert where(m, x) == ["disk"] and where(m, y) == ["dropped"] * 3


def test_recompute_drops_from_gpu_when_disk_is_next():
    m = make_manager(gpu=3, host=None, disk=4, placement=RecomputeOverDisk(max_depth=1))
    be = backend_for(m)
    x = turn(m, be, 1)
    y = turn(m, be, 2, nblocks=2)
    evict(m, be, GPU, 3)
    assert where(m, x) == ["dropped"] and where(m, y) == ["disk", "disk"]
    assert m.counters.dropped_pages[GPU] == 1


def _restored(placement):
    """Y (two blocks) written to disk, then found again by a new turn: restored to GPU,
    with the disk tier's keep_copy on."""
    m = make_manager(gpu=2, host=None, disk=4, placement=placement, keep_copy=True)
    be = backend_for(m)
    y = turn(m, be, 2, nblocks=2)
    evict(m, be, GPU, 2)
    assert where(m, y) == ["disk", "disk"]
    req = m.create("s", blocks(2, 2), 2 * TPB)
    run(m, be, m.resume(req))
    check(m, be)
    assert where(m, y) == ["gpu", "gpu"]
    return m, be, y, req


def test_recompute_keeps_no_disk_copy_of_a_page_cheaper_to_recompute():
    m, _, y, _ = _restored(RecomputeOverDisk(max_depth=1))
    assert [p.copy >= 0 for p in y] == [False, True]
    assert m.counters.copies_kept == 1
    m, _, y, _ = _restored(None)  # the default keeps both, as keep_copy alone does
    assert [p.copy >= 0 for p in y] == [True, True]


def test_a_drop_of_a_page_with_a_ready_copy_takes_the_copy_back():
    """A page asked to drop that has a ready disk copy goes back onto it (no bytes move,
    nothing lost); its parent, still a parent, cascades."""

    class DropLater(PlacementPolicy):
        name = "drop-later"
        drop = False  # cascade at first; every victim asked to drop once set

        def place(self, page, src, levels, clock):
            return DROP if self.drop else src + 1

    placement = DropLater()
    m, be, y, req = _restored(placement)  # keep_copy's decision is the default's: both kept
    assert [p.copy >= 0 and p.copy_ready for p in y] == [True, True]
    m.close(req)
    placement.drop = True
    evict(m, be, GPU, 2)
    assert where(m, y) == ["disk", "disk"]
    assert m.counters.copies_reused == 2 and m.counters.dropped_pages[GPU] == 0


# -- skip-host ------------------------------------------------------------------------------

def test_skip_host_sends_pages_used_once_straight_to_disk():
    """A's page was used by one turn, B's by two: A skips the host tier, B cascades."""
    for placement, expect in ((None, ["host", "host"]), (SkipHost(), ["disk", "host"])):
        m = make_manager(gpu=2, host=4, disk=4, placement=placement)
        be = backend_for(m)
        a = turn(m, be, 1)
        b = turn(m, be, 2)
        assert turn(m, be, 2) == b  # B's page found again: a second use
        evict(m, be, GPU, 2)
        assert where(m, a + b) == expect, placement
        assert m.counters.moved_pages[GPU][DISK] == expect.count("disk")


def test_skip_host_keeps_page_metadata_under_lru():
    m = make_manager(placement=SkipHost())
    assert not m._fast  # the fast LRU path keeps no use counts: the generic one does


def test_skip_host_splits_one_plan_between_host_and_disk():
    """The host is full (H, held by a suspended turn): B's page (used twice) goes there
    and pushes H to disk, while A's (used once) goes straight to disk, in one plan, the
    disk taking both."""
    m = make_manager(gpu=2, host=1, disk=4, placement=SkipHost())
    be = backend_for(m)
    h = turn(m, be, 3)
    m.create("s", blocks(1, 3), TPB)  # holds H's page
    evict(m, be, GPU, 1)
    assert where(m, h) == ["host"]
    a = turn(m, be, 1)
    b = turn(m, be, 2)
    turn(m, be, 2)
    evict(m, be, GPU, 2)
    assert where(m, a + b + h) == ["disk", "host", "disk"]
    assert m.counters.moved_pages[GPU][DISK] == 1 and m.counters.moved_pages[HOST][DISK] == 1


# -- invariants stay the manager's ----------------------------------------------------------

class Nowhere(PlacementPolicy):
    name = "nowhere"

    def __init__(self, dest):
        self.dest = dest

    def place(self, page, src, levels, clock):
        return self.dest


@pytest.mark.parametrize("dest", [0, 3, 7, "disk", True])
def test_a_placement_that_answers_no_colder_tier_is_an_error(dest):
    m, be = three_tiers(Nowhere(dest))
    turn(m, be, 1)
    with pytest.raises(CoreError, match="nowhere"):
        m.evict(GPU, 1)


def test_every_builtin_is_registered_and_recompute_checks_its_depth():
    assert PLACEMENT_NAMES[0] == "cascade"
    assert {type(make_placement(n)).__name__ for n in PLACEMENT_NAMES} == \
        {"Cascade", "RecomputeOverDisk", "SkipHost"}
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_depth"):
            RecomputeOverDisk(max_depth=bad)


# -- recompute's depth from the model and the hardware ----------------------------------------

def test_recompute_depth_is_where_recompute_starts_to_cost_more_than_disk():
    from kvsim.engine.compute import ComputeModel
    from kvsim.config import load_config
    from kvsim.run.policies import block_recompute_s, disk_page_s, recompute_depth
    from kvsim.run import prepare_run

    prep = prepare_run(load_config("configs/default.yaml"))
    model = ComputeModel(prep.shape, prep.profile)
    tpb, page = prep.cfg.cache.tokens_per_block, prep.spec.page_bytes
    d = recompute_depth(model, prep.profile, tpb, page, 8192)
    disk = disk_page_s(prep.profile, page)
    assert 0 < d < 1 << 31
    assert block_recompute_s(model, tpb, d - 1, 8192) < disk <= block_recompute_s(model, tpb, d, 8192)
    # a disk twice as fast halves its cost: recomputing is cheaper at fewer depths
    fast = prep.profile.model_copy(update={"nvme": prep.profile.nvme.model_copy(
        update={"read": prep.profile.nvme.read * 2, "write": prep.profile.nvme.write * 2})})
    assert recompute_depth(model, fast, tpb, page, 8192) < d


# -- choosing the placement in a run ---------------------------------------------------------

runner = CliRunner()
SMALL = ["--set", "workload.synthetic.n_sessions=4", "--set", "output.plots=false",
         "--no-progress"]


def test_config_selects_the_placement_and_refuses_unknown_names(tmp_path):
    from kvsim.cli import app
    from kvsim.config import ConfigFileError, load_config

    assert load_config("configs/default.yaml").cache.policy.placement == "cascade"
    assert load_config("configs/default.yaml", ["cache.policy.placement=skip-host"]) \
        .cache.policy.placement == "skip-host"
    with pytest.raises(ConfigFileError) as e:
        load_config("configs/default.yaml", ["cache.policy.placement=nearest"])
    assert "cache.policy.placement" in str(e.value) and "'nearest'" in str(e.value)
    for bad in ("nearest", "no_such_module_xyz:Thing", "json:JSONDecoder"):
        out = tmp_path / bad.replace(":", "_")
        r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                                "--set", f"cache.policy.placement={bad}"])
        assert r.exit_code == 2, r.output
        assert "cache.policy.placement" in r.output and "Traceback" not in r.output
        assert not out.exists()


def test_summary_names_the_placement(tmp_path):
    from kvsim.cli import app

    for name in PLACEMENT_NAMES:
        out = tmp_path / name
        r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                                "--set", f"cache.policy.placement={name}"])
        assert r.exit_code == 0, r.output
        run_info = json.loads((out / "summary.json").read_text())["run"]
        assert run_info["placement"] == name
        assert ("placement_max_depth" in run_info) == (name == "recompute")
        assert (f"placement {name}" in r.output) == (name != "cascade")


def test_the_documented_example_placement_runs(tmp_path):
    """docs/policies.md's placement example: loads as module:Class and drops the first
    block's pages instead of writing them to disk; a run takes it."""
    import re
    import sys as _sys
    from pathlib import Path

    from kvsim.cli import app
    from kvsim.run.policies import PlacementError, load_user_placement

    doc = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    code = [c for c in re.findall(r"```python\n(.*?)```", doc, re.S) if "PlacementPolicy" in c][0]
    (tmp_path / "doc_placement.py").write_text(code)
    _sys.path.insert(0, str(tmp_path))
    try:
        placement = load_user_placement("doc_placement:FirstBlocksRecompute")
        m = make_manager(gpu=3, host=None, disk=4, placement=placement)
        be = backend_for(m)
        x = turn(m, be, 1)  # a one-block prompt: cheaper to recompute
        y = turn(m, be, 2, nblocks=2)
        evict(m, be, GPU, 3)
        assert where(m, x) == ["dropped"] and where(m, y) == ["disk", "disk"]
        with pytest.raises(PlacementError, match="not a placement policy"):
            load_user_placement("json:JSONDecoder")
        with pytest.raises(PlacementError, match="cannot load"):
            load_user_placement("doc_placement:Nope")
        out = tmp_path / "run"
        r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                                "--set", "cache.policy.placement=doc_placement:FirstBlocksRecompute"])
        assert r.exit_code == 0, r.output
    finally:
        _sys.path.remove(str(tmp_path))
        _sys.modules.pop("doc_placement", None)


# -- a tier's own eviction order -------------------------------------------------------------

def test_each_tier_evicts_in_its_own_order():
    """GPU under lru, host under lfu. A (used twice) and B (once) wait on host; C (used
    twice, older) and D (once, newer) on GPU. One page must leave the GPU: lru's choice,
    C, the least recent; the full host makes room by lfu's choice, B, the least used
    (lru would have pushed out A, lfu on GPU would have sent D)."""
    from kvsim.core.policy import LFU, LRU

    def story(policy, tier_policies):
        m = make_manager(gpu=2, host=2, disk=4, policy=policy, tier_policies=tier_policies)
        be = backend_for(m)
        a = turn(m, be, 1)
        assert turn(m, be, 1) == a
        b = turn(m, be, 2)
        evict(m, be, GPU, 2)
        c = turn(m, be, 3)
        assert turn(m, be, 3) == c
        d = turn(m, be, 4)
        evict(m, be, GPU, 1)
        return where(m, a + b + c + d)

    assert story(LRU(), {1: LFU()}) == ["host", "disk", "host", "gpu"]
    assert story(LRU(), None) == ["disk", "host", "host", "gpu"]
    assert story(LFU(), None) == ["host", "disk", "gpu", "host"]
    assert story(LFU(), {0: LRU()}) == ["host", "disk", "host", "gpu"]


def test_a_tier_policy_for_no_such_tier_is_an_error():
    from kvsim.core.policy import LFU

    with pytest.raises(CoreError, match="no tier at position 3"):
        make_manager(tier_policies={3: LFU()})


def test_config_gives_a_tier_its_own_eviction_policy(tmp_path):
    from kvsim.cli import app
    from kvsim.config import ConfigFileError, load_config

    cfg = load_config("configs/default.yaml", ["cache.tiers[1].eviction=lfu"])
    assert [t.eviction for t in cfg.cache.tiers] == [None, "lfu", None]
    out = tmp_path / "ok"
    r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                            "--set", "cache.tiers[1].eviction=lfu"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "summary.json").read_text())["run"]["tier_eviction"] == {"host": "lfu"}
    assert "lru, host lfu" in r.output
    with pytest.raises(ConfigFileError, match=r"cache.tiers\[1\].eviction.*whole cache"):
        load_config("configs/default.yaml", ["cache.tiers[1].eviction=belady"])
    with pytest.raises(ConfigFileError, match="cannot be mixed"):
        load_config("configs/default.yaml", ["cache.policy.eviction=belady",
                                             "cache.tiers[2].eviction=lfu"])
    for bad in ("mru", "json:JSONDecoder"):
        out = tmp_path / bad.replace(":", "_")
        r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *SMALL,
                                "--set", f"cache.tiers[2].eviction={bad}"])
        assert r.exit_code == 2, r.output
        assert "cache.tiers[2].eviction" in r.output and "Traceback" not in r.output


# -- both backends run a placement unchanged ---------------------------------------------------

TINY = ["--set", "workload.synthetic.n_sessions=3", "--set", "model=llama-3-8b",
        "--set", "cache.page_bytes=4KiB", "--set", "workload.synthetic.max_context_tokens=3000",
        "--set", "workload.synthetic.prefix_tokens=1000",
        "--set", "cache.tiers=[{level: gpu, quota: 512KiB}, {level: host, quota: 256KiB}, "
                 "{level: disk, quota: 4MiB}]", "--set", "output.plots=false", "--no-progress"]


@pytest.mark.parametrize("backend", ["sim", "hw"])
def test_both_backends_run_skip_host(tmp_path, backend):
    """The hw backend (CPU mode: numpy stands in for the GPU) and the sim run the plans a
    placement makes, GPU -> disk batches included, with the refcheck on."""
    from kvsim.cli import app

    moved = {}
    for name in ("cascade", "skip-host"):
        out = tmp_path / name
        extra = ["--backend", "hw", "--device", "cpu", "--time-scale", "50"] if backend == "hw" else []
        r = runner.invoke(app, ["run", "configs/default.yaml", "--out", str(out), *TINY, *extra,
                                "--set", f"cache.policy.placement={name}"])
        assert r.exit_code == 0, r.output
        s = json.loads((out / "summary.json").read_text())
        assert s["run"]["backend"] == backend and s["config"]["engine"]["refcheck"]
        assert s["metrics"]["requests_completed"] > 0
        moved[name] = s["core_counters"]["moved_pages"]
    assert moved["skip-host"][GPU][DISK] > moved["cascade"][GPU][DISK]
