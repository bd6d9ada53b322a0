#include "transport/cuda_ipc/vmm.hpp"

#include <unistd.h>

#include "error.hpp"
#include "transport/cuda_ipc/init_info.hpp"

namespace wsync::cuda_ipc {
namespace {

std::string driver_error(const gpu::CudaApi &api, gpu::CUresult rc) {
    const char *name = nullptr;
    if (api.cuGetErrorName) api.cuGetErrorName(rc, &name);
    return name ? name : "CUresult " + std::to_string(rc);
}

// Pieces one run may have: a 1 TiB tensor in 20 MiB pieces is about 52000.
constexpr uint64_t kMaxRunPieces = uint64_t(1) << 16;
// Piece references one part may list over all its runs.
constexpr uint64_t kMaxListedPieces = uint64_t(1) << 20;

}  // namespace

VmmExports::~VmmExports() {
    server_.reset();  // no descriptor is handed out any more; the held ones close
    if (leaked_) return;
    try {
        gpu::Device::Scope scope(dev_);
        for (auto &kv : by_id_) dev_.api().cuMemRelease(kv.second.handle);
    } catch (...) {  // no context: the driver releases them with the process
    }
}

VmmExports::Run VmmExports::cover(gpu::CUdeviceptr p, uint64_t len, const std::string &tensor,
                                  uint64_t version) {
    const gpu::CudaApi &api = dev_.api();
    const std::string who = std::string(kKind) + ": tensor '" + tensor + "'";
    Run run;
    const gpu::CUdeviceptr end = p + std::max<uint64_t>(len, 1);
    for (gpu::CUdeviceptr at = p; at < end;) {
        gpu::CUdeviceptr base = 0;
        std::size_t size = 0;
        WSYNC_CU(api, cuMemGetAddressRange(&base, &size, at), who + ": cuMemGetAddressRange");
        if (size == 0 || base > at || run.pieces.size() >= kMaxRunPieces)
            fail(WSYNC_ERR_INVALID_ARGUMENT, who + ": the driver reports no allocation at its byte " +
                                                 std::to_string(at - p));
        unsigned long long id = 0;
        WSYNC_CU(api, cuPointerGetAttribute(&id, gpu::CU_POINTER_ATTRIBUTE_BUFFER_ID, base), who + ": buffer id");
        auto it = by_id_.find(id);
        if (it == by_id_.end()) {
            gpu::CUmemGenericAllocationHandle h = 0;
            gpu::CUresult rc = api.cuMemRetainAllocationHandle(&h, reinterpret_cast<void *>(base));
            if (rc != gpu::CUDA_SUCCESS)
                fail(WSYNC_ERR_UNSUPPORTED,
                     who + " lives in memory that cannot be exported: not with cuIpcGetMemHandle "
                     "(a cudaMallocAsync pool, or virtual memory), nor as a virtual-memory "
                     "allocation (cuMemRetainAllocationHandle: " + driver_error(api, rc) +
                     "); use packed: true, which copies it into exportable buckets");
            int fd = -1;
            rc = api.cuMemExportToShareableHandle(&fd, h, gpu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            if (rc != gpu::CUDA_SUCCESS) {
                api.cuMemRelease(h);
                fail(WSYNC_ERR_UNSUPPORTED,
                     who + " lives in virtual memory that cannot be exported as a file descriptor "
                     "(cuMemExportToShareableHandle: " + driver_error(api, rc) +
                     "; its allocation was made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR); "
                     "use packed: true, which copies it into exportable buckets");
            }
            const uint64_t key = ++next_key_;
            try {
                if (!server_) server_ = std::make_unique<sys::FdExporter>(socket_, kKind);
                server_->add(key, fd);
            } catch (...) {
                close(fd);
                api.cuMemRelease(h);
                throw;
            }
            it = by_id_.emplace(id, Export{key, h, base, size, version}).first;
        }
        it->second.last_version = version;
        if (run.pieces.empty()) run.base = base;
        run.pieces.push_back({it->second.key, it->second.bytes});
        at = base + size;
    }
    return run;
}

void VmmExports::sweep(uint64_t version) noexcept {
    for (auto it = by_id_.begin(); it != by_id_.end();) {
        if (it->second.last_version + 1 >= version) {  // the last version used it
            ++it;
            continue;
        }
        unsigned long long id = 0;
        const bool same = dev_.api().cuPointerGetAttribute(&id, gpu::CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                                           it->second.base) == gpu::CUDA_SUCCESS &&
                          id == it->first;
        if (same) {
            ++it;
            continue;
        }
        if (server_) server_->remove(it->second.key);
        dev_.api().cuMemRelease(it->second.handle);
        it = by_id_.erase(it);
    }
}

VmmRuns read_vmm_runs(const wire::json &vmm, const std::string &where) {
    VmmRuns out;
    out.socket = wire::string_field(vmm, "socket", where, 100);
    const auto &pieces = wire::array_field(vmm, "pieces", where, kMaxRunPieces * 64);
    std::vector<VmmPiece> all(pieces.size());
    for (std::size_t k = 0; k < pieces.size(); ++k) {
        const std::string at = where + ".pieces[" + std::to_string(k) + "]";
        if (!pieces[k].is_array() || pieces[k].size() != 2) wire::malformed(at + " is not [key, bytes]");
        all[k] = {wire::as_uint(pieces[k][0], at + " key", UINT64_MAX >> 1),
                  wire::as_uint(pieces[k][1], at + " bytes", uint64_t(1) << 48)};
        if (all[k].bytes == 0) wire::malformed(at + " has no bytes");
    }
    const auto &runs = wire::array_field(vmm, "runs", where, kMaxRunPieces);
    uint64_t listed = 0;  // piece references over all runs: bounded, so a request cannot make
                          // the receiver allocate more than a few MB for them
    for (std::size_t r = 0; r < runs.size(); ++r) {
        const std::string at = where + ".runs[" + std::to_string(r) + "]";
        if (!runs[r].is_array() || runs[r].empty() || runs[r].size() > kMaxRunPieces)
            wire::malformed(at + " is not a list of piece indices");
        listed += runs[r].size();
        if (listed > kMaxListedPieces)
            wire::malformed(where + " lists more than " + std::to_string(kMaxListedPieces) +
                            " pieces over its runs");
        std::vector<VmmPiece> run;
        uint64_t bytes = 0;
        if (all.empty()) wire::malformed(at + " names pieces, and the part has none");
        for (const wire::json &i : runs[r]) {
            const VmmPiece &piece = all[wire::as_uint(i, at, all.size() - 1)];
            bytes += piece.bytes;
            if (bytes > uint64_t(1) << 48) wire::malformed(at + " is larger than 2^48 bytes");
            run.push_back(piece);
        }
        out.runs.push_back(std::move(run));
    }
    return out;
}

}  // namespace wsync::cuda_ipc
