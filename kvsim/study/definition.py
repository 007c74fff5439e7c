"""Study and tune files: YAML in, validated, immutable specs out.

A study names a base run config (a path or a shipped name) with overrides, and the axes
it is varied along: a grid, zipped axes, named variants, seeds, traces. A tune names a
base config, a search space over config keys, an objective built from summary metrics,
constraints, a trial budget and a held-out split. Unknown keys, wrong types and
inconsistent axes are errors naming the study file and the key
(``grid.cache.tiers[1].quota``), like kvsim.config's. Whether each point's config is
valid is checked when the points are expanded (kvsim.study.points).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsim.config.keypaths import KeyPathError, parse_key, unknown_key
from kvsim.config.loading import format_error, key_lines, parse_override, read_yaml
from kvsim.config.runconfig import ConfigFileError, RunConfig
from kvsim.config.strict import Strict
from kvsim.config.units import parse_size

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# The summary metrics a study tabulates by default (dotted paths into summary.json's metrics)
DEFAULT_METRICS = (
    "requests_completed", "requests_failed", "hit_ratio", "ttft_s.p50", "ttft_s.p90",
    "ttft_s.p99", "tpot_s.p50", "e2e_s.p90", "throughput.requests_per_s",
    "throughput.output_tokens_per_s", "bytes.host_to_gpu", "bytes.disk_read", "bytes.disk_write",
)
DEFAULT_PLOT_METRICS = ("ttft_s.p90", "throughput.requests_per_s", "hit_ratio")
# the top-level metric names a run's summary has (kvsim.engine.metrics); the rest of a
# path is checked against the summaries that come back (``missing_metric``: a study's
# points, before its table; a tune's first trial)
METRIC_ROOTS = frozenset({
    "requests_completed", "requests_failed", "input_tokens", "output_tokens", "hit_tokens",
    "hit_ratio", "computed_tokens", "ttft_s", "ttft_s_by_input", "ttft_host_hit_s", "tpot_s",
    "decode_step_s", "decode_steps", "e2e_s", "throughput", "bytes",
    "evicted_pages", "dropped_pages", "offloaded_pages", "onboarded_pages", "failed_batches",
    "preemptions", "holds_released", "engine_steps", "sim_time_s", "wall_time_s",
    "page_bytes", "tiers_slots", "disk_copies",
    "balance",    # each tier's evictable pages, the disk's retained copies (kvsim.engine.balance)
    "host_fill",  # only where the config has a host tier fill (kvsim.run.host_fill_metrics)
    "driver",     # only where a host fill takes the profile's driver lock
    "page_cache", # only where the disk tier's writes are buffered (kvsim_backends.sim.pagecache)
    "manager",    # only where engine.manager_cost charged plans (kvsim.engine.managercost)
    "ranks",      # only for a node of several ranks (a list: one summary a rank)
    "cluster",    # only for a cluster (kvsim.run.clustermetrics): its own figures
    "instances",  # ... and each instance's (a list)
    "remote",     # only with a remote tier (cache.remote; kvsim.run.remotetier)
})


class StudyFileError(ConfigFileError):
    """A study or tune file is wrong; the message names the file and the key."""


def _check_key(key: str) -> str:
    """A key of the run configuration, by kvsim.config.keypaths' grammar and schema walk."""
    try:
        parts = parse_key(key)
    except KeyPathError as e:
        raise ValueError(f"{key!r} is not a config key path ({e})") from None
    why = unknown_key(parts, RunConfig)
    if why:
        raise ValueError(f"{key!r}: {why}")
    return key


def _check_metric(path: str) -> str:
    if path.split(".")[0] not in METRIC_ROOTS:
        raise ValueError(f"{path!r} is not a summary metric; expected a path under one of "
                         f"{', '.join(sorted(METRIC_ROOTS))}")
    return path


# the roots a summary has only with some option or shape (above): a path under one may be
# absent from every point's summary without being misspelt
OPTIONAL_ROOTS = frozenset({"host_fill", "driver", "page_cache", "manager", "ranks", "cluster",
                            "instances", "remote", "disk_copies"})


