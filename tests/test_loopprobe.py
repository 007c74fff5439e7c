"""The hw loop's step terms measured before a compare (``kvsim.tools.loopprobe``): the
probe's config, its check on the sim, the fit of a hw compute log (the step terms, and
the host costs at a resume) and the file it writes."""

from __future__ import annotations

import pytest

from gpuskip import have_gpu
from kvsim.config import load_config
from kvsim.tools import loopprobe
from kvsim.tools.hwloop import load_hw_loop

SLICE = ["configs/agentic-slice.yaml", ["engine.fast_forward=false"]]


def hw_rows(n: int, gap: float, rate: float, after: float) -> list[list]:
    """A hw compute log (``kvsim_backends.hw.logs``) of ``n`` memory-bound steps of 4-10 ms
    (0.2 ms of GEMMs each), ``gap`` of idle GPU before each, running ``rate`` x (reads -
    ``after``) over nominal."""
    rows, t = [], 0.0
    for i in range(n):
        nominal = 4e-3 + 6e-3 * ((i * 7) % n) / n
        took = nominal + rate * max(0.0, nominal - 0.2e-3 - after)
        rows.append([t, nominal, took, took, gap if i else None, 5e-5, 0.2e-3, 0])
        t += took + gap
    return rows


def test_the_probe_replays_its_own_workload_on_the_compared_config():
    """Its synthetic workload (seeded alone: any config's seed gives the same probe) and one
    GPU tier in place of the config's; the model, page size, engine and profile kept."""
    cfg = load_config(*SLICE)
    p = loopprobe.probe_config(cfg)
    assert p.workload.kind == "synthetic" and p.workload.synthetic.n_sessions == 3
    assert [(t.level, t.quota) for t in p.cache.tiers] == [("gpu", 24 << 30)]
    assert (p.model, p.hardware, p.engine, p.cache.tokens_per_block) == \
        (cfg.model, cfg.hardware, cfg.engine, cfg.cache.tokens_per_block)
    other = loopprobe.probe_config(load_config(SLICE[0], [*SLICE[1], "seed=7"]))
    assert other.workload == p.workload
    loopprobe.check(cfg)  # its sim replay completes and runs enough memory-bound steps


def test_the_check_refuses_a_probe_that_cannot_fit(monkeypatch):
    cfg = load_config(*SLICE)
    monkeypatch.setattr(loopprobe, "MIN_STEPS", 10**6)
    with pytest.raises(ValueError, match=r"hw loop probe: .* memory-bound steps \(needs 1000000\).*--hw-loop"):
        loopprobe.check(cfg)


def test_fit_steps_finds_the_terms_of_a_log_and_keeps_the_base_model():
    base = load_hw_loop("h200")
    model, rep = loopprobe.fit_steps(hw_rows(400, 100e-6, 0.02, 3e-3), base)
    assert model.step.gap == pytest.approx(100e-6, rel=1e-9)
    assert model.step.overrun_rate == pytest.approx(0.02, rel=1e-6)
    assert model.step.overrun_after == pytest.approx(3e-3, rel=1e-6)
    assert model.name == "h200-probed" and rep["steps"] == 399  # (the first has no gap)
    # the overrun a read second, by third of the run (each third's summed overrun / reads)
    rows = loopprobe.ordinary(loopprobe.steps_of(hw_rows(400, 100e-6, 0.02, 3e-3)))
    thirds = [rows[:133], rows[133:266], rows[266:]]
    assert rep["overrun_per_read_s_by_third"] == pytest.approx(
        [sum(r[2] for r in p) / sum(r[1] for r in p) for p in thirds])
    assert all(0.0 < x < 0.02 for x in rep["overrun_per_read_s_by_third"])
    assert model.model_dump(exclude={"step", "name"}) == base.model_dump(exclude={"step", "name"})
    with pytest.raises(ValueError, match="199 ordinary steps, fewer than 200"):
        loopprobe.fit_steps(hw_rows(200, 100e-6, 0.02, 3e-3), base)


