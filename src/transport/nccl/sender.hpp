// The nccl_broadcast sender, rank 0 of the model-update group: packs each chunk into one of two
// device buckets and broadcasts it to every receiver.
#pragma once

#include <cstdint>
#include <memory>

#include "gpu/api.hpp"
#include "gpu/device.hpp"
#include "strategy.hpp"
#include "transport/nccl/control.hpp"
#include "transport/nccl/init_info.hpp"

namespace wsync::nccl {

std::unique_ptr<SenderImpl> make_sender(const gpu::NcclApi &nccl, std::unique_ptr<gpu::Device> dev,
                                        const InitInfo &info, std::unique_ptr<Listener> listener,
                                        bool synchronize, int64_t timeout_ms);

}  // namespace wsync::nccl
