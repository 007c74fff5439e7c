"""How copies in flight slow a step's compute, by the kind of work it is: the structural
model the sim stretches compute with and the copy-path rule weighs (pure: standard
library only; every constant comes from the hardware profile's ``sm.interference``).

A step's work (``kvsim.core.datapath.work``) is a ``gemm_share`` of tensor-core GEMMs
(the stand-in's FLOP-bound part) and the rest HBM reads (its memory-bound part). What the
copies in flight take is a ``CopyLoad``: the SM copy kernel's CTAs moving bytes in each
direction, whether a copy-engine copy moves bytes, the bytes a second copies move
through HBM (and how many of them are written into it), and the host-bound share of the
copy-engine calls issuing their pages. Each kind of work loses to it by its own structure:

- **GEMMs** run in waves of CTAs, one tile each. A resident copy CTA takes
  ``cta_sm_share_h2d`` (``_d2h``) of an SM from them: ``lost`` of ``S`` SMs taken, a
  GEMM of ``t`` tiles runs ``w = ceil(t / (S - lost))`` waves. Each wave is bound one
  way or the other: while tiles queue for SMs (the waves but one) they spread over the
  SMs left, ``S / (S - lost) - 1``; the wave that does not queue (a one-wave GEMM's
  only one: each tile has an SM, the copy CTA beside it) waits for its slowest tile,
  one beside a copy CTA that runs ``straggle_h2d`` (``_d2h``) slower; a GEMM of one wave
  whose tiles all find an SM no copy CTA sits on has no such tile. Copy CTAs pack: a
  cuBLAS GEMM CTA on Hopper holds nearly all of an SM's registers and shared memory, so no
  copy CTA shares an SM with one, and a copy kernel launched while GEMMs run takes SMs as
  their CTAs retire and stacks its CTAs on them, ``copy_ctas_per_sm`` an SM: ``c`` copy
  CTAs hold ``ceil(c / copy_ctas_per_sm)`` SMs, and a one-wave GEMM loses nothing while
  ``t <= S - ceil(c / copy_ctas_per_sm)``.
  So ``(S / (S - lost) - 1) x (w - 1) / w + straggle / w`` (``gemm_loss``): a prefill
  chunk's GEMMs, of many waves, lose the SMs taken and a share of the straggle; a decode
  batch's, of one wave (a small M), the straggle alone, and only where its tiles need an
  SM a copy CTA is on. (Measured on H200s: beside 1-4 GPU -> host CTAs a decode-like
  step of 256 requests ran 0-1% longer, beside 14 +55-58%, while a prefill chunk ran
  +13% from the first CTA; what the small GEMMs lose beside many CTAs is the waiting
  CTAs' ``backlog_d2h`` below, as for reads.) The step's GEMMs (one layer's projections
  at the step's M) are weighted by their FLOPs;
- a GEMM of few rows is partly bound by its bytes: its weights are read once per GEMM
  whatever M is. ``hbm_exposure``: the share of a GEMM's time (its FLOPs at the GPU's
  GEMM rate at that M, ``Structure.gemm_rates``) its bytes take at the reads' HBM rate,
  FLOP-weighted over the layer's GEMMs (llama-3-8b on an H200: 0.52 at M = 256, 0.09 at
  4096); that share of the GEMM part loses what the reads lose to the copies' HBM bytes
  (the memory kind's HBM term). No term of its own: refitted with it, the kinds' terms
  put a decode-like step's cells of twelve H200 runs within 87 times of 170 each run left
  out, against 78 without (``benchmarks/hw_interference.py --loo``);
- **HBM reads** run as many small CTAs: a copy CTA takes its share of an SM's slots
  (``cta_sm_share_*``), the reads the rest, ``S / (S - lost)``;
- both: the copies' HBM bytes take ``hbm_weight`` (a byte read from HBM) and
  ``hbm_write_weight`` (a byte written into it) of theirs from the work's rate: ``x / (1
  - x)`` with ``x = (weight x read_Bps + write weight x written_Bps) / hbm_Bps``;
  ``copy_engine_slowdown`` while any copy-engine copy moves bytes; ``issue_slowdown``
  times the share of calls issuing host-bound pages (``issue_share``: the GPU's front
  end takes in their command stream beside the compute's launches); ``backlog_d2h``
  for each GPU -> host SM copy CTA beyond those the link drains (``stalled_d2h``: CTAs
  less the kernel's rate over a CTA's, ``Structure.cta_d2h_Bps``; beside GEMMs a CTA's
  idle rate, ``cta_d2h_idle_Bps``: each of nine H200 machines held out, the kinds'
  terms refitted on the others, 554 of 1008 cells within against 538 at the reads'
  drain rate, 2026-12-05), for GEMMs times the
  share of their time in the wave that does not queue (``last_wave_share``: a GEMM of
  one wave waits on the tiles such CTAs slow throughout, a long one once; on an H200 the
  four GEMMs of M = 256 beside 4 / 6 / 8 / 14 such CTAs of 1 MiB, launched while they
  ran, +0.8 / 8.9 / 47.4 / 214%, those of M = 4096 +14.5 / 26.9 / 17.7 / 44.4%:
  ``benchmarks/hw_gemm_ctas.py --dir d2h``). On three H200s a
  step of HBM reads beside such a kernel of 1-8 CTAs ran 0-2% longer, of 14 (the
  default) 23-35%, of 24 72-108%, of 36 130-147%, while the kernel moved 41-52 GB/s
  throughout: the CTAs the link leaves waiting hold their stores in the memory system the
  step reads through, whatever they move (its host -> GPU CTAs, which wait for reads, did
  not: 1-8% from 1 to 66 CTAs); ``page_d2h``, seconds of the work's for each page the SM
  kernel moves GPU -> host (``pages_d2h``: its GPU -> host bytes a second over the page
  size): on H200s reads beside it GPU -> host ran 2.7% longer at 64 KiB pages, 0.8% at
  4 MiB, at 37-45 GB/s each (the medians of nine grids, 2026-12-04). Each with the
  kind's own terms (a fit gives GEMMs no read weight and no page term, reads no
  straggle).

A step's stretch under a load over all of it is ``share x gemm + (1 - share) x memory``
(``stretch``): the stand-in runs its two parts one after the other, each slowed by its
own kind while the load holds (the sim's job keeps the parts apart: ``MixTable.parts``).
With no copy in flight and no call issuing every term is 0.0 exactly. A compute without
a ``StepWork`` (a load of the SMs alone: the hw backend's FMA kernel) keeps the older
model's terms (``sm_kernel_slowdown`` per ``sm_kernel_ctas`` CTAs,
``copy_engine_slowdown``), measured against such a kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from kvsim.core.datapath.work import (StepWork, gemm_rate, gemm_rows, gemm_share, gemm_tiles,
                                      row_buckets)

#: bytes an element of a GEMM's operands takes (fp16 / bf16, as the stand-in runs them)
ELEM_BYTES = 2


class CopyLoad(NamedTuple):
    """What the copies in flight take from compute: SM copy CTAs moving bytes host ->
    GPU and GPU -> host (a GPU-side kernel such as a check counts as GPU -> host: it reads
    HBM), whether a copy-engine copy moves bytes, the bytes a second they move through
    HBM (a GPU -> GPU copy reads and writes each byte: twice its rate), of which
    ``h2d_Bps`` are written into HBM from the host (the rest are read from it), and
    ``issue``, the host-bound share of the copy-engine calls issuing their pages (0-1:
    the command stream the GPU's front end takes in beside the compute's launches), and
    ``sm_d2h_Bps``, the bytes a second the SM kernel's GPU -> host CTAs move (by which
    the CTAs beyond what that rate needs are told: ``Structure.stalled_d2h``)."""

    ctas_h2d: int = 0
    ctas_d2h: int = 0
    copy_engine: bool = False
    hbm_Bps: float = 0.0
    h2d_Bps: float = 0.0
    issue: float = 0.0
    sm_d2h_Bps: float = 0.0

    @property
    def idle(self) -> bool:
        return not (self.ctas_h2d or self.ctas_d2h or self.copy_engine or self.hbm_Bps
                    or self.issue)


IDLE = CopyLoad()


@dataclass(frozen=True)
class KindTerms:
    """One kind of work's terms (``sm.interference.gemm`` / ``.memory`` of a profile):
    the SMs a copy CTA takes by direction, the constant while a copy-engine copy moves
    bytes, the HBM bytes a byte read from (``hbm_weight``) and written into HBM
    (``hbm_write_weight``, None: ``hbm_weight``) takes from the work's reads; a GEMM
    CTA's slowdown beside a copy CTA (``straggle_*``, waited for once a wave: GEMMs
    only); the stretch at a whole share of issuing copy-engine calls
    (``issue_slowdown``); the stretch per GPU -> host copy CTA the link leaves waiting
    (``backlog_d2h``: ``Structure.stalled_d2h``); the seconds of the work's each page
    the SM kernel moves GPU -> host costs it (``page_d2h``: ``Structure.pages_d2h``)."""

    cta_sm_share_h2d: float
    cta_sm_share_d2h: float
    copy_engine_slowdown: float
    hbm_weight: float
    straggle_h2d: float = 0.0
    straggle_d2h: float = 0.0
    hbm_write_weight: float | None = None
    issue_slowdown: float = 0.0
    backlog_d2h: float = 0.0
    page_d2h: float = 0.0

    def lost_sms(self, load: CopyLoad) -> float:
        return self.cta_sm_share_h2d * load.ctas_h2d + self.cta_sm_share_d2h * load.ctas_d2h

    def straggle(self, load: CopyLoad) -> float:
        return ((self.straggle_h2d if load.ctas_h2d else 0.0)
                + (self.straggle_d2h if load.ctas_d2h else 0.0))

    def hbm_share(self, load: CopyLoad, hbm_Bps: float) -> float:
        """The share of the work's HBM rate the copies' bytes take (capped at 0.9)."""
        w = self.hbm_weight
        ww = w if self.hbm_write_weight is None else self.hbm_write_weight
        x = (w * (load.hbm_Bps - load.h2d_Bps) + ww * load.h2d_Bps) / hbm_Bps
        return x if x < 0.9 else 0.9

    def engine(self, load: CopyLoad) -> float:
        """The copy engine's own terms: its constant while it moves bytes, its issuing."""
        out = self.copy_engine_slowdown if load.copy_engine else 0.0
        if load.issue:
            out += self.issue_slowdown * (load.issue if load.issue < 1.0 else 1.0)
        return out


