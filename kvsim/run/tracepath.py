"""Which trace a run replays, checked before it is read: ``--trace`` or ``workload.path``.

A trace-driven workload (``mooncake``, ``agentic``) needs one that exists; a synthetic one
replays none, so a ``--trace`` beside it is refused rather than ignored (the run would
otherwise report the synthetic sessions as if they were the trace's). A relative path is
taken from the current folder, and the error says which folder that was.
"""

from __future__ import annotations

import os

from kvsim.config import ConfigFileError
from kvsim.workload import TraceError

TRACE_KINDS = ("mooncake", "agentic")


def trace_path(kind: str, configured: str | None, trace: str | None) -> str | None:
    """The trace a workload of ``kind`` replays: ``trace`` (``--trace``) or ``configured``
    (``workload.path``); None for a synthetic workload. ConfigFileError (its message led by
    the key, for ``blame``) or TraceError (``--trace``'s) when it names nothing there, or
    when a synthetic workload is given ``--trace``."""
    if kind not in TRACE_KINDS:
        if trace:
            raise ConfigFileError(f"workload.kind: {kind} replays no trace, but --trace names {trace}; "
                                  f"expected workload.kind {' or '.join(TRACE_KINDS)} to replay it "
                                  "(e.g. --set workload.kind=agentic)")
        return None
    path = trace or configured
    if not path:
        raise ConfigFileError(f"workload.path: a {kind} workload needs a trace; expected "
                              "workload.path or --trace")
    if not os.path.exists(os.path.expanduser(path)):
        where = "" if os.path.isabs(os.path.expanduser(path)) else \
            f" (a relative path is taken from the current folder, {os.getcwd()})"
        what = ("a Mooncake JSONL file" if kind == "mooncake"
                else "a session file (.json, .json.gz) or a folder of them")
        msg = f"{path}: no such file or folder{where}; expected {what}"
        if trace:
            raise TraceError(f"--trace {msg}")
        raise ConfigFileError(f"workload.path: {msg}")
    return path
