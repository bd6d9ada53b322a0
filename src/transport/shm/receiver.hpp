// shm's receiver: checks each request against the board, yields views straight into the
// bucket (read-only mapping), and acknowledges or refuses on the board.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/local/segment.hpp"
#include "strategy.hpp"

namespace wsync::shm {

// `seg` is attached and `index` already claimed on its board (board::attach).
std::unique_ptr<ReceiverImpl> make_receiver(std::shared_ptr<SharedSegment> seg, uint32_t index,
                                            bool verify, bool checksums_promised,
                                            unsigned copy_threads);

}  // namespace wsync::shm
