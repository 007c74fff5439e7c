"""A cluster of instances behind a router that decides at each request's arrival.

``cluster.nodes`` nodes of the ``node`` section's ranks make ``nodes x ranks`` instances
(instance ``i`` is rank ``i % ranks`` of node ``i // ranks``), each a single-instance
replay (its tier manager, policies, backend, engine) on one runtime, each node's shared
parts (its disk drive, its driver lock) its own. With ``router.policy: session-hash``
the sessions are split among the instances by the hash of their id before the replay
(``kvsim.run.ranks``: a decision that depends on the id alone is the same made early);
any other router decides at run time (``Cluster``):

- the cluster's own arrivals hold the sessions' starts; a dispatcher process wakes at each
  start, asks the router (``kvsim.core.routing``) and hands the turn to the chosen engine
  (``Engine.accept``), which admits it at its next step boundary;
- a session's later turns are due on the engine that served its previous one; when one
  comes due there, the router is asked again (``reroute``): sent elsewhere, the session's
  held pages on the old instance are released (as at a session's end) and its cursor
  moves with the turn;
- the router sees the instances only through ``ClusterProbe``: the request's cached
  prefix on each instance by tier (its chain keys computed once a request, looked up in
  each instance's prefix tree, within the request's reuse scope) and each engine's load
  counters; and, for a router that would rather not ask every instance, the instances
  that may hold the request's first blocks (``holders``) and the instances in order of
  load (``by_load``, ``load_span``, ``mean_load``), kept by ``kvsim.run.routeindex``
  as pages enter and leave the trees and as engines' loads move. Nothing polls an idle
  instance: an engine sleeps until a turn is handed to it or the last session ends
  (``open``); a busy engine runs ahead of the clock no further than the cluster's next
  arrival (``next_ns``), as it would before its own.

Cost: the built-in routers ask only the instances that hold the request's first two
blocks and those near the least loaded (prefix-aware: whose load could still make theirs
the lowest cost; least-loaded: the lowest, ties included), so a request costs a few probes
and O(log instances) on top; keeping the views costs a dictionary update as a prompt's
first or second block's page enters or leaves a tree, and a re-placing (O(log instances))
for each engine whose load moved since the last request. Round robin asks nothing;
prefix-aware with ``temperature`` > 0 and a user's router reading ``cached`` and ``load``
for each instance cost O(instances) a request. Nothing else grows with instances.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any, Iterator, Sequence

from kvsim.config import ConfigFileError
from kvsim.core.keys import chain_key, scope_root
from kvsim.core.routing import ROUTERS, Load, RouteRequest, Router, make_router
from kvsim.run.routeindex import DEPTH, KeyIndex, LoadOrder, bits
from kvsim.engine.arrivals import Arrivals
from kvsim.engine.metrics import NS
from kvsim.workload import Workload, cache_blocks

KEY = "router.policy"
INSTANCE_BYTES = 4 << 20   # an instance's manager, engine and backend before their slots
SLOT_BYTES = 64            # what the core and the sim backend keep a slot


def instances_of(cfg) -> int:
    return cfg.node.ranks * cfg.cluster.nodes


def routed(cfg) -> bool:
    """Whether the run's router decides at run time (any router but session-hash)."""
    return cfg.router.policy != "session-hash"


def check_cluster(cfg, backend: str, slots: int, available: int | None) -> None:
    """What a cluster cannot be: a cluster of nodes or a run-time router on the hw backend
    (one machine, one node: not built), belady under a run-time router (its future is
    each instance's, unknown before routing), more instances than memory holds (the
    estimate named). ConfigFileError naming the key."""
    n = instances_of(cfg)
    if backend != "sim" and cfg.cluster.nodes > 1:
        raise ConfigFileError(f"cluster.nodes: {cfg.cluster.nodes} nodes are simulated only; the "
                              f"{backend} backend runs one node (set cluster.nodes: 1 or --backend sim)")
    if backend != "sim" and routed(cfg):
        raise ConfigFileError(f"{KEY}: {cfg.router.policy} routes at run time, on the sim backend "
                              f"only; on {backend} use session-hash")
    if routed(cfg) and cfg.cache.policy.eviction == "belady":
        raise ConfigFileError(f"{KEY}: {cfg.router.policy} decides where requests go while the "
                              f"replay runs; cache.policy.eviction belady needs each instance's "
                              f"future before it (use router.policy session-hash)")
    need = n * (INSTANCE_BYTES + SLOT_BYTES * slots)
    if available is not None and need > available:
        raise ConfigFileError(f"cluster.nodes: {cfg.cluster.nodes} nodes x {cfg.node.ranks} ranks = "
                              f"{n} instances need about {need / 2**30:.1f} GiB ({INSTANCE_BYTES >> 20} "
                              f"MiB and {slots:,} slots of {SLOT_BYTES} bytes each); this machine "
                              f"has {available / 2**30:.1f} GiB available")