def test_the_written_model_reads_back(tmp_path):
    base = load_hw_loop("h200")
    model, rep = loopprobe.fit_steps(hw_rows(300, 96.5e-6, 0.0232, 3.86e-3), base)
    loopprobe.write(tmp_path / "hwloop.yaml", model, rep)
    text = (tmp_path / "hwloop.yaml").read_text()
    assert "measured here" in text and "299 ordinary steps" in text
    assert "a read second's, by third of the run: " in text
    back = load_hw_loop(tmp_path / "hwloop.yaml")
    assert back.model_dump(exclude={"step"}) == model.model_dump(exclude={"step"})
    for k in ("gap", "overrun_rate", "overrun_after"):  # six significant digits
        assert getattr(back.step, k) == pytest.approx(getattr(model.step, k), rel=1e-5)


def with_resumes(rows: list[list], scale: float, model, at=(50, 120, 180, 240, 300, 360)):
    """``rows`` with a resume before each step of ``at`` (3,000-5,500 GPU pages, the check
    launched) whose host lag is ``scale`` x what ``model`` charges it, +-3%: (rows, resumes)."""
    rows = [list(r) for r in rows]
    resumes = []
    for j, i in enumerate(at):
        pages = 3000 + 500 * j
        cost = model.resume_s(pages) + pages * model.refcheck.launch_per_page
        rows[i][5] += scale * cost * (1.03 if j % 2 else 0.97)
        resumes.append((i, pages))
    return rows, [(0, 0), *resumes]  # (a cold prompt's resume: no pages, no cost)


def test_fit_host_scales_the_resume_costs_to_this_hosts_lag():
    """The host lag of the steps after resumes, beyond the median step's, over what the
    model charges them: its resume terms scaled by that (least squares), the rest kept."""
    base = load_hw_loop("h200")
    rows, resumes = with_resumes(hw_rows(400, 100e-6, 0.0, 0.0), 1.2, base)
    model, rep = loopprobe.fit_host(rows, resumes, base, checked=True)
    assert rep["resumes"] == 6 and rep["host_scale"] == pytest.approx(1.2, rel=0.01)
    k = rep["host_scale"]
    assert model.resume == pytest.approx(base.resume * k) and model.resume_per_page == pytest.approx(
        base.resume_per_page * k)
    assert model.refcheck.launch_per_page == pytest.approx(base.refcheck.launch_per_page * k)
    assert model.model_dump(exclude={"resume", "resume_per_page", "refcheck"}) == \
        base.model_dump(exclude={"resume", "resume_per_page", "refcheck"})
    assert model.refcheck.latency == base.refcheck.latency
    # without the check, its launch is not in the cost: the same lags give a larger scale
    _, rep2 = loopprobe.fit_host(rows, resumes, base, checked=False)
    assert rep2["host_scale"] > 1.3


def test_fit_host_keeps_the_base_for_too_few_resumes_or_no_hosts_speed():
    base = load_hw_loop("h200")
    rows, resumes = with_resumes(hw_rows(400, 100e-6, 0.0, 0.0), 1.2, base, at=(50, 120, 180))
    model, rep = loopprobe.fit_host(rows, resumes, base, checked=True)
    assert model == base and rep == {"resumes": 3, "host_scale": None}
    rows, resumes = with_resumes(hw_rows(400, 100e-6, 0.0, 0.0), 10.0, base)
    model, rep = loopprobe.fit_host(rows, resumes, base, checked=True)
    assert model == base and rep["host_scale"] is None and rep["host_scale_refused"] == pytest.approx(10, rel=0.01)
    assert "x10 is no host's speed" in loopprobe.host_scale_text(rep)


def test_fit_host_leaves_out_resumes_in_the_warm_up():
    """A resume before the log's first ``WARMUP_STEPS`` steps, whose lag is the warm-up's
    whatever the resume costs, is not counted, and the text says so."""
    base = load_hw_loop("h200")
    rows, resumes = with_resumes(hw_rows(400, 100e-6, 0.0, 0.0), 1.2, base)
    rows[3][5] += 0.05                       # a warm-up step's lag (50 ms) after a resume
    resumes.append((3, 248))
    model, rep = loopprobe.fit_host(rows, resumes, base, checked=True)
    assert rep["resumes"] == 6 and rep["warmup_resumes"] == 1
    assert rep["host_scale"] == pytest.approx(1.2, rel=0.01)
    assert "; 1 in the first 10 steps left out" in loopprobe.host_scale_text(rep)
    # counted, it would move the scale far from the host's
    rows[loopprobe.WARMUP_STEPS][5] += 0.05
    _, rep2 = loopprobe.fit_host(rows, [*resumes[:-1], (loopprobe.WARMUP_STEPS, 248)], base, checked=True)
    assert rep2["resumes"] == 7 and "warmup_resumes" not in rep2 and rep2["host_scale"] > 1.4
    # two replays' logs joined (fithost's together): the second's warm-up is its own
    _, joined = loopprobe.fit_host(rows, [*resumes[:-1], (loopprobe.WARMUP_STEPS, 248)], base,
                                   checked=True, starts=[0, loopprobe.WARMUP_STEPS - 1])
    assert joined["warmup_resumes"] == 1 and joined["host_scale"] == pytest.approx(1.2, rel=0.01)


