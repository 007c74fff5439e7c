"""Scratch paths: created owned, swept only when their owner is gone, never anyone else's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

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
