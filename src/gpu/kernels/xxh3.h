// XXH3-64 (seed 0, default secret) for the device kernels, which cannot call the xxHash library.
// It computes what XXH3_64bits() computes, for every length, with the portable (scalar) form of
// the algorithm: xxHash 0.8's specification (doc/xxhash_spec.md, "XXH3") and the constants of
// its reference implementation. The same text is compiled by nvcc into gpu/kernels/delta.cu and
// by the host compiler into tests/test_delta_codec.cpp, which checks it against the library's
// XXH3_64bits() for every length from 0 to 4160, around each 1 KiB stripe block, at 64 KiB, and
// at unaligned addresses; that is the check of its numerics that needs no GPU.
//
// Loads: an 8-byte-aligned pointer is read with one 64-bit load, any other byte by byte (a
// device load must be naturally aligned). Values are little-endian, as on every GPU and on the
// hosts libwsync supports.
#pragma once

#if defined(__CUDACC__)
#define WSYNC_XXH_FN __device__ __forceinline__
#define WSYNC_XXH_SECRET __constant__
typedef unsigned long long wsync_xxh_u64;
typedef unsigned int wsync_xxh_u32;
#else
#include <cstdint>
#include <cstring>
#define WSYNC_XXH_FN inline
#define WSYNC_XXH_SECRET static const
typedef uint64_t wsync_xxh_u64;
typedef uint32_t wsync_xxh_u32;
#endif

