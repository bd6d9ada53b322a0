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
    unsigned int esize, width, first_tile, vector16;
};
struct PatchEntry {
    unsigned long long dst, idx, values, save, count, elements, state;
    unsigned int esize, width, first_tile, when;
};
struct ApplyState {
    unsigned long long bad, verdict, got, base_hash, result_hash, pieces, n_pieces, arrived;
};
struct ApplySlot {
    ApplyState state;
    PatchEntry apply, restore;
    HashEntry hash;
};
#define GO 0ull              // Verdict kGo
#define MALFORMED 1ull       // kMalformed
#define BASE_DIFFERS 2ull    // kBaseDiffers
#define RESULT_DIFFERS 3ull  // kResultDiffers

#define PIECE_BYTES 65536ull   // kHashPieceBytes
#define HASH_BLOCK 256u        // kHashBlock: 8 warps, a piece each
#define DIFF_TILE 8192ull      // kDiffTileElems
#define DIFF_BLOCK 256u        // kDiffBlock: 8 warps of 1024 elements
#define WARP_ELEMS 1024ull     // DIFF_TILE / (DIFF_BLOCK / 32): 32 a lane
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

// ---- XXH3-64 of one buffer by a whole warp (xxh3.h, "the lane-parallel form") ----------------
__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    return v + __shfl_xor_sync(0xffffffffu, v, 16);
}
// Every lane of the warp calls it with the same arguments; every lane gets the hash. `shared`:
// the bytes were written by other blocks of this launch, so they are read through L2 (ld.cg),
// not the read-only path.
__device__ unsigned long long warp_hash(const unsigned char *in, unsigned long long len, bool shared) {
    using namespace wsync_xxh3;
    const unsigned t = threadIdx.x & 31, g = t >> 3, i = t & 7;
    if (len <= 240) return hash64_short(in, len);  // a tensor's last piece; every lane alike
    u64 key[4];
#pragma unroll
    for (unsigned r = 0; r < 4; ++r) key[r] = key64(32 * r + 8 * g + 8 * i);
    const u64 skey = key64(128 + 8 * i);
    u64 acc = acc_init(i);
    const u64 blocks = (len - 1) / 1024;
    const bool whole_words = (reinterpret_cast<unsigned long long>(in) & 7) == 0;
    for (u64 b = 0; b < blocks; ++b) {
        const unsigned char *at = in + b * 1024 + 8 * t;
        u64 v[4];
        if (whole_words) {
#pragma unroll
            for (unsigned r = 0; r < 4; ++r) {
                const u64 *w = reinterpret_cast<const u64 *>(at + 256 * r);
                v[r] = shared ? __ldcg(w) : __ldg(w);
            }
        } else {
#pragma unroll
            for (unsigned r = 0; r < 4; ++r) v[r] = rd64(at + 256 * r);
        }
        u64 prod = 0, word = 0;
#pragma unroll
        for (unsigned r = 0; r < 4; ++r) lane_add(&prod, &word, v[r], key[r]);
        prod = warp_sum(prod);
        word = warp_sum(word);
        acc = scramble_lane(acc + prod + __shfl_xor_sync(0xffffffffu, word, 1), skey);
    }
    const unsigned stripes = unsigned(((len - 1) - 1024 * blocks) / 64);
    u64 prod = 0, word = 0;
#pragma unroll
    for (unsigned r = 0; r < 4; ++r)
        if (4 * r + g < stripes) lane_add(&prod, &word, rd64(in + blocks * 1024 + 256 * r + 8 * t), key[r]);
    if (g == 0) lane_add(&prod, &word, rd64(in + len - 64 + 8 * i), key64(121 + 8 * i));
    prod = warp_sum(prod);
    word = warp_sum(word);
    acc += prod + __shfl_xor_sync(0xffffffffu, word, 1);
    u64 accs[8];
#pragma unroll
    for (unsigned k = 0; k < 8; ++k) accs[k] = __shfl_sync(0xffffffffu, acc, k);
    return merge_accs(accs, len);
}

// Piece p of entry e into its slot (a whole warp).
__device__ __forceinline__ void hash_piece(const HashEntry &e, unsigned long long p) {
    const unsigned long long begin = p * PIECE_BYTES;
    const unsigned long long n = e.bytes - begin < PIECE_BYTES ? e.bytes - begin : PIECE_BYTES;
    const unsigned long long h = warp_hash(reinterpret_cast<const unsigned char *>(e.src) + begin, n, false);
    if ((threadIdx.x & 31) == 0) reinterpret_cast<unsigned long long *>(e.out)[p] = h;
}

