// The IPC handles one cuda_ipc receiver has opened, by handle bytes.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "transport/local/board.hpp"
#include "gpu/device.hpp"
#include "sys.hpp"
#include "transport/cuda_ipc/vmm.hpp"

#include <vector>

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
    // Forgets every mapping without closing it (work that may still read them never finished:
    // the driver closes them when the process exits).
    void abandon() noexcept {
        open_.clear();
        runs_.clear();
    }
    // The mapping of `h` in this process, opened on first use; marks it used by `version`.
    gpu::CUdeviceptr get(const gpu::CUipcMemHandle &h, uint64_t version, const std::string &what);
    // The mapping in this process of a sender's virtual-memory run (vmm.hpp): its pieces'
    // descriptors fetched from `socket` (one connection, within the deadline), imported and
    // mapped side by side into one reserved range, read-write for this GPU; made on first use,
    // marked used by `version`. Throws with nothing left mapped or imported on failure:
    // UNAVAILABLE (the sender's socket gone or refusing a piece), TIMEOUT, or the driver's error.
    gpu::CUdeviceptr get_run(const std::string &socket, const std::vector<VmmPiece> &pieces,
                             uint64_t version, const sys::Deadline &deadline, const std::string &what);
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
    struct Run {
        gpu::CUdeviceptr ptr;
        uint64_t bytes;
        std::vector<gpu::CUmemGenericAllocationHandle> handles;
        uint64_t last_version;
    };
    void unmap(const Run &run) noexcept;
    std::map<std::string, Run> runs_;  // by socket and piece keys
};

// Closes the handles version `version` no longer uses, then says so on the board (before the
// acknowledgement, so a trainer whose flush returned finds the version released).
void release_through(board::Board *b, uint32_t index, HandleCache &cache, uint64_t version) noexcept;

}  // namespace wsync::cuda_ipc
