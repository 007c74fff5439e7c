"""The run's policies, from ``cache.policy`` and ``cache.tiers[i].eviction``: the
eviction policy, the placement policy and the tiers' own eviction policies. Outside the
core: they may import a user's module, ``belady`` reads the whole trace, and
``recompute`` reads the model and the hardware profile.

``cache.policy.eviction`` is a built-in name (``kvsim.core.policy.POLICY_NAMES``) or
``module:Class``, a user's ``kvsim.core.policy.EvictionPolicy`` subclass, built with
``cache.policy.knobs`` as keyword arguments (none: no arguments). ``belady`` needs the
future: ``future_uses`` precomputes, in one pass over the trace, the turns that use each
block (a compact ``NextUses`` table). ``check_tiers`` refuses a policy on a tier it cannot
order (too few pages for its queues), naming the tier's quota.

``cache.policy.placement`` is a built-in name (``kvsim.core.policy.PLACEMENT_NAMES``) or
``module:Class``, a user's ``kvsim.core.policy.PlacementPolicy`` subclass, built with no
arguments. A user's policy is guarded (``kvsim.run.userpolicy``): an exception its own
methods raise during the run is a ``PolicyError`` (``PlacementError``) naming its key.
``recompute`` drops, instead of writing to disk, pages shallower than the depth at which
recomputing one block costs the GPU as long as the disk takes to write and read back one
page (``recompute_depth``).
"""

from __future__ import annotations

import importlib
import math
import struct
from array import array
from typing import TYPE_CHECKING, Sequence

import numpy as np

from kvsim.config import ConfigFileError, knob_problem
from kvsim.core.keys import scope_root, sha256
from kvsim.core.policy import (BOUND_NAMES, PLACEMENT_NAMES, POLICY_NAMES, EvictionPolicy, NextUses,
                               PlacementPolicy, RecomputeOverDisk, knobs_of, make_placement,
                               make_policy)
from kvsim.core.policy.builtin import NEVER
from kvsim.run.userpolicy import guard
from kvsim.engine.compute import ComputeModel
from kvsim.workload.blocks import cache_blocks
from kvsim.workload.model import Session, Turn, Workload

if TYPE_CHECKING:
    from kvsim.config import RunConfig
    from kvsim.config.hardware import HardwareProfile
    from kvsim.config.modelshape import ModelShape
KEY = "cache.policy.eviction"
_pack_i64 = struct.Struct("<q").pack  # as kvsim.core.keys.chain_key packs one block id


def _pack_seq(ids: Sequence[int]) -> bytes:
    """A block's ids as kvsim.core.keys.chain_key packs a sequence of them."""
    return array("q", ids).tobytes()


class PolicyError(ConfigFileError):
    """The configured policy cannot be used (unknown, not loadable, or not on this backend)."""


def build_policy(cfg: "RunConfig", workload: Workload, backend: str,
                 starts: list[float] | None = None) -> EvictionPolicy:
    name = cfg.cache.policy.eviction
    if name in BOUND_NAMES:  # an offline bound: built on the trace's future uses
        if backend != "sim":
            raise PolicyError(f"{KEY}: {name} is an offline bound that reads the trace's "
                              f"future; it runs on the sim backend only, not {backend!r}")
        return make_policy(name, future=future_uses(workload, cfg.cache.tokens_per_block,
                                                     starts))
    knobs = dict(cfg.cache.policy.knobs)
    if name in POLICY_NAMES:
        return make_policy(name, **knobs)
    return load_user_policy(name, knobs=knobs)


def check_tiers(cfg: "RunConfig", capacities: Sequence[int], policy: EvictionPolicy,
                tier_policies: dict[int, EvictionPolicy]) -> None:
    """PolicyError, naming the tier's quota, if a tier's eviction policy cannot order a
    tier of that many pages (``EvictionPolicy.check_tier``)."""
    for i, cap in enumerate(capacities):
        pol = tier_policies.get(i, policy)
        why = getattr(pol, "check_tier", lambda c: None)(cap)
        if why:
            who = cfg.cache.tiers[i].eviction or cfg.cache.policy.eviction
            raise PolicyError(f"cache.tiers[{i}].quota: {who} cannot order a tier of {cap} "
                              f"pages: {why}")


