"""Results folders: what a run writes, and the only folders it may replace.

A results folder carries a marker file, ``.kvsim-results`` (JSON: kvsim's version and
what wrote it). kvsim replaces a folder only when it carries that mark or is empty; any
other existing folder, a file, the current folder or one that holds it is refused with
an error naming the path, *before* anything runs (``Staging.reserve``).

Writing is staged: ``Staging`` creates a scratch folder beside the destination
(``kvsim.scratch``: its name records the owner, so a run killed with SIGKILL leaves
nothing the next start in the same parent folder does not remove), the run writes into
it, and ``commit`` swaps it into place. Where the file system supports it the swap is one
atomic ``renameat2(RENAME_EXCHANGE)``: at every instant the destination holds either the
old complete results or the new ones. Elsewhere the old folder is first renamed to a
scratch name (a kill in that moment leaves the destination absent, never half-written).
``abandon`` removes the staging folder and the parent folders the reservation created.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
from pathlib import Path

from kvsim import scratch

MARKER = ".kvsim-results"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class OutputError(ValueError):
    """The results destination cannot be used; the message names it and says why."""


def kvsim_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("kvsim")
    except PackageNotFoundError:  # running from a source tree that is not installed
        from kvsim import __version__  # noqa: PLC0415

        return __version__


def mark(folder: str | Path, kind: str = "run") -> None:
    """Write the marker that makes ``folder`` a kvsim results folder."""
    (Path(folder) / MARKER).write_text(json.dumps({"kvsim": kvsim_version(), "kind": kind}) + "\n")


def is_results_folder(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def check_destination(dest: str | Path, what: str = "--out") -> Path:
    """``dest`` as a Path if kvsim may write its results there; else OutputError."""
    text = os.fspath(dest)
    if not text or "\0" in text:
        raise OutputError(f"{what} {text!r}: not a usable folder name")
    p = Path(text).expanduser()
    try:
        here = Path.cwd().resolve()
    except OSError:
        here = None
    full = p.resolve()
    if here is not None and (full == here or full in here.parents):
        raise OutputError(f"{what} {text}: is the current folder or holds it; results go into a "
                          f"folder of their own (e.g. {what} results/NAME)")
    if len(p.name.encode()) > 200:
        raise OutputError(f"{what} {text}: the folder name is {len(p.name.encode())} bytes long; "
                          f"expected at most 200")
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        raise OutputError(f"{what} {text}: exists and is not a folder; kvsim replaces only its own "
                          f"results folders")
    if p.is_dir():
        try:
            empty = next(os.scandir(p), None) is None
        except OSError as e:
            raise OutputError(f"{what} {text}: cannot be read ({e.strerror})") from None
        if not empty and not is_results_folder(p):
            raise OutputError(f"{what} {text}: exists and is not a kvsim results folder (it has no "
                              f"{MARKER}); kvsim replaces only folders it wrote: choose another "
                              f"{what} or move that folder away yourself")
    anc = p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if anc.exists() and not anc.is_dir():
        raise OutputError(f"{what} {text}: {anc} is not a folder")
    return p


class Staging:
    """A scratch folder beside ``dest`` that becomes ``dest`` on ``commit``."""

    def __init__(self, dest: Path, path: Path, created: list[Path], kind: str, what: str):
        self.dest, self.path, self._created, self.kind, self._what = dest, path, created, kind, what

    @classmethod
    def reserve(cls, dest: str | Path, kind: str = "run", what: str = "--out") -> "Staging":
        """Check ``dest``, create its missing parents and the staging folder (so a path
        that cannot be written fails now, not after the replay)."""
        p = check_destination(dest, what)
        created: list[Path] = []
        anc = p.parent
        while not anc.exists():
            created.append(anc)
            anc = anc.parent
        try:
            for d in reversed(created):
                d.mkdir()
            scratch.sweep(p.parent)
            stage = scratch.make_dir(p.parent, "." + p.name[:64], mode=0o777)
        except OSError as e:
            _rmdirs(created)
            raise OutputError(f"{what} {os.fspath(dest)}: cannot create a folder in "
                              f"{p.parent} ({e.strerror})") from None
        return cls(p, stage, created, kind, what)

    def commit(self) -> Path:
        """Mark the staged folder and swap it into ``dest``; the old results are removed."""
        mark(self.path, self.kind)
        check_destination(self.dest, self._what)  # it may have changed during the run
        if self.dest.is_dir():
            if not _exchange(self.path, self.dest):
                old = self.dest.with_name(scratch.scratch_name("." + self.dest.name[:64]))
                self.dest.rename(old)
                self.path.rename(self.dest)
                self.path = old
            scratch.remove(self.path)  # now the old results
        else:
            self.path.rename(self.dest)
        self._created = []
        return self.dest

    def abandon(self) -> None:
        """Remove the staging folder and the parent folders ``reserve`` created."""
        try:
            scratch.remove(self.path)
        except OSError:
            pass
        _rmdirs(self._created)
        self._created = []

    def __enter__(self) -> "Staging":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abandon()


def _rmdirs(created: list[Path]) -> None:
    for d in created:  # deepest first; only if still empty
        try:
            d.rmdir()
        except OSError:
            pass


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two folders (Linux renameat2); False where that is not supported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(b))
