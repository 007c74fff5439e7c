"""Copy path by what it costs: the path of one GPU <-> host batch from the copies already
in flight and the compute running, weighing the batch's copy time against the compute it
slows (pure: standard library only; every input comes from the hardware profile).

Both backends call ``PathChooser.choose`` as they submit a batch (``path_chooser`` builds
it once). A direction whose path is pinned (a forced ``copy_path``, chunked host
registration, the coherent-link opt-in: ``kvsim.core.datapath.copypath``) keeps it.
Otherwise, for a batch of ``n`` pages of ``p`` bytes in direction ``d``:

- **rates**: the batch's flow and, where the other direction has a batch in flight, that
  flow too, max-min fair over the link's per-direction and both-directions rates and, for
  SM-kernel flows, the kernel's own ceilings (``sm.h2d`` / ``sm.d2h`` / ``sm.both``, the
  link's where not given) and its CTAs x the per-CTA rate (x its direction's ``busy_eff``
  while compute runs);
- **CTAs**: a direction alone gets CTAs for its link by Little's law (``copy_ctas``, as
  before); a batch the rule puts on the SM kernel beside the other direction's SM-kernel
  batch, for half the kernel's both-directions ceiling, so the pair holds no more CTAs
  than it can keep busy (a pinned path keeps a direction's own);
- **time**: the copy engine ``per_call + n x per_page + n x p / rate`` (the H200's
  measured additive model, where the profile gives the SM kernel's ceilings; else
  ``n x max(per_page, p / rate)``, the older overlap model; under compute a page's DMA
  at least ``p / link + busy_per_page``), the SM kernel ``launch`` (+ ``busy_start``
  under compute) ``+ n x p / rate``; each path's ``transfer.latency``;
- **cost**: ``time x (1 + stretch + slowdown)``: ``stretch``, the share of the running
  compute's progress the batch's copy takes while it runs (the interference model,
  ``kvsim.core.datapath.interference``: the compute's own stretch with the batch's load
  against without it); ``slowdown``, the share of its rate the other direction's batch
  loses to this one. The cheaper path wins; a tie goes to the copy engine (no SMs).

A batch moving alone while nothing computes takes ``PathChooser.lone``: the older
time-per-page rule's path (``direction_paths``, validated on the H200 one direction at a
time) unless the other path's worse regret is smaller over the two futures the batch may
have: alone to its end, or joined by the other direction (a path that moves a few percent
more alone can leave a pair well below what the other allows). It is what the backends
report as each direction's path. With both directions in flight, the path that keeps
their sum highest wins; while a GEMM-heavy step computes, the SM kernel pays for the
waves it takes.

Decisions are cached by (direction, the other's path, the compute's key, the batch's
pages rounded down to a power of two, the size the cost is computed at): a pure function
of the key, so both backends decide alike for the same state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from kvsim.core.datapath.copypath import DIRECTIONS, CopyPath, copy_ctas
from kvsim.core.datapath.interference import (IDLE, CopyLoad, MixTable, Most, Shares, issue_share,
                                              kind_share, legacy_stretch)
from kvsim.core.datapath.work import StepWork, gemm_rows, gemm_share

CE, SM = CopyPath.COPY_ENGINE, CopyPath.SM_KERNEL
Stretch = Callable[[CopyLoad], float]


@dataclass(frozen=True)
class CostInputs:
    """A profile's numbers for one page size (``cost_inputs``)."""

    page_bytes: int
    link: Mapping[str, float]        # h2d, d2h, both, mixed, mixed_ce_h2d (one a path)
    sm: Mapping[str, float]          # the SM kernel's ceilings: h2d, d2h, both
    per_page: Mapping[str, float]    # the copy engine's host time a page, by direction
    per_call: float
    launch: float
    latency: Mapping[CopyPath, float]
    cta_rate: Mapping[str, float]
    ctas_one: Mapping[str, int]      # a direction alone
    ctas_both: Mapping[str, int]     # both directions on the SM kernel
    busy_eff: Mapping[str, float]    # a copy CTA's share of its idle rate under compute
    busy_start: float
    additive: bool                   # host time, then DMA (else they overlap)
    one_thread: bool                 # copy-engine calls issued on one host thread, in turn
    busy_per_page: Mapping[str, float]  # the copy engine's more a page under compute
    # a measured split both ways (``sm.both_ctas_d2h``): the SM kernel's both-ways total
    # with more GPU -> host CTAs than it (None: no split measured, ``sm.both`` always)
    crowded: float | None = None
    # the kinds' busy shares, (GEMMs', reads') each (h2d, d2h) (None: ``busy_eff`` beside any
    # step; ``kvsim.core.datapath.interference.busy_share``)
    busy_kinds: tuple[Shares, Shares] | None = None
    # with them, the most bytes a second GPU -> host CTAs move together beside each kind
    # (``kind_share``; None: no limit)
    busy_most: Most | None = None


