"""kvsim: a KV-cache tier manager with one policy core and two backends (SimPy and a real GPU)."""

__version__ = "0.1.0"
