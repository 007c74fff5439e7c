"""The SimPy backend: simulated time (SimRuntime) and a fluid model of one GPU's data paths
(SimBackend: link, copy engines, SM copy kernels, NVMe, HBM; compute under interference)."""

from .backend import SimBackend
from .runtime import SimRuntime

__all__ = ["SimBackend", "SimRuntime"]
