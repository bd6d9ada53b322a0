// The pack kernel: gathers a chunk's tensors into one contiguous device bucket in one launch,
// optionally casting float32 to bfloat16 or float16 on the way. Its interface is described in
// src/gpu/kernels/pack_abi.hpp; the PTX the library embeds is generated from this file by
// scripts/gen-ptx.sh (compute_80: bfloat16 conversion instructions need sm_80 or newer).
//
// Work is cut into tiles of equal size (64 KiB of a copy, 16384 elements of a cast) over all
// entries, and blocks take tiles, so a chunk of one 117 MB tensor and eight small ones keeps
// every SM busy until the last tile (the first version gave each entry its own row of blocks and
// ran at ~555 GB/s on an H100 whose device copy does ~1500; docs/gpu-validation.md). Each thread
// keeps four 16-byte loads in flight before it stores.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

struct PackEntry {
    unsigned long long src;
    unsigned long long dst;
    unsigned long long count;  // bytes for a copy, elements for a cast
    unsigned int op;           // 0 copy, 1 f32 -> bf16, 2 f32 -> f16
    unsigned int first_tile;   // index of the entry's first tile in the launch
};

#define TILE_BYTES 65536u  // kPackTileBytes
#define TILE_ELEMS 16384u  // kPackTileElems
#define BLOCK 256u         // kPackBlock

// The entry that holds `tile`: the last whose first_tile <= tile (an empty entry shares its
// first_tile with the next one and so is never chosen).
__device__ __forceinline__ unsigned find_entry(const PackEntry *entries, unsigned count, unsigned tile) {
    unsigned lo = 0, hi = count;
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (entries[mid].first_tile <= tile) lo = mid; else hi = mid;
    }
    return lo;
}

template <typename T>
__device__ __forceinline__ void copy_words(const T *__restrict__ s, T *__restrict__ d, unsigned n) {
    unsigned i = threadIdx.x;
    for (; i + 3 * BLOCK < n; i += 4 * BLOCK) {
        const T a = __ldg(s + i), b = __ldg(s + i + BLOCK), c = __ldg(s + i + 2 * BLOCK),
                e = __ldg(s + i + 3 * BLOCK);
        d[i] = a; d[i + BLOCK] = b; d[i + 2 * BLOCK] = c; d[i + 3 * BLOCK] = e;
    }
    for (; i < n; i += BLOCK) d[i] = __ldg(s + i);
}

__device__ __forceinline__ void copy_tile(const unsigned char *s, unsigned char *d, unsigned n) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(s) | reinterpret_cast<unsigned long long>(d);
    if ((a & 15) == 0) {
        copy_words(reinterpret_cast<const uint4 *>(s), reinterpret_cast<uint4 *>(d), n / 16);
        for (unsigned i = (n & ~15u) + threadIdx.x; i < n; i += BLOCK) d[i] = s[i];
    } else if ((a & 7) == 0) {
        copy_words(reinterpret_cast<const uint2 *>(s), reinterpret_cast<uint2 *>(d), n / 8);
        for (unsigned i = (n & ~7u) + threadIdx.x; i < n; i += BLOCK) d[i] = s[i];
    } else if ((a & 3) == 0) {
        copy_words(reinterpret_cast<const unsigned *>(s), reinterpret_cast<unsigned *>(d), n / 4);
        for (unsigned i = (n & ~3u) + threadIdx.x; i < n; i += BLOCK) d[i] = s[i];
    } else {
        copy_words(s, d, n);
    }
}

template <int OP>
__device__ __forceinline__ unsigned short cast1(float f) {
    if (OP == 1) return __bfloat16_as_ushort(__float2bfloat16_rn(f));
    return __half_as_ushort(__float2half_rn(f));
}

template <int OP>
__device__ __forceinline__ void cast_tile(const float *s, unsigned short *d, unsigned n) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(s) | (reinterpret_cast<unsigned long long>(d) << 1);
    unsigned done = 0;
    if ((a & 15) == 0) {  // s 16-byte and d 8-byte aligned: four elements a load
        const float4 *s4 = reinterpret_cast<const float4 *>(s);
        uint2 *d4 = reinterpret_cast<uint2 *>(d);
        const unsigned n4 = n / 4;
        for (unsigned i = threadIdx.x; i < n4; i += BLOCK) {
            const float4 v = __ldg(s4 + i);
            uint2 o;
            o.x = cast1<OP>(v.x) | (unsigned(cast1<OP>(v.y)) << 16);
            o.y = cast1<OP>(v.z) | (unsigned(cast1<OP>(v.w)) << 16);
            d4[i] = o;
        }
        done = n4 * 4;
    }
    for (unsigned i = done + threadIdx.x; i < n; i += BLOCK) d[i] = cast1<OP>(__ldg(s + i));
}

extern "C" __global__ void __launch_bounds__(256) wsync_pack(const PackEntry *entries, unsigned int count,
                                                             unsigned int tiles) {
    for (unsigned tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        const unsigned e = find_entry(entries, count, tile);
        const PackEntry t = entries[e];
        const unsigned long long k = tile - t.first_tile;
        if (t.op == 0) {
            const unsigned long long begin = k * TILE_BYTES;
            const unsigned long long left = t.count - begin;
            const unsigned n = left < TILE_BYTES ? unsigned(left) : TILE_BYTES;
            copy_tile(reinterpret_cast<const unsigned char *>(t.src) + begin,
                      reinterpret_cast<unsigned char *>(t.dst) + begin, n);
        } else {
            const unsigned long long begin = k * TILE_ELEMS;
            const unsigned long long left = t.count - begin;
            const unsigned n = left < TILE_ELEMS ? unsigned(left) : TILE_ELEMS;
            const float *s = reinterpret_cast<const float *>(t.src) + begin;
            unsigned short *d = reinterpret_cast<unsigned short *>(t.dst) + begin;
            if (t.op == 1) cast_tile<1>(s, d, n); else cast_tile<2>(s, d, n);
        }
    }
}
