#include "transport/cuda_ipc/handle_cache.hpp"

#include "error.hpp"

namespace wsync::cuda_ipc {

using gpu::CUdeviceptr;
using gpu::CUipcMemHandle;

HandleCache::~HandleCache() { close_all(); }

void HandleCache::close_all() noexcept {
    try {
        gpu::Device::Scope scope(dev_);
        for (auto &kv : open_) dev_.api().cuIpcCloseMemHandle(kv.second.ptr);
    } catch (...) {
        // No context to close them in: the driver releases them with the process.
    }
    open_.clear();
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
    } catch (...) {
    }
}

void release_through(board::Board *b, uint32_t index, HandleCache &cache, uint64_t version) noexcept {
    cache.evict_older_than(version);
    board::release(b, index, version);
}

}  // namespace wsync::cuda_ipc
