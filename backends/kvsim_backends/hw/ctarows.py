"""Calibrate's rows of the SM copy kernel by CTAs (``Measured.ctas``, which
``kvsim.tools.fit`` reads), taken on a GPU by ``microbench.measure_copies`` at each page
size with its backend and its batches:

- one direction (``one_way``): at ``SWEEP_PAGE`` every count of the plan's
  (``Plan.cta_counts``: 4 .. 64 on a GPU), at every other page size the fewest of them;
  rows ``{ctas, dir, page, GBps}``. The fit takes each page size's row of fewest CTAs,
  rate / CTAs, for ``sm.cta_onboard`` / ``cta_offload`` (a table by page size where rows
  of several exist: on the H200 GPU -> host 8.6-9.0 GB/s a CTA at 64 KiB pages,
  10.7-11.0 at 256 KiB-1 MiB). Reports from before these rows had a page have the
  64 KiB sweep only, without ``page``;
- both ways at once (``both_split``): host -> GPU at its own CTAs beside each GPU -> host
  count of ``BOTH_D2H_CTAS``; rows ``{ctas, dir: 'both', page, h2d_ctas, GBps, lone}``,
  for ``sm.both_ctas_d2h`` and ``sm.both_crowded``.
"""

from __future__ import annotations

import statistics
from typing import Callable

from kvsim.core.datapath.copypath import CopyPath
from kvsim.tools.measured import Measured

KiB = 1 << 10
SWEEP_PAGE = 64 * KiB  # the page size of the sweep over every CTA count

#: GPU -> host CTAs tried both ways beside host -> GPU's own (and GPU -> host's own)
BOTH_D2H_CTAS = (2, 3, 4, 5, 6, 8)

#: seconds a list of batches takes, started together on a path
Timed = Callable[[list, CopyPath], float]


def one_way(counts: tuple[int, ...], repeats: int, be, timed: Timed, cells: dict[str, list],
            m: Measured, pb: int) -> None:
    """The SM kernel one direction at a time at ``pb`` with each CTA count of ``counts``
    (at ``SWEEP_PAGE``; the fewest at other page sizes), ``cells[d]`` the direction's
    batches, the median of ``repeats`` (``m.ctas`` rows); ``be``'s CTAs kept."""
    own = dict(be.ctas)
    for c in counts if pb == SWEEP_PAGE else (min(counts),):
        be.ctas = {"h2d": c, "d2h": c}
        for d in ("h2d", "d2h"):
            s = statistics.median(timed(cells[d], CopyPath.SM_KERNEL) for _ in range(repeats))
            nbytes = sum(b.pages for b in cells[d]) * pb
            m.ctas.append({"ctas": c, "dir": d, "page": pb, "GBps": nbytes / s / 1e9})
    be.ctas = own


def both_split(repeats: int, be, timed: Timed, both: list, m: Measured, pb: int) -> dict[str, int]:
    """The SM kernel both ways at ``pb``: host -> GPU at its own CTAs beside each GPU -> host
    count (``m.ctas`` rows, ``dir`` 'both'; ``lone``: a lone batch's); the CTAs of the
    greatest total (H200: 36 + 4 CTAs 78-79 GB/s; 36 + 5-14 61-69, the waiting slow h2d)."""
    own, best = dict(be.ctas), (0.0, 0)
    for c in sorted(set(BOTH_D2H_CTAS) | {own["d2h"]}):
        be.ctas = {"h2d": own["h2d"], "d2h": c}
        timed(both, CopyPath.SM_KERNEL)  # warm-up
        s = statistics.median(timed(both, CopyPath.SM_KERNEL) for _ in range(repeats))
        gbs = sum(b.pages for b in both) * pb / s / 1e9
        m.ctas.append({"ctas": c, "dir": "both", "page": pb, "h2d_ctas": own["h2d"], "GBps": gbs,
                       "lone": c == own["d2h"]})
        best = max(best, (gbs, c))
    be.ctas = own
    return {"h2d": own["h2d"], "d2h": best[1]}
