"""``kvsim calibrate`` measures how two ranks' kernels on one GPU overlap
(``kvsim_backends.hw.rankshareprobe``) and fits the profile's ``gpu.kernel_overlap``
(``kvsim.tools.fitoverlap``): the pure fit on hand-made cells, the probe's cell loop on a
stand-in GPU, CPU mode keeping the base's value and saying why, and ``--from-report``
refitting it from a report that holds the cells (the H200's 0.1 ms cells of 2026-12-03
11:43, ``tests/fixtures/h200-rank-share-2026-12-03.json``)."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuskip import have_gpu
from kvsim.config.hardware import load_profile
from kvsim.tools.calibrate import calibrate, refit
from kvsim.tools.fitoverlap import fit_kernel_overlap, fit_overlap, kernel_overlap
from kvsim_backends.hw import rankshareprobe as probe

FIXTURE = Path(__file__).parent / "fixtures" / "h200-rank-share-2026-12-03.json"


def cell(rank: str, other: str, k: float, ko: float, overlap: float, chunk: float = 0.1) -> dict:
    """A cell whose kernels of ``k`` us each waited the other's ``ko`` less ``overlap``."""
    return {"chunk_ms": chunk, "rank": rank, "other": other, "kernel_us": k, "other_kernel_us": ko,
            "stretch": (k + ko - overlap) / k}


def test_the_fit_is_the_median_cell_overlap():
    """Four cells: each one's overlap, k_o - (stretch - 1) x k, is the one it was built with;
    the fit is the median of the four (the mean of the middle two), in seconds."""
    built = [2.0, 11.0, 5.0, 7.0]
    rows = [cell("a", "a", 50.0, 50.0, built[0]), cell("a", "b", 50.0, 400.0, built[1]),
            cell("b", "a", 400.0, 50.0, built[2]), cell("b", "b", 400.0, 400.0, built[3])]
    plain = sorted(r["other_kernel_us"] - (r["stretch"] - 1) * r["kernel_us"] for r in rows)
    assert plain == pytest.approx(sorted(built))
    want = (plain[1] + plain[2]) / 2  # 6.0 us
    value, why = kernel_overlap(rows)
    assert value == pytest.approx(want / 1e6)
    assert why.startswith("measured: median over 4 cells (3 pairs of step kinds) at read kernels 0.1 ms")
    assert "within 10% in 4 of 4" in why  # each cell's stretch is within 5 us of the fit's
    assert fit_overlap(rows + [cell("a", "a", 50.0, 50.0, 3.0, chunk=0.5)]) == {
        0.1: pytest.approx(want), 0.5: pytest.approx(3.0)}


def test_a_negative_median_is_clamped_to_zero():
    """Kernels that waited longer than the other's whole kernel (stretch above strict turns):
    the median overlap is negative; the value written is 0 and the why says so."""
    rows = [cell("a", "b", 50.0, 100.0, -20.0), cell("b", "a", 100.0, 50.0, -4.0),
            cell("a", "a", 50.0, 50.0, 3.0)]
    med = statistics.median(r["other_kernel_us"] - (r["stretch"] - 1) * r["kernel_us"] for r in rows)
    assert med == pytest.approx(-4.0)
    value, why = kernel_overlap(rows)
    assert value == 0.0
    assert "clamped to 0" in why and f"{med:+.2f} us" in why
    assert fit_overlap(rows) == {0.1: 0.0}


def test_cells_of_two_read_kernel_lengths_are_refused():
    with pytest.raises(ValueError, match="one read-kernel length"):
        kernel_overlap([cell("a", "a", 50.0, 50.0, 1.0), cell("a", "a", 50.0, 50.0, 1.0, chunk=0.5)])


def test_what_the_fit_does_with_no_cells():
    base = load_profile("h200-pcie").model_dump()
    for rs, want in ((None, None), ({"skipped": "needs a GPU"}, "base: needs a GPU"),
                     ({"rows": []}, "base: no pair of steps ran together")):
        d, why = json.loads(json.dumps(base)), {}
        fit_kernel_overlap(rs, d, why)
        assert d["gpu"]["kernel_overlap"] == base["gpu"]["kernel_overlap"]
        assert why.get("gpu.kernel_overlap") == want


