// Where a chunk's tensors lie in a bucket: one rule for every packed transport (shm's host
// buckets, cuda_ipc's and nccl_broadcast's device buckets), and the receiving side's check of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor.hpp"

namespace wsync::copy {
class Pool;
}

namespace wsync::layout {

constexpr uint64_t kTensorAlign = 256;  // every tensor's offset inside a bucket
constexpr uint64_t kPageBytes = 4096;   // bucket sizes are whole pages

constexpr uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Entries a transport does not place in its bucket (shm's tensors sent in place from the
// arena): in_place[i] != 0. An empty mask means every entry is placed.
using InPlace = std::vector<uint8_t>;

// Lays table.metas out back to back at kTensorAlign-aligned offsets (table.offsets) and returns
// the bytes used; entries flagged in `in_place` take no room and keep the offset the caller set
// in table.offsets (sized to the table here, new entries 0). WSYNC_ERR_INVALID_ARGUMENT naming
// `who` and the tensor when the chunk does not fit in `capacity` bytes.
uint64_t place(TensorTable &table, uint64_t capacity, const std::string &who,
               const InPlace &in_place = {});

// The receiving side: every tensor kTensorAlign-aligned and inside the `bytes` received (entries
// flagged in `in_place` are not checked: the caller checks them against their own region).
// WSYNC_ERR_MALFORMED naming the tensor ("... outside the 4096-byte <what>").
void check(const TensorTable &table, uint64_t bytes, const std::string &where, const char *what,
           const InPlace &in_place = {});
// The same check of entry i alone, against a region of `bytes` called `what`.
void check_entry(const TensorTable &table, std::size_t i, uint64_t bytes, const std::string &where,
                 const char *what);

// Copies each tensor of a host chunk to its placed offset (table.offsets) at dst, and with
// `checksum` fills table.checksums in the same pass (src/copy/copy.hpp). An entry flagged in
// `in_place` is not copied; with `checksum` it is hashed where it lies (tensors[i].data). Each
// large tensor is copied and hashed by the pool's threads; the checksums are tree hashes
// (table.tree_sums).
void pack_host(uint8_t *dst, const wsync_tensor_t *tensors, TensorTable &table, bool checksum,
               const InPlace &in_place, copy::Pool &pool);

}  // namespace wsync::layout
