"""Routing policies: which instance of a cluster serves a request, decided when it arrives.

A router sees the cluster only through a read-only ``Probe`` (built by the cluster, one a
request): the number of instances, and for each instance the request's cached prefix
there by tier (tokens of this request's prompt, matched within its reuse scope: another
tenant's pages are never seen) and its load (prefill tokens queued, decode blocks
running, requests running and waiting). It returns an instance index. Nothing here
changes an instance; a router keeps only its own state (a round-robin counter, where a
session went, a seeded random generator), never module state.

Policies (``router.policy``):

- ``round-robin``: instances in turn.
- ``least-loaded``: the lowest load, in blocks: queued prefill tokens / block tokens plus
  running decode blocks (ties: the next in round-robin order).
- ``session-affinity``: a session's turns go where its first went (its first: least
  loaded), unless that instance's load exceeds ``threshold`` x the cluster's mean load;
  then the least loaded, which the session follows from then on.
- ``prefix-aware``: Dynamo's KV router cost, lowest wins:
  ``overlap_weight x prefill_blocks + decode_blocks``, where ``prefill_blocks`` is the
  instance's queued prefill blocks plus the blocks of this request it would compute:
  its blocks minus the cached prefix, each cached block counted by its tier's weight
  (``tier_weights``: gpu 1, host 0.8, disk 0.5 by default). A prefix is scored by the
  share of *this request* it covers (blocks it saves), not by the blocks an instance
  holds, so a first block every request shares (Mooncake's) moves no request.
  ``balance_threshold`` (SGLang's cache-aware router): when the most and least loaded
  instances differ by more than this many blocks, the least loaded wins outright.
  ``temperature`` > 0: sample with probabilities softmax(-cost / (temperature x mean
  cost)), seeded (Dynamo's router temperature); 0: the lowest cost.
- ``session-hash`` is the node's rule (``kvsim.run.ranks.rank_of``); it needs no probe.

A user's router (``router.policy: module:Class``) subclasses ``Router``: built as
``Class(instances, knobs, seed)`` (``knobs``: ``router.knobs``), its ``route(request,
probe)`` returns an index in ``range(probe.instances)``: any integer but a bool (a
numpy one, ``np.argmin``'s, is taken as the int it equals).

A cluster's probe also offers the views of an ``IndexedProbe`` (optional: the built-in
routers use them when there, and decide exactly as from ``cached`` and ``load`` of every
instance): ``holders(blocks)``, the instances that may hold the request's first ``blocks``
blocks (1 or 2; any other instance's cached prefix is shorter), and the instances by load
in blocks (``by_load``, ``load_span``, ``mean_load``). With them a request costs the
prefix-aware and least-loaded routers a few probes (the holders, and the instances whose
load could still give the lowest cost, ties included), not one an instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Mapping, Protocol, Sequence

__all__ = ["IndexedProbe", "LEVEL_NAMES", "Load", "Probe", "RouteRequest", "Router",
           "ROUTER_NAMES", "make_router"]

LEVEL_NAMES = ("gpu", "host", "disk")


@dataclass(frozen=True, slots=True)
class Load:
    """An instance's load as its engine had it at its last step boundary."""

    queued_prefill_tokens: int   # prompt tokens admitted or waiting, not yet computed or found
    decode_blocks: int           # KV blocks of the requests decoding
    running: int                 # requests admitted (onboarding, prefilling, decoding)
    waiting: int                 # requests queued for admission


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a router knows of the request it routes."""

    session: str
    turn: int                    # 1: the session's first turn
    input_tokens: int
    blocks: int                  # the prompt's cache blocks
    block_tokens: int            # tokens a cache block
    previous: int | None         # the instance that served the session's previous turn


class Probe(Protocol):
    """The read-only view a router has of the cluster, for one request."""

    instances: int

    def cached(self, i: int) -> tuple[int, int, int]:
        """Tokens of this request's prompt cached on instance ``i``, by tier (gpu, host,
        disk): its longest cached prefix within the request's reuse scope."""

    def load(self, i: int) -> Load:
        """Instance ``i``'s load."""


