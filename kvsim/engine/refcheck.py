"""The refcheck's comparison: tags found in slots against the tags the core expects.

Its own module, left out of the optional compiled build (an exception subclassing a
builtin one is not a mypyc native class); ``kvsim.engine.plans`` re-exports both names.
"""

from __future__ import annotations

import numpy as np


class RefcheckError(AssertionError):
    """Bytes found where a page should be do not match the page's block."""


def check_tags(found: np.ndarray, expected: np.ndarray, what: str) -> None:
    if (found.dtype == expected.dtype and found.shape == expected.shape
            and found.tobytes() == expected.tobytes()):
        return  # the common case, every tag as expected, without numpy's elementwise ops
    differ = found != expected
    if not differ.any():  # equal values in another dtype or shape
        return
    written = expected != 0
    bad = np.flatnonzero(written & differ)
    if bad.size:
        i = int(bad[0])
        raise RefcheckError(f"refcheck failed for {what}: {bad.size} page(s) differ; first at "
                            f"position {i}: found tag {int(found[i]):#x}, expected {int(expected[i]):#x}")
