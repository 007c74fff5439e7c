"""What a tune's first trials tell about its file: a misspelt metric or a split the
workload cannot have fails every trial alike, so the tune stops at the first such trial
(``TuneStopped``, a StudyFileError: exit 2, naming the file and the key) rather than
spend its budget on failures; ``kvsim.study.tune.run_tune`` then removes what the tune
wrote, where it wrote it into a folder of its own. Pure: a trial's payload
(kvsim.study.execute.run_point's answer) in."""

from __future__ import annotations

from pathlib import Path

from kvsim.study.definition import StudyFileError, TuneSpec, missing_metric


class TuneStopped(StudyFileError):
    """A tune file wrong for every trial, found at a trial's answer."""


def stop_if_the_file_is_wrong(spec: TuneSpec, path: str, payload: dict) -> None:
    """TuneStopped where ``payload`` shows the tune file wrong for every trial: a metric
    of the objective or constraints its summary lacks, or a split of a workload of too few
    sessions."""
    if "metrics" in payload:
        bad = [w for w in (missing_metric([payload["metrics"]], m) for m in
                           (*spec.objective.weights, *(c.metric for c in spec.constraints))) if w]
        if bad:
            raise TuneStopped(f"{path}: objective or constraints: {'; '.join(bad)}")
    if "split_error" in payload and spec.split is not None:
        raise TuneStopped(f"{path}: split: {payload['split_error']}; expected a workload of "
                          "at least 2 sessions to split, or split: null")


def stopped(e: TuneStopped, cleared: bool, folder: Path, storage: str | None) -> StudyFileError:
    """The error a stopped tune exits with: what it left, and where to go on from."""
    if storage:
        left = (f"its trials stay in --storage {storage} under the tune's name: give the "
                "corrected tune another storage or name")
    elif cleared:
        left = "nothing of it was kept"
    else:
        left = f"its folder {folder} holds its storage: give the corrected tune another --out"
    return StudyFileError(f"{e} (the tune stopped; {left})")