def test_the_written_model_says_its_host_scale(tmp_path):
    base = load_hw_loop("h200")
    rows, resumes = with_resumes(hw_rows(400, 100e-6, 0.02, 3e-3), 1.2, base)
    model, rep = loopprobe.fit_steps(rows, base)
    model, host = loopprobe.fit_host(rows, resumes, model, checked=True)
    loopprobe.write(tmp_path / "hwloop.yaml", model, {**rep, **host})
    text = (tmp_path / "hwloop.yaml").read_text()
    assert f"the base's x{host['host_scale']:.3f}, fitted to 6 resumes' host lag" in text
    back = load_hw_loop(tmp_path / "hwloop.yaml")
    assert back.resume_per_page == pytest.approx(model.resume_per_page, rel=1e-9)


@pytest.mark.gpu
@pytest.mark.skipif(not have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_probe_fits_the_loop_of_this_machine():
    """On a GPU: the probe replays on the hw backend (about 17 s) and fits a gap of tens to
    hundreds of us before its steps and a non-negative overrun."""
    cfg = load_config(*SLICE)
    model, rep = loopprobe.measure(cfg, load_hw_loop("h200"), {"device": "gpu"})
    assert rep["steps"] >= loopprobe.MIN_STEPS
    assert 5e-6 < model.step.gap < 1e-3 and model.step.overrun_rate >= 0.0
    assert rep["resumes"] >= loopprobe.MIN_RESUMES  # (on the sim: four past the warm-up, 248-3,476 pages)


def test_fithost_pairs_a_compares_turns_with_their_steps_and_scales(tmp_path, capsys):
    """``python -m kvsim.tools.fithost OUT``: each turn with GPU hits only, paired with the
    row launched at its admission, pages = hits / 16; the scale of those rows' host lag;
    exit 2 naming a folder without the logs."""
    import csv
    import gzip
    import json

    from kvsim.tools import fithost
    from kvsim.tools.reports import CALL_LOGS_FILE

    base = load_hw_loop("h200")
    rows, resumes = with_resumes(hw_rows(400, 100e-6, 0.0, 0.0), 1.3, base)
    out = tmp_path / "cmp"
    (out / "hw").mkdir(parents=True)
    (out / CALL_LOGS_FILE).write_bytes(gzip.compress(json.dumps({"hw_compute": rows}).encode()))
    with (out / "hw" / "requests.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, ["rid", "arrival_s", "queue_s", "hit_gpu", "hit_host", "hit_disk"])
        w.writeheader()
        for n, (i, pages) in enumerate(resumes[1:]):  # (arrived 2 ms before, queued 2 ms)
            w.writerow({"rid": n, "arrival_s": rows[i][0] - 0.002, "queue_s": 0.002,
                        "hit_gpu": pages * 16, "hit_host": 0, "hit_disk": 0})
        w.writerow({"rid": 9, "arrival_s": rows[5][0], "queue_s": 0, "hit_gpu": 16000,
                    "hit_host": 16, "hit_disk": 0})  # (a load: not a resume of GPU pages alone)
    got, found = fithost.resumes_of(out)
    assert found == resumes[1:]
    assert fithost.main([str(out)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("fithost_scale: ") and float(last.split()[-1]) == pytest.approx(1.3, rel=0.01)
    assert fithost.main([str(tmp_path)]) == 2
    assert "expected a kvsim compare output folder" in capsys.readouterr().err
    # a compare without the refcheck: its launch is not charged, the same lags scale more
    (out / "hw" / "summary.json").write_text(json.dumps({"config": {"engine": {"refcheck": False}}}))
    assert not fithost.checked(out) and fithost.checked(tmp_path)
    assert fithost.main([str(out)]) == 0
    assert float(capsys.readouterr().out.splitlines()[-1].split()[-1]) > 1.5
