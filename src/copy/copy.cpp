#include "copy/copy.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "copy/kernels.hpp"
#include "sys.hpp"

namespace wsync {
namespace copy {

bool have_avx2() noexcept {
#if defined(__x86_64__)
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes;
#else
    return false;
#endif
}

std::size_t nt_threshold() noexcept {
    // Past the core's own cache the destination would only evict what the engine uses; streamed
    // copies measured 1.3-1.5x faster than cached ones from 1 MiB on (docs/data-path.md).
    static const std::size_t t = [] {
        long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
        return l2 > 0 ? std::max<std::size_t>(std::size_t(l2), 256 << 10) : std::size_t(1) << 20;
    }();
    return t;
}

void copy_bytes(void *dst, const void *src, std::size_t n) noexcept {
#if defined(__x86_64__)
    if (have_avx2())
        return kernels::avx2_copy(static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src),
                                  n, n >= nt_threshold());
#endif
    std::memcpy(dst, src, n);
}

uint64_t hash_bytes(const void *data, uint64_t n) noexcept {
#if defined(__x86_64__)
    if (have_avx2()) return kernels::avx2_hash(data, n);
#endif
    return XXH3_64bits(data, n);
}

namespace {
uint64_t copy_hashing_nt(void *dst, const void *src, uint64_t total, uint64_t off, uint64_t len,
                         bool nt, bool fence = true) noexcept {
#if defined(__x86_64__)
    if (have_avx2())
        return kernels::avx2_copy_hashing(static_cast<uint8_t *>(dst),
                                          static_cast<const uint8_t *>(src), total, off, len, nt,
                                          fence);
#endif
    (void)fence;
    (void)nt;
    // Each block read once from the source, into a private buffer that the hash and the copy
    // both read: what reaches dst is what was hashed, whatever writes the source meanwhile.
    alignas(64) uint8_t buf[kernels::kHashBlock];
    const uint8_t *s = static_cast<const uint8_t *>(src);
    uint8_t *d = static_cast<uint8_t *>(dst) - off;
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (uint64_t at = 0; at < total; at += kernels::kHashBlock) {
        const uint64_t n = std::min(kernels::kHashBlock, total - at);
        const uint64_t lo = std::max(at, off), hi = std::min(at + n, off + len);
        if (lo >= hi) {
            XXH3_64bits_update(&state, s + at, n);
            continue;
        }
        std::memcpy(buf, s + at, n);
        XXH3_64bits_update(&state, buf, n);
        std::memcpy(d + lo, buf + (lo - at), hi - lo);
    }
    return XXH3_64bits_digest(&state);
}

// The pieces' hashes as the tree hash reads them: little-endian words.
void to_little_endian(uint64_t *h, uint64_t count) noexcept {
    if (kLittleEndian) return;
    for (uint64_t i = 0; i < count; ++i) {
        uint8_t b[8];
        for (int k = 0; k < 8; ++k) b[k] = uint8_t(h[i] >> (8 * k));
        std::memcpy(h + i, b, 8);
    }
}

// Piece p of the `total` bytes at s: its XXH3-64, copying its share of [off, off + len) to
// d + x for each source byte x of it (d = dst - off) from the same loads.
uint64_t piece_hash(uint8_t *d, const uint8_t *s, uint64_t total, uint64_t p, uint64_t off,
                    uint64_t len, bool copy, bool nt) noexcept {
    const uint64_t at = p * kTreePieceBytes, n = std::min(kTreePieceBytes, total - at);
    const uint64_t lo = std::max(at, off), hi = std::min(at + n, off + len);
    if (!copy || lo >= hi) return hash_bytes(s + at, n);
    return copy_hashing_nt(d + lo, s + at, n, lo - at, hi - lo, nt, /*fence=*/false);
}

// Makes a thread's non-temporal stores (piece_hash leaves them unfenced) globally visible
// before what it does next, as every other copy here does at its end.
void store_fence(bool nt) noexcept {
#if defined(__x86_64__)
    if (nt) __builtin_ia32_sfence();
#else
    (void)nt;
#endif
}

// The tree hash of the `total` bytes at s on the calling thread, copying [off, off + len) to
// dst when `copy`: 512 pieces (32 MiB) at a time, combined as they come.
uint64_t tree_sequential(void *dst, const void *src, uint64_t total, uint64_t off, uint64_t len,
                         bool copy, bool nt) noexcept {
    uint8_t *d = static_cast<uint8_t *>(dst) - off;
    const auto *s = static_cast<const uint8_t *>(src);
    const uint64_t pieces = (total + kTreePieceBytes - 1) / kTreePieceBytes;
    uint64_t h[512];
    if (pieces <= 512) {  // up to 32 MiB, nearly every tensor: one XXH3 call, no streaming state
        for (uint64_t p = 0; p < pieces; ++p) h[p] = piece_hash(d, s, total, p, off, len, copy, nt);
        to_little_endian(h, pieces);
        store_fence(nt);
        return hash_bytes(h, pieces * sizeof(uint64_t));
    }
    XXH3_state_t state;
    XXH3_64bits_reset(&state);
    for (uint64_t p = 0; p < pieces;) {
        unsigned k = 0;
        for (; k < 512 && p < pieces; ++k, ++p) h[k] = piece_hash(d, s, total, p, off, len, copy, nt);
        to_little_endian(h, k);
        XXH3_64bits_update(&state, h, k * sizeof(uint64_t));
    }
    store_fence(nt);
    return XXH3_64bits_digest(&state);
}

constexpr uint64_t kParallelFrom = uint64_t(8) << 20;  // bytes; below, one thread is as fast
}  // namespace

uint64_t copy_hashing(void *dst, const void *src, uint64_t total, uint64_t off,
                      uint64_t len) noexcept {
    return copy_hashing_nt(dst, src, total, off, len, len >= nt_threshold());
}

uint64_t combine_piece_hashes(const uint64_t *hashes, uint64_t count) {
    if (kLittleEndian) return hash_bytes(hashes, count * sizeof(uint64_t));
    std::vector<uint64_t> le(hashes, hashes + count);
    to_little_endian(le.data(), count);
    return hash_bytes(le.data(), count * sizeof(uint64_t));
}

uint64_t tree_hash(const void *data, uint64_t n) noexcept {
    return tree_sequential(nullptr, data, n, 0, 0, false, false);
}

// ---------------------------------------------------------------------------------------------
Pool::Pool(unsigned threads) : threads_(threads) {
    if (threads_ == 0) {
        cpu_set_t set;
        unsigned cpus = sched_getaffinity(0, sizeof set, &set) == 0
                            ? unsigned(CPU_COUNT(&set))
                            : std::thread::hardware_concurrency();
        threads_ = std::min(8u, std::max(1u, cpus));
    }
}

Pool::~Pool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto &t : workers_) t.join();
}

