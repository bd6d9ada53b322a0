// The AVX2 half of copy.cpp, compiled with -mavx2 and called only where the CPU has AVX2
// (copy.cpp checks). XXH3 is inlined here so that it, too, runs on 256-bit vectors. Nothing in
// this file may instantiate a template or inline function shared with other files: the linker
// could keep this file's AVX2 copy for callers on CPUs without AVX2.
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "copy/kernels.hpp"

namespace wsync {
namespace copy {
namespace kernels {

namespace {

void forward_avx2(uint8_t *d, const uint8_t *s, size_t n, bool nt) {
    // n >= 64. The first and last 32 bytes go unaligned; the loop stores aligned in between.
    const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s));
    const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 32));
    uint8_t *const dlast = d + n - 32;
    uint8_t *const dfirst = d;
    size_t skip = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
    d += skip, s += skip, n -= skip;
    if (nt) {
        for (; n >= 128; n -= 128, d += 128, s += 128) {
            __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s));
            __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 32));
            __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 64));
            __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 96));
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d), a);
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d + 32), b);
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d + 64), c);
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d + 96), e);
        }
    } else {
        for (; n >= 128; n -= 128, d += 128, s += 128) {
            __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s));
            __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 32));
            __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 64));
            __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + 96));
            _mm256_store_si256(reinterpret_cast<__m256i *>(d), a);
            _mm256_store_si256(reinterpret_cast<__m256i *>(d + 32), b);
            _mm256_store_si256(reinterpret_cast<__m256i *>(d + 64), c);
            _mm256_store_si256(reinterpret_cast<__m256i *>(d + 96), e);
        }
    }
    for (; n >= 32; n -= 32, d += 32, s += 32)
        _mm256_store_si256(reinterpret_cast<__m256i *>(d),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s)));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(dfirst), first);
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(dlast), last);
}

void backward_avx2(uint8_t *d, const uint8_t *s, size_t n, bool nt) {
    // n >= 64. Walks down from the end; the end of the aligned part is d + n.
    const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s));
    const __m256i last = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 32));
    uint8_t *const dlast = d + n - 32;
    n -= reinterpret_cast<uintptr_t>(d + n) & 31;
    if (nt) {
        for (; n >= 128; n -= 128) {
            __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 32));
            __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 64));
            __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 96));
            __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 128));
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d + n - 32), a);
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d + n - 64), b);
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d + n - 96), c);
            _mm256_stream_si256(reinterpret_cast<__m256i *>(d + n - 128), e);
        }
    } else {
        for (; n >= 128; n -= 128) {
            __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 32));
            __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 64));
            __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 96));
            __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 128));
            _mm256_store_si256(reinterpret_cast<__m256i *>(d + n - 32), a);
            _mm256_store_si256(reinterpret_cast<__m256i *>(d + n - 64), b);
            _mm256_store_si256(reinterpret_cast<__m256i *>(d + n - 96), c);
            _mm256_store_si256(reinterpret_cast<__m256i *>(d + n - 128), e);
        }
    }
    for (; n >= 32; n -= 32)
        _mm256_store_si256(reinterpret_cast<__m256i *>(d + n - 32),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i *>(s + n - 32)));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(d), first);
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(dlast), last);
}

// See copy.cpp: a forward copy stalls when dst is a little ahead of src (mod 4096), a backward
// one when it is a little behind.
inline bool backward_is_safer(const void *dst, const void *src) {
    size_t delta = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
    return delta != 0 && delta <= kAliasWindow;
}

inline uint64_t lo_of(uint64_t a, uint64_t b) { return a < b ? a : b; }
inline uint64_t hi_of(uint64_t a, uint64_t b) { return a < b ? b : a; }

}  // namespace

// Without the fence that makes non-temporal stores visible in order: callers fence once.
static void copy_unfenced(uint8_t *d, const uint8_t *s, size_t n, bool nt) {
    if (n < 64) {
        memcpy(d, s, n);
    } else if (backward_is_safer(d, s)) {
        backward_avx2(d, s, n, nt);
    } else {
        forward_avx2(d, s, n, nt);
    }
}

