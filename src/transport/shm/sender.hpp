// shm's sender: packs each chunk into the next bucket once every receiver is done with the
// bucket's previous chunk, then publishes it on the board.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/local/segment.hpp"
#include "strategy.hpp"

namespace wsync::shm {

// `seg` is the segment this process created. Claims the board's sender index.
// copy_threads: the option, threads that pack and hash one large tensor (copy::Pool).
std::unique_ptr<SenderImpl> make_sender(std::shared_ptr<SharedSegment> seg, bool checksum,
                                        int64_t timeout_ms, unsigned copy_threads);

}  // namespace wsync::shm