def build_router(cfg, instances: int) -> Router:
    """The configured router for ``instances`` instances (a user's ``module:Class`` with
    ``router.knobs``). ConfigFileError naming ``router.policy`` when it is not a router."""
    from kvsim.run.policies import PolicyError, load_user_class  # noqa: PLC0415

    name = cfg.router.policy
    if name in ROUTERS:
        return make_router(name, instances, cfg.router.builtin_knobs(), cfg.seed)
    cls = load_user_class(name, KEY, tuple(ROUTERS), PolicyError)
    if not (isinstance(cls, type) and issubclass(cls, Router)):
        raise PolicyError(f"{KEY}: {name} is not a router; expected a subclass of "
                          f"kvsim.core.routing.Router")
    try:
        return cls(instances, dict(cfg.router.knobs), cfg.seed)
    except Exception as e:  # noqa: BLE001 - a user's constructor may fail any way
        raise PolicyError(f"{KEY}: {name}(instances, router.knobs, seed) failed: "
                          f"{type(e).__name__}: {e}") from None


class ClusterProbe:
    """The read-only view a router has for one request (``kvsim.core.routing.Probe``)."""

    __slots__ = ("instances", "_mgrs", "_engines", "_scope", "_blocks", "_ntok", "_bt",
                 "_keys", "_levels", "_index", "_order")

    def __init__(self, mgrs: Sequence[Any], engines: Sequence[Any], levels: Sequence[int],
                 scope: Any, blocks: Sequence[Any], ntokens: int, block_tokens: int,
                 index: KeyIndex, order: LoadOrder) -> None:
        self.instances = len(engines)
        self._mgrs, self._engines, self._levels = mgrs, engines, levels
        self._scope, self._blocks, self._ntok, self._bt = scope, blocks, ntokens, block_tokens
        self._keys: list[tuple[bytes, int]] | None = None
        self._index, self._order = index, order

    def _chain(self) -> list[tuple[bytes, int]]:
        if self._keys is None:  # hashed once a request, whatever the instances
            key, out, b, left = scope_root(self._scope), [], self._bt, self._ntok
            for ids in self._blocks:
                if left <= 0:
                    break
                key = chain_key(key, ids)
                out.append((key, b if left >= b else left))
                left -= b
            self._keys = out
        return self._keys

    def cached(self, i: int) -> tuple[int, int, int]:
        by_pos = self._mgrs[i].probe_chain(self._chain())
        out = [0, 0, 0]
        for pos, toks in enumerate(by_pos):
            out[self._levels[pos]] += toks
        return out[0], out[1], out[2]

    def load(self, i: int) -> Load:
        return Load(*self._engines[i].queue_load())

    def holders(self, blocks: int) -> list[int]:
        chain = self._chain()
        if not 1 <= blocks <= DEPTH:
            raise ValueError(f"holders(blocks): blocks is 1 to {DEPTH}, got {blocks}")
        if len(chain) < blocks:
            return []
        return bits(self._index.holding([key for key, _ in chain[:blocks]]))

    def by_load(self) -> Iterator[tuple[float, int]]:
        self._order.refresh()
        return self._order.ascending()

    def load_span(self) -> tuple[float, float]:
        self._order.refresh()
        return self._order.span()

    def mean_load(self) -> float:
        self._order.refresh()
        return self._order.mean()