// ---- tree-hash pieces: one warp a piece ----------------------------------------------------
extern "C" __global__ void wsync_piece_hash(const HashEntry *entries, unsigned count, unsigned pieces) {
    const unsigned warps = HASH_BLOCK / 32;
    for (unsigned p = blockIdx.x * warps + (threadIdx.x >> 5); p < pieces; p += gridDim.x * warps) {
        const HashEntry &e = find_entry(entries, count, p, &HashEntry::first_piece);
        if (e.state && reinterpret_cast<const volatile ApplyState *>(e.state)->verdict != GO) continue;
        hash_piece(e, p - e.first_piece);
    }
}

// ---- compare: 1024 elements a warp, 32 a lane, in 16-byte vectors -------------------------
// Warp w of a tile takes elements [1024w, 1024w + 1024) of it in 2 * esize rounds: in round r
// lane l compares the V = 16 / esize elements at 32Vr + Vl, with one 16-byte load from each
// side when the entry is vector16 (now and base 16-byte aligned) and all V are inside the
// tensor, else element by element. Bit rV + e of the lane's mask: element 32Vr + Vl + e
// differs. So a round reads 512 contiguous bytes of each side, and the masks in (round, lane,
// bit) order are the elements in index order.
template <unsigned ES>
__device__ __forceinline__ unsigned warp_mask(const DiffEntry &e, unsigned long long first) {
    constexpr unsigned V = 16 / ES, R = 2 * ES;
    const unsigned lane = threadIdx.x & 31;
    const unsigned char *now = reinterpret_cast<const unsigned char *>(e.now);
    const unsigned char *base = reinterpret_cast<const unsigned char *>(e.base);
    unsigned mask = 0;
#pragma unroll
    for (unsigned r = 0; r < R; ++r) {
        const unsigned long long at = first + 32ull * V * r + V * lane;
        unsigned bits = 0;
        if (e.vector16 && at + V <= e.elements) {
            const uint4 a = __ldg(reinterpret_cast<const uint4 *>(now + at * ES));
            const uint4 b = __ldg(reinterpret_cast<const uint4 *>(base + at * ES));
            const unsigned long long x0 = ((unsigned long long)(a.y ^ b.y) << 32) | (a.x ^ b.x);
            const unsigned long long x1 = ((unsigned long long)(a.w ^ b.w) << 32) | (a.z ^ b.z);
#pragma unroll
            for (unsigned k = 0; k < V; ++k) {
                const unsigned long long x = k * ES < 8 ? x0 : x1;
                const unsigned shift = (k * ES * 8) & 63;
                const unsigned long long m = ES == 8 ? ~0ull : ((1ull << (8 * ES)) - 1);
                bits |= unsigned(((x >> shift) & m) != 0) << k;
            }
        } else {
            for (unsigned k = 0; k < V && at + k < e.elements; ++k) {
                const unsigned long long o = (at + k) * ES;
                bool d;
                if (ES == 1) d = now[o] != base[o];
                else if (ES == 2) d = *reinterpret_cast<const unsigned short *>(now + o) != *reinterpret_cast<const unsigned short *>(base + o);
                else if (ES == 4) d = *reinterpret_cast<const unsigned *>(now + o) != *reinterpret_cast<const unsigned *>(base + o);
                else d = *reinterpret_cast<const unsigned long long *>(now + o) != *reinterpret_cast<const unsigned long long *>(base + o);
                bits |= unsigned(d) << k;
            }
        }
        mask |= bits << (r * V);
    }
    return mask;
}
// This warp's first element of the tile (may be past the entry's end: then its mask is 0).
__device__ __forceinline__ unsigned long long warp_first(const DiffEntry &e, unsigned tile) {
    return (unsigned long long)(tile - e.first_tile) * DIFF_TILE + (threadIdx.x >> 5) * WARP_ELEMS;
}
__device__ __forceinline__ unsigned diff_mask(const DiffEntry &e, unsigned tile) {
    const unsigned long long first = warp_first(e, tile);
    if (first >= e.elements) return 0;
    switch (e.esize) {
    case 1: return warp_mask<1>(e, first);
    case 2: return warp_mask<2>(e, first);
    case 4: return warp_mask<4>(e, first);
    default: return warp_mask<8>(e, first);
    }
}

