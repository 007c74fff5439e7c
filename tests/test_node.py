"""A node of ranks (``node:``): sessions routed by a stable hash, one clock for the node,
the disk drive and the driver's lock shared, results reported for the node and per rank.

Scenarios, each on the default synthetic workload made small:
- routing: every session on exactly one rank, the same rank on every run, spread;
- independence: with nothing shared (no disk tier, a profile without a driver), each
  rank of a 3-rank node replays exactly as a one-rank run of its own sessions would;
- the shared drive: two ranks writing to one disk take longer than one alone;
- the driver's lock: ranks filling their host tiers with the driver's allocation
  (``cumem``) stall their executors longer than with registration (``register``);
- bad node settings: exit code 2, naming the key.
"""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from gpuskip import have_gpu
from kvsim.cli import app
from kvsim.config import ConfigFileError, load_config
from kvsim.run import prepare_run, replay
from kvsim.run.ranks import rank_of, split

SMALL = ["workload.synthetic.n_sessions=12", "model=llama-3-8b", "cache.page_bytes=2MiB",
         "cache.tiers=[{level: gpu, quota: 2GiB}, {level: host, quota: 4GiB}]"]


def test_sessions_go_to_one_rank_each_stably_and_spread():
    prep = prepare_run(load_config("default", [*SMALL, "workload.synthetic.n_sessions=64"]))
    parts = split(prep.workload, prep.starts, 4)
    sids = [[s.sid for s in w.sessions] for w, _ in parts]
    assert sorted(x for p in sids for x in p) == sorted(s.sid for s in prep.workload.sessions)
    assert all(len(p) >= 8 for p in sids), [len(p) for p in sids]  # 64 over 4: none starved
    # the start times travel with their sessions
    starts = dict(zip((s.sid for s in prep.workload.sessions), prep.starts))
    for (w, st), p in zip(parts, sids):
        assert st == [starts[x] for x in p]
    # a stable hash: the same rank for the same id whatever the process (not Python's hash)
    assert [rank_of(f"syn-{i:04d}", 4) for i in range(6)] == [rank_of(f"syn-{i:04d}", 4) for i in range(6)]
    assert rank_of("x", 1) == 0


def _rows(result):
    return [(r.session, r.turn, r.arrival_ns, r.first_token_ns, r.done_ns, r.hit_gpu, r.hit_host)
            for r in result.rows]


def test_ranks_that_share_nothing_replay_as_their_own_runs(tmp_path):
    """No disk tier and a profile without a driver: the ranks share nothing but the clock,
    so each one's rows equal those of a one-rank replay of its sessions alone."""
    sets = [*SMALL, f"hardware={_no_driver_profile(tmp_path)}"]
    node = replay(prepare_run(load_config("default", [*sets, "node.ranks=3"])))
    assert node.run_info["ranks"] == 3 and len(node.metrics["ranks"]) == 3
    base = prepare_run(load_config("default", sets))
    for r, (w, st) in enumerate(split(base.workload, base.starts, 3)):
        alone = prepare_run(load_config("default", sets), workload=w)
        alone.starts = st  # (a one-rank run would draw its own start times: pin the node's)
        mine = [row for row in node.rows if row.rank == r]
        assert _rows(replay(alone)) == [(x.session, x.turn, x.arrival_ns, x.first_token_ns,
                                         x.done_ns, x.hit_gpu, x.hit_host) for x in mine], r
    total = node.metrics
    assert total["requests_completed"] == sum(x["requests_completed"] for x in total["ranks"])
    assert total["hit_tokens"]["total"] == sum(x["hit_tokens"]["total"] for x in total["ranks"])
    assert total["hit_ratio"] == pytest.approx(total["hit_tokens"]["total"] / total["input_tokens"])


def _no_driver_profile(tmp_path):
    import yaml

    from kvsim.config.hardware import load_profile

    d = load_profile("h200-pcie").model_dump(mode="json")
    d["driver"] = None
    d["name"] = "no-driver"
    p = tmp_path / "no-driver.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_ranks_share_the_disk_drive():
    """Two ranks that each write a disk's worth: the node's one drive takes longer to take
    both than one rank's alone (its disk busy time is the node's, not each rank's)."""
    sets = [*SMALL, "workload.synthetic.n_sessions=16",
            "cache.tiers=[{level: gpu, quota: 1GiB}, {level: host, quota: 1GiB}, "
            "{level: disk, quota: 32GiB, io_workers: 4}]"]
    one = replay(prepare_run(load_config("default", sets)))
    two = replay(prepare_run(load_config("default", [*sets, "node.ranks=2"])))
    assert two.metrics["bytes"]["disk_write"] > 0
    per_rank = [r["bytes"]["disk_write"] for r in two.metrics["ranks"]]
    assert sum(per_rank) == two.metrics["bytes"]["disk_write"] and min(per_rank) > 0
    # each rank's disk busy time counts the node's drive: both ranks see the same drive
    busy = [r for r in two.timeline if "disk_write_busy_s" in r]
    last = {row["rank"]: row["disk_write_busy_s"] for row in busy}
    assert last[0] == pytest.approx(last[1], rel=0.05)  # one drive, sampled by both ranks
    assert one.metrics["bytes"]["disk_write"] > 0