@dataclass(frozen=True)
class Structure:
    """The model's constants: ``sms`` on the GPU, ``hbm_Bps`` the rate a memory-bound
    step reads at (the compute model's: ``gpu.hbm x decode_efficiency``), ``tile`` a
    GEMM CTA's output tile (rows, cols), each kind's terms, and ``cta_d2h_Bps``, what
    one SM copy CTA moves GPU -> host under compute (the profile's ``sm.cta_offload`` at
    the run's page size x ``InterferenceSpec.drain_eff``: the rate the sim's CTAs move at
    where they, not the link, bind), ``copy_ctas_per_sm``, the copy CTAs one SM takes
    beside a step's GEMMs (``gemm_loss``), and ``gemm_rates``, the GPU's GEMM FLOP/s by
    M ((M, FLOP/s) sorted by M: ``gpu.gemm_flops``, or the compute model's one rate), by
    which a GEMM's time its bytes take is told (``hbm_exposure``; empty: none),
    ``page_bytes``, the run's page size (``pages_d2h``; 0: none), and
    ``cta_d2h_idle_Bps``, what one such CTA moves alone (``sm.cta_offload`` at the
    page size), by which the CTAs waiting beside GEMMs are told (0: ``cta_d2h_Bps``)."""

    sms: int
    hbm_Bps: float
    tile: tuple[int, int]
    gemm: KindTerms
    memory: KindTerms
    cta_d2h_Bps: float = 0.0
    copy_ctas_per_sm: int = 1
    gemm_rates: tuple[tuple[int, float], ...] = ()
    page_bytes: int = 0
    cta_d2h_idle_Bps: float = 0.0

    def pages_d2h(self, terms: KindTerms, load: CopyLoad) -> float:
        """``terms``' ``page_d2h`` times the pages a second the SM kernel moves GPU ->
        host at ``page_bytes`` (0 without either)."""
        if not terms.page_d2h or not load.sm_d2h_Bps or self.page_bytes <= 0:
            return 0.0
        return terms.page_d2h * load.sm_d2h_Bps / self.page_bytes

    def stalled_d2h(self, load: CopyLoad, per_cta: float = 0.0) -> float:
        """The SM kernel's GPU -> host CTAs beyond those its rate needs at ``per_cta``
        (0: ``cta_d2h_Bps``) each: CTAs whose stores wait for the link (0 without a rate)."""
        per_cta = per_cta or self.cta_d2h_Bps
        if not load.ctas_d2h or per_cta <= 0.0:
            return 0.0
        x = load.ctas_d2h - load.sm_d2h_Bps / per_cta
        return x if x > 0.0 else 0.0

    def hbm_stretch(self, terms: KindTerms, load: CopyLoad) -> float:
        x = terms.hbm_share(load, self.hbm_Bps)
        return x / (1.0 - x)

    def gemm_stretch(self, gemms: Sequence[tuple[int, float]], load: CopyLoad,
                     exposure: float = 0.0) -> float:
        """GEMMs of (tiles, weight) each: their waves on the SMs the copy CTAs leave,
        each wave waiting for its straggler (``gemm_loss``), plus the kind's copy-engine
        and HBM terms, and the reads' HBM term for the share ``exposure`` of their time
        their bytes take (``hbm_exposure``)."""
        t = self.gemm
        out = gemm_loss(gemms, self.sms, t.lost_sms(load), t.straggle(load),
                        load.ctas_h2d + load.ctas_d2h, self.copy_ctas_per_sm)
        out += t.engine(load) + self.pages_d2h(t, load)
        if t.backlog_d2h:
            stalled = self.stalled_d2h(load, self.cta_d2h_idle_Bps)
            if stalled:
                out += t.backlog_d2h * stalled * last_wave_share(gemms, self.sms)
        if load.hbm_Bps:
            out += self.hbm_stretch(t, load)
            if exposure > 0.0:
                out += exposure * self.hbm_stretch(self.memory, load)
        return out

    def memory_stretch(self, load: CopyLoad) -> float:
        t = self.memory
        lost = t.lost_sms(load)
        s = float(self.sms)
        out = s / (s - lost) - 1.0 if lost < s - 1.0 else s - 1.0
        out += t.engine(load) + self.pages_d2h(t, load)
        if t.backlog_d2h:
            out += t.backlog_d2h * self.stalled_d2h(load)
        if load.hbm_Bps:
            out += self.hbm_stretch(t, load)
        return out

    def stretch(self, share: float, gemms: Sequence[tuple[int, float]], load: CopyLoad,
                exposure: float = 0.0) -> float:
        """A step of GEMM share ``share`` (its GEMMs ``gemms``, ``exposure`` of their
        time bound by their bytes) under ``load``: the share-weighted stretch of its parts
        (what the step takes in all while the load holds over it)."""
        if load.idle:
            return 0.0
        out = 0.0
        if share > 0.0:
            out += share * self.gemm_stretch(gemms, load, exposure)
        if share < 1.0:
            out += (1.0 - share) * self.memory_stretch(load)
        return out


