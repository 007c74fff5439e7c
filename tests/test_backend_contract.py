"""The backend contract: one suite, every backend (sim, hw in CPU mode, hw on a GPU).

What every Backend + Runtime pair must do, narrated per scenario:
- a page filled with a tag and moved between any two tiers arrives with its tag;
- a failed transfer (each backend's ``fail_next_transfer`` hook) succeeds with False and
  never leaves the page's tag in the destination;
- ``compute(d)`` takes about ``d`` of the runtime's time;
- the runtime's waitables: timeout values, all_of/any_of, process return values.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvsim.run.seam import settings_for
from kvsim.core.plan import Batch, BatchKind, Fill
from kvsim.core.spec import Level

PB = 64 << 10
SLOTS = 16
LEVELS = (Level.GPU, Level.HOST, Level.DISK)


from gpuskip import have_gpu as _have_gpu  # noqa: E402


@pytest.fixture(params=["sim", "sim-io3", "hw-cpu", "hw-cpu-io3", pytest.param("hw-gpu", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not _have_gpu(), reason="needs CuPy and a CUDA GPU")])])
def pair(request, tmp_path):
    """A fresh (runtime, backend) of each kind, 16 slots a tier, 64 KiB pages (``-io3``:
    with 3 prioritised disk I/O workers, the disk tier's ``io_workers``)."""
    slots = {lv: SLOTS for lv in LEVELS}
    kind, _, io = request.param.partition("-io")
    workers = int(io or 0)
    if kind == "sim":
        from kvsim_backends.sim import SimBackend, SimRuntime
        rt = SimRuntime()
        be = SimBackend(rt, settings_for(PB, slots, "h200-pcie", refcheck=True, io_workers=workers))
    else:
        from kvsim_backends.hw import HwBackend, RealtimeRuntime
        rt = RealtimeRuntime()
        be = HwBackend(rt, settings_for(PB, slots, disk_dir=tmp_path, refcheck=True, device="cpu" if kind == "hw-cpu" else "gpu", io_workers=workers))
    yield rt, be
    be.close()


def run1(rt, waitable):
    def proc():
        return (yield waitable)
    p = rt.process(proc())
    rt.run(p)
    return p.value


def batch(src, dst, ss, ds, tags):
    return Batch(BatchKind.EVICT, src, dst, np.asarray(ss, np.int64), np.asarray(ds, np.int64),
                 np.asarray(tags, np.uint64), PB, 0)


def tags_for(n, seed):
    return np.random.default_rng(seed).integers(1, 2**62, n, dtype=np.int64).astype(np.uint64)


@pytest.mark.parametrize("src,dst", [(a, b) for a, b in itertools.product(LEVELS, LEVELS)
                                     if not (a == b and a != Level.GPU)])
def test_transfer_moves_content(pair, src, dst):
    rt, be = pair
    tags = tags_for(4, seed=int(src) * 3 + int(dst) + 1)
    ss, ds = np.array([0, 5, 2, 9]), np.array([3, 1, 12, 7])
    be.fill(Fill(src, ss, tags))                       # step 1: the source holds 4 pages
    assert (be.read_tags(src, ss) == tags).all()
    ok = run1(rt, be.transfer(batch(src, dst, ss, ds, tags)))   # step 2: move them
    assert ok is True
    assert (be.read_tags(dst, ds) == tags).all()       # step 3: each arrived with its tag


@pytest.mark.parametrize("src,dst", [(Level.HOST, Level.GPU), (Level.GPU, Level.HOST),
                                     (Level.GPU, Level.DISK), (Level.DISK, Level.GPU)])
def test_failed_transfer_reports_false_and_leaves_no_tag(pair, src, dst):
    rt, be = pair
    tags = tags_for(3, seed=7)
    ss, ds = np.array([1, 2, 3]), np.array([4, 5, 6])
    be.fill(Fill(src, ss, tags))
    be.fail_next_transfer()
    ok = run1(rt, be.transfer(batch(src, dst, ss, ds, tags)))
    assert ok is False
    if dst == Level.DISK:  # a disk slot whose write failed must not be served
        found = be.read_tags(dst, ds) if not hasattr(be, "disk") else \
            np.where(be.disk.valid[ds], be.read_tags(dst, ds), 0)
    else:
        found = be.read_tags(dst, ds)
    assert not (found == tags).any()
    assert run1(rt, be.transfer(batch(src, dst, ss, ds, tags))) is True  # the hook fires once
    assert (be.read_tags(dst, ds) == tags).all()


def test_compute_takes_about_its_duration(pair):
    rt, be = pair
    t0 = rt.now
    took = run1(rt, be.compute(0.05))
    elapsed = rt.now - t0
    assert 0.045 <= elapsed <= 0.2
    assert 0.04 <= took <= 0.2
    assert rt.now >= t0


def test_runtime_semantics(pair):
    rt, _ = pair
    out = {}

    def child():
        yield rt.timeout(0.01)
        return "child done"

    def main():
        v = yield rt.timeout(0.02, value="tick")
        out["timeout"] = v
        a, b = rt.timeout(0.01, "a"), rt.timeout(0.03, "b")
        got = yield rt.any_of([a, b])
        out["any"] = list(got.values())
        got = yield rt.all_of([a, b])
        out["all"] = sorted(got.values())
        out["child"] = yield rt.process(child())
        ev = rt.event()
        ev.succeed(42)
        out["event"] = yield ev
        return "main done"

    t0 = rt.now
    p = rt.process(main())
    rt.run(p)
    assert p.value == "main done"
    assert out == {"timeout": "tick", "any": ["a"], "all": ["a", "b"], "child": "child done", "event": 42}
    assert rt.now - t0 >= 0.06 - 1e-9
