"""Layering: ``kvsim.core`` is pure policy. It imports nothing time- or I/O-bound (no
SimPy, CuPy, threads, event loops, clocks, processes, sockets, backends) and calls no
``open``, ``os.*`` or ``time.*``.

Two proofs: a fresh interpreter imports kvsim.core and looks at what got loaded (numpy
itself loads ``threading`` and ``time``, so those are checked against what importing numpy
alone loads); and every file of kvsim/core is parsed and its imports and calls checked.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
import textwrap

CORE = pathlib.Path(__file__).resolve().parents[1] / "kvsim" / "core"

FORBIDDEN = ("simpy", "cupy", "threading", "asyncio", "time", "subprocess", "socket",
             "kvsim_backends")

ALLOWED_IMPORTS = {
    "__future__", "abc", "array", "bisect", "collections", "dataclasses", "enum",
    "functools", "hashlib", "heapq", "itertools", "math", "numbers", "operator", "struct",
    "typing", "_sha256",  # (CPython's own SHA-256, as hashlib's: kvsim.core.keys)
    "numpy", "kvsim.core",
}

FORBIDDEN_CALLS = {"open", "input", "print", "exec", "eval", "__import__", "breakpoint"}
FORBIDDEN_NAMES = {"os", "time", "sys", "io", "random"}  # attribute access on these


def test_importing_core_loads_nothing_time_or_io_bound():
    code = textwrap.dedent(f"""
        import json, sys
        import numpy  # numpy may load threading/time itself: that is numpy's, not ours
        baseline = set(sys.modules)
        import kvsim.core, kvsim.core.audit
        mods = set(sys.modules)
        forbidden = {FORBIDDEN!r}
        def hit(names):
            return sorted(m for m in names if m.split(".")[0] in forbidden)
        print(json.dumps({{"new": hit(mods - baseline), "all": hit(mods)}}))
    """)
    root = CORE.parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["new"] == [], f"kvsim.core loaded {found['new']}"
    # nothing outside numpy's own threading/time may be there at all
    assert set(found["all"]) <= {"threading", "time"}, found["all"]


def _imports(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: inside kvsim.core
                yield node.lineno, "kvsim.core"
            else:
                yield node.lineno, node.module or ""


def _allowed(mod: str) -> bool:
    return any(mod == a or mod.startswith(a + ".") for a in ALLOWED_IMPORTS)


def test_core_sources_import_only_pure_modules_and_call_no_io():
    files = sorted(CORE.glob("*.py"))
    assert files, CORE
    problems = []
    for f in files:
        tree = ast.parse(f.read_text(), filename=str(f))
        for line, mod in _imports(tree):
            if not _allowed(mod):
                problems.append(f"{f.name}:{line}: imports {mod}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in FORBIDDEN_CALLS:
                problems.append(f"{f.name}:{node.lineno}: calls {node.func.id}()")
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in FORBIDDEN_NAMES:
                problems.append(f"{f.name}:{node.lineno}: uses {node.value.id}.{node.attr}")
    assert not problems, "kvsim.core must stay pure:\n" + "\n".join(problems)


BACKEND_IMPORTERS = {"run.py"}


def test_only_the_backend_registry_imports_the_backends():
    """kvsim depends on kvsim_backends in one place: the backend registry (kvsim/run.py:
    ``BACKENDS``, ``sim_backend``, ``measure_hardware``). Everything else in kvsim reaches
    a backend through it, so the backends can depend on kvsim without a circle elsewhere."""
    root = CORE.parent
    found = set()
    for f in sorted(root.rglob("*.py")):
        for _, mod in _imports(ast.parse(f.read_text(), filename=str(f))):
            if mod.split(".")[0] in ("kvsim_backends", "backends"):
                found.add(str(f.relative_to(root)))
    assert found == BACKEND_IMPORTERS, f"kvsim modules importing kvsim_backends: {sorted(found)}"