void avx2_copy(uint8_t *d, const uint8_t *s, size_t n, bool nt) {
    copy_unfenced(d, s, n, nt);
    if (nt) _mm_sfence();
}

uint64_t avx2_hash(const void *p, size_t n) { return XXH3_64bits(p, n); }

namespace {

// XXH3's 64-byte stripe accumulation (XXH3_accumulate_512_avx2) and its scramble, on
// accumulators held in registers rather than in the memory array the reference keeps.
struct Acc {
    __m256i lo, hi;
};

// One 64-byte stripe of the source, loaded once: the hash reads these registers and the copy
// stores these registers, so no byte can reach the destination that the hash did not see (a
// source another process writes meanwhile could otherwise hand the hash one value and the
// destination another: adversarial trial, where a toggled piece end was committed as verified).
struct Stripe {
    __m256i lo, hi;
};

inline Stripe load_stripe(const uint8_t *p) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)),
            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + 32))};
}

// Streamed stores need d 32-byte aligned; `unaligned` stores through the cache instead.
inline void store_stripe(uint8_t *d, const Stripe &v, bool nt, bool unaligned) {
    if (unaligned) {
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d), v.lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(d + 32), v.hi);
    } else if (nt) {
        _mm256_stream_si256(reinterpret_cast<__m256i *>(d), v.lo);
        _mm256_stream_si256(reinterpret_cast<__m256i *>(d + 32), v.hi);
    } else {
        _mm256_store_si256(reinterpret_cast<__m256i *>(d), v.lo);
        _mm256_store_si256(reinterpret_cast<__m256i *>(d + 32), v.hi);
    }
}

inline void accumulate(Acc &a, const Stripe &in, const uint8_t *secret) {
    const __m256i d0 = in.lo, d1 = in.hi;
    const __m256i k0 = _mm256_xor_si256(d0, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(secret)));
    const __m256i k1 = _mm256_xor_si256(d1, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(secret + 32)));
    const __m256i p0 = _mm256_mul_epu32(k0, _mm256_shuffle_epi32(k0, _MM_SHUFFLE(0, 3, 0, 1)));
    const __m256i p1 = _mm256_mul_epu32(k1, _mm256_shuffle_epi32(k1, _MM_SHUFFLE(0, 3, 0, 1)));
    a.lo = _mm256_add_epi64(p0, _mm256_add_epi64(a.lo, _mm256_shuffle_epi32(d0, _MM_SHUFFLE(1, 0, 3, 2))));
    a.hi = _mm256_add_epi64(p1, _mm256_add_epi64(a.hi, _mm256_shuffle_epi32(d1, _MM_SHUFFLE(1, 0, 3, 2))));
}

inline __m256i scramble1(__m256i acc, const uint8_t *secret) {
    const __m256i prime32 = _mm256_set1_epi32(int(XXH_PRIME32_1));
    const __m256i k = _mm256_xor_si256(_mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47)),
                                       _mm256_loadu_si256(reinterpret_cast<const __m256i *>(secret)));
    const __m256i lo = _mm256_mul_epu32(k, prime32);
    const __m256i hi = _mm256_mul_epu32(_mm256_shuffle_epi32(k, _MM_SHUFFLE(0, 3, 0, 1)), prime32);
    return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

inline void scramble(Acc &a, const uint8_t *secret) {
    a.lo = scramble1(a.lo, secret);
    a.hi = scramble1(a.hi, secret + 32);
}

