"""The hw backend never loses data, never leaves files behind and refuses what the machine
cannot give (issue 19), in CPU mode:

- the disk tier's file is a scratch file: gone after SIGINT, SIGTERM (under
  ``scratch.terminate_raises``), an exception or a normal end; after SIGKILL it stays
  until the next start sweeps its folder, which leaves a live run's file and the user's
  own files alone;
- a tier larger than the machine's memory or disk is refused, naming its config key,
  before anything is allocated;
- an EIO or ENOSPC at each disk I/O point (open, allocate, write, read) either fails the
  transfer, counted in ``failed_batches``, with the refcheck passing over every page the
  run served, or stops the run with an error that says what failed. A failure the backend
  did not see (a write or read that silently did nothing) is caught by the refcheck: so
  its passing proves no page was served from a failed copy.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import kvsim.backend
from kvsim.run.seam import settings_for
from kvsim import scratch
from kvsim.cli import app
from kvsim.config import load_config
from kvsim.core import TierManager
from kvsim.core.plan import Fill
from kvsim.core.spec import Level
from kvsim.engine.refcheck import RefcheckError
from kvsim.run import build_backend, prepare_run, replay
from kvsim_backends.hw import CapacityError, HwBackend, RealtimeRuntime
from kvsim_backends.hw import build as hw_build
from kvsim_backends.hw import resources
from kvsim_backends.hw.disk import DiskStore, DiskTierError

GIB = 1 << 30
BASE = ["workload.synthetic.n_sessions=2", "model=llama-3-8b", "cache.page_bytes=4KiB",
        "output.plots=false"]


def tiers(gpu="4MiB", host="2MiB", disk="8MiB", path=None) -> str:
    t = [f"{{level: gpu, quota: {gpu}}}"]
    if host:
        t.append(f"{{level: host, quota: {host}}}")
    if disk:
        t.append(f"{{level: disk, quota: {disk}" + (f", path: '{path}'" if path else "") + "}")
    return f"cache.tiers=[{', '.join(t)}]"


def scratch_files(d) -> list[str]:
    return sorted(p.name for p in Path(d).iterdir() if scratch.is_scratch(p))


# -- capacity: refused before anything is allocated ---------------------------------------

@pytest.fixture
def no_allocation(monkeypatch):
    """Fails the test if the hw backend (tiers, staging, the disk file) is constructed."""
    made = []

    def refuse(*a, **k):
        made.append((a, k))
        raise AssertionError("the hw backend was constructed after a refusal")

    monkeypatch.setattr(hw_build, "HwBackend", refuse)
    return made


def _build(sets, **kw):
    prep = prepare_run(load_config("default", sets))
    return build_backend(prep, TierManager(prep.spec), "hw", {"device": "cpu", **kw})[1:]


@pytest.mark.parametrize("key,size,label,page", [("cache.tiers[0].quota", "1TiB", "gpu tier", "4KiB"),
                                                 ("cache.tiers[1].quota", "1TiB", "host tier", "4KiB"),
                                                 ("cache.tiers[2].quota", "1000TiB", "disk tier", "4MiB")])
def test_a_tier_larger_than_the_machine_is_refused_before_anything_is_allocated(
        tmp_path, no_allocation, key, size, label, page):
    # (a 1000 TiB tier in pages of 4 MiB: within kvsim's page count a tier, beyond any disk)
    sets = [*BASE, f"cache.page_bytes={page}", tiers("8MiB", "4MiB", "8MiB", path=tmp_path),
            f"{key}={size}"]
    t0 = time.perf_counter()
    with pytest.raises(CapacityError) as e:
        _build(sets)
    assert time.perf_counter() - t0 < 10
    msg = str(e.value)
    assert key in msg and label in msg and ("host memory" in msg or "disk space" in msg), msg
    assert f"{float(size[:-3]):.1f} TiB" in msg, msg  # the size, as a person reads it
    assert isinstance(e.value, kvsim.backend.CapacityError)  # the CLI's "bad input": exit 2
    assert no_allocation == [] and list(tmp_path.iterdir()) == []


def test_the_same_config_with_tiers_that_fit_is_built(tmp_path):
    rt, be = _build([*BASE, tiers(path=tmp_path)])
    try:
        assert be.info["capacity"]["host_available_bytes"] > 0
        assert be.info["capacity"]["disk_free_bytes"] > 0
        assert len(scratch_files(tmp_path)) == 1
    finally:
        be.close()
    assert scratch_files(tmp_path) == []


def test_in_cpu_mode_the_tiers_in_host_memory_are_checked_together(tmp_path, monkeypatch):
    """Each of the GPU tier (host memory in CPU mode) and the host tier fits; together they
    do not: both keys are named."""
    monkeypatch.setattr(resources, "host_available", lambda: 3 * GIB)  # may use 2 GiB
    with pytest.raises(CapacityError) as e:
        _build([*BASE, tiers(gpu="1536MiB", host="1GiB", path=tmp_path)])
    msg = str(e.value)
    assert "cache.tiers[0].quota + cache.tiers[1].quota" in msg, msg
    assert "1.5 GiB (gpu tier, in host memory in CPU mode) + 1.0 GiB (host tier) = 2.5 GiB" in msg
    assert "2.0 GiB of host memory" in msg and "3.0 GiB available" in msg, msg
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CapacityError) as e:  # each too large alone: each named alone
        _build([*BASE, tiers(gpu="2560MiB", host="3GiB", path=tmp_path)])
    msg = str(e.value)
    assert "cache.tiers[0].quota: 2.5 GiB (gpu tier" in msg and "+" not in msg, msg
    assert "cache.tiers[1].quota: 3.0 GiB (host tier) exceeds" in msg, msg
    rt, be = _build([*BASE, tiers(gpu="1GiB", host="512MiB", path=tmp_path)])  # 1.5 GiB: fits
    be.close()


def test_on_a_gpu_the_gpu_tier_is_checked_against_free_device_memory(monkeypatch):
    class FakeCuda:
        @staticmethod
        def memGetInfo():
            return 10 * GIB, 80 * GIB

    monkeypatch.setattr(resources, "host_available", lambda: 4 * GIB)  # may use 3 GiB
    gpu = resources.Tier(Level.GPU, 16 * GIB, "cache.tiers[0].quota")
    host = resources.Tier(Level.HOST, 2 * GIB, "cache.tiers[1].quota")
    with pytest.raises(CapacityError, match=r"cache.tiers\[0\].quota: 16.0 GiB \(gpu tier\) exceeds "
                                            r"the 9.0 GiB of device memory.*10.0 GiB free"):
        resources.check_capacity([gpu, host], on_gpu=True, cuda=FakeCuda)
    # 8 GiB on the device, and only the host tier in host memory: both fit
    seen = resources.check_capacity([resources.Tier(Level.GPU, 8 * GIB, "k"), host],
                                    on_gpu=True, cuda=FakeCuda)
    assert seen == {"device_free_bytes": 10 * GIB, "host_available_bytes": 4 * GIB}


def test_a_disk_tier_on_a_ram_file_system_counts_as_host_memory(tmp_path, monkeypatch):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\ntmpfs {tmp_path} tmpfs rw 0 0\n"
                      f"tmpfs /elsewhere tmpfs rw 0 0\n")
    assert resources.filesystem_type(str(tmp_path / "x"), str(mounts)) == "tmpfs"
    assert resources.filesystem_type("/usr", str(mounts)) == "ext4"
    monkeypatch.setattr(resources, "filesystem_type", lambda p: "tmpfs")
    monkeypatch.setattr(resources, "host_available", lambda: 5 * GIB)  # may use 4 GiB
    monkeypatch.setattr(resources, "disk_free", lambda p: 100 * GIB)
    t = [resources.Tier(Level.HOST, 2 * GIB, "cache.tiers[1].quota"),
         resources.Tier(Level.DISK, 3 * GIB, "cache.tiers[2].quota")]
    with pytest.raises(CapacityError, match=r"cache.tiers\[1\].quota \+ cache.tiers\[2\].quota: "
                                            r".*\(disk tier, a file on tmpfs"):
        resources.check_capacity(t, on_gpu=True, disk_dir=str(tmp_path))


def test_a_disk_tier_folder_that_is_missing_or_not_writable_names_its_key(tmp_path, monkeypatch):
    monkeypatch.setattr(resources, "host_available", lambda: None)  # (host memory not judged here)
    t = [resources.Tier(Level.DISK, 1 * GIB, "cache.tiers[2].quota")]
    with pytest.raises(CapacityError) as e:
        resources.check_capacity(t, on_gpu=False, disk_dir=str(tmp_path / "none"))
    assert str(e.value) == (f"cache.tiers[2].path: {tmp_path / 'none'}: no such folder; expected the "
                            "folder the disk tier's file is made in; nothing was allocated")
    monkeypatch.setattr(resources.os, "access", lambda p, mode: False)
    with pytest.raises(CapacityError, match=r"cache.tiers\[2\].path: .*: this user cannot make a file "
                                            r"there; expected a writable folder; nothing was allocated$"):
        resources.check_capacity(t, on_gpu=False, disk_dir=str(tmp_path))


def test_host_available_reads_memavailable(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24683652 kB\nMemFree:  1 kB\nMemAvailable:   23937904 kB\n")
    assert resources.host_available(str(f)) == 23937904 * 1024
    f.write_text("MemTotal: 1 kB\n")
    assert resources.host_available(str(f)) is None  # not told: not checked


def test_the_cli_refuses_an_oversized_quota_at_once_with_exit_2_naming_the_key():
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["run", "default", "--backend", "hw", "--device", "cpu",
                                 "--no-progress", *sum((["--set", x] for x in BASE), []),
                                 "--set", tiers(), "--set", "cache.tiers[0].quota=1TiB"])
    assert time.perf_counter() - t0 < 20
    assert r.exit_code == 2 and "cache.tiers[0].quota: 1.0 TiB (gpu tier" in r.output, r.output
    assert "Traceback" not in r.output


# -- leftovers: the disk tier's file on every exit ----------------------------------------

RUN = textwrap.dedent("""
    import sys
    from kvsim import scratch
    from kvsim.config import load_config
    from kvsim.run import prepare_run, replay
    prep = prepare_run(load_config("default", sys.argv[1:]))
    with scratch.terminate_raises():
        replay(prep, "hw", backend_options={"device": "cpu", "time_scale": 1.0})
    print("finished", flush=True)
