"""The hw-loop model's ``step`` terms (``kvsim.tools.hwloop.StepCost``) from hw replays'
compute logs.

A hw compute log (``kvsim_backends.hw.logs``) times each step between two events on the
compute stream and logs the stream's idle GPU time before it (the gap). On the H200
replays of the agentic slice every step starts on an idle stream (no gap under 20 us):
the loop waits to see a step end, does its host work, then records the next step's start
event and launches its kernels. So:

- ``gap``: the mean gap before the ordinary steps (below ``ORDINARY_GAP_S``: longer ones
  are the loop's holds, which the ``resume`` terms model, or a wait for work);
- the overrun: an ordinary memory-bound step's GPU time beyond nominal, fitted by least
  squares as ``a + b x read seconds`` (its nominal seconds not in GEMMs), kept as
  ``overrun_rate`` = b and ``overrun_after`` = -a / b (no overrun below it).

What the logs show it is not: a clock or power ramp after idle. The overrun rises with the
gap up to ~150 us and falls after longer gaps (a step after an idle of a millisecond or
more runs about as long as one after 60-80 us), and at a given gap it grows with the
step's read seconds but not with its GEMM seconds. What it is, as far as these logs go:
the time between the start event and the step's kernels, which the events include
because the start event is recorded on an idle stream before the loop launches them (the
GEMM calls, then the read kernels' graphs); the gap and the loop's host lag grow together
with it (a slow loop thread launches slowly). The logs hold no per-step launch times to
split it further. An ordinary step: gap under ``ORDINARY_GAP_S``, GEMMs under half its
nominal seconds, within ``ORDINARY_OVER_S`` of nominal (longer: a held refcheck's step,
``refcheck.holds_sms``). A step's GEMM seconds: ``kvsim.tools.fitboost.steps_of``.

``python -m kvsim.tools.fitgap OUT [OUT ...] [--hold-out]``: OUT a ``kvsim compare``
output folder; prints the terms, the overrun by gap, and with ``--hold-out`` each run's
ordinary steps' overrun predicted from the terms fitted on the others.
"""

from __future__ import annotations

import sys
from typing import Sequence

from kvsim.tools.fitboost import Step, load_run

ORDINARY_GAP_S = 300e-6  # a longer gap: a hold or a wait for work, not the loop's step
ORDINARY_OVER_S = 1e-3  # a step further from nominal: a held check's, not ordinary
GAP_BINS_S = (0.0, 60e-6, 80e-6, 100e-6, 150e-6, 300e-6, 1e-3, float("inf"))

Ordinary = tuple[float, float, float]  # (gap s, read s, overrun s)


def with_gaps(steps: Sequence[Step]) -> list[tuple[float, Step]]:
    """Each step but the first with the GPU's idle time before it (its start minus the
    previous step's end)."""
    return [(s[0] - (p[0] + p[2]), s) for p, s in zip(steps, steps[1:])]


def ordinary(steps: Sequence[Step]) -> list[Ordinary]:
    """(gap, read seconds, overrun) of the ordinary memory-bound steps (the docstring)."""
    out = []
    for gap, (_, nominal, took, gemm) in with_gaps(steps):
        over = took - nominal
        if 0.0 <= gap < ORDINARY_GAP_S and gemm < 0.5 * nominal and abs(over) < ORDINARY_OVER_S:
            out.append((gap, nominal - gemm, over))
    return out


def fit(runs: Sequence[Sequence[Ordinary]]) -> dict:
    """The ``step`` terms (gap, overrun_rate, overrun_after, in seconds) of the ordinary
    steps of ``runs``; the overrun by least squares on read seconds (none if it does not
    grow with them)."""
    rows = [r for run in runs for r in run]
    if len(rows) < 2:
        raise ValueError("fitgap: fewer than 2 ordinary steps")
    n = len(rows)
    mx = sum(r[1] for r in rows) / n
    my = sum(r[2] for r in rows) / n
    sxx = sum((r[1] - mx) ** 2 for r in rows)
    b = sum((r[1] - mx) * (r[2] - my) for r in rows) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    rate, after = (b, max(0.0, -a / b)) if b > 0 else (0.0, 0.0)
    return {"gap": sum(r[0] for r in rows) / n, "overrun_rate": rate, "overrun_after": after}


def overrun(rows: Sequence[Ordinary], terms: dict) -> float:
    """The summed overrun the terms give ``rows``."""
    return sum(terms["overrun_rate"] * max(0.0, r[1] - terms["overrun_after"]) for r in rows)


def by_gap(rows: Sequence[Ordinary]) -> list[tuple[float, float, int, float, float]]:
    """(gap from, to, steps, median overrun, summed overrun) for each of ``GAP_BINS_S``
    that holds a step of ``rows``."""
    out = []
    for lo, hi in zip(GAP_BINS_S, GAP_BINS_S[1:]):
        o = sorted(r[2] for r in rows if lo <= r[0] < hi)
        if o:
            out.append((lo, hi, len(o), o[len(o) // 2], sum(o)))
    return out


def main(argv: Sequence[str]) -> int:
    hold = "--hold-out" in argv
    folders = [a for a in argv if a != "--hold-out"]
    if not folders:
        print("usage: python -m kvsim.tools.fitgap OUT [OUT ...] [--hold-out]", file=sys.stderr)
        return 2
    try:
        runs = [ordinary(load_run(f)) for f in folders]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t = fit(runs)
    print(f"step: gap {t['gap'] * 1e6:.2f} us, overrun_rate {t['overrun_rate']:.5f}, "
          f"overrun_after {t['overrun_after'] * 1e3:.4f} ms")
    for f, rows in zip(folders, runs):
        print(f"{f}: {len(rows)} ordinary steps, overrun {sum(r[2] for r in rows):+.3f} s, "
              f"the terms {overrun(rows, t):+.3f} s; by gap (us: steps, median us, sum s):")
        for lo, hi, k, med, tot in by_gap(rows):
            print(f"  {lo * 1e6:.0f}-{hi * 1e6:.0f}: {k}, {med * 1e6:+.1f}, {tot:+.3f}")
    if hold and len(runs) > 1:
        for i, f in enumerate(folders):
            ti = fit([r for j, r in enumerate(runs) if j != i])
            print(f"{f} held out: gap {ti['gap'] * 1e6:.2f} us, rate {ti['overrun_rate']:.5f}, "
                  f"after {ti['overrun_after'] * 1e3:.4f} ms: overrun {overrun(runs[i], ti):+.3f} s "
                  f"against {sum(r[2] for r in runs[i]):+.3f} s")
    print(f"fitgap_gap_us: {t['gap'] * 1e6:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
