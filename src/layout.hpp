// Where a chunk's tensors lie in a bucket: one rule for every packed transport (shm's host
// buckets, cuda_ipc's and nccl_broadcast's device buckets), and the receiving side's check of it.
#pragma once

#include <cstdint>
#include <string>

#include "tensor.hpp"

namespace wsync::layout {

constexpr uint64_t kTensorAlign = 256;  // every tensor's offset inside a bucket
constexpr uint64_t kPageBytes = 4096;   // bucket sizes are whole pages

constexpr uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Lays table.metas out back to back at kTensorAlign-aligned offsets (table.offsets) and returns
// the bytes used. WSYNC_ERR_INVALID_ARGUMENT naming `who` and the tensor when the chunk does not
// fit in `capacity` bytes.
uint64_t place(TensorTable &table, uint64_t capacity, const std::string &who);

// The receiving side: every tensor kTensorAlign-aligned and inside the `bytes` received.
// WSYNC_ERR_MALFORMED naming the tensor ("... outside the 4096-byte <what>").
void check(const TensorTable &table, uint64_t bytes, const std::string &where, const char *what);

// Copies each tensor of a host chunk to its placed offset (table.offsets) at dst, and with
// `checksum` fills table.checksums with XXH3-64 in the same pass (src/copy.hpp).
void pack_host(uint8_t *dst, const wsync_tensor_t *tensors, TensorTable &table, bool checksum);

}  // namespace wsync::layout
