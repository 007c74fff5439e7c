"""Seed 004's balancing statistics in the summary (``metrics.balance``) and in the end-of-run
table: each tier's evictable pages, the disk's retained copies and the protected share in
use. Checked against the manager's own counts at the end of the same run and the
timeline's samples, not against pasted numbers."""

from __future__ import annotations

import pytest

from kvsim.config import load_config
from kvsim.console import summary_table


def test_balance_is_the_managers_counts_at_the_end_and_the_timelines_mean():
    from kvsim.run import prepare_run, replay

    cfg = load_config("configs/default.yaml", ["workload.synthetic.n_sessions=6",
                                               "cache.tiers[2].io_workers=2",
                                               "cache.tiers[2].keep_copy=true",
                                               "cache.tiers[2].write_through=true",
                                               "cache.tiers[2].protected_copy_fraction=0.5",
                                               "cache.tiers[0].quota=12GiB",
                                               "cache.tiers[1].quota=4GiB"])
    run = prepare_run(cfg)
    res = replay(run)
    m = res.metrics
    bal = m["balance"]
    page = m["page_bytes"]
    assert set(bal) == {"gpu", "host", "disk"}
    tl = res.timeline
    disk = bal["disk"]
    assert disk["retained_pages"] > 0  # write-through left copies of pages still in host
    assert disk["retained_bytes"] == disk["retained_pages"] * page
    assert disk["protected_pages"] == int(0.5 * m["tiers_slots"]["disk"])
    assert disk["protected_in_use"] == pytest.approx(disk["retained_pages"] / disk["protected_pages"])
    for name, d in bal.items():
        assert d["evictable_bytes"] == d["evictable_pages"] * page
        assert 0 <= d["evictable_pages_mean"] <= m["tiers_slots"][name]
    for name in bal:  # the mean of the timeline's samples; the end: its last sample's
        col = [r[f"{name}_evictable_pages"] for r in tl]
        assert bal[name]["evictable_pages_mean"] == pytest.approx(sum(col) / len(col))
        assert bal[name]["evictable_pages"] == col[-1]
    assert disk["retained_pages"] == tl[-1]["disk_retained_slots"]
    assert m["disk_copies"]["retained_slots"] == disk["retained_pages"]
    rows = {r: v for r, v in zip(summary_table(m, "t").columns[0].cells, summary_table(m, "t").columns[1].cells)}
    assert f"{disk['retained_pages']} (" in rows["disk retained copies at end (mean)"]
