"""The ``workload`` section of the run configuration: what requests arrive and when
(``WorkloadConfig``: a synthetic generator, a Mooncake trace or agentic sessions), the
seeded generator's shape (``SyntheticConfig``), its optional burst of long-context
requests (``BurstConfig``) and agentic traces' cache priorities (``PrioritiesConfig``).
Part of ``kvsim.config``'s ``RunConfig``; docs/config.md describes every key.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, model_validator

from kvsim.config.strict import Seconds, Strict


class BurstConfig(Strict):
    """Long-context requests arriving together on top of the synthetic sessions."""

    requests: Annotated[int, Field(gt=0)] = 4
    input_tokens: Annotated[int, Field(gt=0)] = 200_000
    output_tokens: Annotated[int, Field(ge=0)] = 64
    at: Seconds = 60.0


class SyntheticConfig(Strict):
    """The seeded session generator (``kvsim.workload.synthetic_agentic``). Every shape key
    left out (None) keeps the generator's own default."""

    n_sessions: Annotated[int, Field(gt=0)] = 40
    seed: Optional[int] = None          # default: the run's seed
    burst: Optional[BurstConfig] = None  # none: no burst
    prefix_tokens: Optional[Annotated[int, Field(gt=0)]] = None       # default 4,000
    first_input_tokens: Optional[Annotated[float, Field(gt=0)]] = None  # median, default 1,500
    step_input_tokens: Optional[Annotated[float, Field(gt=0)]] = None   # median, default 1,500
    output_tokens: Optional[Annotated[float, Field(gt=0)]] = None       # median, default 250
    think_s: Optional[Annotated[float, Field(ge=0)]] = None             # median, default 5 s
    turns: Optional[tuple[Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)]]] = None  # (4, 14)
    max_context_tokens: Optional[Annotated[int, Field(gt=0)]] = None  # default 60,000
    subagent_prob: Optional[Annotated[float, Field(ge=0, le=1)]] = None  # default 0.05
    shared_prefix: bool = True  # every session in one reuse scope (false: one scope each)

    @model_validator(mode="after")
    def _shape(self) -> "SyntheticConfig":
        if self.turns is not None and self.turns[1] < self.turns[0]:
            raise ValueError(f"turns: got {list(self.turns)}; expected [min, max] with min <= max")
        prefix = self.prefix_tokens if self.prefix_tokens is not None else 4_000
        ctx = self.max_context_tokens if self.max_context_tokens is not None else 60_000
        if ctx <= prefix:
            raise ValueError(f"max_context_tokens ({ctx}) must exceed prefix_tokens ({prefix})")
        return self

    def shape(self) -> dict:
        """The generator's keyword arguments this config sets (the keys not left out)."""
        keys = ("prefix_tokens", "first_input_tokens", "step_input_tokens", "output_tokens",
                "think_s", "turns", "max_context_tokens", "subagent_prob", "shared_prefix")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class PrioritiesConfig(Strict):
    """Agentic traces: the cache priority of each part of a prompt (higher kept longer
    by priority-aware eviction policies)."""
    prefix: Annotated[int, Field(ge=-(1 << 31), lt=1 << 31)] = 0    # shared tools + system prefix
    context: Annotated[int, Field(ge=-(1 << 31), lt=1 << 31)] = 0   # a session's own turns
    subagent: Annotated[int, Field(ge=-(1 << 31), lt=1 << 31)] = 0  # sub-agents' turns


class WorkloadConfig(Strict):
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
    priorities: Optional[PrioritiesConfig] = None  # agentic: priorities by part of a prompt
    # who may share KV: tenant (as the trace's ids allow, within one tenant: the trace's
    # 'tenant' field; none given: one tenant) or session (nothing across sessions). Two
    # tenants never share, whichever is chosen.
    scope: Literal["tenant", "session"] = "tenant"

    @model_validator(mode="after")
    def _path(self) -> "WorkloadConfig":
        if self.kind != "synthetic" and not self.path:
            raise ValueError(f"a {self.kind} workload needs a path (or pass --trace)")
        if self.synthetic.burst is not None and (self.kind != "synthetic" or self.start != "poisson"):
            raise ValueError("synthetic.burst needs kind: synthetic and start: poisson (its "
                             "requests arrive at a set time)")
        if self.priorities is not None and self.kind != "agentic":
            raise ValueError("workload.priorities applies to agentic traces only (a Mooncake "
                             "trace gives each request's priority in its own 'priority' field)")
        # a key that does nothing for this kind is refused, not ignored (null: unset)
        if self.time_scale != 1.0 and self.kind != "mooncake":
            raise ValueError(f"workload.time_scale applies to Mooncake traces only (it scales their "
                             f"timestamps); a {self.kind} workload's sessions start as workload.start says")
        if self.limit is not None and self.kind == "synthetic":
            raise ValueError("workload.limit applies to traces only (their first requests or session "
                             "files); the synthetic workload's sessions are workload.synthetic.n_sessions")
        if self.kind != "agentic":
            for key, on, own in (("max_think", self.max_think is not None, "think times: think_s"),
                                 ("shared_prefix", self.shared_prefix, "prefix: shared_prefix")):
                if on:
                    hint = f" (the synthetic workload's {own} under workload.synthetic)" \
                        if self.kind == "synthetic" else ""
                    raise ValueError(f"workload.{key} applies to agentic traces only{hint}")
        if self.kind == "mooncake" and self.start != "poisson":
            raise ValueError(f"workload.start: {self.start} applies to sessions in a closed loop "
                             "(agentic, synthetic); a Mooncake trace's requests arrive at their "
                             "timestamps (workload.time_scale)")
        return self
