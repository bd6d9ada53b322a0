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

#include "copy_kernels.hpp"

namespace wsync {
namespace copy {
namespace kernels {

namespace {

void forward_avx2(uint8_t *d, const uint8_t *s, size_t n,
                                                  bool nt) {
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
    if (nt) _mm_sfence();
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(dfirst), first);
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(dlast), last);
}

void backward_avx2(uint8_t *d, const uint8_t *s, size_t n,
                                                   bool nt) {
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
    if (nt) _mm_sfence();
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

void avx2_copy(uint8_t *d, const uint8_t *s, size_t n, bool nt) {
    if (n < 64) {
        memcpy(d, s, n);
    } else if (backward_is_safer(d, s)) {
        backward_avx2(d, s, n, nt);
    } else {
        forward_avx2(d, s, n, nt);
    }
}

uint64_t avx2_hash(const void *p, size_t n) { return XXH3_64bits(p, n); }

uint64_t avx2_copy_hashing(uint8_t *dst, const uint8_t *s, uint64_t total, uint64_t off,
                           uint64_t len, bool nt) {
    uint8_t *d = dst - off;  // d + x is where source byte x goes
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (uint64_t at = 0; at < total; at += kHashBlock) {
        uint64_t n = lo_of(kHashBlock, total - at);
        uint64_t lo = hi_of(at, off), hi = lo_of(at + n, off + len);
        if (lo < hi) avx2_copy(d + lo, s + lo, size_t(hi - lo), nt);
        // Start loading the next block while this one is hashed from L1: the hash then costs
        // little more than the copy's wait for memory.
        const uint8_t *next = s + at + n;
        for (uint64_t k = 0; k < lo_of(kHashBlock, total - at - n); k += 64)
            _mm_prefetch(reinterpret_cast<const char *>(next + k), _MM_HINT_T0);
        XXH3_64bits_update(&state, s + at, size_t(n));
    }
    return XXH3_64bits_digest(&state);
}

}  // namespace kernels
}  // namespace copy
}  // namespace wsync
