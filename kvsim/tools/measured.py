"""What ``kvsim calibrate`` measures, as data: ``Measured`` (filled by
``kvsim_backends.hw.microbench``, read back from a saved report by ``read_report`` and
``measured_from_report``)
and ``batch``, the one-batch transfer both the measurement and the fit check replay. Kept
apart from ``kvsim.tools.fit`` so that the hw backend's measurement needs nothing of the fit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvsim.core.plan import Batch, BatchKind


@dataclass
class Measured:
    device: str
    copies: list[dict] = field(default_factory=list)   # page, path, dir, pages, bytes, seconds
    ctas: list[dict] = field(default_factory=list)
    disk: list[dict] = field(default_factory=list)
    host_fill_Bps: float | None = None
    compute: dict = field(default_factory=dict)
    small: list[dict] = field(default_factory=list)    # page, path, dir, pages, seconds, call_s
    # the profile's nvme.queue_depth and nvme.piece, which the hw backend runs its disk at:
    # the fit takes the disk cells measured at them (None: the best cells)
    disk_setting: dict | None = None
    # compute with copies, per kind of work (kvsim_backends.hw.interfere's rows)
    interference: list[dict] = field(default_factory=list)
    # the copy engine one way under a prefill (interfere's rows of its ``busy_grid``)
    busy_copies: list[dict] = field(default_factory=list)
    # the host fill per backing on a GPU (kvsim_backends.hw.driverprobe.fill_probed's
    # rows: rate, probe blocked share, seconds in cudaHostRegister) and an executor
    # call's host time (``call_s``): the driver's lock as the profile's ``driver`` models it
    host_fills: dict[str, dict] = field(default_factory=dict)
    driver_call_s: float | None = None
    # the page cache in front of the disk folder (kvsim_backends.hw.pagecacheprobe's
    # ``measure_for_calibrate``: limits, phases, or why it was skipped); None: not measured
    page_cache: dict | None = None
    # two ranks' steps on one GPU (kvsim_backends.hw.rankshareprobe's
    # ``measure_for_calibrate``: rows, or why it was skipped); None: not measured
    rank_share: dict | None = None


#: what a saved report must hold to be refitted (the rest defaults: not measured)
REPORT_NEEDS = {"device": str, "date": str, "base": str, "copies": list}
#: the sections ``measured_from_report`` reads, and the kind of value each is
REPORT_SECTIONS = {"ctas": list, "disk": list, "compute": dict, "small": list, "interference": list,
                   "busy_copies": list, "host_fills": dict, "out_of_sample": list}


def read_report(path: str | Path) -> dict:
    """A saved ``.report.json`` of ``kvsim calibrate``, checked before anything is fitted or
    written: ValueError naming the file and what is wrong (unreadable, not JSON, not a JSON
    object, a needed key missing or a section of another kind)."""
    p = Path(path)
    want = "a calibrate report (the NAME.yaml.report.json kvsim calibrate writes)"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"--from-report {p}: cannot read it ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"--from-report {p}: not UTF-8 text; expected {want}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--from-report {p}: not JSON ({e.msg}, line {e.lineno} column {e.colno}: "
                         f"cut short?); expected {want}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--from-report {p}: a JSON {type(data).__name__}; expected {want}")
    kinds = {str: "text", list: "a list", dict: "a mapping"}
    bad = [f"{k} ({'missing' if k not in data else 'not ' + kinds[t]})" for k, t in REPORT_NEEDS.items()
           if not isinstance(data.get(k), t)]
    bad += [f"{k} (not {kinds[t]})" for k, t in REPORT_SECTIONS.items()
            if data.get(k) is not None and not isinstance(data[k], t)]
    if bad:
        raise ValueError(f"--from-report {p}: {', '.join(bad)}; expected {want}")
    return data


def measured_from_report(report: dict) -> Measured:
    """The measurements a saved ``.report.json`` holds (nothing fitted)."""
    return Measured(device=report["device"], copies=list(report["copies"]), ctas=list(report.get("ctas", [])),
                    disk=list(report.get("disk", [])), host_fill_Bps=report.get("host_fill_Bps"),
                    compute=dict(report.get("compute", {})), small=list(report.get("small", [])),
                    disk_setting=report.get("disk_setting"),
                    interference=list(report.get("interference", [])),
                    busy_copies=list(report.get("busy_copies", [])),
                    host_fills=dict(report.get("host_fills", {})),
                    driver_call_s=report.get("driver_call_s"),
                    page_cache=report.get("page_cache"), rank_share=report.get("rank_share"))


def batch(src, dst, ss, ds, pb) -> Batch:
    """A batch of pages of ``pb`` bytes from slots ``ss`` of ``src`` to ``ds`` of ``dst``."""
    ss, ds = np.asarray(ss, np.int64), np.asarray(ds, np.int64)
    return Batch(BatchKind.EVICT, src, dst, ss, ds, np.zeros(len(ss), np.uint64), pb, 0)