def hbm_exposure(structure: Structure, projections: Sequence[tuple[int, int]], rows: int) -> float:
    """The FLOP-weighted share of the time GEMMs of M = ``rows`` by each of
    ``projections`` (K, N) take at ``structure.gemm_rates`` that their bytes (``ELEM_BYTES``
    an element of M x K, K x N and M x N) take at ``structure.hbm_Bps``, each at most 1;
    0.0 without rates."""
    if not structure.gemm_rates or structure.hbm_Bps <= 0.0:
        return 0.0
    rate = gemm_rate(structure.gemm_rates, rows)
    num = den = 0.0
    for k, n in projections:
        flops = 2.0 * rows * k * n
        byte_s = ELEM_BYTES * (k * n + rows * k + rows * n) / structure.hbm_Bps
        x = byte_s * rate / flops
        num += flops * (x if x < 1.0 else 1.0)
        den += flops
    return num / den if den > 0 else 0.0


def last_wave_share(gemms: Sequence[tuple[int, float]], sms: int) -> float:
    """The FLOP-weighted mean of ``1 / waves`` of GEMMs of (tiles, weight) on ``sms``
    SMs: the share of a GEMM's time in the wave that waits for its slowest tile (1.0 for
    a GEMM of one wave; 1.0 without GEMMs)."""
    num = den = 0.0
    for tiles, w in gemms:
        num += w / math.ceil(tiles / sms)
        den += w
    return num / den if den > 0 else 1.0