def cost_inputs(profile, page_bytes: int, sm_ctas: int | Mapping[str, int] | None) -> CostInputs:
    """The cost rule's inputs from a hardware profile (``sm_ctas``: the setting, one count
    or one a direction, taken both ways as it is; None: Little's law)."""
    sm, ce, i = profile.sm, profile.copy_engine, profile.sm.interference
    lk = profile.link
    link = {"h2d": lk.h2d, "d2h": lk.d2h, "both": lk.both,
            "mixed": lk.mixed_for("d2h", page_bytes), "mixed_ce_h2d": lk.mixed_for("h2d", page_bytes)}
    ceil = {d: profile.sm_ceiling(d) for d in ("h2d", "d2h", "both")}
    rate = {d: sm.cta_rate(d, page_bytes) for d in DIRECTIONS}  # (a table: at this page size)

    def size(target: float, d: str) -> int:
        if sm_ctas is not None:
            return sm_ctas[d] if isinstance(sm_ctas, Mapping) else sm_ctas
        return copy_ctas(target, rate[d], sm.copy_cta_slots, sm.headroom(d))

    one = {d: size(link[d], d) for d in DIRECTIONS}
    both = {d: size(ceil["both"] / 2, d) for d in DIRECTIONS}
    if sm_ctas is None and sm.both_ctas_d2h is not None:  # (measured: host -> GPU keeps its own)
        both = {"h2d": one["h2d"], "d2h": sm.both_ctas_d2h}
    return CostInputs(
        page_bytes, link, ceil, {d: ce.per_page_for(d, page_bytes) for d in DIRECTIONS},
        ce.per_call, sm.launch, {CE: profile.transfer.latency_for(False), SM: profile.transfer.latency_for(True)},
        rate, one, both,
        dict(zip(DIRECTIONS, i.busy_eff())), i.busy_start, sm.h2d is not None or sm.d2h is not None,
        ce.call_threads == 1, {d: ce.busy_per_page_for(d, page_bytes) for d in DIRECTIONS},
        None if sm_ctas is not None or sm.both_ctas_d2h is None
        else (sm.both_crowded or profile.sm_ceiling("both")), i.kind_busy(), i.kind_most())


def _fair(flows: list[tuple[str, CopyPath, float]], ci: CostInputs,
          d2h_ctas: int = 0) -> list[float]:
    """Max-min fair rates of flows (direction, path, cap), by progressive filling over
    the link's resources and the SM kernel's own (a pair on different paths: the link's
    ``mixed`` total too, ``mixed_ce_h2d``'s with the copy engine host -> GPU; both on the
    SM kernel with ``d2h_ctas`` GPU -> host CTAs past the split: ``crowded``)."""
    ce_h2d = any(d == "h2d" and p is CE for d, p, _ in flows)
    both = ci.sm["both"]
    if ci.crowded is not None and d2h_ctas > ci.ctas_both["d2h"] and \
            len(flows) == 2 and all(p is SM for _, p, _ in flows):
        both = ci.crowded
    res: dict[str, float] = {"both": ci.link["both"], "sm_both": both,
                             "mixed": ci.link["mixed_ce_h2d" if ce_h2d else "mixed"]}
    mixed = len({p for _, p, _ in flows}) > 1
    uses = []
    for d, p, _ in flows:
        u = [d, "both"] + (["mixed"] if mixed else [])
        res[d] = ci.link[d]
        if p is SM:
            u += ["sm_" + d, "sm_both"]
            res["sm_" + d] = ci.sm[d]
        uses.append(u)
    rates = [0.0] * len(flows)
    active = set(range(len(flows)))
    left = dict(res)
    while active:
        inc = min([left[r] / sum(1 for i in active if r in uses[i]) for r in left
                   if any(r in uses[i] for i in active)] +
                  [flows[i][2] - rates[i] for i in active])
        for i in active:
            rates[i] += inc
        for r in left:
            left[r] -= inc * sum(1 for i in active if r in uses[i])
        done = {i for i in active if rates[i] >= flows[i][2] * (1 - 1e-12)
                or any(left[r] <= 1e-9 * res[r] for r in uses[i])}
        active -= done
    return rates


