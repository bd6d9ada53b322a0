// The ucx sender: stages each chunk in host memory, serves receivers' leased, bounds-checked
// fetches from a progress thread, keeps the last "keep_versions" committed versions pullable, and
// tracks elastic membership (attach, leases, acknowledgements, deaths).
#pragma once

#include <cstdint>
#include <memory>

#include "strategy.hpp"
#include "transport/ucx/init_info.hpp"
#include "transport/ucx/worker.hpp"

namespace wsync::ucx {

// copy_threads: the option, threads that pack and hash one large tensor (copy::Pool).
// arena_bytes: the option, host memory for the trainer's own tensors (0: none; rounded up to
// whole pages), whose chunks laid out as the sender would pack them cross without a pack.
std::unique_ptr<SenderImpl> make_sender(std::unique_ptr<Worker> worker, const InitInfo &info,
                                        int64_t timeout_ms, uint64_t block_bytes,
                                        unsigned copy_threads, uint64_t arena_bytes);

}  // namespace wsync::ucx
