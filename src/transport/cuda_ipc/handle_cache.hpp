// The IPC handles one cuda_ipc receiver has opened, by handle bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "board.hpp"
#include "gpu/device.hpp"

namespace wsync::cuda_ipc {

// Opened IPC handles of one receiver, by handle bytes. Each is opened once and closed exactly
// once: when a version this receiver ends does not use it (the trainer moved that memory and
// may want to free it: see wsync_sender_wait_released), or when the receiver goes away.
class HandleCache {
public:
    explicit HandleCache(const gpu::Device &dev) : dev_(dev) {}
    ~HandleCache();
    HandleCache(const HandleCache &) = delete;
    HandleCache &operator=(const HandleCache &) = delete;

    void close_all() noexcept;
    // The mapping of `h` in this process, opened on first use; marks it used by `version`.
    gpu::CUdeviceptr get(const gpu::CUipcMemHandle &h, uint64_t version, const std::string &what);
    // Closes every handle `version` did not use. Called as a version's last chunk ends: views of
    // older versions are gone, and this version's views use only handles it keeps.
    void evict_older_than(uint64_t version) noexcept;

private:
    struct Entry {
        gpu::CUdeviceptr ptr;
        uint64_t last_version;
    };
    const gpu::Device &dev_;
    std::map<std::string, Entry> open_;
};

// Closes the handles version `version` no longer uses, then says so on the board (before the
// acknowledgement, so a trainer whose flush returned finds the version released).
void release_through(board::Board *b, uint32_t index, HandleCache &cache, uint64_t version) noexcept;

}  // namespace wsync::cuda_ipc
