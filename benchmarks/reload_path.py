"""Seed 000's reload comparison, paired: the TTFT of each turn that reloads a host-resident
prefix, with the copy engine against the SM copy kernel, turn by turn.

    python benchmarks/reload_path.py [STUDY_FOLDER]

Reads the points of ``studies/copy-path-c2c.yaml``'s run (default
``results/study-copy-path-c2c``: ``kvsim study studies/copy-path-c2c.yaml`` writes it):
for each model (``8b``, ``70b``) its ``-copy-engine`` and ``-sm-kernel`` points'
``requests.csv``. A turn is paired by (session, turn) when it found part of its prefix on
host (``hit_host`` > 0) in both runs and queued in neither (``queue_s`` under 1 ms), so
the difference is its reload, not a wait for the other session. Prints each model's
pairs: host tokens, TTFT medians, the copy engine's extra TTFT (median and range, in ms
and %), then the 8B median difference last as ``reload_ttft_delta_ms_8b: value``. The
seed: a 393K-token host-resident prefix (~13 GB a rank) reloads ~0.19 s (~9%) slower
with the copy engine.
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path


def rows(path: Path) -> dict[tuple[str, str], dict]:
    with open(path, newline="") as f:
        return {(r["session"], r["turn"]): r for r in csv.DictReader(f)}


def reloads(rs: dict) -> dict:
    out = {}
    for k, r in rs.items():
        if not r["ttft_s"] or int(r["hit_host"]) <= 0:
            continue
        if float(r["queue_s"] or 0) >= 1e-3:
            continue
        out[k] = r
    return out


def main(argv: list[str]) -> int:
    folder = Path(argv[0] if argv else "results/study-copy-path-c2c")
    pts = folder / "points"
    if not pts.is_dir():
        print(f"{folder}: no points/ (run: kvsim study studies/copy-path-c2c.yaml --out {folder})",
              file=sys.stderr)
        return 2
    delta_8b = None
    for model in ("8b", "70b"):
        ce_f, sm_f = pts / f"{model}-copy-engine" / "requests.csv", pts / f"{model}-sm-kernel" / "requests.csv"
        if not (ce_f.exists() and sm_f.exists()):
            print(f"{model}: points missing", file=sys.stderr)
            continue
        ce, sm = reloads(rows(ce_f)), reloads(rows(sm_f))
        keys = sorted(set(ce) & set(sm))
        if not keys:
            print(f"{model}: no turn reloads from host unqueued in both runs")
            continue
        d = [float(ce[k]["ttft_s"]) - float(sm[k]["ttft_s"]) for k in keys]
        rel = [float(ce[k]["ttft_s"]) / float(sm[k]["ttft_s"]) - 1 for k in keys]
        host = statistics.median(int(ce[k]["hit_host"]) for k in keys)
        print(f"{model}: {len(keys)} paired reload turns, median {host:,.0f} host tokens; TTFT median "
              f"copy engine {statistics.median(float(ce[k]['ttft_s']) for k in keys):.3f} s, kernel "
              f"{statistics.median(float(sm[k]['ttft_s']) for k in keys):.3f} s; copy engine extra "
              f"{statistics.median(d) * 1e3:+.1f} ms [{min(d) * 1e3:+.1f}, {max(d) * 1e3:+.1f}], "
              f"{statistics.median(rel):+.1%} [{min(rel):+.1%}, {max(rel):+.1%}]")
        if model == "8b":
            delta_8b = statistics.median(d) * 1e3
    if delta_8b is None:
        return 1
    print(f"reload_ttft_delta_ms_8b: {delta_8b:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
