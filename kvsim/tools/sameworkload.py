"""Whether two replays are of one workload: what ``kvsim diff`` and ``kvsim compare
--hw-from`` check before they set figures side by side (pure: the rows and configs only)."""

from __future__ import annotations

from pathlib import Path

from kvsim.config.keypaths import ABSENT, config_diff

#: the top-level keys, beside ``workload``, that decide what a replay's requests are and
#: what computes them: a hw run re-predicted by the sim must have run the same
REPLAY_KEYS = ("seed", "model", "tp", "kv_dtype")


def one_workload(ra: list, rb: list, a: str | Path, b: str | Path) -> None:
    """ValueError unless two runs' ``requests.csv`` rows are of one workload: some turn (by
    session and turn) in both, and every such turn with the same input tokens in both (a
    run of fewer sessions or turns than the other is still of its workload)."""
    tokens = {(str(r.session), str(r.turn)): getattr(r, "input_tokens", None) for r in ra}
    shared = 0
    for r in rb:
        key = (str(r.session), str(r.turn))
        if key not in tokens:
            continue
        shared += 1
        x, y = tokens[key], getattr(r, "input_tokens", None)
        if x is not None and y is not None and x != y:
            raise ValueError(f"{a} and {b}: session {key[0]} turn {key[1]} has {x} input tokens in one "
                             f"and {y} in the other; expected two runs of one workload")
    if not shared:
        raise ValueError(f"{a} and {b}: no turn (by session and turn) is in both; expected two "
                         "runs of one workload")


def replay_diffs(a: dict, b: dict, where_a: str = "there", where_b: str = "here") -> str:
    """What differs between two resolved configs in what decides a replay's requests and
    what computes them (``REPLAY_KEYS`` and ``workload``, its ``path`` aside: the trace
    may lie elsewhere), as ``key A where_a, B where_b`` (at most four, then a count); ''
    where nothing does. Keys one of them lacks (a run saved before they existed) are not
    compared."""
    keys = [k for k in (*REPLAY_KEYS, "workload") if k in a and k in b]
    diffs = [f"{k} {x!r} {where_a}, {y!r} {where_b}" for k, x, y in sorted(config_diff(
        {k: a[k] for k in keys}, {k: b[k] for k in keys}, skip=()), key=lambda d: d[0])
        if k != "workload.path" and x is not ABSENT and y is not ABSENT]
    more = f"; and {len(diffs) - 4} more" if len(diffs) > 4 else ""
    return f"{'; '.join(diffs[:4])}{more}" if diffs else ""


def same_replay(now: dict, saved: dict, folder: str | Path) -> None:
    """ValueError unless ``saved`` (a hw run's resolved config) replayed what ``now`` (the
    config to re-predict it with, resolved) replays (``replay_diffs``); the hardware
    profile, the tiers and the engine may differ (what a re-prediction varies)."""
    diffs = replay_diffs(saved, now)
    if diffs:
        raise ValueError(f"--hw-from {folder}: its hw run replayed another workload or model: "
                         f"{diffs}; expected the config it ran (the same --set)")
