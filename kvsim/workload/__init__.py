"""kvsim.workload: request traces and generators feeding the engine.

The data model (``Turn``, ``Session``, ``Workload``) is in :mod:`.model`; loaders for the
Mooncake JSONL traces (open loop) and the agentic coding sessions (closed loop) in
:mod:`.mooncake` and :mod:`.agentic`; a seeded synthetic agentic generator in
:mod:`.synthetic`; trace-block to cache-block mapping in :mod:`.blocks`; Poisson session
starts in :mod:`.arrivals`; infinite-cache reuse analysis in :mod:`.analysis`; slicing
(first turns of each session) and reuse scopes (``workload.scope``) in :mod:`.transform`.
"""

from .agentic import load_agentic
from .analysis import ideal_reuse_ratio, ideal_reuse_tokens
from .starts import session_start_times
from .blocks import cache_blocks
from .model import START_POLICIES, Session, TraceError, Turn, Workload
from .mooncake import load_mooncake, write_jsonl_mooncake
from .synthetic import synthetic_agentic
from .transform import first_turns, scoped

__all__ = [
    "START_POLICIES", "Session", "TraceError", "Turn", "Workload", "cache_blocks", "first_turns",
    "ideal_reuse_ratio", "ideal_reuse_tokens", "load_agentic", "load_mooncake", "scoped",
    "session_start_times", "synthetic_agentic", "write_jsonl_mooncake",
]
