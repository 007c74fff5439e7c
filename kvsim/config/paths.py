"""Where the shipped configs are: the checkout's ``configs/`` (a source tree or an editable
install), else the copy a wheel installs as the package ``kvsim_configs`` (a plain
``pip install .``, which the compiled build needs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def find_configs(checkout: Path | None = None) -> Path:
    """The configs folder: ``checkout / 'configs'`` when it is a folder (by default the
    checkout this module sits in), else the installed ``kvsim_configs``; else that first
    path, which errors then name."""
    here = (checkout or Path(__file__).resolve().parents[2]) / "configs"
    if here.is_dir():
        return here
    spec = importlib.util.find_spec("kvsim_configs")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return here


CONFIGS = find_configs()