class PathChooser:
    """The path (and SM CTAs) of each GPU <-> host batch: ``pinned`` paths kept, the rest
    by cost (see the module docstring). ``kinds``: the structural interference model for
    the run's GEMMs (None: the older terms ``per_cta`` and ``ce_slow`` for every compute,
    as for a compute without a step's work)."""

    def __init__(self, inputs: CostInputs, pinned: Mapping[str, CopyPath | None],
                 idle: Mapping[str, CopyPath], kinds: MixTable | None = None,
                 per_cta: float = 0.0, ce_slow: float = 0.0):
        self.inputs = inputs
        self.pinned = dict(pinned)
        self.idle = dict(idle)
        self.lone = {d: self._lone(d) for d in DIRECTIONS}
        self.kinds = kinds
        self.per_cta = per_cta
        self.ce_slow = ce_slow
        self._cache: dict[tuple, tuple[CopyPath, int]] = {}

    def pick(self, d: str, pages: int, other: CopyPath | None, computing: bool,
             work: StepWork | None) -> tuple[CopyPath, int]:
        """``choose`` for the running compute as a backend sees it: whether one runs, and
        its step's work (None: the SMs alone). The step's GEMM share is taken to 1/64 and
        its GEMMs' M as the stand-in's (the cache's key)."""
        if not computing:
            return self.choose(d, pages, other)
        kinds = self.kinds
        if work is None or kinds is None:
            per_cta, ce_slow = self.per_cta, self.ce_slow
            return self.choose(d, pages, other,
                               lambda load: legacy_stretch(per_cta, ce_slow, load), "legacy")
        share = round(gemm_share(work) * 64) / 64
        rows = gemm_rows(work.tokens, kinds.min_rows, kinds.max_rows)
        gemms, structure, exposure = kinds.gemms[rows], kinds.structure, kinds.exposure[rows]
        ci = self.inputs
        # (at the rounded share, as the stretch: the decision a function of its key)
        busy: dict[str, float] | None = None
        if ci.busy_kinds is not None:  # (and the step's share: with ``busy_most``, ``cost``
            # takes GPU -> host's at each batch's CTAs)
            busy = dict(zip(DIRECTIONS, kind_share(ci.busy_kinds, share)), gemm_share=share)
        return self.choose(d, pages, other,
                           lambda load: structure.stretch(share, gemms, load, exposure), (share, rows),
                           busy)

    def _lone(self, d: str) -> CopyPath:
        """The path of a batch that starts alone while nothing computes: the older rule's
        (``idle``) unless the other path's worse regret over the two futures it may have is
        smaller: moving alone to its end (the regret: the better path's rate alone over
        this one's) or joined by an equal batch the other way (the best pair's total rate
        over the best this path leaves, the joiner on the path ``choose`` would give it).
        So a batch gives up a few percent alone where its path would hold a pair well below
        what the other path allows (256 KiB pages on the H200: the copy engine both ways
        ~76 GB/s against ~70 once one direction holds the SM kernel)."""
        p = self.pinned.get(d)
        if p is not None:
            return p
        idle = self.idle[d]
        alt = SM if idle is CE else CE
        alone = {q: self._alone_rate(d, q) for q in (CE, SM)}
        pair = {q: max(self._pair_rate(d, q, j) for j in (CE, SM)) for q in (CE, SM)}
        a, b = max(alone.values()), max(pair.values())

        def regret(q: CopyPath) -> float:
            return max(a / alone[q], b / pair[q]) - 1.0
        return alt if regret(alt) < regret(idle) - 1e-9 else idle

    def _cap(self, d: str, path: CopyPath, other: CopyPath | None, eff: float,
             flying: bool = False) -> float:
        """A flow's own cap: the SM kernel's CTAs x their rate (x ``eff``), none on the copy
        engine (``flying``: a batch in flight, ``_n``)."""
        if path is CE:
            return float("inf")
        return self._n(d, path, other, flying) * self.inputs.cta_rate[d] * eff

    def _n(self, d: str, path: CopyPath, other: CopyPath | None, flying: bool = False) -> int:
        """A batch's SM-kernel CTAs (0 on the copy engine): a joiner's by ``ctas``; one in
        flight that a batch the other way joins (``flying``), with a measured split those
        it launched with alone (its own), else the pair's."""
        if path is not SM:
            return 0
        if flying and self.inputs.crowded is not None:
            return self.inputs.ctas_one[d]
        return self.ctas(d, path, other)

    def _d2h_ctas(self, d: str, path: CopyPath, other: CopyPath | None, flying: bool) -> int:
        """GPU -> host's CTAs where ``d`` is it on the SM kernel (0 otherwise; ``_fair``)."""
        return self._n(d, path, other, flying) if d == "d2h" else 0

    def _alone_rate(self, d: str, path: CopyPath) -> float:
        """Bytes a second of a long batch moving alone in ``d`` on ``path`` (the copy
        engine's host time a page exposed as ``cost`` has it)."""
        ci = self.inputs
        r = _fair([(d, path, self._cap(d, path, None, 1.0))], ci)[0]
        if path is SM:
            return r
        pp, dma = ci.per_page[d], ci.page_bytes / r
        return ci.page_bytes / (pp + dma if ci.additive else max(pp, dma))

    def _pair_rate(self, d: str, path: CopyPath, joiner: CopyPath) -> float:
        """Total bytes a second of long equal batches both ways, ``d``'s on ``path``, the
        other's on ``joiner``. Both on the copy engine: a page each way costs its host
        times (in turn where calls share one thread) and its DMA at the pair's fair rates;
        otherwise the fair rates' sum, the copy engine's at most a page a (its host time +
        its DMA) (``link.mixed`` is the pair's total as the sim's fluid caps it: host time
        apart)."""
        ci = self.inputs
        od = "d2h" if d == "h2d" else "h2d"
        n = self._d2h_ctas(d, path, joiner, True) or self._d2h_ctas(od, joiner, path, False)
        rates = _fair([(d, path, self._cap(d, path, joiner, 1.0, True)),
                       (od, joiner, self._cap(od, joiner, path, 1.0))], ci, n)
        pb = ci.page_bytes
        if path is not CE or joiner is not CE:
            if path is SM and joiner is SM:
                return sum(rates)
            i, e = (0, d) if path is CE else (1, od)  # (the copy engine's flow)
            pp, dma = ci.per_page[e], pb / rates[i]
            ce = pb / (pp + dma if ci.additive else max(pp, dma))
            return rates[1 - i] + ce
        hosts, dmas = (ci.per_page[d], ci.per_page[od]), (pb / rates[0], pb / rates[1])
        if ci.one_thread:
            t = sum(hosts) + max(dmas) if ci.additive else max(sum(hosts), max(dmas))
        elif ci.additive:
            t = max(h + m for h, m in zip(hosts, dmas))
        else:
            t = max(max(h, m) for h, m in zip(hosts, dmas))
        return 2 * pb / t

    def ctas(self, d: str, path: CopyPath, other: CopyPath | None) -> int:
        ci = self.inputs
        return ci.ctas_both[d] if (path is SM and other is SM) else ci.ctas_one[d]

    def choose(self, d: str, pages: int, other: CopyPath | None = None,
               stretch: Stretch | None = None, key: object = None,
               busy: Mapping[str, float] | None = None) -> tuple[CopyPath, int]:
        """(path, SM CTAs) for a batch of ``pages`` in ``d``: ``other``, the path of the
        other direction's batch in flight (None: none); ``stretch(load)``, the running
        compute's stretch under a load (None: nothing computes), ``key`` naming it (the
        decision is cached under it: ``busy``, a copy CTA's shares beside it by direction,
        and with ``busy_most`` the step's ``gemm_share``, None: ``busy_eff``, must follow
        from it)."""
        p = self.pinned.get(d)
        if p is not None:  # (a pinned path keeps its CTAs too: what it was sized and measured at)
            return p, self.inputs.ctas_one[d]
        if other is None and stretch is None:  # alone, nothing computing: ``lone``
            p = self.lone[d]
            return p, self.inputs.ctas_one[d]
        n = 1 << (max(1, pages).bit_length() - 1)
        k = (d, other, key if stretch is not None else None, n)
        hit = self._cache.get(k)
        if hit is None:
            best = min((self.cost(d, n, path, other, stretch, busy), i, path)
                       for i, path in enumerate((CE, SM)))
            path = best[2]
            hit = self._cache[k] = (path, self.ctas(d, path, other))
        return hit

    def cost(self, d: str, pages: int, path: CopyPath, other: CopyPath | None,
             stretch: Stretch | None, busy: Mapping[str, float] | None = None) -> float:
        """Seconds a batch costs on ``path``: its time x (1 + the compute's progress it
        takes + the other direction's rate it takes); ``busy`` as ``choose``."""
        ci = self.inputs
        computing = stretch is not None
        od = "d2h" if d == "h2d" else "h2d"
        eff = ci.busy_eff if busy is None else busy

        most = ci.busy_most if ci.busy_kinds is not None and "gemm_share" in eff else None

        def cap(dd: str, pp: CopyPath, oth: CopyPath | None, flying: bool = False) -> float:
            e = eff[dd] if computing else 1.0
            if computing and most is not None and dd == "d2h" and pp is SM:
                e = kind_share(ci.busy_kinds, eff["gemm_share"], most,  # type: ignore[arg-type]
                               self._cap(dd, pp, oth, 1.0, flying))[1]
            return self._cap(dd, pp, oth, e, flying)

        flows = [(d, path, cap(d, path, other))]
        n = self._d2h_ctas(d, path, other, False)
        if other is not None:
            flows.append((od, other, cap(od, other, path, True)))
            n = n or self._d2h_ctas(od, other, path, True)
        rates = _fair(flows, ci, n)
        nbytes = pages * ci.page_bytes
        r = rates[0]
        issue = 0.0
        if path is CE:
            host = pages * ci.per_page[d]
            dma = nbytes / r
            more = ci.busy_per_page[d] if computing else 0.0
            if more > 0:  # under compute a page's DMA takes that longer (the sim caps its flow)
                dma = max(dma, pages * (ci.page_bytes / ci.link[d] + more))
            t = ci.per_call + (host + dma if ci.additive else max(host, dma))
            # its issuing's host-bound share, over the batch's time
            issue = issue_share(ci.per_page[d], ci.page_bytes, ci.link[d]) * host / t if t > 0 else 0.0
        else:
            t = ci.launch + (ci.busy_start if computing else 0.0) + nbytes / r
        t += ci.latency[path]
        slowdown = 0.0
        if other is not None:
            alone = _fair([(od, other, cap(od, other, None, True))], ci)[0]
            slowdown = 1.0 - rates[1] / alone if alone > 0 else 0.0
        taken = 0.0
        if stretch is not None:
            fly = [] if other is None else [(od, other, rates[1], self._n(od, other, path, True))]
            without = _load([(od, other, rates[1], self._n(od, other, None, True))] if other is not None
                            else [], self.inputs)
            with_ = _load([(d, path, r, self._n(d, path, other))] + fly, self.inputs, issue)
            s0, s1 = stretch(without), stretch(with_)
            taken = 1.0 - (1.0 + s0) / (1.0 + s1) if s1 > s0 else 0.0
        return t * (1.0 + taken + slowdown)


