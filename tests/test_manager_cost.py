"""engine.manager_cost (seed 003): the manager's bookkeeping a plan, charged to the
executor. The cost of a plan from its parts (numbers chosen so each term shows), the
statistics knob's two granularities, and a replay where each plan's cost delays the
next step: the summary's manager block adds up to the plans' costs, and serving slows."""

from __future__ import annotations

import pytest

from kvsim.config import ConfigFileError, load_config
from kvsim.engine.live import EngineParams
from kvsim.engine.managercost import cost_on, plan_cost_s

US = 1e-6


def params(**kw) -> EngineParams:
    return EngineParams(**kw)


def test_a_plans_cost_from_its_parts_and_the_stats_granularity():
    base = dict(mgr_per_plan_s=100 * US, mgr_per_page_s=1 * US, mgr_per_moved_page_s=10 * US,
                mgr_stats_per_page_s=2 * US, mgr_stats_per_commit_s=5 * US)
    pages, new = [300, 100], 50           # two batches moving 400 pages; 50 new pages
    work = 100 * US + 50 * 1 * US + 400 * 10 * US
    assert plan_cost_s(params(**base), pages, new) == pytest.approx(work)
    assert plan_cost_s(params(**base, mgr_stats=1), pages, new) == pytest.approx(work + 400 * 7 * US)
    assert plan_cost_s(params(**base, mgr_stats=2), pages, new) == pytest.approx(
        work + 400 * 2 * US + 2 * 5 * US)
    assert not cost_on(params()) and not cost_on(params(mgr_stats=1))
    assert cost_on(params(mgr_per_plan_s=1e-9))


def _replay(sets):
    from kvsim.run import prepare_run, replay
    cfg = load_config("configs/default.yaml", ["workload.synthetic.n_sessions=4", "engine.refcheck=false",
                                               *sets])
    return replay(prepare_run(cfg)).metrics


def test_each_plan_blocks_the_next_step_for_its_cost():
    free = _replay([])
    costly = _replay(["engine.manager_cost.per_plan=20ms"])
    assert "manager" not in free
    mc = costly["manager"]
    assert mc["busy_s"] == pytest.approx(mc["plans"] * 0.020) and mc["max_s"] == pytest.approx(0.020)
    # the executor waited: the same requests take longer to serve
    assert costly["requests_completed"] == free["requests_completed"]
    assert costly["e2e_s"]["mean"] > free["e2e_s"]["mean"]


def test_bad_manager_cost_is_refused_naming_the_key():
    with pytest.raises(ConfigFileError, match=r"engine\.manager_cost\.stats"):
        load_config("configs/default.yaml", ["engine.manager_cost.stats=sometimes"])
    with pytest.raises(ConfigFileError, match=r"engine\.manager_cost\.per_page"):
        load_config("configs/default.yaml", ["engine.manager_cost.per_page=-1us"])
