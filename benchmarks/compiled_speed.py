"""The optional compiled build (``KVSIM_COMPILE=1 pip install .``, mypyc) against the
pure-Python source, side by side: the whole Mooncake conversation trace replayed as
``benchmarks/sim_speed.py`` does (trace span / replay wall time), in interleaved pairs, each
replay in a fresh process. Checks that the compiled side really runs compiled modules and
the pure side the ``.py`` files, and that both give the same metrics (all but the wall
time). Last line: ``compiled_speedup_x: <median of the pairs' ratios>``.

The compiled side runs in its own virtual environment (``--venv``; built first when it is
missing or its build stamp differs from this checkout's sources: a venv, then
``KVSIM_COMPILE=1 pip install .`` from this checkout, about two minutes on a 2-core VM,
and the registry for the dependencies). The pure side runs this
checkout's source with the current interpreter.

    python3 benchmarks/compiled_speed.py [--venv local/compiled-venv] [--pairs 3] [--config C] [--trace PATH | --trace '']

Exits non-zero when the two sides' metrics differ (``.ci/run`` runs it once on the
default job, so a change that breaks the compiled build or its results fails CI).
"""

from __future__ import annotations

import argparse
import hashlib
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
prep = prepare_run(load_config(sys.argv[1], []), sys.argv[2] or None)
arrivals = [t.arrival_s for _, t in prep.workload.iter_turns()]
res = replay(prep)
m = dict(res.metrics)
wall = m.pop("wall_time_s")
span = max(arrivals) - min(arrivals) if sys.argv[2] else m["sim_time_s"]
print(json.dumps({"span": span, "wall": wall,
                  "metrics_sha256": hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest(),
                  "modules": [kvsim.core.manager.__file__, kvsim_backends.sim.fluid.__file__]}))
"""


def source_stamp() -> str:
    """A hash of what the install is built from (the packages' sources, configs and the
    build files): the compiled install is rebuilt when it changes."""
    h = hashlib.sha256()
    files = [ROOT / "setup.py", ROOT / "pyproject.toml"]
    for d in ("kvsim", "backends", "configs"):
        files += sorted(p for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".json"))
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def build_venv(venv: Path) -> Path:
    """The compiled install in ``venv``, (re)built when missing or older than the source."""
    py, stamp_file, stamp = venv / "bin" / "python", venv / "kvsim-source-stamp", source_stamp()
    if py.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return py
    print(f"# building the compiled install in {venv} (KVSIM_COMPILE=1 pip install .)", flush=True)
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(ROOT)]
                   if stamp_file.exists() else [str(py), "-m", "pip", "install", "-q", str(ROOT)],
                   check=True, env={**os.environ, "KVSIM_COMPILE": "1"})
    stamp_file.write_text(stamp)
    return py


def replay_once(python: str, env: dict, config: str, trace: str, cwd: str) -> dict:
    out = subprocess.run([python, "-c", DRIVER, config, trace], cwd=cwd, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"a replay with {python} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=str(ROOT / "local" / "compiled-venv"))
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--config", default=str(ROOT / "configs" / "mooncake-conversation.yaml"))
    ap.add_argument("--trace", default=str(ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"),
                    help="'' for the config's own workload (e.g. configs/default.yaml's synthetic sessions)")
    a = ap.parse_args()
    if a.pairs < 1:
        ap.error(f"--pairs: got {a.pairs}; expected >= 1")
    if a.trace and not Path(a.trace).is_file():
        ap.error(f"--trace {a.trace}: no such file")
    if Path(a.config).is_file():  # the replays run in a neutral folder
        a.config = str(Path(a.config).resolve())
    if a.trace:
        a.trace = str(Path(a.trace).resolve())
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
                what = "real time (trace span / wall)" if a.trace else "simulated time / wall"
                print(f"pair {i + 1}: compiled {sc:.1f}x, pure {sp:.1f}x {what} -> {sc / sp:.2f}x", flush=True)
    print(f"metrics_equal: {len(shas) == 1}")
    print(f"compiled_speedup_x: {statistics.median(ratios):.2f}")
    if len(shas) != 1:
        raise SystemExit("the compiled build's metrics differ from the pure source's")


if __name__ == "__main__":
    main()
