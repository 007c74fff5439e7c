"""The one output rule of every kvsim command that writes, and the marker it reads.

Folders (``kvsim run``, ``compare``, ``study``, ``tune``: ``--out`` or ``output.dir``):

- a folder that does not exist is created (with its missing parents);
- an existing folder is used only if it is empty or carries the marker file
  ``.kvsim-results`` of the same kind of command (``run`` replaces an earlier run folder
  whatever its config, but not one holding anything it did not write there; a ``study`` or
  ``tune`` folder is resumed only with the same config hash, else the error names both
  hashes);
- anything else is refused before any work (``OutputError``, exit code 2), naming the
  folder and the way out: a folder of another kind, a folder kvsim did not write, a file,
  the current folder or one holding it.
- ``--force`` takes a folder kvsim did not write (one without a marker) and adds kvsim's
  files beside the ones there: it never removes or overwrites a file it did not write.
  Each command writes a known set of top-level names (``NAMES``); one of them already
  there and not written by kvsim is a collision, refused up front. Such a folder's marker
  says ``shared`` and lists the names kvsim wrote, the only ones it may later replace.

Files (``calibrate --out``, a profile and its report; ``diff --out`` and ``calibrate
--check --out``, JSON reports): a new file is created; an existing one is replaced only
when it is recognisably one kvsim wrote of that kind (``FILE_KINDS``). A file kvsim did
not write is never replaced, with or without ``--force``.

Every file kvsim writes is written whole (``write_whole``: a scratch-named temporary file
beside it, renamed into place), so a temporary name can never be a user's file.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kvsim import scratch

MARKER = ".kvsim-results"

#: the top-level names each kind of command may write into its folder
NAMES: dict[str, frozenset[str]] = {
    "run": frozenset({"summary.json", "requests.csv", "timeline.csv", "timeline.png", "ttft_cdf.png",
                      "point.json"}),   # (a study's point folder is a run folder and its point.json)
    "compare": frozenset({"compare.json", "compare-calls.json.gz", "sim", "hw", "hardware.yaml",
                          "hardware.yaml.report.json", "hwloop.yaml"}),
    "study": frozenset({"study.yaml", "points", "study.csv", "study.parquet", "failures.json", "plots",
                       "report.html"}),
    "tune": frozenset({"optuna.db", "optuna.db-journal", "optuna.db-wal", "optuna.db-shm", "trials",
                       "held_out", "base", "trials.csv", "trials.parquet", "top.csv", "top.parquet",
                       "best.yaml", "plots", "report.html"}),
}
COMMAND = {"run": "kvsim run", "compare": "kvsim compare", "study": "kvsim study", "tune": "kvsim tune"}
RESUMED = ("study", "tune")   # kinds whose folder is continued, not replaced


class OutputError(ValueError):
    """The destination cannot be used; the message names it and says the way out."""


def kvsim_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("kvsim")
    except PackageNotFoundError:  # running from a source tree that is not installed
        from kvsim import __version__  # noqa: PLC0415

        return __version__


# ------------------------------------------------------------------------------ writing


def write_whole(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all: a new scratch file beside it (a name
    no user file can have), renamed into place; removed if anything fails."""
    p = Path(path)
    tmp, fd = scratch.make_file(p.parent, "." + p.name[:64])
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def read_marker(folder: str | Path) -> dict | None:
    """The marker of ``folder``: None without one; {} for a marker file kvsim cannot read
    (not JSON, not a mapping): such a folder counts as not kvsim's."""
    p = Path(folder) / MARKER
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("kind"), str) else {}


def marker_data(kind: str, hash_: str | None = None, files: list[str] | None = None,
                wrote: list[str] | None = None) -> dict:
    """``files``: a shared folder's names kvsim wrote; ``wrote``: the names a run or compare
    wrote into a folder of its own (a later one replaces the folder whole)."""
    data: dict = {"kvsim": kvsim_version(), "kind": kind}
    if hash_ is not None:
        data["hash"] = hash_
    if files is not None:
        data["shared"] = True
        data["files"] = sorted(files)
    if wrote is not None:
        data["wrote"] = sorted(wrote)
    return data


def write_marker(folder: str | Path, data: dict) -> None:
    write_whole(Path(folder) / MARKER, (json.dumps(data, sort_keys=True) + "\n").encode())


