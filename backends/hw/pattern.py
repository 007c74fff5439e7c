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
# pages checked per numpy chunk: bounds the temporary (rows x words) arrays
_CHUNK_WORDS = 1 << 22


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    z = np.asarray(x, dtype=np.uint64) + _C1
    z = (z ^ (z >> np.uint64(30))) * _C2
    z = (z ^ (z >> np.uint64(27))) * _C3
    return z ^ (z >> np.uint64(31))


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


def verify_rows(rows: np.ndarray, full: bool = True) -> np.ndarray:
    """Tags of pages given as rows ((n, page_bytes) uint8): word 0 if the whole page
    matches its pattern, else NO_TAG. Without ``full``, word 0 unverified."""
    w = np.ascontiguousarray(rows).view(np.uint64)
    cand = w[:, 0].copy()
    if not full or w.shape[0] == 0:
        return cand
    words = w.shape[1]
    step = max(1, _CHUNK_WORDS // words)
    for i in range(0, w.shape[0], step):
        good = (w[i:i + step] == patterns(cand[i:i + step], words)).all(axis=1)
        cand[i:i + step][~good] = NO_TAG
    return cand


def verify_pages(view: np.ndarray, slots: np.ndarray, full: bool = True) -> np.ndarray:
    """``verify_rows`` over rows ``slots`` of ``view``, a chunk at a time."""
    slots = np.asarray(slots, dtype=np.int64)
    words = view.shape[1] // 8
    step = max(1, _CHUNK_WORDS // words)
    out = np.empty(len(slots), dtype=np.uint64)
    for i in range(0, len(slots), step):
        out[i:i + step] = verify_rows(view[slots[i:i + step]], full)
    return out


CUDA_SOURCE = r"""
typedef unsigned long long u64;

__device__ __forceinline__ u64 splitmix64(u64 z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// one CTA per page (grid-stride over pages): word 0 = tag, word i = splitmix64(tag ^ i)
extern "C" __global__ void kv_fill(u64* base, const long long* slots, const u64* tags,
                                   long long pages, long long words, int full) {
    for (long long p = blockIdx.x; p < pages; p += gridDim.x) {
        u64* page = base + slots[p] * words;
        u64 tag = tags[p];
        if (!full) { if (threadIdx.x == 0) page[0] = tag; continue; }
        for (long long i = threadIdx.x; i < words; i += blockDim.x)
            page[i] = i == 0 ? tag : splitmix64(tag ^ (u64)i);
    }
}

// out[p] = word 0 of page p when the whole page matches its pattern, else 0
extern "C" __global__ void kv_check(const u64* base, const long long* slots, u64* out,
                                    long long pages, long long words, int full) {
    __shared__ int bad;
    for (long long p = blockIdx.x; p < pages; p += gridDim.x) {
        const u64* page = base + slots[p] * words;
        u64 tag = page[0];
        if (threadIdx.x == 0) bad = 0;
        __syncthreads();
        if (full)
            for (long long i = 1 + threadIdx.x; i < words; i += blockDim.x)
                if (page[i] != splitmix64(tag ^ (u64)i)) { bad = 1; break; }
        __syncthreads();
        if (threadIdx.x == 0) out[p] = bad ? 0ull : tag;
        __syncthreads();
    }
}
"""
