"""Page content for the refcheck: a deterministic byte pattern from a page's 64-bit tag.

A page is ``page_bytes // 8`` little-endian uint64 words: word 0 is the tag itself, word i
(i >= 1) is ``splitmix64(tag ^ i)``. ``verify`` recovers a page's tag from word 0 and
accepts it only if every other word matches, so a page in the wrong slot reads as the
other page's tag, and a torn or partly written page (two tags mixed, garbage, zeros)
reads as ``NO_TAG`` (0: "no content"; kvsim's tags are never 0). With the refcheck off
only word 0 is written and read back, unverified.

The same function is written three times: numpy (host, disk and CPU-mode device memory),
and CUDA C (``CUDA_SOURCE``, compiled by the GPU module); the tests pin them together.
"""

from __future__ import annotations

import numpy as np

NO_TAG = np.uint64(0)
_C1 = np.uint64(0x9E3779B97F4A7C15)
_C2 = np.uint64(0xBF58476D1CE4E5B9)
_C3 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
# pages checked per numpy chunk: bounds the temporary (rows x words) arrays
_CHUNK_WORDS = 1 << 22


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64) + _C1  # a new array: the rest works in place
    t = z >> _S30
    z ^= t
    z *= _C2
    np.right_shift(z, _S27, out=t)
    z ^= t
    z *= _C3
    np.right_shift(z, _S31, out=t)
    z ^= t
    return z


def patterns(tags: np.ndarray, words: int) -> np.ndarray:
    """(len(tags), words) uint64: the content of pages holding ``tags``."""
    tags = np.asarray(tags, dtype=np.uint64).reshape(-1, 1)
    idx = np.arange(words, dtype=np.uint64).reshape(1, -1)
    out = splitmix64(tags ^ idx)
    out[:, 0] = tags[:, 0]
    return out


def write_pages(view: np.ndarray, slots: np.ndarray, tags: np.ndarray, full: bool = True) -> None:
    """Write tag patterns into rows ``slots`` of ``view`` ((n_slots, page_bytes) uint8)."""
    slots = np.asarray(slots, dtype=np.int64)
    tags = np.asarray(tags, dtype=np.uint64)
    words = view.shape[1] // 8
    w = view.view(np.uint64)
    if not full:
        w[slots, 0] = tags
        return
    step = max(1, _CHUNK_WORDS // words)
    for i in range(0, len(slots), step):
        w[slots[i:i + step]] = patterns(tags[i:i + step], words)


# words per verification tile: a page bigger than this is checked in several tiles, so
# even a one-page batch spreads over the threads of a pool
_TILE_WORDS = 1 << 16


def verify_rows(rows: np.ndarray, full: bool = True, pool=None) -> np.ndarray:
    """Tags of pages given as rows ((n, page_bytes) uint8): word 0 if the whole page
    matches its pattern, else NO_TAG. Without ``full``, word 0 unverified. ``pool`` (an
    executor) checks tiles of the pages in parallel (numpy releases the GIL)."""
    w = np.ascontiguousarray(rows).view(np.uint64)
    return _verify(lambda i0, i1, a, b: w[i0:i1, a:b], w[:, 0].copy(), w.shape[1], full, pool)


def verify_pages(view: np.ndarray, slots: np.ndarray, full: bool = True, pool=None) -> np.ndarray:
    """``verify_rows`` over rows ``slots`` of ``view`` ((n_slots, page_bytes) uint8), a
    tile at a time."""
    slots = np.asarray(slots, dtype=np.int64)
    w = view.view(np.uint64)
    return _verify(lambda i0, i1, a, b: w[slots[i0:i1], a:b], w[slots, 0], w.shape[1], full, pool)


def _verify(tile, cand: np.ndarray, words: int, full: bool, pool) -> np.ndarray:
    """Set ``cand[i]`` (word 0 of page i) to NO_TAG where page i differs from its pattern;
    ``tile(i0, i1, a, b)`` gives words a..b of pages i0..i1 as a (i1-i0, b-a) array."""
    n = len(cand)
    if not full or n == 0:
        return cand
    if words >= _TILE_WORDS:  # one page a tile row, split by words
        spans = [(i, i + 1, a, min(words, a + _TILE_WORDS))
                 for i in range(n) for a in range(0, words, _TILE_WORDS)]
    else:  # whole pages, several a tile
        step = _TILE_WORDS // words
        spans = [(i, min(n, i + step), 0, words) for i in range(0, n, step)]

    def check(span):
        i0, i1, a, b = span
        exp = splitmix64(cand[i0:i1].reshape(-1, 1) ^ np.arange(a, b, dtype=np.uint64).reshape(1, -1))
        if a == 0:
            exp[:, 0] = cand[i0:i1]
        return (tile(i0, i1, a, b) == exp).all(axis=1)

    results = pool.map(check, spans) if pool is not None and len(spans) > 1 else map(check, spans)
    good = np.ones(n, dtype=bool)
    for (i0, i1, _, _), g in zip(spans, results):
        good[i0:i1] &= g
    cand[~good] = NO_TAG
    return cand


CUDA_SOURCE = r"""
typedef unsigned long long u64;

__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// a CTA a part of ``span`` words of a page (grid-stride over page x part): word 0 = tag,
// word i = splitmix64(tag ^ i). One CTA a whole 2 MiB page took ~140 us of GPU time for any
// number of pages up to 64, on the compute stream before the next step, and every
// GPU -> host copy waited for it.
extern "C" __global__ void kv_fill(u64* base, const long long* slots, const u64* tags,
                                   long long pages, long long words, int full, long long span) {
    const long long parts = (words + span - 1) / span;
    for (long long w = blockIdx.x; w < pages * parts; w += gridDim.x) {
        const long long p = w / parts, a = (w % parts) * span;
        u64* page = base + slots[p] * words;
        const u64 tag = tags[p];
        if (!full) { if (a == 0 && threadIdx.x == 0) page[0] = tag; continue; }
        const long long b = a + span < words ? a + span : words;
        for (long long i = a + threadIdx.x; i < b; i += blockDim.x)
            page[i] = i == 0 ? tag : splitmix64(tag ^ (u64)i);
    }
}

// out[p] = word 0 of page p (written by the CTA of its first part); bad[p] = 1 when a word
// of the page does not match its pattern. A page is checked in parts of ``span`` words, a
// CTA a part (grid-stride over page x part), with no early exit so that each thread keeps
// several independent loads in flight: one CTA a 2 MiB page read host memory through its
// mapped address at a few GB/s, slower than the copy it checks.
extern "C" __global__ void kv_check(const u64* base, const long long* slots, u64* out, int* bad,
                                    long long pages, long long words, int full, long long span) {
    __shared__ u64 tag;
    const long long parts = (words + span - 1) / span;
    for (long long w = blockIdx.x; w < pages * parts; w += gridDim.x) {
        const long long p = w / parts, a = (w % parts) * span;
        const u64* page = base + slots[p] * words;
        if (threadIdx.x == 0) {
            tag = page[0];
            if (a == 0) out[p] = tag;
        }
        __syncthreads();
        if (full) {
            const u64 t = tag;
            const long long b = a + span < words ? a + span : words;
            int wrong = 0;
            #pragma unroll 8
            for (long long i = (a ? a : 1) + threadIdx.x; i < b; i += blockDim.x)
                wrong |= page[i] != splitmix64(t ^ (u64)i);
            if (wrong) bad[p] = 1;
        }
        __syncthreads();  // before thread 0 reads the next part's tag
    }
}
"""
