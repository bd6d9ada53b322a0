// cuda_ipc's init info: what the trainer's strategy publishes once and every sender and
// receiver is created from (the board segment's name, the host, the geometry, the mode).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace wsync::cuda_ipc {

using json = nlohmann::json;

inline constexpr const char *kKind = "cuda_ipc";
inline constexpr uint32_t kUnpackedSlots = 16;  // chunks in flight before send_chunk waits (packed=false)

struct InitInfo {
    std::string segment, rendezvous, host;
    uint32_t senders, receivers, buckets;
    uint64_t bucket_bytes;
    bool packed;
    std::string dtype;
    uint32_t slots() const { return packed ? buckets : kUnpackedSlots; }
};

// Validates an init-info body; WSYNC_ERR_MALFORMED names the bad field, WSYNC_ERR_MISMATCH says
// the info comes from another host.
InitInfo parse_init_info(const json &body);

// The kernel's per-boot UUID ("unknown" when unreadable): two processes share CUDA IPC only if
// they share a host.
std::string host_boot_id();

}  // namespace wsync::cuda_ipc
