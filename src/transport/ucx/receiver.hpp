// The ucx receiver: attaches to the trainer (hello/welcome), and for each chunk asks for a
// lease, fetches the chunk (or each run of selected ranges) into its own buffer, and
// acknowledges.
#pragma once

#include <cstdint>
#include <memory>

#include "plan/select.hpp"
#include "strategy.hpp"
#include "transport/ucx/init_info.hpp"
#include "transport/ucx/worker.hpp"

namespace wsync::ucx {

struct ReceiverOptions {
    Config config;
    bool verify = true;
    unsigned copy_threads = 0;
    int64_t timeout_ms = 60000;
    std::shared_ptr<const select::Spec> selection;  // null: every tensor
    int device = -1;  // "device": the engine's GPU (wsync_recv_copy into its memory); -1: none
};

std::unique_ptr<ReceiverImpl> make_receiver(const InitInfo &info, uint32_t index,
                                            const ReceiverOptions &options);

}  // namespace wsync::ucx