// XXH3-64 (default secret, seed 0) of n > 240 bytes at s, exactly as XXH3_64bits computes it
// (XXH3_hashLong_64b_internal), while copying them to d (streamed only when d is 32-byte
// aligned): each 64-byte stripe the hash reads is stored from the same registers, to the same
// offset. XXH3's stripes cover [0, 64 * floor((n - 1) / 64)); its last accumulation reads
// [n - 64, n), and the bytes of that load past the stripes are the ones stored for the tail.
// One pass, the hash's arithmetic overlapping the copy's wait for memory. Streamed stores are
// fenced before the tail is stored, so they are visible when it returns.
uint64_t copy_hash_whole(uint8_t *d, const uint8_t *s, size_t n, bool nt) {
    const bool unaligned = (reinterpret_cast<uintptr_t>(d) & 31) != 0;
    if (unaligned) nt = false;
    const uint8_t *const secret = XXH3_kSecret;
    const size_t secret_size = sizeof XXH3_kSecret;
    const size_t stripes_per_block = (secret_size - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
    const size_t block_len = XXH_STRIPE_LEN * stripes_per_block;
    const size_t blocks = (n - 1) / block_len;
    XXH_ALIGN(XXH_ACC_ALIGN) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC;
    Acc a{_mm256_load_si256(reinterpret_cast<const __m256i *>(acc)),
          _mm256_load_si256(reinterpret_cast<const __m256i *>(acc + 4))};
    size_t x = 0;  // the next stripe's offset
    for (size_t b = 0; b < blocks; ++b) {
        for (size_t k = 0; k < stripes_per_block; ++k, x += XXH_STRIPE_LEN) {
            const Stripe v = load_stripe(s + x);
            accumulate(a, v, secret + k * XXH_SECRET_CONSUME_RATE);
            store_stripe(d + x, v, nt, unaligned);
        }
        scramble(a, secret + secret_size - XXH_STRIPE_LEN);
    }
    const size_t stripes = ((n - 1) - block_len * blocks) / XXH_STRIPE_LEN;
    for (size_t k = 0; k < stripes; ++k, x += XXH_STRIPE_LEN) {
        const Stripe v = load_stripe(s + x);
        accumulate(a, v, secret + k * XXH_SECRET_CONSUME_RATE);
        store_stripe(d + x, v, nt, unaligned);
    }
    const Stripe last = load_stripe(s + n - XXH_STRIPE_LEN);
    accumulate(a, last, secret + secret_size - XXH_STRIPE_LEN - 7 /* XXH_SECRET_LASTACC_START */);
    // x == 64 * floor((n - 1) / 64), so n - 64 <= x < n: bytes [x, n) come from `last`.
    alignas(32) uint8_t tail[XXH_STRIPE_LEN];
    _mm256_store_si256(reinterpret_cast<__m256i *>(tail), last.lo);
    _mm256_store_si256(reinterpret_cast<__m256i *>(tail + 32), last.hi);
    if (nt) _mm_sfence();  // the streamed stripe before it may share the tail's cache line
    memcpy(d + x, tail + (x - (n - XXH_STRIPE_LEN)), n - x);
    _mm256_store_si256(reinterpret_cast<__m256i *>(acc), a.lo);
    _mm256_store_si256(reinterpret_cast<__m256i *>(acc + 4), a.hi);
    return XXH3_mergeAccs(acc, secret + 11 /* XXH_SECRET_MERGEACCS_START */,
                          xxh_u64(n) * XXH_PRIME64_1);
}

}  // namespace

uint64_t avx2_copy_hashing(uint8_t *dst, const uint8_t *s, uint64_t total, uint64_t off,
                           uint64_t len, bool nt, bool fence) {
    if (off == 0 && len == total && total > 240)
        return copy_hash_whole(dst, s, size_t(total), nt);
    // A range, or a tensor too small for XXH3's long loop: block by block, the source block is
    // copied once into a private buffer in L1, which the hash and the copy to dst then both
    // read (never the shared source twice).
    alignas(64) uint8_t buf[kHashBlock];
    uint8_t *d = dst - off;  // d + x is where source byte x goes
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (uint64_t at = 0; at < total; at += kHashBlock) {
        const uint64_t n = lo_of(kHashBlock, total - at);
        const uint64_t lo = hi_of(at, off), hi = lo_of(at + n, off + len);
        if (lo >= hi) {  // nothing of this block is copied: hash it where it is
            XXH3_64bits_update(&state, s + at, size_t(n));
            continue;
        }
        copy_unfenced(buf, s + at, size_t(n), false);
        XXH3_64bits_update(&state, buf, size_t(n));
        copy_unfenced(d + lo, buf + (lo - at), size_t(hi - lo), nt);
    }
    if (nt && fence) _mm_sfence();
    return XXH3_64bits_digest(&state);
}

}  // namespace kernels
}  // namespace copy
}  // namespace wsync
