#include "transport/cuda_ipc/handle_cache.hpp"

#include <unistd.h>

#include "error.hpp"
#include "transport/cuda_ipc/fd_exporter.hpp"
#include "transport/cuda_ipc/init_info.hpp"

namespace wsync::cuda_ipc {

using gpu::CUdeviceptr;
using gpu::CUipcMemHandle;

HandleCache::~HandleCache() { close_all(); }

void HandleCache::close_all() noexcept {
    try {
        gpu::Device::Scope scope(dev_);
        for (auto &kv : open_) dev_.api().cuIpcCloseMemHandle(kv.second.ptr);
        for (auto &kv : runs_) unmap(kv.second);
    } catch (...) {
        // No context to close them in: the driver releases them with the process.
    }
    open_.clear();
    runs_.clear();
}

void HandleCache::unmap(const Run &run) noexcept {
    const gpu::CudaApi &api = dev_.api();
    api.cuMemUnmap(run.ptr, run.bytes);
    api.cuMemAddressFree(run.ptr, run.bytes);
    for (auto h : run.handles) api.cuMemRelease(h);
}

CUdeviceptr HandleCache::get_run(const std::string &socket, const std::vector<VmmPiece> &pieces,
                                 uint64_t version, const sys::Deadline &deadline, const std::string &what) {
    std::string key = socket;
    uint64_t bytes = 0;
    std::vector<uint64_t> keys;
    for (const VmmPiece &p : pieces) {
        key += "/" + std::to_string(p.key);
        keys.push_back(p.key);
        bytes += p.bytes;
    }
    auto it = runs_.find(key);
    if (it != runs_.end()) {
        it->second.last_version = version;
        return it->second.ptr;
    }
    const gpu::CudaApi &api = dev_.api();
    const std::string who = std::string(kKind) + ": " + what + " on " + dev_.uuid_string();
    std::vector<int> fds = sys::fetch_fds(socket, keys, deadline, who,
                                          "the sender's descriptor socket '" + socket +
                                              "' is gone (the trainer's sender was destroyed, or its process exited)");
    Run run{0, bytes, {}, version};
    uint64_t mapped = 0;  // bytes of the range mapped so far
    auto undo = [&]() noexcept {
        if (mapped) api.cuMemUnmap(run.ptr, mapped);
        if (run.ptr) api.cuMemAddressFree(run.ptr, bytes);
        for (auto h : run.handles) api.cuMemRelease(h);
        for (int fd : fds)
            if (fd >= 0) close(fd);
    };
    try {
        for (std::size_t k = 0; k < fds.size(); ++k) {
            gpu::CUmemGenericAllocationHandle h = 0;
            WSYNC_CU(api, cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(static_cast<intptr_t>(fds[k])),
                                                        gpu::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     who + ": cuMemImportFromShareableHandle of piece " + std::to_string(keys[k]));
            run.handles.push_back(h);
            close(fds[k]);
            fds[k] = -1;
        }
        WSYNC_CU(api, cuMemAddressReserve(&run.ptr, bytes, 0, 0, 0),
                 who + ": cuMemAddressReserve of " + std::to_string(bytes) + " bytes");
        for (std::size_t k = 0; k < pieces.size(); ++k) {
            WSYNC_CU(api, cuMemMap(run.ptr + mapped, pieces[k].bytes, 0, run.handles[k], 0),
                     who + ": cuMemMap of piece " + std::to_string(keys[k]));
            mapped += pieces[k].bytes;
        }
        gpu::CUmemAccessDesc access{{gpu::CU_MEM_LOCATION_TYPE_DEVICE, dev_.ordinal()},
                                    gpu::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        WSYNC_CU(api, cuMemSetAccess(run.ptr, bytes, &access, 1), who + ": cuMemSetAccess");
    } catch (...) {
        undo();
        throw;
    }
    return runs_.emplace(std::move(key), std::move(run)).first->second.ptr;
}

CUdeviceptr HandleCache::get(const CUipcMemHandle &h, uint64_t version, const std::string &what) {
    std::string key(h.reserved, sizeof h.reserved);
    auto it = open_.find(key);
    if (it == open_.end()) {
        CUdeviceptr p = 0;
        WSYNC_CU(dev_.api(),
                 cuIpcOpenMemHandle(&p, h, gpu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                 "cuda_ipc: cuIpcOpenMemHandle for " + what + " on " + dev_.uuid_string());
        it = open_.emplace(std::move(key), Entry{p, version}).first;
    }
    it->second.last_version = version;
    return it->second.ptr;
}

void HandleCache::evict_older_than(uint64_t version) noexcept {
    try {
        gpu::Device::Scope scope(dev_);
        for (auto it = open_.begin(); it != open_.end();) {
            if (it->second.last_version < version) {
                dev_.api().cuIpcCloseMemHandle(it->second.ptr);
                it = open_.erase(it);
            } else {
                ++it;
            }
        }
        for (auto it = runs_.begin(); it != runs_.end();) {
            if (it->second.last_version < version) {
                unmap(it->second);
                it = runs_.erase(it);
            } else {
                ++it;
            }
        }
    } catch (...) {
    }
}

void release_through(board::Board *b, uint32_t index, HandleCache &cache, uint64_t version) noexcept {
    cache.evict_older_than(version);
    board::release(b, index, version);
}

}  // namespace wsync::cuda_ipc
