"""The serving engine: continuous batching over the tier manager, as generator processes.

It is the only part of kvsim that knows time exists, and it knows it only through the
Runtime protocol (kvsim.backend)."""

from kvsim.engine.engine import Engine, EngineParams
from kvsim.engine.metrics import Metrics

__all__ = ["Engine", "EngineParams", "Metrics"]
