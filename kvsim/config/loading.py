"""Loading a run configuration: YAML files (duplicate keys refused) and ``--set``
overrides applied to the raw YAML, validated by ``kvsim.config.runconfig``'s models; and
the errors, one line each, that name their source: the ``--set`` argument that wrote the
key (for a rule across keys that the file alone keeps, the arguments that break it, found
by validating again without each), else ``FILE:LINE``, then the key path, what is wrong
and what was given.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from kvsim.config.keypaths import KeyPathError, format_key, parse_key, unknown_key
from kvsim.config.paths import CONFIGS
from kvsim.config.runconfig import ConfigFileError, RunConfig
from kvsim.config.yamlfile import YamlFileError, load_bytes, read_strict


def _loc(loc: tuple) -> str:
    return format_key(loc) or "(top level)"


def _error_loc(e: Any) -> str:
    return _loc(tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))))


def format_error(err: ValidationError, source: str, overrides: tuple[tuple[str, str], ...] = (),
            lines: dict[str, int] | None = None, alone: set[str] | None = None,
            at_fault: Callable[[str, str], list[str]] | None = None) -> str:
    """One line per error, naming its source: the ``--set`` argument that wrote the key
    (or one around it), else ``FILE:LINE`` (``lines``: key path -> line in the file; the
    nearest enclosing key's line for a key the file does not have), and the key path,
    what is wrong and what was given. ``alone``: the key paths of the errors the file
    has without the overrides; an error the file alone does not have, at a key that
    overrides wrote inside (a rule across keys, ``workload``'s), was caused by those:
    ``at_fault(loc, msg)`` says which (``--set`` arguments; several: only together),
    else the last one that wrote inside the key is named."""
    out = []
    for e in err.errors():
        loc = _error_loc(e)
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        got_s = "" if isinstance(got, (dict, list)) or got is None or repr(got) in msg \
            else f" (got {got!r})"
        arg = next((text for key, text in reversed(overrides) if _within(loc, key)), None)
        args = [arg] if arg is not None else []
        if not args and overrides and alone is not None and loc not in alone:
            args = (at_fault(loc, e["msg"]) if at_fault else []) or \
                [next((text for key, text in reversed(overrides) if _within(key, loc)),
                      overrides[-1][1])]
        if len(args) > 1:
            out.append(f"{' and '.join(f'--set {a}' for a in args)} (together): {loc}: "
                       f"{msg}{got_s}")
        elif args:
            out.append(f"--set {args[0]}: {loc}: {msg}{got_s}")
        else:
            out.append(f"{_where(source, loc, lines)}: {loc}: {msg}{got_s}")
    return "\n".join(out)


def _errors(data: dict) -> set[tuple[str, str]]:
    """(key path, message) of each error ``data`` has as a RunConfig."""
    try:
        RunConfig.model_validate(data)
    except ValidationError as e:
        return {(_error_loc(er), er["msg"]) for er in e.errors()}
    return set()


def _culprits(original: dict, given: list[tuple[str, str, Any]]) -> Callable[[str, str], list[str]]:
    """``at_fault`` for ``format_error``: the ``--set`` arguments (``given``: key path,
    argument, value, in order) without which the error at ``loc`` saying ``msg`` is gone,
    a minimal set of those that wrote inside ``loc``: each is dropped in turn, for good if
    the error stays without it (the others applied as given, in order, over the file)."""

    def with_only(kept: list[int]) -> set[tuple[str, str]]:
        data = copy.deepcopy(original)
        try:
            for i in kept:
                set_path(data, given[i][0], given[i][2])
        except ConfigFileError:  # (an item of a list an override dropped left out wrote)
            return set()
        return _errors(data)

    def at_fault(loc: str, msg: str) -> list[str]:
        kept = list(range(len(given)))
        inside = [i for i in kept if loc == _loc(()) or _within(given[i][0], loc)]
        for i in inside:
            if (loc, msg) in with_only([k for k in kept if k != i]):
                kept.remove(i)  # not needed for the error
        return [given[i][1] for i in inside if i in kept]

    return at_fault


def _where(source: str, loc: str, lines: dict[str, int] | None) -> str:
    """``source:LINE`` for key path ``loc`` (or its nearest enclosing key the file has)."""
    if not lines:
        return source
    key = loc
    while key and key not in lines:
        cut = max(key.rfind("."), key.rfind("["))
        key = key[:cut] if cut > 0 else ""
    line = lines.get(key) if key else lines.get("")
    return f"{source}:{line}" if line else source


def key_lines(text: str) -> dict[str, int]:
    """Key path -> the (1-based) line where a YAML document gives it ('' -> the first)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    out: dict[str, int] = {}

    def walk(node, parts: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    here = parts + (k.value,)
                    out.setdefault(format_key(here), k.start_mark.line + 1)
                    walk(v, here)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                here = parts + (i,)
                out.setdefault(format_key(here), v.start_mark.line + 1)
                walk(v, here)

    if root is not None:
        out[""] = root.start_mark.line + 1
        walk(root, ())
    return out


def _within(loc: str, key: str) -> bool:
    """Whether config path ``loc`` is ``key`` or inside it (``a.b[1].c`` is inside ``a.b``)."""
    return loc == key or loc.startswith((key + ".", key + "["))


def blame(message: str, config: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """An error found after validation that starts with a key path (``cache.tiers[0].quota:
    ...``), prefixed with its source: the ``--set`` argument that wrote that key (or one
    inside or around it), else the config file and the line that gives the key (or the
    nearest enclosing one). Any other message is returned as it is."""
    head = message.split(": ", 1)[0]
    try:
        key = format_key(parse_key(head))
    except KeyPathError:
        return message
    for ov in reversed(overrides):
        k = ov.partition("=")[0].strip()
        if _within(key, k) or _within(k, key):
            return f"--set {ov}: {message}"
    try:
        p = resolve_config_path(config)
        lines = key_lines(p.read_text(encoding="utf-8"))
    except (ConfigFileError, OSError, UnicodeDecodeError):
        return message
    return f"{_where(str(p), key, lines)}: {message}"


def split_key(dotted: str) -> list:
    """``a.b[1].c`` -> ['a', 'b', 1, 'c'] (kvsim.config.keypaths' grammar); ConfigFileError
    naming the path when it is not one."""
    try:
        return list(parse_key(dotted))
    except KeyPathError as e:
        raise ConfigFileError(f"{dotted}: {e}") from None


def set_path(data: dict, dotted: str, value: Any) -> None:
    """Set ``a.b[1].c`` in nested dicts/lists, creating dicts on the way."""
    parts = split_key(dotted)
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigFileError(f"{dotted}: no list item [{part}] there")
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ConfigFileError(f"{dotted}: {part!r} is not inside a mapping")
            node = node.setdefault(part, [] if isinstance(nxt, int) else {})
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigFileError(f"{dotted}: no list item [{last}] there")
        node[last] = value
    else:
        if not isinstance(node, dict):
            raise ConfigFileError(f"{dotted}: {last!r} is not inside a mapping")
        node[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``key.path=value`` -> (the key path, its value read as YAML). ConfigFileError naming
    the argument: no '=', a key the grammar does not accept or the configuration does not
    have (kvsim.config.keypaths), a value that is not YAML."""
    if "=" not in text:
        raise ConfigFileError(f"--set {text}: expected key.path=value")
    key, _, raw = text.partition("=")
    key = key.strip()
    try:
        parts = parse_key(key)
    except KeyPathError as e:
        raise ConfigFileError(f"--set {text}: {e}") from None
    why = unknown_key(parts, RunConfig)
    if why:
        raise ConfigFileError(f"--set {text}: {why}")
    try:
        value = load_bytes(raw.encode(), "value") if raw.strip() else ""
    except (YamlFileError, UnicodeEncodeError) as e:
        raise ConfigFileError(f"--set {text}: the value is not valid YAML "
                              f"({str(e).splitlines()[0]})") from None
    return key, value


def resolve_config_path(path: str | Path) -> Path:
    p = Path(path)
    if p.exists():
        return p
    for cand in (CONFIGS / p, CONFIGS / f"{p}.yaml"):
        if cand.exists():
            return cand
    raise ConfigFileError(f"{path}: no such config file (nor under {CONFIGS})")


def read_yaml(path: str | Path) -> Any:
    """A YAML file's content, strictly (kvsim.config.yamlfile: UTF-8 text, no duplicate keys
    in a mapping, no structure that holds itself, no alias bomb). Errors name the file (and
    the line and column where YAML tells them)."""
    return read_strict(Path(path), ConfigFileError)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read, override and validate a run configuration. Errors name their source: the
    ``--set`` argument, or the file and line."""
    p = resolve_config_path(path)
    data = read_yaml(p)
    if not isinstance(data, dict):
        raise ConfigFileError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    original = data
    data = copy.deepcopy(data)
    given = []
    for ov in overrides:
        key, value = parse_override(ov)
        try:
            set_path(data, key, value)
        except ConfigFileError as e:
            raise ConfigFileError(f"--set {ov}: {str(e).removeprefix(key + ': ')}") from None
        given.append((key, ov, value))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        try:
            lines = key_lines(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            lines = {}
        alone = {loc for loc, _ in _errors(original)} if given else None
        raise ConfigFileError(format_error(e, str(p), tuple((k, ov) for k, ov, _ in given), lines,
                                           alone, _culprits(original, given))) from None


def validate_config(data: dict, source: str = "<config>",
                    overrides: tuple[tuple[str, str], ...] = ()) -> RunConfig:
    """``overrides``: (key path, ``--set`` argument) pairs that wrote into ``data``; errors
    in those keys name the argument."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigFileError(format_error(e, source, overrides)) from None
