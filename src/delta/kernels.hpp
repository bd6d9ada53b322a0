// The compare and apply loops of delta.cpp, built twice: by delta.cpp for the baseline ISA and
// by avx2.cpp with -mavx2 (called only where the CPU has AVX2). Include after <xxhash.h>
// with XXH_INLINE_ALL, and with WSYNC_DELTA_MASK defined as the file's 32-byte difference mask,
// WSYNC_DELTA_SAME128 as its 128-byte equality test and WSYNC_DELTA_EMASK as its template
// <size_t E> 64-element difference mask (bit j: element j of E bytes differs).
// Everything below has internal linkage and uses no template or inline function shared with
// other files (no std::vector, no std::min), so each file keeps its own build of it and the
// linker can never hand an AVX2 copy to a CPU without AVX2.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "delta/delta.hpp"

namespace wsync {
namespace delta {
namespace kernels {

// Where find_changes puts indices and values; grow() (delta.cpp, baseline ISA) makes room.
struct Sink {
    uint64_t *idx;
    uint8_t *vals;
    size_t size, cap;
    void *owner;
    void (*grow)(Sink *);
};
// The patch as plain pointers.
struct Scatter {
    const uint64_t *idx;
    size_t count;
    const uint8_t *values;
    uint64_t esize;
};
bool avx2_find_changes(const uint8_t *now, uint8_t *base, uint64_t nbytes, uint64_t esize,
                       uint64_t limit, const Scatter *fold, Sink *out, uint64_t *hash);
Applied avx2_apply_verified(uint8_t *dst, uint64_t nbytes, const Scatter &p, uint8_t *old,
                            uint64_t base_hash, uint64_t result_hash, uint64_t *got);

namespace {

// Hashed and patched block by block, each block still in L1 for its second use. A block holds
// whole elements, so no element straddles two.
constexpr uint64_t kBlock = 16 << 10;
inline uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
inline uint64_t block_for(uint64_t esize) {
    return esize >= kBlock ? esize : kBlock / esize * esize;
}

// Bit i set: byte i of the n (< 32) bytes differs.
inline uint32_t tail_mask(const uint8_t *a, const uint8_t *b, uint64_t n) {
    uint32_t m = 0;
    for (uint64_t i = 0; i < n; ++i) m |= uint32_t(a[i] != b[i]) << i;
    return m;
}

inline void copy_element(uint8_t *d, const uint8_t *s, uint64_t esize) {
    switch (esize) {
    case 2: memcpy(d, s, 2); break;
    case 4: memcpy(d, s, 4); break;
    default: memcpy(d, s, esize);
    }
}

// Writes the next kSlots changed elements of the 64-element window at element e0 (the set bits
// of *m, lowest first) to slots at, at+1, ... of the sink, unconditionally: slots past the
// window's count get a harmless copy of element 63 and are overwritten by the next window
// (two slots measured fastest: 8 cost more at 0% than the branch they save at 1%). No branch
// depends on the data, so a window with changes costs the same as one without (at 1% of bf16
// elements changed, about half of all windows hold a change: a branch there is a coin flip).
constexpr unsigned kSlots = 2;
template <size_t E>
inline void put_slots(uint64_t *idx, uint8_t *vals, size_t at, uint64_t e0, const uint8_t *win,
                 uint64_t *m) {
    uint64_t bits = *m;
    for (unsigned i = 0; i < kSlots; ++i) {
        const unsigned t = unsigned(__builtin_ctzll(bits | (uint64_t(1) << 63)));
        idx[at + i] = e0 + t;
        memcpy(vals + (at + i) * E, win + uint64_t(t) * E, E);
        bits &= bits - 1;
    }
    *m = bits;
}

// find_changes_impl for elements of E = 1, 2, 4 or 8 bytes: 64 elements per window, their
// difference mask in one 64-bit word (WSYNC_DELTA_EMASK<E>), the changed ones written by
// put_slots without branches. Capacity for a whole block (plus a window's slack) is made before the
// block; `limit` is checked after each block, so the compare may run up to one block past it.
template <size_t E>
inline bool find_changes_fixed(const uint8_t *now, uint8_t *base, uint64_t nbytes, uint64_t limit,
                               const Scatter *fold, Sink *out, uint64_t *hash) {
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    size_t f = 0;
    constexpr uint64_t kWin = 64 * E;
    for (uint64_t at = 0; at < nbytes; at += kBlock) {
        const uint64_t end = min_u64(nbytes, at + kBlock);
        for (; fold && f < fold->count && fold->idx[f] * E < end; ++f)
            memcpy(base + fold->idx[f] * E, fold->values + f * E, E);
        while (out->cap - out->size < kBlock / E + 64) out->grow(out);
        uint64_t *idx = out->idx;
        uint8_t *vals = out->vals;
        size_t n = out->size;
        uint64_t p = at;
        for (; p + kWin <= end; p += kWin) {
            uint64_t m = WSYNC_DELTA_EMASK<E>(now + p, base + p);
            const size_t cnt = size_t(__builtin_popcountll(m));
            const uint64_t e0 = p / E;
            size_t k = 0;  // at least once: a window without changes writes its slots too
            do put_slots<E>(idx, vals, n + k, e0, now + p, &m);
            while ((k += kSlots) < cnt);
            n += cnt;
        }
        for (; p < end; p += E)  // the block's last elements, fewer than a window
            if (memcmp(now + p, base + p, E) != 0) {
                idx[n] = p / E;
                memcpy(vals + n * E, now + p, E);
                ++n;
            }
        out->size = n;
        if (n > limit) return false;
        XXH3_64bits_update(&st, now + at, end - at);
    }
    *hash = XXH3_64bits_digest(&st);
    return true;
}

// `fold`: a committed patch not yet written into base, written block by block just before the
// block is compared (while it is in L1). The changed elements' values are gathered from `now`
// in the same pass, for the same reason.
inline bool find_changes_impl(const uint8_t *now, uint8_t *base, uint64_t nbytes, uint64_t esize,
                              uint64_t limit, const Scatter *fold, Sink *out, uint64_t *hash) {
    switch (esize) {
    case 1: return find_changes_fixed<1>(now, base, nbytes, limit, fold, out, hash);
    case 2: return find_changes_fixed<2>(now, base, nbytes, limit, fold, out, hash);
    case 4: return find_changes_fixed<4>(now, base, nbytes, limit, fold, out, hash);
    case 8: return find_changes_fixed<8>(now, base, nbytes, limit, fold, out, hash);
    default: break;
    }
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    uint64_t skip = 0;  // bytes before this belong to elements already recorded
    size_t f = 0;       // next fold entry
    const uint64_t blk = block_for(esize);
    // Element of a byte offset: a shift for the usual power-of-two sizes, else a division.
    const int shift = (esize & (esize - 1)) == 0 ? __builtin_ctzll(esize) : -1;
    for (uint64_t at = 0; at < nbytes; at += blk) {
        const uint64_t end = min_u64(nbytes, at + blk);
        for (; fold && f < fold->count && fold->idx[f] * esize < end; ++f)
            copy_element(base + fold->idx[f] * esize, fold->values + f * esize, esize);
        for (uint64_t p = at; p < end; p += 32) {
            // Most of a tensor is unchanged: 128 equal bytes are skipped with one test.
            if (((p - at) & 127) == 0 && end - p >= 128 && skip <= p &&
                WSYNC_DELTA_SAME128(now + p, base + p)) {
                p += 96;
                continue;
            }
            uint32_t m = end - p >= 32 ? WSYNC_DELTA_MASK(now + p, base + p)
                                       : tail_mask(now + p, base + p, end - p);
            if (skip > p) m = skip - p >= 32 ? 0 : m & (~0u << (skip - p));
            while (m) {
                const uint64_t at_byte = p + uint64_t(__builtin_ctz(m));
                const uint64_t e = shift >= 0 ? at_byte >> shift : at_byte / esize;
                if (out->size == out->cap) out->grow(out);
                out->idx[out->size] = e;
                copy_element(out->vals + out->size * esize, now + e * esize, esize);
                if (++out->size > limit) return false;
                skip = (e + 1) * esize;
                m = skip - p >= 32 ? 0 : m & (~0u << (skip - p));
            }
        }
        XXH3_64bits_update(&st, now + at, end - at);
    }
    *hash = XXH3_64bits_digest(&st);
    return true;
}

// E: the element size when it is 1, 2, 4 or 8 (fixed-size moves), 0 for any other (esize).
// One hash on the way: each block is patched (the replaced bytes saved) and hashed while in L1;
// a result that hashes to result_hash is the trainer's tensor, bit for bit, whatever dst held
// before. Only when it does not is dst put back and hashed again, to name the cause: a
// destination that did not hold the base (kBaseDiffers) or a patch whose result is wrong
// (kResultDiffers). Hashing the base on every apply as well cost a second XXH3 pass over the
// tensor and decided nothing the result's hash does not.
template <size_t E>
Applied apply_impl(uint8_t *dst, uint64_t nbytes, const Scatter &p, uint8_t *old,
                   uint64_t base_hash, uint64_t result_hash, uint64_t *got) {
    const uint64_t es = E ? E : p.esize;
    XXH3_state_t after;
    XXH3_64bits_reset(&after);
    const size_t n = p.count;
    size_t k = 0;
    const uint64_t blk = block_for(es);
    for (uint64_t at = 0; at < nbytes; at += blk) {
        const uint64_t end = min_u64(nbytes, at + blk);
        // One load per line first brings the block into L1 in order (the hardware prefetcher
        // follows it); the scatter's stores then hit. Scattered into lines not yet cached (at
        // 1% of bf16 elements changed, one line in four), they stalled the hash's loads of
        // the same lines: without this the apply at 1% was 45% slower than with a second hash
        // pass, which it replaces (a software prefetch of the next block did not help).
        for (uint64_t q = at; q < end; q += 64) (void)*static_cast<volatile const uint8_t *>(dst + q);
        for (; k < n && p.idx[k] * es < end; ++k) {
            uint8_t *d = dst + p.idx[k] * es;
            memcpy(old + k * es, d, E ? E : es);
            memcpy(d, p.values + k * es, E ? E : es);
        }
        XXH3_64bits_update(&after, dst + at, end - at);
    }
    const uint64_t r = XXH3_64bits_digest(&after);
    if (r == result_hash) return Applied::kApplied;
    for (size_t j = n; j-- > 0;)  // every changed element back as it was (last first, should
        memcpy(dst + p.idx[j] * es, old + j * es, E ? E : es);  // an index repeat)
    const uint64_t b = XXH3_64bits(dst, nbytes);
    if (b != base_hash) {
        *got = b;
        return Applied::kBaseDiffers;
    }
    *got = r;
    return Applied::kResultDiffers;
}

inline Applied apply_any(uint8_t *dst, uint64_t nbytes, const Scatter &p, uint8_t *old,
                         uint64_t base_hash, uint64_t result_hash, uint64_t *got) {
    switch (p.esize) {
    case 1: return apply_impl<1>(dst, nbytes, p, old, base_hash, result_hash, got);
    case 2: return apply_impl<2>(dst, nbytes, p, old, base_hash, result_hash, got);
    case 4: return apply_impl<4>(dst, nbytes, p, old, base_hash, result_hash, got);
    case 8: return apply_impl<8>(dst, nbytes, p, old, base_hash, result_hash, got);
    default: return apply_impl<0>(dst, nbytes, p, old, base_hash, result_hash, got);
    }
}

}  // namespace
}  // namespace kernels
}  // namespace delta
}  // namespace wsync
