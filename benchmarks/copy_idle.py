"""Seed 000's idle relation in the sim: 1 GiB of host <-> GPU copies on an idle GPU, the
copy engine against the SM kernel, by page size, on a profile (default ``gh200-c2c``; the
seed: the copy engines "match or slightly beat the kernel on an idle GPU"). Each cell is
the sim backend moving one batch (``kvsim.tools.fitkinds.sim_cell``), the engines paying the
profile's host time per page (``copy_engine.per_page_h2d`` / ``per_page_d2h``).
Last line: ``ce_over_sm_idle_4MiB: x`` (the engines' time over the kernel's, the slower
direction).

    python benchmarks/copy_idle.py [--profile gh200-c2c]
"""

from __future__ import annotations

import argparse

from kvsim.config.hardware import load_profile
from kvsim.tools.fitkinds import sim_cell

MiB, GiB = 1 << 20, 1 << 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="gh200-c2c")
    p = load_profile(ap.parse_args().profile)
    worst = {}
    for page in (1 * MiB, 2 * MiB, 4 * MiB):
        for d in ("h2d", "d2h"):
            pages = GiB // page
            cell = lambda path: {"page": page, "path": path, "dir": d, "pages": pages,  # noqa: E731
                                 "bytes": pages * page, "batches": [[d, pages]]}
            ce, _ = sim_cell(p, cell("copy_engine"))
            sm, _ = sim_cell(p, cell("sm_kernel"))
            worst[page] = max(worst.get(page, 0.0), ce / sm)
            print(f"{page // MiB} MiB {d}: copy engine {GiB / ce / 1e9:6.1f} GB/s, "
                  f"SM kernel {GiB / sm / 1e9:6.1f} GB/s, time x{ce / sm:.3f}")
    print(f"ce_over_sm_idle_4MiB: {worst[4 * MiB]:.3f}")


if __name__ == "__main__":
    main()
