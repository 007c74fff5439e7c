"""The copy path, the SM kernel's CTAs and the disk's queue depth are one setting each,
read by both backends: ``engine.copy_path`` (per direction) and ``engine.sm_ctas`` in the
run config, ``nvme.queue_depth`` / ``nvme.piece`` in the hardware profile.

Scenario: a tiny default run whose 160 KiB pages go to the copy engine on their own; the
config forces the SM kernel host -> GPU; both backends then run that path (the sim's and
the hw backend's stats, the hw backend's timing log) and size its CTAs alike; bad values
are refused naming the key.
"""

import threading

import pytest
from typer.testing import CliRunner

from kvsim.run.seam import settings_for
from kvsim.cli import app
from kvsim.config import ConfigFileError, load_config
from kvsim.core import TierManager
from kvsim.core.spec import Level
from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.run import build_backend, prepare_run, replay

# 160 KiB pages (the copy engine's on h200-pcie: above 2.5 us x 55.5 GB/s), a GPU tier
# small enough that the replay offloads
TINY = ["workload.synthetic.n_sessions=2", "model=llama-3-8b", "cache.page_bytes=160KiB",
        "cache.tiers=[{level: gpu, quota: 160MiB}, {level: host, quota: 80MiB}, {level: disk, quota: 320MiB}]"]


def backends(overrides, tmp_path):
    """(sim backend, hw backend in CPU mode) built from the default config with ``overrides``."""
    prep = prepare_run(load_config("default", [*TINY, *overrides]))
    _, _, sim = build_backend(prep, TierManager(prep.spec), "sim")
    _, _, hw = build_backend(prep, TierManager(prep.spec), "hw", {"device": "cpu", "disk_dir": str(tmp_path)})
    return prep, sim, hw


def test_by_default_both_backends_choose_alike(tmp_path):
    prep, sim, hw = backends([], tmp_path)
    try:
        assert sim.paths == hw.copy_paths == {"h2d": sim.paths["h2d"], "d2h": sim.paths["d2h"]}
        assert sim.paths["h2d"].value == "copy_engine"
        assert sim.ctas == hw.ctas == {"h2d": 24, "d2h": 26}
    finally:
        hw.close()


def test_forcing_the_copy_path_in_the_config_changes_both_backends(tmp_path):
    prep, sim, hw = backends(["engine.copy_path.h2d=sm_kernel", "engine.sm_ctas=6"], tmp_path)
    try:
        assert {d: p.value for d, p in sim.paths.items()} == {"h2d": "sm_kernel", "d2h": "copy_engine"}
        assert hw.copy_paths == sim.paths
        assert sim.ctas == hw.ctas == {"h2d": 6, "d2h": 6}
    finally:
        hw.close()


def test_a_forced_path_is_the_one_a_replay_runs_on_each_backend():
    cfg = load_config("default", [*TINY, "engine.copy_path=sm_kernel"])  # one name: both ways
    assert (cfg.engine.copy_path.h2d, cfg.engine.copy_path.d2h) == ("sm_kernel", "sm_kernel")
    prep = prepare_run(cfg)
    sim_log: list = []
    hw_log: list = []
    sim = replay(prep, "sim", backend_options={"timing_log": sim_log})
    hw = replay(prep, "hw", backend_options={"device": "cpu", "time_scale": 50.0, "timing_log": hw_log})
    for log in (sim_log, hw_log):
        gpu_host = [r["path"] for r in log if {r["src"], r["dst"]} == {"gpu", "host"}]
        assert gpu_host and set(gpu_host) == {"sm_kernel"}
    assert sim.metrics["requests_completed"] == hw.metrics["requests_completed"] > 0
    # left to the rule (auto), a batch alone takes the profile's one-direction path, the
    # copy engine here; one beside a batch the other way, or beside compute, its cost's
    default_log: list = []
    replay(prepare_run(load_config("default", TINY)), "sim", backend_options={"timing_log": default_log})
    assert "copy_engine" in {r["path"] for r in default_log if {r["src"], r["dst"]} == {"gpu", "host"}}


@pytest.mark.parametrize("override, key", [
    ("engine.copy_path.h2d=dma", "engine.copy_path.h2d"),
    ("engine.copy_path=fast", "engine.copy_path.h2d"),
    ("engine.copy_path.sideways=auto", "engine.copy_path.sideways"),
    ("engine.sm_ctas=0", "engine.sm_ctas"),
    ("engine.sm_ctas=many", "engine.sm_ctas"),
    ("engine.sm_ctas=true", "engine.sm_ctas"),
])
def test_bad_copy_settings_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigFileError, match=key.replace(".", r"\.")):
        load_config("default", [override])


