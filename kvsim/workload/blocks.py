"""Mapping trace blocks (``block_tokens`` each) onto cache blocks (``tokens_per_block``).

The trace block size and the cache's block size are independent; this module is the one
place that converts between them. Invariant: the mapping is a pure function of the id
sequence, so two requests with equal trace-id prefixes get equal cache-block prefixes
(reuse is preserved exactly when the cache block is no coarser than the trace block, and
when it is coarser only whole groups of trace blocks can match).

- equal sizes: the ids themselves;
- ``block_tokens == k * tokens_per_block``: each id ``h`` becomes ``(h, 0) .. (h, k-1)``;
- ``tokens_per_block == k * block_tokens``: groups of ``k`` consecutive ids, as tuples
  (the last group may be shorter);
- any other ratio: ValueError naming both sizes.
"""

from __future__ import annotations


def cache_blocks(hash_ids, block_tokens: int, tokens_per_block: int, input_tokens: int | None = None) -> list:
    """Cache-block keys for a request whose trace blocks are ``hash_ids``.

    With ``input_tokens`` given, the result is cut to ``ceil(input_tokens /
    tokens_per_block)`` blocks (splitting a partial last trace block yields only the
    cache blocks that hold tokens)."""
    if block_tokens < 1 or tokens_per_block < 1:
        raise ValueError(f"block sizes must be positive: trace block_tokens={block_tokens}, "
                         f"cache tokens_per_block={tokens_per_block}")
    if block_tokens == tokens_per_block:
        out = list(hash_ids)
    elif block_tokens % tokens_per_block == 0:
        k = block_tokens // tokens_per_block
        if input_tokens is not None and len(hash_ids) * k > -(-input_tokens // tokens_per_block):
            # (only the cache blocks the request fills, not its last trace block's worth:
            # that may be a block_size of 1e30 tokens)
            full, part = divmod(-(-input_tokens // tokens_per_block), k)
            rk = range(k)
            return ([(h, j) for h in hash_ids[:full] for j in rk]
                    + [(hash_ids[full], j) for j in range(part)])
        rk = range(k)
        out = [(h, j) for h in hash_ids for j in rk]
    elif tokens_per_block % block_tokens == 0:
        k = tokens_per_block // block_tokens
        ids = tuple(hash_ids)
        out = [ids[i:i + k] for i in range(0, len(ids), k)]
    else:
        raise ValueError(f"trace block_tokens={block_tokens} and cache tokens_per_block="
                         f"{tokens_per_block} are not multiples of each other")
    if input_tokens is not None:
        n = -(-input_tokens // tokens_per_block)
        if n < len(out):
            del out[n:]
    return out
