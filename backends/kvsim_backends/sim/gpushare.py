"""Ranks that share a GPU in the sim (``node.ranks_per_gpu`` > 1): the GPU's parts.

Ranks ``r`` with the same ``r // ranks_per_gpu`` are on one GPU (their first GPU
``settings.gpu_index()``): they share its fluid (the PCIe link each way and both, the SM
copy kernel's ceilings, HBM, and its compute, by its steps' kernel lengths:
``Fluid.share_compute``, ``kvsim_backends.sim.smshare``),
its copy engines, its pool of copy-CTA slots and its power state (``compute.boost``: the
GEMMs of every rank on it spend one headroom). Each part is built once a GPU by the
first of its ranks (``Runtime.shared``, under a name of the node and the GPU).

Invariants: with one rank a GPU (the default) every part is the rank's own, built as
before, so every output is unchanged.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from kvsim.core.datapath.interference import MixTable

from .fluid import Fluid
from .smshare import KernelLengths

T = TypeVar("T")


def ranks_on_gpu(settings: Any) -> int:
    """How many ranks share this backend's GPU (1: it is the rank's own)."""
    return min(settings.ranks_per_gpu, settings.ranks)


def gpu_part(runtime: Any, settings: Any, name: str, make: Callable[[], T]) -> T:
    """The rank's GPU part ``name``: ``make()``, its own, or the one its GPU's ranks share."""
    if ranks_on_gpu(settings) == 1:
        return make()
    return runtime.shared(settings.node_part(f"gpu{settings.gpu_index()}:{name}"), make)


def mixed_caps(link: Any, page_bytes: int) -> dict[str, float]:
    """The link's totals with one direction on each copy path at ``page_bytes`` (the
    fluid's ``mixed`` resources, ``fairshare.link_caps``): none where the profile has none."""
    if link.mixed is None and link.mixed_ce_h2d is None:
        return {}
    return {"mixed": link.mixed_for("d2h", page_bytes), "mixed_ce_h2d": link.mixed_for("h2d", page_bytes)}


def crowded_caps(sm: Any) -> dict[str, float]:
    """The SM kernel's both-ways total with more GPU -> host CTAs than its split's
    (``fairshare.link_caps``): none where the profile has none."""
    if sm.both_crowded is None or sm.both_ctas_d2h is None:
        return {}
    return {"sm_both_crowded": sm.both_crowded, "sm_both_ctas_d2h": float(sm.both_ctas_d2h)}


def gpu_fluid(runtime: Any, settings: Any, disk: dict[str, float], kinds: MixTable | None) -> Fluid:
    """The rank's GPU fluid: its link (``h2d``, ``d2h``, ``link`` both ways), the SM copy
    kernel's ceilings, HBM, ``disk``'s resources; shared by the ranks on its GPU, whose
    compute then shares its SMs by their steps' kernels (``Fluid.share_compute``: the
    model's projections at the profile's ``gpu.gemm_flops``, reads in kernels of
    ``engine.read_kernel``, overlapping by ``gpu.kernel_overlap``)."""
    p = settings.profile
    link, sm = p.link, p.sm

    def make() -> Fluid:
        f = Fluid(runtime.env, {"h2d": link.h2d, "d2h": link.d2h, "link": link.both,
                                "sm_h2d": p.sm_ceiling("h2d"), "sm_d2h": p.sm_ceiling("d2h"),
                                "sm_both": p.sm_ceiling("both"), "hbm": p.gpu.hbm / 2, **disk,
                                **mixed_caps(link, settings.page_bytes), **crowded_caps(sm)},
                  per_cta_slowdown=sm.interference.per_cta_slowdown,
                  copy_engine_slowdown=sm.interference.copy_engine_slowdown,
                  busy_cta_efficiency=sm.interference.busy_cta_efficiency, kinds=kinds,
                  busy_cta_efficiency_d2h=sm.interference.busy_eff()[1],
                  busy_kinds=sm.interference.kind_busy(), busy_most=sm.interference.kind_most())
        if ranks_on_gpu(settings) > 1:
            f.share_compute = KernelLengths(settings.model, settings.read_kernel_s,
                                            p.gpu.gemm_flops, p.gpu.kernel_overlap)
        return f
    return gpu_part(runtime, settings, "fluid", make)
