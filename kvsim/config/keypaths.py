"""Config key paths: the one small grammar of ``--set key.path=value`` and of every key a
study or tune file names, and the check that a path names a key the configuration has.

Grammar (no spaces inside; surrounding spaces are ignored by ``--set``)::

    path    := segment ("." segment)*
    segment := name ("[" index "]")*
    name    := [A-Za-z_][A-Za-z0-9_]*
    index   := [0-9]{1,6}              (a list position, from 0)

``parse_key`` turns a path into its parts (``cache.tiers[1].quota`` -> ``('cache',
'tiers', 1, 'quota')``) or raises ``KeyPathError`` saying what is wrong and where: an
empty path or segment (``=3``, ``.=3``, ``a..b``), a bad index (``[x]``, ``[-1]``, ``[]``,
an unclosed ``[``), a character a name cannot have. ``unknown_key`` walks the parts down
the pydantic models of the configuration and says which part names no key there (with
the keys that part could be), so a typo fails before anything else runs. ``config_diff``
lists the key paths where two configurations differ (a study report's point against its
base; a hw run's recorded config against the one that re-predicts it). Pure functions.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Union

from pydantic import BaseModel

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INDEX = re.compile(r"\[([0-9]{1,6})\]")
MAX_INDEX_DIGITS = 6


class KeyPathError(ValueError):
    """A key path that the grammar does not accept; the message says what and where."""


def parse_key(path: str) -> tuple:
    """The parts of a key path (module docstring); KeyPathError when it is not one."""
    if not isinstance(path, str):
        raise KeyPathError(f"expected a key path such as cache.tiers[1].quota, got {path!r}")
    if not path:
        raise KeyPathError("the key is empty; expected a key path such as cache.tiers[1].quota")
    parts: list = []
    i, n = 0, len(path)
    while True:
        m = _NAME.match(path, i)
        if m is None:
            what = "the key ends" if i >= n else f"{path[i]!r} at column {i + 1}"
            if i < n and path[i] == ".":
                what = f"an empty part at column {i + 1}"
            raise KeyPathError(f"{what} where a key name belongs; expected a key path such as "
                               f"cache.tiers[1].quota")
        parts.append(m.group())
        i = m.end()
        while i < n and path[i] == "[":
            m = _INDEX.match(path, i)
            if m is None:
                close = path.find("]", i)
                inner = path[i + 1:close] if close > 0 else path[i + 1:]
                raise KeyPathError(f"bad list index [{inner}{']' if close > 0 else ''} at column "
                                   f"{i + 1}; expected [N] with N a whole number from 0")
            parts.append(int(m.group(1)))
            i = m.end()
        if i >= n:
            return tuple(parts)
        if path[i] != ".":
            raise KeyPathError(f"{path[i]!r} at column {i + 1} cannot be in a key; expected a key "
                               f"path such as cache.tiers[1].quota")
        i += 1


def format_key(parts: tuple | list) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out


def _unwrap(t: Any) -> list:
    """The types a field's annotation may hold, Annotated and Optional taken apart."""
    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(t)[0])
    if origin is Union or origin is types.UnionType:
        out = []
        for a in typing.get_args(t):
            if a is not type(None):
                out += _unwrap(a)
        return out
    return [t]


def unknown_key(parts: tuple, model: type[BaseModel]) -> str | None:
    """Why ``parts`` names no key of ``model`` (None: it may; a part under a value whose
    type says nothing, e.g. a free mapping, is left to validation)."""
    kinds: list = [model]
    for depth, part in enumerate(parts):
        here = format_key(parts[:depth]) or "the configuration"
        models = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        seqs = [k for k in kinds if typing.get_origin(k) in (list, tuple)]
        maps = [k for k in kinds if typing.get_origin(k) is dict]
        if isinstance(part, int):
            if not seqs:
                return f"{here} is not a list (no [{part}] in it)" if models or not maps else None
            args = typing.get_args(seqs[0])
            kinds = _unwrap(args[0] if args and (typing.get_origin(seqs[0]) is list or
                                                 args[-1] is Ellipsis or part >= len(args))
                            else args[part]) if args else [Any]
            continue
        if models:
            m = models[0]
            fields = {**{n: f for n, f in m.model_fields.items()},
                      **{f.alias: f for f in m.model_fields.values() if f.alias}}
            if part not in fields:
                keys = ", ".join(sorted(m.model_fields))
                return f"{format_key(parts[:depth + 1])}: no such key in {here} (its keys: {keys})"
            kinds = _unwrap(fields[part].annotation)
            continue
        if maps:
            args = typing.get_args(maps[0])
            kinds = _unwrap(args[1]) if len(args) == 2 else [Any]
            continue
        if seqs or Any in kinds or not kinds:
            return None if not seqs else f"{here} is a list; expected [N] before {part!r}"
        return f"{here} is a value, not a section (no key {part!r} in it)"
    return None


def field_at(parts: tuple, model: type[BaseModel]):
    """The pydantic field a key path ends at (None: a list item, a mapping's value, or no
    such key)."""
    kinds: list = [model]
    field = None
    for part in parts:
        models = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if isinstance(part, int):
            seqs = [k for k in kinds if typing.get_origin(k) in (list, tuple)]
            if not seqs:
                return None
            args = typing.get_args(seqs[0])
            kinds, field = (_unwrap(args[0]) if args else [Any]), None
            continue
        if not models or part not in models[0].model_fields:
            return None
        field = models[0].model_fields[part]
        kinds = _unwrap(field.annotation)
    return field


ABSENT = object()


def config_diff(base: Any, config: Any, skip: tuple[str, ...] = ("name",),
                prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(key, base value, this value) for each place two configs differ, as deep as both
    have the same shape: mappings key by key, lists of one length item by item; where
    the shapes part (a mapping against null, lists of other lengths) the whole value.
    A key only one side has is ``ABSENT`` on the other; top-level keys in ``skip`` are
    left out."""
    if isinstance(base, dict) and isinstance(config, dict):
        out = []
        for k in dict.fromkeys([*base, *config]):
            if not prefix and k in skip:
                continue
            out += config_diff(base.get(k, ABSENT), config.get(k, ABSENT), skip,
                               f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(base, list) and isinstance(config, list) and len(base) == len(config):
        out = []
        for i, (a, b) in enumerate(zip(base, config)):
            out += config_diff(a, b, skip, f"{prefix}[{i}]")
        return out
    return [] if base == config else [(prefix, base, config)]
