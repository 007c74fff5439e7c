"""Configuration: what a user writes and what it resolves to, validated once.

- ``runconfig``: the run configuration's models (``RunConfig``, pydantic, strict, frozen);
  ``loading``: YAML files and ``--set`` overrides in (``load_config`` /
  ``validate_config``), errors that name where they came from; ``node``: the ``node``
  and ``router`` sections;
- ``keypaths``: the grammar of a key path (``--set``'s and the study files'), and whether the
  configuration has that key;
- ``workload``: the ``workload`` section's models; ``strict``: the shared base model and
  the size and time types;
- ``hardware``: hardware profiles (``configs/hardware/``); ``modelshape``: model shapes
  (``configs/models/``); ``units``: sizes, times and rates as text; ``paths``: where the
  shipped configs are.

Nothing here runs a replay; the rest of kvsim reads a config only through these models.
"""

from kvsim.config.loading import (blame, load_config, parse_override, read_yaml,
                                  resolve_config_path, set_path, split_key, validate_config)
from kvsim.config.runconfig import ConfigFileError, RunConfig, host_fill, knob_problem

__all__ = ["ConfigFileError", "RunConfig", "blame", "host_fill", "knob_problem", "load_config", "parse_override",
           "read_yaml", "resolve_config_path", "set_path", "split_key", "validate_config"]
