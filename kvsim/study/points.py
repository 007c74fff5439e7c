"""A study's points: its axes expanded into resolved, validated run configs.

Order: traces x variants x zipped rows x grid (first key slowest) x seeds. Each point's
config is the base config's YAML, then the study's ``set``, then the command line's
``--set``, then the variant's ``set``, then the point's axis values, the seed and the
trace; it is validated like a run config, and an invalid one is an error naming the study
file, the point and the key. A point's name comes from its parameters (``variant__host=
64GiB__seed=1``); its hash is over the fully resolved config, the backend and the content
of the trace it replays and of the user's own profile and model files (``inputs_digest``:
a file rewritten under the same path is another input), so a finished point is
recognised when the study runs again (kvsim.study.execute).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from kvsim.config import (ConfigFileError, load_config, read_yaml, resolve_config_path, set_path,
                          split_key, validate_config)
from kvsim.config.hardware import CONFIG_DIR, profile_file
from kvsim.config.hfmodel import model_file
from kvsim.run.tracepath import TRACE_KINDS
from kvsim.study.definition import StudyFileError, StudySpec

_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


@dataclass(frozen=True)
class Point:
    name: str
    params: dict            # column label -> the value as the study file wrote it
    numeric: dict           # column label -> the resolved number (axes with numbers only)
    variant: str | None
    config: dict            # the resolved run config (RunConfig.model_dump(mode="json"))
    backend: str = "sim"
    hash: str = ""
    split: dict | None = field(default=None)   # tune: {"part", "held_out", "seed"}


def get_key(data: Any, dotted: str) -> Any:
    node = data
    for part in split_key(dotted):
        node = node[part]
    return node


def config_hash(config: dict, backend: str, split: dict | None = None,
                inputs: str | None = None) -> str:
    """``inputs``: ``inputs_digest`` of what the config reads besides itself (None: none)."""
    what: dict = {"config": config, "backend": backend, "split": split}
    if inputs is not None:
        what["inputs"] = inputs
    blob = json.dumps(what, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def inputs_digest(config: dict, known: dict[str, str | None]) -> str | None:
    """A digest of the content of what a resolved config reads besides itself: the trace it
    replays (a Mooncake file; an agentic file, or the session files of a folder its
    ``limit`` keeps, by name and content) and the user's own hardware profile and model
    files (``hardware:`` / ``model:`` paths; a shipped preset's content goes with kvsim's
    version). None where it reads none of these (a synthetic workload on presets), so such
    a point's hash is its config's alone; a file that cannot be read counts as absent (the
    point then fails and says why). ``known``: digests already taken, by path, this plan."""
    parts = [_trace_part(config, known)]
    for key, where in (("hardware", profile_file), ("model", model_file)):
        if isinstance(config.get(key), str):
            path = os.path.abspath(where(config[key]))
            if not path.startswith(os.path.abspath(CONFIG_DIR) + os.sep):
                parts.append(_digest(key, [path], known))
    if parts[1:] == [None] * (len(parts) - 1):
        return parts[0]  # (no user file: the trace's digest alone, as before)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _trace_part(config: dict, known: dict[str, str | None]) -> str | None:
    w = config.get("workload") or {}
    if w.get("kind") not in TRACE_KINDS or not w.get("path"):
        return None
    path = os.path.abspath(os.path.expanduser(w["path"]))
    try:
        from kvsim.workload.agentic import session_files

        files = session_files(path)[:w.get("limit")] if os.path.isdir(path) else [path]
    except (OSError, ValueError):
        return None
    return _digest(json.dumps([path, w.get("limit")]), files, known)


def _digest(key: str, files: list[str], known: dict[str, str | None]) -> str | None:
    """A digest of ``files`` by name and content (cached in ``known`` under ``key``), None
    where one cannot be read."""
    if key not in known:
        try:
            h = hashlib.sha256()
            for f in files:
                h.update(os.path.basename(f).encode() + b"\0")
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                h.update(b"\0")
            known[key] = h.hexdigest()[:16]
        except OSError:
            known[key] = None
    return known[key]


def base_data(spec_base: str, source: str) -> tuple[str, dict]:
    """The base config's raw YAML (a mapping), and its path."""
    try:
        p = resolve_config_path(spec_base)
        load_config(p)  # the base on its own must be a valid config
        data = read_yaml(p)
    except ConfigFileError as e:
        raise StudyFileError(f"{source}: base: {e}") from None
    return str(p), data


