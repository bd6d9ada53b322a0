// The model-update group's communicator, as one rank holds it: created non-blocking, polled
// against deadlines, and aborted rather than left hanging whenever something goes wrong.
#pragma once

#include <cstdint>
#include <string>

#include "gpu/api.hpp"
#include "gpu/device.hpp"
#include "sys.hpp"
#include "transport/nccl/init_info.hpp"

namespace wsync::nccl {

// A communicator that is aborted rather than left hanging whenever something goes wrong.
class Comm {
public:
    // Joins the group as `rank` within `timeout_ms` (WSYNC_ERR_TIMEOUT, WSYNC_ERR_PEER or
    // WSYNC_ERR_MISMATCH for another NCCL major.minor; the communicator aborted).
    Comm(const gpu::NcclApi &nccl, const gpu::Device &dev, const InitInfo &info, int rank,
         int64_t timeout_ms);
    ~Comm() { close(); }
    Comm(const Comm &) = delete;
    Comm &operator=(const Comm &) = delete;

    // Leaves the group within the teardown bound. ncclCommDestroy alone would first flush the
    // communicator's queued broadcasts with no timeout, so a peer that never posts its side
    // would hang the destructor. nccl.h, ncclCommFinalize: it "flushes all issued
    // communications, and marks communicator state as ncclInProgress. The state will change to
    // ncclSuccess when the communicator is globally quiescent [...]; then, calling
    // ncclCommDestroy can locally free the rest of the resources [...] without blocking" (also
    // NCCL User Guide, "Creating a Communicator: Finalizing a communicator"). So: finalize, poll
    // the state until the bound, then destroy, or abort when the bound passes or NCCL fails.
    void close() noexcept;

    gpu::ncclComm_t get() const { return comm_; }

    void abort() noexcept;

    // Throws WSYNC_ERR_PEER (and aborts) if NCCL reports an asynchronous error.
    void check(const std::string &what);

    // Waits for `ev` while watching the communicator; aborts at the deadline.
    void wait(const gpu::Event &ev, const sys::Deadline &deadline, const std::string &what);

    // Posts this rank's side of a broadcast of `bytes` at `buf` from rank 0 on `stream`, and
    // returns once NCCL has enqueued it, so an event recorded next on `stream` follows it. A
    // non-blocking communicator may return ncclInProgress before the kernel is on the stream;
    // NCCL then requires polling ncclCommGetAsyncError until the state leaves ncclInProgress
    // before the communicator or its stream is used again (NCCL User Guide, "Group Calls:
    // Nonblocking Group Operation"; NCCL API, ncclCommGetAsyncError). Aborts the communicator
    // on an error or when the deadline passes first.
    void broadcast(void *buf, uint64_t bytes, gpu::CUstream stream, const sys::Deadline &deadline,
                   const std::string &what);

private:
    std::string who() const;
    // Polls ncclCommGetAsyncError until the state leaves ncclInProgress or the deadline
    // passes. Returns the last state: ncclInProgress means the deadline passed.
    gpu::ncclResult_t poll_async(const sys::Deadline &deadline);
    std::string describe(gpu::ncclResult_t r) const;

    const gpu::NcclApi &nccl_;
    const gpu::Device &dev_;
    int rank_;
    int64_t teardown_ms_;  // the bound of close(): the "timeout_ms" option
    gpu::ncclComm_t comm_ = nullptr;
};

}  // namespace wsync::nccl
