// Kernels behind copy.cpp, one set per instruction set (avx2.cpp is built with -mavx2).
#pragma once

#include <cstddef>
#include <cstdint>

namespace wsync {
namespace copy {
namespace kernels {

// Within this many bytes (mod 4096) of "dst a little ahead of src", copy backward (copy.hpp).
constexpr std::size_t kAliasWindow = 2048;
// The hashing copy's block: small enough that a block's source is still in L1 when it is hashed
// right after its copy, so the bytes cross the memory bus once for both.
constexpr uint64_t kHashBlock = 16 << 10;

void avx2_copy(uint8_t *d, const uint8_t *s, std::size_t n, bool nt);
uint64_t avx2_hash(const void *p, std::size_t n);
// fence false: non-temporal stores are left unfenced, for a caller that copies many pieces
// and fences once after the last (copy.cpp's tree hashing).
uint64_t avx2_copy_hashing(uint8_t *dst, const uint8_t *src, uint64_t total, uint64_t off,
                           uint64_t len, bool nt, bool fence = true);

}  // namespace kernels
}  // namespace copy
}  // namespace wsync
