"""The manager's own bookkeeping time (``engine.manager_cost``, seed 003), charged to the
executor: a plan's cost is what the manager spends planning and committing it, on the
thread that would otherwise launch the next step, so the next step starts that much later.

cost = per_plan + per_page x new GPU pages + per_moved_page x pages moved + statistics,
where statistics with ``stats`` ``page`` (1) commit once a moved page: (stats_per_page +
stats_per_commit) x moved; with ``batch`` (2) once a batch: stats_per_page x moved +
stats_per_commit x batches; ``off`` (0): none. ``kvsim.run.manager_cost_params`` maps the
config to ``EngineParams``' ``mgr_*`` fields.
"""

from __future__ import annotations

from typing import Sequence

STATS = {"off": 0, "page": 1, "batch": 2}


def manager_cost_params(mc) -> dict:
    """``engine.manager_cost`` (``ManagerCostConfig``) as EngineParams' fields."""
    return dict(mgr_per_plan_s=mc.per_plan, mgr_per_page_s=mc.per_page,
                mgr_per_moved_page_s=mc.per_moved_page, mgr_stats=STATS[mc.stats],
                mgr_stats_per_page_s=mc.stats_per_page, mgr_stats_per_commit_s=mc.stats_per_commit)


def plan_cost_s(p, batch_pages: Sequence[int], new_pages: int) -> float:
    """Seconds of bookkeeping for a plan of batches of ``batch_pages`` pages that also
    allocates ``new_pages`` GPU pages, under ``p`` (``EngineParams``)."""
    moved = sum(batch_pages)
    c = p.mgr_per_plan_s + p.mgr_per_page_s * new_pages + p.mgr_per_moved_page_s * moved
    if p.mgr_stats == 1:
        c += (p.mgr_stats_per_page_s + p.mgr_stats_per_commit_s) * moved
    elif p.mgr_stats == 2:
        c += p.mgr_stats_per_page_s * moved + p.mgr_stats_per_commit_s * len(batch_pages)
    return c


def cost_on(p) -> bool:
    """Whether any of ``p``'s manager costs is set."""
    return (p.mgr_per_plan_s > 0 or p.mgr_per_page_s > 0 or p.mgr_per_moved_page_s > 0
            or (p.mgr_stats != 0 and (p.mgr_stats_per_page_s > 0 or p.mgr_stats_per_commit_s > 0)))
