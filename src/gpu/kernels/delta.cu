// The delta kernels: tree-hash pieces, compare + stream compaction (the trainer's patches), and
// the check and scatter of a patch (the receiver's verified apply, the trainer's fold). Their
// interface is src/gpu/kernels/delta_abi.hpp; the library embeds the PTX that scripts/gen-ptx.sh
// makes of this file (delta_ptx.inc) and launches it from src/gpu/diff.cpp. The fake driver
// (tests/fake_gpu) emulates each kernel from the ABI's description, so CI checks the launch
// logic; scripts/gpu-validate.sh checks these kernels' numerics on a GPU against the host's.
#include "xxh3.h"

struct HashEntry {
    unsigned long long src, bytes, out, state;
    unsigned int first_piece, reserved;
};
struct DiffEntry {
    unsigned long long now, base, elements, counts, offsets, patch, changed;
    unsigned int esize, width, first_tile, reserved;
};
struct PatchEntry {
    unsigned long long dst, idx, values, save, count, elements, state;
    unsigned int esize, width, first_tile, when;
};
struct ApplyState {
    unsigned long long bad, verdict, got, base_hash, result_hash, pieces, n_pieces, reserved;
};
#define GO 0ull              // Verdict kGo
#define MALFORMED 1ull       // kMalformed
#define BASE_DIFFERS 2ull    // kBaseDiffers
#define RESULT_DIFFERS 3ull  // kResultDiffers
#define VERDICT_BLOCK 128u   // kVerdictBlock

#define PIECE_BYTES 65536ull   // kHashPieceBytes
#define DIFF_TILE 8192ull      // kDiffTileElems
#define DIFF_BLOCK 256u        // kDiffBlock
#define PER_THREAD 32u         // DIFF_TILE / DIFF_BLOCK
#define PATCH_TILE 4096ull     // kPatchTileChanges
#define PATCH_BLOCK 256u       // kPatchBlock

// The entry that holds launch tile `tile`: the last whose first tile <= tile (an empty entry
// shares its first tile with the next and so is never chosen).
template <typename E>
__device__ __forceinline__ const E &find_entry(const E *entries, unsigned count, unsigned tile,
                                               unsigned E::*first) {
    unsigned lo = 0, hi = count;
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (entries[mid].*first <= tile) lo = mid; else hi = mid;
    }
    return entries[lo];
}

// ---- tree-hash pieces: one thread a piece --------------------------------------------------
extern "C" __global__ void wsync_piece_hash(const HashEntry *entries, unsigned count, unsigned pieces) {
    for (unsigned p = blockIdx.x * blockDim.x + threadIdx.x; p < pieces; p += gridDim.x * blockDim.x) {
        const HashEntry &e = find_entry(entries, count, p, &HashEntry::first_piece);
        if (e.state && reinterpret_cast<const volatile ApplyState *>(e.state)->verdict != GO) continue;
        const unsigned long long begin = (unsigned long long)(p - e.first_piece) * PIECE_BYTES;
        const unsigned long long n = e.bytes - begin < PIECE_BYTES ? e.bytes - begin : PIECE_BYTES;
        const unsigned char *src = reinterpret_cast<const unsigned char *>(e.src) + begin;
        reinterpret_cast<unsigned long long *>(e.out)[p - e.first_piece] = wsync_xxh3::hash64(src, n);
    }
}

// ---- compare: which of a thread's 32 elements differ ----------------------------------------
template <typename T>
__device__ __forceinline__ unsigned diff_mask_t(const DiffEntry &e, unsigned long long first, unsigned n) {
    const T *a = reinterpret_cast<const T *>(e.now) + first;
    const T *b = reinterpret_cast<const T *>(e.base) + first;
    unsigned mask = 0;
    if (n == PER_THREAD) {
#pragma unroll
        for (unsigned k = 0; k < PER_THREAD; ++k) mask |= unsigned(__ldg(a + k) != __ldg(b + k)) << k;
    } else {
        for (unsigned k = 0; k < n; ++k) mask |= unsigned(__ldg(a + k) != __ldg(b + k)) << k;
    }
    return mask;
}
// Elements [first, first + n) of the entry, n <= 32: bit k set when element first + k differs.
__device__ __forceinline__ unsigned diff_mask(const DiffEntry &e, unsigned long long first, unsigned n) {
    switch (e.esize) {
    case 1: return diff_mask_t<unsigned char>(e, first, n);
    case 2: return diff_mask_t<unsigned short>(e, first, n);
    case 4: return diff_mask_t<unsigned int>(e, first, n);
    default: return diff_mask_t<unsigned long long>(e, first, n);
    }
}
// This thread's slice of the tile: its first element and how many (0 past the entry's end).
__device__ __forceinline__ unsigned thread_slice(const DiffEntry &e, unsigned tile, unsigned long long *first) {
    *first = (unsigned long long)(tile - e.first_tile) * DIFF_TILE + threadIdx.x * PER_THREAD;
    if (*first >= e.elements) return 0;
    const unsigned long long left = e.elements - *first;
    return left < PER_THREAD ? unsigned(left) : PER_THREAD;
}