namespace wsync_xxh3 {

typedef wsync_xxh_u64 u64;
typedef wsync_xxh_u32 u32;

// The default secret: XXH3_kSecret, 192 bytes.
WSYNC_XXH_SECRET unsigned char kSecret[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

// kSecret as little-endian 64-bit words at every byte offset 0..184, so that each secret word
// the algorithm reads (aligned or not: 3, 7, 11, 121 ...) is one load of a constant, whose
// offset the unrolled loops know at compile time. Generated from kSecret (and checked against
// it in test_delta_codec).
WSYNC_XXH_SECRET wsync_xxh_u64 kSecretAt[185] = {
    0xbe4ba423396cfeb8ull, 0x7cbe4ba423396cfeull, 0x017cbe4ba423396cull,
    0x81017cbe4ba42339ull, 0x2c81017cbe4ba423ull, 0xf72c81017cbe4ba4ull,
    0x21f72c81017cbe4bull, 0xad21f72c81017cbeull, 0x1cad21f72c81017cull,
    0xde1cad21f72c8101ull, 0xd4de1cad21f72c81ull, 0x6dd4de1cad21f72cull,
    0xe96dd4de1cad21f7ull, 0x83e96dd4de1cad21ull, 0x9083e96dd4de1cadull,
    0x979083e96dd4de1cull, 0xdb979083e96dd4deull, 0x72db979083e96dd4ull,
    0x4072db979083e96dull, 0xa44072db979083e9ull, 0xa4a44072db979083ull,
    0xb7a4a44072db9790ull, 0xb3b7a4a44072db97ull, 0x67b3b7a4a44072dbull,
    0x1f67b3b7a4a44072ull, 0xcb1f67b3b7a4a440ull, 0x79cb1f67b3b7a4a4ull,
    0xe679cb1f67b3b7a4ull, 0x4ee679cb1f67b3b7ull, 0xcc4ee679cb1f67b3ull,
    0xc0cc4ee679cb1f67ull, 0xe5c0cc4ee679cb1full, 0x78e5c0cc4ee679cbull,
    0x8278e5c0cc4ee679ull, 0x5a8278e5c0cc4ee6ull, 0xd05a8278e5c0cc4eull,
    0x7dd05a8278e5c0ccull, 0xcc7dd05a8278e5c0ull, 0xffcc7dd05a8278e5ull,
    0x72ffcc7dd05a8278ull, 0x2172ffcc7dd05a82ull, 0xb82172ffcc7dd05aull,
    0x08b82172ffcc7dd0ull, 0x4608b82172ffcc7dull, 0x744608b82172ffccull,
    0xf7744608b82172ffull, 0x43f7744608b82172ull, 0x2443f7744608b821ull,
    0x8e2443f7744608b8ull, 0xe08e2443f7744608ull, 0x35e08e2443f77446ull,
    0x9035e08e2443f774ull, 0xe69035e08e2443f7ull, 0x81e69035e08e2443ull,
    0x3a81e69035e08e24ull, 0x263a81e69035e08eull, 0x4c263a81e69035e0ull,
    0x3c4c263a81e69035ull, 0x283c4c263a81e690ull, 0x52283c4c263a81e6ull,
    0xbb52283c4c263a81ull, 0x91bb52283c4c263aull, 0xc391bb52283c4c26ull,
    0x00c391bb52283c4cull, 0xcb00c391bb52283cull, 0x88cb00c391bb5228ull,
    0xd088cb00c391bb52ull, 0x65d088cb00c391bbull, 0x8b65d088cb00c391ull,
    0x1b8b65d088cb00c3ull, 0x531b8b65d088cb00ull, 0x2e531b8b65d088cbull,
    0xa32e531b8b65d088ull, 0x71a32e531b8b65d0ull, 0x6471a32e531b8b65ull,
    0x486471a32e531b8bull, 0x97486471a32e531bull, 0xa297486471a32e53ull,
    0x0da297486471a32eull, 0xf90da297486471a3ull, 0x4ef90da297486471ull,
    0x384ef90da2974864ull, 0x19384ef90da29748ull, 0xef19384ef90da297ull,
    0x46ef19384ef90da2ull, 0xa946ef19384ef90dull, 0xdea946ef19384ef9ull,
    0xacdea946ef19384eull, 0xd8acdea946ef1938ull, 0xa8d8acdea946ef19ull,
    0xfaa8d8acdea946efull, 0x76faa8d8acdea946ull, 0x3f76faa8d8acdea9ull,
    0xe33f76faa8d8acdeull, 0x9ce33f76faa8d8acull, 0x349ce33f76faa8d8ull,
    0x3f349ce33f76faa8ull, 0xf93f349ce33f76faull, 0xdcf93f349ce33f76ull,
    0xbbdcf93f349ce33full, 0xc7bbdcf93f349ce3ull, 0xc7c7bbdcf93f349cull,
    0x0bc7c7bbdcf93f34ull, 0x4f0bc7c7bbdcf93full, 0x1d4f0bc7c7bbdcf9ull,
    0x8a1d4f0bc7c7bbdcull, 0x518a1d4f0bc7c7bbull, 0xe0518a1d4f0bc7c7ull,
    0x4be0518a1d4f0bc7ull, 0xcd4be0518a1d4f0bull, 0xb4cd4be0518a1d4full,
    0x59b4cd4be0518a1dull, 0x3159b4cd4be0518aull, 0xc83159b4cd4be051ull,
    0x9fc83159b4cd4be0ull, 0x7e9fc83159b4cd4bull, 0xc97e9fc83159b4cdull,
    0xd9c97e9fc83159b4ull, 0x78d9c97e9fc83159ull, 0x7378d9c97e9fc831ull,
    0x647378d9c97e9fc8ull, 0xea647378d9c97e9full, 0xc5ea647378d9c97eull,
    0xacc5ea647378d9c9ull, 0x83acc5ea647378d9ull, 0x3483acc5ea647378ull,
    0xd33483acc5ea6473ull, 0xebd33483acc5ea64ull, 0xc3ebd33483acc5eaull,
    0xc5c3ebd33483acc5ull, 0x81c5c3ebd33483acull, 0xa081c5c3ebd33483ull,
    0xffa081c5c3ebd334ull, 0xfaffa081c5c3ebd3ull, 0x13faffa081c5c3ebull,
    0x6313faffa081c5c3ull, 0xeb6313faffa081c5ull, 0x17eb6313faffa081ull,
    0x0d17eb6313faffa0ull, 0xdd0d17eb6313faffull, 0x51dd0d17eb6313faull,
    0xb751dd0d17eb6313ull, 0xf0b751dd0d17eb63ull, 0xdaf0b751dd0d17ebull,
    0x49daf0b751dd0d17ull, 0xd349daf0b751dd0dull, 0x16d349daf0b751ddull,
    0x5516d349daf0b751ull, 0x265516d349daf0b7ull, 0x29265516d349daf0ull,
    0xd429265516d349daull, 0x68d429265516d349ull, 0x9e68d429265516d3ull,
    0x2b9e68d429265516ull, 0x162b9e68d4292655ull, 0xbe162b9e68d42926ull,
    0x58be162b9e68d429ull, 0x7d58be162b9e68d4ull, 0x477d58be162b9e68ull,
    0xa1477d58be162b9eull, 0xfca1477d58be162bull, 0x8ffca1477d58be16ull,
    0xf88ffca1477d58beull, 0xb8f88ffca1477d58ull, 0xd1b8f88ffca1477dull,
    0x7ad1b8f88ffca147ull, 0xd07ad1b8f88ffca1ull, 0x31d07ad1b8f88ffcull,
    0xce31d07ad1b8f88full, 0x45ce31d07ad1b8f8ull, 0xcb45ce31d07ad1b8ull,
    0x3acb45ce31d07ad1ull, 0x8f3acb45ce31d07aull, 0x958f3acb45ce31d0ull,
    0x16958f3acb45ce31ull, 0x0416958f3acb45ceull, 0x280416958f3acb45ull,
    0xaf280416958f3acbull, 0xd7af280416958f3aull, 0xfbd7af280416958full,
    0xcafbd7af28041695ull, 0xbbcafbd7af280416ull, 0x4bbbcafbd7af2804ull,
    0x404bbbcafbd7af28ull, 0x7e404bbbcafbd7afull,
};

#define WSYNC_XXH_P32_1 0x9E3779B1u
#define WSYNC_XXH_P32_2 0x85EBCA77u
#define WSYNC_XXH_P32_3 0xC2B2AE3Du
#define WSYNC_XXH_P64_1 0x9E3779B185EBCA87ull
#define WSYNC_XXH_P64_2 0xC2B2AE3D27D4EB4Full
#define WSYNC_XXH_P64_3 0x165667B19E3779F9ull
#define WSYNC_XXH_P64_4 0x85EBCA77C2B2AE63ull
#define WSYNC_XXH_P64_5 0x27D4EB2F165667C5ull

WSYNC_XXH_FN u64 rd64(const unsigned char *p) {
#if defined(__CUDACC__)
    if ((reinterpret_cast<unsigned long long>(p) & 7) == 0) return *reinterpret_cast<const u64 *>(p);
    u64 v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
#else
    u64 v;
    std::memcpy(&v, p, 8);
    return v;
#endif
}
WSYNC_XXH_FN u32 rd32(const unsigned char *p) {
    return u32(p[0]) | (u32(p[1]) << 8) | (u32(p[2]) << 16) | (u32(p[3]) << 24);
}
// The secret's 64-bit word at byte `off` (0..184).
WSYNC_XXH_FN u64 key64(unsigned off) { return kSecretAt[off]; }
WSYNC_XXH_FN u32 key32(unsigned off) { return rd32(kSecret + off); }

WSYNC_XXH_FN u64 mul128_fold64(u64 a, u64 b) {
#if defined(__CUDACC__)
    return (a * b) ^ __umul64hi(a, b);
#else
    const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
    return static_cast<u64>(p) ^ static_cast<u64>(p >> 64);
#endif
}
WSYNC_XXH_FN u64 rotl64(u64 x, int r) { return (x << r) | (x >> (64 - r)); }
WSYNC_XXH_FN u64 swap64(u64 x) {
    x = ((x & 0x00000000FFFFFFFFull) << 32) | (x >> 32);
    x = ((x & 0x0000FFFF0000FFFFull) << 16) | ((x >> 16) & 0x0000FFFF0000FFFFull);
    return ((x & 0x00FF00FF00FF00FFull) << 8) | ((x >> 8) & 0x00FF00FF00FF00FFull);
}
WSYNC_XXH_FN u64 avalanche(u64 h) {  // XXH3_avalanche
    h ^= h >> 37;
    h *= 0x165667919E3779F9ull;
    return h ^ (h >> 32);
}
WSYNC_XXH_FN u64 avalanche64(u64 h) {  // XXH64_avalanche
    h ^= h >> 33;
    h *= WSYNC_XXH_P64_2;
    h ^= h >> 29;
    h *= WSYNC_XXH_P64_3;
    return h ^ (h >> 32);
}
WSYNC_XXH_FN u64 rrmxmx(u64 h, u64 len) {
    h ^= rotl64(h, 49) ^ rotl64(h, 24);
    h *= 0x9FB21C651E98DF25ull;
    h ^= (h >> 35) + len;
    h *= 0x9FB21C651E98DF25ull;
    return h ^ (h >> 28);
}
WSYNC_XXH_FN u64 mix16(const unsigned char *in, unsigned key) {
    return mul128_fold64(rd64(in) ^ key64(key), rd64(in + 8) ^ key64(key + 8));
}

// len 0..16
WSYNC_XXH_FN u64 hash_0to16(const unsigned char *in, u64 len) {
    if (len > 8) {
        const u64 lo = rd64(in) ^ (key64(24) ^ key64(32));
        const u64 hi = rd64(in + len - 8) ^ (key64(40) ^ key64(48));
        return avalanche(len + swap64(lo) + hi + mul128_fold64(lo, hi));
    }
    if (len >= 4) {
        const u64 in64 = u64(rd32(in + len - 4)) + (u64(rd32(in)) << 32);
        return rrmxmx(in64 ^ (key64(8) ^ key64(16)), len);
    }
    if (len) {
        const u32 combined = (u32(in[0]) << 16) | (u32(in[len >> 1]) << 24) | u32(in[len - 1]) |
                             (u32(len) << 8);
        return avalanche64(u64(combined) ^ u64(key32(0) ^ key32(4)));
    }
    return avalanche64(key64(56) ^ key64(64));
}

// len 17..128
WSYNC_XXH_FN u64 hash_17to128(const unsigned char *in, u64 len) {
    u64 acc = len * WSYNC_XXH_P64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += mix16(in + 48, 96);
                acc += mix16(in + len - 64, 112);
            }
            acc += mix16(in + 32, 64);
            acc += mix16(in + len - 48, 80);
        }
        acc += mix16(in + 16, 32);
        acc += mix16(in + len - 32, 48);
    }
    acc += mix16(in, 0);
    acc += mix16(in + len - 16, 16);
    return avalanche(acc);
}

