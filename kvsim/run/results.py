"""Results folders of ``kvsim run`` and ``kvsim compare`` (and of each point of a study or
tune): written staged, swapped into place.

Which folder may take them is the one output rule of ``kvsim.run.outputs`` (absent, empty,
an earlier folder of the same command, or with ``--force`` a folder kvsim did not write,
beside whose files kvsim only adds its own), checked *before* anything runs
(``Staging.reserve``) and again at ``commit``.

Writing is staged: ``Staging`` creates a scratch folder beside the destination
(``kvsim.scratch``: its name records the owner, so a run killed with SIGKILL leaves
nothing the next start in the same parent folder does not remove), the run writes into
it, and ``commit`` swaps it into place. Where the file system supports it the swap is one
atomic ``renameat2(RENAME_EXCHANGE)``: at every instant the destination holds either the
old complete results or the new ones. Elsewhere the old folder is first renamed to a
scratch name (a kill in that moment leaves the destination absent, never half-written).
Into a shared folder (``--force``) the staged files move one by one, each replacing only
a file kvsim wrote there. ``abandon`` removes the staging folder and the parent folders
the reservation created.
"""

from __future__ import annotations

import csv
import ctypes
import errno
import json
import os
from pathlib import Path

from kvsim import scratch
from kvsim.engine.metrics import Row
from kvsim.run.outputs import (MARKER, OutputError, Target, check_folder, kvsim_version, make_parents,
                               mark, read_marker, replace_owned)

__all__ = ["MARKER", "OutputError", "Staging", "is_results_folder", "kvsim_version", "mark"]

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def is_results_folder(path: str | Path, kind: str = "run") -> bool:
    """Whether ``path`` carries the marker of a ``kind`` folder."""
    m = read_marker(path)
    return bool(m) and m.get("kind") == kind


class Staging:
    """A scratch folder beside ``dest`` that becomes ``dest`` on ``commit``."""

    def __init__(self, target: Target, path: Path, created: list[Path]):
        self.target, self.path, self._created = target, path, created
        self.dest, self.kind, self._what = target.path, target.kind, target.what

    @classmethod
    def reserve(cls, dest: str | Path, kind: str = "run", what: str = "--out",
                force: bool = False) -> "Staging":
        """Check ``dest`` (kvsim.run.outputs), create its missing parents and the staging
        folder (so a path that cannot be written fails now, not after the replay)."""
        target = check_folder(dest, kind, what, force=force)
        p = target.path
        created = make_parents(p, what)
        try:
            scratch.sweep(p.parent)
            stage = scratch.make_dir(p.parent, "." + p.name[:64], mode=0o777)
        except OSError as e:
            _rmdirs(created)
            raise OutputError(f"{what} {os.fspath(dest)}: cannot create a folder in "
                              f"{p.parent} ({e.strerror})") from None
        return cls(target, stage, created)

    def commit(self) -> Path:
        """Mark the staged folder and move it into ``dest``: the old results are removed
        (in a shared folder: only the files kvsim wrote there)."""
        now = check_folder(self.dest, self.kind, self._what, force=self.target.shared)
        if now.shared:
            replace_owned(self.dest, self.path, now.owned, self.kind, self._what)
            scratch.remove(self.path)
        else:
            mark(self.path, self.kind, wrote=[e.name for e in os.scandir(self.path) if e.name != MARKER])
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


def output_dir(cfg, out: str | None) -> Path:
    return Path(out or cfg.output.dir.format(name=cfg.name))


def write_files(result, folder: Path, plots: bool = True) -> None:
    """summary.json, requests.csv, timeline.csv (and plots) into ``folder`` (created if
    absent), marked as a results folder."""
    folder = Path(folder)
    folder.mkdir(exist_ok=True)
    mark(folder)
    (folder / "summary.json").write_text(json.dumps(result.summary(), indent=2, sort_keys=True,
                                                    allow_nan=False) + "\n")
    ranks = result.run_info.get("ranks", 1) > 1  # (the rank column: only for a node of several)
    cluster = result.run_info.get("cluster", False)  # (instance, node, rank: a cluster's)
    remote = result.cfg.cache.remote is not None  # (a hit_remote column last: only then)
    cols = (*Row.COLUMNS, "hit_remote") if remote else Row.COLUMNS
    values = (lambda r: (*r.csv_values(), r.hit_remote)) if remote else Row.csv_values
    with open(folder / "requests.csv", "w", newline="") as f:
        w = csv.writer(f)
        if cluster:
            w.writerow(("instance", "node", "rank", *cols))
            w.writerows((r.instance, r.node, r.rank, *values(r)) for r in result.rows)
        else:
            w.writerow(("rank", *cols) if ranks else cols)
            for r in result.rows:
                w.writerow((r.rank, *values(r)) if ranks else values(r))
    if result.timeline:
        keys = list(dict.fromkeys(k for row in result.timeline for k in row))
        with open(folder / "timeline.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(result.timeline)
    if plots:
        from kvsim.run.plots import write_plots

        write_plots(result, folder)


def write_results(result, out: Path, plots: bool = True) -> Path:
    """Write the results folder ``out`` (kvsim.run.results: refused unless ``out`` is absent,
    empty or an earlier results folder; staged beside it and swapped into place)."""
    with Staging.reserve(out) as stage:
        write_files(result, stage.path, plots)
        return stage.commit()


def git_commit() -> str | None:
    """The commit of the checkout kvsim runs from (with ``-dirty`` when it has uncommitted
    changes), or None for an installed copy or where git is absent."""
    import subprocess  # noqa: PLC0415

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