def mark(folder: str | Path, kind: str = "run", wrote: list[str] | None = None) -> None:
    """Write the marker that makes ``folder`` a kvsim folder of ``kind`` (all of it kvsim's;
    ``wrote``: the names in it)."""
    write_marker(folder, marker_data(kind, wrote=wrote))


# ------------------------------------------------------------------------------ folders


@dataclass
class Target:
    """A checked destination folder. ``state``: ``new`` (absent), ``empty``, ``ours`` (a
    folder of this kind, all kvsim's), ``shared`` (a folder kvsim did not write, taken
    with ``--force``, or one taken so before: kvsim owns only ``owned`` in it),
    ``abandoned`` (a claim undone: nothing more is written)."""
    path: Path
    kind: str
    what: str
    state: str
    hash: str | None = None
    owned: frozenset[str] = frozenset()
    created: list[Path] = field(default_factory=list)   # parents (and itself) a claim made
    _marker_new: bool = False

    @property
    def shared(self) -> bool:
        return self.state == "shared"

    # -- claiming: the folder made ready to write into ----------------------------------
    def claim(self) -> "Target":
        """Check again (the folder may have changed since), create what is missing and
        write the marker; a study's or tune's folder before its work starts."""
        again = check_folder(self.path, self.kind, self.what, self.hash, force=self.shared)
        self.state, self.owned = again.state, again.owned
        self.created = make_parents(self.path, self.what)
        if not self.path.exists():
            try:
                self.path.mkdir()
            except OSError as e:
                _rmdirs(self.created)
                raise OutputError(f"{self.what} {self.path}: cannot be created ({e.strerror})") from None
            self.created.insert(0, self.path)
        old = read_marker(self.path)
        self._marker_new = old is None
        files = sorted(NAMES[self.kind]) if self.shared else None
        write_marker(self.path, marker_data(self.kind, self.hash, files))
        return self

    def finish(self) -> None:
        """A shared folder: the marker lists the names kvsim has written (those that exist)."""
        if self.shared and self.path.is_dir():
            have = [n for n in NAMES[self.kind] if os.path.lexists(self.path / n)]
            write_marker(self.path, marker_data(self.kind, self.hash, have))

    def abandon_if_unused(self) -> None:
        """Undo the claim when nothing was written yet (a cluster that did not start):
        the marker it wrote and the folders it created go; anything else stays."""
        if any(os.path.lexists(self.path / n) for n in NAMES[self.kind]):
            self.finish()
            return
        if self._marker_new:
            try:
                (self.path / MARKER).unlink()
            except OSError:
                pass
            self.state = "abandoned"   # (finish() writes no marker back)
        _rmdirs(self.created)
        self.created = []


    def abandon_new(self) -> bool:
        """Undo a claim whose work was wrong from its start (a tune whose file fails every
        trial): where this claim made the folder kvsim's (its marker new: the folder was
        absent, empty, or a user's taken with --force, which then held none of these
        names), the names of this kind written into it since go, then the marker and the
        folders the claim created; True where so. Else nothing is removed."""
        if not self._marker_new:
            return False
        for n in sorted(NAMES[self.kind]):
            p = self.path / n
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.lexists(p):
                p.unlink(missing_ok=True)
        try:
            (self.path / MARKER).unlink()
        except OSError:
            pass
        _rmdirs(self.created)
        self.created = []
        self.state = "abandoned"   # (finish() writes no marker back)
        return True


def _cwd() -> Path | None:
    try:
        return Path.cwd().resolve()
    except OSError:
        return None


def check_path(dest: str | Path, what: str) -> Path:
    """The checks every destination shares: a usable name, not the current folder or one
    holding it, no file among its parents."""
    text = os.fspath(dest)
    if not text or "\0" in text:
        raise OutputError(f"{what} {text!r}: not a usable name")
    p = Path(text).expanduser()
    here = _cwd()
    full = p.resolve()
    if here is not None and (full == here or full in here.parents):
        raise OutputError(f"{what} {text}: is the current folder or holds it; kvsim writes its "
                          f"results into a folder of their own (e.g. {what} results/NAME)")
    _check_name_and_parent(p, text, what, "the folder name")
    return p


