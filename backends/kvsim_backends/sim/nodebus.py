"""The node's shared host side in the sim: its DRAM bandwidth and its PCIe switches.

A profile with ``host.memory_bandwidth`` or ``pcie`` gives each node one ``NodeBus``
(``Runtime.shared``) with these resources: ``host_mem``, the DRAM bandwidth that device
transfers draw on (both directions, every GPU and the disk together), and for switch s
``up{s}_h2d`` / ``up{s}_d2h``, its uplink to the host each way (full duplex; GPU g is
behind switch ``g // pcie.gpus_per_switch``, a rank's GPUs from ``rank x tp``). What a
route adds to its flow (``node_routes``): host <-> GPU one byte of ``host_mem`` and the
rank's uplink per byte; disk <-> host one of ``host_mem``; GPU <-> disk two (the disk's
DMA and the GPU's both touch the pinned staging buffer) and the uplink; GPU <-> GPU none.

Every fluid of the node (each rank's own, and the node's shared disk fluid) joins the
bus; its flows name the bus's resources beside its own. Whenever one member's flows change
(or what caps them: compute starting or stopping under an SM copy kernel), the bus brings
the members with flows up to now, fills all their flows' rates at once, max-min fair (a
member's own resources apart from another's of the same name, the bus's shared), and each
member takes its rates (``Fluid.take_rates``: its load, its compute's slowdown, its next
wake-up). So a flow's rate is limited by the tightest resource it uses, across ranks.

Invariants: members with no flows are not visited (a change costs O(flows moving on the
node), not O(ranks)); the members are visited in the order they joined; an allocation is
a pure function of each moving member's flow signatures and whether its compute runs
(memoised like ``Fluid``'s). Without the profile's keys there is no bus and no route adds
anything: every output is as before.
"""

from __future__ import annotations

from typing import Any, Final, Hashable

from kvsim.core.spec import Level

from .fairshare import busy_cap, fair_rates, link_caps

HOST_MEM: Final = "host_mem"
_CACHE_MAX: Final = 4096


def node_routes(profile: Any, gpu: int) -> dict[tuple[Level, Level], tuple[str, ...]]:
    """What each (source, destination) route of a rank whose first GPU is ``gpu`` adds to
    its flow's resources on ``profile`` (empty where the profile names neither key)."""
    mem = (HOST_MEM,) if profile.host.memory_bandwidth is not None else ()
    up: dict[str, tuple[str, ...]] = {"h2d": (), "d2h": ()}
    if profile.pcie is not None:
        s = gpu // profile.pcie.gpus_per_switch
        up = {d: (f"up{s}_{d}",) for d in up}
    return {(Level.HOST, Level.GPU): mem + up["h2d"], (Level.GPU, Level.HOST): mem + up["d2h"],
            (Level.DISK, Level.GPU): mem + mem + up["h2d"],
            (Level.GPU, Level.DISK): mem + mem + up["d2h"],
            (Level.DISK, Level.HOST): mem, (Level.HOST, Level.DISK): mem,
            (Level.GPU, Level.GPU): ()}


def node_caps(profile: Any, gpus: int) -> dict[str, float]:
    """The bus's resources for a node of ``gpus`` GPUs on ``profile`` (empty: no bus)."""
    caps: dict[str, float] = {}
    if profile.host.memory_bandwidth is not None:
        caps[HOST_MEM] = profile.host.memory_bandwidth
    if profile.pcie is not None:
        for s in range(-(-gpus // profile.pcie.gpus_per_switch)):
            caps[f"up{s}_h2d"] = caps[f"up{s}_d2h"] = profile.pcie.uplink
    return caps


class NodeBus:
    """The node's shared resources and the fluids that draw on them."""

    def __init__(self, caps: dict[str, float]):
        self.cap = dict(caps)
        self.members: list[Any] = []   # the fluids that joined, in order
        self._moving: dict[int, Any] = {}  # member index -> fluid, members with flows
        self._cache: dict[tuple, tuple[tuple[float, ...], ...]] = {}

    def join(self, fluid: Any) -> None:
        """``fluid`` draws on the bus from now on (before any flow of its starts)."""
        if fluid.bus is self:
            return
        fluid.bus = self
        fluid.bus_index = len(self.members)
        self.members.append(fluid)
        for r in self.cap:
            fluid.busy_s.setdefault(r, 0.0)

    def realloc(self, changed: Any) -> None:
        """``changed``'s flows (synced to now) or their caps changed: new rates for every
        member with flows, each member's load and wake-up set from them."""
        moving = self._moving
        if changed.flows:
            moving[changed.bus_index] = changed
        else:
            moving.pop(changed.bus_index, None)
        members = [moving[i] for i in sorted(moving)]
        for m in members:
            m._sync_flows()  # (changed's already is: a no-op)
        key = tuple([(m.bus_index, m.busy_now(), *[f.sig for f in m.flows]) for m in members])
        rates = self._cache.get(key)
        if rates is None:
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            rates = self._cache[key] = self._rates(members)
        for m, r in zip(members, rates):
            m.take_rates(r)
        if not changed.flows:
            changed.take_rates(())

    def _rates(self, members: list[Any]) -> tuple[tuple[float, ...], ...]:
        cap: dict[Hashable, float] = {}
        cap.update(self.cap)
        res: list[tuple[Hashable, ...]] = []
        limits: list[float] = []
        sizes = []
        for m in members:
            i, own, sigs = m.bus_index, m.cap, m._sigs
            busy = m.busy_now()
            mine = [sigs[f.sig] for f in m.flows]
            own = link_caps(own, mine, busy=busy)  # (its link's total while both paths cross it)
            for rs, c, n, _ in mine:
                keys = tuple([r if r in self.cap else (i, r) for r in rs])
                for r in rs:
                    if r not in self.cap:
                        cap[(i, r)] = own[r]
                res.append(keys)
                limits.append(busy_cap(c, n, rs, busy))
            sizes.append(len(m.flows))
        flat = fair_rates(cap, res, limits)
        out, at = [], 0
        for n in sizes:
            out.append(tuple(flat[at:at + n]))
            at += n
        return tuple(out)
