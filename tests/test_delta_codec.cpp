// The delta codec (src/delta/delta.cpp), white-box: bitwise change finding at every element size, the
// index coding and its width switch at 2^32 elements, the patch parser's refusals, and the
// verified apply that leaves the destination as it was whenever a checksum disagrees.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "delta/delta.hpp"  // before cmocka.h, whose fail() macro would rename wsync::fail
#include "gpu/kernels/xxh3.h"
#include "error.hpp"
#include "tensor.hpp"
#include "whitebox.hpp"

using namespace wsync;

namespace {

// Every element whose bytes differ, the slow way.
std::vector<uint64_t> naive_changes(const std::vector<uint8_t> &a, const std::vector<uint8_t> &b,
                                    size_t esize) {
    std::vector<uint64_t> out;
    for (size_t e = 0; e < a.size() / esize; ++e)
        if (std::memcmp(a.data() + e * esize, b.data() + e * esize, esize) != 0) out.push_back(e);
    return out;
}

// Encodes now-vs-base, parses it back, applies it onto a copy of base and checks the result.
void round_trip(const std::vector<uint8_t> &base, const std::vector<uint8_t> &now, size_t esize) {
    delta::Changes ch;
    uint64_t hash = 0;
    std::vector<uint8_t> scratch = base;
    assert_true(delta::find_changes(now.data(), scratch.data(), now.size(), esize, UINT64_MAX, nullptr, ch, &hash));
    assert_true(hash == XXH3_64bits(now.data(), now.size()));
    std::vector<uint64_t> idx(ch.idx.begin(), ch.idx.begin() + ch.count);
    assert_true(idx == naive_changes(now, base, esize));
    const uint64_t elements = now.size() / esize;
    std::vector<uint8_t> patch, old;
    delta::encode(ch, elements, patch);
    delta::Patch p = delta::parse(patch.data(), patch.size(), elements, esize, "t");
    assert_true(p.idx == idx);
    std::vector<uint8_t> dst = base;
    uint64_t got = 0;
    assert_int_equal(int(delta::apply_verified(dst.data(), dst.size(), p,
                                               XXH3_64bits(base.data(), base.size()), hash, &got, old)),
                     int(delta::Applied::kApplied));
    assert_memory_equal(dst.data(), now.data(), now.size());
}

void changes_at_every_element_size_match_a_bytewise_comparison(void **) {
    const size_t sizes[] = {1, 2, 3, 4, 6, 8, 16, 32, 48};
    const size_t counts[] = {1, 7, 31, 33, 1000, 9000};
    for (size_t es : sizes)
        for (size_t n : counts)
            for (int pattern = 0; pattern < 4; ++pattern) {
                std::vector<uint8_t> base = noise(n * es, n + es), now = base;
                for (size_t e = 0; e < n; ++e) {
                    bool change = pattern == 1 ? true  // all changed
                                  : pattern == 2 ? false  // none
                                  : pattern == 3 ? (e % 97 == 5)
                                                 : (noise(1, e * 13 + es)[0] < 20);
                    if (change) now[e * es + (e % es)] ^= uint8_t(1 + e % 255);
                }
                round_trip(base, now, es);
            }
}

void nan_payloads_and_signed_zeros_are_changes(void **) {
    std::vector<float> a(64, 1.0f), b;
    a[3] = 0.0f;
    a[7] = std::nanf("1");
    a[9] = std::nanf("7");
    b = a;
    b[3] = -0.0f;                 // == in IEEE, a change in bits
    b[7] = std::nanf("2");        // another payload
    std::vector<uint8_t> ab(64 * 4), bb(64 * 4);
    std::memcpy(ab.data(), a.data(), ab.size());
    std::memcpy(bb.data(), b.data(), bb.size());
    delta::Changes ch;
    uint64_t hash;
    assert_true(delta::find_changes(bb.data(), ab.data(), bb.size(), 4, UINT64_MAX, nullptr, ch, &hash));
    assert_int_equal(ch.count, 2);
    assert_int_equal(ch.idx[0], 3);
    assert_int_equal(ch.idx[1], 7);  // the unchanged NaN at 9 is not a change
    round_trip(ab, bb, 4);
}

// The compare gives up within the 16 KiB block where the changes pass the limit, not at the
// end of the tensor (a tensor that changed wholesale costs one block of compare, not all of it).
void find_changes_stops_once_past_its_limit(void **) {
    for (const uint64_t esize : {1, 2, 4, 8, 3}) {
        std::vector<uint8_t> base(1 << 20, 0), now(1 << 20, 1);
        const uint64_t elements = now.size() / esize, per_block = (16 << 10) / esize;
        delta::Changes ch;
        uint64_t hash = 0;
        assert_false(delta::find_changes(now.data(), base.data(), elements * esize, esize, 10, nullptr, ch, &hash));
        assert_true(ch.count > 10);
        assert_true(ch.count <= per_block);
        assert_true(delta::find_changes(now.data(), base.data(), elements * esize, esize, elements, nullptr, ch, &hash));
        assert_int_equal(ch.count, elements);
        for (uint64_t k = 0; k < elements; ++k) assert_int_equal(ch.idx[k], k);
    }
}

void index_width_switches_at_two_to_the_32_elements(void **) {
    const uint64_t k32 = uint64_t(1) << 32;
    const uint64_t small[] = {0, k32 - 1};
    delta::IndexCoding c = delta::choose_coding(small, 2, k32);
    assert_int_equal(c.coding, delta::kPlain);
    assert_int_equal(c.width, 4);
    const uint64_t near[] = {5, k32 + 3, k32 + 10};  // gaps fit in 32 bits
    c = delta::choose_coding(near, 3, k32 + 20);
    assert_int_equal(c.coding, delta::kGaps);
    assert_int_equal(c.width, 4);
    const uint64_t far[] = {1, k32 + 1};  // a gap of exactly 2^32
    c = delta::choose_coding(far, 2, k32 + 20);
    assert_int_equal(c.coding, delta::kPlain);
    assert_int_equal(c.width, 8);
    assert_int_equal(delta::patch_bytes(3, 2, 4), 32 + 16 + 6);
    assert_int_equal(delta::patch_bytes(3, 2, 8), 32 + 24 + 6);
}

// A patch written by hand: header, indices, values.
std::vector<uint8_t> hand_patch(uint8_t coding, uint8_t width, uint32_t esize,
                                const std::vector<uint64_t> &ix, uint64_t elements) {
    const uint64_t n = ix.size();
    std::vector<uint8_t> p(delta::patch_bytes(n, esize, width), 0);
    const uint32_t magic = delta::kMagic;
    std::memcpy(p.data(), &magic, 4);  // little-endian hosts only, as the library
    p[4] = coding;
    p[5] = width;
    std::memcpy(p.data() + 8, &esize, 4);
    std::memcpy(p.data() + 16, &n, 8);
    std::memcpy(p.data() + 24, &elements, 8);
    for (size_t k = 0; k < n; ++k) std::memcpy(p.data() + 32 + k * width, &ix[k], width);
    return p;
}

void gap_coded_and_64_bit_patches_parse_to_absolute_indices(void **) {
    delta::Patch p = delta::parse(hand_patch(delta::kGaps, 4, 2, {3, 1, 10}, 100).data(),
                                  delta::patch_bytes(3, 2, 4), 100, 2, "t");
    assert_true((p.idx == std::vector<uint64_t>{3, 4, 14}));
    p = delta::parse(hand_patch(delta::kPlain, 8, 2, {0, 99}, 100).data(),
                     delta::patch_bytes(2, 2, 8), 100, 2, "t");
    assert_true((p.idx == std::vector<uint64_t>{0, 99}));
}

void expect_refused(const std::vector<uint8_t> &p, uint64_t elements, uint64_t esize,
                    const char *needle) {
    try {
        delta::parse(p.data(), p.size(), elements, esize, "tensor 'x'");
        fail_msg("a bad patch was accepted (%s)", needle);
    } catch (const Error &e) {
        assert_int_equal(e.status(), WSYNC_ERR_MALFORMED);
        if (!std::strstr(e.what(), needle)) fail_msg("'%s' does not mention '%s'", e.what(), needle);
    }
}

void malformed_patches_are_refused_by_name(void **) {
    std::vector<uint8_t> good = hand_patch(delta::kPlain, 4, 2, {1, 5}, 10);
    expect_refused(std::vector<uint8_t>(good.begin(), good.begin() + 20), 10, 2, "shorter than its header");
    std::vector<uint8_t> bad = good;
    bad[0] ^= 1;
    expect_refused(bad, 10, 2, "magic");
    bad = good, bad[5] = 3;
    expect_refused(bad, 10, 2, "unknown coding");
    expect_refused(good, 10, 4, "elements of 2 bytes");
    expect_refused(good, 11, 2, "tensor of 10 elements");
    expect_refused(std::vector<uint8_t>(good.begin(), good.end() - 1), 10, 2, "does not hold");
    expect_refused(hand_patch(delta::kPlain, 4, 2, {5, 5}, 10), 10, 2, "out of order");
    expect_refused(hand_patch(delta::kPlain, 4, 2, {5, 1}, 10), 10, 2, "out of order");
    expect_refused(hand_patch(delta::kPlain, 4, 2, {10}, 10), 10, 2, "outside the tensor");
    expect_refused(hand_patch(delta::kPlain, 8, 2, {7, 3}, 10), 10, 2, "out of order");
    expect_refused(hand_patch(delta::kPlain, 8, 2, {0, 12}, 10), 10, 2, "outside the tensor");
    expect_refused(hand_patch(delta::kGaps, 4, 2, {2, 0}, 10), 10, 2, "out of order");
    expect_refused(hand_patch(delta::kGaps, 8, 2, {2, UINT64_MAX}, 10), 10, 2, "out of order");
}

// wsync_recv_patch's in-place check (delta::check) refuses what parse() refuses, with the same
// words, and hands out flat indices: in place for plain coding (int32 up to 2^31 elements),
// decoded for gaps and for 32-bit wire indices of a tensor over 2^31 elements. The headers
// claim huge tensors; no tensor memory is needed.
std::vector<int64_t> checked_flat(const std::vector<uint8_t> &p, uint64_t elements, bool *in_place) {
    const delta::PatchView v = delta::check(p.data(), p.size(), elements, 2, "t");
    std::vector<int64_t> out(v.count);
    delta::flat_indices(v, out.data());
    *in_place = delta::flat_in_place(v, elements);
    return out;
}

void the_in_place_check_refuses_like_the_parser_and_decodes_every_coding(void **) {
    bool in_place = false;
    const uint64_t big = (uint64_t(1) << 34) + 5;  // gap coding's home: over 2^32 elements
    assert_true((checked_flat(hand_patch(delta::kGaps, 4, 2, {3, 1, 4000000000u, 4000000000u}, big),
                              big, &in_place) ==
                 std::vector<int64_t>{3, 4, 4000000004ll, 8000000004ll}));
    assert_false(in_place);
    assert_true((checked_flat(hand_patch(delta::kPlain, 8, 2, {0, big - 1}, big), big, &in_place) ==
                 std::vector<int64_t>{0, int64_t(big - 1)}));
    assert_true(in_place);  // int64 on the wire already
    const uint64_t mid = (uint64_t(1) << 31) + 10;  // 32-bit wire indices that int32 cannot hold
    assert_true((checked_flat(hand_patch(delta::kPlain, 4, 2, {7, (1u << 31) + 3}, mid), mid,
                              &in_place) == std::vector<int64_t>{7, (int64_t(1) << 31) + 3}));
    assert_false(in_place);
    assert_true((checked_flat(hand_patch(delta::kPlain, 4, 2, {1, 5}, 10), 10, &in_place) ==
                 std::vector<int64_t>{1, 5}));
    assert_true(in_place);
    const struct {
        std::vector<uint8_t> p;
        uint64_t elements;
        const char *needle;
    } bad[] = {
        {hand_patch(delta::kPlain, 4, 2, {5, 5}, 10), 10, "patch index 1 is out of order"},
        {hand_patch(delta::kPlain, 4, 2, {5, 1}, 10), 10, "patch index 1 is out of order"},
        {hand_patch(delta::kPlain, 4, 2, {1, 10}, 10), 10, "patch index 1 is out of order or outside the tensor"},
        {hand_patch(delta::kGaps, 4, 2, {2, 0}, big), big, "out of order"},
        {hand_patch(delta::kGaps, 8, 2, {2, UINT64_MAX}, 10), 10, "out of order"},
        {hand_patch(delta::kPlain, 8, 2, {4, 3}, 10), 10, "out of order"},
        {hand_patch(delta::kPlain, 4, 2, {1, 5}, 10), 11, "tensor of 10 elements"},
    };
    for (const auto &b : bad) {
        try {
            delta::check(b.p.data(), b.p.size(), b.elements, 2, "tensor 'x'");
            fail_msg("a bad patch was accepted (%s)", b.needle);
        } catch (const Error &e) {
            assert_int_equal(e.status(), WSYNC_ERR_MALFORMED);
            if (!std::strstr(e.what(), b.needle) || !std::strstr(e.what(), "tensor 'x'"))
                fail_msg("'%s' does not mention '%s'", e.what(), b.needle);
        }
    }
}

void a_patch_onto_the_wrong_base_or_with_a_wrong_result_leaves_the_destination_unchanged(void **) {
    std::vector<uint8_t> base = noise(5000 * 2, 9), now = base;
    for (size_t e = 0; e < 5000; e += 37) now[e * 2] ^= 0x40;
    delta::Changes ch;
    uint64_t hash = 0;
    std::vector<uint8_t> scratch = base;
    assert_true(delta::find_changes(now.data(), scratch.data(), now.size(), 2, UINT64_MAX, nullptr, ch, &hash));
    std::vector<uint8_t> patch, old;
    delta::encode(ch, 5000, patch);
    delta::Patch p = delta::parse(patch.data(), patch.size(), 5000, 2, "t");
    const uint64_t base_hash = XXH3_64bits(base.data(), base.size());

    std::vector<uint8_t> other = base;  // not the base: one element differs
    other[4001] ^= 1;
    const std::vector<uint8_t> before = other;
    uint64_t got = 0;
    assert_int_equal(int(delta::apply_verified(other.data(), other.size(), p, base_hash, hash, &got, old)),
                     int(delta::Applied::kBaseDiffers));
    assert_true(got == XXH3_64bits(before.data(), before.size()));
    assert_true(other == before);

    std::vector<uint8_t> dst = base;  // the base, but the patch's result checksum is wrong
    assert_int_equal(int(delta::apply_verified(dst.data(), dst.size(), p, base_hash, hash ^ 1, &got, old)),
                     int(delta::Applied::kResultDiffers));
    assert_true(got == hash);
    assert_true(dst == base);
}

// The apply judges by the result: a destination that differs from the base only in elements
// the patch overwrites ends as the trainer's tensor, bit for bit, and is kept; one that differs
// anywhere else is refused and put back, as is a result that is wrong although the base was
// right (each named by the hash that did not match).
void the_apply_keeps_a_result_equal_to_the_trainers_and_nothing_else(void **) {
    std::vector<uint8_t> base = noise(5000 * 2, 11), now = base;
    for (size_t e = 0; e < 5000; e += 37) now[e * 2] ^= 0x40;
    delta::Changes ch;
    uint64_t hash = 0;
    std::vector<uint8_t> scratch = base;
    assert_true(delta::find_changes(now.data(), scratch.data(), now.size(), 2, UINT64_MAX, nullptr, ch, &hash));
    std::vector<uint8_t> patch, old;
    delta::encode(ch, 5000, patch);
    delta::Patch p = delta::parse(patch.data(), patch.size(), 5000, 2, "t");
    const uint64_t base_hash = XXH3_64bits(base.data(), base.size());
    uint64_t got = 0;

    std::vector<uint8_t> dst = base;  // element 37 * 20 is one the patch writes
    dst[37 * 20 * 2 + 1] ^= 0x11;
    assert_int_equal(int(delta::apply_verified(dst.data(), dst.size(), p, base_hash, hash, &got, old)),
                     int(delta::Applied::kApplied));
    assert_true(dst == now);

    dst = base;  // element 37 * 20 + 1 is not
    dst[(37 * 20 + 1) * 2] ^= 0x11;
    const std::vector<uint8_t> before = dst;
    assert_int_equal(int(delta::apply_verified(dst.data(), dst.size(), p, base_hash, hash, &got, old)),
                     int(delta::Applied::kBaseDiffers));
    assert_true(got == XXH3_64bits(before.data(), before.size()));
    assert_true(dst == before);

    // A wrong result and a wrong base at once: the base is named (the engine is the one to fix).
    assert_int_equal(int(delta::apply_verified(dst.data(), dst.size(), p, base_hash, hash ^ 1, &got, old)),
                     int(delta::Applied::kBaseDiffers));
    assert_true(dst == before);
}

void scalars_and_odd_sizes_round_trip(void **) {
    for (size_t n : {1, 2, 5, 31, 32, 33, 63, 65, 16383, 16385}) {
        std::vector<uint8_t> base = noise(n, n), now = base;
        now[n - 1] ^= 0x80;
        now[0] ^= 0x01;
        round_trip(base, now, 1);
    }
    std::vector<uint8_t> b8 = noise(8, 1), n8 = b8;  // a 0-d double
    n8[7] ^= 0x80;
    round_trip(b8, n8, 8);
}

// A committed patch folded into the base by the next compare gives the same changes as a base
// that had it written in already.
void a_fold_during_the_compare_equals_a_fold_before_it(void **) {
    std::vector<uint8_t> v1 = noise(3 * 20000, 3), v2 = v1, v3;
    for (size_t e = 0; e < 20000; e += 17) v2[e * 3 + 1] ^= 0x11;
    v3 = v2;
    for (size_t e = 5; e < 20000; e += 23) v3[e * 3] ^= 0x22;
    delta::Changes c12, c23, direct;
    uint64_t h;
    std::vector<uint8_t> base = v1, patch;
    assert_true(delta::find_changes(v2.data(), base.data(), base.size(), 3, UINT64_MAX, nullptr, c12, &h));
    delta::encode(c12, 20000, patch);
    delta::Patch p = delta::parse(patch.data(), patch.size(), 20000, 3, "t");
    assert_true(delta::find_changes(v3.data(), base.data(), base.size(), 3, UINT64_MAX, &p, c23, &h));
    assert_true(base == v2);  // folded
    std::vector<uint8_t> b2 = v2;
    assert_true(delta::find_changes(v3.data(), b2.data(), b2.size(), 3, UINT64_MAX, nullptr, direct, &h));
    assert_int_equal(c23.count, direct.count);
    assert_memory_equal(c23.idx.data(), direct.idx.data(), direct.count * 8);
    assert_memory_equal(c23.values.data(), direct.values.data(), direct.count * 3);
}

// The compare at every element size against the slow way, over sizes that end inside a
// 64-element window and inside a 16 KiB block, with changes spread thin, in clusters (windows
// with more changed elements than the branch-free writer takes in one go: up to all 64), at the
// first and the last element, and folded from a previous patch on the way.
void the_compare_finds_exactly_the_changed_elements_at_every_density(void **) {
    uint64_t seed = 12345;
    auto rnd = [&seed] {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        return seed >> 33;
    };
    for (const size_t esize : {1, 2, 4, 8, 3, 16})
        for (const size_t elements : {size_t(1), size_t(63), size_t(64), size_t(65), size_t(8191),
                                      size_t(8193), size_t(70001)}) {
            const std::vector<uint8_t> v1 = noise(elements * esize, unsigned(esize + elements));
            std::vector<uint8_t> v2 = v1, v3;
            for (const unsigned per_mille : {0u, 1u, 10u, 300u, 1000u}) {
                v2 = v1;
                for (size_t e = 0; e < elements; ++e)
                    if (rnd() % 1000 < per_mille) v2[e * esize + rnd() % esize] ^= uint8_t(1 + rnd() % 255);
                for (size_t c = 0; c < 3 && elements > 64; ++c) {  // a cluster of up to 64 in a row
                    const size_t at = rnd() % (elements - 64), len = 1 + rnd() % 64;
                    for (size_t e = at; e < at + len; ++e) v2[e * esize] ^= 0x80;
                }
                v2[0] ^= 1;
                v2[(elements - 1) * esize + esize - 1] ^= 2;
                const std::vector<uint64_t> want = naive_changes(v2, v1, esize);
                std::vector<uint8_t> base = v1;
                delta::Changes ch;
                uint64_t h = 0;
                assert_true(delta::find_changes(v2.data(), base.data(), base.size(), esize, elements,
                                                nullptr, ch, &h));
                assert_int_equal(ch.count, want.size());
                for (size_t k = 0; k < want.size(); ++k) {
                    assert_int_equal(ch.idx[k], want[k]);
                    assert_memory_equal(ch.values.data() + k * esize, v2.data() + want[k] * esize, esize);
                }
                assert_int_equal(h, XXH3_64bits(v2.data(), v2.size()));
                // The same compare of v3 against v1 with v1 -> v2 folded in on the way.
                std::vector<uint8_t> patch;
                delta::encode(ch, elements, patch);
                const delta::Patch p = delta::parse(patch.data(), patch.size(), elements, esize, "t");
                v3 = v2;
                for (size_t e = 0; e < elements; e += 1 + rnd() % 97) v3[e * esize] ^= 0x04;
                delta::Changes folded;
                assert_true(delta::find_changes(v3.data(), base.data(), base.size(), esize, elements, &p,
                                                folded, &h));
                assert_true(base == v2);
                const std::vector<uint64_t> want3 = naive_changes(v3, v2, esize);
                assert_int_equal(folded.count, want3.size());
                assert_memory_equal(folded.idx.data(), want3.data(), want3.size() * 8);
            }
        }
}

// The trainer's bases: an abandoned version's staged bytes never reach them.
// A 1-D bfloat16 host tensor over d's bytes (shape borrowed).
wsync_tensor_t host_bf16(const char *name, std::vector<uint8_t> &d, int64_t *shape) {
    wsync_tensor_t t{};
    t.name = name;
    t.data = d.data();
    t.dtype = {WSYNC_DTYPE_BFLOAT, 16, 1};
    t.ndim = 1;
    t.shape = shape;
    t.device = {WSYNC_DEVICE_CPU, 0};
    return t;
}

void an_abandoned_version_leaves_the_trainers_base_intact(void **) {
    delta::Config cfg;
    cfg.mode = delta::Mode::kAuto;
    delta::Encoder enc(cfg);
    std::vector<uint8_t> a = noise(4096, 1), b = noise(4096, 2);
    const std::vector<uint8_t> a1 = a;
    int64_t shape[1] = {2048};
    auto tensor = [&](const char *name, std::vector<uint8_t> &d) { return host_bf16(name, d, shape); };
    auto send = [&](uint64_t v, std::vector<wsync_tensor_t> ts, bool commit) {
        std::vector<wsync_tensor_t> wire;
        std::vector<PatchInfo> patches;
        enc.encode(v, ts.data(), metas_from_chunk(ts.data(), ts.size(), true), wire, patches);
        enc.chunk_sent();
        if (commit) enc.commit(v);
        return std::make_pair(wire, patches);
    };
    send(1, {tensor("a", a), tensor("b", b)}, true);
    a[10] ^= 1;
    auto v2 = send(2, {tensor("a", a)}, false);
    assert_int_equal(v2.second[0].base_version, 1);  // a patch, staged
    enc.abandon();
    b[3] ^= 1;
    auto v3 = send(3, {tensor("b", b)}, true);
    assert_int_equal(v3.second[0].wire_bytes, 0);  // dense after the abandon
    // a, absent from the dense version 3, is dense at its next send too: an engine may hold
    // the abandoned version's patch of it (in-place loaders), so no base of it is trusted
    // (delta user trial: patches against such bases reached engines that apply them unchecked).
    a[20] ^= 1;
    auto v4 = send(4, {tensor("a", a)}, true);
    assert_int_equal(v4.second[0].wire_bytes, 0);
    const std::vector<uint8_t> a4 = a;
    a[30] ^= 1;
    auto v5 = send(5, {tensor("a", a), tensor("b", b)}, true);
    const PatchInfo &p = v5.second[0];
    assert_true(p.wire_bytes > 0);
    assert_int_equal(p.base_version, 4);
    assert_true(p.base_xxh3 == XXH3_64bits(a4.data(), a4.size()));  // a as committed in v4
    assert_true(v5.second[1].wire_bytes > 0);  // b, dense in v3, unchanged since: a patch
    delta::Patch parsed = delta::parse(static_cast<const uint8_t *>(v5.first[0].data), p.wire_bytes,
                                       2048, 2, "a");
    std::vector<uint8_t> dst = a4, old;
    uint64_t got;
    assert_int_equal(int(delta::apply_verified(dst.data(), dst.size(), parsed, p.base_xxh3,
                                               p.result_xxh3, &got, old)),
                     int(delta::Applied::kApplied));
    assert_true(dst == a);
    assert_true(a1 != a4);
}

// After a dense version (here: the first one after a receiver failed) every tensor's next send
// is dense, also those the dense version did not carry; a tensor sent dense since is patched
// again. Versions of subsets of the model, as trainers that send only what changed do.
void after_a_dense_version_every_tensor_goes_dense_once_even_those_it_did_not_carry(void **) {
    delta::Config cfg;
    cfg.mode = delta::Mode::kOn;
    delta::Encoder enc(cfg);
    std::vector<uint8_t> a = noise(4096, 3), b = noise(4096, 4);
    int64_t shape[1] = {2048};
    auto tensor = [&](const char *name, std::vector<uint8_t> &d) { return host_bf16(name, d, shape); };
    auto patched = [&](uint64_t v, std::vector<wsync_tensor_t> ts) {
        std::vector<wsync_tensor_t> wire;
        std::vector<PatchInfo> patches;
        enc.encode(v, ts.data(), metas_from_chunk(ts.data(), ts.size(), true), wire, patches);
        enc.chunk_sent();
        enc.commit(v);
        std::vector<bool> out;
        for (const PatchInfo &p : patches) out.push_back(p.wire_bytes > 0);
        return out;
    };
    assert_true(patched(1, {tensor("a", a), tensor("b", b)}) == std::vector<bool>({false, false}));
    a[1] ^= 1, b[1] ^= 1;
    assert_true(patched(2, {tensor("a", a), tensor("b", b)}) == std::vector<bool>({true, true}));
    enc.dense_next();  // a receiver failed version 2, or re-attached
    a[2] ^= 1;
    assert_true(patched(3, {tensor("a", a)}) == std::vector<bool>({false}));
    b[2] ^= 1;
    a[3] ^= 1;
    // b was not in version 3: dense now; a was dense in version 3: a patch.
    assert_true(patched(4, {tensor("a", a), tensor("b", b)}) == std::vector<bool>({true, false}));
    a[4] ^= 1, b[4] ^= 1;
    assert_true(patched(5, {tensor("a", a), tensor("b", b)}) == std::vector<bool>({true, true}));
}

}  // namespace

