"""Optional compiled build (mypyc). The default install is pure Python; this file adds
nothing unless KVSIM_COMPILE=1 is set:

    KVSIM_COMPILE=1 pip install .        # not -e: mypyc builds extension modules

compiles the simulator's hot modules (kvsim/core, kvsim/engine's step loop and turn
lifecycle, kvsim/engine/compute.py, backends/kvsim_backends/sim) with mypyc into C extensions that take
precedence over the .py files. Results are identical; benchmarks/compiled_speed.py
measures the speed-up side by side (README: "Compiled build (optional)"). mypy is fetched
as a build requirement only then.
"""

import os
import sys
from pathlib import Path

from setuptools import setup

COMPILE = os.environ.get("KVSIM_COMPILE") == "1"

# Not compiled: kvsim/core/errors.py and kvsim/engine/refcheck.py (exceptions subclassing
# builtins: unsupported by mypyc native classes), kvsim/core/datapath/copypath.py (its public
# function accepts a str where the annotation says CopyPath; mypyc would enforce it),
# kvsim/core/audit.py (a checker, not type-clean), kvsim/engine/metrics.py (mypyc turns a
# dataclass ClassVar into a field: mypyc/mypyc#1122), and the package __init__ files.
CORE = ["retained", "eviction", "lending", "keys", "manager", "queries", "pages", "destinations", "plan", "commits", "request",
        "spec", "stats", "statepages", "tiers", "tree", "types"]
ENGINE = ["engine", "lifestate", "statemoves", "lifecycle", "live", "arrivals", "decoders", "sessions", "stages", "compute"]
SIM = ["backend", "fluid", "flow", "fairshare", "runtime", "transfer", "servers", "stepjob", "smshare"]


def _compiled():
    from mypyc.build import mypycify  # noqa: PLC0415 (a build requirement only when compiling)

    # mypyc names a module after its folders: backends/kvsim_backends/sim/x.py is
    # kvsim_backends.sim.x, the name it is imported by
    paths = ([f"kvsim/core/{m}.py" for m in CORE] + [f"kvsim/engine/{m}.py" for m in ENGINE]
             + [f"backends/kvsim_backends/sim/{m}.py" for m in SIM])
    return mypycify(paths, opt_level="3")


if COMPILE:
    try:
        ext_modules = _compiled()
    except ImportError:
        if "egg_info" not in sys.argv:  # a build, not setuptools asking what it requires
            raise SystemExit("KVSIM_COMPILE=1 needs mypy (it provides mypyc) to build") from None
        ext_modules = []  # setuptools asks for the build requirements before mypy is there
    setup(ext_modules=ext_modules, setup_requires=["mypy>=1.10"])
else:
    setup()