def gemm_loss(gemms: Sequence[tuple[int, float]], sms: int, lost: float,
              straggle: float = 0.0, ctas: int = 0, per_sm: int = 1) -> float:
    """GEMMs of (tiles, weight) on ``sms`` SMs of which ``ctas`` copy CTAs take ``lost``:
    their FLOP-weighted stretch. Of a GEMM's ``w = ceil(tiles / (sms - lost))`` waves,
    the ``w - 1`` whose tiles queue for SMs spread over the SMs left, ``sms / (sms - lost)
    - 1``; the one that does not waits for its slowest tile, one beside a copy CTA that
    runs ``straggle`` slower: ``straggle / w`` (a GEMM of one wave, a small M, loses the
    straggle alone, none where its tiles fit on the SMs no copy CTA holds, ``sms -
    ceil(ctas / per_sm)`` with ``per_sm`` copy CTAs packed on an SM; a long one mostly
    the SMs)."""
    if (lost <= 0.0 and straggle <= 0.0) or not gemms:
        return 0.0
    left = sms - lost
    left = left if left > 1.0 else 1.0
    spread = sms / left - 1.0
    num = den = 0.0
    free = sms - -(-ctas // per_sm)
    for tiles, w in gemms:
        waves = math.ceil(tiles / left)
        s = 0.0 if waves == 1 and tiles <= free else straggle
        num += w * (spread * (waves - 1) + s) / waves
        den += w
    return num / den if den > 0 else 0.0


class MixTable:
    """The stretch of a ``StepWork`` under a load, for one model's GEMMs: ``projections``
    (K, N) of a layer on one GPU, M from ``gemm_rows`` within [``min_rows``,
    ``max_rows``]; the GEMMs' (tiles, FLOP weight) and ``hbm_exposure`` of each M are
    worked out once, and each kind's stretch once per load (the last load's are kept: a
    load holds over many steps), so that a step's costs a division and two products."""

    def __init__(self, structure: Structure, projections: Sequence[tuple[int, int]],
                 min_rows: int, max_rows: int):
        self.structure = structure
        self.min_rows = min_rows
        self.max_rows = max_rows
        self.gemms = {m: tuple((gemm_tiles(m, n, structure.tile), float(m) * k * n)
                               for k, n in projections)
                      for m in row_buckets(min_rows, max_rows)}
        self.exposure = {m: hbm_exposure(structure, projections, m) for m in self.gemms}
        self._load: CopyLoad = IDLE   # the load the parts below are for
        self._memory = 0.0            # the memory kind's stretch under it
        self._gemm: dict[int, float] = {}  # M -> the GEMM kind's stretch under it

    def gemms_for(self, work: StepWork) -> tuple[tuple[int, float], ...]:
        return self.gemms[gemm_rows(work.tokens, self.min_rows, self.max_rows)]

    def exposure_for(self, work: StepWork) -> float:
        return self.exposure[gemm_rows(work.tokens, self.min_rows, self.max_rows)]

    def parts(self, work: StepWork, load: CopyLoad) -> tuple[float, float, float]:
        """(GEMM share, the GEMM part's stretch, the reads part's) of ``work`` under
        ``load`` (0.0 each with none): the stand-in runs its GEMMs first, then its reads."""
        if load is not self._load:
            if load.idle:
                return 0.0, 0.0, 0.0
            if load != self._load:
                self._memory = self.structure.memory_stretch(load)
                self._gemm = {}
            self._load = load
        total = work.flop_s + work.memory_s
        share = work.flop_s / total if total > 0 else 0.0
        g = 0.0
        if share > 0.0:
            rows = gemm_rows(work.prefill_tokens + work.decode_tokens, self.min_rows, self.max_rows)
            got = self._gemm.get(rows)
            if got is None:
                got = self._gemm[rows] = self.structure.gemm_stretch(self.gemms[rows], load,
                                                                     self.exposure[rows])
            g = got
        return share, g, self._memory

    def stretch(self, work: StepWork, load: CopyLoad) -> float:
        """How much longer ``work`` runs while ``load`` holds over all of it (0.0 with
        none): the same float as ``structure.stretch``."""
        share, g, m = self.parts(work, load)
        out = 0.0
        if share > 0.0:
            out += share * g
        if share < 1.0:
            out += (1.0 - share) * m
        return out


def issue_share(per_page_s: float, page_bytes: int, link_Bps: float) -> float:
    """The host-bound share of a copy-engine call's issuing: the part of a page's host
    time (``per_page_s``) beyond the time its bytes take on the link, 0 where the link is
    the slower (large pages), near 1 where each page is mostly the driver's work (small
    host -> GPU pages on the H200: 3.3 us a 16 KiB page against 0.3 us of bytes)."""
    if per_page_s <= 0.0 or link_Bps <= 0.0:
        return 0.0
    x = 1.0 - page_bytes / link_Bps / per_page_s
    return x if x > 0.0 else 0.0


def legacy_stretch(per_cta: float, copy_engine: float, load: CopyLoad) -> float:
    """The older model, for a compute of the SMs alone: ``per_cta`` a copy CTA moving
    bytes, ``copy_engine`` while a copy-engine copy moves bytes (the same float the sim
    computed before the kinds)."""
    return per_cta * (load.ctas_h2d + load.ctas_d2h) + (copy_engine if load.copy_engine else 0.0)


Shares = tuple[float, float]  # a copy CTA's share of its idle rate: (host -> GPU, GPU -> host)
# the most bytes a second the SM kernel's GPU -> host CTAs move together beside each kind:
# (GEMMs', reads'), None where a kind sets no such limit (``KindSpec.busy_rate_d2h``)
Most = tuple[float | None, float | None]


def busy_share(other: Shares, kinds: tuple[Shares, Shares] | None,
               work: StepWork | None, most: Most | None = None, idle_d2h: float = 0.0) -> Shares:
    """A copy CTA's share of its idle rate under a compute of ``work``: ``other`` where it
    is not a step's work or without per-kind shares; else the kinds' (``kinds``: (GEMMs',
    reads')) weighted by the time the step spends as each (``gemm_share``): the mean rate
    of a copy the CTAs bind through the whole step. (Measured on an H200: under a
    prefill's GEMMs 8 GPU -> host CTAs moved 0.37-0.49 of their idle rate, beside reads
    6 of them about 0.57.) ``most`` and ``idle_d2h``: as ``kind_share``."""
    if kinds is None or work is None:
        return other
    return kind_share(kinds, gemm_share(work), most, idle_d2h)


def kind_share(kinds: tuple[Shares, Shares], share: float, most: Most | None = None,
               idle_d2h: float = 0.0) -> Shares:
    """The kinds' shares (GEMMs', reads') of a step whose GEMMs take ``share`` of its time;
    with ``most`` and GPU -> host SM copy CTAs in flight whose idle rates sum to
    ``idle_d2h`` (bytes a second), each kind's GPU -> host share at most its ``most`` over
    that: together they move no more than ``most`` (beside an H200's GEMMs 4 CTAs of 16
    KiB pages moved 0.88 of their idle rate each, 8 of them 0.54, 6 of 256 KiB-1 MiB
    0.45-0.5: 27-34 GB/s in all, 2026-12-04)."""
    (g0, g1), (m0, m1) = kinds
    if most is not None and idle_d2h > 0.0:
        cg, cm = most
        if cg is not None and cg < g1 * idle_d2h:
            g1 = cg / idle_d2h
        if cm is not None and cm < m1 * idle_d2h:
            m1 = cm / idle_d2h
    return m0 + share * (g0 - m0), m1 + share * (g1 - m1)


def least_share(shares: Sequence[Shares]) -> Shares:
    """The shares beside several computes at once (ranks sharing a GPU): each direction's
    least, the compute that holds the SMs hardest."""
    return min(s[0] for s in shares), min(s[1] for s in shares)
