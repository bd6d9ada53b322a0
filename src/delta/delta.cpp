#include "delta/delta.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "copy/copy.hpp"
#include "error.hpp"
#include "wire.hpp"

namespace {

// Bit i set: byte i of the 32 bytes differs (words first: most blocks are equal).
inline uint32_t diff_mask_words(const uint8_t *a, const uint8_t *b) {
    uint64_t x[4], y[4];
    std::memcpy(x, a, 32);
    std::memcpy(y, b, 32);
    if (((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0) return 0;
    uint32_t m = 0;
    for (unsigned i = 0; i < 32; ++i) m |= uint32_t(a[i] != b[i]) << i;
    return m;
}
inline bool same128_words(const uint8_t *a, const uint8_t *b) { return std::memcmp(a, b, 128) == 0; }
// Bit j set: element j of the 64 elements of E bytes at a and b differs.
template <size_t E>
inline uint64_t emask64_words(const uint8_t *a, const uint8_t *b) {
    uint64_t m = 0;
    for (unsigned j = 0; j < 64; ++j) m |= uint64_t(std::memcmp(a + j * E, b + j * E, E) != 0) << j;
    return m;
}
}  // namespace
#define WSYNC_DELTA_EMASK emask64_words
#define WSYNC_DELTA_MASK diff_mask_words
#define WSYNC_DELTA_SAME128 same128_words

#include "delta/kernels.hpp"

namespace wsync {
namespace delta {

namespace {

uint64_t round8(uint64_t x) { return (x + 7) / 8 * 8; }

void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint64_t get(const uint8_t *p, unsigned width) {
    uint64_t v = 0;
    for (unsigned i = 0; i < width; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}

kernels::Scatter as_scatter(const Patch &p) {
    return {p.idx.data(), p.idx.size(), p.values, p.esize};
}

// Makes room in the Changes behind a Sink.
void grow_changes(kernels::Sink *s) {
    auto *c = static_cast<Changes *>(s->owner);
    const std::size_t cap = c->idx.size() < 512 ? 1024 : c->idx.size() * 2;
    c->idx.resize(cap);
    c->values.resize(cap * c->esize);
    s->idx = c->idx.data();
    s->vals = c->values.data();
    s->cap = cap;
}

}  // namespace

IndexCoding choose_coding(const uint64_t *idx, std::size_t count, uint64_t elements) {
    constexpr uint64_t k32 = uint64_t(1) << 32;
    if (elements <= k32) return {kPlain, 4};
    uint64_t prev = 0;
    for (std::size_t k = 0; k < count; ++k) {
        if (idx[k] - prev >= k32) return {kPlain, 8};
        prev = idx[k];
    }
    return {kGaps, 4};
}

uint64_t patch_bytes(uint64_t count, uint64_t esize, unsigned width) {
    return kHeaderBytes + round8(count * width) + count * esize;
}

void encode(const Changes &ch, uint64_t elements, std::vector<uint8_t> &out) {
    const uint64_t *idx = ch.idx.data(), esize = ch.esize;
    const std::size_t count = ch.count;
    const IndexCoding c = choose_coding(idx, count, elements);
    out.resize(patch_bytes(count, esize, c.width));
    uint8_t *p = out.data();
    std::memset(p, 0, kHeaderBytes);
    std::memset(p + kHeaderBytes + round8(count * c.width) - 8, 0, 8);  // the indices' padding
    put32(p, kMagic);
    p[4] = c.coding;
    p[5] = uint8_t(c.width);
    put32(p + 8, uint32_t(esize));
    put64(p + 16, count);
    put64(p + 24, elements);
    uint8_t *ix = p + kHeaderBytes;
    uint64_t prev = 0;
    for (std::size_t k = 0; k < count; ++k) {
        const uint64_t v = c.coding == kGaps ? idx[k] - prev : idx[k];
        prev = idx[k];
        if (c.width == 4) put32(ix + 4 * k, uint32_t(v));
        else put64(ix + 8 * k, v);
    }
    if (count) std::memcpy(ix + round8(count * c.width), ch.values.data(), count * esize);
}

const uint8_t *patch_values(const uint8_t *bytes) {
    return bytes + kHeaderBytes + round8(get(bytes + 16, 8) * bytes[5]);
}

Patch parse(const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
            const std::string &what) {
    Patch p;
    parse_into(p, bytes, n, elements, esize, what);
    return p;
}

Header check_header(const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
                    const std::string &what) {
    auto bad = [&](const std::string &why) { wire::malformed(what + ": patch " + why); };
    if (n < kHeaderBytes) bad("of " + std::to_string(n) + " bytes is shorter than its header");
    if (get(bytes, 4) != kMagic) bad("does not start with the magic \"WDP1\"");
    const unsigned coding = bytes[4], width = bytes[5];
    if (coding > kGaps || (width != 4 && width != 8) || get(bytes + 6, 2) != 0 ||
        get(bytes + 12, 4) != 0)
        bad("header has an unknown coding, index width or reserved bits");
    if (get(bytes + 8, 4) != esize)
        bad("is for elements of " + std::to_string(get(bytes + 8, 4)) + " bytes, the tensor's are " +
            std::to_string(esize));
    if (get(bytes + 24, 8) != elements)
        bad("is for a tensor of " + std::to_string(get(bytes + 24, 8)) + " elements, this one has " +
            std::to_string(elements));
    const uint64_t count = get(bytes + 16, 8);
    // Bounded by the bytes at hand before patch_bytes() multiplies anything.
    if (count > elements || count > (n - kHeaderBytes) / (width + esize) ||
        patch_bytes(count, esize, width) != n)
        bad("of " + std::to_string(n) + " bytes does not hold its " + std::to_string(count) +
            " elements");
    return {Coding(coding), width, count};
}

void bad_index(const std::string &what, uint64_t k) {
    wire::malformed(what + ": patch index " + std::to_string(k) +
                    " is out of order or outside the tensor");
}

uint64_t combine_piece_hashes(const uint64_t *hashes, uint64_t count) {
    return copy::combine_piece_hashes(hashes, count);
}
uint64_t tree_hash(const void *data, uint64_t nbytes) { return copy::tree_hash(data, nbytes); }

namespace {

}  // namespace

void parse_into(Patch &p, const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
                const std::string &what) {
    const Header h = check_header(bytes, n, elements, esize, what);
    const uint64_t count = h.count;
    const unsigned width = h.width;
    p.esize = esize;
    p.values = bytes + kHeaderBytes + round8(count * width);
    p.idx.resize(count);
    const uint8_t *ix = bytes + kHeaderBytes;
    if (h.coding == kPlain && kLittleEndian && (width == 4 || width == 8)) {
        // The common codings: fixed-width loads and one compare per index, no byte loop (the
        // receiver's apply of a 5%-changed bf16 tensor spent a third of its time here).
        // Defects are gathered without a branch per index and located afterwards.
        auto load = [&](uint64_t k) {
            if (width == 8) {
                uint64_t v;
                std::memcpy(&v, ix + 8 * k, 8);
                return v;
            }
            uint32_t v;
            std::memcpy(&v, ix + 4 * k, 4);
            return uint64_t(v);
        };
        uint64_t prev = 0, bad = 0;
        for (uint64_t k = 0; k < count; ++k) {
            const uint64_t i = load(k);
            bad |= uint64_t(i >= elements) | (uint64_t(i <= prev) & uint64_t(k > 0));
            p.idx[k] = prev = i;
        }
        if (bad)
            for (uint64_t k = 0; k < count; ++k)
                if (p.idx[k] >= elements || (k > 0 && p.idx[k] <= p.idx[k - 1])) bad_index(what, k);
        return;
    }
    uint64_t at = 0;
    for (uint64_t k = 0; k < count; ++k) {
        const uint64_t v = get(ix + k * width, width);
        const uint64_t i = h.coding == kGaps ? at + v : v;
        if (i >= elements || (k > 0 && i <= at) || (h.coding == kGaps && i < at))
            bad_index(what, k);
        p.idx[k] = at = i;
    }
}

PatchView check(const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
                const std::string &what) {
    const Header h = check_header(bytes, n, elements, esize, what);
    PatchView v;
    v.coding = h.coding;
    v.width = h.width;
    v.count = h.count;
    v.indices = bytes + kHeaderBytes;
    v.values = bytes + kHeaderBytes + round8(h.count * h.width);
    const uint8_t *ix = v.indices;
    if (h.coding == kPlain && h.width == 4) {  // the common case: one compare per index
        uint32_t prev = 0;
        for (uint64_t k = 0; k < h.count; ++k) {
            uint32_t i;
            std::memcpy(&i, ix + 4 * k, 4);
            if (!kLittleEndian) i = uint32_t(get(ix + 4 * k, 4));
            if (i >= elements || (k > 0 && i <= prev)) bad_index(what, k);
            prev = i;
        }
        return v;
    }
    uint64_t at = 0;
    for (uint64_t k = 0; k < h.count; ++k) {
        const uint64_t d = get(ix + k * h.width, h.width);
        const uint64_t i = h.coding == kGaps ? at + d : d;
        if (i >= elements || (k > 0 && i <= at) || (h.coding == kGaps && i < at))
            bad_index(what, k);
        at = i;
    }
    return v;
}

bool flat_in_place(const PatchView &v, uint64_t elements) {
    if (!kLittleEndian || v.coding != kPlain) return false;
    // 4-byte indices are read as int32_t: every index must be below 2^31. 8-byte ones are
    // below `elements`, which a tensor's byte size keeps far below 2^63.
    return v.width == 8 || elements <= (uint64_t(1) << 31);
}

void flat_indices(const PatchView &v, int64_t *out) {
    uint64_t at = 0;
    for (uint64_t k = 0; k < v.count; ++k) {
        const uint64_t d = get(v.indices + k * v.width, v.width);
        at = v.coding == kGaps ? at + d : d;
        out[k] = int64_t(at);
    }
}

bool find_changes(const void *now, void *base, uint64_t nbytes, uint64_t esize, uint64_t limit,
                  const Patch *fold, Changes &out, uint64_t *hash) {
    out.esize = esize;
    out.values.resize(out.idx.size() * esize);
    kernels::Sink sink{out.idx.data(), out.values.data(), 0, out.idx.size(), &out, grow_changes};
    const auto *a = static_cast<const uint8_t *>(now);
    auto *b = static_cast<uint8_t *>(base);
    const kernels::Scatter f = fold ? as_scatter(*fold) : kernels::Scatter{nullptr, 0, nullptr, esize};
    const kernels::Scatter *fp = fold ? &f : nullptr;
    bool ok;
#if defined(__x86_64__)
    if (copy::have_avx2()) ok = kernels::avx2_find_changes(a, b, nbytes, esize, limit, fp, &sink, hash);
    else
#endif
        ok = kernels::find_changes_impl(a, b, nbytes, esize, limit, fp, &sink, hash);
    out.count = sink.size;
    return ok;
}

Applied apply_verified(void *dst, uint64_t nbytes, const Patch &p, uint64_t base_hash,
                       uint64_t result_hash, uint64_t *got, std::vector<uint8_t> &old) {
    if (old.size() < p.idx.size() * p.esize) old.resize(p.idx.size() * p.esize);
    const kernels::Scatter s = as_scatter(p);
    auto *d = static_cast<uint8_t *>(dst);
#if defined(__x86_64__)
    if (copy::have_avx2())
        return kernels::avx2_apply_verified(d, nbytes, s, old.data(), base_hash, result_hash, got);
#endif
    return kernels::apply_any(d, nbytes, s, old.data(), base_hash, result_hash, got);
}

void scatter(void *dst, const Patch &p) {
    auto *d = static_cast<uint8_t *>(dst);
    for (std::size_t k = 0; k < p.idx.size(); ++k)
        std::memcpy(d + p.idx[k] * p.esize, p.values + k * p.esize, p.esize);
}

}  // namespace delta
}  // namespace wsync
