"""The refcheck's comparison: tags found in slots against the tags the core expects.

Its own module, left out of the optional compiled build (an exception subclassing a
builtin one is not a mypyc native class); ``kvsim.engine.plans`` re-exports both names.

Tags come as sequences of ints: the core's lists, the sim backend's lists, the hw
backend's uint64 arrays. Two lists compare as lists (no numpy on the sim's hot path);
anything else through numpy.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class RefcheckError(AssertionError):
    """Bytes found where a page should be do not match the page's block."""


def tags_equal(found: Sequence[int], expected: Sequence[int]) -> bool:
    """Every tag as expected (same length, same values)."""
    if type(found) is list and type(expected) is list:
        return found == expected
    f = np.asarray(found, dtype=np.uint64)
    e = np.asarray(expected, dtype=np.uint64)
    return f.shape == e.shape and f.tobytes() == e.tobytes()


def check_tags(found: Sequence[int], expected: Sequence[int], what: str) -> None:
    """Raise RefcheckError if a written page (expected tag not 0) holds another tag."""
    if tags_equal(found, expected):
        return  # the common case, every tag as expected, without numpy's elementwise ops
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
