"""The optional compiled build (``KVSIM_COMPILE=1 pip install .``, mypyc) against the
pure-Python source, side by side: the whole Mooncake conversation trace replayed as
``benchmarks/sim_speed.py`` does (trace span / replay wall time), in interleaved pairs, each
replay in a fresh process. Checks that the compiled side really runs compiled modules and
the pure side the ``.py`` files, and that both give the same metrics (all but the wall
time). Last line: ``compiled_speedup_x: <median of the pairs' ratios>``.

The compiled side runs in its own virtual environment (``--venv``; built first when it is
missing: a venv, then ``KVSIM_COMPILE=1 pip install .`` from this checkout, about two
minutes on a 2-core VM, and the registry for the dependencies). The pure side runs this
checkout's source with the current interpreter.

    python3 benchmarks/compiled_speed.py [--venv local/compiled-venv] [--pairs 3] [--trace PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One replay; prints a JSON line. Run from a neutral folder so that the compiled side
# imports its installed package, not this checkout.
DRIVER = r"""
import hashlib, json, sys
import kvsim.core.manager, kvsim_backends.sim.fluid
from kvsim.config import load_config
from kvsim.run import prepare_run, replay
prep = prepare_run(load_config(sys.argv[1], []), sys.argv[2])
arrivals = [t.arrival_s for _, t in prep.workload.iter_turns()]
res = replay(prep)
m = dict(res.metrics)
wall = m.pop("wall_time_s")
print(json.dumps({"span": max(arrivals) - min(arrivals), "wall": wall,
                  "metrics_sha256": hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest(),
                  "modules": [kvsim.core.manager.__file__, kvsim_backends.sim.fluid.__file__]}))
"""


def build_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if py.exists():
        return py
    print(f"# building the compiled install in {venv} (KVSIM_COMPILE=1 pip install .)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], check=True,
                   env={**os.environ, "KVSIM_COMPILE": "1"})
    return py


def replay_once(python: str, env: dict, config: str, trace: str, cwd: str) -> dict:
    out = subprocess.run([python, "-c", DRIVER, config, trace], cwd=cwd, env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=str(ROOT / "local" / "compiled-venv"))
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--config", default=str(ROOT / "configs" / "mooncake-conversation.yaml"))
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"))
    a = ap.parse_args()
    if a.pairs < 1:
        ap.error(f"--pairs: got {a.pairs}; expected >= 1")
    if not Path(a.trace).is_file():
        ap.error(f"--trace {a.trace}: no such file")
    compiled_py = str(build_venv(Path(a.venv)))
    # the pure side: this checkout first on the path, its backends folder as kvsim_backends
    with tempfile.TemporaryDirectory(prefix="kvsim-pure-") as stage:
        os.symlink(ROOT / "backends", Path(stage) / "kvsim_backends")
        pure_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), stage])}
        comp_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        with tempfile.TemporaryDirectory(prefix="kvsim-cwd-") as cwd:
            ratios, shas = [], set()
            for i in range(a.pairs):
                c = replay_once(compiled_py, comp_env, a.config, a.trace, cwd)
                p = replay_once(sys.executable, pure_env, a.config, a.trace, cwd)
                if i == 0:
                    print(f"# compiled side runs {c['modules']}\n# pure side runs {p['modules']}")
                    if not all(m.endswith(".so") for m in c["modules"]):
                        raise SystemExit("the compiled side imported .py modules: is --venv a compiled install?")
                    if not all(m.endswith(".py") for m in p["modules"]):
                        raise SystemExit("the pure side imported compiled modules")
                sc, sp = c["span"] / c["wall"], p["span"] / p["wall"]
                ratios.append(sc / sp)
                shas |= {c["metrics_sha256"], p["metrics_sha256"]}
                print(f"pair {i + 1}: compiled {sc:.1f}x, pure {sp:.1f}x real time -> {sc / sp:.2f}x", flush=True)
    print(f"metrics_equal: {len(shas) == 1}")
    print(f"compiled_speedup_x: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
