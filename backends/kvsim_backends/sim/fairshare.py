"""Max-min fair sharing of resources between flows (progressive filling): the one
allocation both a rank's fluid (``fluid.Fluid``, through ``flow_rates``) and a node's bus
(``nodebus.NodeBus``) make, and the load the flows' rates put on compute (``flows_load``).
Pure arithmetic; compiled with the sim (setup.py)."""

from __future__ import annotations

import math
from typing import Any, Final

from kvsim.core.datapath.interference import IDLE, CopyLoad

_INF: Final = math.inf


def fair_rates(cap: dict[Any, float], res: list[tuple[Any, ...]],
               limits: list[float]) -> list[float]:
    """Max-min fair rates of flows over resources ``res[i]`` (a resource named twice takes
    two bytes of it per byte of the flow), flow i at most ``limits[i]`` (0: no limit), by
    progressive filling (a fluid's flows, a node bus's flows of all its ranks)."""
    count: dict[Any, int] = {}
    for rs in res:
        for r in rs:
            count[r] = count.get(r, 0) + 1
    rates = [0.0] * len(res)
    rem = {r: cap[r] for r in count}
    active = list(range(len(res)))
    while active:
        inc = _INF
        for r, n in count.items():
            if n:
                inc = min(inc, rem[r] / n)
        for i in active:
            if limits[i]:
                inc = min(inc, limits[i] - rates[i])
        for i in active:
            rates[i] += inc
        full = set()
        for r, n in count.items():
            if n:
                rem[r] -= inc * n
                if rem[r] <= 1e-12 * cap[r]:
                    full.add(r)
        still = []
        for i in active:
            if (limits[i] and rates[i] >= limits[i] * (1 - 1e-12)) or not full.isdisjoint(res[i]):
                for r in res[i]:
                    count[r] -= 1
            else:
                still.append(i)
        active = still
    return rates


def mixed(sigs) -> str | None:
    """Whether flows of signatures ``sigs`` (``(res, cap, ctas, ce)`` each) cross the link
    each way on another path: an SM copy kernel one way, a copy engine the other. Their
    total is then the profile's ``link.mixed`` (the ``mixed`` resource; ``mixed_ce_h2d``
    with the copy engine host -> GPU), not ``link.both``: on the H200 such pairs moved
    44-70 GB/s at 64 KiB-4 MiB pages where the copy engine both ways moves 92 at 1 MiB.
    The resource's name, None where they do not."""
    sm = [False, False]  # (to the GPU, from it)
    ce = [False, False]
    for res, _, n, e in sigs:
        if "link" in res:
            i = 0 if "h2d" in res else 1
            sm[i] = sm[i] or n > 0
            ce[i] = ce[i] or e
    if ce[0] and sm[1]:
        return "mixed_ce_h2d"
    return "mixed" if ce[1] and sm[0] else None


def crowded(sigs, most: float, share: float = 1.0) -> bool:
    """Whether flows ``sigs`` run the SM copy kernel both ways with more GPU -> host CTAs
    than ``most`` (measured on an idle GPU), counted at ``share`` of an idle CTA each
    (the kernel's GPU -> host busy share while compute runs: slower CTAs, more of them
    before the link leaves any waiting): those wait on the link and slow host -> GPU
    (``sm.both_crowded``)."""
    to = back = False
    for res, _, n, _ in sigs:
        if n and "sm_both" in res:
            if "sm_h2d" in res:
                to = True
            elif n * share > most:
                back = True
    return to and back


def link_caps(cap: dict, sigs, link: Any = "link", busy: tuple[float, float] | None = None) -> dict:
    """``cap`` with the link's total (key ``link``) cut to the mixed pair's where flows
    ``sigs`` cross it each way on another path (``mixed``), and the SM kernel's both-ways
    total to ``sm_both_crowded`` where its GPU -> host CTAs are more than
    ``sm_both_ctas_d2h`` (``crowded``, each at the ``busy`` share of ``busy_cap`` while
    compute runs); ``cap`` itself otherwise."""
    key = mixed(sigs)
    m = None if key is None else cap.get(key)
    if m is not None and m < cap[link]:
        cap = {**cap, link: m}
    c = cap.get("sm_both_crowded")
    if c is not None and c < cap["sm_both"] and crowded(sigs, cap["sm_both_ctas_d2h"],
                                                        1.0 if busy is None else busy[1]):
        cap = {**cap, "sm_both": c}
    return cap


def busy_cap(cap: float, ctas: int, res: tuple, busy: tuple[float, float] | None) -> float:
    """A flow's cap: an SM copy kernel's (``ctas``) is its direction's share of it while
    compute runs (``busy``: the shares (to the GPU, any other); None: none runs)."""
    if ctas and busy is not None:
        return cap * busy[0 if "h2d" in res else 1]
    return cap


def flow_rates(cap: dict[str, float], sigs: tuple,
               busy: tuple[float, float] | None) -> tuple[float, ...]:
    """Max-min fair rate of each of a fluid's flows with signatures ``sigs`` (``(res, cap,
    ctas, ce)`` each) over resources of bandwidths ``cap``, by progressive filling; an SM
    copy kernel's cap is its direction's ``busy`` share of it while compute runs
    (``busy_cap``); the link's total its pairing's while both paths cross it
    (``link_caps``)."""
    if not sigs:
        return ()
    caps = [busy_cap(c, n, res, busy) for res, c, n, _ in sigs]
    if len(sigs) == 1:  # the common case: no sharing
        rate = min(cap[r] for r in sigs[0][0])
        return (min(rate, caps[0]) if caps[0] else rate,)
    # only the resources some flow uses take part (min and the per-resource updates
    # do not depend on the order they are visited in)
    count: dict[str, int] = {}
    for res, _, _, _ in sigs:
        for r in res:
            count[r] = count.get(r, 0) + 1
    if len(count) == sum(len(sg[0]) for sg in sigs):
        # no resource shared (e.g. a disk write beside a host -> GPU copy): each flow
        # alone, as progressive filling would give it
        out = []
        for sg, c in zip(sigs, caps):
            rate = min(cap[r] for r in sg[0])
            out.append(min(rate, c) if c else rate)
        return tuple(out)
    return tuple(fair_rates(link_caps(cap, sigs, busy=busy), [sg[0] for sg in sigs], caps))


def flows_load(sigs: tuple, rates: tuple[float, ...], ce: bool, issue: float) -> CopyLoad:
    """What flows of signatures ``sigs`` (``(res, cap, ctas, ce)`` each) at ``rates`` take
    from compute: their copy CTAs by direction, ``ce`` (a copy-engine flow moves bytes),
    the bytes they move through HBM (a GPU -> GPU copy reads and writes each byte), those
    written into it, ``issue``, and the SM kernel's GPU -> host bytes a second (``IDLE``
    where all are 0)."""
    h2d = d2h = 0
    hbm = written = sm_out = 0.0
    for (res, _, c, _), r in zip(sigs, rates):
        to_gpu = "h2d" in res
        if c:
            if to_gpu:
                h2d += c
            else:
                d2h += c
                sm_out += r
        if to_gpu:
            hbm += r
            written += r
        elif "d2h" in res:
            hbm += r
        elif "hbm" in res:
            hbm += 2.0 * r
            written += r
    load = CopyLoad(h2d, d2h, ce, hbm, written, issue, sm_out)
    return IDLE if load.idle else load
