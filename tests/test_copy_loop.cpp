// The copy loop itself (src/copy/copy.cpp), white-box: every small size at every relative alignment
// in both directions, the hashing copy against XXH3 of the whole source, and the pool.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "copy/copy.hpp"
#include "whitebox.hpp"

namespace {

// Copies n bytes from src offset so to dst offset do inside page-aligned buffers and checks the
// bytes and that nothing around the destination changed.
void check_copy(size_t n, size_t so, size_t dof, void (*fn)(void *, const void *, size_t)) {
    const size_t cap = n + 3 * 4096;
    auto *src = static_cast<uint8_t *>(aligned_alloc(4096, (cap + 4095) / 4096 * 4096));
    auto *dst = static_cast<uint8_t *>(aligned_alloc(4096, (cap + 4095) / 4096 * 4096));
    std::vector<uint8_t> data = noise(n, n * 31 + so * 7 + dof);
    if (n) std::memcpy(src + so, data.data(), n);  // data() may be null when n is 0
    std::memset(dst, 0xEE, cap);
    fn(dst + dof, src + so, n);
    if (n && std::memcmp(dst + dof, data.data(), n) != 0)
        fail_msg("n %zu src+%zu dst+%zu: bytes differ", n, so, dof);
    for (size_t i = 0; i < dof; ++i)
        if (dst[i] != 0xEE) fail_msg("n %zu src+%zu dst+%zu: wrote before dst", n, so, dof);
    for (size_t i = dof + n; i < cap; ++i)
        if (dst[i] != 0xEE) fail_msg("n %zu src+%zu dst+%zu: wrote past dst", n, so, dof);
    std::free(src);
    std::free(dst);
}

void plain(void *d, const void *s, size_t n) { wsync::copy::copy_bytes(d, s, n); }

void copy_is_exact_for_small_sizes_at_every_relative_alignment(void **) {
    // Destination offsets either side of the direction switch (dst 1..2048 ahead goes backward).
    const size_t dofs[] = {0, 1, 16, 31, 32, 64, 255, 2047, 2048, 2049, 4000, 4095};
    for (size_t n = 0; n <= 300; ++n)
        for (size_t so : {size_t(0), size_t(1), size_t(33)})
            for (size_t dof : dofs) check_copy(n, so, dof, plain);
}

void copy_is_exact_for_large_sizes_in_both_directions(void **) {
    const size_t sizes[] = {4096, 65536 + 7, (size_t(1) << 20) + 3,
                            wsync::copy::nt_threshold() + 4099};  // non-temporal
    for (size_t n : sizes)
        for (size_t dof : {size_t(0), size_t(16), size_t(64), size_t(2048), size_t(3000)})
            check_copy(n, 0, dof, plain);
}

void hashing_copy_returns_the_hash_of_the_whole_source_and_copies_the_range(void **) {
    const size_t n = 100003;
    std::vector<uint8_t> src = noise(n, 5);
    const uint64_t want = XXH3_64bits(src.data(), n);
    const uint64_t ranges[][2] = {{0, n}, {0, 0}, {1, 1}, {16383, 2}, {50000, 50003}, {n - 1, 1}};
    for (auto &r : ranges) {
        std::vector<uint8_t> dst(r[1] + 1, 0xEE);
        assert_true(wsync::copy::copy_hashing(dst.data(), src.data(), n, r[0], r[1]) == want);
        assert_memory_equal(dst.data(), src.data() + r[0], r[1]);
        assert_int_equal(dst[r[1]], 0xEE);
    }
    assert_true(wsync::copy::hash_bytes(src.data(), n) == want);
}

void hashing_copy_of_whole_tensors_equals_xxh3_at_every_size_and_alignment(void **) {
    // Around XXH3's 240-byte short/long switch, its 64-byte stripes and 1024-byte blocks.
    const size_t sizes[] = {1,    63,   64,   65,   240,  241,  255,  256,  257,  1023,
                            1024, 1025, 1087, 1088, 1089, 2048, 4097, 65536, 100003, 3000001};
    for (size_t n : sizes)
        for (size_t dof : {size_t(0), size_t(1), size_t(16), size_t(31), size_t(64), size_t(2048)}) {
            std::vector<uint8_t> src = noise(n + 7, n);
            std::vector<uint8_t> dst(n + dof + 64, 0xEE);
            uint64_t got = wsync::copy::copy_hashing(dst.data() + dof, src.data() + 7, n, 0, n);
            if (got != XXH3_64bits(src.data() + 7, n)) fail_msg("n %zu dst+%zu: hash differs", n, dof);
            if (std::memcmp(dst.data() + dof, src.data() + 7, n) != 0)
                fail_msg("n %zu dst+%zu: bytes differ", n, dof);
            for (size_t i = 0; i < dof; ++i) assert_int_equal(dst[i], 0xEE);
            for (size_t i = dof + n; i < dst.size(); ++i) assert_int_equal(dst[i], 0xEE);
        }
}

void pool_copy_is_exact_when_split_between_threads(void **) {
    wsync::copy::Pool pool(3);
    auto fn = [](void *d, const void *s, size_t n) {
        static wsync::copy::Pool p(3);
        p.copy(d, s, n);
    };
    check_copy((size_t(24) << 20) + 5, 0, 16, fn);
    check_copy((size_t(9) << 20) + 1, 64, 4095, fn);
    assert_int_equal(pool.threads(), 3);
}

// The tree hash from its definition (docs/wire-format.md "tree"), independent of src/copy/copy.cpp.
uint64_t tree_by_definition(const uint8_t *p, size_t n) {
    std::vector<uint8_t> le;
    for (size_t at = 0; at < n; at += 65536) {
        const uint64_t h = XXH3_64bits(p + at, std::min<size_t>(65536, n - at));
        for (int i = 0; i < 8; ++i) le.push_back(uint8_t(h >> (8 * i)));
    }
    return XXH3_64bits(le.data(), le.size());
}

// Around the piece size, the 512-piece batches of the one-thread loop, and the 8 MiB from which
// the pool splits; whole copies and ranges that start and end inside, on and across pieces; one
// thread, and three (the caller's and two workers), which must give the same value.
void tree_hashing_copy_equals_the_definition_on_one_thread_and_on_three(void **) {
    // Static: a failed assertion leaves the test by longjmp, and a pool on the stack would keep
    // its threads on memory the next test reuses.
    static wsync::copy::Pool one(1), three(3);
    const size_t sizes[] = {0,      1,      241,    65535,          65536,
                            65537,  131072, 200001, (size_t(32) << 20) + 65536 * 3 + 17,
                            (size_t(8) << 20) - 1,  (size_t(8) << 20) + 1, (size_t(12) << 20) + 4099};
    for (size_t n : sizes) {
        std::vector<uint8_t> src = noise(n + 64, n + 1);
        const uint8_t *s = src.data() + 64;  // torch's alignment
        const uint64_t want = tree_by_definition(s, n);
        assert_true(wsync::copy::tree_hash(s, n) == want);
        assert_true(one.tree_hash(s, n) == want);
        assert_true(three.tree_hash(s, n) == want);
        const size_t ranges[][2] = {{0, n}, {0, n / 2}, {n / 3, n - n / 3}, {n ? n - 1 : 0, n ? size_t(1) : size_t(0)},
                                    {std::min<size_t>(n, 65535), n > 65535 ? std::min<size_t>(n - 65535, 2) : 0}};
        for (auto &r : ranges)
            for (wsync::copy::Pool *pool : {&one, &three})
                for (size_t dof : {size_t(0), size_t(16), size_t(64)}) {
                    std::vector<uint8_t> dst(r[1] + dof + 64, 0xEE);
                    const uint64_t got = pool->copy_tree_hashing(dst.data() + dof, s, n, r[0], r[1]);
                    if (got != want)
                        fail_msg("n %zu range [%zu, +%zu) %u threads: tree hash differs", n, r[0], r[1],
                                 pool->threads());
                    if (r[1] && std::memcmp(dst.data() + dof, s + r[0], r[1]) != 0)
                        fail_msg("n %zu range [%zu, +%zu) %u threads: bytes differ", n, r[0], r[1],
                                 pool->threads());
                    for (size_t i = 0; i < dof; ++i) assert_int_equal(dst[i], 0xEE);
                    for (size_t i = dof + r[1]; i < dst.size(); ++i) assert_int_equal(dst[i], 0xEE);
                }
    }
}

// One flipped byte anywhere changes the tree hash, whichever thread hashes its piece.
void a_flipped_byte_in_any_piece_changes_the_tree_hash(void **) {
    static wsync::copy::Pool three(3);  // static: see above
    const size_t n = (size_t(16) << 20) + 333;
    std::vector<uint8_t> src = noise(n, 9), dst(n);
    const uint64_t clean = three.copy_tree_hashing(dst.data(), src.data(), n, 0, n);
    for (size_t at : {size_t(0), size_t(65535), size_t(65536), n / 2, n - 1}) {
        src[at] ^= 0x10;
        if (three.copy_tree_hashing(dst.data(), src.data(), n, 0, n) == clean)
            fail_msg("a flip at byte %zu left the tree hash unchanged", at);
        if (three.tree_hash(src.data(), n) == clean) fail_msg("tree_hash missed byte %zu", at);
        src[at] ^= 0x10;
    }
    assert_true(three.tree_hash(src.data(), n) == clean);
}

}  // namespace

