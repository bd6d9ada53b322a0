// The receiver's host copy loop (wsync_recv_copy): bytes out of a shared bucket into the
// engine's own memory, robust to how the two are aligned relative to each other, with the
// tensor's XXH3-64 computed in the same pass when it must be verified. Why it exists and what it
// measures: docs/data-path.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace wsync {

// Whether this host stores integers little-endian, as the wire's hashes and indices are (an
// unknown byte order counts as big: the portable paths are taken).
inline constexpr bool kLittleEndian =
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
#else
    false;
#endif

namespace copy {

// Copies n bytes; the ranges must not overlap. Stores are aligned to 32 bytes; the direction is
// chosen so that loads never follow recent stores at the same offset modulo 4096 (the 4K
// aliasing that makes a forward copy run ~3x slower when dst is a little ahead of src); copies of
// at least nt_threshold() bytes use non-temporal stores (they would only evict the cache).
void copy_bytes(void *dst, const void *src, std::size_t n) noexcept;

// Streams XXH3-64 over all `total` bytes at src while copying bytes [off, off + len) of them to
// dst, in one pass over the source. Every byte stored to dst is one the hash read, from the same
// load: a source that another process writes meanwhile gives a hash that differs from the
// sender's, never a verified copy that differs from what was hashed. A whole tensor has each
// 64-byte stripe hashed and stored from the same registers (streamed when dst is 32-byte
// aligned and the copy is at least nt_threshold() bytes, through the cache otherwise); a range
// or a small tensor goes block by block through a private L1 buffer that the hash and the copy
// both read. Returns the hash of the whole source, equal to XXH3_64bits(src, total).
uint64_t copy_hashing(void *dst, const void *src, uint64_t total, uint64_t off,
                      uint64_t len) noexcept;

// XXH3-64 of n bytes, on AVX2 where the CPU has it (the value is the same either way).
uint64_t hash_bytes(const void *data, uint64_t n) noexcept;

// The tree hash: XXH3-64 over the little-endian array of the XXH3-64 of each kTreePieceBytes
// piece of the bytes (the last piece shorter; no bytes: XXH3-64 of nothing). Unlike one XXH3-64
// stream its pieces hash independently, so one tensor's checksum can be computed, and verified
// while it is copied, by several threads (Pool::tree_hash, Pool::copy_tree_hashing) and by GPU
// threads (gpu/kernels/delta.cu). Dense tensors of shm and ucx requests and patches made on a GPU
// carry it (docs/wire-format.md "tree"; docs/data-path.md).
constexpr uint64_t kTreePieceBytes = 65536;
uint64_t combine_piece_hashes(const uint64_t *hashes, uint64_t count);
// On the calling thread alone, in a fixed 4 KiB of stack.
uint64_t tree_hash(const void *data, uint64_t n) noexcept;

// Whether this CPU runs the AVX2 kernels (copy/avx2.cpp, delta/avx2.cpp).
bool have_avx2() noexcept;

// Bytes from which copy_bytes switches to non-temporal stores (the core's L2 size, at least
// 256 KiB; 1 MiB when the system does not say).
std::size_t nt_threshold() noexcept;

// Threads for one receiver's large plain copies (and a delta trainer's compares: parallel()),
// made once (lazily, on the first job large enough) and kept until the owner is destroyed: no
// thread is created per call. One caller at a time.
class Pool {
public:
    // threads: how many threads share one copy, the caller's included; 0 means one per CPU
    // this process may run on (at most 8). 1 makes a pool that never starts a thread.
    explicit Pool(unsigned threads);
    ~Pool();
    Pool(const Pool &) = delete;
    Pool &operator=(const Pool &) = delete;
    unsigned threads() const { return threads_; }
    // Copies like copy_bytes, split between the threads when n is large (>= 8 MiB).
    void copy(void *dst, const void *src, std::size_t n) noexcept;
    // The tree hash of n bytes at src, its pieces shared out between the threads from 8 MiB.
    uint64_t tree_hash(const void *src, uint64_t n);
    // Copies bytes [off, off + len) of the `total` bytes at src to dst (dst receives byte `off`)
    // and returns the tree hash of all `total` bytes, in one pass: each piece is hashed from the
    // same loads that copy its share of the range (copy_hashing), split between the threads by
    // whole pieces from 8 MiB; non-temporal stores when len >= nt_threshold().
    uint64_t copy_tree_hashing(void *dst, const void *src, uint64_t total, uint64_t off,
                               uint64_t len);
    // Runs fn(item, worker) for every item in [0, items), the items shared out between the
    // threads as they come free (worker 0 is the caller; workers are < threads()); returns
    // when all have run. fn must not throw (callers keep each item's error themselves).
    void parallel(std::size_t items, const std::function<void(std::size_t, unsigned)> &fn) noexcept;

private:
    void start() noexcept;
    void work(unsigned self) noexcept;

    unsigned threads_;
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    uint64_t job_ = 0;      // generation of the current job
    unsigned pending_ = 0;  // workers that have not finished the current job
    bool stop_ = false;
    uint8_t *dst_ = nullptr;
    const uint8_t *src_ = nullptr;
    std::size_t n_ = 0;
    // parallel(): the function (null for a copy job), and the next item to take.
    const std::function<void(std::size_t, unsigned)> *fn_ = nullptr;
    std::size_t items_ = 0;
    std::atomic<std::size_t> next_{0};
    std::vector<uint64_t> pieces_;  // the pieces' hashes of the current tree hash
};

}  // namespace copy
}  // namespace wsync
