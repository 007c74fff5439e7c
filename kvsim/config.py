"""Run configurations: YAML in, a validated, immutable RunConfig out.

Sizes and times accept units ('160GiB', '10ms'); unknown keys, wrong types and impossible
sizes are errors that name the file and the key path (``cache.tiers[1].quota``).
``--set key.path=value`` overrides are applied to the raw YAML before validation, so they
are validated exactly like the file. Nothing here touches a trace, a result or a disk
tier's bytes; building the run does (kvsim.run).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from kvsim.paths import CONFIGS
from kvsim.units import parse_size, parse_time

Size = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(parse_time), Field(ge=0)]


class ConfigFileError(ValueError):
    """A configuration file or override is wrong; the message says where and what."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierConfig(_Strict):
    level: Literal["gpu", "host", "disk"]
    quota: Size
    max_quota: Optional[Size] = None   # reserved address range (host fill); default: quota
    path: Optional[str] = None         # disk tier: directory for the tier's file (hw backend)

    @model_validator(mode="after")
    def _check(self) -> "TierConfig":
        if self.max_quota is not None and self.max_quota < self.quota:
            raise ValueError(f"max_quota ({self.max_quota}) is below quota ({self.quota})")
        if self.path is not None:
            if self.level != "disk":
                raise ValueError("path is only for the disk tier")
            p = Path(os.path.expanduser(self.path))
            if p.exists() and not p.is_dir():
                raise ValueError(f"path {self.path!r} exists and is not a directory")
        return self


class CacheConfig(_Strict):
    tokens_per_block: Annotated[int, Field(gt=0)] = 32
    page_bytes: Optional[Size] = None   # default: the model's KV bytes per token x block
    tiers: list[TierConfig]

    @model_validator(mode="after")
    def _order(self) -> "CacheConfig":
        order = {"gpu": 0, "host": 1, "disk": 2}
        levels = [t.level for t in self.tiers]
        if not levels or levels[0] != "gpu" or any(order[b] <= order[a] for a, b in zip(levels, levels[1:])):
            raise ValueError(f"tiers must be ordered gpu -> host -> disk (host and disk "
                             f"optional), got {' -> '.join(levels) or 'none'}")
        return self


class EngineConfig(_Strict):
    max_batch_tokens: Annotated[int, Field(gt=0)] = 8192
    max_running: Annotated[int, Field(gt=0)] = 256
    fast_forward: bool = True
    refcheck: bool = True
    refcheck_disk_writes: bool = True
    hold_sessions: bool = True
    gpu_free_watermark: Annotated[float, Field(ge=0, lt=0.5)] = 0.0
    max_plan_failures: Annotated[int, Field(gt=0)] = 3


class SyntheticConfig(_Strict):
    n_sessions: Annotated[int, Field(gt=0)] = 40
    seed: Optional[int] = None          # default: the run's seed


class WorkloadConfig(_Strict):
    kind: Literal["synthetic", "mooncake", "agentic"] = "synthetic"
    path: Optional[str] = None          # trace file or directory (mooncake, agentic)
    time_scale: Annotated[float, Field(gt=0)] = 1.0   # mooncake: multiply timestamps
    limit: Optional[Annotated[int, Field(gt=0)]] = None  # first N requests / sessions
    shared_prefix: bool = False         # agentic: tools + system prefix shared by sessions
    max_think: Optional[Seconds] = None  # agentic: cap think times (the real ones reach 22 h)
    max_turns: Optional[Annotated[int, Field(gt=0)]] = None  # keep each session's first turns
    start: Literal["poisson", "concurrency"] = "poisson"
    sessions_per_s: Annotated[float, Field(gt=0)] = 0.5
    concurrency: Annotated[int, Field(gt=0)] = 16
    synthetic: SyntheticConfig = SyntheticConfig()

    @model_validator(mode="after")
    def _path(self) -> "WorkloadConfig":
        if self.kind != "synthetic" and not self.path:
            raise ValueError(f"a {self.kind} workload needs a path (or pass --trace)")
        return self


class OutputConfig(_Strict):
    dir: str = "results/{name}"
    timeline_interval: Seconds = 1.0
    plots: bool = True


class RunConfig(_Strict):
    name: str = "run"
    seed: int = 0
    model: str = "llama-3-70b"          # preset under configs/models or a YAML path
    tp: Optional[Annotated[int, Field(gt=0)]] = None   # overrides the model's tp
    hardware: str = "h200-pcie"         # preset under configs/hardware or a YAML path
    cache: CacheConfig
    engine: EngineConfig = EngineConfig()
    workload: WorkloadConfig = WorkloadConfig()
    output: OutputConfig = OutputConfig()


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _format(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = _loc(tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))))
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        got_s = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        lines.append(f"  {loc}: {msg}{got_s}")
    return "\n".join(lines)


def set_path(data: dict, dotted: str, value: Any) -> None:
    """Set ``a.b[1].c`` in nested dicts/lists, creating dicts on the way."""
    parts: list[Any] = []
    for piece in dotted.split("."):
        while "[" in piece:
            head, _, rest = piece.partition("[")
            if head:
                parts.append(head)
            idx, _, piece = rest.partition("]")
            parts.append(int(idx))
        if piece:
            parts.append(piece)
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigFileError(f"--set {dotted}: no list item [{part}] there")
            node = node[part]
        else:
            if not isinstance(node, dict):
                raise ConfigFileError(f"--set {dotted}: {part!r} is not inside a mapping")
            node = node.setdefault(part, [] if isinstance(nxt, int) else {})
    last = parts[-1]
    if isinstance(last, int):
        if not isinstance(node, list) or last >= len(node):
            raise ConfigFileError(f"--set {dotted}: no list item [{last}] there")
        node[last] = value
    else:
        if not isinstance(node, dict):
            raise ConfigFileError(f"--set {dotted}: {last!r} is not inside a mapping")
        node[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ConfigFileError(f"--set {text!r}: expected key.path=value")
    key, _, raw = text.partition("=")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigFileError(f"--set {text!r}: the value is not valid YAML ({e})") from None
    return key.strip(), value


def resolve_config_path(path: str | Path) -> Path:
    p = Path(path)
    if p.exists():
        return p
    for cand in (CONFIGS / p, CONFIGS / f"{p}.yaml"):
        if cand.exists():
            return cand
    raise ConfigFileError(f"{path}: no such config file (nor under {CONFIGS})")


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read, override and validate a run configuration."""
    p = resolve_config_path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigFileError(f"{p}: cannot read ({e.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
        raise ConfigFileError(f"{where}: malformed YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigFileError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    data = copy.deepcopy(data)
    for ov in overrides:
        key, value = parse_override(ov)
        set_path(data, key, value)
    return validate_config(data, str(p))


def validate_config(data: dict, source: str = "<config>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigFileError(_format(e, source)) from None
