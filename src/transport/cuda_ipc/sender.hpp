// A cuda_ipc sender: one per trainer GPU. packed=true gathers each chunk into a reusable device
// bucket; packed=false shares the trainer's own allocations by (handle, offset).
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/api.hpp"
#include "strategy.hpp"
#include "transport/cuda_ipc/init_info.hpp"
#include "transport/local/segment.hpp"

namespace wsync::cuda_ipc {

std::unique_ptr<SenderImpl> make_sender(const gpu::CudaApi &api, std::shared_ptr<SharedSegment> seg,
                                        const InitInfo &info, bool synchronize, int64_t timeout_ms,
                                        int64_t release_timeout_ms);

}  // namespace wsync::cuda_ipc
