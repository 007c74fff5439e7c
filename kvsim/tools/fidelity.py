"""The fidelity standard, applied: is a sim prediction no further from a hw run than hw runs
of the same config are from each other (``kvsim fidelity``)?

kvsim's standard for the sim against the GPU: on a workload, the sim is no further from a hw
run than two hw runs of the same config are from each other, or within 10% on TTFT p50 and
p90 and 5% on bytes moved. ``judge`` applies it figure by figure to a compare's two sides
(its ``sim/`` and ``hw/`` summaries) and any number of further hw runs of the same config:

- the figures: TTFT p50 and p90 (tolerance 10%) and the bytes moved each way (host -> GPU,
  GPU -> host, disk read, disk write: 5%), node-wide and, for a node of several ranks,
  rank by rank;
- a figure's error: (sim - hw) / hw; hw's own spread: the largest |(other - hw) / hw| over
  the other hw runs (none: 0);
- within: |error| <= max(tolerance, spread). A figure whose hw value is 0 is within only
  where the sim's is 0 too, or another hw run's is not (hw itself then has no scale).

Invariants: pure (summaries in, rows out); the runs' rank counts must agree (a ValueError
naming the runs otherwise); rows come in a fixed order (node-wide first, then each rank).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from kvsim.tools.rankcmp import rank_headline, rel_err

TTFT_TOL, BYTES_TOL = 0.10, 0.05


def figures(m: dict) -> dict[str, tuple[float | None, float]]:
    """The judged figures of a ``metrics`` dict (summary.json's, or one of its ``ranks``):
    those ``kvsim compare`` puts rank by rank (``rankcmp.rank_headline``) but requests/s,
    name -> (value, tolerance)."""
    return {k: (v, BYTES_TOL if k.startswith("bytes_") else TTFT_TOL)
            for k, v in rank_headline(m).items() if k != "requests_per_s"}


def _scopes(m: dict) -> list[tuple[str, dict]]:
    return [("node", m)] + [(f"rank {i}", r) for i, r in enumerate(m.get("ranks") or [])]


def judge(sim: dict, hw: dict, others: Sequence[dict], names: Sequence[str] = ()) -> list[dict]:
    """Rows (``scope``, ``figure``, ``sim``, ``hw``, ``err``, ``spread``, ``tol``, ``within``)
    for the ``metrics`` of the sim, the hw run it was compared with and the ``others`` (hw
    runs of the same config); ``names`` label the runs in errors (sim, hw, others...)."""
    label = list(names) or ["sim", "hw", *(f"hw run {i + 2}" for i in range(len(others)))]
    runs = [sim, hw, *others]
    counts = [len(m.get("ranks") or []) or 1 for m in runs]
    if len(set(counts)) > 1:
        raise ValueError("fidelity: the runs have different rank counts: "
                         + ", ".join(f"{n} {c}" for n, c in zip(label, counts)))
    rows = []
    scoped = [_scopes(m) for m in runs]
    for i, (scope, hm) in enumerate(scoped[1]):
        ref = figures(hm)
        got = figures(scoped[0][i][1])
        alts = [figures(s[i][1]) for s in scoped[2:]]
        for name, (h, tol) in ref.items():
            s = got[name][0]
            if h is None or s is None:
                continue
            e = rel_err(s, h)
            spreads = [rel_err(a[name][0], h) for a in alts if a[name][0] is not None]
            if h == 0:  # no scale: within where the sim agrees or hw itself moves off 0
                ok = s == 0 or any(x is None for x in spreads)
                spread = None if any(x is None for x in spreads) else 0.0
            else:
                spread = max((abs(x) for x in spreads if x is not None), default=0.0)
                ok = e is not None and abs(e) <= max(tol, spread)
            rows.append({"scope": scope, "figure": name, "sim": s, "hw": h, "err": e,
                         "spread": spread, "tol": tol, "within": ok})
    return rows


def load_metrics(folder: str | Path, side: str = "hw", own: bool = True) -> dict:
    """A ``side`` run's ``metrics`` (``load_run``)."""
    return load_run(folder, side, own)[1]["metrics"]


def same_config(hw: tuple[Path, dict], others: Sequence[tuple[Path, dict]]) -> None:
    """ValueError unless every other hw run (``load_run``'s answers) replayed what the
    compared one did: the same workload, seed, model, tp and kv_dtype
    (kvsim.tools.sameworkload; the profile may differ: each machine's calibration). A run
    of another workload is no measure of how far hw repeats itself."""
    from kvsim.tools.sameworkload import replay_diffs

    for path, data in others:
        diffs = replay_diffs(data.get("config") or {}, hw[1].get("config") or {}, "in it",
                             "in the compared one")
        if diffs:
            raise ValueError(f"{path}: not a hw run of the compared config ({hw[0]}): {diffs}; "
                             "expected further hw runs of the same workload and model")


def load_run(folder: str | Path, side: str = "hw", own: bool = True) -> tuple[Path, dict]:
    """A ``side`` ('sim' or 'hw') run's summary (its path and data): ``folder`` a results folder (its
    ``summary.json``; only where ``own``) or a compare's folder (its ``side``/``summary.json``;
    a ``--hw-from`` compare's hw side is the folder its ``compare.json`` names). A summary
    that records another backend than ``side`` is refused (a sim run is no hw run)."""
    f = Path(folder)
    where = ([f / "summary.json"] if own else []) + [f / side / "summary.json"]
    if side == "hw" and not where[-1].is_file() and (f / "compare.json").is_file():
        try:
            src = json.loads((f / "compare.json").read_text()).get("hw_from")
        except ValueError:
            src = None
        if src:
            where.append(Path(src) / "hw" / "summary.json")
    for p in where:
        if p.is_file():
            try:
                data = json.loads(p.read_text())
                m = data["metrics"]
                m["ttft_s"]["p50"], m["ttft_s"]["p90"], m["throughput"]["requests_per_s"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{p}: not a kvsim summary (metrics.ttft_s, metrics.throughput: "
                                 f"missing {e})") from None
            backend = data.get("backend")
            if backend is not None and backend != side:
                raise ValueError(f"{p}: a run on the {backend} backend; expected a {side} run")
            return p, data
    if own:
        raise ValueError(f"{folder}: expected a results folder (summary.json) or a compare's "
                         f"folder ({side}/summary.json)")
    raise ValueError(f"{folder}: expected a kvsim compare folder ({side}/summary.json)")


LABELS = {"ttft_p50_s": "TTFT p50 s", "ttft_p90_s": "TTFT p90 s", "bytes_host_to_gpu": "host->gpu GB",
          "bytes_gpu_to_host": "gpu->host GB", "bytes_disk_read": "disk read GB",
          "bytes_disk_write": "disk write GB"}


def table(rows: list[dict]):
    """``judge``'s rows as a rich table (bytes in GB, 1e9)."""
    from rich.table import Table  # noqa: PLC0415

    t = Table(title="fidelity: the sim against hw, beside hw against itself")
    for c in ("scope", "figure", "sim", "hw", "sim err", "hw spread", "tol", "within"):
        t.add_column(c, justify="left" if c in ("scope", "figure") else "right")

    def val(k: str, v: float) -> str:
        return f"{v / 1e9:.3f}" if k.startswith("bytes_") else f"{v:.4g}"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:+.1f}%"
    for r in rows:
        k = r["figure"]
        t.add_row(r["scope"], LABELS.get(k, k), val(k, r["sim"]), val(k, r["hw"]), pct(r["err"]),
                  "-" if r["spread"] is None else f"{r['spread'] * 100:.1f}%",
                  f"{r['tol'] * 100:.0f}%", "yes" if r["within"] else "NO")
    return t
