"""The node's host DRAM bandwidth and PCIe switches in the sim (``host.memory_bandwidth``,
``pcie``; ``kvsim_backends.sim.nodebus``).

Scenarios, each two (or four) ranks of one node on one clock, every rank copying a batch
host -> GPU on the copy engine at the same moment:
- a host memory bandwidth below the sum of the ranks' links: each rank gets half of it,
  together exactly it; the batches end later by what the lower rate costs;
- without the key: each at its own link's rate (what a node did before the key);
- a switch shared by two GPUs: their sum is the uplink's; ranks behind two switches
  each get their own link;
- a GPU -> disk write through the staging buffer takes two bytes of host DRAM a byte;
- a bad key: exit code 2, naming it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from kvsim.cli import app
from kvsim.config.hardware import ProfileError, load_profile
from kvsim.core.plan import Batch, BatchKind
from kvsim.core.spec import Level
from kvsim.run.seam import settings_for
from kvsim_backends.sim import SimBackend, SimRuntime

PB = 2 << 20     # 2 MiB pages
PAGES = 64       # 128 MiB a batch: a few ms on a PCIe Gen5 link
BASE = load_profile("h200-pcie")
LINK = BASE.link.h2d


def _profile(memory_bandwidth=None, pcie=None):
    host = BASE.host.model_copy(update={"memory_bandwidth": memory_bandwidth})
    data = BASE.model_dump()
    data["host"] = host.model_dump()
    if pcie is not None:
        data["pcie"] = pcie
    return type(BASE).model_validate(data)


def _node(profile, ranks, *, disk=False):
    rt = SimRuntime()
    slots = {Level.GPU: PAGES, Level.HOST: PAGES}
    if disk:
        slots[Level.DISK] = PAGES
    base = settings_for(PB, slots, profile, copy_path="copy_engine")
    # (one GPU a rank: rank r on GPU r)
    return rt, [SimBackend(rt, dataclasses.replace(base, rank=r, ranks=ranks, tp=1)) for r in range(ranks)]


def _batch(src=Level.HOST, dst=Level.GPU):
    idx = np.arange(PAGES, dtype=np.int64)
    return Batch(BatchKind.ONBOARD, src, dst, idx, idx, [0] * PAGES, PB, 0)


def _copy_at_once(profile, ranks, **kw):
    """Every rank submits one batch at t=0: (each rank's flow rate midway, each batch's
    seconds)."""
    rt, bes = _node(profile, ranks, **kw)
    done = [be.transfer(_batch(*kw.get("route", ()))) for be in bes]
    rt.env.run(until=1e-3)  # (past the calls' host time, well before the bytes are in)
    rates = [sum(f.rate for f in be.fluid.flows) for be in bes]
    rt.env.run(until=rt.env.all_of(done))
    secs = [be.stats()["h2d_busy_s"] for be in bes]
    return rates, secs


def test_host_memory_below_the_links_is_shared_half_and_half():
    # 1.5 links' worth: above one rank's link, below the two ranks' sum
    bw = 1.5 * LINK
    rates, secs = _copy_at_once(_profile(bw), 2)
    assert rates == pytest.approx([bw / 2, bw / 2], rel=1e-9)
    assert sum(rates) == pytest.approx(bw, rel=1e-9)
    # the same batches without the key: each at its own link
    free, free_secs = _copy_at_once(BASE, 2)
    assert free == pytest.approx([LINK, LINK], rel=1e-9)
    # each batch's bytes took the lower rate's time instead of the link's
    nbytes = PAGES * PB
    for s, f in zip(secs, free_secs):
        assert s - f == pytest.approx(nbytes / (bw / 2) - nbytes / LINK, rel=1e-6)


def test_without_the_keys_there_is_no_bus_and_no_route_draws_more():
    _, bes = _node(BASE, 2, disk=True)
    for be in bes:
        assert be.fluid.bus is None and be.disk_fluid.bus is None
        assert not any(be._node_res.values())


def test_host_memory_above_the_links_changes_nothing():
    rates, _ = _copy_at_once(_profile(2.5 * LINK), 2)
    assert rates == pytest.approx([LINK, LINK], rel=1e-9)


def test_a_switch_shared_by_two_gpus_caps_their_sum_at_its_uplink():
    up = 0.8 * LINK  # an uplink slower than one GPU's link, to see it bind
    rates, _ = _copy_at_once(_profile(pcie={"gpus_per_switch": 2, "uplink": up}), 2)
    assert sum(rates) == pytest.approx(up, rel=1e-9)
    assert rates[0] == pytest.approx(rates[1], rel=1e-9)
    # four ranks on two switches: each pair shares its own uplink
    rates, _ = _copy_at_once(_profile(pcie={"gpus_per_switch": 2, "uplink": up}), 4)
    assert rates == pytest.approx([up / 2] * 4, rel=1e-9)
    # one GPU a switch at an uplink as fast as the link: each rank at its link
    rates, _ = _copy_at_once(_profile(pcie={"gpus_per_switch": 1, "uplink": LINK}), 2)
    assert rates == pytest.approx([LINK, LINK], rel=1e-9)


def test_the_tighter_of_host_memory_and_the_switch_binds():
    # host memory for 1.2 links, uplinks of one link, one GPU a switch: host memory binds
    rates, _ = _copy_at_once(_profile(1.2 * LINK, {"gpus_per_switch": 1, "uplink": LINK}), 2)
    assert rates == pytest.approx([0.6 * LINK] * 2, rel=1e-9)


def test_a_staged_disk_write_takes_two_bytes_of_host_memory_a_byte():
    """GPU -> disk goes through the pinned staging buffer: the GPU's DMA writes it and the
    disk's reads it, so one rank's write with host memory below twice the disk's rate
    moves at half the host memory's."""
    bw = 1.5 * BASE.nvme.write   # below 2 x the disk's write rate, above it once
    rt, (be,) = _node(_profile(bw), 1, disk=True)
    done = be.transfer(_batch(Level.GPU, Level.DISK))
    rt.env.run(until=5e-3)
    assert sum(f.rate for f in be.fluid.flows) == pytest.approx(bw / 2, rel=1e-9)
    rt.env.run(until=done)


@pytest.mark.parametrize("bad, key", [({"gpus_per_switch": 0, "uplink": "50GB/s"}, "pcie.gpus_per_switch"),
                                      ({"gpus_per_switch": 2}, "pcie.uplink")])
def test_a_bad_pcie_key_is_refused_naming_it(tmp_path, bad, key):
    text = (load_profile.__globals__["CONFIG_DIR"] / "hardware" / "h200-pcie.yaml").read_text()
    path = tmp_path / "bad.yaml"
    inline = ", ".join(f"{k}: {v}" for k, v in bad.items())
    path.write_text(text + f"pcie: {{{inline}}}\n")
    with pytest.raises(ProfileError, match=key.replace(".", r"\.")):
        load_profile(path)
    res = CliRunner().invoke(app, ["run", "default", "--no-progress", "--set", f"hardware={path}",
                                   "--set", "workload.synthetic.n_sessions=2"])
    assert res.exit_code == 2 and "Traceback" not in res.output and key in res.output