extern "C" __global__ void wsync_delta_count(const DiffEntry *entries, unsigned count, unsigned tiles) {
    __shared__ unsigned total;
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const DiffEntry &e = find_entry(entries, count, tile, &DiffEntry::first_tile);
        if (threadIdx.x == 0) total = 0;
        __syncthreads();
        unsigned long long first;
        const unsigned n = thread_slice(e, tile, &first);
        unsigned c = n ? __popc(diff_mask(e, first, n)) : 0;
        for (int o = 16; o > 0; o /= 2) c += __shfl_down_sync(0xffffffffu, c, o);
        if ((threadIdx.x & 31) == 0 && c) atomicAdd(&total, c);
        __syncthreads();
        if (threadIdx.x == 0) reinterpret_cast<unsigned *>(e.counts)[tile - e.first_tile] = total;
        __syncthreads();
    }
}

template <typename T>
__device__ __forceinline__ void put_values(const DiffEntry &e, unsigned long long first, unsigned mask,
                                           unsigned long long pos, unsigned char *idx, unsigned char *val) {
    const T *a = reinterpret_cast<const T *>(e.now) + first;
    while (mask) {
        const unsigned k = __ffs(mask) - 1;
        mask &= mask - 1;
        const unsigned long long i = first + k;
        if (e.width == 4) reinterpret_cast<unsigned *>(idx)[pos] = unsigned(i);
        else reinterpret_cast<unsigned long long *>(idx)[pos] = i;
        reinterpret_cast<T *>(val)[pos] = a[k];
        ++pos;
    }
}

extern "C" __global__ void wsync_delta_compact(const DiffEntry *entries, unsigned count, unsigned tiles) {
    __shared__ unsigned warp_sums[DIFF_BLOCK / 32];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const DiffEntry &e = find_entry(entries, count, tile, &DiffEntry::first_tile);
        unsigned char *idx = reinterpret_cast<unsigned char *>(e.patch) + 32;
        const unsigned long long idx_bytes = (e.changed * e.width + 7) & ~7ull;
        unsigned char *val = idx + idx_bytes;
        if (tile == e.first_tile && threadIdx.x == 0) {
            // The header (delta.hpp): magic "WDP1", plain coding, width, esize, count, elements.
            unsigned long long *h = reinterpret_cast<unsigned long long *>(e.patch);
            h[0] = 0x31504457ull | ((unsigned long long)e.width << 40);
            h[1] = e.esize;
            h[2] = e.changed;
            h[3] = e.elements;
            if (e.changed * e.width != idx_bytes) reinterpret_cast<unsigned *>(idx)[e.changed] = 0;
        }
        unsigned long long first;
        const unsigned n = thread_slice(e, tile, &first);
        const unsigned mask = n ? diff_mask(e, first, n) : 0;
        // Exclusive prefix of the threads' counts: within the warp, then over the warps.
        const unsigned c = __popc(mask);
        unsigned inc = c;
        for (int o = 1; o < 32; o *= 2) {
            const unsigned v = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= unsigned(o)) inc += v;
        }
        if (lane == 31) warp_sums[warp] = inc;
        __syncthreads();
        unsigned before = 0;
        for (unsigned w = 0; w < warp; ++w) before += warp_sums[w];
        if (mask) {
            const unsigned long long pos =
                reinterpret_cast<const unsigned long long *>(e.offsets)[tile - e.first_tile] + before + inc - c;
            switch (e.esize) {
            case 1: put_values<unsigned char>(e, first, mask, pos, idx, val); break;
            case 2: put_values<unsigned short>(e, first, mask, pos, idx, val); break;
            case 4: put_values<unsigned int>(e, first, mask, pos, idx, val); break;
            default: put_values<unsigned long long>(e, first, mask, pos, idx, val); break;
            }
        }
        __syncthreads();
    }
}

