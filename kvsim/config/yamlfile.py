"""The one strict YAML reader of every file a user gives kvsim (run configs, study and tune
files, hardware profiles, model files).

PyYAML's safe loader, except that:

- the text must be UTF-8 (an error names the file and the line of the first bad byte);
- a key given twice in one mapping is an error (by default the last one silently wins);
  merge keys (``<<: *base``) work as in YAML 1.1: the mapping's own keys override them;
- an alias inside the node its anchor names (``a: &a [*a]``, a structure that holds
  itself) is an error: it made a Python object no validation or copy can walk;
- aliases may not expand the document beyond ``MAX_VALUES`` values (a few nested lists of
  aliases grow a file of lines into billions of values: validation then ran for minutes
  and gigabytes before it failed or was killed).

Errors are ``YamlFileError`` (a ValueError), each naming ``SOURCE:LINE[:COLUMN]``.
"""

from __future__ import annotations

from typing import Any

import yaml

#: at most this many values (scalars, lists, mappings) once every alias is expanded
MAX_VALUES = 1_000_000


class YamlFileError(ValueError):
    """A file that is not strict YAML; the message names it and the line."""


class StrictLoader(yaml.SafeLoader):
    """The safe loader with the checks of the module docstring."""

    def __init__(self, stream):
        super().__init__(stream)
        self._open: list[str | None] = []     # anchors of the nodes being composed
        self._sizes: dict[int, int] = {}      # node id -> values it expands to
        self._count = 0                       # values so far, aliases expanded

    def _grow(self, n: int, mark) -> None:
        self._count += n
        if self._count > MAX_VALUES:
            raise yaml.composer.ComposerError(
                None, None, f"its aliases expand it to more than {MAX_VALUES:,} values; expected "
                f"at most that many (a config that size is not one: an alias bomb?)", mark)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()
            if ev.anchor in self._open:
                raise yaml.composer.ComposerError(
                    None, None, f"the alias *{ev.anchor} lies inside the node its anchor &{ev.anchor} "
                    f"names (a structure that holds itself); expected a tree", ev.start_mark)
            node = super().compose_node(parent, index)
            self._grow(self._sizes.get(id(node), 1), ev.start_mark)
            return node
        ev = self.peek_event()
        before = self._count
        self._open.append(getattr(ev, "anchor", None))
        try:
            node = super().compose_node(parent, index)
        finally:
            self._open.pop()
        self._grow(1, ev.start_mark)
        self._sizes[id(node)] = self._count - before
        return node

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *base``: its keys come first, this mapping's own override them
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the base class reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {first})", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_bytes(raw: bytes, source: str) -> Any:
    """The content of a YAML file's bytes ``raw`` (``source``: its name, for errors)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise YamlFileError(f"{source}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); expected a "
                            f"YAML file in UTF-8") from None
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise YamlFileError(f"{where}: malformed YAML: {getattr(e, 'problem', e)}") from None


def read_strict(path, error: type[Exception] = YamlFileError) -> Any:
    """The content of YAML file ``path``; ``error`` (a ValueError class) names the file
    where it cannot be read or is not strict YAML."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    try:
        return load_bytes(raw, str(path))
    except YamlFileError as e:
        raise error(str(e)) from None