// Another process writing the source while an engine copies it out with verification
// (adversarial trial: a piece's last 32 bytes toggled between garbage and the original were
// committed as garbage under a matching hash, because the copy stored them from an earlier load
// than the one the hash read). A writer thread flips chosen bytes back and forth; whatever it
// does, a copy whose hash equals the true source's hash holds exactly the true bytes, and the
// race is seen to happen (some copies are refused by their hash). `run` copies and returns the
// hash; `want` is the hash of the true source.
template <class Run>
void under_a_racing_writer(const char *what, uint8_t *src, size_t n, std::vector<size_t> at,
                           uint64_t want, const uint8_t *dst, size_t off, size_t len, Run run) {
    const std::vector<uint8_t> truth(src, src + n);
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        while (!stop.load(std::memory_order_relaxed))
            for (size_t x : at) __atomic_fetch_xor(src + x, uint8_t(0x5a), __ATOMIC_RELAXED);
    });
    size_t refused = 0, verified = 0, wrong = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < until && (refused < 200 || verified < 200)) {
        if (run() != want) {
            ++refused;
            continue;
        }
        ++verified;
        if (std::memcmp(dst, truth.data() + off, len) != 0) ++wrong;
    }
    stop.store(true);
    writer.join();
    std::memcpy(src, truth.data(), n);
    if (wrong) fail_msg("%s: %zu of %zu verified copies differ from the source", what, wrong, verified);
    if (refused == 0) fail_msg("%s: the writer never raced a copy (%zu copies)", what, verified);
}

