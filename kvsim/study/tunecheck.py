"""What a tune's first trials tell about its file: a misspelt metric or a split the
workload cannot have fails every trial alike, so the tune stops at the first such trial
(StudyFileError: exit 2, naming the file and the key) rather than spend its budget on
failures. Pure: a trial's payload (kvsim.study.execute.run_point's answer) in."""

from __future__ import annotations

from pathlib import Path

from kvsim.study.definition import StudyFileError, TuneSpec, missing_metric


def stop_if_the_file_is_wrong(spec: TuneSpec, path: str, folder: Path, payload: dict) -> None:
    """StudyFileError where ``payload`` shows the tune file wrong for every trial: a metric
    of the objective or constraints its summary lacks, or a split of a workload of too few
    sessions."""
    keep = (f"(the tune stopped; its folder {folder} holds its storage: give the corrected "
            "tune another --out)")
    if "metrics" in payload:
        bad = [w for w in (missing_metric([payload["metrics"]], m) for m in
                           (*spec.objective.weights, *(c.metric for c in spec.constraints))) if w]
        if bad:
            raise StudyFileError(f"{path}: objective or constraints: {'; '.join(bad)} {keep}")
    if "split_error" in payload and spec.split is not None:
        raise StudyFileError(f"{path}: split: {payload['split_error']}; expected a workload of "
                             f"at least 2 sessions to split, or split: null {keep}")