def missing_metric(summaries: list[dict], path: str) -> str | None:
    """Why ``path`` names no metric, where none of the runs' ``summaries`` (their
    ``metrics``) has it though its root is one every summary has (a name misspelt below
    the root): what the deepest level the path reaches holds. None where one has it, or
    under an optional root."""
    parts = path.split(".")
    if not summaries or parts[0] in OPTIONAL_ROOTS:
        return None
    deepest = None
    for m in summaries:
        node: Any = m
        for i, k in enumerate(parts):
            if isinstance(node, dict) and k in node:
                node = node[k]
                continue
            if deepest is None or i > deepest[0]:
                deepest = (i, node)
            break
        else:
            return None
    i, node = deepest
    where = ".".join(parts[:i]) or "a summary"
    has = ", ".join(sorted(map(str, node))) if isinstance(node, dict) else "a number, nothing below it"
    return f"no metric {path!r} in any run's summary: {where} has {has}"


ConfigKey = Annotated[str, Field(min_length=1)]


def _check_name(v: str) -> str:
    if not NAME.match(v):
        raise ValueError(f"{v!r}: a name is letters, digits, '.', '_', '-'")
    return v


Name = Annotated[str, AfterValidator(_check_name)]  # a study's, tune's or variant's name
Metric = Annotated[str, Field(min_length=1)]


class _Strict(Strict):
    """As a run config's sections: unknown keys refused, a boolean never a number, NaN and
    infinity no number (a NaN bound or weight would make every trial infeasible or NaN)."""
    model_config = ConfigDict(populate_by_name=True)


class Variant(_Strict):
    name: Name
    overrides: dict[ConfigKey, Any] = Field(default_factory=dict, alias="set")

    @field_validator("overrides")
    @classmethod
    def _keys(cls, v: dict) -> dict:
        for k in v:
            _check_key(k)
        return v


def _overrides(v: Any) -> Any:
    """``set:`` as a mapping, or as a list of ``key=value`` strings like ``--set``."""
    if isinstance(v, list):
        out = {}
        for item in v:
            if not isinstance(item, str):
                raise ValueError(f"expected key=value strings or a mapping, got {item!r}")
            try:
                k, val = parse_override(item)
            except ConfigFileError as e:
                raise ValueError(str(e).removeprefix("--set ")) from None
            out[k] = val
        return out
    return v


class _Base(_Strict):
    name: Name
    base: str = "default"                  # a config path, or a name under configs/
    overrides: dict[ConfigKey, Any] = Field(default_factory=dict, alias="set")
    backend: Literal["sim", "hw"] = "sim"
    out: Optional[Annotated[str, Field(min_length=1)]] = None   # folder; default results/<kind>-<name>

    @field_validator("overrides", mode="before")
    @classmethod
    def _set_list(cls, v: Any) -> Any:
        return _overrides(v)

    @field_validator("overrides")
    @classmethod
    def _set_keys(cls, v: dict) -> dict:
        for k in v:
            _check_key(k)
        return v


