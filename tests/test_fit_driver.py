"""The host-fill rates per backing and the driver's lock, fitted from what calibrate
measured on a GPU (``Measured.host_fills``, ``driver_call_s``): a saved report's rows go
into a profile that loads, each term the quotient the fit's docstring names, computed
here by hand; a backing that failed keeps the base's rate; a base without a driver
section gets one only when both required terms were measured. And the probe itself in
CPU mode (no driver: a numpy copy)."""

from __future__ import annotations

import pytest

from gpuskip import have_gpu as _have_gpu
from kvsim.config.hardware import HardwareProfile, load_profile
from kvsim.core.datapath.fill import Backing
from kvsim.tools.fitdriver import fit_driver
from kvsim.tools.measured import measured_from_report

GiB = 1 << 30
BASE = load_profile("h200-pcie")

ROWS = {
    # 2 GiB registered: 0.8 s to full, of which 0.05 s inside cudaHostRegister
    "register": {"backing": "register", "ok": True, "bytes": 2 * GiB, "full_s": 0.8,
                 "rate_Bps": 2 * GiB / 0.8, "register_s": 0.05, "probe_blocked_share": 0.11},
    "pinned": {"backing": "pinned", "ok": False, "error": "RuntimeError: out of memory"},
    "cumem": {"backing": "cumem", "ok": True, "bytes": 2 * GiB, "full_s": 0.5,
              "rate_Bps": 2 * GiB / 0.5, "register_s": 0.0, "probe_blocked_share": 0.875},
}


def _fit(base: HardwareProfile, rows=ROWS, call_s=4e-6):
    d, why = base.model_dump(), {}
    fit_driver(rows, call_s, d, why)
    return HardwareProfile.model_validate(d), why


def test_each_backing_rate_and_the_driver_terms_are_the_measured_quotients():
    p, why = _fit(BASE)
    assert p.host.fill_rate == 2 * GiB / 0.8
    assert p.host.cumem_fill_rate == 2 * GiB / 0.5
    assert p.host.pinned_fill_rate == BASE.host.pinned_fill_rate  # failed: the base's
    assert p.driver.register_rate == 2 * GiB / 0.05
    assert p.driver.cumem_lock_share == 0.875
    assert p.driver.call == 4e-6
    assert "cudaHostRegister" in why["driver.register_rate"]
    assert "host.pinned_fill_rate" not in why


def test_the_rows_survive_a_saved_report():
    report = {"device": "gpu", "copies": [], "host_fills": ROWS, "driver_call_s": 4e-6}
    m = measured_from_report(report)
    assert m.host_fills == ROWS and m.driver_call_s == 4e-6


def test_a_base_without_a_driver_gets_one_only_when_both_terms_were_measured():
    bare = BASE.model_copy(update={"driver": None})
    p, _ = _fit(bare)
    assert p.driver is not None and p.driver.cumem_lock_share == 0.875
    no_cumem = {k: v for k, v in ROWS.items() if k != "cumem"}
    p, why = _fit(bare, no_cumem)
    assert p.driver is None and not any(k.startswith("driver.") for k in why)
    # with the base's driver section, the measured register rate replaces its own alone
    p, _ = _fit(BASE, no_cumem)
    assert p.driver.register_rate == 2 * GiB / 0.05
    assert p.driver.cumem_lock_share == BASE.driver.cumem_lock_share


def test_the_probe_times_a_cpu_mode_fill():
    from kvsim_backends.hw.driverprobe import fill_probed

    r = fill_probed(32 << 20, Backing.REGISTER, None, 8 << 20, gap_s=1e-3, slot=1 << 20)
    assert r["ok"] and r["bytes"] == 32 << 20 and r["register_s"] == 0.0  # no driver here
    assert r["full_s"] > 0 and r["rate_Bps"] == r["bytes"] / r["full_s"]
    assert r["probe_calls"] >= 1 and 0.0 <= r["probe_blocked_share"] <= 1.0


@pytest.mark.gpu
@pytest.mark.skipif(not _have_gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_calibrate_measures_every_backing_and_the_driver(capsys):
    """On a GPU: a 1 GiB fill per backing, each ok (cumem where cuda-bindings are there),
    time spent inside cudaHostRegister for register only, an executor call of under a
    millisecond; the fit gives a profile that loads, with a driver section."""
    import cupy as cp

    from kvsim_backends.hw.microbench import Plan, measure_host_fill
    from kvsim.tools.measured import Measured

    plan = Plan.for_device(True)
    plan.host_fill_bytes = 1 << 30
    m = Measured(device="gpu")
    measure_host_fill(plan, m, cp)
    reg, pin, cum = (m.host_fills[b] for b in ("register", "pinned", "cumem"))
    assert reg["ok"] and pin["ok"], (reg, pin)
    assert 0 < reg["register_s"] < reg["full_s"] and pin["register_s"] == 0.0
    assert 0 < m.driver_call_s < 1e-3
    p, why = _fit(BASE, m.host_fills, m.driver_call_s)
    assert p.driver.register_rate == reg["bytes"] / reg["register_s"]
    with capsys.disabled():
        print("\n" + "; ".join(f"{k} = {v}" for k, v in sorted(why.items())))
        print({b: {k: r.get(k) for k in ("ok", "rate_Bps", "register_s", "probe_blocked_share", "error")}
               for b, r in m.host_fills.items()}, "call_s", m.driver_call_s)
    if cum["ok"]:
        assert p.driver.cumem_lock_share == min(1.0, cum["probe_blocked_share"])