// The warp's schedule of XXH3's long path (xxh3.h, hash_long_by_lanes: 32 threads' sums over 4
// stripes a round, reduced as delta.cu's shuffles reduce them) is XXH3_64bits at every length
// from 241 to 4160, around the 1 KiB block edges up to 64 KiB + 1, and at unaligned addresses;
// the fake driver hashes pieces and verdicts with it, so the kernels' decomposition is what
// every GPU test on the fake runs.
void the_warp_schedule_of_xxh3_equals_the_librarys_at_every_length(void **) {
    const std::vector<uint8_t> b = noise(70000 + 16, 98);
    std::vector<size_t> lengths;
    for (size_t n = 0; n <= 4160; ++n) lengths.push_back(n);
    for (size_t k = 5; k <= 64; ++k)
        for (size_t d : {1023, 1024, 1025}) lengths.push_back(k * 1024 + d - 1024);
    lengths.push_back(65535);
    lengths.push_back(65536);
    for (size_t off : {0, 1, 6, 8}) {
        for (size_t n : lengths) {
            const uint64_t got = wsync_xxh3::hash64_by_lanes(b.data() + off, n);
            if (got != XXH3_64bits(b.data() + off, n)) print_message("length %zu at offset %zu differs\n", n, off);
            assert_true(got == XXH3_64bits(b.data() + off, n));
        }
    }
}