class StudySpec(_Base):
    grid: dict[ConfigKey, list[Any]] = Field(default_factory=dict)
    zipped: dict[ConfigKey, list[Any]] = Field(default_factory=dict, alias="zip")
    variants: list[Variant] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=list)
    traces: list[str] = Field(default_factory=list)
    labels: dict[ConfigKey, str] = Field(default_factory=dict)   # axis key -> short column name
    baseline: Optional[str] = None         # a point name: metrics relative to it
    metrics: list[Metric] = Field(default_factory=lambda: list(DEFAULT_METRICS))
    plot_metrics: list[Metric] = Field(default_factory=lambda: list(DEFAULT_PLOT_METRICS))

    @field_validator("grid", "zipped")
    @classmethod
    def _axes(cls, v: dict) -> dict:
        for k, values in v.items():
            _check_key(k)
            if not values:
                raise ValueError(f"{k}: an axis needs at least one value")
        return v

    @field_validator("metrics", "plot_metrics")
    @classmethod
    def _metrics(cls, v: list) -> list:
        for m in v:
            _check_metric(m)
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict) -> dict:
        for k, label in v.items():
            _check_key(k)
            if not NAME.match(label):
                raise ValueError(f"{k}: label {label!r} is letters, digits, '.', '_', '-'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "StudySpec":
        lengths = {len(v) for v in self.zipped.values()}
        if len(lengths) > 1:
            raise ValueError("zip: every zipped axis needs the same number of values, got "
                             + ", ".join(f"{k}: {len(v)}" for k, v in self.zipped.items()))
        both = set(self.grid) & set(self.zipped)
        if both:
            raise ValueError(f"{', '.join(sorted(both))}: an axis is either in grid or in zip, not both")
        names = [v.name for v in self.variants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variants: names must be unique, repeated: {', '.join(dup)}")
        for k in self.labels:
            if k not in self.grid and k not in self.zipped:
                raise ValueError(f"labels: {k} is not a grid or zip axis")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: repeated seeds")
        axes = [*self.grid, *self.zipped]
        for v in self.variants:  # an axis is applied after a variant: it would overwrite it
            for vk in v.overrides:
                ak = next((a for a in axes if vk == a or vk.startswith((a + ".", a + "["))), None)
                if ak is not None:
                    raise ValueError(f"variants[{v.name}]: {vk} is set at every point by the axis "
                                     f"{ak}; expected a variant to set what no axis sets")
        return self


# ----------------------------------------------------------------------------------- tune


#: the fields each type of search parameter reads (``type`` aside)
READS = {"float": {"type", "low", "high", "log", "step", "unit"},
         "int": {"type", "low", "high", "log", "step", "unit"},
         "categorical": {"type", "choices"},
         "split": {"type", "low", "high", "step", "total", "keys"}}


class Param(_Strict):
    """One search dimension. ``float``/``int``: low..high (``log`` for a log scale; ``unit``
    appends a unit, e.g. ``GiB``, to the sampled number); ``categorical``: choices;
    ``split``: a fraction f in low..high of ``total`` goes to ``keys[0]`` and the rest to
    ``keys[1]`` (e.g. host and disk quotas for a fixed budget)."""
    type: Literal["float", "int", "categorical", "split"]
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    unit: Optional[str] = None
    choices: Optional[list[Any]] = None
    total: Optional[str] = None
    keys: Optional[list[ConfigKey]] = None

    @model_validator(mode="after")
    def _check(self) -> "Param":
        unread = sorted(self.model_fields_set - READS[self.type])
        if unread:  # a field this type never reads would be dropped, not searched
            raise ValueError(f"{', '.join(unread)}: not read by a {self.type} parameter (it reads "
                             f"{', '.join(sorted(READS[self.type] - {'type'}))})")
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs choices")
            for c in self.choices:
                if not (c is None or isinstance(c, (bool, int, float, str))):
                    raise ValueError(f"choices: {c!r} is not a scalar (Optuna stores scalars)")
            return self
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} parameter needs low and high")
        if not self.low < self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        if self.log and self.low <= 0:
            raise ValueError("log scale needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("step and log do not go together")
        if self.type == "int" and not all(float(v).is_integer() for v in (self.low, self.high, self.step or 1)):
            raise ValueError(f"an int parameter's low, high and step are whole numbers, got low "
                             f"{self.low}, high {self.high}, step {self.step}")
        if self.step is not None:  # (Optuna would lower high to the last whole step, or search low alone)
            n = (self.high - self.low) / self.step if self.step > 0 else 0
            if n < 1 or abs(n - round(n)) > 1e-9 * n:
                raise ValueError(f"step ({self.step}): expected a step > 0 that divides high - low "
                                 f"({self.high - self.low:g}) into whole steps")
        if self.type == "split":
            if self.total is None or not self.keys or len(self.keys) != 2:
                raise ValueError("a split parameter needs total and two keys")
            for k in self.keys:
                _check_key(k)
            parse_size(self.total)
            if not (0 <= self.low and self.high <= 1):
                raise ValueError("a split's low and high are fractions in 0..1")
        if self.unit is not None:
            parse_size(f"1{self.unit}")
        return self


class Objective(_Strict):
    """``maximize: METRIC`` or ``minimize: METRIC``, or a weighted sum: ``direction`` and
    ``terms`` (metric -> weight)."""
    maximize: Optional[Metric] = None
    minimize: Optional[Metric] = None
    direction: Optional[Literal["maximize", "minimize"]] = None
    terms: dict[Metric, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one(self) -> "Objective":
        forms = [self.maximize is not None, self.minimize is not None, bool(self.terms)]
        if sum(forms) != 1:
            raise ValueError("give exactly one of maximize, minimize, or direction + terms")
        if self.terms and self.direction is None:
            raise ValueError("terms need a direction (maximize or minimize)")
        if not self.terms and self.direction is not None:
            raise ValueError("direction goes with terms")
        for m in (self.maximize, self.minimize, *self.terms):
            if m is not None:
                _check_metric(m)
        return self

    @property
    def sense(self) -> str:
        if self.maximize is not None:
            return "maximize"
        if self.minimize is not None:
            return "minimize"
        return str(self.direction)

    @property
    def weights(self) -> dict[str, float]:
        if self.terms:
            return dict(self.terms)
        return {str(self.maximize or self.minimize): 1.0}


class Constraint(_Strict):
    metric: Metric
    max: Optional[float] = None
    min: Optional[float] = None

    @model_validator(mode="after")
    def _bound(self) -> "Constraint":
        _check_metric(self.metric)
        if self.max is None and self.min is None:
            raise ValueError("a constraint needs max or min")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max}): no trial could meet it")
        return self


class Split(_Strict):
    """Sessions held out of the search and replayed only to evaluate its best configs."""
    held_out: Annotated[float, Field(gt=0, lt=1)] = 0.3
    seed: int = 0


class TuneSpec(_Base):
    space: dict[str, Param]
    objective: Objective
    constraints: list[Constraint] = Field(default_factory=list)
    trials: Annotated[int, Field(gt=0)] = 20
    parallel: Optional[Annotated[int, Field(gt=0)]] = None   # trials in flight; default: workers
    sampler: Literal["tpe", "random"] = "tpe"
    seed: int = 0
    storage: Optional[Annotated[str, Field(min_length=1)]] = None   # Optuna URL; default SQLite there
    split: Optional[Split] = Split()
    top: Annotated[int, Field(gt=0)] = 3   # best trials evaluated on the held-out sessions

    @field_validator("space")
    @classmethod
    def _space(cls, v: dict) -> dict:
        if not v:
            raise ValueError("the search space is empty")
        owner: dict[str, str] = {}  # config key -> the parameter that sets it
        for k, p in v.items():
            if p.type != "split":
                _check_key(k)
            elif not NAME.match(k):
                raise ValueError(f"{k!r}: a split parameter's name is letters, digits, '.', '_', '-'")
            for key in (p.keys if p.type == "split" else [k]):
                if key in owner:  # one would overwrite the other: a dimension searched for nothing
                    raise ValueError(f"{key}: set by both {owner[key]!r} and {k!r}; expected one "
                                     "parameter a config key")
                owner[key] = k
        return v


# ---------------------------------------------------------------------------------- loading


def _read_yaml(path: str | Path, what: str) -> tuple[Path, dict]:
    """The file's mapping, read as strictly as a config (UTF-8, no duplicate keys)."""
    p = Path(path)
    if not p.is_file():
        raise StudyFileError(f"{p}: cannot read the {what} file (no such file)")
    try:
        data = read_yaml(p)
    except ConfigFileError as e:
        raise StudyFileError(str(e)) from None
    if not isinstance(data, dict):
        raise StudyFileError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    return p, data


def _validate(model: type[BaseModel], data: dict, source: str, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        try:
            lines = key_lines(Path(source).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            lines = {}
        raise StudyFileError(format_error(e, source, lines=lines)) from None


def load_study(path: str | Path) -> StudySpec:
    p, data = _read_yaml(path, "study")
    return _validate(StudySpec, data, str(p), "study")


def load_tune(path: str | Path) -> TuneSpec:
    p, data = _read_yaml(path, "tune")
    return _validate(TuneSpec, data, str(p), "tune")


Spec = Union[StudySpec, TuneSpec]
