"""Which kvsim a benchmark replays with: this checkout's source (the default), the kvsim
the interpreter has installed (``--installed``, e.g. the compiled build), or the compiled
build, made first in ``local/compiled-venv`` when missing or stale (``--compiled``: the
script runs again there with ``--installed``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def choose(script: str) -> bool:
    """Put the chosen kvsim on the path for ``script`` (its ``__file__``); True when it is
    the installed one. With ``--compiled`` this does not return: the script runs again in
    the compiled install."""
    if "--compiled" in sys.argv[1:]:
        from compiled_speed import build_venv  # noqa: PLC0415 (only for --compiled)

        py = str(build_venv(ROOT / "local" / "compiled-venv"))
        args = [x for x in sys.argv[1:] if x != "--compiled"]
        os.execv(py, [py, str(Path(script).resolve()), "--installed", *args])
    if "--installed" in sys.argv[1:]:  # nothing of the checkout on the path
        sys.path[:] = [p for p in sys.path
                       if Path(p or ".").resolve() not in (ROOT, ROOT / "benchmarks",
                                                           ROOT / "backends")]
        return True
    sys.path[:0] = [str(ROOT), str(ROOT / "backends")]
    return False
