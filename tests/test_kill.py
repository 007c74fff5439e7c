"""Killing a run at every phase (loading, replay, writing results) with SIGINT, SIGTERM and
SIGKILL, on the sim and the hw backend (CPU mode, with a disk tier): the user's files are
never touched, the results folder holds the earlier complete results (never a half-written
one), SIGINT/SIGTERM leave nothing behind, and what SIGKILL left is gone after the next
start that uses the same folders."""

from __future__ import annotations

import json
import os
import shutil
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvsim.run.results import MARKER

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--no-progress", "--set", "workload.synthetic.n_sessions=2", "--set", "model=llama-3-8b",
        "--set", "cache.page_bytes=4KiB", "--set",
        "cache.tiers=[{level: gpu, quota: 4MiB}, {level: host, quota: 2MiB}, {level: disk, quota: 8MiB}]"]
BACKEND = {"sim": [], "hw": ["--backend", "hw", "--device", "cpu", "--time-scale", "50"]}


def _kvsim(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvsim.cli", "run", "default", *args], env=env,
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)


def _wait_for(proc: subprocess.Popen, text: str, timeout: float = 60.0) -> str:
    seen = ""
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while text not in seen:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {text!r} from the run; stderr so far: {seen}")
        if sel.select(timeout=0.5):
            seen += proc.stderr.readline()
    return seen


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sim", "hw"])
@pytest.mark.parametrize("phase", ["load", "replay", "write"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_a_kill_at_any_phase_loses_nothing_and_leaves_nothing(tmp_path, backend, phase, sig):
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    tmp.mkdir()
    (work / "notes.txt").write_text("the user's")
    (work / "data").mkdir()
    (work / "data" / "x.bin").write_bytes(b"\0" * 1000)
    out = work / "res"  # an earlier, complete results folder
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"kvsim": "0", "kind": "run"}))
    (out / "summary.json").write_text('{"earlier": true}')
    before = _files(work)
    env = {**os.environ, "TMPDIR": str(tmp), "KVSIM_PAUSE_AT": phase}

    proc = _kvsim([*BACKEND[backend], *TINY, "--out", str(out)], env)
    _wait_for(proc, f"kvsim: paused at {phase}")
    proc.send_signal(sig)
    err = proc.communicate(timeout=60)[1]
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 128 + sig, err
        assert "interrupted" in err and "Traceback" not in err, err
        # a kill the process sees: nothing of it is left, at once
        assert _files(work) == before and list(tmp.iterdir()) == []
    after = _files(work)  # the user's files and the earlier results, intact
    assert {k: after.get(k) for k in before} == before

    # the next start in the same folders: it runs, and only its results and the user's files remain
    env.pop("KVSIM_PAUSE_AT")
    nxt = _kvsim([*BACKEND[backend], *TINY, "--out", str(out)], env)
    err = nxt.communicate(timeout=300)[1]
    assert nxt.returncode == 0, err
    assert sorted(p.name for p in work.iterdir()) == ["data", "notes.txt", "res"]
    assert (work / "notes.txt").read_text() == "the user's"
    assert (work / "data" / "x.bin").read_bytes() == b"\0" * 1000
    assert list(tmp.iterdir()) == []
    assert "metrics" in json.loads((out / "summary.json").read_text())


def _kvsim_cmd(cmd: str, args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvsim.cli", cmd, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("then", ["run-sim", "study"])
def test_what_a_killed_hw_run_left_goes_with_the_next_start_of_any_kind(tmp_path, then):
    """A hw run SIGKILLed in its replay leaves its disk-tier file in the temporary folder;
    the next kvsim start removes it whatever it is: a sim run (no disk file of its own), or
    a study."""
    from kvsim import scratch

    import tempfile

    # a short temporary folder: Dask's local cluster puts its sockets there, and a socket's
    # path has at most 107 bytes (pytest's own folders can be longer)
    tmp = Path(tempfile.mkdtemp(prefix="kk", dir="/tmp"))
    try:
        _killed_then(tmp, tmp_path, then, scratch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _killed_then(tmp, tmp_path, then, scratch) -> None:
    env = {**os.environ, "TMPDIR": str(tmp), "KVSIM_PAUSE_AT": "replay"}
    proc = _kvsim([*BACKEND["hw"], *TINY, "--out", str(tmp_path / "hw")], env)
    _wait_for(proc, "kvsim: paused at replay")
    left = [p for p in tmp.iterdir() if scratch.is_scratch(p)]
    assert left and all(p.stat().st_size >= 8 << 20 or p.is_dir() for p in left), left  # the disk tier
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert [p for p in tmp.iterdir() if scratch.is_scratch(p)] == left   # nothing sees a SIGKILL
    env.pop("KVSIM_PAUSE_AT")
    if then == "run-sim":
        r = _kvsim_cmd("run", ["default", *TINY, "--out", str(tmp_path / "sim")], env)
        assert r.returncode == 0, r.stderr
        assert list(tmp.iterdir()) == []
    else:
        study = tmp_path / "s.yaml"
        study.write_text("name: s\nbase: default\nset: {workload.synthetic.n_sessions: 2, "
                         "output.plots: false}\nseeds: [0]\n")
        r = _kvsim_cmd("study", [str(study), "--out", str(tmp_path / "study"), "--workers", "1",
                                 "--no-progress", "--no-plots"], env)
        assert r.returncode == 0, r.stderr
        assert [p for p in tmp.iterdir() if scratch.is_scratch(p)] == []   # (Dask's own may stay)


def test_a_study_worker_sweeps_its_configured_disk_folder(tmp_path):
    """A worker on another host has its own temporary folder and disk paths: run_point
    sweeps them before it replays (here: a dead owner's file in the disk tier's path)."""
    from kvsim import scratch
    from kvsim.config import load_config
    from kvsim.study.execute import run_point

    disk = tmp_path / "disk"
    disk.mkdir()
    dead = disk / f"disk.kvsim-{2**22 + 11}-1-{scratch._host()}-abcdefgh.bin"   # no such pid
    dead.write_bytes(b"\0" * 4096)
    mine = disk / "user.bin"
    mine.write_bytes(b"keep")
    cfg = load_config("default", ["workload.synthetic.n_sessions=1", "output.plots=false",
                                  f"cache.tiers[2].path={disk}"]).model_dump(mode="json")
    out = run_point(cfg)
    assert "error" not in out, out
    assert not dead.exists() and mine.read_bytes() == b"keep"


_KILLED_WHILE_RENDERING = """
import os, signal, sys
import kvsim.run
from kvsim.config import load_config
from kvsim.study.execute import run_point

def write_files(result, folder, plots=True):   # a worker killed as it renders the point
    (folder / "summary.json").write_text("{}")
    os.kill(os.getpid(), signal.SIGKILL)

kvsim.run.write_files = write_files
run_point(load_config("default", ["workload.synthetic.n_sessions=1", "output.plots=false"])
          .model_dump(mode="json"))
"""


def test_a_worker_killed_while_rendering_a_point_leaves_only_what_a_sweep_removes(tmp_path):
    """run_point renders the point's files in the temporary folder: a worker killed there
    (the study killed with SIGKILL takes its workers along) left a folder of its own name
    behind for good; now it is a scratch folder, and the next start's sweep removes it."""
    from kvsim import scratch

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", _KILLED_WHILE_RENDERING], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left and all(scratch.is_scratch(n) for n in left), left
    scratch.sweep(tmp_path)
    assert list(tmp_path.iterdir()) == []
