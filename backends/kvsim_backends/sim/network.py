"""The remote tier's network in the sim (``cache.remote``): each node's link to the
cluster-wide store, and a rank's gets and puts over it.

One fluid for the whole cluster (``Runtime.shared("network")``: one runtime is the
cluster's clock), with two resources a node, ``net_in@N`` and ``net_out@N``, each the
link's ``bandwidth`` (full duplex; the node's ranks share it, max-min fair). A transfer
pays the link's ``latency`` once, then moves its bytes:

- get (remote -> GPU): latency, the bytes over the node's ``net_in``, then, without
  GPUDirect, over the rank's own host -> GPU link (its fluid's ``h2d`` and ``link``,
  shared with its other copies: the pages bounce through host memory; with the node's
  bus, its host DRAM and the rank's switch too: ``nodebus``); with GPUDirect
  the network leg is the whole of it (the NIC writes into GPU memory);
- put (GPU/host/disk -> remote): the bytes over the node's ``net_out``, then latency.
  The page's slot is freed when it is dropped: the put reads a copy (the source tier's
  read is not modelled).

The legs of a get follow one another (a batch is store-and-forward: an upper bound on
a pipelined copy's time). Every number comes from the settings (``NetworkSettings``).
"""

from __future__ import annotations

from typing import Any

from kvsim.settings import BackendSettings, NetworkSettings

from .fluid import Fluid


def cluster_network(env: Any, net: NetworkSettings) -> Fluid:
    """The cluster's network: each node's link, both ways."""
    caps: dict[str, float] = {}
    for n in range(net.nodes):
        caps[f"net_in@{n}"] = net.bandwidth
        caps[f"net_out@{n}"] = net.bandwidth
    return Fluid(env, caps, per_cta_slowdown=0.0, copy_engine_slowdown=0.0, busy_cta_efficiency=1.0)


class SimNetwork:
    """A rank's side of the network: its gets and puts, and their bytes."""

    def __init__(self, runtime: Any, settings: BackendSettings, link: Fluid, counts: dict,
                 host: tuple[str, ...] = ()):
        net = settings.network
        assert net is not None
        self.env = runtime.env
        self.fluid: Fluid = runtime.shared("network", lambda: cluster_network(runtime.env, net))
        self.inbound = (f"net_in@{settings.node}",)
        self.outbound = (f"net_out@{settings.node}",)
        self.latency = net.latency
        self.gpudirect = net.gpudirect
        self.link = link          # the rank's own GPU link (its fluid)
        self.pcie = ("h2d", "link") + host  # a get's bounce: the link, host DRAM, its switch
        self.counts = counts      # the backend's byte counters (h2d: a get's PCIe leg)
        self.get_bytes = 0
        self.put_bytes = 0

    def get(self, nbytes: int) -> Any:
        """Fetch ``nbytes`` from the store into GPU memory; succeeds with True."""
        return self.env.process(self._get(nbytes))

    def put(self, nbytes: int) -> Any:
        """Send ``nbytes`` to the store; succeeds with True once they are there."""
        return self.env.process(self._put(nbytes))

    def _get(self, nbytes: int):
        if self.latency > 0:
            yield self.env.timeout(self.latency)
        yield self.fluid.add_flow(nbytes, self.inbound)
        if not self.gpudirect:
            yield self.link.add_flow(nbytes, self.pcie)
            self.counts["h2d"] += nbytes
        self.get_bytes += nbytes
        return True

    def _put(self, nbytes: int):
        yield self.fluid.add_flow(nbytes, self.outbound)
        if self.latency > 0:
            yield self.env.timeout(self.latency)
        self.put_bytes += nbytes
        return True

    def stats(self) -> dict:
        return {"remote_get_bytes": self.get_bytes, "remote_put_bytes": self.put_bytes}
