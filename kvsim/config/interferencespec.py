"""The hardware profile's ``sm.interference`` section: how copies slow compute, the older
per-CTA terms and the structural model's per-kind terms (``KindSpec``;
``kvsim.core.datapath.interference`` has the model and what each term is)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from kvsim.config.units import parse_rate, parse_time
from kvsim.core.datapath.interference import KindTerms, Most, Shares

Seconds = Annotated[float, BeforeValidator(parse_time), Field(ge=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]
Slowdown = Annotated[float, Field(ge=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]

__all__ = ["InterferenceSpec", "KindSpec", "KindTerms"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KindSpec(_Frozen):
    """How copies slow one kind of a step's work (``kvsim.core.datapath.interference``,
    which says what each term is): ``cta_sm_share_h2d`` / ``_d2h``, the share of an SM a
    copy CTA takes from the work's CTAs; ``copy_engine_slowdown`` while a copy-engine copy
    moves bytes; ``hbm_weight`` / ``hbm_write_weight`` (default: ``hbm_weight``), the HBM
    bytes a copied byte read from / written into HBM takes from the work's reads;
    ``straggle_h2d`` / ``_d2h``, a GEMM CTA's slowdown beside a copy CTA;
    ``issue_slowdown`` while copy-engine calls issue pages host-bound; ``backlog_d2h``
    per GPU -> host copy CTA the link leaves waiting; ``page_d2h``, the work's time each
    page the SM kernel moves GPU -> host costs it (a duration: '43ns'; the last five
    default 0);
    ``busy_cta_efficiency`` / ``_d2h``: a copy CTA's share of its idle rate beside this
    kind of work (None: ``InterferenceSpec``'s); a step's are the kinds' weighted by its
    time in each (``kvsim.core.datapath.interference.busy_share``); ``busy_rate_d2h``:
    the most the SM kernel's GPU -> host CTAs move together beside this kind: CTAs of
    idle rate ``r`` in all move ``min(r x busy share, busy_rate_d2h)`` (None: no such
    limit; ``kind_share``)."""

    cta_sm_share_h2d: Annotated[float, Field(ge=0)]
    cta_sm_share_d2h: Annotated[float, Field(ge=0)]
    copy_engine_slowdown: Slowdown
    hbm_weight: Annotated[float, Field(ge=0)] = 1.0
    hbm_write_weight: Annotated[float, Field(ge=0)] | None = None
    straggle_h2d: Annotated[float, Field(ge=0)] = 0.0
    straggle_d2h: Annotated[float, Field(ge=0)] = 0.0
    issue_slowdown: Annotated[float, Field(ge=0)] = 0.0
    backlog_d2h: Annotated[float, Field(ge=0)] = 0.0
    page_d2h: Seconds = 0.0
    busy_cta_efficiency: Fraction | None = None
    busy_cta_efficiency_d2h: Fraction | None = None
    busy_rate_d2h: Rate | None = None

    def terms(self) -> KindTerms:
        return KindTerms(self.cta_sm_share_h2d, self.cta_sm_share_d2h,
                         self.copy_engine_slowdown, self.hbm_weight,
                         self.straggle_h2d, self.straggle_d2h, self.hbm_write_weight,
                         self.issue_slowdown, self.backlog_d2h, self.page_d2h)


class InterferenceSpec(_Frozen):
    """How copies slow compute: an SM copy kernel of ``sm_kernel_ctas`` CTAs stretches a
    compute kernel by ``sm_kernel_slowdown`` (linear in the CTA count); any copy-engine
    transfer in flight stretches it by ``copy_engine_slowdown``. ``busy_cta_efficiency``:
    the share of its idle bandwidth a copy CTA gets while compute occupies the SMs;
    ``busy_cta_efficiency_d2h`` a GPU -> host CTA's where it differs (None: the same);
    ``drain_cta_efficiency_d2h``: the share of its idle rate a GPU -> host CTA drains at
    beside a step of the structural model, which sets how many of them wait (the kinds'
    ``backlog_d2h``; None: the busy share GPU -> host). Apart because they differ: under
    a prefill's GEMMs 8 CTAs moved 0.37-0.49 of their idle rate (H200, 2026-12-03 22:33),
    beside a step's HBM reads about 0.57 (six grids' copy times, 2026-12-04); ``kvsim
    calibrate`` fits the busy share under a prefill (the GEMM kind's, on a profile with
    the kinds) and keeps this one from its base. Each kind may give its own busy shares (``KindSpec``): a
    step's are then the kinds' by its time in each.

    ``lasting_step_penalty``: what the SM kernel leaves behind once it has moved pages over
    the host link ``lasting_after_batches`` times: every later compute call (an engine
    step) takes this much longer, for the rest of the run, whatever path copies then. The
    seed measured it on a coherent link: SM idle gaps between kernels grow, no kernel gets
    slower, so the sim adds it after the step's work (it holds no SM and stretches no
    copy). Default 0: no lasting effect (nothing like it was measured on PCIe).
    ``lasting_gap_per_kernel``: the same penalty as the seed's mechanism, a grown idle gap
    per kernel: a step pays it times its kernels (``BackendSettings.kernels_per_step``:
    the model's layers x ``engine.kernels_per_layer``), on top of ``lasting_step_penalty``.

    ``busy_start``: how much later an SM copy kernel launched while compute runs starts
    moving bytes than on an idle GPU: its CTAs get SM room only as the compute's CTAs
    retire. A fixed cost per kernel, so it weighs on small batches and vanishes in large
    ones. Default 0.

    ``gemm`` and ``memory`` (``KindSpec``, both or neither): the structural model of how
    copies slow a step by the kind of its work (``kvsim.core.datapath.interference``):
    the GEMMs of its FLOP-bound share lose waves to the SMs copy CTAs take (GEMM CTAs of
    ``gemm_tile`` output each), its HBM reads lose SM slots and HBM bytes. Without them
    every step is stretched by ``sm_kernel_slowdown`` and ``copy_engine_slowdown`` (the
    older model), which stay the terms of a compute of the SMs alone (no ``StepWork``).

    ``copy_ctas_per_sm``: how many SM copy CTAs share one SM where a step's GEMMs leave it
    free (the copy kernel's resident CTAs an SM, by its registers and threads). A copy
    kernel launched while GEMMs run gets SMs as their CTAs retire and packs onto them, so
    ``c`` copy CTAs hold ``ceil(c / copy_ctas_per_sm)`` SMs: a GEMM of one wave whose tiles
    fit on the rest loses nothing to them. Default 1 (a CTA an SM)."""

    sm_kernel_slowdown: Slowdown
    sm_kernel_ctas: Annotated[int, Field(gt=0)]
    copy_engine_slowdown: Slowdown
    busy_cta_efficiency: Fraction
    busy_cta_efficiency_d2h: Fraction | None = None
    drain_cta_efficiency_d2h: Fraction | None = None
    lasting_step_penalty: Seconds = 0.0
    # the same effect per kernel: each of a step's kernels (the model's layers x the
    # engine's kernels_per_layer) leaves this much more idle gap once it has begun
    lasting_gap_per_kernel: Seconds = 0.0
    lasting_after_batches: Annotated[int, Field(gt=0)] = 3
    busy_start: Seconds = 0.0
    gemm: KindSpec | None = None
    memory: KindSpec | None = None
    gemm_tile: tuple[Annotated[int, Field(gt=0)], Annotated[int, Field(gt=0)]] = (128, 256)
    copy_ctas_per_sm: Annotated[int, Field(gt=0)] = 1

    def busy_eff(self) -> tuple[float, float]:
        """A copy CTA's share of its idle rate under compute: (host -> GPU, GPU -> host)."""
        e, d2h = self.busy_cta_efficiency, self.busy_cta_efficiency_d2h
        return e, e if d2h is None else d2h

    def kind_busy(self) -> tuple[Shares, Shares] | None:
        """The kinds' busy shares, (GEMMs', reads'), each (host -> GPU, GPU -> host), the
        spec's where a kind gives none; None where no kind gives one (one share for all)."""
        g, m = self.gemm, self.memory
        if g is None or m is None or all(
                k.busy_cta_efficiency is None and k.busy_cta_efficiency_d2h is None
                and k.busy_rate_d2h is None for k in (g, m)):
            return None
        e, d2h = self.busy_eff()

        def of(k: KindSpec) -> Shares:
            return (e if k.busy_cta_efficiency is None else k.busy_cta_efficiency,
                    d2h if k.busy_cta_efficiency_d2h is None else k.busy_cta_efficiency_d2h)
        return of(g), of(m)

    def kind_most(self) -> Most | None:
        """The kinds' ``busy_rate_d2h``, (GEMMs', reads'); None where neither gives one."""
        g, m = self.gemm, self.memory
        if g is None or m is None or (g.busy_rate_d2h is None and m.busy_rate_d2h is None):
            return None
        return g.busy_rate_d2h, m.busy_rate_d2h

    def drain_eff(self) -> float:
        """A GPU -> host copy CTA's share of its idle rate as the waiting CTAs count it."""
        d = self.drain_cta_efficiency_d2h
        return self.busy_eff()[1] if d is None else d

    @property
    def per_cta_slowdown(self) -> float:
        return self.sm_kernel_slowdown / self.sm_kernel_ctas

    @model_validator(mode="after")
    def _both_kinds(self) -> "InterferenceSpec":
        if (self.gemm is None) != (self.memory is None):
            raise ValueError("gemm and memory: give both kinds' terms or neither")
        return self
