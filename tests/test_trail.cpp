// The trainer's half of checksums that follow the bytes (src/transport/ucx/trail.hpp), white
// box: whatever order and slices the streams write a chunk in, the sums are each entry's tree
// hash (copy::tree_hash) of the bytes as they were when first written whole; a piece is hashed
// as sent only once one engine's run of bytes holds it whole, and then never again.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "copy/copy.hpp"
#include "tensor.hpp"
#include "transport/ucx/trail.hpp"
#include "whitebox.hpp"

namespace {

using wsync::TensorTable;
using wsync::ucx::Trail;

uint64_t lcg(uint64_t &s) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
}

// A chunk of `n` entries of random sizes (empty, under a piece, several pieces), packed at
// 256-byte offsets; with `shuffled` the table lists them in another order than their bytes.
TensorTable random_table(uint64_t &seed, std::size_t n, bool shuffled, uint64_t *bytes) {
    TensorTable t;
    uint64_t off = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const uint64_t kind = lcg(seed) % 4;
        const uint64_t nb = kind == 0 ? 0 : kind == 1 ? lcg(seed) % 5000 : lcg(seed) % (300 << 10);
        wsync::TensorMeta m{};
        m.name = "t" + std::to_string(i);
        m.nbytes = nb;
        t.metas.push_back(m);
        t.offsets.push_back(off);
        off = (off + nb + 255) / 256 * 256;
    }
    if (shuffled)
        for (std::size_t i = n; i > 1; --i) {
            const std::size_t j = lcg(seed) % i;
            std::swap(t.metas[i - 1], t.metas[j]);
            std::swap(t.offsets[i - 1], t.offsets[j]);
        }
    *bytes = off;
    return t;
}

uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int b = 0; b < 8; ++b) v |= uint64_t(p[b]) << (8 * b);
    return v;
}

void sums_match(Trail &trail, const TensorTable &t, const std::vector<uint8_t> &bytes) {
    const std::vector<uint8_t> all = trail.sums(0, t.metas.size());
    assert_int_equal(all.size(), t.metas.size() * 8);
    for (std::size_t i = 0; i < t.metas.size(); ++i)
        assert_true(le64(all.data() + i * 8) == wsync::copy::tree_hash(bytes.data() + t.offsets[i], t.metas[i].nbytes));
}

void whatever_order_and_slices_the_streams_write_in_the_sums_are_each_entrys_tree_hash(void **) {
    uint64_t seed = 7;
    for (int round = 0; round < 60; ++round) {
        uint64_t size = 0;
        const TensorTable t = random_table(seed, 1 + lcg(seed) % 12, round % 3 == 2, &size);
        const std::vector<uint8_t> bytes = noise(size + 1, uint64_t(round) + 1);
        Trail trail(bytes.data(), t);
        assert_int_equal(trail.entries(), t.metas.size());
        // Two engines, each pulling the chunk in pieces of its own, in slices as a stream
        // writes them, interleaved; some rounds skip a stretch (a selection's ranges).
        uint64_t at[2] = {0, 0};
        const uint64_t piece = 1 + lcg(seed) % (1 << 20), slice = 1 + lcg(seed) % (300 << 10);
        while (at[0] < size || at[1] < size) {
            const uint32_t to = static_cast<uint32_t>(lcg(seed) % 2);
            if (at[to] >= size) continue;
            if (round % 4 == 3 && lcg(seed) % 8 == 0) at[to] = std::min(size, at[to] + lcg(seed) % 100000);
            const uint64_t end = std::min({size, at[to] + slice, (at[to] / piece + 1) * piece});
            if (end > at[to]) trail.written(to, at[to], end);
            at[to] = end;
        }
        sums_match(trail, t, bytes);
        // Any range of entries, asked for again: the same sums.
        const std::size_t first = lcg(seed) % t.metas.size(), count = 1 + lcg(seed) % (t.metas.size() - first);
        const std::vector<uint8_t> some = trail.sums(first, count);
        const std::vector<uint8_t> all = trail.sums(0, t.metas.size());
        assert_memory_equal(some.data(), all.data() + first * 8, count * 8);
        assert_true(trail.complete());
    }
}

void a_piece_is_hashed_once_one_engines_run_holds_it_whole_and_keeps_those_bytes(void **) {
    // Two entries of three pieces each (64 KiB), back to back.
    TensorTable t;
    for (int i = 0; i < 2; ++i) {
        wsync::TensorMeta m{};
        m.name = i ? "b" : "a";
        m.nbytes = 3 * wsync::copy::kTreePieceBytes;
        t.metas.push_back(m);
        t.offsets.push_back(uint64_t(i) * 3 * wsync::copy::kTreePieceBytes);
    }
    const uint64_t P = wsync::copy::kTreePieceBytes, size = 6 * P;
    std::vector<uint8_t> bytes = noise(size, 3);
    const std::vector<uint8_t> sent = bytes;
    Trail trail(bytes.data(), t);
    assert_false(trail.ready(0, 1));
    trail.written(0, 0, P + 100);          // engine 0: piece 0 whole, piece 1 begun
    trail.written(1, 2 * P, 4 * P);        // engine 1 starts elsewhere: pieces 2 and 3 whole in its run
    assert_false(trail.ready(0, 1));       // piece 1 of "a" is whole in no run yet
    trail.written(0, 5 * P, 6 * P);        // engine 0 skips ahead: its run restarts, piece 5 whole
    trail.written(0, 6 * P, 6 * P);        // an empty slice changes nothing
    trail.written(1, 4 * P + 10, 5 * P);   // a gap: piece 4 began before engine 1's new run
    assert_false(trail.ready(1, 1));
    trail.written(0, P + 100, 2 * P);      // not after engine 0's run (it ended at 6P): piece 1 begins before
    assert_false(trail.ready(0, 1));
    assert_false(trail.complete());
    trail.written(1, P, 2 * P);            // engine 1: piece 1 whole in one slice
    assert_true(trail.ready(0, 1));
    // What was hashed is what the sums say, whatever the bytes are later (an arena written
    // after its first send): the later engines' checks catch the difference.
    bytes[10] ^= 1;
    bytes[3 * P + 10] ^= 1;  // piece 3 ("b"), hashed as sent
    bytes[4 * P + 10] ^= 1;  // piece 4 ("b"), not hashed yet: taken as it is now
    std::vector<uint8_t> want = sent;
    want[4 * P + 10] ^= 1;
    sums_match(trail, t, want);
    assert_true(trail.complete());
}

}  // namespace

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whatever_order_and_slices_the_streams_write_in_the_sums_are_each_entrys_tree_hash),
        cmocka_unit_test(a_piece_is_hashed_once_one_engines_run_holds_it_whole_and_keeps_those_bytes),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