// The XXH3-64 the GPU kernels compile (src/gpu/kernels/xxh3.h, here built for the host) is the
// library's XXH3_64bits at every length up to 4160 (each short-input path, both mid-size ones,
// every stripe count of the long path's first blocks), around the 1 KiB block edges up to 64 KiB
// + 1 and at unaligned addresses; and the tree hash is XXH3 over the pieces' hashes.
void the_device_xxh3_equals_the_librarys_at_every_length(void **) {
    const std::vector<uint8_t> b = noise(70000 + 16, 99);
    std::vector<size_t> lengths;
    for (size_t n = 0; n <= 4160; ++n) lengths.push_back(n);
    for (size_t k = 5; k <= 64; ++k)
        for (size_t d : {1023, 1024, 1025}) lengths.push_back(k * 1024 + d - 1024);
    lengths.push_back(65535);
    lengths.push_back(65536);
    lengths.push_back(65537);
    size_t checked = 0;
    for (size_t off : {0, 1, 3, 8}) {
        for (size_t n : lengths) {
            const uint64_t want = XXH3_64bits(b.data() + off, n);
            const uint64_t got = wsync_xxh3::hash64(b.data() + off, n);
            if (got != want) print_message("length %zu at offset %zu differs\n", n, off);
            assert_true(got == want);
            ++checked;
        }
    }
    assert_true(checked > 4 * 4160);
    // The word table the device reads is the secret's bytes at every offset.
    for (unsigned off = 0; off + 8 <= 192; ++off) {
        uint64_t want;
        std::memcpy(&want, wsync_xxh3::kSecret + off, 8);
        assert_true(wsync_xxh3::key64(off) == want);
    }
    // The tree hash: pieces of 64 KiB, combined as little-endian words.
    for (size_t n : {size_t(0), size_t(1), size_t(65536), size_t(65537), size_t(70000)}) {
        std::vector<uint64_t> h;
        for (size_t at = 0; at < n; at += 65536) h.push_back(XXH3_64bits(b.data() + at, std::min<size_t>(65536, n - at)));
        assert_true(delta::tree_hash(b.data(), n) == XXH3_64bits(h.data(), h.size() * 8));
        assert_true(delta::combine_piece_hashes(h.data(), h.size()) == delta::tree_hash(b.data(), n));
    }
    // More than the 512 pieces tree_hash combines at a time (33 MiB of zeros and a flipped byte).
    std::vector<uint8_t> big(size_t(33) << 20, 0);
    big[size_t(32) << 20] = 1;
    std::vector<uint64_t> h;
    for (size_t at = 0; at < big.size(); at += 65536) h.push_back(XXH3_64bits(big.data() + at, 65536));
    assert_true(delta::tree_hash(big.data(), big.size()) == XXH3_64bits(h.data(), h.size() * 8));
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(changes_at_every_element_size_match_a_bytewise_comparison),
        cmocka_unit_test(nan_payloads_and_signed_zeros_are_changes),
        cmocka_unit_test(find_changes_stops_once_past_its_limit),
        cmocka_unit_test(index_width_switches_at_two_to_the_32_elements),
        cmocka_unit_test(gap_coded_and_64_bit_patches_parse_to_absolute_indices),
        cmocka_unit_test(malformed_patches_are_refused_by_name),
        cmocka_unit_test(the_in_place_check_refuses_like_the_parser_and_decodes_every_coding),
        cmocka_unit_test(a_patch_onto_the_wrong_base_or_with_a_wrong_result_leaves_the_destination_unchanged),
        cmocka_unit_test(the_apply_keeps_a_result_equal_to_the_trainers_and_nothing_else),
        cmocka_unit_test(scalars_and_odd_sizes_round_trip),
        cmocka_unit_test(a_fold_during_the_compare_equals_a_fold_before_it),
        cmocka_unit_test(the_compare_finds_exactly_the_changed_elements_at_every_density),
        cmocka_unit_test(the_device_xxh3_equals_the_librarys_at_every_length),
        cmocka_unit_test(the_warp_schedule_of_xxh3_equals_the_librarys_at_every_length),
        cmocka_unit_test(an_abandoned_version_leaves_the_trainers_base_intact),
        cmocka_unit_test(after_a_dense_version_every_tensor_goes_dense_once_even_those_it_did_not_carry),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