def apply(data: dict, overrides: dict, where: str) -> None:
    for key, value in overrides.items():
        try:
            set_path(data, key, value)
        except ConfigFileError as e:
            raise StudyFileError(f"{where}: {e}") from None


def _tokens(key: str) -> list[str]:
    """``cache.tiers[1].quota`` -> ['cache', 'tiers[1]', 'quota']."""
    out: list[str] = []
    for p in split_key(key):
        if isinstance(p, int) and out:
            out[-1] += f"[{p}]"
        else:
            out.append(str(p))
    return out


def labels_for(keys: list[str], given: dict[str, str]) -> dict[str, str]:
    """Short column names: the key's last part, with more parts where two would clash."""
    toks = {k: _tokens(k) for k in keys}
    out = {}
    for k in keys:
        if k in given:
            out[k] = given[k]
            continue
        t = toks[k]
        for n in range(1, len(t) + 1):
            if not any(o != k and toks[o][-n:] == t[-n:] for o in keys):
                break
        out[k] = ".".join(t[-n:])
    return out


def axis_keys(spec: StudySpec) -> dict[str, str]:
    """Column label -> the config key of each grid and zip axis."""
    keys = [*spec.zipped, *spec.grid]
    return {label: key for key, label in labels_for(keys, spec.labels).items()}


