#include "delta.hpp"

#include <cstdlib>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "copy.hpp"
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
}  // namespace
#define WSYNC_DELTA_MASK diff_mask_words

#include "delta_kernels.hpp"

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

void grow_vector(kernels::Sink *s) {
    auto *v = static_cast<std::vector<uint64_t> *>(s->owner);
    v->resize(s->size);
    v->resize(v->size() < 512 ? 1024 : v->size() * 2);
    s->data = v->data();
    s->cap = v->size();
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

std::vector<uint8_t> encode(const uint64_t *idx, std::size_t count, uint64_t elements,
                            uint64_t esize, const void *data) {
    const IndexCoding c = choose_coding(idx, count, elements);
    std::vector<uint8_t> out(patch_bytes(count, esize, c.width), 0);
    uint8_t *p = out.data();
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
    uint8_t *vals = ix + round8(count * c.width);
    const uint8_t *src = static_cast<const uint8_t *>(data);
    for (std::size_t k = 0; k < count; ++k) std::memcpy(vals + k * esize, src + idx[k] * esize, esize);
    return out;
}

const uint8_t *patch_values(const uint8_t *bytes) {
    return bytes + kHeaderBytes + round8(get(bytes + 16, 8) * bytes[5]);
}

Patch parse(const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
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
    // count <= elements <= 2^62 keeps patch_bytes() from overflowing.
    if (count > elements || patch_bytes(count, esize, width) != n)
        bad("of " + std::to_string(n) + " bytes does not hold its " + std::to_string(count) +
            " elements");
    Patch p;
    p.esize = esize;
    p.values = bytes + kHeaderBytes + round8(count * width);
    p.idx.resize(count);
    const uint8_t *ix = bytes + kHeaderBytes;
    uint64_t at = 0;
    for (uint64_t k = 0; k < count; ++k) {
        const uint64_t v = get(ix + k * width, width);
        const uint64_t i = coding == kGaps ? at + v : v;
        if (i >= elements || (k > 0 && i <= at) || (coding == kGaps && i < at))
            bad("index " + std::to_string(k) + " is out of order or outside the tensor");
        p.idx[k] = at = i;
    }
    return p;
}

bool find_changes(const void *now, const void *base, uint64_t nbytes, uint64_t esize,
                  uint64_t limit, std::vector<uint64_t> &idx, uint64_t *hash) {
    idx.clear();
    kernels::Sink sink{idx.data(), 0, idx.size(), &idx, grow_vector};
    const auto *a = static_cast<const uint8_t *>(now);
    const auto *b = static_cast<const uint8_t *>(base);
    bool ok;
#if defined(__x86_64__)
    if (copy::have_avx2()) ok = kernels::avx2_find_changes(a, b, nbytes, esize, limit, &sink, hash);
    else
#endif
        ok = kernels::find_changes_impl(a, b, nbytes, esize, limit, &sink, hash);
    idx.resize(sink.size);
    return ok;
}

Applied apply_verified(void *dst, uint64_t nbytes, const Patch &p, uint64_t base_hash,
                       uint64_t result_hash, uint64_t *got) {
    std::vector<uint8_t> old(p.idx.size() * p.esize);
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
