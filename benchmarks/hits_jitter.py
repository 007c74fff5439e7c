"""How far "the same hit tokens by tier on every turn" can hold: the sim against itself with
one profile constant moved within what the H200 machines measure run to run.

``kvsim compare`` counts the turns whose hit tokens by tier are the same on both backends
(80-84 of 90 on sessions 1-3 of ``configs/agentic-slice.yaml``; two hw runs of one config
agree on 79). Which tier a page sits on when its turn comes back depends on timing: the
eviction that moved it ran before or after another turn released its pages. This replays
the slice with the compare's sim side (refcheck and the loop modelled, step by step) on the
committed calibrated profile, then again with one constant moved (the disk's rates by 5%:
the VM's disk moved by 10% within minutes; the compute call's fixed cost by 20%; the link
by 2%; the loop's fixed time by 20%), and prints each run's agreement with the first, the
turns that differ, its TTFT p90 and the turns whose TTFT moved over 1 s and 2x (with the
other sessions' turns they came back in the other order with: ``kvsim compare``'s races).
No GPU needed (about a minute).

    python3 benchmarks/hits_jitter.py [--sessions 1,2,3] [--traces DIR] [--trace DIR]

``--sessions 10,11,12`` replays the second slice of the saved compares, whose TTFT p90
rests on one race (docs/hw-notes.md, 2026-11-30 05:38 UTC). Last two lines:
``ttft_p90_under_jitter_s: <lowest> - <highest> (unmoved <p90>)`` and
``same_hits_under_jitter_min: <fewest turns the same> of <turns>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _slices import SESSIONS, comma_list, session_slice, slice_config  # noqa: E402  (beside this script)
from kvsim.compare import hits_agreement, replay_sim_side, turn_timing  # noqa: E402
from kvsim.hardware import load_profile  # noqa: E402
from kvsim.run import prepare_run  # noqa: E402

# (section, key, factor)
MOVES = [("nvme", "read", 0.95), ("nvme", "read", 1.05), ("nvme", "write", 0.95), ("nvme", "write", 1.05),
         ("compute", "latency", 0.8), ("compute", "latency", 1.2), ("link", "h2d", 0.98),
         ("loop", "resume", 1.2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", default="1,2,3", help="session file numbers of the slice (default 1,2,3)")
    ap.add_argument("--traces", default=str(SESSIONS), help="the folder of session files")
    ap.add_argument("--trace", help="a folder holding just the slice's session files (instead of the two above)")
    a = ap.parse_args()
    sessions = tuple(comma_list(ap, "--sessions", a.sessions, int))
    cfg = slice_config()
    base = load_profile("h200-pcie-calibrated")
    with tempfile.TemporaryDirectory() as tmp:
        trace = a.trace or str(session_slice(tmp, sessions, a.traces))
        ref = replay_sim_side(prepare_run(cfg, trace, base), [])
        p90_ref = ref.metrics["ttft_s"]["p90"]
        fewest, turns, p90s = None, len(ref.rows), []
        print(f"unmoved: TTFT p90 {p90_ref:.3f} s")
        print("| moved | turns the same | turns that differ | TTFT p90 s | turns over 1 s and 2x apart (order flipped with) |")
        print("| --- | --- | --- | --- | --- |")
        for sec, key, f in MOVES:
            part = getattr(base, sec)
            prof = base.model_copy(update={sec: part.model_copy(update={key: getattr(part, key) * f})})
            res = replay_sim_side(prepare_run(cfg, trace, prof), [])
            h = hits_agreement(res.rows, ref.rows)
            fewest = h["same_hits_by_tier"] if fewest is None else min(fewest, h["same_hits_by_tier"])
            p90s.append(res.metrics["ttft_s"]["p90"])
            apart = "; ".join(f"{x['turn']} {x['ttft_s'][0]:.2f} s (unmoved {x['ttft_s'][1]:.2f})"
                              + (f" ({', '.join(x['flipped'])})" if x["flipped"] else "")
                              for x in turn_timing(res.rows, ref.rows)["apart"])
            print(f"| {sec}.{key} x{f:g} | {h['same_hits_by_tier']} of {h['turns']} | "
                  f"{', '.join(sorted(h['differ'])) or '-'} | {p90s[-1]:.3f} | {apart or '-'} |", flush=True)
    print(f"ttft_p90_under_jitter_s: {min(p90s):.3f} - {max(p90s):.3f} (unmoved {p90_ref:.3f})")
    print(f"same_hits_under_jitter_min: {fewest} of {turns}")


if __name__ == "__main__":
    main()