def test_more_ctas_than_the_profile_has_slots_is_refused_naming_the_key():
    with pytest.raises(ConfigFileError, match=r"engine\.sm_ctas: got 200.*132 copy CTA slots"):
        prepare_run(load_config("default", [*TINY, "engine.sm_ctas=200"]))
    r = CliRunner().invoke(app, ["run", "default", "--set", "engine.sm_ctas=200", "--no-progress"])
    assert r.exit_code == 2 and "engine.sm_ctas" in r.output and "Traceback" not in r.output


def profile_with(**nvme) -> HardwareProfile:
    d = load_profile("h200-pcie").model_dump()
    d["nvme"].update(nvme)
    return HardwareProfile.model_validate(d)


def test_the_hw_backends_io_threads_are_the_profiles_queue_depth(tmp_path):
    from kvsim_backends.hw import HwBackend, RealtimeRuntime

    def disk_threads():
        return sum(t.name.startswith("kvsim-disk") for t in threading.enumerate())

    before = disk_threads()
    be = HwBackend(RealtimeRuntime(), settings_for(1 << 16, {Level.GPU: 4, Level.DISK: 4}, disk_dir=tmp_path, device="cpu", profile=profile_with(queue_depth=3, piece=1 << 15)))
    try:
        assert disk_threads() - before == 3 and be.disk.piece_bytes == 1 << 15
    finally:
        be.close()


def test_the_coherent_kernel_opt_in_reaches_both_backends_on_c2c_only(tmp_path):
    """``engine.kernel_on_coherent_link``: the SM kernel on the gh200-c2c profile (both
    backends), nothing changes on h200-pcie; 5 MiB pages are the copy engine's otherwise."""
    big = ["cache.page_bytes=5MiB",
           "cache.tiers=[{level: gpu, quota: 160MiB}, {level: host, quota: 80MiB}, {level: disk, quota: 320MiB}]"]
    for hardware, opt_in, want in (("gh200-c2c", "false", "copy_engine"), ("gh200-c2c", "true", "sm_kernel"),
                                   ("h200-pcie", "true", "copy_engine")):
        _, sim, hw = backends([*big, f"hardware={hardware}", f"engine.kernel_on_coherent_link={opt_in}"],
                              tmp_path)
        try:
            assert {d: p.value for d, p in sim.paths.items()} == {"h2d": want, "d2h": want}, hardware
            assert sim.paths == hw.copy_paths
        finally:
            hw.close()


def test_a_registration_unit_that_splits_pages_forces_the_sim_kernel():
    from kvsim_backends.sim import SimBackend, SimRuntime
    MiB = 1 << 20
    slots = {Level.GPU: 8, Level.HOST: 300}  # 300 pages of 5 MiB: 1500 MiB of host
    paths = lambda **kw: {d: p.value for d, p in SimBackend(SimRuntime(), settings_for(5 * MiB, slots, "h200-pcie", **kw)).paths.items()}
    assert paths() == {"h2d": "copy_engine", "d2h": "copy_engine"}
    # 512 MiB units: pages 102 and 204 straddle -> the kernel, both directions
    assert paths(registration_unit=512 * MiB) == {"h2d": "sm_kernel", "d2h": "sm_kernel"}
    # 510 MiB units hold 102 whole pages each: none straddles
    assert paths(registration_unit=510 * MiB) == {"h2d": "copy_engine", "d2h": "copy_engine"}
    with pytest.raises(ValueError, match="chunked"):
        SimBackend(SimRuntime(), settings_for(5 * MiB, slots, "h200-pcie", registration_unit=512 * MiB, copy_path="copy_engine"))


def test_the_host_fills_units_hold_whole_pages_so_the_copy_engine_stays():
    """The progressive fill registers 512 MiB units of whole slots: 5 MiB pages, 102 a unit,
    none straddles, so its registration forces nothing (the rule's own check, not a flag)."""
    from kvsim.core.datapath.fill import layout_for, registration_unit
    from kvsim_backends.sim import SimBackend, SimRuntime
    MiB = 1 << 20
    slots = {Level.GPU: 8, Level.HOST: 300}
    fill = {"mode": "progressive", "backing": "register", "unit": 512 * MiB}
    assert registration_unit("register", layout_for("register", 5 * MiB, 300, 512 * MiB)) == 510 * MiB
    assert registration_unit("pinned", layout_for("pinned", 5 * MiB, 300, 512 * MiB)) is None
    assert registration_unit("register", None) is None  # no fill: one registration
    be = SimBackend(SimRuntime(), settings_for(5 * MiB, slots, "h200-pcie", host_fill=fill))
    assert {d: p.value for d, p in be.paths.items()} == {"h2d": "copy_engine", "d2h": "copy_engine"}