void a_verified_copy_holds_what_was_hashed_while_another_process_writes_the_source(void **) {
    const size_t n = 65536;  // one tree piece
    auto *src = static_cast<uint8_t *>(aligned_alloc(4096, n + 4096));
    auto *dst = static_cast<uint8_t *>(aligned_alloc(4096, n + 4096));
    std::vector<uint8_t> data = noise(n, 99);
    std::memcpy(src, data.data(), n);
    std::vector<size_t> at;  // the first and last stripe's ends, a block's edge, a middle stripe
    for (size_t x : {size_t(0), size_t(16352), size_t(16384), size_t(33000), n - 32})
        for (size_t k = 0; k < 32; ++k) at.push_back(x + k);
    const uint64_t whole = XXH3_64bits(data.data(), n);
    for (size_t dof : {size_t(0), size_t(64), size_t(16), size_t(3)})  // aligned (one load), and not
        under_a_racing_writer(dof < 32 && dof ? "whole, dst unaligned" : "whole, dst aligned", src, n,
                              at, whole, dst + dof, 0, n, [&] {
                                  return wsync::copy::copy_hashing(dst + dof, src, n, 0, n);
                              });
    under_a_racing_writer("a range", src, n, at, whole, dst, 16000, 20000, [&] {
        return wsync::copy::copy_hashing(dst, src, n, 16000, 20000);
    });
    const std::vector<size_t> small_at = {0, 100, 199};
    under_a_racing_writer("200 bytes", src, 200, small_at, XXH3_64bits(data.data(), 200), dst, 0,
                          200, [&] { return wsync::copy::copy_hashing(dst, src, 200, 0, 200); });
    std::free(src);
    std::free(dst);
    // The tree hash's pieces, split between two threads as a receiver's large verified copies are.
    const size_t big = size_t(9) << 20;
    auto *bsrc = static_cast<uint8_t *>(aligned_alloc(4096, big));
    auto *bdst = static_cast<uint8_t *>(aligned_alloc(4096, big));
    std::vector<uint8_t> bdata = noise(big, 7);
    std::memcpy(bsrc, bdata.data(), big);
    std::vector<size_t> bat;
    for (size_t p : {size_t(0), size_t(70), size_t(143)})  // pieces' last 32 bytes
        for (size_t k = 0; k < 32; ++k) bat.push_back((p + 1) * 65536 - 32 + k);
    wsync::copy::Pool pool(2);
    under_a_racing_writer("tree, two threads", bsrc, big, bat, wsync::copy::tree_hash(bdata.data(), big),
                          bdst, 0, big, [&] { return pool.copy_tree_hashing(bdst, bsrc, big, 0, big); });
    std::free(bsrc);
    std::free(bdst);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(copy_is_exact_for_small_sizes_at_every_relative_alignment),
        cmocka_unit_test(copy_is_exact_for_large_sizes_in_both_directions),
        cmocka_unit_test(hashing_copy_returns_the_hash_of_the_whole_source_and_copies_the_range),
        cmocka_unit_test(hashing_copy_of_whole_tensors_equals_xxh3_at_every_size_and_alignment),
        cmocka_unit_test(pool_copy_is_exact_when_split_between_threads),
        cmocka_unit_test(tree_hashing_copy_equals_the_definition_on_one_thread_and_on_three),
        cmocka_unit_test(a_flipped_byte_in_any_piece_changes_the_tree_hash),
        cmocka_unit_test(a_verified_copy_holds_what_was_hashed_while_another_process_writes_the_source),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