class FakeGpu:
    """A GPU where a step lasts its nominal seconds alone and ``stretch[me, other]`` times
    that while the other stream runs a step of ``other``; events complete at once."""

    def __init__(self, stretch: dict):
        self.stretch = stretch
        gpu = self

        class Stream:
            def __init__(self, non_blocking=True):
                self.t, self.kind = 0.0, None
                gpu.streams.append(self)

        class Event:
            done = True

            def record(self, stream):
                self.t = stream.t

            def synchronize(self):
                pass

        self.streams: list = []
        self.cuda = SimpleNamespace(Stream=Stream, Event=Event,
                                    get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3)

    def launch(self, stream, seconds, work):
        other = next((s.kind for s in self.streams[-2:] if s is not stream), None)
        stream.kind = work.kind
        stream.t += seconds * (self.stretch[work.kind, other] if other else 1.0)


def test_the_probe_measures_each_pair_of_kinds_once(monkeypatch):
    """Three kinds: 6 pairs, 9 rows (a kind beside itself once, two kinds both ways); each
    row's stretch the stand-in GPU's, its kernels its alone time over its kernel count."""
    secs, kernels = {"s": 0.004, "m": 0.009, "l": 0.08}, {"s": 80, "m": 90, "l": 190}
    kinds = list(secs)
    stretch = {(a, b): 1.0 + 0.1 * (i + 1) + 0.01 * j for i, a in enumerate(kinds)
               for j, b in enumerate(kinds)}
    gpu = FakeGpu(stretch)
    monkeypatch.setattr(probe, "kernels_of", lambda si, seconds, work: kernels[work.kind])
    works = {k: SimpleNamespace(kind=k, seconds=s) for k, s in secs.items()}
    rows = probe.run_cells(gpu, gpu, works, 0.003, 3, 0.1)
    got = [(r["rank"], r["other"]) for r in rows]
    pairs = list(itertools.combinations_with_replacement(kinds, 2))
    assert len(pairs) == 6
    assert got == [x for a, b in pairs for x in ([(a, a)] if a == b else [(a, b), (b, a)])]
    for r in rows:
        k, ko = secs[r["rank"]] / kernels[r["rank"]], secs[r["other"]] / kernels[r["other"]]
        assert r["stretch"] == pytest.approx(stretch[r["rank"], r["other"]])
        assert r["alone_ms"] == pytest.approx(secs[r["rank"]] * 1e3)
        assert (r["kernel_us"], r["other_kernel_us"]) == (pytest.approx(k * 1e6), pytest.approx(ko * 1e6))
        assert r["kernel_rule"] == pytest.approx((k + ko) / k) and r["steps"] >= 1
        assert r["chunk_ms"] == 0.1


def test_the_probe_without_a_gpu_says_why(monkeypatch):
    monkeypatch.setattr(probe, "load_cupy", lambda: None)
    assert probe.measure_for_calibrate(None, "gpu", {}) == {"skipped": "needs a GPU"}


def test_a_failed_measurement_is_skipped_with_its_error(monkeypatch):
    """A CUDA error while the cells run (a RuntimeError, as CuPy's are) ends the probe with
    the reason, the backend closed; calibrate keeps the base's value and says why."""
    closed = []

    class Backend:
        def __init__(self, rt, st):
            self.standin = object()

        def close(self):
            closed.append(True)

    def fail(*a, **k):
        raise RuntimeError("cudaErrorLaunchFailure: unspecified launch failure")
    monkeypatch.setattr(probe, "load_cupy", lambda: object())
    monkeypatch.setattr(probe, "HwBackend", Backend)
    monkeypatch.setattr(probe, "RealtimeRuntime", lambda: None)
    monkeypatch.setattr(probe, "run_cells", fail)
    st = type("St", (), {"read_kernel_s": 1e-4})()
    got = probe.measure_for_calibrate(lambda *a, **k: st, "gpu", {})
    assert got == {"skipped": "the measurement failed (RuntimeError: cudaErrorLaunchFailure: "
                              "unspecified launch failure)"}
    assert closed == [True]
    d, why = {"gpu": {"kernel_overlap": 9e-6}}, {}
    fit_kernel_overlap(got, d, why)
    assert d["gpu"]["kernel_overlap"] == 9e-6 and why["gpu.kernel_overlap"].startswith("base: the measurement failed")


