// nccl_broadcast's init info: the NCCL unique id of the model-update group, its size, the
// bucket size and cast, the trainer's NCCL version and the sender's GPU.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "gpu/api.hpp"
#include "transport/nccl/control.hpp"

namespace wsync::nccl {

using json = nlohmann::json;

inline constexpr const char *kKind = "nccl_broadcast";
inline constexpr uint32_t kMaxReceivers = 4095;

struct InitInfo {
    gpu::ncclUniqueId id;
    uint32_t nranks;
    uint64_t bucket_bytes;
    std::string dtype;
    int nccl_version;
    // The model-update group's tag: XXH3-64 of its unique id, derived once by
    // parse_init_info. Every request carries it as "group", so a receiver of another group
    // (another trainer's, or a restarted one's) refuses the request before its seq is looked
    // at (the unique id itself stays out of requests).
    uint64_t group = 0;
    // The sender's GPU ("sender_gpu": the UUID of the "device" of the strategy that made the
    // init info, which its sender must be on). NCCL refuses two ranks of one communicator on
    // one GPU ("invalid usage" during the asynchronous init, on both ranks), so a receiver on
    // this GPU is refused before it joins. Absent (has_sender_gpu false) in the init info of a
    // libwsync from before the field: nothing is checked then.
    bool has_sender_gpu = false;
    gpu::CUuuid sender_gpu{};
    // Where receivers reach the sender's control channel (control.hpp): "control", a port and
    // the sender host's addresses. Absent (has_control false) in an older trainer's init info:
    // its receivers then have no channel, as before.
    bool has_control = false;
    ControlAddress control;
};

// Validates an init-info body; WSYNC_ERR_MALFORMED names the bad field.
InitInfo parse_init_info(const json &body);

}  // namespace wsync::nccl
