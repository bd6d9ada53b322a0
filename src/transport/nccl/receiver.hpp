// An nccl_broadcast receiver, rank index + 1 of the model-update group: posts its side of each
// chunk's broadcast into its own device bucket and yields views into it.
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/api.hpp"
#include "gpu/device.hpp"
#include "strategy.hpp"
#include "transport/nccl/init_info.hpp"

namespace wsync::nccl {

std::unique_ptr<ReceiverImpl> make_receiver(const gpu::NcclApi &nccl,
                                            std::unique_ptr<gpu::Device> dev, const InitInfo &info,
                                            uint32_t index, bool synchronize, int64_t timeout_ms);

}  // namespace wsync::nccl
