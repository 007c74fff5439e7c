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
from typing import Final, Hashable, Sequence, Union

BlockIds = Union[int, Sequence[int]]
"""One block's identity: a trace block id (int) or a sequence of token / sub-block ids."""

_SCOPE_PREFIX: Final = b"kvsim-scope:"
_TAG_MASK: Final = (1 << 63) - 1


def _fastest_sha256():
    """SHA-256 as the per-block hot path calls it (``sha256(data).digest()``): CPython's
    own module ``_sha256`` where the interpreter has it (up to 3.11), else hashlib's. The
    digests are the same; on a key's 40-odd bytes the built-in one costs about a quarter
    less on 3.11 (hashlib's OpenSSL constructor looks the digest up by name every call, and
    each digest() copies an EVP context). From 3.12 the built-in one (``_sha2``) is not
    faster: hashlib's is used there."""
    try:
        from _sha256 import sha256 as builtin  # noqa: PLC0415
    except ImportError:
        return hashlib.sha256
    return builtin if builtin(b"abc").digest() == hashlib.sha256(b"abc").digest() else hashlib.sha256


# bound methods of immutable codecs, hoisted for the per-block hot path
sha256: Final = _fastest_sha256()  # (public: belady's future table hashes as the core does)
_pack_i64: Final = struct.Struct("<q").pack
_unpack_u64: Final = struct.Struct("<Q").unpack_from


def scope_root(scope: Hashable) -> bytes:
    """The chain's starting key for a reuse scope (tenant, session namespace, ...)."""
    return sha256(_SCOPE_PREFIX + repr(scope).encode()).digest()


def chain_key(parent: bytes, ids: BlockIds) -> bytes:
    """Key of a block whose parent key is ``parent`` (a scope root for the first block):
    SHA-256 of the parent key and the block's ids as little-endian int64s (one id:
    ``ids.to_bytes(8, "little", signed=True)``, packed the faster way)."""
    return sha256(parent + (_pack_i64(ids) if isinstance(ids, int)
                             else array("q", ids).tobytes())).digest()


def tag_of(key: bytes) -> int:
    """Content tag of the page holding the block ``key`` (never 0: 0 means 'no content')."""
    return (_unpack_u64(key)[0] & _TAG_MASK) or 1  # the first 8 bytes, little-endian
