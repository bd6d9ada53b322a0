// The small shared-memory segment every cuda_ipc sender and receiver of one sync maps: its
// identity, the sender count, and the acknowledgement board (board.hpp). The GPU bytes never
// touch it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "board.hpp"
#include "sys.hpp"

namespace wsync::cuda_ipc {

struct Control;  // the segment's layout (segment.cpp)

class BoardSegment {
public:
    // Creates the segment under a fresh name and serves its descriptor to re-attaching engines.
    static std::shared_ptr<BoardSegment> create(uint32_t senders, uint32_t receivers,
                                                uint32_t slots);
    // By name while it exists, else through the creator's rendezvous socket (an engine
    // re-attaching after the name was removed). WSYNC_ERR_MISMATCH when the segment does not
    // match the init info.
    static std::shared_ptr<BoardSegment> attach(const std::string &name,
                                                const std::string &rendezvous, uint32_t senders,
                                                uint32_t receivers, uint32_t slots,
                                                int64_t timeout_ms);
    ~BoardSegment();
    BoardSegment(const BoardSegment &) = delete;
    BoardSegment &operator=(const BoardSegment &) = delete;

    // Removes the name once every sender and receiver has mapped the segment (or at the
    // owner's end): after that nothing is left in /dev/shm, even if every process is killed.
    void unlink_if_complete();
    void unlink() noexcept;

    board::Board *board() const;
    int fd() const { return fd_; }
    uint32_t receivers() const { return receivers_; }
    uint32_t slots() const { return slots_; }
    const std::string &name() const { return name_; }
    const std::string &rendezvous() const { return rendezvous_; }

private:
    BoardSegment() = default;
    std::string name_, rendezvous_;
    std::unique_ptr<sys::FdServer> server_;  // the creator's: hands fd_ to re-attaching engines
    Control *c_ = nullptr;
    int fd_ = -1;  // kept open: the liveness locks live on it
    uint32_t receivers_ = 0, slots_ = 0;  // from the init info, never re-read from shared memory
    bool owner_ = false;
    bool unlinked_ = false;
};

}  // namespace wsync::cuda_ipc