// ---- check and scatter ----------------------------------------------------------------------
__device__ __forceinline__ unsigned long long index_at(const PatchEntry &e, unsigned long long i) {
    return e.width == 4 ? (unsigned long long)reinterpret_cast<const unsigned *>(e.idx)[i]
                        : reinterpret_cast<const unsigned long long *>(e.idx)[i];
}

extern "C" __global__ void wsync_patch_check(const PatchEntry *entries, unsigned count, unsigned tiles) {
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const PatchEntry &e = find_entry(entries, count, tile, &PatchEntry::first_tile);
        ApplyState *st = reinterpret_cast<ApplyState *>(e.state);
        if (tile == e.first_tile && threadIdx.x == 0) {
            // The header (delta.hpp): magic "WDP1", plain coding, width; esize; count; elements.
            const unsigned long long *h = reinterpret_cast<const unsigned long long *>(e.idx - 32);
            if (h[0] != (0x31504457ull | ((unsigned long long)e.width << 40)) || h[1] != e.esize ||
                h[2] != e.count || h[3] != e.elements)
                st->verdict = MALFORMED;
        }
        const unsigned long long begin = (unsigned long long)(tile - e.first_tile) * PATCH_TILE;
        const unsigned long long end = e.count - begin < PATCH_TILE ? e.count : begin + PATCH_TILE;
        for (unsigned long long i = begin + threadIdx.x; i < end; i += PATCH_BLOCK) {
            const unsigned long long j = index_at(e, i);
            if (j >= e.elements || (i > 0 && j <= index_at(e, i - 1))) {
                atomicMin(&st->bad, i);
                st->verdict = MALFORMED;
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void scatter_t(const PatchEntry &e, unsigned long long begin, unsigned long long end) {
    T *dst = reinterpret_cast<T *>(e.dst);
    const T *values = reinterpret_cast<const T *>(e.values);
    T *save = reinterpret_cast<T *>(e.save);
    for (unsigned long long i = begin + threadIdx.x; i < end; i += PATCH_BLOCK) {
        const unsigned long long j = index_at(e, i);
        if (j >= e.elements) continue;
        if (save) save[i] = dst[j];
        dst[j] = values[i];
    }
}

extern "C" __global__ void wsync_patch_scatter(const PatchEntry *entries, unsigned count, unsigned tiles) {
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const PatchEntry &e = find_entry(entries, count, tile, &PatchEntry::first_tile);
        if (e.state && reinterpret_cast<const volatile ApplyState *>(e.state)->verdict != e.when) continue;
        const unsigned long long begin = (unsigned long long)(tile - e.first_tile) * PATCH_TILE;
        const unsigned long long end = e.count - begin < PATCH_TILE ? e.count : begin + PATCH_TILE;
        switch (e.esize) {
        case 1: scatter_t<unsigned char>(e, begin, end); break;
        case 2: scatter_t<unsigned short>(e, begin, end); break;
        case 4: scatter_t<unsigned int>(e, begin, end); break;
        default: scatter_t<unsigned long long>(e, begin, end); break;
        }
    }
}

// ---- the verdicts: one thread a state ------------------------------------------------------
// Stage 0 compares the tree hash of the destination's pieces with the patch's base, stage 1
// with its result; a state whose verdict is no longer kGo is left as it is.
extern "C" __global__ void wsync_patch_verdict(ApplyState *states, unsigned count, unsigned stage) {
    const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= count) return;
    ApplyState &s = states[k];
    if (s.verdict != GO) return;
    // The pieces' hashes are little-endian words in device memory: the bytes tree_hash combines.
    const unsigned long long h =
        wsync_xxh3::hash64(reinterpret_cast<const unsigned char *>(s.pieces), s.n_pieces * 8);
    const unsigned long long want = stage == 0 ? s.base_hash : s.result_hash;
    if (h != want) {
        s.got = h;
        s.verdict = stage == 0 ? BASE_DIFFERS : RESULT_DIFFERS;
    }
}
