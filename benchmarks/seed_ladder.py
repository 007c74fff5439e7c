"""A seed's ladder from a study run over several seeds: each row's mean and spread, each
step's change from the row above paired by seed, and a verdict against the seed's own
numbers (same direction, or different beyond the spread).

    python benchmarks/seed_ladder.py results/study-ssd-options/study.csv --seed 004

``--seed 004`` compares with seed 004's table (FIELD.md section 4: req/s, TTFT p50, p90,
each row on top of the one above; numbers copied here as the seed's, input to nothing).
A step's change is computed per seed (this row over the row above, same seed), then its
mean and [min, max] over the seeds. Verdict: ``same`` when the mean change has the seed's
sign and the [min, max] excludes 0 or the seed's change too; ``same (within spread)``
when the sign agrees but the spread crosses 0; ``opposite`` when the sign differs and
the spread excludes 0; ``within spread`` when it differs but the spread crosses 0. The
last line prints the number of cells that agree as ``name: value``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict

# seed 004 (FIELD.md section 4): each row on top of the one above
SEED_004 = {
    "ladder": ["baseline", "parallel-io", "keep-copy", "write-through"],
    "metrics": {"throughput.requests_per_s": [18.7, 24.8, 27.2, 28.2],
                "ttft_s.p50": [3.43, 3.21, 2.18, 1.46],
                "ttft_s.p90": [42.6, 15.0, 7.7, 3.8]},
}
SEEDS = {"004": SEED_004}


def load(path: str) -> dict[str, dict[int, dict]]:
    """variant -> seed -> row (numbers as floats where they parse)."""
    out: dict[str, dict[int, dict]] = defaultdict(dict)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r.get("status") != "ok":
                continue
            seed = int(r["point"].split("__seed=")[1]) if "__seed=" in r["point"] else 0
            row = {}
            for k, v in r.items():
                try:
                    row[k] = float(v)
                except (TypeError, ValueError):
                    row[k] = v
            out[r["variant"]][seed] = row
    return out


def verdict(seed_change: float, mean: float, lo: float, hi: float) -> str:
    same = (seed_change > 0) == (mean > 0)
    clear = lo > 0 or hi < 0
    if same:
        return "same" if clear else "same (within spread)"
    return "opposite" if clear else "within spread"


def paired_change(runs: dict, prev: dict, m: str) -> tuple[float, float, float]:
    """Metric ``m``'s change from ``prev`` to ``runs``, paired by seed: mean, min, max."""
    ch = [runs[s][m] / prev[s][m] - 1 for s in sorted(runs) if s in prev and prev[s][m]]
    return statistics.fmean(ch), min(ch), max(ch)


def markdown(data: dict, spec: dict, rows: list[str], prev_of: dict) -> None:
    """One line a row: each metric's seed value (step), kvsim's mean [min, max] over the
    seeds and its step paired by seed, mean [min, max], and the verdict."""
    ladder = spec["ladder"]
    names = {"throughput.requests_per_s": "req/s", "ttft_s.p50": "TTFT p50 (s)", "ttft_s.p90": "TTFT p90 (s)"}
    print()
    head = ["row"]
    for m in spec["metrics"]:
        head += [f"seed {names[m]}", f"kvsim {names[m]}", "verdict"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for i, v in enumerate(rows):
        runs = data.get(v, {})
        cells = [v]
        for m, seed_vals in spec["metrics"].items():
            vals = [runs[s][m] for s in sorted(runs)]
            mean = statistics.fmean(vals)
            fmt = (lambda x: f"{x:.4f}") if m.startswith("throughput") else (lambda x: f"{x:.2f}")
            k = f"{fmt(mean)} [{fmt(min(vals))}, {fmt(max(vals))}]"
            sv, vd = "", ""
            if i < len(ladder):
                sv = f"{seed_vals[i]:g}"
            if 0 < i < len(ladder):
                cm, lo, hi = paired_change(runs, data[ladder[i - 1]], m)
                sc = seed_vals[i] / seed_vals[i - 1] - 1
                sv += f" ({sc:+.0%})"
                k += f" ({cm:+.1%} [{lo:+.1%}, {hi:+.1%}])"
                vd = verdict(sc, cm, lo, hi)
            elif v in prev_of:  # a row beside the ladder: its change from the row it replaces
                cm, lo, hi = paired_change(runs, data[prev_of[v]], m)
                k += f" (vs {prev_of[v]}: {cm:+.1%} [{lo:+.1%}, {hi:+.1%}])"
            cells += [sv, k, vd]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--seed", default="004", choices=sorted(SEEDS))
    ap.add_argument("--rows", default="", help="extra variants to print, comma separated; "
                    "name:prev also gives its change from variant prev, paired by seed")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the ladder as a markdown table (docs/studies.md's)")
    a = ap.parse_args(argv)
    data = load(a.csv)
    spec = SEEDS[a.seed]
    ladder = spec["ladder"]
    missing = [v for v in ladder if v not in data]
    if missing:
        print(f"{a.csv}: no variant {', '.join(missing)} (has {', '.join(sorted(data))})", file=sys.stderr)
        return 2
    extra, prev_of = [], {}
    for v in a.rows.split(","):
        if v:
            name, _, prev = v.partition(":")  # name:prev compares it with prev, paired by seed
            extra.append(name)
            if prev:
                prev_of[name] = prev
    agree = cells = 0
    for m, seed_vals in spec["metrics"].items():
        print(f"\n{m}")
        print(f"{'row':<22} {'seed':>8} {'seed step':>10} {'kvsim mean [min, max]':>28} "
              f"{'kvsim step mean [min, max]':>32}  verdict")
        for i, v in enumerate(ladder + extra):
            runs = data.get(v, {})
            vals = [runs[s][m] for s in sorted(runs)]
            mean = statistics.fmean(vals)
            cell = f"{mean:.4g} [{min(vals):.4g}, {max(vals):.4g}]"
            step = vd = ""
            sv = seed_step = ""
            if i < len(ladder):
                sv = f"{seed_vals[i]:.4g}"
            if 0 < i < len(ladder):
                cm, lo, hi = paired_change(runs, data[ladder[i - 1]], m)
                step = f"{cm:+.1%} [{lo:+.1%}, {hi:+.1%}]"
                sc = seed_vals[i] / seed_vals[i - 1] - 1
                seed_step = f"{sc:+.0%}"
                vd = verdict(sc, cm, lo, hi)
                cells += 1
                agree += vd.startswith("same")
            print(f"{v:<22} {sv:>8} {seed_step:>10} {cell:>28} {step:>32}  {vd}")
    if a.markdown:
        markdown(data, spec, ladder + extra, prev_of)
    print(f"\nseeds: {len(next(iter(data.values())))}")
    print(f"cells_same_direction: {agree}/{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