""")


def _start_replay(tmp_path, sets, env=None) -> subprocess.Popen:
    script = tmp_path / "run_hw.py"
    script.write_text(RUN)
    return subprocess.Popen([sys.executable, str(script), *sets], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_tier_file(proc: subprocess.Popen, d: Path, timeout: float = 60.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        mine = [p for p in d.glob(f"kvsim-disk.kvsim-{proc.pid}-*.bin")]
        if mine:
            time.sleep(0.5)  # into the replay
            assert proc.poll() is None, proc.communicate()
            return mine[0]
        if proc.poll() is not None:
            raise AssertionError(f"the replay ended first: {proc.communicate()}")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("no disk tier file appeared")


def _user_files(d: Path) -> dict[str, bytes]:
    """Files a user keeps in the disk tier's folder, one named as older kvsims named the tier."""
    files = {"notes.txt": b"mine", "kvsim-disk-123-0123456789ab.bin": b"old, not a scratch name",
             "model.kvsim-1.bin": b"looks a little like one"}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return files


def _assert_user_files(d: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (d / name).read_bytes() == data, name


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_replay_stopped_by_sigint_or_sigterm_removes_its_disk_tier_file(tmp_path, sig):
    d = tmp_path / "disk"
    d.mkdir()
    mine = _user_files(d)
    proc = _start_replay(tmp_path, [*BASE, tiers(path=d)])
    f = _wait_for_tier_file(proc, d)
    assert f.stat().st_size == 8 << 20  # preallocated
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "finished" not in out, (out, err)
    assert not f.exists() and scratch_files(d) == [], err
    _assert_user_files(d, mine)


@pytest.mark.parametrize("where", ["configured path", "temporary directory"])
def test_a_sigkilled_replays_file_is_swept_by_the_next_start_and_nothing_else(tmp_path, monkeypatch, where):
    d = tmp_path / "disk"
    d.mkdir()
    mine = _user_files(d)
    if where == "configured path":
        sets, env = [*BASE, tiers(path=d)], None
    else:
        sets, env = [*BASE, tiers()], {**os.environ, "TMPDIR": str(d)}
        monkeypatch.setattr(tempfile, "tempdir", str(d))  # this process's next start
    proc = _start_replay(tmp_path, sets, env)
    dead = _wait_for_tier_file(proc, d)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert dead.exists()  # SIGKILL leaves it: nothing runs in the process any more
    live, fd = scratch.make_file(d, "kvsim-disk", ".bin")  # a live run's (this process's)
    os.close(fd)
    rt, be = _build(sets)  # the next start
    try:
        assert not dead.exists()
        assert live.exists() and Path(be.disk.path).exists()
        assert sorted(scratch_files(d)) == sorted([live.name, Path(be.disk.path).name])
    finally:
        be.close()
    assert scratch_files(d) == [live.name]
    _assert_user_files(d, mine)
    scratch.remove(live)


def test_a_replay_that_raises_or_ends_removes_its_disk_tier_file(tmp_path):
    sets = [*BASE, tiers(path=tmp_path)]

    def boom(t, n):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        replay(prepare_run(load_config("default", sets)), "hw", progress=boom,
               backend_options={"device": "cpu", "time_scale": 50.0})
    assert scratch_files(tmp_path) == []
    res = replay(prepare_run(load_config("default", sets)), "hw",
                 backend_options={"device": "cpu", "time_scale": 50.0})
    assert res.metrics["bytes"]["disk_write"] > 0 and scratch_files(tmp_path) == []


def test_a_backend_that_fails_after_creating_its_disk_file_removes_it(tmp_path, monkeypatch):
    from kvsim_backends.hw import backend as hw_backend

    seen = []

    def no_staging(*a, **k):  # (allocated after the disk tier's file)
        seen.append(scratch_files(tmp_path))
        raise MemoryError("staging buffers could not be allocated")

    monkeypatch.setattr(hw_backend, "StagingPool", no_staging)
    with pytest.raises(MemoryError, match="staging"):
        _build([*BASE, tiers(path=tmp_path)])
    assert len(seen) == 1 and len(seen[0]) == 1  # the file was there when it failed
    assert list(tmp_path.iterdir()) == []


# -- injected I/O faults at each disk I/O point ---------------------------------------------

# GPU and disk tiers only: evictions go to the disk and resumed pages come back from it
FAULTS = ["workload.synthetic.n_sessions=4", "model=llama-3-8b", "cache.page_bytes=4KiB",
          "engine.hold_sessions=false", "output.plots=false"]


def _fault_run(tmp_path, hook=None, extra=()):
    sets = [*FAULTS, tiers(gpu="3MiB", host=None, disk="32MiB", path=tmp_path), *extra]
    opts = {"device": "cpu", "time_scale": 100.0}
    if hook is not None:
        opts["io_hook"] = hook
    return replay(prepare_run(load_config("default", sets)), "hw", backend_options=opts)


class Every:
    """An io_hook that fails every ``n``-th call of ``op`` with ``err``."""

    def __init__(self, op: str, err: int, n: int = 5):
        self.op, self.err, self.n = op, err, n
        self.calls = self.raised = 0

    def __call__(self, op, off, nbytes):
        if op != self.op:
            return
        self.calls += 1
        if self.calls % self.n == 0:
            self.raised += 1
            raise OSError(self.err, f"injected {errno.errorcode[self.err]}")


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
@pytest.mark.parametrize("op", ["write", "read"])
def test_a_failing_write_or_read_is_counted_and_its_copy_never_served(tmp_path, op, err):
    """The run completes; the failed batches are counted in the metrics (``failed_batches``,
    the core's counter); the refcheck, which reads back every page a batch committed (disk
    writes too) and raises on any page that is not what the core expects, passed: no page
    was served from a failed or incomplete copy. (For reads the refcheck does not read the
    disk back, so that every injected read fault falls on a transfer.)"""
    hook = Every(op, err, 100)  # rare enough that many batches to and from the disk succeed
    extra = ["engine.refcheck_disk_writes=false"] if op == "read" else []
    m = _fault_run(tmp_path, hook, extra).metrics
    assert hook.raised > 0 and m["failed_batches"] > 0, (hook.raised, m["failed_batches"])
    assert m["requests_completed"] > 0
    assert m["bytes"]["disk_write"] > 0 and m["bytes"]["disk_read"] > 0  # (verified pages)
    assert scratch_files(tmp_path) == []


@pytest.mark.parametrize("op", ["write", "read"])
def test_a_failure_the_backend_does_not_see_is_caught_by_the_refcheck(tmp_path, monkeypatch, op):
    """The control for the test above: the same faults, but silent (a pwrite that writes
    nothing, a pread that returns zeros, both reporting success). The refcheck stops the run,
    so it would have caught a page served from a failed copy above."""
    n = [0]
    real_w, real_r = DiskStore._pwrite, DiskStore._pread

    def pwrite(self, buf, off, *addr):
        n[0] += 1
        if n[0] % 5:
            real_w(self, buf, off, *addr)

    def pread(self, buf, off, *addr):
        n[0] += 1
        if n[0] % 5:
            real_r(self, buf, off, *addr)
        else:
            buf[:] = 0

    monkeypatch.setattr(DiskStore, "_pwrite" if op == "write" else "_pread", pwrite if op == "write" else pread)
    extra = ["engine.refcheck_disk_writes=false"] if op == "read" else []
    with pytest.raises(RefcheckError, match="refcheck failed for"):
        _fault_run(tmp_path, None, extra)
    assert scratch_files(tmp_path) == []


def test_a_failing_read_of_the_refcheck_stops_the_run_saying_so(tmp_path):
    hook = Every("read", errno.EIO, 3)
    with pytest.raises(OSError, match="refcheck could not read back .* DISK page.*injected EIO") as e:
        _fault_run(tmp_path, hook)
    assert not isinstance(e.value, RefcheckError)
    assert scratch_files(tmp_path) == []


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
@pytest.mark.parametrize("op", ["open", "allocate"])
def test_a_disk_tier_that_cannot_be_created_stops_the_run_before_it_starts(tmp_path, op, err):
    hook = Every(op, err, 1)
    with pytest.raises(DiskTierError, match=f"disk_dir: cannot .*{tmp_path}.*injected "
                                            f"{errno.errorcode[err]}") as e:
        _fault_run(tmp_path, hook)
    assert e.value.errno == err
    assert list(tmp_path.iterdir()) == []


def test_a_failing_o_direct_open_falls_back_to_buffered_io(tmp_path):
    opens = []

    def hook(op, off, n):
        if op == "open":
            opens.append(op)
            if len(opens) == 2:
                raise OSError(errno.EIO, "injected EIO")

    be = HwBackend(RealtimeRuntime(), settings_for(4096, {Level.GPU: 8, Level.DISK: 8}, disk_dir=tmp_path, device="cpu", io_hook=hook))
    try:
        assert len(opens) == 2 and not be.disk.uses_direct
        tags = np.arange(1, 5, dtype=np.uint64)
        be.fill(Fill(Level.DISK, np.arange(4), tags))
        assert (be.read_tags(Level.DISK, np.arange(4)) == tags).all()
    finally:
        be.close()
    assert list(tmp_path.iterdir()) == []


# -- the command line, stopped mid-replay ---------------------------------------------------

CLI = "import sys; from kvsim.cli import app; sys.argv[0] = 'kvsim'; app()"


def _cli_hw(d: Path, out: Path, pause: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "KVSIM_PAUSE_AT"}
    if pause:
        env["KVSIM_PAUSE_AT"] = pause
    args = ["run", "default", "--backend", "hw", "--device", "cpu", "--time-scale", "50",
            "--no-progress", "--out", str(out), *sum((["--set", x] for x in BASE), []),
            "--set", tiers(path=d)]
    return subprocess.Popen([sys.executable, "-c", CLI, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_kvsim_run_on_hw_killed_mid_replay_leaves_nothing_after_the_next_start(tmp_path, sig):
    """``kvsim run --backend hw`` paused at its replay's first step and signalled: after
    SIGINT or SIGTERM its disk tier file is gone at once; after SIGKILL the next run's start
    removes it. The user's files in the folder stay, and no results folder is left."""
    d = tmp_path / "disk"
    d.mkdir()
    mine = _user_files(d)
    proc = _cli_hw(d, tmp_path / "res", "replay")
    for line in proc.stderr:  # (it says so before it waits)
        if "paused at replay" in line:
            break
    else:
        raise AssertionError(f"the run ended before its replay: {proc.communicate()}")
    f, = d.glob(f"kvsim-disk.kvsim-{proc.pid}-*.bin")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (128 + sig, -sig), (proc.returncode, err)
    assert not (tmp_path / "res").exists()
    if sig == signal.SIGKILL:
        assert f.exists()
        nxt = _cli_hw(d, tmp_path / "res2", None)
        out, err = nxt.communicate(timeout=300)
        assert nxt.returncode == 0, err
        assert (tmp_path / "res2" / "summary.json").exists()
    assert not f.exists() and scratch_files(d) == [], err
    _assert_user_files(d, mine)
    assert sorted(p.name for p in d.iterdir()) == sorted(mine)
