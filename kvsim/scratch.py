"""Scratch paths kvsim creates and must never leave behind, and how a crash is cleaned up.

A *scratch path* (a staging folder for results, the hw backend's disk-tier folder or file)
carries its owner in its name: ``STEM.kvsim-PID-START-HOST-RAND[.EXT]``, where START is the
owning process's start time (Linux: ``/proc/PID/stat`` field 22, clock ticks since boot)
and HOST a short hash of the host name. The name is written in the same system call that
creates the path, so there is no moment when an unowned scratch path exists.

- ``make_dir`` / ``make_file`` create one (exclusively; mode 0700 / 0600).
- ``sweep(parent)`` removes the scratch paths in ``parent`` whose owner is gone: same host,
  and no process with that pid and start time runs. A live run's paths, paths of other
  hosts (a shared file system), and anything whose name is not a scratch name are never
  touched: kvsim deletes only what it created.
- ``sweep_start(*folders)``: what every command and every study or tune worker does when
  it starts: sweep the temporary folder and the configured disk tiers' folders, so what a
  killed hw run left there goes with the next start of any kind (a sim run included).
- ``terminate_raises()`` turns SIGTERM (and SIGHUP) into ``Terminated``, a
  ``KeyboardInterrupt``, so ``finally`` blocks and context managers clean up on a kill
  the process can see, exactly as on Ctrl-C. SIGKILL and the OOM killer leave scratch
  paths behind; the next ``sweep`` of the same parent removes them. A signal whose
  exception Python swallowed (it landed in a ``__del__`` or a garbage-collector callback,
  e.g. Dask's) is kept: ``raise_pending()`` raises it again, and the loops that wait for
  work call it.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_NAME = re.compile(r"^(?P<stem>.*)\.kvsim-(?P<pid>\d+)-(?P<start>\d+)-(?P<host>[0-9a-f]{8})"
                   r"-(?P<rand>[0-9a-z]{8})(?P<ext>\.[A-Za-z0-9]+)?$")


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM or SIGHUP; raised in the main thread to unwind it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _host() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), 0 where the platform
    does not tell it, None when no such process runs (a zombie, dead but not yet reaped by
    its parent, runs no more: it will never remove its scratch paths)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc here: only whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X", b"x"):   # field 3, the state: a zombie, or dead
        return None
    return int(fields[19])  # field 22 of the whole line


def owner_tag() -> str:
    pid = os.getpid()
    return f"{pid}-{process_start(pid) or 0}-{_host()}"


def scratch_name(stem: str, ext: str = "") -> str:
    rand = "".join(secrets.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(8))
    return f"{stem}.kvsim-{owner_tag()}-{rand}{ext}"


def is_scratch(path: str | Path) -> bool:
    return _NAME.match(Path(path).name) is not None


def make_dir(parent: str | Path, stem: str, mode: int = 0o700) -> Path:
    """A new scratch folder in ``parent`` (which must exist); private to the user unless
    ``mode`` says otherwise (the umask applies)."""
    p = Path(parent) / scratch_name(stem)
    p.mkdir(mode=mode)
    return p


def make_file(parent: str | Path, stem: str, ext: str = "") -> tuple[Path, int]:
    """A new, empty scratch file in ``parent`` and its descriptor (read-write, 0600)."""
    p = Path(parent) / scratch_name(stem, ext)
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    return p, fd


def owner_alive(name: str) -> bool:
    """Whether the process that owns scratch path ``name`` may still run (True for a name
    that is not a scratch name or belongs to another host: never sweep those)."""
    m = _NAME.match(name)
    if m is None or m["host"] != _host():
        return True
    start = process_start(int(m["pid"]))
    if start is None:
        return False
    want = int(m["start"])
    return start == want or 0 in (start, want)


def sweep(parent: str | Path) -> list[Path]:
    """Remove the scratch paths in ``parent`` left by processes that are gone; returns
    them. A folder or file that cannot be listed or removed is skipped silently: a sweep
    never stops a run."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        if owner_alive(e.name):
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
            removed.append(Path(e.path))
        except OSError:
            pass
    return removed


def sweep_start(*folders: str | Path | None) -> list[Path]:
    """What every kvsim command (and each study or tune worker) does when it starts: sweep
    the temporary folder (where the hw backend's disk tier goes by default) and the given
    folders (the configured disk tiers' paths), each once. Returns what was removed."""
    removed: list[Path] = []
    seen: set[str] = set()
    for f in (tempfile.gettempdir(), *folders):
        if f is None:
            continue
        key = os.path.realpath(os.path.expanduser(os.fspath(f)))
        if key not in seen:
            seen.add(key)
            removed += sweep(key)
    return removed


def remove(path: str | Path) -> None:
    """Remove a scratch path of this process (folder or file); gone already is fine."""
    p = Path(path)
    if not is_scratch(p):  # a guard: this module removes only what it named
        raise ValueError(f"{p}: not a kvsim scratch path")
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    except FileNotFoundError:
        pass


@contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGINT raises ``KeyboardInterrupt`` and SIGTERM and SIGHUP
    ``Terminated`` in the main thread (a no-op off the main thread); each such signal is
    also kept until the block ends, for ``raise_pending`` (where the exception was
    swallowed: Python prints nothing of it then). The previous handlers come back
    afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, _frame):
        _raise.pending = signum  # type: ignore[attr-defined]
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    _raise.pending = None  # type: ignore[attr-defined]
    hook = sys.unraisablehook

    def _unraisable(u):  # (a signal's exception swallowed: raise_pending has it)
        kept = getattr(_raise, "pending", None) is not None
        if not (kept and isinstance(u.exc_value, KeyboardInterrupt)):
            hook(u)

    sigs = (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None))
    old = {s: signal.signal(s, _raise) for s in sigs if s is not None}
    sys.unraisablehook = _unraisable
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for s, h in old.items():
            signal.signal(s, h)


def raise_pending() -> None:
    """Raise again a signal ``terminate_raises`` caught whose exception was swallowed
    (``KeyboardInterrupt`` for SIGINT, else ``Terminated``); nothing otherwise."""
    for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        h = signal.getsignal(s) if s is not None else None
        signum = getattr(h, "pending", None)
        if signum is not None:
            h.pending = None  # type: ignore[union-attr]
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise Terminated(signum)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Within the block, SIGINT, SIGTERM and SIGHUP are only noted (main thread; a no-op
    elsewhere); at its end the handlers before come back and a noted signal is raised
    again, to them. For work a signal must not cut in half (a Dask cluster being built
    cannot be closed); the block should last seconds at most."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    sigs = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, lambda signum, _f: noted.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if noted:
            signal.raise_signal(noted[0])


def release_import_lock() -> None:
    """Release the interpreter's import lock where this thread holds it outside any
    import: a KeyboardInterrupt raised inside the import system (in its weakref callback
    that takes the lock, before the ``try`` that gives it back; such an exception is
    swallowed) leaves it held, and any other thread's next import waits for good (Dask's
    threads, as a cluster closes; a thread pool's, as Python exits). Call it where this
    thread imports nothing: after an interrupt, on the way out."""
    import _imp

    while _imp.lock_held():
        try:
            _imp.release_lock()
        except RuntimeError:   # another thread's, and rightly: it is importing
            return

