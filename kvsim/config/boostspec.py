"""The hardware profile's ``compute.boost`` section: the GPU's power state, GEMM-bound
steps after light steps or idle running faster than the calibrated rate
(``kvsim.core.datapath.powerstate`` has the model and its arithmetic; docs/config.md).

Absent: not modelled (every step's work at the calibrated rate, as before).
``kvsim.tools.fitboost`` fits the four terms from hw replays' compute logs.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from kvsim.config.units import parse_time

_PosSeconds = Annotated[float, BeforeValidator(parse_time), Field(gt=0)]


class BoostSpec(BaseModel):
    """``gain``: the GEMM speed at full headroom over the hot rate (GEMMs without end),
    minus 1; ``spend``: the seconds of GEMM work that spend the headroom by 1/e;
    ``recover``: the seconds of light work or idle that give back the missing headroom by
    1/e; ``calibrated``: the headroom at which the profile's GEMM rate was timed (0: hot,
    1: from idle)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gain: Annotated[float, Field(ge=0)]
    spend: _PosSeconds
    recover: _PosSeconds
    calibrated: Annotated[float, Field(ge=0, le=1)] = 0.0