def _check_name_and_parent(p: Path, text: str, what: str, noun: str) -> None:
    """``p``'s name at most 200 bytes, and its nearest existing ancestor a folder."""
    if len(p.name.encode()) > 200:
        raise OutputError(f"{what} {text}: {noun} is {len(p.name.encode())} bytes long; "
                          f"expected at most 200")
    anc = p.parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if anc.exists() and not anc.is_dir():
        raise OutputError(f"{what} {text}: {anc} is not a folder")


def check_folder(dest: str | Path, kind: str, what: str = "--out", hash_: str | None = None,
                 force: bool = False) -> Target:
    """Whether ``kind``'s command may write into folder ``dest`` (module docstring): a
    Target, or OutputError naming the folder and the way out. Nothing is written."""
    cmd = COMMAND[kind]
    p = check_path(dest, what)
    text = os.fspath(dest)
    if p.is_symlink() or (p.exists() and not p.is_dir()):
        raise OutputError(f"{what} {text}: exists and is not a folder; {cmd} writes into a folder "
                          f"of its own: choose another {what}")
    if not p.exists():
        return Target(p, kind, what, "new", hash_)
    try:
        present = {e.name for e in os.scandir(p)}
    except OSError as e:
        raise OutputError(f"{what} {text}: cannot be read ({e.strerror})") from None
    if not present:
        return Target(p, kind, what, "empty", hash_)
    marker = read_marker(p)
    if marker:
        got = marker["kind"]
        if got != kind:
            raise OutputError(f"{what} {text}: is a {COMMAND.get(got, 'kvsim ' + got)} folder; {cmd} "
                              f"writes only into a new folder, an empty one or one of its own "
                              f"(--force does not mix two commands' results): choose another {what}")
        if kind in RESUMED and hash_ is not None and marker.get("hash") != hash_:
            raise OutputError(f"{what} {text}: holds a {kind} of config hash {marker.get('hash')}; this "
                              f"{kind}'s config hash is {hash_} (its file, --set or the trace a tune "
                              f"reads differ): to resume it, run it as before; else choose another {what}")
        if not marker.get("shared"):
            wrote = marker.get("wrote")
            wrote = {str(n) for n in wrote if isinstance(n, str)} if isinstance(wrote, list) else set()
            return _ours(p, kind, what, hash_, force, present, wrote)
        owned = frozenset(str(n) for n in marker.get("files", ()) if isinstance(n, str))
        _collisions(p, kind, what, present - owned - {MARKER})
        return Target(p, kind, what, "shared", hash_, owned)
    if not force:
        why = "it has no " + MARKER if marker is None else "its " + MARKER + " is not kvsim's"
        raise OutputError(f"{what} {text}: exists and was not written by kvsim ({why}); {cmd} "
                          f"writes only into a new folder, an empty one or one of its own: choose "
                          f"another {what}, or add --force to write beside the files there (kvsim "
                          f"never replaces them)")
    if marker is not None:  # a marker file that is not kvsim's: it would be replaced
        raise OutputError(f"{what} {text}: --force: {p / MARKER} exists and kvsim did not write "
                          f"it; kvsim never replaces a file it did not write: choose another {what}")
    _collisions(p, kind, what, present)
    return Target(p, kind, what, "shared", hash_, frozenset())


def _ours(p: Path, kind: str, what: str, hash_: str | None, force: bool, present: set[str],
          wrote: set[str]) -> Target:
    """A folder this kind of command wrote. A ``run`` or ``compare`` replaces it whole, so
    anything in it that is neither one of its names nor one its marker says it wrote (a
    user's notes, another command's folder put inside) is refused, naming it; with
    ``--force`` the folder becomes shared and only kvsim's names in it are replaced. A
    study or tune adds to its folder name by name: the rest stays."""
    if kind in RESUMED:
        return Target(p, kind, what, "ours", hash_)
    ours = NAMES[kind] | wrote
    foreign = sorted(n for n in present - ours - {MARKER} if not scratch.is_scratch(n))
    if not foreign:
        return Target(p, kind, what, "ours", hash_)
    if not force:
        raise OutputError(f"{what} {os.fspath(p)}: holds {p / foreign[0]}, which kvsim did not write "
                          f"there, and {COMMAND[kind]} replaces its folder whole: move it away, choose "
                          f"another {what}, or add --force to replace only kvsim's files there")
    return Target(p, kind, what, "shared", hash_, frozenset(present & ours))