def load_user_class(path: str, key: str, names: tuple[str, ...],
                    error: type[ConfigFileError]) -> type:
    """The class ``module:Class`` names (a user's own policy), or ``error`` naming ``key``
    and what it expected (one of the built-in ``names``, or module:Class)."""
    mod_name, sep, cls_name = path.partition(":")
    if not sep or not mod_name or not cls_name:
        raise error(f"{key}: got {path!r}; expected one of {', '.join(names)} or module:Class")
    try:
        return getattr(importlib.import_module(mod_name), cls_name)
    except (ImportError, AttributeError) as e:
        raise error(f"{key}: cannot load {path!r}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a user's module may fail any way on import
        raise error(f"{key}: cannot load {path!r}: importing {mod_name} raised "
                    f"{type(e).__name__}: {e}") from None


def load_user_policy(path: str, key: str = KEY, knobs: dict | None = None) -> EvictionPolicy:
    """An instance of the class ``module:Class`` names, built with ``knobs`` (errors name
    the config ``key``, or ``cache.policy.knobs``)."""
    cls = load_user_class(path, key, POLICY_NAMES, PolicyError)
    knobs = knobs or {}
    declared = knobs_of(cls)
    for k, v in knobs.items():
        why = knob_problem(declared[k], v) if k in declared else None
        if why:
            raise PolicyError(f"cache.policy.knobs.{k}: {why}")
    try:
        policy = cls(**knobs)
    except TypeError as e:
        raise PolicyError(f"cache.policy.knobs: {path!r} does not take "
                          f"{', '.join(sorted(knobs)) or 'no arguments'}: {e}") from None
    except Exception as e:  # noqa: BLE001 - a user's constructor may fail any way
        raise PolicyError(f"{key}: {path!r} cannot be built: {type(e).__name__}: {e}") from None
    if not callable(getattr(policy, "order", None)) or getattr(policy, "fast_lru", False):
        raise PolicyError(f"{key}: {path!r} is not an eviction policy (subclass "
                          f"kvsim.core.policy.EvictionPolicy and define key())")
    return guard(policy, key, PolicyError)  # its methods' exceptions: errors naming the key


def turn_order(workload: Workload, starts: list[float] | None = None) -> list[tuple[str, Turn]]:
    """Every turn with its reuse scope, in the order the engine is expected to prepare
    them: by nominal arrival (a session's start, then its turns' think times; a turn's own
    arrival time where it has one), ties in trace order. Exact for traces of independent
    requests (Mooncake); for sessions the replay's timing may reorder turns a little."""
    out: list[tuple[float, int, str, Turn]] = []

    def walk(s: Session, t: float) -> float:
        for item in s.items:
            if isinstance(item, Turn):
                t = item.arrival_s if item.arrival_s is not None else t + item.think_s
                out.append((t, len(out), s.scope, item))
            else:
                t = walk(item, t)
        return t

    for i, s in enumerate(workload.sessions):
        first = s.items[0] if s.items else None
        if starts is not None and i < len(starts):
            t0 = starts[i]
        elif s.start_s is not None:
            t0 = s.start_s
        else:
            t0 = getattr(first, "arrival_s", None) or 0.0
        walk(s, t0)
    out.sort(key=lambda x: (x[0], x[1]))
    return [(scope, turn) for _, _, scope, turn in out]


def future_uses(workload: Workload, tokens_per_block: int,
                starts: list[float] | None = None) -> NextUses:
    """Chain key -> the turns (numbered from 1, as the manager's clock counts them) whose
    prompt holds that block, ascending, as a ``NextUses`` table. One pass over the trace's
    blocks; a block's key is hashed once per (parent key, block ids), however many turns
    share that prefix. The pass records each turn's block numbers in one flat array (a
    turn holds a block once: its keys along the chain are all distinct), then one stable
    sort groups them by block: no list per block. The same sort gives each occurrence
    its block's next turn (``NextUses``' occurrence arrays)."""
    keys: list[bytes] = []  # block number -> chain key
    # what a block's chain key hashes (its parent's key, then its ids packed as chain_key
    # packs them) -> its block number: bytes, which the garbage collector need not track
    known: dict[bytes, int] = {}
    roots: dict[str, bytes] = {}
    blocks = array("q")  # the block numbers of each turn's prompt, turn after turn
    lengths = array("q")  # ... how many each turn holds
    sha = sha256
    for scope, turn in turn_order(workload, starts):
        key = roots.get(scope)
        if key is None:
            key = roots[scope] = scope_root(scope)
        ids_list = cache_blocks(turn.hash_ids, workload.block_tokens, tokens_per_block,
                                turn.input_tokens)
        lengths.append(len(ids_list))
        if not ids_list:
            continue
        # the ids as chain_key packs them: int64s, little-endian
        pack = _pack_i64 if isinstance(ids_list[0], int) else _pack_seq
        start = len(blocks)
        step = b""
        for ids in ids_list:  # the prefix seen before
            step = key + pack(ids)
            b = known.get(step)
            if b is None:
                break
            key = keys[b]
            blocks.append(b)
        else:
            continue
        # the rest are new (their parent is): numbered in order, hashed as chain_key does
        first = len(keys)
        known[step] = first
        key = sha(step).digest()
        keys.append(key)
        for ids in ids_list[len(blocks) - start + 1:]:
            step = key + pack(ids)
            known[step] = len(keys)
            key = sha(step).digest()
            keys.append(key)
        blocks.extend(range(first, len(keys)))
    del known
    n_turns = len(lengths)
    by_block = np.frombuffer(blocks, dtype=np.int64) if blocks else np.zeros(0, np.int64)
    turn_of = np.repeat(np.arange(1, n_turns + 1, dtype=np.int64),
                        np.frombuffer(lengths, dtype=np.int64) if n_turns else 0)
    order = np.argsort(by_block, kind="stable")  # stable: each block's turns stay ascending
    counts = np.bincount(by_block, minlength=len(keys)).astype(np.int64)
    packed = ((np.cumsum(counts) - counts) << 32) | counts  # NextUses.index's start, count
    turns = turn_of[order]
    # by occurrence (turn after turn, in prompt order): the next turn using the same block
    later = np.full(len(turns), NEVER, dtype=np.int64)
    if len(turns) > 1:
        same = by_block[order[1:]] == by_block[order[:-1]]
        later[:-1] = np.where(same, turns[1:], NEVER)
    occ_next = np.empty(len(turns), dtype=np.int64)
    occ_next[order] = later
    turn_at = np.zeros(n_turns + 1, dtype=np.int64)  # turn_at[turn]: its first occurrence
    if n_turns > 1:
        turn_at[2:] = np.cumsum(np.frombuffer(lengths, dtype=np.int64))[:-1]
    return NextUses(dict(zip(keys, packed.tolist())), array("q", turns.tobytes()),
                    turn_at.tolist(), list(map(keys.__getitem__, blocks)), occ_next.tolist())


PLACEMENT_KEY = "cache.policy.placement"
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
    cls = load_user_class(path, PLACEMENT_KEY, PLACEMENT_NAMES, PlacementError)
    try:
        placement = cls()
    except Exception as e:  # noqa: BLE001 - a user's constructor: say which key
        raise PlacementError(f"{PLACEMENT_KEY}: {path!r} cannot be built with no arguments: {e}") from None
    if not isinstance(placement, PlacementPolicy):
        raise PlacementError(f"{PLACEMENT_KEY}: {path!r} is not a placement policy (subclass "
                             f"kvsim.core.policy.PlacementPolicy and define place())")
    return guard(placement, PLACEMENT_KEY, PlacementError)


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