void Pool::start() noexcept {
    try {
        for (unsigned k = 1; k < threads_; ++k) workers_.push_back(sys::start_thread([this, k] { work(k); }));
    } catch (...) {
        // No thread to be had: copy on fewer (the caller's alone at worst).
    }
    threads_ = unsigned(workers_.size()) + 1;
}

namespace {
// Part `k` of `parts` of n bytes, cut at 4096-byte boundaries of the destination so that no two
// threads store into one page (or one cache line).
std::pair<std::size_t, std::size_t> part(uint8_t *dst, std::size_t n, unsigned k, unsigned parts) {
    auto cut = [&](unsigned j) -> std::size_t {
        if (j == 0) return 0;
        if (j == parts) return n;
        uintptr_t p = reinterpret_cast<uintptr_t>(dst) + n / parts * j;
        std::size_t at = std::size_t((p & ~uintptr_t(4095)) - reinterpret_cast<uintptr_t>(dst));
        return std::min(at, n);
    };
    std::size_t lo = cut(k), hi = cut(k + 1);
    return {lo, hi < lo ? lo : hi};
}
}  // namespace

void Pool::work(unsigned self) noexcept {
    uint64_t seen = 0;
    for (;;) {
        uint8_t *d;
        const uint8_t *s;
        std::size_t n;
        const std::function<void(std::size_t, unsigned)> *fn;
        {
            std::unique_lock<std::mutex> lock(mu_);
            wake_.wait(lock, [&] { return stop_ || job_ != seen; });
            if (stop_) return;
            seen = job_;
            d = dst_, s = src_, n = n_, fn = fn_;
        }
        if (fn) {
            for (std::size_t k; (k = next_.fetch_add(1)) < items_;) (*fn)(k, self);
        } else {
            auto [lo, hi] = part(d, n, self, threads_);
            if (hi > lo) copy_bytes(d + lo, s + lo, hi - lo);
        }
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_ == 0) done_.notify_one();
    }
}

