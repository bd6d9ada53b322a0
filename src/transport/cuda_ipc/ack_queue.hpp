// Acknowledgements a cuda_ipc receiver owes for chunks whose loader work is still running on
// the GPU. wsync_recv_end of a chunk that does not end its version hands its acknowledgement
// here instead of waiting for the loader's copies: an event is recorded on the loader's stream,
// and a thread of the receiver's own publishes the acknowledgement once that event completes
// (or reports the chunk failed when the work fails or outlives the deadline). So an engine takes
// chunk k+1 while chunk k's copies run, and the trainer still hears of chunk k only once its
// memory is no longer read. The chunk that ends a version drains the queue first (its
// wsync_recv_end waits for everything and reports a failed earlier chunk), so a version never
// completes on a failed copy.
//
// Who touches what: the owner thread calls defer() and drain(); the queue's thread only pops,
// polls events and writes this receiver's acknowledgement words (one atomic store per slot, as
// the owner's own acknowledgements) and its failure records, under board_mutex(), which the
// owner also holds for its own failure records.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu/device.hpp"
#include "transport/local/receiver_end.hpp"
#include "strategy.hpp"

namespace wsync::cuda_ipc {

class AckQueue {
public:
    AckQueue(const gpu::Device &dev, std::shared_ptr<local::ReceiverEnd> end, int64_t timeout_ms);
    // Waits (up to the deadline) for the queued chunks and publishes them, then stops the thread.
    ~AckQueue();
    AckQueue(const AckQueue &) = delete;
    AckQueue &operator=(const AckQueue &) = delete;

    // Records an event on `stream` now and queues the acknowledgement of (slot, seq). Throws
    // (nothing queued) when the event cannot be recorded; the caller then waits itself.
    void defer(gpu::CUstream stream, const ChunkHeader &h, uint32_t slot, uint64_t seq);
    // Waits until every queued acknowledgement is published (deadline: the receiver's timeout
    // from now). Returns WSYNC_OK, or the first failure of a queued chunk of `version` since
    // the last drain (its status; *message names the chunk and why), or WSYNC_ERR_TIMEOUT if
    // the queue did not drain in time (the chunks left are then reported failed to the sender
    // by the thread at their own deadlines). A failed chunk of another version (one the trainer
    // abandoned after hearing of it) does not fail `version`.
    wsync_status_t drain(uint64_t version, std::string *message);

private:
    struct Pending {
        std::unique_ptr<gpu::Event> event;
        ChunkHeader header;
        uint32_t slot;
        uint64_t seq;
        sys::Deadline deadline;
    };
    void run();
    // Publishes the front chunk as failed (caller holds mu_).
    void fail_front(wsync_status_t status, const std::string &why);

    const gpu::Device &dev_;
    std::shared_ptr<local::ReceiverEnd> end_;
    uint32_t index_;  // end_'s, for messages
    int64_t timeout_ms_;
    std::mutex mu_;
    std::condition_variable cv_;       // the thread waits for work; drain() for an empty queue
    std::deque<Pending> pending_;
    std::vector<std::unique_ptr<gpu::Event>> spare_;  // events of published chunks, reused
    wsync_status_t failed_ = WSYNC_OK;  // the first failure since the last drain
    uint64_t failed_version_ = 0;
    std::string failure_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace wsync::cuda_ipc
