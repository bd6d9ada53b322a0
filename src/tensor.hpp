// Tensor metadata: dtype and device tables, validation of caller descriptors, overflow-checked
// sizes, and the tensor table every request carries (names, dtypes, shapes, offsets,
// checksums). Shared by every strategy; knows nothing of any strategy's transport fields.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "wsync.h"

namespace wsync {

using json = nlohmann::json;

// Overflow-checked arithmetic: nullopt on overflow.
std::optional<uint64_t> mul_u64(uint64_t a, uint64_t b);
std::optional<uint64_t> add_u64(uint64_t a, uint64_t b);

// Bytes per element, or 0 if (code, bits, lanes) is not a dtype libwsync moves.
uint64_t dtype_size(wsync_dtype_t dtype);
// "bfloat16", "float32", "float8_e4m3fn", "int64x4" (lanes), "dtype(code=99,bits=8,lanes=1)".
std::string dtype_name(wsync_dtype_t dtype);
std::string device_name(wsync_device_t device);
// True for the WSYNC_DEVICE_* codes of wsync.h.
bool device_is_known(wsync_device_t device);
// True for memory the CPU can read and write directly (CPU, CUDA_HOST, ROCM_HOST).
bool device_is_host(wsync_device_t device);

// "tensor 3 ('layers.0.q')" for messages: the name (may be NULL) cut to about 80 bytes, bytes
// that are not printable UTF-8 escaped (\xNN).
std::string tensor_label(std::size_t index, const char *name);

// One tensor's description, without its bytes. No heap allocation but the name.
struct TensorMeta {
    std::string name;
    wsync_dtype_t dtype{};
    int32_t ndim = 0;
    int64_t shape[WSYNC_MAX_NDIM] = {};
    uint64_t nbytes = 0;  // product(shape) * dtype_size, checked
};

// Whether a destination declared as one tensor takes another (no cast is made): the same dtype,
// the same shape (wsync_recv_apply's check, and landing's).
inline bool same_dtype(wsync_dtype_t a, wsync_dtype_t b) {
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
inline bool same_shape(const TensorMeta &a, const TensorMeta &b) {
    return a.ndim == b.ndim && std::equal(a.shape, a.shape + a.ndim, b.shape);
}

// Validates caller descriptor number `index` and returns its metadata. `need_data` (sending)
// requires a non-NULL data pointer and a WSYNC_DEVICE_* device type; the planner passes false. Throws
// WSYNC_ERR_INVALID_ARGUMENT naming the tensor on any defect (a name that is not UTF-8 among
// them; the message shows it escaped).
TensorMeta meta_from_descriptor(const wsync_tensor_t &t, std::size_t index, bool need_data);

// Validates count descriptors (each descriptor, and unique names), with no limit on count.
std::vector<TensorMeta> metas_from_descriptors(const wsync_tensor_t *tensors, std::size_t count,
                                               bool need_data);

// Validates an array of descriptors as one chunk: 1..WSYNC_MAX_CHUNK_TENSORS of them (checked
// before anything is read or allocated), then as metas_from_descriptors.
std::vector<TensorMeta> metas_from_chunk(const wsync_tensor_t *tensors, std::size_t count,
                                         bool need_data);

// A tensor sent as a patch against the receiver's copy of an earlier version (docs/delta.md).
// Its bytes in the strategy's buffer are the patch (wire_bytes of them), and the table's
// checksum of it, if any, is of those bytes.
struct PatchInfo {
    uint64_t wire_bytes = 0;   // 0: the tensor is dense
    uint64_t base_version = 0; // the committed version the patch applies to
    uint64_t base_xxh3 = 0;    // XXH3-64 of the tensor at base_version
    uint64_t result_xxh3 = 0;  // XXH3-64 of the tensor once patched
    // The two checksums are tree hashes (delta::tree_hash), as patches made on a GPU carry,
    // rather than XXH3-64 of the whole tensor. On the wire: "sums" 1 (docs/wire-format.md).
    bool tree = false;
};

// A part of a split tensor (src/plan/parts.hpp): bytes [offset, offset + bytes) of the whole tensor,
// which the entry's meta describes. bytes 0: the entry is the whole tensor.
struct PartInfo {
    uint64_t offset = 0;
    uint64_t bytes = 0;
};

// The tensor table of a request: metadata plus each tensor's byte offset in the strategy's
// buffer and, optionally, its XXH3-64 checksum, patches and parts.
struct TensorTable {
    std::vector<TensorMeta> metas;
    std::vector<uint64_t> offsets;
    std::vector<uint64_t> checksums;  // empty: no checksums carried
    // Which checksum `checksums` holds for each entry's bytes in the buffer (a patch's bytes
    // included): false XXH3-64 ("xxh3" on the wire), true the tree hash (copy::tree_hash;
    // "tree"), which a receiver verifies on several threads while it copies.
    bool tree_sums = false;
    // A receiver's only: the request carries no checksums because its transport sends them
    // after the bytes (ucx "sums_follow", docs/data-path.md "Checksums that follow the bytes");
    // the iteration takes them from its backing (ChunkBacking::trailing_sums), tree hashes in
    // the order of the request's table. A selection's view: `follow_from` maps each of its
    // entries to that table's (kNoSum: a range no checksum covers).
    bool sums_follow = false;
    std::vector<uint64_t> follow_from;
    static constexpr uint64_t kNoSum = UINT64_MAX;
    std::vector<PatchInfo> patches;   // empty: every tensor dense
    std::vector<PartInfo> parts;      // empty: every entry a whole tensor
    // Payload bytes: each entry's size, or its part's.
    uint64_t total_bytes() const;
    bool is_patch(std::size_t i) const { return !patches.empty() && patches[i].wire_bytes != 0; }
    bool is_part(std::size_t i) const { return !parts.empty() && parts[i].bytes != 0; }
    // The bytes of the whole tensor entry i carries: its size, or its part's.
    uint64_t payload_bytes(std::size_t i) const {
        return is_part(i) ? parts[i].bytes : metas[i].nbytes;
    }
    // Bytes of entry i in the strategy's buffer: its size, its part's, or its patch's.
    uint64_t wire_bytes(std::size_t i) const {
        return is_patch(i) ? patches[i].wire_bytes : payload_bytes(i);
    }
    // The table a transport sees: each patch as a 1-D uint8 tensor of its bytes, each part as a
    // 1-D tensor of its elements; `whole` then keeps every entry's tensor as it was sent.
    TensorTable as_wire() const;
    std::vector<TensorMeta> whole;  // as_wire()'s: the tensors (metas describe the wire entries)
    const TensorMeta &tensor(std::size_t i) const { return whole.empty() ? metas[i] : whole[i]; }
};

// A sparse column of the tensor table ("patches", "parts"): an object of equal-length arrays
// whose "tensor" array holds strictly increasing indices below n. read_sparse_column checks that
// and returns the indices and the other arrays, in the order named; WSYNC_ERR_MALFORMED naming
// the column otherwise.
struct SparseColumn {
    std::string what;                          // "tensor table: parts"
    std::vector<std::size_t> rows;             // the entries' tensor indices
    std::vector<const json::array_t *> cols;   // the named arrays
    std::string at(std::size_t k) const { return what + " entry " + std::to_string(k); }
};
SparseColumn read_sparse_column(const json &obj, const char *key, std::size_t n,
                                std::initializer_list<const char *> names);

// Writes the table's columns into obj (see docs/wire-format.md).
void encode_tensor_table(const TensorTable &table, json &obj);
// Reads and validates the columns of obj. Throws WSYNC_ERR_MALFORMED naming the column and the
// tensor index on any defect (types, counts, lengths, names with NUL or not UTF-8, dtypes,
// shape overflow, dups). Moves the names out of obj (a decoded request read once), leaving its
// other columns as they were.
TensorTable decode_tensor_table(json &obj);

// XXH3-64 of a tensor's bytes (the checksum requests carry).
uint64_t checksum_bytes(const void *data, uint64_t n);

}  // namespace wsync