void Pool::copy(void *dst, const void *src, std::size_t n) noexcept {
    if (threads_ > 1 && n >= kParallelFrom && workers_.empty()) start();
    if (workers_.empty() || n < kParallelFrom) {
        copy_bytes(dst, src, n);
        return;
    }
    uint8_t *d = static_cast<uint8_t *>(dst);
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn_ = nullptr;
        dst_ = d, src_ = static_cast<const uint8_t *>(src), n_ = n;
        pending_ = threads_ - 1;
        ++job_;
    }
    wake_.notify_all();
    auto [lo, hi] = part(d, n, 0, threads_);
    if (hi > lo) copy_bytes(d + lo, static_cast<const uint8_t *>(src) + lo, hi - lo);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
}

uint64_t Pool::tree_hash(const void *src, uint64_t n) {
    return copy_tree_hashing(nullptr, src, n, 0, 0);
}

uint64_t Pool::copy_tree_hashing(void *dst, const void *src, uint64_t total, uint64_t off,
                                 uint64_t len) {
    const bool copy = dst != nullptr && len > 0, nt = copy && len >= nt_threshold();
    if (threads_ < 2 || total < kParallelFrom) return tree_sequential(dst, src, total, off, len, copy, nt);
    // Whole pieces per item, at least 2 MiB each (a thread streams through its item), about
    // four items per thread so that a thread slowed by the other work on its core is made up for.
    const uint64_t pieces = (total + kTreePieceBytes - 1) / kTreePieceBytes;
    const uint64_t per = std::max<uint64_t>(32, (pieces + 4 * threads_ - 1) / (4 * threads_));
    pieces_.resize(pieces);
    uint8_t *d = static_cast<uint8_t *>(dst) - off;
    const auto *s = static_cast<const uint8_t *>(src);
    parallel((pieces + per - 1) / per, [&](std::size_t item, unsigned) {
        const uint64_t end = std::min(pieces, (item + 1) * per);
        for (uint64_t p = item * per; p < end; ++p)
            pieces_[p] = piece_hash(d, s, total, p, off, len, copy, nt);
        store_fence(nt);
    });
    return combine_piece_hashes(pieces_.data(), pieces);
}

void Pool::parallel(std::size_t items, const std::function<void(std::size_t, unsigned)> &fn) noexcept {
    if (threads_ > 1 && items > 1 && workers_.empty()) start();
    if (workers_.empty() || items < 2) {
        for (std::size_t k = 0; k < items; ++k) fn(k, 0);
        return;
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        fn_ = &fn;
        items_ = items;
        next_.store(0);
        pending_ = threads_ - 1;
        ++job_;
    }
    wake_.notify_all();
    for (std::size_t k; (k = next_.fetch_add(1)) < items;) fn(k, 0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
    fn_ = nullptr;
}

}  // namespace copy
}  // namespace wsync
