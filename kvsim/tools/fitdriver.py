"""The profile's host-fill rates per backing and its ``driver`` section, from what
``kvsim calibrate`` measured on a GPU (``Measured.host_fills``, ``driver_call_s``):

- ``host.fill_rate`` / ``host.pinned_fill_rate`` / ``host.cumem_fill_rate``: each backing's
  bytes over its time to full;
- ``driver.register_rate``: the registered bytes over the seconds spent inside
  ``cudaHostRegister`` (the lock held throughout; faulting in takes none);
- ``driver.cumem_lock_share``: the share of the ``cumem`` fill a probe's driver call was
  blocked (the lock held for the driver's allocation and mapping);
- ``driver.call``: the median host time of an executor's call (an event recorded on a
  stream).

A backing that failed (or was not measured) leaves its terms to the base profile.
"""

from __future__ import annotations

_RATE_KEY = {"register": "fill_rate", "pinned": "pinned_fill_rate", "cumem": "cumem_fill_rate"}


def fit_driver(host_fills: dict[str, dict], call_s: float | None, d: dict, why: dict[str, str]) -> None:
    """Write the measured terms into the profile dict ``d`` (and why each, into ``why``)."""
    for backing, key in _RATE_KEY.items():
        r = host_fills.get(backing)
        if r and r.get("ok") and r.get("rate_Bps"):
            d["host"][key] = r["rate_Bps"]
            why[f"host.{key}"] = (f"measured: the hw backend's host tier, {backing} backing, "
                                  f"{r['bytes'] / 2**30:.1f} GiB to full in {r['full_s']:.2f} s")
    # a base without a driver section gets one only when both of its required terms are
    # measured here (a driver that costs nothing stays so otherwise)
    drv = dict(d.get("driver") or {})
    reg = host_fills.get("register")
    if reg and reg.get("ok") and reg.get("register_s"):
        drv["register_rate"] = reg["bytes"] / reg["register_s"]
        why["driver.register_rate"] = (f"measured: {reg['bytes'] / 2**30:.1f} GiB registered in "
                                       f"{reg['register_s']:.3f} s inside cudaHostRegister")
    cum = host_fills.get("cumem")
    if cum and cum.get("ok") and cum.get("probe_blocked_share") is not None:
        drv["cumem_lock_share"] = min(1.0, cum["probe_blocked_share"])
        why["driver.cumem_lock_share"] = ("measured: the share of a cumem fill a probe's "
                                          "cudaMemGetInfo (every 1 ms) was blocked over 1 ms")
    if call_s is not None:
        drv["call"] = call_s
        why["driver.call"] = "measured: median host time of an event recorded on a stream"
    if "register_rate" in drv and "cumem_lock_share" in drv:
        d["driver"] = drv
    else:
        for k in ("driver.register_rate", "driver.cumem_lock_share", "driver.call"):
            why.pop(k, None)
