"""How far the GPU repeats itself, beside how far the sim predicts it: saved ``kvsim compare``
runs of one slice, each hw side against every other (``kvsim diff``'s comparison), and each
run's sim side against its hw side, on the same measures: TTFT p50 and p90, hit tokens by
tier, and the turns that found the same hit tokens by tier. No GPU needed (it reads
``docs/runs``).

hw against hw is the floor under any prediction of a single run: a sim that differs from
hw by no more than hw differs from itself has nothing left to fit on that measure.

    python3 benchmarks/hw_repeat.py [RUN_DIR ...] [--resim [--traces DIR]]

Default: the runs of sessions 1-3 on the committed profile with the current hw backend
(the one of 2026-11-30 04:56 UTC on: the fill kernel in parts, the GIL switch interval),
three of them on one machine back to back (07:32-07:49 UTC). Each RUN_DIR holds a
compare's ``sim/`` and ``hw/``. ``--resim``: the sim side replayed again with this
checkout's code and the config's profile (the committed one; session files from
``--traces``), so that a change to the model is judged against hw's own spread; without
it, each run's saved ``sim/`` (the model of its day). Last two lines: ``hw_vs_hw: ...``
and ``sim_vs_hw: ...``, each the range over its pairs of |TTFT p50 diff|, |TTFT p90 diff|,
|host hit tokens diff| and the turns the same of all.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _slices import SESSIONS, session_slice, slice_config  # noqa: E402  (beside this script)
from kvsim.compare import compare_saved, diff_runs  # noqa: E402
from kvsim.run import write_results  # noqa: E402

RUNS = ROOT / "docs" / "runs"
DEFAULT = [RUNS / f"h200-agentic-slice-sessions-1-3-{n}" for n in
           ("loop-disk-2026-11-30-0559", "repeat-2026-11-30-0732", "repeat-2026-11-30-0738",
            "repeat-2026-11-30-0744")]
KEYS = ("ttft_p50_s", "ttft_p90_s", "hit_tokens_gpu", "hit_tokens_host", "hit_tokens_disk")


def pair(a: Path, b: Path) -> dict:
    """``a`` against ``b`` (the reference): each measure's relative difference, the turns
    the same."""
    r = diff_runs(a, b)
    out = {k: r["metrics"][k]["rel_err"] for k in KEYS}
    out["same"], out["turns"] = r["turns"]["same_hits_by_tier"], r["turns"]["turns"]
    out["b_p90"] = r["metrics"]["ttft_p90_s"]["b"]
    return out


def pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x * 100:+6.1f}%"


def row(name: str, p: dict) -> str:
    return (f"{name:34s} {pct(p['ttft_p50_s'])} {pct(p['ttft_p90_s'])}  "
            + " ".join(pct(p[k]) for k in KEYS[2:]) + f"  {p['same']:3d} of {p['turns']}")


def summary(label: str, ps: list[dict]) -> str:
    def span(k):
        v = [abs(p[k]) * 100 for p in ps if p[k] is not None]
        return f"{min(v):.1f}-{max(v):.1f}%" if v else "n/a"
    same = [p["same"] for p in ps]
    return (f"{label}: {len(ps)} pairs; |TTFT p50 diff| {span('ttft_p50_s')}, |TTFT p90 diff| "
            f"{span('ttft_p90_s')}, |host hits diff| {span('hit_tokens_host')}, turns the same "
            f"{min(same)}-{max(same)} of {ps[0]['turns']}")


def resimulate(runs: list[Path], tmp: Path, traces: str) -> list[Path]:
    """Each run's sim side replayed again as ``kvsim compare --hw-from RUN`` would, on the
    session files its hw side replayed; the results written under ``tmp``."""
    out = []
    for i, r in enumerate(runs):
        with open(r / "hw" / "requests.csv", newline="") as f:
            names = sorted({row["session"] for row in csv.DictReader(f)})
        try:
            sessions = [int(n.rsplit("_", 1)[1]) for n in names]
        except (IndexError, ValueError):
            raise SystemExit(f"{r}/hw/requests.csv: sessions {names}; --resim expects the agentic "
                             f"session files' names (trace_NNNN)") from None
        trace = session_slice(tmp, sessions, traces)
        _, sim = compare_saved(slice_config(), r, str(trace))
        out.append(write_results(sim, tmp / f"run{i}", plots=False))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT,
                    help="saved compare folders (each with sim/ and hw/)")
    ap.add_argument("--resim", action="store_true", help="replay the sim side again with this "
                    "checkout's code and the config's profile instead of reading each run's sim/")
    ap.add_argument("--traces", default=str(SESSIONS), help="with --resim: the session files")
    a = ap.parse_args(argv)
    if len(a.runs) < 2:
        ap.error(f"got {len(a.runs)} run folder(s); expected at least 2 (hw against hw needs a pair)")
    for r in a.runs:
        for side in ("sim", "hw"):
            if not (r / side).is_dir():
                ap.error(f"{r}: no {side}/ folder; expected a saved `kvsim compare` output")
    head = (f"{'':34s} {'p50':>7s} {'p90':>7s}  {'gpu':>7s} {'host':>7s} {'disk':>7s}  same turns")
    with tempfile.TemporaryDirectory() as tmp:
        sims = resimulate(a.runs, Path(tmp), a.traces) if a.resim else [r / "sim" for r in a.runs]
        print(f"sim ({'replayed now' if a.resim else 'as saved'}) against each run's hw "
              f"(rel diff = (sim - hw) / hw):")
        print(head)
        sim_hw = []
        for r, s in zip(a.runs, sims):
            p = pair(s, r / "hw")
            sim_hw.append(p)
            print(row(r.name[-30:], p) + f"   (hw p90 {p['b_p90']:.3f} s)")
    print("\nhw against hw (a against b: (a - b) / b):")
    print(head)
    hw_hw = []
    for x, y in itertools.combinations(a.runs, 2):
        p = pair(x / "hw", y / "hw")
        hw_hw.append(p)
        print(row(f"{x.name[-4:]} vs {y.name[-4:]}", p))
    print()
    print(summary("hw_vs_hw", hw_hw))
    print(summary("sim_vs_hw", sim_hw))


if __name__ == "__main__":
    main()
