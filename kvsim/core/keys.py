"""Block identity: chain hashes over a reuse scope, the parent's key and the block's ids.

A block's key is SHA-256(parent_key || encoded ids); the first parent is the scope root,
SHA-256("kvsim-scope:" || scope). Different scopes therefore never share a key, and equal
keys mean equal prefixes (up to SHA-256 collisions). A page's content tag is a 63-bit
number derived from its key: both backends write it (sim: a tag, hw: a byte pattern) and
check it on every reuse, restore and migration.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from typing import Hashable, Sequence, Union

BlockIds = Union[int, Sequence[int]]
"""One block's identity: a trace block id (int) or a sequence of token / sub-block ids."""

_SCOPE_PREFIX = b"kvsim-scope:"
_TAG_MASK = (1 << 63) - 1
# bound methods of immutable codecs, hoisted for the per-block hot path
_sha256 = hashlib.sha256
_pack_i64 = struct.Struct("<q").pack
_unpack_u64 = struct.Struct("<Q").unpack_from


def scope_root(scope: Hashable) -> bytes:
    """The chain's starting key for a reuse scope (tenant, session namespace, ...)."""
    return hashlib.sha256(_SCOPE_PREFIX + repr(scope).encode()).digest()


def chain_key(parent: bytes, ids: BlockIds) -> bytes:
    """Key of a block whose parent key is ``parent`` (a scope root for the first block):
    SHA-256 of the parent key and the block's ids as little-endian int64s (one id:
    ``ids.to_bytes(8, "little", signed=True)``, packed the faster way)."""
    return _sha256(parent + (_pack_i64(ids) if isinstance(ids, int)
                             else array("q", ids).tobytes())).digest()


def tag_of(key: bytes) -> int:
    """Content tag of the page holding the block ``key`` (never 0: 0 means 'no content')."""
    return (_unpack_u64(key)[0] & _TAG_MASK) or 1  # the first 8 bytes, little-endian