extern "C" __global__ void wsync_delta_count(const DiffEntry *entries, unsigned count, unsigned tiles) {
    __shared__ unsigned warp_sums[DIFF_BLOCK / 32];
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const DiffEntry &e = find_entry(entries, count, tile, &DiffEntry::first_tile);
        unsigned c = __popc(diff_mask(e, tile));
        for (int o = 16; o > 0; o /= 2) c += __shfl_down_sync(0xffffffffu, c, o);
        if (lane == 0) warp_sums[warp] = c;
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned total = 0;
            for (unsigned w = 0; w < DIFF_BLOCK / 32; ++w) total += warp_sums[w];
            reinterpret_cast<unsigned *>(e.counts)[tile - e.first_tile] = total;
        }
        __syncthreads();
    }
}

// The changed elements of this lane's round-r bits at patch position pos onwards.
template <unsigned ES>
__device__ __forceinline__ void put_round(const DiffEntry &e, unsigned long long at, unsigned bits,
                                          unsigned long long pos, unsigned char *idx, unsigned char *val) {
    const unsigned char *now = reinterpret_cast<const unsigned char *>(e.now);
    while (bits) {
        const unsigned k = __ffs(bits) - 1;
        bits &= bits - 1;
        const unsigned long long i = at + k;
        if (e.width == 4) reinterpret_cast<unsigned *>(idx)[pos] = unsigned(i);
        else reinterpret_cast<unsigned long long *>(idx)[pos] = i;
        if (ES == 1) val[pos] = now[i];
        else if (ES == 2) reinterpret_cast<unsigned short *>(val)[pos] = reinterpret_cast<const unsigned short *>(now)[i];
        else if (ES == 4) reinterpret_cast<unsigned *>(val)[pos] = reinterpret_cast<const unsigned *>(now)[i];
        else reinterpret_cast<unsigned long long *>(val)[pos] = reinterpret_cast<const unsigned long long *>(now)[i];
        ++pos;
    }
}
// Writes the warp's changes, round by round: a round's lanes are placed by a warp-wide prefix
// sum of their counts, after the rounds before and the warps before (`pos`).
template <unsigned ES>
__device__ __forceinline__ void put_warp(const DiffEntry &e, unsigned long long first, unsigned mask,
                                         unsigned long long pos, unsigned char *idx, unsigned char *val) {
    constexpr unsigned V = 16 / ES, R = 2 * ES;
    const unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (unsigned r = 0; r < R; ++r) {
        const unsigned bits = (mask >> (r * V)) & (V == 32 ? ~0u : ((1u << V) - 1));
        const unsigned c = __popc(bits);
        unsigned inc = c;
        for (int o = 1; o < 32; o *= 2) {
            const unsigned v = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= unsigned(o)) inc += v;
        }
        if (bits) put_round<ES>(e, first + 32ull * V * r + V * lane, bits, pos + inc - c, idx, val);
        pos += __shfl_sync(0xffffffffu, inc, 31);
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
        const unsigned mask = diff_mask(e, tile);
        unsigned c = __popc(mask);
        for (int o = 16; o > 0; o /= 2) c += __shfl_down_sync(0xffffffffu, c, o);
        if (lane == 0) warp_sums[warp] = c;
        __syncthreads();
        unsigned long long pos = reinterpret_cast<const unsigned long long *>(e.offsets)[tile - e.first_tile];
        for (unsigned w = 0; w < warp; ++w) pos += warp_sums[w];
        const unsigned long long first = warp_first(e, tile);
        if (__any_sync(0xffffffffu, mask != 0)) {
            switch (e.esize) {
            case 1: put_warp<1>(e, first, mask, pos, idx, val); break;
            case 2: put_warp<2>(e, first, mask, pos, idx, val); break;
            case 4: put_warp<4>(e, first, mask, pos, idx, val); break;
            default: put_warp<8>(e, first, mask, pos, idx, val); break;
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

// One tile of the check: the header (by the entry's first tile) and the tile's indices.
__device__ void check_tile(const PatchEntry &e, unsigned long long t) {
    ApplyState *st = reinterpret_cast<ApplyState *>(e.state);
    if (t == 0 && threadIdx.x == 0) {
        // The header (delta.hpp): magic "WDP1", plain coding, width; esize; count; elements.
        const unsigned long long *h = reinterpret_cast<const unsigned long long *>(e.idx - 32);
        if (h[0] != (0x31504457ull | ((unsigned long long)e.width << 40)) || h[1] != e.esize ||
            h[2] != e.count || h[3] != e.elements)
            st->verdict = MALFORMED;
    }
    const unsigned long long begin = t * PATCH_TILE;
    const unsigned long long end = e.count - begin < PATCH_TILE ? e.count : begin + PATCH_TILE;
    for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned long long j = index_at(e, i);
        if (j >= e.elements || (i > 0 && j <= index_at(e, i - 1))) {
            atomicMin(&st->bad, i);
            st->verdict = MALFORMED;
        }
    }
}

template <typename T>
__device__ __forceinline__ void scatter_t(const PatchEntry &e, unsigned long long begin, unsigned long long end) {
    T *dst = reinterpret_cast<T *>(e.dst);
    const T *values = reinterpret_cast<const T *>(e.values);
    T *save = reinterpret_cast<T *>(e.save);
    for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned long long j = index_at(e, i);
        if (j >= e.elements) continue;
        if (save) save[i] = dst[j];
        dst[j] = values[i];
    }
}

// Changes [begin, end) of the entry (any block size).
__device__ __forceinline__ void scatter_range(const PatchEntry &e, unsigned long long begin, unsigned long long end) {
    switch (e.esize) {
    case 1: scatter_t<unsigned char>(e, begin, end); break;
    case 2: scatter_t<unsigned short>(e, begin, end); break;
    case 4: scatter_t<unsigned int>(e, begin, end); break;
    default: scatter_t<unsigned long long>(e, begin, end); break;
    }
}

extern "C" __global__ void wsync_patch_scatter(const PatchEntry *entries, unsigned count, unsigned tiles) {
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const PatchEntry &e = find_entry(entries, count, tile, &PatchEntry::first_tile);
        if (e.state && reinterpret_cast<const volatile ApplyState *>(e.state)->verdict != e.when) continue;
        const unsigned long long begin = (unsigned long long)(tile - e.first_tile) * PATCH_TILE;
        const unsigned long long end = e.count - begin < PATCH_TILE ? e.count : begin + PATCH_TILE;
        scatter_range(e, begin, end);
    }
}

