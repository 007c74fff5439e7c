"""The building blocks every section of the run configuration's schema shares: the strict
base model (``Strict``) and the field types of sizes (``Size``: '160GiB', at most 1 EiB)
and durations (``Seconds``, ``PositiveSeconds``: '10ms').

Invariant: a boolean is never taken for a number (YAML's ``true`` is not 1): only fields
typed ``bool`` accept one, and the error names the kind of value the field expects.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

from kvsim.config.units import parse_size, parse_time

MAX_BYTES = 1 << 60  # 1 EiB: beyond any machine, and far from int64's limits


def _size(value: Any) -> int:
    n = parse_size(value)
    if n > MAX_BYTES:
        raise ValueError(f"size {value!r} is more than 1 EiB; expected a size a machine can have")
    return n


Size = Annotated[int, BeforeValidator(_size), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(parse_time), Field(ge=0)]
PositiveSeconds = Annotated[float, BeforeValidator(parse_time), Field(gt=0)]


class Strict(BaseModel):
    """The base of every configuration section: unknown keys are errors, a validated
    section is immutable, and NaN or infinity is no number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's ``true`` is not the number 1: only boolean fields take booleans."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and field.annotation is not bool:
            raise ValueError(f"expected {_expected(field)}, got the boolean {value!r}")
        return value


def _expected(field: Any) -> str:
    funcs = {getattr(getattr(m, "func", None), "__name__", "") for m in field.metadata}
    if "_size" in funcs:
        return "a size"
    if "parse_time" in funcs:
        return "a duration"
    kinds = [get_args(a)[0] if get_origin(a) is Annotated else a
             for a in get_args(field.annotation) if a is not type(None)] or [field.annotation]
    return {"int": "a whole number", "float": "a number"}.get(   # (Optional[float]: a number)
        getattr(kinds[0], "__name__", "") if len(kinds) == 1 else "", "a value of another type")
