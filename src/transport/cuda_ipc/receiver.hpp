// A cuda_ipc receiver: takes the part of each request for its own GPU, opens (and caches) the
// handles it names, and yields views into the sender's memory.
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/api.hpp"
#include "strategy.hpp"
#include "transport/cuda_ipc/init_info.hpp"
#include "transport/local/segment.hpp"

namespace wsync::cuda_ipc {

std::unique_ptr<ReceiverImpl> make_receiver(const gpu::CudaApi &api,
                                            std::shared_ptr<SharedSegment> seg,
                                            const InitInfo &info, uint32_t index, int ordinal,
                                            bool synchronize, int64_t timeout_ms);

}  // namespace wsync::cuda_ipc