@pytest.fixture(scope="module")
def cpu_calibration(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cal") / "cpu.yaml"
    calibrate(out, device="cpu")
    return out


def test_cpu_calibrate_keeps_the_bases_overlap_and_says_why(cpu_calibration):
    report = json.loads(Path(str(cpu_calibration) + ".report.json").read_text())
    assert report["rank_share"] == {"skipped": "needs a GPU"}
    assert report["why"]["gpu.kernel_overlap"] == "base: needs a GPU"
    assert load_profile(cpu_calibration).gpu.kernel_overlap == load_profile("h200-pcie").gpu.kernel_overlap
    assert "#   gpu.kernel_overlap: base: needs a GPU\n" in cpu_calibration.read_text()


def test_refit_fits_the_overlap_from_the_reports_cells(cpu_calibration, tmp_path):
    """The CPU report with the H200's nine 0.1 ms cells put in: the refit on a base without
    an overlap (gh200-c2c: 0) writes their median overlap; without the cells it keeps the
    base's, saying why, and a report from before the cells says nothing of it."""
    rows = json.loads(FIXTURE.read_text())
    assert len(rows) == 9 and {r["chunk_ms"] for r in rows} == {0.1}
    want = statistics.median(r["other_kernel_us"] - (r["stretch"] - 1) * r["kernel_us"] for r in rows)
    assert want > 0
    report = json.loads(Path(str(cpu_calibration) + ".report.json").read_text())
    report["rank_share"] = {"rows": rows, "read_kernel_ms": 0.1, "window_ms": 400.0, "reps": 5}
    src = tmp_path / "with-cells.report.json"
    src.write_text(json.dumps(report))
    assert load_profile("gh200-c2c").gpu.kernel_overlap == 0.0
    new = refit(src, tmp_path / "fitted.yaml", base="gh200-c2c")
    assert load_profile(tmp_path / "fitted.yaml").gpu.kernel_overlap == pytest.approx(want / 1e6, rel=1e-5)
    assert new["why"]["gpu.kernel_overlap"].startswith(
        "measured: median over 9 cells (6 pairs of step kinds) at read kernels 0.1 ms")
    assert new["rank_share"]["rows"] == rows  # the refit's report keeps the cells
    # the CPU report as written (skipped): the base's, and why
    kept = refit(Path(str(cpu_calibration) + ".report.json"), tmp_path / "kept.yaml", base="gh200-c2c")
    assert load_profile(tmp_path / "kept.yaml").gpu.kernel_overlap == 0.0
    assert kept["why"]["gpu.kernel_overlap"] == "base: needs a GPU"
    del report["rank_share"]
    src.write_text(json.dumps(report))
    old = refit(src, tmp_path / "old.yaml", base="h200-pcie")
    assert load_profile(tmp_path / "old.yaml").gpu.kernel_overlap == load_profile("h200-pcie").gpu.kernel_overlap
    assert "gpu.kernel_overlap" not in old["why"]


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_probe_measures_every_pair_of_kinds(capsys):
    """On a GPU, calibrate's probe at the default read kernel: a row for each of the 9
    rank-steps of the 6 pairs of kinds, each with positive kernel lengths and stretch."""
    from functools import partial

    from kvsim.core.datapath.work import READ_KERNEL_S
    from kvsim.run.seam import settings_for
    from kvsim.tools.fitkinds import KIND_MODEL, share_works

    base = load_profile("h200-pcie")
    works = share_works(base)
    rs = probe.measure_for_calibrate(partial(settings_for, profile=base, model=KIND_MODEL), "gpu", works)
    rows = rs["rows"]
    pairs = set(itertools.combinations_with_replacement(sorted(works), 2))
    assert len(pairs) == 6
    assert len(rows) == 9, [(r["rank"], r["other"]) for r in rows]
    assert {tuple(sorted((r["rank"], r["other"]))) for r in rows} == pairs
    assert all(r["kernel_us"] > 0 and r["other_kernel_us"] > 0 and r["stretch"] > 0 for r in rows)
    assert rs["read_kernel_ms"] == pytest.approx(READ_KERNEL_S * 1e3)
    value, why = kernel_overlap(rows)
    assert value >= 0.0
    with capsys.disabled():
        print(f"\nrank share probe: {rs['seconds']:.1f} s; gpu.kernel_overlap {why}")
