"""Hardware profiles: every constant the sim backend and the compute model use, from YAML.

A ``HardwareProfile`` is a frozen pydantic model (unknown keys are refused). Sizes, times and
rates accept unit strings (``'4MiB'``, ``'2.5us'``, ``'55.5GB/s'``) through ``kvsim.units``;
inside the model they are plain bytes, seconds and bytes per second. ``load_profile`` takes
a path or a name (``'h200-pcie'`` -> ``configs/hardware/h200-pcie.yaml`` of the repository)
and raises ``ProfileError`` naming the file and the key path of every bad value.

Invariants: positive rates, counts and sizes; the both-directions link total is at least
the larger single direction; at least 2 SMs for copy CTAs; efficiencies in (0, 1].
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from kvsim.units import parse_rate, parse_size, parse_time

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"

Bytes = Annotated[int, BeforeValidator(parse_size), Field(gt=0)]
Seconds = Annotated[float, BeforeValidator(parse_time), Field(ge=0)]
PosSeconds = Annotated[float, BeforeValidator(parse_time), Field(gt=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Slowdown = Annotated[float, Field(ge=0)]


class ProfileError(ValueError):
    """A profile file is missing or has a bad value; the message names file and key path."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkSpec(_Frozen):
    """The GPU <-> host link. Bandwidths are what a large copy achieves, per direction."""

    kind: Literal["pcie", "c2c"]
    h2d: Rate
    d2h: Rate
    both: Rate  # total of both directions at once

    @model_validator(mode="after")
    def _both_covers_one(self) -> "LinkSpec":
        if self.both < max(self.h2d, self.d2h):
            raise ValueError(f"both ({self.both:g} B/s) must be at least the faster direction "
                             f"({max(self.h2d, self.d2h):g} B/s)")
        return self


class CopyEngineSpec(_Frozen):
    """Async copy engines; one batched call costs per_call + pages * per_page of host time."""

    count: Annotated[int, Field(gt=0)]
    per_call: Seconds
    per_page: Seconds


class InterferenceSpec(_Frozen):
    """How copies slow compute: an SM copy kernel of ``sm_kernel_ctas`` CTAs stretches a
    compute kernel by ``sm_kernel_slowdown`` (linear in the CTA count); any copy-engine
    transfer in flight stretches it by ``copy_engine_slowdown``. ``busy_cta_efficiency``:
    the share of its idle bandwidth a copy CTA gets while compute occupies the SMs."""

    sm_kernel_slowdown: Slowdown
    sm_kernel_ctas: Annotated[int, Field(gt=0)]
    copy_engine_slowdown: Slowdown
    busy_cta_efficiency: Fraction

    @property
    def per_cta_slowdown(self) -> float:
        return self.sm_kernel_slowdown / self.sm_kernel_ctas


class SMSpec(_Frozen):
    """Streaming multiprocessors, as SM copy kernels see them."""

    count: Annotated[int, Field(ge=2)]
    cta_offload: Rate   # one copy CTA, GPU -> host
    cta_onboard: Rate   # one copy CTA, host -> GPU
    threads_per_cta: Annotated[int, Field(gt=0)]
    copy_cta_slots: Annotated[int, Field(ge=2)]  # copy CTAs resident at once, all kernels
    launch: Seconds
    interference: InterferenceSpec


class NVMeSpec(_Frozen):
    """The disk tier's device. A transfer is cut into pieces of at most ``piece`` bytes;
    ``queue_depth`` of them in flight; each costs ``latency`` plus its bytes at the rate."""

    read: Rate
    write: Rate
    queue_depth: Annotated[int, Field(gt=0)]
    latency: Seconds
    piece: Bytes


class HostSpec(_Frozen):
    fill_rate: Rate  # host-tier commit (fault in + register) rate


class GPUSpec(_Frozen):
    name: str
    memory: Bytes
    flops_bf16: Annotated[float, Field(gt=0)]  # dense bf16 FLOP/s, a plain number
    hbm: Rate
    prefill_efficiency: Fraction
    decode_efficiency: Fraction
    step_overhead: Seconds


class HardwareProfile(_Frozen):
    name: str
    link: LinkSpec
    copy_engine: CopyEngineSpec
    sm: SMSpec
    nvme: NVMeSpec
    host: HostSpec
    gpu: GPUSpec
    notes: str = ""


def _resolve(path_or_name: str | Path, kind: str) -> Path:
    p = Path(path_or_name)
    if p.suffix in (".yaml", ".yml") or p.exists() or len(p.parts) > 1:
        return p
    return CONFIG_DIR / kind / f"{path_or_name}.yaml"


def load_yaml_model(model: type[BaseModel], path_or_name: str | Path, kind: str):
    """Load and validate ``model`` from a YAML file or a preset name under configs/<kind>/."""
    path = _resolve(path_or_name, kind)
    if not path.is_file():
        presets = sorted(q.stem for q in (CONFIG_DIR / kind).glob("*.yaml"))
        raise ProfileError(f"{path}: no such file (presets in configs/{kind}: {presets})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top)"
            got = err.get("input")
            lines.append(f"{path}: {where}: {err['msg']} (got {got!r})")
        raise ProfileError("\n".join(lines)) from None


def load_profile(path_or_name: str | Path) -> HardwareProfile:
    """A hardware profile from a YAML path or a preset name such as ``'h200-pcie'``."""
    return load_yaml_model(HardwareProfile, path_or_name, "hardware")