def _collisions(p: Path, kind: str, what: str, foreign: set[str]) -> None:
    clash = sorted(foreign & NAMES[kind])
    if clash:
        raise OutputError(f"{what} {p}: --force: {p / clash[0]} exists and kvsim did not write it; "
                          f"kvsim never replaces a file it did not write: move it away yourself or "
                          f"choose another {what}")


def make_parents(p: Path, what: str) -> list[Path]:
    """Create the missing parents of ``p``; returns them, deepest first."""
    created: list[Path] = []
    anc = p.parent
    while not anc.exists():
        created.append(anc)
        anc = anc.parent
    try:
        for d in reversed(created):
            d.mkdir()
    except OSError as e:
        _rmdirs(created)
        raise OutputError(f"{what} {os.fspath(p)}: cannot create a folder in {p.parent} "
                          f"({e.strerror})") from None
    return created


def _rmdirs(created: list[Path]) -> None:
    for d in created:  # deepest first; only if empty
        try:
            d.rmdir()
        except OSError:
            pass


def replace_owned(dest: Path, stage: Path, owned: frozenset[str], kind: str, what: str) -> None:
    """Move the entries of folder ``stage`` into the shared folder ``dest``: an entry may
    replace only a name kvsim wrote there (``owned``); kvsim's earlier names that the new
    results do not have are removed. The marker lists the new names."""
    names = sorted(e.name for e in os.scandir(stage) if e.name != MARKER)
    for n in names:
        if os.path.lexists(dest / n) and n not in owned:
            raise OutputError(f"{what} {dest}: {dest / n} exists and kvsim did not write it; kvsim "
                              f"never replaces a file it did not write: choose another {what}")
    for n in sorted(owned - set(names)):
        _remove(dest / n)
    for n in names:
        if os.path.lexists(dest / n):
            _remove(dest / n)
        os.rename(stage / n, dest / n)
    write_marker(dest, marker_data(kind, None, names))


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif os.path.lexists(p):
        p.unlink()


# -------------------------------------------------------------------------------- files


def _json_field(key: str, value: str) -> Callable[[Path], bool]:
    def ours(p: Path) -> bool:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return False
        return isinstance(data, dict) and data.get(key) == value
    return ours


def _profile(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            first = f.readline(200).decode("utf-8", "replace")
    except OSError:
        return False
    return first.startswith(("# Written by `kvsim calibrate`", "# Re-fitted by `kvsim calibrate"))


def _profile_report(p: Path) -> bool:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and "fit_check" in data


#: file kind -> (how kvsim recognises a file it wrote, the command that writes it)
FILE_KINDS: dict[str, tuple[Callable[[Path], bool], str]] = {
    "profile": (_profile, "kvsim calibrate"),
    "profile-report": (_profile_report, "kvsim calibrate"),
    "diff": (_json_field("kvsim_report", "diff"), "kvsim diff"),
    "calibrate-check": (_json_field("kvsim_report", "calibrate-check"), "kvsim calibrate --check"),
    "fidelity": (_json_field("kvsim_report", "fidelity"), "kvsim fidelity"),
}


def check_file(dest: str | Path, kind: str, what: str = "--out") -> Path:
    """Whether ``kind``'s command may write file ``dest``: a new file, or one it wrote
    before (recognised by ``FILE_KINDS``); else OutputError naming it. Nothing written."""
    ours, cmd = FILE_KINDS[kind]
    text = os.fspath(dest)
    if not text or "\0" in text:
        raise OutputError(f"{what} {text!r}: not a usable file name")
    p = Path(text).expanduser()
    if p.is_dir():
        raise OutputError(f"{what} {text}: is a folder; expected a file name")
    if os.path.lexists(p) and (p.is_symlink() or not p.is_file()):
        raise OutputError(f"{what} {text}: exists and is not a plain file; choose another {what}")
    _check_name_and_parent(p, text, what, "the name")
    if p.exists() and not ours(p):
        raise OutputError(f"{what} {text}: exists and was not written by {cmd}; kvsim never replaces "
                          f"a file it did not write: choose another {what}")
    return p
