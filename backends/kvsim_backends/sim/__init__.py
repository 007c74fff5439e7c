"""The SimPy backend: simulated time (SimRuntime) and a fluid model of one GPU's data paths
(SimBackend: link, copy engines, SM copy kernels, NVMe, HBM; compute under interference).

What a transfer of one batch costs (all constants from the HardwareProfile):

- host <-> GPU on the **copy engine**: wait for a free engine, spend the batched call's
  host time ``per_call + pages * per_page`` (the direction's per-page cost at this page
  size; with ``copy_engine.call_threads`` set, on one of that many host threads, so calls
  of both directions take turns there as in the hw backend), then move the bytes as a fluid
  flow over the direction's bandwidth and the both-directions total; the engine is held
  throughout.
- host <-> GPU on an **SM copy kernel**: wait for ``ctas`` copy-CTA slots (a pool shared by
  all copy kernels), launch (``busy_start`` later when compute runs then: its CTAs wait
  for the compute's to retire), then move the bytes at min(fair share, ctas * per-CTA
  rate), the per-CTA rate cut to ``busy_cta_efficiency`` while compute runs; the fair share is
  over the link's resources and the SM kernel's own ceilings (``sm_h2d`` / ``sm_d2h`` /
  ``sm_both``, used by SM-kernel flows only: zero-copy tops out below the copy engines,
  most of all with both directions at once).
- disk: one op latency, then a fluid flow at the device's rate for this page size:
  ``min(bw, queue_depth * op / (latency + op / bw))`` with ``op = min(page, piece)``. With
  ``nvme.rewrite``, bytes written into disk slots written before move at that rate. With
  the disk tier's ``io_workers`` N > 0 the disk leg is instead
  pieces on N modelled workers in ``kvsim.core.datapath.diskio``'s order (``diskpool``): each
  piece one op latency, then its bytes over the device's own bandwidth (``read``,
  ``write``), shared; N replaces ``queue_depth``; while a restore runs, at most
  ``write_cap(N, io_write_share)`` write pieces are in flight, as on hw. With the disk
  tier's ``writes: buffered`` the host's page cache sits in front of the drive
  (``pagecache``: writes at memory speed up to the dirty limit, write-back on the drive,
  reads of cached pages from memory; the profile's ``page_cache``).
- GPU <-> disk: staged through host and pipelined: the disk leg's latency plus the link
  leg's start cost, then one flow over the disk and the link resources together.
- GPU -> GPU (copy-on-write): a launch, then a flow over HBM at half its bandwidth
  (every byte read and written).
- every transfer: then ``transfer.latency`` (``latency_sm_kernel`` for an SM-kernel
  batch), the backend's fixed cost beyond the data path, before it completes; it holds
  nothing (0 by default: no extra event). A caller may add to it per leg: ``link_leg_s``
  to a transfer with a GPU-link leg, ``disk_leg_s`` to one with a disk leg (0 by default).
- a refcheck is free and immediate: the tags are not bytes (``read_tags_later`` is None).
- on a profile with ``host.memory_bandwidth`` or ``pcie``: every flow above with a host leg
  also draws on the node's host DRAM, and a host <-> GPU (or staged GPU <-> disk) one on
  its rank's PCIe switch uplink, shared max-min fair by every rank of the node
  (``nodebus``).

A host-tier batch's path comes from ``kvsim.core.datapath.pathcost`` as it starts (the same
rule the hw backend applies: alone with nothing computing, ``kvsim.core.datapath.copypath``'s
time per page; else by cost, from the batches whose bytes are moving and the compute
running) unless ``copy_path`` pins one; a staged disk leg takes a direction's path alone.
``compute(d, work)`` is a fluid job stretched by copy interference, by the kind of its
step's work where the profile has ``sm.interference.gemm`` / ``.memory``
(``kvsim.core.datapath.interference``), its work ``d x compute.scale`` (the hw
stand-in's overrun; 1 by default), then ``compute.latency`` (the hw backend's own cost
per call; 0 by default: no event).
With the profile's ``sm.interference.lasting_step_penalty``, once SM copy kernels have
started ``lasting_after_batches`` batches over the host link, every later compute call
takes that much longer, after its work (the seed's lasting per-step cost of the kernel on
a coherent link; it holds nothing): ``stats()`` reports when it began.
``compute_ahead`` predicts one exactly (the fluid's own expression) while no event is due
before it ends and no SM copy kernel runs, so the engine can run ahead of the clock with
transfers in flight; ``catch_up`` then lands the clock on the very float it reached (moving
it there without an event when none is due before: ``SimRuntime.advance_to``).
"""

from .backend import SimBackend
from .runtime import SimRuntime

__all__ = ["SimBackend", "SimRuntime"]
