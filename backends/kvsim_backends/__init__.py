"""kvsim's backends, importable as ``kvsim_backends`` (sim: SimPy model; hw: real bytes;
reference: a hand-stepped backend for tests)."""