class Cluster:
    """The run-time router's side of a cluster: its arrivals, its dispatcher, its hooks in
    each engine (``Engine.cluster``)."""

    def __init__(self, rt: Any, engines: Sequence[Any], mgrs: Sequence[Any], router: Router,
                 block_tokens: int) -> None:
        self.rt = rt
        self.engines = list(engines)
        self.mgrs = list(mgrs)
        self.router = router
        self.block_tokens = block_tokens       # the workload's hash block
        self.B = mgrs[0].tokens_per_block
        self.levels = [int(t.level) for t in mgrs[0].tiers]  # tier position -> 0 gpu, 1 host, 2 disk
        self.arrivals = Arrivals()
        self.arrivals.on_end = self._ended
        self.index = {id(e): i for i, e in enumerate(self.engines)}
        self.where: dict[int, int] = {}        # a session (its cursor's sid) -> its last instance
        self.routed = [0] * len(self.engines)  # requests routed to each instance
        self.open_sessions = 0
        for e in self.engines:
            e.cluster = self
            e.arrivals.on_end = self._ended
        self.keys = KeyIndex()                 # who holds a prompt's first blocks
        self.keys.watch([m.tree for m in self.mgrs])
        self.loads = LoadOrder(self.engines, self.B)  # the instances by load

    def load(self, workload: Workload, starts: list[float] | None) -> None:
        for e in self.engines:
            e.block_tokens = workload.block_tokens
        self.open_sessions = len(workload.sessions)
        self.arrivals.load(workload, starts)

    # == the engines' hooks ==========================================================
    def open(self) -> bool:
        """Whether a session may still send an engine a turn."""
        return self.open_sessions > 0

    def next_ns(self) -> int | None:
        heap = self.arrivals.heap
        return heap[0][0] if heap else None

    def reroute(self, engine: Any, at: int, cur: Any, frame: Any, turn: Any) -> Any:
        return self.engines[self._route(at, cur, frame, turn)]

    def _ended(self, done_ns: int) -> None:
        self.open_sessions -= 1
        if self.arrivals.start_next(done_ns):  # (a closed loop by concurrency: the next one)
            self._dispatch_due(done_ns)
        if not self.open_sessions:
            for e in self.engines:  # the last session ended: every engine may stop
                e.wake()

    # == dispatching ===================================================================
    def dispatch(self):
        """Process: hand each session's first turn, when due, to the instance routed to."""
        rt, heap = self.rt, self.arrivals.heap
        while heap:
            target = heap[0][0]
            wait = target / NS - rt.now
            if wait > 0:
                yield rt.timeout(wait)
            self._dispatch_due(max(target, round(rt.now * NS)))

    def _dispatch_due(self, now_ns: int) -> None:
        for at, cur, frame, turn in self.arrivals.pop_due(now_ns):
            self.engines[self._route(at, cur, frame, turn)].hand(at, cur, frame, turn)

    def _route(self, at: int, cur: Any, frame: Any, turn: Any) -> int:
        blocks = cache_blocks(turn.hash_ids, self.block_tokens, self.B, turn.input_tokens)
        req = RouteRequest(session=frame.session.sid, turn=cur.turn_index,
                           input_tokens=turn.input_tokens, blocks=len(blocks),
                           block_tokens=self.B, previous=self.where.get(cur.sid))
        probe = ClusterProbe(self.mgrs, self.engines, self.levels, frame.session.scope, blocks,
                             turn.input_tokens, self.B, self.keys, self.loads)
        try:
            i = self.router.route(req, probe)
        except Exception as e:  # noqa: BLE001
            if type(self.router) in ROUTERS.values():
                raise  # (a built-in's failure is kvsim's, not the config's)
            raise ConfigFileError(f"{KEY}: {type(self.router).__name__}.route raised "
                                  f"{type(e).__name__}: {e} (routing session {req.session!r} "
                                  f"turn {req.turn})") from None
        # any integer (a numpy one, from np.argmin say) as an int; never a truth value
        ok = type(i) is int or (isinstance(i, Integral) and not isinstance(i, bool))
        if not (ok and 0 <= i < len(self.engines)):
            raise ConfigFileError(f"{KEY}: {type(self.router).__name__}.route returned {i!r}; "
                                  f"expected an instance index in [0, {len(self.engines)})")
        i = int(i)
        self.where[cur.sid] = i
        self.routed[i] += 1
        return i


__all__ = ["Cluster", "ClusterProbe", "build_router", "check_cluster", "instances_of", "routed"]
