"""Scratch paths: created owned, swept only when their owner is gone, never anyone else's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvsim import scratch


def _orphan(parent, kind: str) -> str:
    """A scratch path made by a process that is then SIGKILLed; returns its name."""
    code = textwrap.dedent(f"""
        import os, sys
        from kvsim import scratch
        if {kind!r} == "dir":
            p = scratch.make_dir({str(parent)!r}, "stage")
            (p / "part.bin").write_bytes(b"x" * 4096)
        else:
            p, fd = scratch.make_file({str(parent)!r}, "kvsim-disk", ".bin")
            os.write(fd, b"y" * 4096)
        print(p.name, flush=True)
        os.kill(os.getpid(), 9)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL
    return out.stdout.strip()


def test_sweep_removes_what_a_killed_run_left_and_nothing_else(tmp_path):
    dead_dir = _orphan(tmp_path, "dir")
    dead_file = _orphan(tmp_path, "file")
    live = scratch.make_dir(tmp_path, "mine")          # this process: alive
    user = tmp_path / "notes.kvsim-1-1-00000000-abcdefgh"  # another host's name: kept
    user.mkdir()
    (tmp_path / "results").mkdir()                      # not a scratch name: kept
    (tmp_path / ".results.xyz").write_text("user data")
    assert {p.name for p in scratch.sweep(tmp_path)} == {dead_dir, dead_file}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, user.name, "results", ".results.xyz"])


def test_a_reused_pid_with_another_start_time_is_not_the_owner(tmp_path):
    pid = os.getpid()
    start = scratch.process_start(pid)
    if not start:
        pytest.skip("no process start times on this platform")
    fake = tmp_path / f"x.kvsim-{pid}-{start + 1}-{scratch._host()}-abcdefgh"
    fake.mkdir()
    assert scratch.sweep(tmp_path) == [fake]
    same = tmp_path / f"x.kvsim-{pid}-{start}-{scratch._host()}-abcdefgh"
    same.mkdir()
    assert scratch.sweep(tmp_path) == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")
def test_a_killed_owner_not_yet_reaped_is_gone(tmp_path):
    """A run killed with SIGKILL stays a zombie until its parent reaps it (a harness that
    has not waited yet; `timeout -s KILL`, killed with it, leaves it to init): its /proc
    entry, start time included, is still there. The next start's sweep took it for a live
    owner and kept its staging folder; it can never remove it itself."""
    code = (f"from kvsim import scratch; scratch.make_dir({str(tmp_path)!r}, 'z'); "
            "print('made', flush=True); import time; time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "made"
        proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        left = sorted(tmp_path.iterdir())
        assert len(left) == 1 and scratch.sweep(tmp_path) == left
        assert list(tmp_path.iterdir()) == []
    finally:
        proc.kill()
        proc.wait()


def test_remove_refuses_a_path_it_did_not_name(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(ValueError, match="not a kvsim scratch path"):
        scratch.remove(tmp_path / "data")
    assert (tmp_path / "data").is_dir()


def test_sigterm_unwinds_through_finally(tmp_path):
    code = textwrap.dedent(f"""
        import os, signal, time
        from kvsim import scratch
        with scratch.terminate_raises():
            p = scratch.make_dir({str(tmp_path)!r}, "stage")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            finally:
                scratch.remove(p)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Terminated: SIGTERM" in out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig, want", [("SIGINT", "raised KeyboardInterrupt "),
                                       ("SIGTERM", "raised Terminated SIGTERM")])
def test_a_signal_swallowed_in_a_destructor_is_raised_again(sig, want):
    """A signal whose exception lands in a ``__del__`` (as in a garbage-collector callback
    of Dask's) is swallowed by Python: ``raise_pending`` raises it where the waiting loop
    looks, once, and Python's "Exception ignored" report of it is kept quiet; outside the
    block nothing is pending."""
    code = textwrap.dedent(f"""
        import gc, os, signal, sys, time
        from kvsim import scratch

        class Swallows:
            def __del__(self):
                os.kill(os.getpid(), signal.{sig})
                for _ in range(1000):  # (the handler runs between bytecodes, here)
                    time.sleep(0.001)

        with scratch.terminate_raises():
            x = Swallows()
            del x
            print("went on", flush=True)
            try:
                scratch.raise_pending()
            except KeyboardInterrupt as e:
                print("raised", type(e).__name__, e, flush=True)
            scratch.raise_pending()  # (once only)
            print("once", flush=True)
        scratch.raise_pending()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["went on", want, "once"]
    assert "Exception ignored" not in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("sig, want", [("SIGINT", "KeyboardInterrupt"), ("SIGTERM", "Terminated")])
def test_a_signal_in_a_deferred_block_is_raised_at_its_end(sig, want):
    """Inside ``signals_deferred`` a signal is only noted: the block's work finishes, and
    the handlers outside it (here ``terminate_raises``') get the signal at its end."""
    code = textwrap.dedent(f"""
        import os, signal, time
        from kvsim import scratch

        with scratch.terminate_raises():
            try:
                with scratch.signals_deferred():
                    os.kill(os.getpid(), signal.{sig})
                    time.sleep(0.2)
                    print("block done", flush=True)
                print("not reached", flush=True)
            except KeyboardInterrupt as e:
                print("raised", type(e).__name__, flush=True)
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["block done", f"raised {want}", "True"]


def test_an_import_lock_left_held_is_released_for_other_threads():
    """The import lock left held by this thread (as a Ctrl-C inside the import system's
    weakref callback leaves it) blocks every other thread's import until
    ``release_import_lock``; one another thread holds is not this thread's to release."""
    code = textwrap.dedent("""
        import _imp, sys, threading
        from kvsim import scratch

        def imports(done):
            import json.tool   # (not imported yet)
            done.set()

        _imp.acquire_lock()            # left held, as the race leaves it
        done = threading.Event()
        threading.Thread(target=imports, args=(done,), daemon=True).start()
        print("blocked" if not done.wait(1.0) else "ran", flush=True)
        scratch.release_import_lock()
        print("ran" if done.wait(10) else "still blocked", flush=True)

        holding, go = threading.Event(), threading.Event()
        def holds():
            _imp.acquire_lock(); holding.set(); go.wait(10); _imp.release_lock()
        t = threading.Thread(target=holds); t.start(); holding.wait(10)
        scratch.release_import_lock()   # another thread's: left alone
        print("held" if _imp.lock_held() else "released", flush=True)
        go.set(); t.join(10)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["blocked", "ran", "held"], out.stdout + out.stderr
