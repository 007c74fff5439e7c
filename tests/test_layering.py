"""Layering: ``kvsim.core`` is pure policy. It imports nothing time- or I/O-bound (no
SimPy, CuPy, threads, event loops, clocks, processes, sockets, backends) and calls no
``open``, ``os.*`` or ``time.*``.

Two proofs: a fresh interpreter imports kvsim.core and looks at what got loaded (numpy
itself loads ``threading`` and ``time``, so those are checked against what importing numpy
alone loads); and every file of kvsim/core is parsed and its imports and calls checked.

And no import circles anywhere in the product: the module graph of kvsim/ and backends/
(installed as ``kvsim_backends``), built from every import statement in the source
(``TYPE_CHECKING`` blocks and imports inside functions included), has no cycle.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE = ROOT / "kvsim" / "core"
PACKAGES = {"kvsim": ROOT / "kvsim", "kvsim_backends": ROOT / "backends" / "kvsim_backends"}  # import name -> folder

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
        import importlib, pkgutil  # (the walk's own tools, before the baseline)
        baseline = set(sys.modules)
        import kvsim.core
        loaded = [m.name for m in pkgutil.walk_packages(kvsim.core.__path__, "kvsim.core.")]
        for m in loaded:  # every module of the core, not only what its __init__ loads
            importlib.import_module(m)
        assert len(loaded) > 20 and "kvsim.core.routing" in loaded, loaded
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


#: numpy's random module: its module-level functions draw from one unseeded global state
#: (a seeded choice in kvsim.core is a generator of its own: kvsim.core.routing.SplitMix)
FORBIDDEN_SUBMODULES = ("numpy.random",)


def _impurities(tree: ast.AST, name: str) -> list[str]:
    """What in one parsed core source breaks purity: imports outside ALLOWED_IMPORTS (and
    numpy.random), calls of FORBIDDEN_CALLS, attributes of FORBIDDEN_NAMES, and any
    ``numpy.random`` / ``np.random`` reached through numpy."""
    problems = []
    numpy_names = {"numpy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            numpy_names |= {a.asname for a in node.names if a.name == "numpy" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "numpy":
            if any(a.name == "random" for a in node.names):
                problems.append(f"{name}:{node.lineno}: imports numpy.random")
    for line, mod in _imports(tree):
        if not _allowed(mod) or any(mod == b or mod.startswith(b + ".")
                                    for b in FORBIDDEN_SUBMODULES):
            problems.append(f"{name}:{line}: imports {mod}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in FORBIDDEN_CALLS:
            problems.append(f"{name}:{node.lineno}: calls {node.func.id}()")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in FORBIDDEN_NAMES:
            problems.append(f"{name}:{node.lineno}: uses {node.value.id}.{node.attr}")
        if isinstance(node, ast.Attribute) and node.attr == "random" \
                and isinstance(node.value, ast.Name) and node.value.id in numpy_names:
            problems.append(f"{name}:{node.lineno}: uses {node.value.id}.random")
    return problems


def test_core_sources_import_only_pure_modules_and_call_no_io():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 20, CORE  # the whole core, not an empty or moved folder
    problems = []
    for f in files:
        problems += _impurities(ast.parse(f.read_text(), filename=str(f)), f.name)
    assert not problems, "kvsim.core must stay pure:\n" + "\n".join(problems)


def test_the_purity_check_can_fail():
    bad = {
        "import time\n": "imports time",
        "import simpy\n": "imports simpy",
        "import random\n": "imports random",
        "import numpy as np\nx = np.random.rand()\n": "uses np.random",
        "import numpy.random\n": "imports numpy.random",
        "from numpy.random import default_rng\n": "imports numpy.random",
        "from numpy import random\n": "imports numpy.random",
        "f = open('x')\n": "calls open()",
        "import kvsim_backends.sim\n": "imports kvsim_backends.sim",
    }
    for src, what in bad.items():
        found = _impurities(ast.parse(src), "m.py")
        assert any(what in p for p in found), (src, found)
    good = "import numpy as np\nfrom kvsim.core.keys import sha256\nx = np.zeros(3)\n"
    assert _impurities(ast.parse(good), "m.py") == []


BACKEND_IMPORTERS = {"run/pipeline.py"}


def test_only_the_backend_registry_imports_the_backends():
    """kvsim depends on kvsim_backends in one place: the backend registry (kvsim/run/pipeline.py:
    ``BACKENDS``, ``sim_backend``, ``measure_hardware``). Everything else in kvsim reaches
    a backend through it, so the backends can depend on kvsim without a circle elsewhere."""
    root = CORE.parent
    found = set()
    for f in sorted(root.rglob("*.py")):
        for _, mod in _imports(ast.parse(f.read_text(), filename=str(f))):
            if mod.split(".")[0] in ("kvsim_backends", "backends"):
                found.add(str(f.relative_to(root)))
    assert found == BACKEND_IMPORTERS, f"kvsim modules importing kvsim_backends: {sorted(found)}"


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, for every module of the packages."""
    mods = {}
    for name, folder in PACKAGES.items():
        for f in sorted(folder.rglob("*.py")):
            parts = [name, *f.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


def import_graph(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``mods`` it imports. ``from a.b import c`` imports the
    module ``a.b.c`` when there is one, else ``a.b``; a name outside ``mods`` counts as
    its nearest enclosing module in ``mods`` (none: not ours, left out)."""
    graph: dict[str, set[str]] = {}
    for mod, f in mods.items():
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, one level up per extra dot
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    deps.add(t)
        graph[mod] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules in order, the first repeated at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        stack = [iter(sorted(graph[start]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The modules caught in import circles, one set per tangle (a strongly connected
    component of more than one module)."""
    reach = {m: _reachable(graph, m) for m in graph}
    out: set[frozenset[str]] = set()
    for m in graph:
        tangle = frozenset(n for n in reach[m] if m in reach[n])
        if m in reach[m] and len(tangle) > 1:
            out.add(tangle)
    return sorted(out, key=sorted)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


# Circles the lead knows of and that are to be removed: each entry must still exist (else
# delete it here), and no other may appear. kvsim.tools.fit's sim check reaches the backend
# registry (kvsim.run), whose measure_hardware imports the hw calibration, which imports
# kvsim.tools.fit's Measured and batch (all three through function-level imports but the last).
KNOWN_CIRCLES: list[frozenset] = []


def test_the_cycle_finder_finds_a_circle_and_passes_a_tree():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    assert circles(g) == [frozenset("abc"), frozenset("ef")]
    tree = {"a": {"b", "c"}, "b": {"c"}, "c": set()}
    assert find_cycle(tree) is None and circles(tree) == []


def test_the_import_graph_sees_type_checking_and_relative_imports():
    mods = _modules()
    graph = import_graph(mods)
    # kvsim.core.tiers imports Page only under TYPE_CHECKING; the sim backend's fluid
    # model imports its runtime relatively (``from .runtime import ...``)
    assert "kvsim.core.pages" in graph["kvsim.core.tiers"]
    assert "kvsim_backends.sim.runtime" in graph["kvsim_backends.sim.fluid"]
    assert "kvsim.core.manager" in graph["kvsim.core"]  # the package's __init__


def test_no_import_circles_in_kvsim_and_its_backends():
    graph = import_graph(_modules())
    found = circles(graph)
    new = [c for c in found if c not in KNOWN_CIRCLES]
    gone = [c for c in KNOWN_CIRCLES if c not in found]
    described = [" -> ".join(find_cycle({m: graph[m] & c for m in c}) or sorted(c)) for c in new]
    assert not new, "import circle: " + "; ".join(described)
    assert not gone, f"no longer a circle, remove it from KNOWN_CIRCLES: {[sorted(c) for c in gone]}"


# -- the package map (README, "Layout"): what may import what --------------------------

#: a part of the product (a package, or a top-level module) -> the parts it may import.
#: Every import counts: function-level and TYPE_CHECKING ones too.
MAY_IMPORT: dict[str, set[str]] = {
    "kvsim.core": set(),                       # pure policy (tested above: stdlib + numpy)
    "kvsim.backend": {"kvsim.core"},           # the Backend and Runtime protocols
    "kvsim.settings": {"kvsim.core", "kvsim.config"},  # what a backend is built from
    "kvsim.scratch": set(),
    "kvsim.config": {"kvsim.core"},
    "kvsim.workload": {"kvsim.core"},
    "kvsim.engine": {"kvsim.core", "kvsim.backend", "kvsim.config", "kvsim.workload"},
    # the backends: the core, the protocols and their settings; never the config
    "kvsim_backends": {"kvsim.core", "kvsim.backend", "kvsim.settings", "kvsim.scratch",
                       "kvsim.tools.measured", "kvsim.tools.hwloop"},
    "kvsim.run": {"kvsim", "kvsim.core", "kvsim.backend", "kvsim.settings", "kvsim.scratch",
                  "kvsim.config", "kvsim.workload", "kvsim.engine", "kvsim_backends"},
    "kvsim.tools": {"kvsim.core", "kvsim.backend", "kvsim.settings", "kvsim.config",
                    "kvsim.workload", "kvsim.engine", "kvsim.run"},
    "kvsim.study": {"kvsim.core", "kvsim.config", "kvsim.workload", "kvsim.run",
                    "kvsim.tools", "kvsim.console", "kvsim.scratch"},
    "kvsim.console": {"kvsim.config", "kvsim.run", "kvsim.scratch"},
    "kvsim.cli": {"kvsim", "kvsim.cli_studies", "kvsim.core", "kvsim.backend", "kvsim.config", "kvsim.workload",
                  "kvsim.engine", "kvsim.run", "kvsim.tools", "kvsim.study", "kvsim.console",
                  "kvsim.scratch"},
    "kvsim.cli_studies": {"kvsim.console", "kvsim.scratch", "kvsim.run", "kvsim.study",
                          "kvsim.config"},
    "kvsim.entry": {"kvsim.cli"},
    "kvsim.__main__": {"kvsim.entry"},          # python -m kvsim
    "kvsim": set(),                            # the package's face: its version
}


def _part(mod: str) -> str:
    """The part of the map ``mod`` belongs to: the longest key that is it or encloses it
    (``kvsim.tools.measured`` is its own, for the backends' sake)."""
    best = ""
    for k in MAY_IMPORT:
        if (mod == k or mod.startswith(k + ".")) and len(k) > len(best):
            best = k
    for k in ("kvsim.tools.measured", "kvsim.tools.hwloop"):
        if mod == k:
            return k
    return best


def test_every_module_is_in_the_map_and_imports_only_what_it_may():
    graph = import_graph(_modules())
    problems = []
    for mod, deps in sorted(graph.items()):
        me = _part(mod)
        if me == "kvsim" and mod != "kvsim":
            problems.append(f"{mod}: not in the package map (add it to MAY_IMPORT and README)")
            continue
        allowed = MAY_IMPORT.get(me, MAY_IMPORT.get(me.rpartition(".")[0], set()))
        for d in sorted(deps):
            them = _part(d)
            if them == me or them.startswith(me + ".") or me.startswith(them + "."):
                continue  # within one part
            if them not in allowed and not any(them.startswith(a + ".") for a in allowed):
                problems.append(f"{mod} imports {d} ({them}), which {me} may not")
    assert not problems, "\n".join(problems)


def test_the_backends_are_built_from_the_settings_alone():
    """Both backends are built as ``Backend(runtime, settings)``: the same two parameters,
    the settings typed as ``kvsim.settings.BackendSettings``."""
    import inspect

    from kvsim_backends.hw import HwBackend
    from kvsim_backends.sim import SimBackend

    for cls in (SimBackend, HwBackend):
        params = list(inspect.signature(cls.__init__).parameters.values())
        assert [p.name for p in params] == ["self", "runtime", "settings"], cls
        assert "BackendSettings" in str(params[2].annotation), cls


def _private_reaches(tree: ast.AST, own: str) -> list[tuple[int, str]]:
    """``_name``s imported from another module, or read as ``module._name`` off an
    imported module (``own``: this module's dotted name)."""
    out = []
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            src = node.module or ""
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__") and src != own:
                    out.append((node.lineno, f"from {'.' * node.level}{src} import {a.name}"))
                else:
                    modules.add(a.asname or a.name)  # (may be a module)
        elif isinstance(node, ast.Import):
            for a in node.names:
                modules.add(a.asname or a.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__") and isinstance(node.value, ast.Name) \
                and node.value.id in modules and node.value.id[:1].islower():
            out.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return out


def test_no_module_reaches_into_another_modules_private_names():
    problems = []
    for mod, f in _modules().items():
        for line, what in _private_reaches(ast.parse(f.read_text()), mod):
            problems.append(f"{f.relative_to(ROOT)}:{line}: {what}")
    assert not problems, "private names used from outside their module:\n" + "\n".join(problems)


def test_the_private_reach_check_can_fail():
    tree = ast.parse("from kvsim.core.keys import _x\nimport os\nos._exit(0)\n")
    assert [w for _, w in _private_reaches(tree, "m")] == ["from kvsim.core.keys import _x", "os._exit"]


#: file names that may repeat: the paired roles of the two backends, and the protocol
PAIRED = {"backend.py", "runtime.py", "hostfill.py"}


def test_module_names_are_unique_and_files_small():
    seen: dict[str, list[str]] = {}
    long = []
    for f in _modules().values():
        rel = str(f.relative_to(ROOT))
        seen.setdefault(f.name, []).append(rel)
        n = len(f.read_text().splitlines())
        if n > 450:
            long.append(f"{rel}: {n} lines")
    dup = {k: v for k, v in seen.items() if len(v) > 1 and k != "__init__.py"}
    for name, where in list(dup.items()):
        backends = [w for w in where if w.startswith("backends/")]
        paired = name in PAIRED and sorted(w.split("/")[2] for w in backends) == ["hw", "sim"] \
            and set(where) - set(backends) <= {"kvsim/backend.py"}
        if paired:
            del dup[name]
    assert not dup, f"module file names that repeat: {dup}"
    assert not long, "modules over 450 lines (one job a module):\n" + "\n".join(long)
