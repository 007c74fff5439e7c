"""Shared by the benchmarks that replay the agentic slices of the saved H200 compares: a
folder of real session files, as ``kvsim compare --trace`` took them on the device."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SESSIONS = ROOT.parent / "shared" / "traces" / "agentic-coding" / "sessions"


def session_slice(parent: str | Path, sessions, traces: str | Path = SESSIONS) -> Path:
    """``parent``/``1-2-3`` holding ``trace_0001.json.gz`` .. of ``sessions`` (from the
    shared traces; made once, reused after)."""
    folder = Path(parent) / "-".join(map(str, sessions))
    if not folder.exists():
        missing = [f for f in (Path(traces) / f"trace_{n:04d}.json.gz" for n in sessions) if not f.is_file()]
        if missing:
            raise SystemExit(f"session files not found: {', '.join(map(str, missing))} (the shared traces; "
                             f"pass --traces DIR)")
        folder.mkdir(parents=True)
        for n in sessions:
            shutil.copy(Path(traces) / f"trace_{n:04d}.json.gz", folder)
    return folder
