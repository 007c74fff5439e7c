"""The hw loop's host costs at a resume, scaled to a machine's host, from hw replays' logs.

``kvsim.tools.hwloop``'s ``resume``, ``resume_per_page`` and ``refcheck.launch_per_page``
are the loop's Python work when the engine resumes a request that holds GPU pages; the
shipped terms come from one 2026-12-03 H200 machine's replays. A host's speed scales them:
``kvsim.tools.loopprobe.fit_host`` fits that scale to the host lag of the steps launched
after resumes. The loop probe does so on its own resumes (four past the warm-up) before a
compare; this module does it on a ``kvsim compare`` folder's hw replay, whose resumes are
its turns with GPU hits only (hw's ``requests.csv``), each paired with the compute log's
row launched at its admission (arrival + queue), of hits / page tokens pages; the check's
launch counted where the compare ran the refcheck (its ``hw/summary.json``).

``python -m kvsim.tools.fithost OUT [OUT ...] [--hw-loop NAME] [--page-tokens 16]``: each
run's scale and its resumes, last line ``fithost_scale: X`` (all runs' resumes together).
"""

from __future__ import annotations

import bisect
import csv
import json
import sys
from pathlib import Path
from typing import Sequence

from kvsim.tools.hwloop import HwLoopModel, load_hw_loop
from kvsim.tools.loopprobe import fit_host, host_scale_text
from kvsim.tools.reports import saved_call_logs

ADMIT_TOLERANCE_S = 1e-4  # a row launched this close to a turn's admission is its first step


def checked(folder: str | Path) -> bool:
    """Whether the compare in ``folder`` ran the refcheck on hw (the config in its
    ``hw/summary.json``; the default, on, where it has none)."""
    try:
        cfg = json.loads((Path(folder) / "hw" / "summary.json").read_text())["config"]
        return bool(cfg["engine"]["refcheck"])
    except (OSError, ValueError, KeyError, TypeError):
        return True


def resumes_of(folder: str | Path, page_tokens: int = 16) -> tuple[list, list[tuple[int, int]]]:
    """(the hw compute log, (row index, GPU pages) of each turn with GPU hits only) of a
    ``kvsim compare`` folder. ValueError naming the folder where a log is missing."""
    folder = Path(folder)
    rows = saved_call_logs(folder).get("hw_compute")
    requests = folder / "hw" / "requests.csv"
    if not rows or not requests.exists():
        raise ValueError(f"{folder}: expected a kvsim compare output folder with a hw compute log "
                         "(compare-calls.json.gz) and hw/requests.csv")
    starts = [r[0] for r in rows]
    out = []
    with requests.open(newline="") as f:
        for q in csv.DictReader(f):
            if int(q["hit_gpu"]) and not int(q["hit_host"]) and not int(q["hit_disk"]):
                admitted = float(q["arrival_s"]) + float(q["queue_s"])
                i = bisect.bisect_left(starts, admitted - ADMIT_TOLERANCE_S)
                if i < len(rows) and abs(rows[i][0] - admitted) < ADMIT_TOLERANCE_S:
                    out.append((i, int(q["hit_gpu"]) // page_tokens))
    return rows, out


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    opts = {"--hw-loop": "h200", "--page-tokens": "16"}
    for k in opts:
        if k in args:
            i = args.index(k)
            if i + 1 >= len(args):
                print(f"error: {k}: give a value", file=sys.stderr)
                return 2
            opts[k] = args.pop(i + 1)
            args.pop(i)
    if not args:
        print("usage: python -m kvsim.tools.fithost OUT [OUT ...] [--hw-loop NAME] "
              "[--page-tokens 16]", file=sys.stderr)
        return 2
    try:
        model: HwLoopModel = load_hw_loop(opts["--hw-loop"])
        runs = [resumes_of(f, int(opts["--page-tokens"])) for f in args]
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    checks = [checked(f) for f in args]
    for f, (rows, resumes), on in zip(args, runs, checks):
        _, rep = fit_host(rows, resumes, model, checked=on)
        print(f"{f}: {host_scale_text(rep)}")
    if len(set(checks)) > 1:
        print("error: the runs differ in engine.refcheck: fit them apart", file=sys.stderr)
        return 2
    # together: each run's rows apart (indices offset), one scale
    rows_all, resumes_all, starts = [], [], []
    for rows, resumes in runs:
        starts.append(len(rows_all))
        resumes_all += [(i + len(rows_all), p) for i, p in resumes]
        rows_all += rows
    _, rep = fit_host(rows_all, resumes_all, model, checked=checks[0], starts=starts)
    print(f"together: {host_scale_text(rep)}")
    k = rep.get("host_scale")
    print(f"fithost_scale: {'n/a' if k is None else f'{k:.3f}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
