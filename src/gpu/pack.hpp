// Packing a chunk into a device bucket, shared by the GPU strategies: the cast option, the
// bucket layout, and the pack kernel (gpu/kernels/pack.cu) launched once per chunk.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/kernels/pack_abi.hpp"
#include "options.hpp"
#include "tensor.hpp"

namespace wsync::gpu {

// The cast option: which float32 tensors become what while packing.
enum class Cast { None, BFloat16, Float16 };
Cast parse_cast(const std::string &option);  // "", "bfloat16", "float16"
bool is_cast_name(const std::string &text);  // one parse_cast accepts
// The "dtype" and "bucket_bytes" options of a kind that packs, with the kind's own doc text.
OptionSpec cast_option(const char *doc);
OptionSpec bucket_bytes_option(const char *doc);
// A kind's options with both a "dtype" cast and a "delta" other than "off": refused,
// WSYNC_ERR_UNSUPPORTED naming `kind` (a patch applies to the tensor as the engine holds it,
// and a cast changes that).
void refuse_cast_with_delta(const char *kind, const Options &options);
// The dtype a tensor travels as, and the pack op that makes it.
wsync_dtype_t cast_dtype(Cast cast, wsync_dtype_t in, PackOp *op);

// Packs chunks into device buckets with one kernel launch per chunk: the table of PackEntry is
// uploaded to a device buffer of its own (grown when a chunk has more tensors), then
// wsync_pack runs on the given stream. The module is loaded once per Packer.
//
// A plain copy of at least `driver_copy_min` bytes goes by the driver's own device copy
// (cuMemcpyDtoDAsync, one call an entry, on the same stream) instead of the kernel: on an H200
// the kernel moved 0.87 GB of one decoder layer at 1.087x one cuMemcpyDtoDAsync of the same
// bytes (docs/gpu-validation.md, 2026-12-04), while the driver's copy of a large tensor runs at
// its full speed; below the threshold one launch for many small tensors beats a call each.
constexpr uint64_t kDriverCopyMin = WSYNC_APPLY_DRIVER_COPY_MIN;  // include/wsync.h
class Packer {
public:
    // driver_copy_min: the smallest plain copy given to the driver (UINT64_MAX: none; every
    // entry goes to the kernel, as tests/gpu/pack_bench.cpp measures the kernel alone).
    explicit Packer(const Device &d, uint64_t driver_copy_min = kDriverCopyMin);
    ~Packer();
    Packer(const Packer &) = delete;
    Packer &operator=(const Packer &) = delete;
    // Enqueues the pack of `entries` on `stream`. Returns at once, without waiting for the
    // stream: the table is uploaded from pageable memory (the driver stages it before the call
    // returns) into the Packer's device table, which a later launch overwrites only in stream
    // order: on the same stream it follows this launch; on another, that stream first waits
    // (on the GPU) for an event recorded after this launch. A table too small is replaced by a
    // larger one and the old kept until the Packer goes (freeing device memory would wait for
    // the whole device, possibly for work that never ends).
    //
    // Plain copies of driver_copy_min bytes or more go by cuMemcpyDtoDAsync on `stream` after
    // the launch, one call each (never joined with a neighbour: a driver copy may not span
    // allocations), the rest (casts, small copies) by the one launch, its tiles renumbered
    // here.
    struct Queued {
        uint32_t launches = 0;        // 0 or 1
        uint64_t driver_copies = 0;   // cuMemcpyDtoDAsync calls
    };
    Queued pack(const std::vector<PackEntry> &entries, CUstream stream);
    uint64_t driver_copy_min() const { return driver_copy_min_; }

private:
    void launch(CUstream stream, uint64_t tiles);
    const Device &dev_;
    uint64_t driver_copy_min_;
    CUmodule module_ = nullptr;
    CUfunction fn_ = nullptr;
    DeviceBuffer table_;
    std::vector<DeviceBuffer> retired_;
    std::vector<PackEntry> staged_;
    std::unique_ptr<Event> launched_;  // recorded after each launch, on its stream
    CUstream last_stream_ = nullptr;
    bool launched_once_ = false;
};

// Lays a chunk's tensors out in a bucket (layout::place, after the cast). Fills
// table.offsets (and table.metas' dtype and nbytes when cast) and returns the bytes used. Throws
// WSYNC_ERR_INVALID_ARGUMENT naming the tensor when the chunk exceeds `capacity`.
uint64_t layout_bucket(TensorTable &table, Cast cast, uint64_t capacity, std::vector<PackOp> *ops,
                       const std::string &who);

// Refuses (WSYNC_ERR_INVALID_ARGUMENT, naming the tensor and address) a chunk whose tensors a
// kernel of `dev` could not read: each tensor's first and last byte (metas[i].nbytes of them,
// before any cast) must lie in memory the driver knows: an allocation (cuMemAlloc, a caching
// allocator's block, a virtual-memory mapping) or pinned or mapped host memory. A kernel that
// reads anything else faults, and a fault is sticky: it ends the CUDA context of the whole
// calling process, the trainer's own work included. One driver call per tensor whose allocation
// holds it whole (cuMemGetAddressRange), up to four otherwise; no system call. Call before
// layout_bucket (which halves nbytes of cast tensors). An "allocation" is what the driver
// calls one: a caching allocator's whole segment (so a shape past its block but inside its
// segment passes), one mapped chunk of a virtual-memory range (a tensor spanning chunks passes
// by its last byte); the bytes between first and last are not looked up; on HMM/ATS systems,
// plain host memory a kernel could read is refused all the same (it is not labelled CUDA).
// The spanning case is not modelled by the fake driver.
void check_sources(const Device &dev, const wsync_tensor_t *tensors,
                   const std::vector<TensorMeta> &metas, const char *kind);
// The same for one tensor: `len` bytes at `data`.
void check_source(const Device &dev, const void *data, uint64_t len, const std::string &name,
                  const char *kind);

// The pack kernel's entries for a chunk that layout_bucket laid out, into the bucket at
// `bucket`: tensor i's bytes go to bucket + table.offsets[i].
void fill_pack_entries(const wsync_tensor_t *tensors, const TensorTable &table,
                       const std::vector<PackOp> &ops, CUdeviceptr bucket,
                       std::vector<PackEntry> *entries);

}  // namespace wsync::gpu