// ---- the verified apply: begin (check + base hash + verdict), scatter, end ------------------
// The block that finishes a launch last (the CUDA programming guide's "memory fence functions"
// example: a fence, then one counter per launch) finds every other block's pieces and flags in
// memory, and warp 0 of it takes the verdict: XXH3 of the pieces' hashes by the whole warp
// (warp_hash), compared with the patch's hash. It resets the counter for the next launch.
__device__ bool last_block(ApplyState *st) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&st->arrived, 1ull) == gridDim.x - 1;
    __syncthreads();
    if (!last) return false;
    __threadfence();
    if (threadIdx.x == 0) st->arrived = 0;
    return true;
}
__device__ void verdict(ApplyState *st, unsigned stage) {
    if (threadIdx.x >= 32) return;
    const volatile ApplyState *v = st;
    if (v->verdict != GO) return;
    const unsigned long long h =
        warp_hash(reinterpret_cast<const unsigned char *>(v->pieces), v->n_pieces * 8, true);
    if (threadIdx.x == 0 && h != (stage == 0 ? v->base_hash : v->result_hash)) {
        st->got = h;
        st->verdict = stage == 0 ? BASE_DIFFERS : RESULT_DIFFERS;
    }
}
// The pieces of group `group` (one a warp) of the slot's destination.
__device__ __forceinline__ void hash_group(const ApplySlot *s, unsigned long long group) {
    const unsigned long long p = group * (HASH_BLOCK / 32) + (threadIdx.x >> 5);
    if (p < s->state.n_pieces) hash_piece(s->hash, p);
}

// Tiles [0, checks) check the patch, the rest hash the destination's pieces, 8 a tile; the last
// block then takes verdict 0 (base).
extern "C" __global__ void wsync_apply_begin(const ApplySlot *slot, unsigned count, unsigned tiles) {
    ApplySlot *s = const_cast<ApplySlot *>(slot);
    const unsigned checks = s->apply.count ? unsigned((s->apply.count + PATCH_TILE - 1) / PATCH_TILE) : 1;
    for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
        if (t < checks) check_tile(s->apply, t);
        else hash_group(s, t - checks);
    }
    if (last_block(&s->state)) verdict(&s->state, 0);
}

// While the verdict is still go: hash the result's pieces, 8 a tile; the last block takes
// verdict 1 (result) and, when the result differs, scatters the saved values back.
extern "C" __global__ void wsync_apply_end(const ApplySlot *slot, unsigned count, unsigned tiles) {
    ApplySlot *s = const_cast<ApplySlot *>(slot);
    if (reinterpret_cast<const volatile ApplyState *>(&s->state)->verdict == GO)
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) hash_group(s, t);
    if (!last_block(&s->state)) return;
    verdict(&s->state, 1);
    __syncthreads();
    if (reinterpret_cast<const volatile ApplyState *>(&s->state)->verdict == RESULT_DIFFERS)
        scatter_range(s->restore, 0, s->restore.count);
}