class IndexedProbe(Probe, Protocol):
    """A probe with the cluster's views (optional): what every instance's ``cached`` and
    ``load`` would say, without asking each."""

    def holders(self, blocks: int) -> Sequence[int]:
        """The instances that may hold the request's first ``blocks`` blocks (1 or 2), in
        any tier, ascending: every instance whose cached prefix covers that many blocks is
        among them (ask ``cached`` for its depth); any other's is shorter."""

    def by_load(self) -> Iterator[tuple[float, int]]:
        """(load in blocks, instance) for every instance, the lowest load first (ties: by
        index); a load in blocks is ``load_blocks(load(i), block_tokens)``."""

    def load_span(self) -> tuple[float, float]:
        """The lowest and the highest load in blocks."""

    def mean_load(self) -> float:
        """The instances' loads in blocks summed in index order, over the instances."""


def indexed(probe: Probe) -> IndexedProbe | None:
    """The probe, when it offers the cluster's views; else None."""
    has = getattr(probe, "by_load", None) is not None
    return probe if has else None  # type: ignore[return-value]


class Router:
    """A routing policy. ``instances``: the cluster's; ``knobs``: ``router.knobs``;
    ``seed``: the run's (for a router that samples)."""

    name = "router"

    def __init__(self, instances: int, knobs: Mapping[str, float] | None = None,
                 seed: int = 0) -> None:
        self.instances = instances
        self.knobs = dict(knobs or {})
        self._next = 0

    def route(self, req: RouteRequest, probe: Probe) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _rotate(self) -> int:
        """The next start of a round-robin scan (ties go to it, then the ones after)."""
        i = self._next
        self._next = (i + 1) % self.instances
        return i

    def _least(self, scores: list[float]) -> int:
        """The index of the lowest score; ties: the first from the rotating start."""
        n = len(scores)
        start = self._rotate()
        best = start
        for k in range(1, n):
            i = (start + k) % n
            if scores[i] < scores[best]:
                best = i
        return best

    def _least_loaded(self, probe: IndexedProbe) -> int:
        """``_least`` of every instance's load in blocks, from the probe's load order: the
        instances tied at the lowest load only."""
        n = probe.instances
        start = self._rotate()
        best, off, lo = start, n, -1.0
        for load, i in probe.by_load():
            if off == n:
                lo = load
            elif load != lo:
                break
            o = (i - start) % n
            if o < off:
                best, off = i, o
        return best


def load_blocks(ld: Load, block_tokens: int) -> float:
    """An instance's load in blocks: queued prefill tokens / block tokens + decode blocks."""
    return ld.queued_prefill_tokens / block_tokens + ld.decode_blocks


class RoundRobin(Router):
    name = "round-robin"

    def route(self, req: RouteRequest, probe: Probe) -> int:
        return self._rotate()


class LeastLoaded(Router):
    name = "least-loaded"

    def route(self, req: RouteRequest, probe: Probe) -> int:
        view = indexed(probe)
        if view is not None:
            return self._least_loaded(view)
        return self._least([load_blocks(probe.load(i), req.block_tokens)
                            for i in range(probe.instances)])


class SessionAffinity(Router):
    name = "session-affinity"

    def __init__(self, instances: int, knobs: Mapping[str, float] | None = None,
                 seed: int = 0) -> None:
        super().__init__(instances, knobs, seed)
        self.threshold = float(self.knobs.get("threshold", 2.0))

    def route(self, req: RouteRequest, probe: Probe) -> int:
        view = indexed(probe)
        if view is not None:
            prev = req.previous
            if prev is not None:
                mean = view.mean_load()
                own = load_blocks(view.load(prev), req.block_tokens)
                if own <= self.threshold * mean or mean == 0:
                    return prev
            return self._least_loaded(view)
        loads = [load_blocks(probe.load(i), req.block_tokens) for i in range(probe.instances)]
        prev = req.previous
        if prev is not None:
            mean = sum(loads) / len(loads)
            if loads[prev] <= self.threshold * mean or mean == 0:
                return prev
        return self._least(loads)


