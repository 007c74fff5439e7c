"""The refcheck's comparison: tags found in slots against the tags the core expects.

Its own module, left out of the optional compiled build (an exception subclassing a
builtin one is not a mypyc native class); ``kvsim.engine.stages`` re-exports both names.

Tags come as sequences of ints: the core's lists, the sim backend's lists, the hw
backend's uint64 arrays. ``check_tags`` compares them through numpy; the hot paths first
ask ``kvsim.engine.stages.tags_equal`` (compiled in the optional build), which compares two
lists in place, and call ``check_tags`` only when it finds a difference.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class RefcheckError(AssertionError):
    """Bytes found where a page should be do not match the page's block."""


def check_tags(found: Sequence[int], expected: Sequence[int], what: str) -> None:
    """Raise RefcheckError if a written page (expected tag not 0) holds another tag."""
    f = np.asarray(found, dtype=np.uint64)
    e = np.asarray(expected, dtype=np.uint64)
    if f.shape != e.shape:
        raise RefcheckError(f"refcheck failed for {what}: {f.size} tag(s) found for "
                            f"{e.size} page(s)")
    bad = np.flatnonzero((e != 0) & (f != e))
    if bad.size:
        i = int(bad[0])
        raise RefcheckError(f"refcheck failed for {what}: {bad.size} page(s) differ; first at "
                            f"position {i}: found tag {int(f[i]):#x}, expected {int(e[i]):#x}")