def test_the_driver_allocation_stalls_the_executors_more_than_registration():
    """Seed 001's shape: four ranks fill 8 GiB host tiers progressively while serving; with
    the driver's allocation (cumem) the driver's lock is held most of each unit, so the
    ranks' executors wait for it longer than with registration, and their first tokens
    come later."""
    out = {}
    for backing in ("register", "cumem"):
        sets = [*SMALL, "node.ranks=4", "cache.tiers[1].quota=8GiB",
                f"cache.tiers[1].fill={{mode: progressive, backing: {backing}}}"]
        out[backing] = replay(prepare_run(load_config("default", sets))).metrics
    reg, cum = out["register"], out["cumem"]
    assert cum["driver"]["executor_wait_s"] > 3 * reg["driver"]["executor_wait_s"] > 0
    assert cum["host_fill"]["ttft_first_mean_s"] > reg["host_fill"]["ttft_first_mean_s"]
    assert cum["host_fill"]["done_s"] > 0 and reg["host_fill"]["done_s"] > 0


def test_one_rank_has_no_rank_column_and_several_have_one(tmp_path):
    r = CliRunner()
    for ranks, has in ((1, False), (2, True)):
        out = tmp_path / f"r{ranks}"
        res = r.invoke(app, ["run", "default", "--no-progress", "--out", str(out),
                             *[x for s in [*SMALL, f"node.ranks={ranks}"] for x in ("--set", s)]])
        assert res.exit_code == 0, res.output
        head = next(csv.reader(open(out / "requests.csv")))
        assert (head[0] == "rank") == has
        summary = json.loads((out / "summary.json").read_text())
        assert ("ranks" in summary["metrics"]) == has


@pytest.mark.parametrize("sets, key", [
    (["node.ranks=0"], "node.ranks"),
    (["node.ranks=2", "node.gpus=1"], "node.ranks"),
    (["node.ranks=2", "cache.tiers[0].quota=200GiB"], r"cache\.tiers\[0\]\.quota"),
    (["node.ranks=2", "cache.tiers[1].quota=100MiB",
      "cache.tiers[1].fill={mode: progressive}"], r"cache\.tiers\[1\]\.quota"),
    (["node.host=pooled"], "node.host"),
    (["router.policy=random"], "router.policy"),
])
def test_bad_node_settings_are_refused_naming_the_key(sets, key):
    with pytest.raises(ConfigFileError, match=key):
        prepare_run(load_config("default", [*SMALL, *sets]))
    res = CliRunner().invoke(app, ["run", "default", "--no-progress",
                                   *[x for s in [*SMALL, *sets] for x in ("--set", s)]])
    assert res.exit_code == 2 and "Traceback" not in res.output


HW = ["model=llama-3-8b", "cache.page_bytes=256KiB", "workload.synthetic.n_sessions=6",
      "workload.max_turns=4", "node.ranks=2",
      "cache.tiers=[{level: gpu, quota: 128MiB}, {level: host, quota: 64MiB}, "
      "{level: disk, quota: 256MiB, io_workers: 4}]"]


def test_hw_ranks_share_one_set_of_disk_threads_each_its_own_file(tmp_path):
    """The hw backend's ranks on one runtime: each has its own disk file (its partition)
    and they all queue on the node's one set of I/O threads, which the last to close
    shuts down."""
    from kvsim.core.spec import Level
    from kvsim.run.seam import settings_for
    from kvsim_backends.hw import HwBackend, RealtimeRuntime
    import dataclasses

    rt = RealtimeRuntime()
    base = settings_for(1 << 16, {Level.GPU: 4, Level.DISK: 8}, device="cpu",
                        disk_dir=str(tmp_path), io_workers=2)
    bes = [HwBackend(rt, dataclasses.replace(base, rank=r, ranks=2)) for r in range(2)]
    try:
        assert bes[0].disk.pool is bes[1].disk.pool
        assert bes[0].disk.path != bes[1].disk.path
        pool = bes[0].disk.pool
        bes[0].close()
        assert pool.queues is not None and not pool._closed  # rank 1 still uses it
    finally:
        for be in bes:
            be.close()
    assert pool._closed


def test_hw_node_in_cpu_mode_replays_with_the_refcheck_on(tmp_path):
    """Two ranks on the hw backend (numpy standing in for device memory), sharing the
    disk's I/O threads, the refcheck on: every page each rank restores or moves carries
    the bytes it wrote; the node goes to disk; the sim's node serves the same turns."""
    hw = replay(prepare_run(load_config("default", HW)), "hw",
                backend_options={"device": "cpu", "time_scale": 200.0, "disk_dir": str(tmp_path)})
    sim = replay(prepare_run(load_config("default", HW)))
    for res in (hw, sim):
        assert res.metrics["requests_completed"] == sim.metrics["requests_completed"] > 0
        assert res.metrics["bytes"]["disk_write"] > 0 and res.metrics["bytes"]["disk_read"] > 0
    assert sorted((r.rank, r.session, r.turn) for r in hw.rows) == \
        sorted((r.rank, r.session, r.turn) for r in sim.rows)
    assert hw.metrics["requests_failed"] == sim.metrics["requests_failed"]


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_hw_node_of_two_ranks_on_one_gpu(tmp_path):
    """Two ranks sharing the one GPU (each its own device memory share and streams), the
    disk's I/O threads shared, the refcheck on (a check kernel on the GPU): the same turns
    served as the sim's node, with no failed transfer."""
    hw = replay(prepare_run(load_config("default", HW)), "hw",
                backend_options={"device": "gpu", "time_scale": 20.0, "disk_dir": str(tmp_path)})
    sim = replay(prepare_run(load_config("default", HW)))
    assert hw.run_info["device"] == "gpu"
    assert hw.run_info["standin"]["chain_s"]  # (its calibration, kept in summary.json)
    assert sorted((r.rank, r.session, r.turn) for r in hw.rows) == \
        sorted((r.rank, r.session, r.turn) for r in sim.rows)
    assert hw.metrics["failed_batches"] == 0 and hw.metrics["bytes"]["disk_read"] > 0
