"""The run's placement policy, from ``cache.policy.placement``, and the tiers' own
eviction policies, from ``cache.tiers[i].eviction`` (outside the core: they may import a
user's module, and ``recompute`` reads the model and the hardware profile).

``cache.policy.placement`` is a built-in name (``kvsim.core.policy.PLACEMENT_NAMES``) or
``module:Class``, a user's ``kvsim.core.policy.PlacementPolicy`` subclass, built with no
arguments. ``recompute`` drops, instead of writing to disk, pages shallower than the depth
at which recomputing one block costs the GPU as long as the disk takes to write and read
back one page (``recompute_depth``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kvsim.compute import ComputeModel
from kvsim.config import ConfigFileError
from kvsim.core.policy import (PLACEMENT_NAMES, POLICY_NAMES, EvictionPolicy, PlacementPolicy,
                               RecomputeOverDisk, make_placement, make_policy)

if TYPE_CHECKING:
    from kvsim.config import RunConfig
    from kvsim.hardware import HardwareProfile
    from kvsim.compute import ModelShape

KEY = "cache.policy.placement"
MAX_DEPTH = 1 << 31  # recomputing is cheaper at every depth a prompt can have


class PlacementError(ConfigFileError):
    """The configured placement policy cannot be used (not loadable, not a placement)."""


def build_placement(cfg: "RunConfig", shape: "ModelShape", profile: "HardwareProfile",
                    page_bytes: int) -> PlacementPolicy:
    name = cfg.cache.policy.placement
    if name == "recompute":
        model = ComputeModel(shape, profile)
        return RecomputeOverDisk(recompute_depth(model, profile, cfg.cache.tokens_per_block,
                                                 page_bytes, cfg.engine.max_batch_tokens))
    if name in PLACEMENT_NAMES:
        return make_placement(name)
    return load_user_placement(name)


def build_tier_policies(cfg: "RunConfig") -> dict[int, EvictionPolicy]:
    """Tier position -> its own eviction policy, for the tiers that name one other than
    ``cache.policy.eviction`` (a fresh instance each: a policy may keep state)."""
    from kvsim.policies import load_user_policy

    out: dict[int, EvictionPolicy] = {}
    for i, t in enumerate(cfg.cache.tiers):
        name = t.eviction
        if name is None or name == cfg.cache.policy.eviction:
            continue
        if name in POLICY_NAMES:
            out[i] = make_policy(name)
            continue
        out[i] = load_user_policy(name, key=f"cache.tiers[{i}].eviction")
    return out


def block_recompute_s(model: ComputeModel, tokens_per_block: int, depth: int,
                      step_tokens: int) -> float:
    """GPU seconds one block at ``depth`` adds to a full prefill step of ``step_tokens``
    tokens (its FLOPs: the dense layers and attention over the ``depth`` blocks before)."""
    b = tokens_per_block
    full = model.step_time(((step_tokens, 0),), ())
    return model.step_time(((step_tokens, 0), (b, depth * b)), ()) - full


def disk_page_s(profile: "HardwareProfile", page_bytes: int) -> float:
    """Disk seconds to write one page and read it back (at the profile's rates)."""
    nvme = profile.nvme
    return page_bytes / nvme.write + page_bytes / nvme.read


def recompute_depth(model: ComputeModel, profile: "HardwareProfile", tokens_per_block: int,
                    page_bytes: int, step_tokens: int) -> int:
    """The first depth at which recomputing a block costs at least the disk's write and
    read of its page: pages shallower than that are cheaper to recompute. The recompute
    cost grows linearly with the depth (attention), so two points fix it."""
    disk = disk_page_s(profile, page_bytes)
    a = block_recompute_s(model, tokens_per_block, 0, step_tokens)
    if a >= disk:
        return 0
    slope = block_recompute_s(model, tokens_per_block, 1, step_tokens) - a
    if slope <= 0:
        return MAX_DEPTH
    return min(MAX_DEPTH, math.ceil((disk - a) / slope))


def load_user_placement(path: str) -> PlacementPolicy:
    """An instance of the class ``module:Class`` names."""
    from kvsim.policies import load_user_class

    cls = load_user_class(path, KEY, PLACEMENT_NAMES, PlacementError)
    try:
        placement = cls()
    except Exception as e:  # noqa: BLE001 - a user's constructor: say which key
        raise PlacementError(f"{KEY}: {path!r} cannot be built with no arguments: {e}") from None
    if not isinstance(placement, PlacementPolicy):
        raise PlacementError(f"{KEY}: {path!r} is not a placement policy (subclass "
                             f"kvsim.core.policy.PlacementPolicy and define place())")
    return placement


def describe(cfg: "RunConfig", placement: PlacementPolicy,
             tier_policies: dict[int, EvictionPolicy]) -> dict:
    """What a run's summary says about its placement and its tiers' own policies."""
    out: dict = {"placement": cfg.cache.policy.placement}
    if isinstance(placement, RecomputeOverDisk):
        out["placement_max_depth"] = placement.max_depth
    if tier_policies:
        out["tier_eviction"] = {cfg.cache.tiers[i].level: cfg.cache.tiers[i].eviction
                                for i in sorted(tier_policies)}
    return out
