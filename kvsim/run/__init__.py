"""Run assembly: one replay from a validated config to a results folder.

- ``replay``: ``prepare_run`` (validate, load the trace; nothing written), ``replay`` (the
  engine on a backend built through the registry ``BACKENDS``: the one module of kvsim
  that imports ``kvsim_backends``) and ``write_results``;
- ``policies``: the run's eviction, placement and per-tier policies from the config
  (built-ins, ``belady``'s future, a user's ``module:Class``);
- ``results``: which folders a run may write, staging and the atomic swap; ``plots``: a
  run's PNGs; ``sharedmanager``: a tier manager behind a reader-writer lock, for callers
  on several threads.
"""

from kvsim.run.pipeline import (BACKENDS, Prepared, Result, build_backend, load_workload,
                                measure_hardware, prepare_run, replay, sim_backend, workload_key)
from kvsim.run.results import output_dir, write_files, write_results

__all__ = ["BACKENDS", "Prepared", "Result", "build_backend", "load_workload", "measure_hardware", "output_dir",
           "prepare_run", "replay", "sim_backend", "workload_key", "write_files", "write_results"]
