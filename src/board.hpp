// The acknowledgement board: a block of POSIX shared memory through which receivers on this
// machine tell senders that they are done with a chunk, and through which a waiting sender
// tells a dead receiver from a slow one. Every strategy whose receivers are processes on the
// sender's host uses it (shm embeds it at the head of its segment; cuda_ipc keeps it in a small
// segment of its own). It knows chunks only as (slot, seq) pairs, nothing of any wire format.
//
// Protocol. A sender publishes chunk number `seq` (1, 2, ...) in slot (seq - 1) % slots with a
// release store, after every receiver has acknowledged that slot's previous chunk. A receiver
// checks the slot (acquire) before touching the chunk, and acknowledges it by storing
// (seq << 8 | status) in its ack word for the slot, then bumps a futex word and wakes waiters.
// Receivers register their pid when they attach; a waiting sender polls those pids.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "sys.hpp"
#include "wsync.h"

namespace wsync::board {

constexpr uint32_t kMaxReceivers = 64;
constexpr uint32_t kMaxSlots = 64;

enum ReceiverState : uint32_t { kFree = 0, kAttached = 1, kDetached = 2 };

struct alignas(64) ReceiverSlot {
    std::atomic<int32_t> pid;
    std::atomic<uint32_t> state;
    std::atomic<uint64_t> failed_seq;     // first chunk this receiver acknowledged as failed
    std::atomic<uint32_t> failed_status;  // and its status
};

struct alignas(64) ChunkSlot {
    std::atomic<uint64_t> seq;                 // chunk now held (0: never used)
    std::atomic<uint64_t> ack[kMaxReceivers];  // per receiver: seq << 8 | status
};

// The shared layout. Zeroed memory plus init() is an empty board.
struct Board {
    char magic[8];
    uint32_t layout;
    uint32_t receivers;
    uint32_t slots;
    uint32_t reserved;
    std::atomic<uint32_t> ack_futex;  // bumped on every acknowledgement and detach
    ReceiverSlot receiver[kMaxReceivers];
    ChunkSlot slot[kMaxSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "acks must be lock-free in shared memory");
static_assert(std::atomic<int32_t>::is_always_lock_free, "pids must be lock-free in shared memory");

// Starts the lifetimes in zeroed shared memory and writes the geometry.
Board *init(void *zeroed_memory, uint32_t receivers, uint32_t slots);
// True if the board's magic, layout and geometry are what the init info says.
bool matches(const Board *b, uint32_t receivers, uint32_t slots);

// "[0, 3]" for a bit mask of receiver indices.
std::string list_indices(uint64_t mask);

// ---- sender side --------------------------------------------------------------------------
class Waiter {
public:
    // `kind` prefixes every message ("shm: receiver 1 (pid 42) died ...").
    Waiter(Board *b, std::string kind);
    void publish(uint32_t slot, uint64_t seq);
    // True once every receiver has attached at least once.
    bool all_attached() const;
    // Waits until every receiver has acknowledged the newest chunk of each slot in `slots`.
    // Fails with WSYNC_ERR_PEER when a receiver died or detached owing a chunk (and, if
    // `report_failures`, when one acknowledged a chunk as failed: once per failure), or with
    // WSYNC_ERR_TIMEOUT at the deadline naming the receivers that did not answer.
    // With several senders on one board (cuda_ipc), a slot may already hold the chunk another
    // sender just published; `max_seq` limits the wait to chunks up to that seq (the slot's
    // previous chunk, seq - slots, when making room for chunk seq).
    void wait(const std::vector<uint32_t> &slots, const sys::Deadline &deadline, const char *what,
              bool report_failures, uint64_t max_seq = UINT64_MAX);

private:
    uint64_t want(uint32_t slot) const;
    uint64_t pending(const std::vector<uint32_t> &slots) const;
    uint64_t oldest_pending_seq(uint32_t r, const std::vector<uint32_t> &slots) const;
    void check_failures();
    void check_alive(uint64_t mask, const std::vector<uint32_t> &slots);

    Board *b_;
    std::string kind_;
    uint64_t reported_[kMaxReceivers] = {};
    uint64_t max_seq_ = UINT64_MAX;
};

// ---- receiver side ------------------------------------------------------------------------
// Takes receiver slot `index` for this process: free, detached, or held by a dead pid.
// Throws WSYNC_ERR_WRONG_STATE if a live process holds it.
void attach(Board *b, uint32_t index, const std::string &kind);
// Marks the receiver detached and wakes waiting senders.
void detach(Board *b, uint32_t index) noexcept;
// The chunk a slot holds now (acquire): a request for another seq is stale or replayed.
uint64_t held(const Board *b, uint32_t slot);
void acknowledge(Board *b, uint32_t index, uint32_t slot, uint64_t seq,
                 wsync_status_t outcome) noexcept;

}  // namespace wsync::board
