"""kvsim's policy core: pure decisions, no clocks, threads, files or devices.

Everything here is standard library and numpy only (a layering test enforces it). The core
decides where KV pages live and which bytes must move; the engine submits the moves to a
backend and reports back with ``TierManager.complete``.
"""

from kvsim.core.errors import ConfigError, CoreError
from kvsim.core.keys import chain_key, scope_root, tag_of
from kvsim.core.manager import TierManager
from kvsim.core.plan import Batch, Fill, Plan, Refusal, RefusalReason
from kvsim.core.request import Request
from kvsim.core.spec import Level, ManagerSpec, TierSpec
from kvsim.core.stats import Counters, TierStats
from kvsim.core.types import Phase, PageState, ReqState

__all__ = [
    "Batch", "ConfigError", "CoreError", "Counters", "Fill", "Level", "ManagerSpec",
    "PageState", "Phase", "Plan", "Refusal", "RefusalReason", "ReqState", "Request",
    "TierManager", "TierSpec", "TierStats", "chain_key", "scope_root", "tag_of",
]