def _load(flows, ci: CostInputs, issue: float = 0.0) -> CopyLoad:
    """The ``CopyLoad`` of flows (direction, path, rate, SM CTAs), ``issue`` the
    copy-engine calls' issuing share."""
    ctas = {"h2d": 0, "d2h": 0}
    ce = False
    hbm = written = sm_out = 0.0
    for d, p, r, n in flows:
        if p is SM:
            ctas[d] += n
            if d == "d2h":
                sm_out += r
        else:
            ce = True
        hbm += r
        if d == "h2d":
            written += r
    load = CopyLoad(ctas["h2d"], ctas["d2h"], ce, hbm, written, issue, sm_out)
    return IDLE if load.idle else load


def path_chooser(profile, page_bytes: int, pinned: Mapping[str, CopyPath | None],
                 idle: Mapping[str, CopyPath], sm_ctas: int | Mapping[str, int] | None,
                 kinds: MixTable | None) -> PathChooser:
    """The chooser for pages of ``page_bytes`` on ``profile``: ``pinned`` paths per
    direction (None: by cost), ``idle`` each direction's path alone with nothing computing
    (``direction_paths``), ``sm_ctas`` the setting (None: Little's law), ``kinds`` the
    structural interference model for the run's GEMMs (None: the profile's older terms)."""
    i = profile.sm.interference
    return PathChooser(cost_inputs(profile, page_bytes, sm_ctas), pinned, idle, kinds,
                       i.per_cta_slowdown, i.copy_engine_slowdown)


def other_path(counts) -> CopyPath | None:
    """The other direction's path as the rule sees it from its batches in flight, counted
    as [copy engine, SM kernel]: the SM kernel if any runs there, else the copy engine if
    any, else None."""
    if counts[1]:
        return SM
    return CE if counts[0] else None
