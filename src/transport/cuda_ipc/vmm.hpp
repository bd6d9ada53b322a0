// Per-allocation cuda_ipc for memory of the driver's virtual memory management API: PyTorch's
// expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) map each segment as
// physical allocations of 20 MiB or more side by side in one reserved range, and no
// cuIpcGetMemHandle can export them (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE is 0).
//
// The sender exports each physical allocation (a "piece") a tensor touches once: the handle
// from cuMemRetainAllocationHandle, as a POSIX file descriptor (cuMemExportToShareableHandle),
// served by key over an abstract Unix socket of its own (sys::FdExporter; same user only).
// A request names, per tensor, a "run": the pieces that hold it, side by side in the trainer's
// range, and the tensor's offset from the run's first byte. The receiver fetches the run's
// descriptors, imports them (cuMemImportFromShareableHandle), reserves one range and maps the
// pieces into it in order (cuMemAddressReserve, cuMemMap, cuMemSetAccess), so the tensor is
// contiguous there as in the trainer; each run is mapped once and unmapped like an IPC handle
// (HandleCache: when a version no longer uses it, or when the receiver goes).
//
// Wire, in the part of the request for this GPU (request.hpp has the rest):
//   "vmm": {"socket": name, "pieces": [[key, bytes], ...], "runs": [[piece index, ...], ...]}
// and a tensor's "alloc" index past the "handles" column picks run (index - handles.size()).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/cuda_ipc/fd_exporter.hpp"
#include "gpu/device.hpp"
#include "wire.hpp"

namespace wsync::cuda_ipc {

struct VmmPiece {
    uint64_t key;    // the sender's key for the piece's descriptor
    uint64_t bytes;  // the piece's size (a multiple of the allocation granularity)
};

// The sender's exported pieces, by the driver's buffer id of each (never reused in a process).
class VmmExports {
public:
    // `socket`: the FdExporter's name, made at the first export.
    VmmExports(const gpu::Device &dev, std::string socket) : dev_(dev), socket_(std::move(socket)) {}
    ~VmmExports();
    VmmExports(const VmmExports &) = delete;
    VmmExports &operator=(const VmmExports &) = delete;

    struct Run {
        gpu::CUdeviceptr base = 0;  // the first piece's first byte
        std::vector<VmmPiece> pieces;
    };
    // The pieces holding [p, p + len), exported on first use. A piece whose handle cannot be
    // exported as a descriptor (memory made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
    // a cudaMallocAsync pool's, or not virtual memory at all) is WSYNC_ERR_UNSUPPORTED naming
    // `tensor`, and nothing is exported for it. Marks the pieces used by `version`. The caller
    // holds the device's scope.
    Run cover(gpu::CUdeviceptr p, uint64_t len, const std::string &tensor, uint64_t version);
    // At the start of `version`: of the pieces the version before did not use, stops exporting
    // those whose address no longer maps the same allocation (the trainer's allocator released
    // it): their descriptor closes and the retained handle goes, so the memory is freed once no
    // engine maps it any more. Pieces the last version used are not looked at (a steady model
    // costs no driver call here; 800 pieces of an 8B model took about 1 ms a version). The
    // caller holds the device's scope.
    void sweep(uint64_t version) noexcept;
    const std::string &socket() const { return socket_; }
    // Keeps every handle until the process exits (receivers may still map them).
    void leak() noexcept { leaked_ = true; }

private:
    struct Export {
        uint64_t key;
        gpu::CUmemGenericAllocationHandle handle;
        gpu::CUdeviceptr base;
        uint64_t bytes;
        uint64_t last_version;  // the newest version that used it
    };
    const gpu::Device &dev_;
    std::string socket_;
    std::unique_ptr<sys::FdExporter> server_;
    std::map<unsigned long long, Export> by_id_;
    uint64_t next_key_ = 0;
    bool leaked_ = false;
};

// Reads a part's "vmm" object: the socket and, for each run, its pieces. MALFORMED (naming
// `where`) for anything out of bounds.
struct VmmRuns {
    std::string socket;
    std::vector<std::vector<VmmPiece>> runs;
};
VmmRuns read_vmm_runs(const wire::json &vmm, const std::string &where);

}  // namespace wsync::cuda_ipc
