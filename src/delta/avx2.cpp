// The AVX2 build of kernels.hpp, compiled with -mavx2 and called only where the CPU has
// AVX2 (delta.cpp checks). XXH3 is inlined here so that it, too, runs on 256-bit vectors.
#include <immintrin.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace {
// Bit i set: byte i of the 32 bytes differs.
inline uint32_t diff_mask_avx2(const uint8_t *a, const uint8_t *b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(a));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(b));
    return ~uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x, y)));
}
// Whether the 128 bytes at a and b are equal: four compares folded into one test.
inline bool same128_avx2(const uint8_t *a, const uint8_t *b) {
    const auto *x = reinterpret_cast<const __m256i *>(a);
    const auto *y = reinterpret_cast<const __m256i *>(b);
    const __m256i d0 = _mm256_xor_si256(_mm256_loadu_si256(x), _mm256_loadu_si256(y));
    const __m256i d1 = _mm256_xor_si256(_mm256_loadu_si256(x + 1), _mm256_loadu_si256(y + 1));
    const __m256i d2 = _mm256_xor_si256(_mm256_loadu_si256(x + 2), _mm256_loadu_si256(y + 2));
    const __m256i d3 = _mm256_xor_si256(_mm256_loadu_si256(x + 3), _mm256_loadu_si256(y + 3));
    const __m256i any = _mm256_or_si256(_mm256_or_si256(d0, d1), _mm256_or_si256(d2, d3));
    return _mm256_testz_si256(any, any) != 0;
}
// Bit j set: element j of the 64 elements of E bytes at a and b differs (E = 1, 2, 4, 8).
inline __m256i load(const uint8_t *p, unsigned k) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p) + k);
}
template <size_t E>
inline uint64_t emask64_avx2(const uint8_t *a, const uint8_t *b) {
    uint64_t eq = 0;
    if (E == 1) {
        for (unsigned k = 0; k < 2; ++k)
            eq |= uint64_t(uint32_t(_mm256_movemask_epi8(_mm256_cmpeq_epi8(load(a, k), load(b, k))))) << (32 * k);
    } else if (E == 2) {
        // Two 16-element compares packed into one byte mask (packs interleaves the 128-bit
        // lanes; the permute puts them back in element order).
        for (unsigned k = 0; k < 2; ++k) {
            const __m256i e0 = _mm256_cmpeq_epi16(load(a, 2 * k), load(b, 2 * k));
            const __m256i e1 = _mm256_cmpeq_epi16(load(a, 2 * k + 1), load(b, 2 * k + 1));
            const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);
            eq |= uint64_t(uint32_t(_mm256_movemask_epi8(p))) << (32 * k);
        }
    } else if (E == 4) {
        for (unsigned k = 0; k < 8; ++k)
            eq |= uint64_t(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(load(a, k), load(b, k))))) << (8 * k);
    } else {
        for (unsigned k = 0; k < 16; ++k)
            eq |= uint64_t(_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(load(a, k), load(b, k))))) << (4 * k);
    }
    return ~eq;
}
}  // namespace
#define WSYNC_DELTA_EMASK emask64_avx2
#define WSYNC_DELTA_MASK diff_mask_avx2
#define WSYNC_DELTA_SAME128 same128_avx2

#include "delta/kernels.hpp"

namespace wsync {
namespace delta {
namespace kernels {

bool avx2_find_changes(const uint8_t *now, uint8_t *base, uint64_t nbytes, uint64_t esize,
                       uint64_t limit, const Scatter *fold, Sink *out, uint64_t *hash) {
    return find_changes_impl(now, base, nbytes, esize, limit, fold, out, hash);
}

Applied avx2_apply_verified(uint8_t *dst, uint64_t nbytes, const Scatter &p, uint8_t *old,
                            uint64_t base_hash, uint64_t result_hash, uint64_t *got) {
    return apply_any(dst, nbytes, p, old, base_hash, result_hash, got);
}

}  // namespace kernels
}  // namespace delta
}  // namespace wsync
