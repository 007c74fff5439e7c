"""Bad configuration raises ConfigError, and the message names the field and the value."""

from __future__ import annotations

import pytest

from conftest import PAGE, make_manager
from kvsim.core import ConfigError, Level, ManagerSpec, TierSpec

GPU, HOST, DISK = Level.GPU, Level.HOST, Level.DISK


def spec(*tiers, page=PAGE, tpb=4):
    return ManagerSpec(page_bytes=page, tokens_per_block=tpb, tiers=tuple(tiers))


def raises(field: str, value, fn, *args, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kw)
    err = info.value
    assert err.field == field and err.value == value, (err.field, err.value)
    assert field in str(err) and repr(value) in str(err), str(err)
    return err


@pytest.mark.parametrize("quota", [0, -PAGE])
def test_zero_or_negative_quota(quota):
    raises("tiers[1] (host).quota_bytes", quota, spec,
           TierSpec(GPU, 4 * PAGE), TierSpec(HOST, quota))


@pytest.mark.parametrize("order", [(HOST, GPU), (GPU, DISK, HOST), (GPU, GPU), (DISK,)])
def test_tier_order_other_than_gpu_host_disk(order):
    names = [lv.name.lower() for lv in order]
    raises("tiers", names, spec, *(TierSpec(lv, 4 * PAGE) for lv in order))


def test_tier_order_may_skip_host_or_disk():
    spec(TierSpec(GPU, PAGE), TierSpec(DISK, PAGE))
    spec(TierSpec(GPU, PAGE), TierSpec(HOST, PAGE))
    spec(TierSpec(GPU, PAGE))


def test_no_tiers():
    raises("tiers", (), spec)


def test_slot_bigger_than_its_tier():
    raises("tiers[0] (gpu).quota_bytes", PAGE - 1, spec, TierSpec(GPU, PAGE - 1))


@pytest.mark.parametrize("field,value,kw", [("page_bytes", 0, {"page": 0}),
                                           ("tokens_per_block", -1, {"tpb": -1})])
def test_page_and_block_sizes(field, value, kw):
    raises(field, value, spec, TierSpec(GPU, 4 * PAGE), **kw)


def test_max_quota_below_quota():
    raises("tiers[0] (gpu).max_quota_bytes", 2 * PAGE, spec,
           TierSpec(GPU, 4 * PAGE, max_quota_bytes=2 * PAGE))


def test_set_quota_beyond_the_reserved_range():
    m = make_manager(gpu=4, max_gpu=8)
    err = raises("gpu.quota_bytes", 9 * PAGE, m.set_quota, GPU, 9 * PAGE)
    assert str(8 * PAGE) in str(err)  # says how far it may go
    assert m.tiers[0].capacity == 4 and m.plans_in_flight() == 0


@pytest.mark.parametrize("quota", [0, -PAGE, PAGE - 1])
def test_set_quota_below_one_page(quota):
    m = make_manager(host=4)
    raises("host.quota_bytes", quota, m.set_quota, HOST, quota)
    assert m.tiers[1].capacity == 4


def test_set_quota_on_a_missing_tier_is_a_core_error():
    from kvsim.core import CoreError
    m = make_manager(host=None)
    with pytest.raises(CoreError, match="HOST"):
        m.set_quota(HOST, 4 * PAGE)
