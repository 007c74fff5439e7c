"""Shared by the benchmarks that replay the agentic slices of the saved H200 compares: a
folder of real session files, as ``kvsim compare --trace`` took them on the device, the
compare's config of them, and comma lists on their command lines."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = ROOT.parent / "shared" / "traces" / "agentic-coding" / "sessions"
# the saved compares' command line: step by step, disk writes not re-read
SETS = ["engine.fast_forward=false", "engine.refcheck_disk_writes=false"]


def slice_config(extra=()):
    """``configs/agentic-slice.yaml`` as the saved compares ran it (plus ``extra`` overrides)."""
    from kvsim.config import load_config  # noqa: PLC0415  (after the caller's sys.path)

    return load_config(str(ROOT / "configs" / "agentic-slice.yaml"), SETS + list(extra))


def comma_list(ap, flag: str, text: str, kind=float) -> list:
    """``text`` ("1,2,3") as a list of ``kind``, or ``ap.error`` naming ``flag``."""
    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        ap.error(f"{flag}: got {text!r}; expected {kind.__name__} values separated by commas, e.g. 1,2,3")


def session_slice(parent: str | Path, sessions, traces: str | Path = SESSIONS) -> Path:
    """``parent``/``1-2-3`` holding ``trace_0001.json.gz`` .. of ``sessions`` (from the
    shared traces; made once, reused after)."""
    folder = Path(parent) / "-".join(map(str, sessions))
    if not folder.exists():
        files = [Path(traces) / f"trace_{n:04d}.json.gz" for n in sessions]
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise SystemExit(f"session files not found: {', '.join(map(str, missing))} (the shared traces; "
                             f"pass --traces DIR)")
        folder.mkdir(parents=True)
        for f in files:
            shutil.copy(f, folder)
    return folder