def _show(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def point_name(variant: str | None, params: dict) -> str:
    bits = [variant] if variant else []
    bits += [f"{k}={_show(v)}" for k, v in params.items()]
    name = "__".join(_UNSAFE.sub("-", b.replace("[", "").replace("]", "")) for b in bits) or "base"
    return name[:200]


def unique_names(names: list[str]) -> list[str]:
    """Point names, each once: a name given again (two values that print alike, or a value
    cut at 200 characters) gets ``__1``, ``__2``, ... (the first suffix no other point's
    name has, so it never becomes another point's name and folder)."""
    taken = set(names)
    out: list[str] = []
    done: set[str] = set()
    for n in names:
        if n in done:
            k = 1
            while f"{n}__{k}" in taken:
                k += 1
            n = f"{n}__{k}"
            taken.add(n)
        done.add(n)
        out.append(n)
    return out


def _params(labels: dict[str, str], axis_values: dict, seed: int | None, trace: str | None) -> dict:
    """A point's parameters by column label (the axis values as the study file wrote them)."""
    params = {labels[k]: v for k, v in axis_values.items()}
    if seed is not None:
        params["seed"] = seed
    if trace is not None:
        params["trace"] = os.path.basename(os.path.normpath(trace))
    return params


def overridden_base(spec, source: str, cli_overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """The raw data of a study's or tune's base config with its ``set`` and then the
    command line's ``--set`` applied (errors name the study file or the argument)."""
    from kvsim.config import parse_override

    _, base = base_data(spec.base, source)
    apply(base, spec.overrides, f"{source}: set")
    for ov in cli_overrides:
        try:
            key, value = parse_override(ov)
        except ConfigFileError as e:
            raise StudyFileError(str(e)) from None
        try:
            set_path(base, key, value)
        except ConfigFileError as e:
            raise StudyFileError(f"--set {ov}: {str(e).removeprefix(key + ': ')}") from None
    return base


def _distinct_grid_values(spec: StudySpec, points: list[Point], source: str,
                          labels: dict[str, str]) -> None:
    """A grid axis whose values repeat, as given or once resolved (``8GiB`` and ``8192MiB``),
    would replay each such point twice: StudyFileError naming the axis. (Variants may
    equal one another or the base: each is named, and the table flags equal results.)"""
    for key, values in spec.grid.items():
        given = [json.dumps(v, sort_keys=True) for v in values]
        twice = next((v for i, v in enumerate(values) if given.index(given[i]) != i), None)
        if twice is not None:
            raise StudyFileError(f"{source}: grid: {key}: {twice!r} is given twice; expected "
                                 "each value once")
        seen: dict[str, Any] = {}
        for pt in points:
            raw = pt.params[labels[key]]
            now = json.dumps(get_key(pt.config, key), sort_keys=True)
            first = seen.setdefault(now, raw)
            if json.dumps(first, sort_keys=True) != json.dumps(raw, sort_keys=True):
                raise StudyFileError(f"{source}: grid: {key}: {first!r} and {raw!r} are one value "
                                     "once resolved; expected each value once")


def expand(spec: StudySpec, source: str, cli_overrides: list[str] | tuple[str, ...] = ()) -> list[Point]:
    """Every point of the study, validated, in order. ``source``: the study file's path."""
    base = overridden_base(spec, source, cli_overrides)
    keys = [*spec.zipped, *spec.grid]
    labels = labels_for(keys, spec.labels)
    n_zip = len(next(iter(spec.zipped.values()))) if spec.zipped else 1
    zip_rows = [{k: v[i] for k, v in spec.zipped.items()} for i in range(n_zip)]
    grid_rows = [dict(zip(spec.grid, combo)) for combo in itertools.product(*spec.grid.values())]
    variants = spec.variants or [None]
    seeds = spec.seeds or [None]
    traces = spec.traces or [None]
    points: list[Point] = []
    digests: dict[str, str | None] = {}
    combos = list(itertools.product(traces, variants, zip_rows, grid_rows, seeds))
    names = unique_names([point_name(v.name if v else None, _params(labels, {**z, **g}, seed, trace))
                          for trace, v, z, g, seed in combos])
    for name, (trace, variant, zrow, grow, seed) in zip(names, combos):
        data = copy.deepcopy(base)
        vname = variant.name if variant else None
        if variant:
            apply(data, variant.overrides, f"{source}: variants[{vname}]")
        axis_values = {**zrow, **grow}
        for key, value in axis_values.items():
            apply(data, {key: value}, f"{source}: {'zip' if key in spec.zipped else 'grid'}")
        if seed is not None:
            data["seed"] = seed
        if trace is not None:
            apply(data, {"workload.path": trace}, f"{source}: traces")
        params = _params(labels, axis_values, seed, trace)
        data["name"] = f"{spec.name}.{name}"
        try:
            cfg = validate_config(data, f"{source}: point {name}")
        except ConfigFileError as e:
            raise StudyFileError(str(e)) from None
        if trace is not None and cfg.workload.kind not in TRACE_KINDS:
            raise StudyFileError(f"{source}: traces: point {name} would not replay {trace}: its "
                                 f"workload.kind is {cfg.workload.kind}, which replays no trace; "
                                 f"expected {' or '.join(TRACE_KINDS)} (in the base config or set:)")
        resolved = cfg.model_dump(mode="json")
        numeric = {}
        for key in axis_values:
            v = get_key(resolved, key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                numeric[labels[key]] = v
        if seed is not None:
            numeric["seed"] = seed
        points.append(Point(name, params, numeric, vname, resolved, spec.backend,
                            config_hash(resolved, spec.backend, inputs=inputs_digest(resolved, digests))))
    _distinct_grid_values(spec, points, source, labels)
    if spec.baseline is not None and spec.baseline not in {p.name for p in points}:
        names = ", ".join(p.name for p in points[:8]) + (", ..." if len(points) > 8 else "")
        raise StudyFileError(f"{source}: baseline: no point named {spec.baseline!r} (points: {names})")
    return points