class PrefixAware(Router):
    name = "prefix-aware"

    def __init__(self, instances: int, knobs: Mapping[str, float] | None = None,
                 seed: int = 0) -> None:
        super().__init__(instances, knobs, seed)
        k = self.knobs
        self.overlap_weight = float(k.get("overlap_weight", 1.0))
        self.weights = (float(k.get("gpu_weight", 1.0)), float(k.get("host_weight", 0.8)),
                        float(k.get("disk_weight", 0.5)))
        bt = k.get("balance_threshold")
        self.balance = None if bt is None or bt < 0 else float(bt)
        self.temperature = float(k.get("temperature", 0.0))
        self._rng = SplitMix(seed)

    def cost(self, req: RouteRequest, probe: Probe, i: int) -> float:
        """Instance ``i``'s cost for the request."""
        bt = req.block_tokens
        wg, wh, wd = self.weights
        ld = probe.load(i)
        g, h, d = probe.cached(i)
        saved = (wg * g + wh * h + wd * d) / bt          # blocks of this request saved
        prefill = ld.queued_prefill_tokens / bt + max(0.0, req.blocks - saved)
        return self.overlap_weight * prefill + ld.decode_blocks

    def costs(self, req: RouteRequest, probe: Probe) -> tuple[list[float], list[float]]:
        """(each instance's cost, each one's load in blocks)."""
        costs = [self.cost(req, probe, i) for i in range(probe.instances)]
        return costs, [load_blocks(probe.load(i), req.block_tokens) for i in range(probe.instances)]

    def _lowest(self, req: RouteRequest, probe: IndexedProbe) -> int:
        """``_least(costs)`` asking only the instances whose cost can be the lowest: those
        that may hold the request's first two blocks, then the rest by ascending load
        until a lower bound on their cost passes the lowest found (their cached prefix
        is at most one block, saving at most its tokens x the highest tier weight)."""
        n, bt = probe.instances, req.block_tokens
        start = self._rotate()
        best, off, low = start, n, math.inf
        deep = probe.holders(2)
        for i in deep:
            c, o = self.cost(req, probe, i), (i - start) % n
            if c < low or (c == low and o < off):
                best, off, low = i, o, c
        skip = set(deep)
        first = min(bt, req.input_tokens)
        most = max(0.0, *self.weights) * max(0, first) / bt        # blocks saved, at most
        floor = self.overlap_weight * max(0.0, req.blocks - most)  # prefill blocks, at least
        scale = min(self.overlap_weight, 1.0)  # ow x queued + decode >= scale x load
        for load, i in probe.by_load():
            bound = scale * load + floor
            if bound - 1e-9 * (abs(bound) + 1.0) > low:  # (a margin for rounding)
                break  # every later one has a load as high
            if i in skip:
                continue
            c, o = self.cost(req, probe, i), (i - start) % n
            if c < low or (c == low and o < off):
                best, off, low = i, o, c
        return best

    def route(self, req: RouteRequest, probe: Probe) -> int:
        view = indexed(probe)
        if view is not None and self.temperature <= 0 and self.overlap_weight > 0:
            if self.balance is not None:
                lo, hi = view.load_span()
                if hi - lo > self.balance:
                    return self._least_loaded(view)
            return self._lowest(req, view)
        costs, loads = self.costs(req, probe)
        if self.balance is not None and max(loads) - min(loads) > self.balance:
            return self._least(loads)
        if self.temperature > 0:
            mean = sum(costs) / len(costs) or 1.0
            lo = min(costs)
            ws = [math.exp(-(c - lo) / (self.temperature * mean)) for c in costs]
            x = self._rng.uniform() * sum(ws)
            for i, w in enumerate(ws):
                x -= w
                if x < 0:
                    return i
            return len(ws) - 1
        return self._least(costs)


class SplitMix:
    """A seeded generator of uniform floats in [0, 1) (SplitMix64): the router's own, the
    same sequence on every run and machine."""

    __slots__ = ("state",)
    MASK = (1 << 64) - 1

    def __init__(self, seed: int) -> None:
        self.state = seed & self.MASK

    def uniform(self) -> float:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


ROUTERS: dict[str, type[Router]] = {c.name: c for c in (RoundRobin, LeastLoaded, SessionAffinity,
                                                         PrefixAware)}
#: every built-in policy name (``session-hash``: the node's, decided by the session id)
ROUTER_NAMES = ("session-hash", *ROUTERS)
#: each built-in router's knobs and what they take (``router.knobs``)
ROUTER_KNOBS: dict[str, tuple[str, ...]] = {
    "round-robin": (), "least-loaded": (), "session-hash": (),
    "session-affinity": ("threshold",),
    "prefix-aware": ("overlap_weight", "gpu_weight", "host_weight", "disk_weight",
                     "balance_threshold", "temperature"),
}


def make_router(name: str, instances: int, knobs: Mapping[str, float] | None = None,
                seed: int = 0) -> Router:
    """The built-in router ``name`` (not ``session-hash``) for ``instances`` instances."""
    return ROUTERS[name](instances, knobs, seed)
