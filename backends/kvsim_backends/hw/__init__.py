"""The hw backend: real bytes on a GPU (CuPy) or, in CPU mode, numpy arrays standing in
for device memory; pinned host memory; a private preallocated file for the disk tier; and
``RealtimeRuntime``, which runs the engine's generator processes against the wall clock."""

from .backend import HwBackend
from .build import build_hw_backend
from .resources import CapacityError
from .runtime import RealtimeRuntime

__all__ = ["CapacityError", "HwBackend", "RealtimeRuntime", "build_hw_backend"]