// len 129..240
WSYNC_XXH_FN u64 hash_129to240(const unsigned char *in, u64 len) {
    u64 acc = len * WSYNC_XXH_P64_1;
    for (unsigned i = 0; i < 8; ++i) acc += mix16(in + 16 * i, 16 * i);
    acc = avalanche(acc);
    const unsigned rounds = unsigned(len / 16);
    for (unsigned i = 8; i < rounds; ++i) acc += mix16(in + 16 * i, 16 * (i - 8) + 3);
    acc += mix16(in + len - 16, 136 - 17);  // XXH3_SECRET_SIZE_MIN - XXH3_MIDSIZE_LASTOFFSET
    return avalanche(acc);
}

// One 64-byte stripe into the eight accumulators, with the secret at `key`.
WSYNC_XXH_FN void accumulate(u64 *acc, const unsigned char *in, unsigned key) {
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (unsigned i = 0; i < 8; ++i) {
        const u64 v = rd64(in + 8 * i);
        const u64 k = v ^ key64(key + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += u64(u32(k)) * u64(u32(k >> 32));
    }
}
WSYNC_XXH_FN void scramble(u64 *acc) {
#if defined(__CUDACC__)
#pragma unroll
#endif
    for (unsigned i = 0; i < 8; ++i) {
        u64 a = acc[i];
        a ^= a >> 47;
        a ^= key64(128 + 8 * i);  // secret size - stripe
        acc[i] = a * WSYNC_XXH_P32_1;
    }
}

// len > 240: stripes of 64 bytes, blocks of 16 stripes (1 KiB) with a scramble after each.
WSYNC_XXH_FN u64 hash_long(const unsigned char *in, u64 len) {
    u64 acc[8] = {WSYNC_XXH_P32_3, WSYNC_XXH_P64_1, WSYNC_XXH_P64_2, WSYNC_XXH_P64_3,
                  WSYNC_XXH_P64_4, WSYNC_XXH_P32_2, WSYNC_XXH_P64_5, WSYNC_XXH_P32_1};
    const u64 blocks = (len - 1) / 1024;
    for (u64 b = 0; b < blocks; ++b) {
        for (unsigned s = 0; s < 16; ++s) accumulate(acc, in + b * 1024 + 64 * s, 8 * s);
        scramble(acc);
    }
    const unsigned stripes = unsigned(((len - 1) - 1024 * blocks) / 64);
    for (unsigned s = 0; s < stripes; ++s) accumulate(acc, in + blocks * 1024 + 64 * s, 8 * s);
    accumulate(acc, in + len - 64, 192 - 64 - 7);
    u64 r = len * WSYNC_XXH_P64_1;
    for (unsigned i = 0; i < 4; ++i)
        r += mul128_fold64(acc[2 * i] ^ key64(11 + 16 * i), acc[2 * i + 1] ^ key64(11 + 16 * i + 8));
    return avalanche(r);
}

// len 0..240
WSYNC_XXH_FN u64 hash64_short(const unsigned char *in, u64 len) {
    if (len <= 16) return hash_0to16(in, len);
    if (len <= 128) return hash_17to128(in, len);
    return hash_129to240(in, len);
}
// ---- the lane-parallel form of hash_long (a warp of 32 threads hashes one buffer) ----------
// hash_long's eight accumulators are independent lanes, except that lane i's input word also
// adds into accumulator i ^ 1; and within one 1 KiB block the 16 stripes only add (the scramble
// comes after the block). So a warp takes a block in 4 rounds of 4 stripes: thread t = 8g + i
// (g = t / 8: which stripe of the round, i = t % 8: which accumulator) reads the word at
// 256 * round + 8 * t (one coalesced 256-byte load per round) and keeps two sums, of its product
// terms (for accumulator i) and of its words (for accumulator i ^ 1). Summing over g (shuffles)
// and exchanging the word sums with lane i ^ 1 gives every thread acc[i], which it scrambles
// itself; the tail stripes go the same way, the last one (at len - 64) on threads g == 0. The
// kernels do this with warp shuffles (delta.cu, warp_hash); hash_long_by_lanes below runs the
// same schedule on the host, and test_delta_codec checks it against XXH3_64bits.
WSYNC_XXH_FN u64 acc_init(unsigned i) {
    return i == 0 ? WSYNC_XXH_P32_3 : i == 1 ? WSYNC_XXH_P64_1 : i == 2 ? WSYNC_XXH_P64_2
         : i == 3 ? WSYNC_XXH_P64_3 : i == 4 ? WSYNC_XXH_P64_4 : i == 5 ? u64(WSYNC_XXH_P32_2)
         : i == 6 ? WSYNC_XXH_P64_5 : u64(WSYNC_XXH_P32_1);
}
// One word of a stripe on lane i, with its secret word k: the product term (for acc[i]) and
// the word itself (for acc[i ^ 1]) added into the thread's sums.
WSYNC_XXH_FN void lane_add(u64 *prod, u64 *word, u64 v, u64 k) {
    const u64 x = v ^ k;
    *word += v;
    *prod += u64(u32(x)) * u64(u32(x >> 32));
}
// acc[i] after a block's scramble (the secret word at 128 + 8i is `k`).
WSYNC_XXH_FN u64 scramble_lane(u64 a, u64 k) {
    a ^= a >> 47;
    a ^= k;
    return a * WSYNC_XXH_P32_1;
}
// The end of hash_long from the eight accumulators.
WSYNC_XXH_FN u64 merge_accs(const u64 *acc, u64 len) {
    u64 r = len * WSYNC_XXH_P64_1;
    for (unsigned i = 0; i < 4; ++i)
        r += mul128_fold64(acc[2 * i] ^ key64(11 + 16 * i), acc[2 * i + 1] ^ key64(11 + 16 * i + 8));
    return avalanche(r);
}
#if !defined(__CUDACC__)
// hash_long (len > 240) as the warp computes it: 32 threads' sums, reduced as the shuffles do.
inline u64 hash_long_by_lanes(const unsigned char *in, u64 len) {
    u64 acc[8];
    for (unsigned i = 0; i < 8; ++i) acc[i] = acc_init(i);
    auto reduce = [&](const u64 *prod, const u64 *word) {
        u64 p[8] = {}, w[8] = {};
        for (unsigned t = 0; t < 32; ++t) {
            p[t & 7] += prod[t];
            w[t & 7] += word[t];
        }
        for (unsigned i = 0; i < 8; ++i) acc[i] += p[i] + w[i ^ 1];
    };
    const u64 blocks = (len - 1) / 1024;
    for (u64 b = 0; b < blocks; ++b) {
        u64 prod[32] = {}, word[32] = {};
        for (unsigned r = 0; r < 4; ++r)
            for (unsigned t = 0; t < 32; ++t)
                lane_add(&prod[t], &word[t], rd64(in + b * 1024 + 256 * r + 8 * t),
                         key64(32 * r + 8 * (t >> 3) + 8 * (t & 7)));
        reduce(prod, word);
        for (unsigned i = 0; i < 8; ++i) acc[i] = scramble_lane(acc[i], key64(128 + 8 * i));
    }
    const unsigned stripes = unsigned(((len - 1) - 1024 * blocks) / 64);
    u64 prod[32] = {}, word[32] = {};
    for (unsigned r = 0; r < 4; ++r)
        for (unsigned t = 0; t < 32; ++t)
            if (4 * r + (t >> 3) < stripes)
                lane_add(&prod[t], &word[t], rd64(in + blocks * 1024 + 256 * r + 8 * t),
                         key64(32 * r + 8 * (t >> 3) + 8 * (t & 7)));
    for (unsigned t = 0; t < 8; ++t)
        lane_add(&prod[t], &word[t], rd64(in + len - 64 + 8 * t), key64(121 + 8 * t));
    reduce(prod, word);
    return merge_accs(acc, len);
}
// XXH3_64bits(in, len) with the long path in the warp's schedule.
inline u64 hash64_by_lanes(const unsigned char *in, u64 len) {
    return len <= 240 ? hash64_short(in, len) : hash_long_by_lanes(in, len);
}
#endif
// XXH3_64bits(in, len).
WSYNC_XXH_FN u64 hash64(const unsigned char *in, u64 len) {
    return len <= 240 ? hash64_short(in, len) : hash_long(in, len);
}

}  // namespace wsync_xxh3
