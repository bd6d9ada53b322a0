#include "transport/nccl/comm.hpp"

#include "error.hpp"

namespace wsync::nccl {

namespace {
constexpr gpu::ncclResult_t kNcclInvalidUsage = 5;  // nccl.h: ncclInvalidUsage

std::string version_family(int code) {
    std::string v = gpu::nccl_version_text(code);
    return v.substr(0, v.rfind('.'));  // "2.28": ranks must agree on major.minor
}
}  // namespace

Comm::Comm(const gpu::NcclApi &nccl, const gpu::Device &dev, const InitInfo &info, int rank,
           int64_t timeout_ms)
    : nccl_(nccl), dev_(dev), rank_(rank), teardown_ms_(timeout_ms) {
    const std::string who = std::string(kKind) + " rank " + std::to_string(rank);
    if (version_family(info.nccl_version) != version_family(nccl.version))
        fail(WSYNC_ERR_MISMATCH, who + ": the trainer uses NCCL " +
                                     gpu::nccl_version_text(info.nccl_version) + ", this process " +
                                     gpu::nccl_version_text(nccl.version) + " (" + nccl.path +
                                     "); every rank needs the same major.minor");
    gpu::ncclConfig_t config{};
    config.size = sizeof config;
    config.magic = gpu::kNcclConfigMagic;
    config.version = gpu::kNcclMinVersion;
    config.blocking = 0;  // return at once; progress is polled below, with a deadline
    config.cgaClusterSize = config.minCTAs = config.maxCTAs = gpu::kNcclConfigUndefInt;
    config.netName = nullptr;
    gpu::Device::Scope scope(dev_);
    gpu::ncclResult_t rc = nccl_.ncclCommInitRankConfig(&comm_, static_cast<int>(info.nranks),
                                                        info.id, rank, &config);
    if (rc != gpu::ncclSuccess && rc != gpu::ncclInProgress) {
        if (comm_) nccl_.ncclCommAbort(comm_);
        comm_ = nullptr;
        gpu::nccl_fail(nccl_, rc, who + ": ncclCommInitRankConfig");
    }
    const gpu::ncclResult_t state = poll_async(sys::Deadline(timeout_ms));
    const std::string where = who + " on " + dev_.uuid_string();
    if (state == gpu::ncclInProgress) {
        abort();
        fail(WSYNC_ERR_TIMEOUT,
             where + ": the group of " + std::to_string(info.nranks) +
                 " ranks was not complete after " + std::to_string(timeout_ms) +
                 " ms (the sender is rank 0, receiver i is rank i + 1; every one must be "
                 "created from this init info, each on a GPU of its own: a receiver on the "
                 "sender's GPU is refused before it joins, two on one GPU fail NCCL's init); "
                 "communicator aborted");
    }
    if (state == kNcclInvalidUsage) {
        // NCCL's duplicate-GPU check ends the init of every rank on a shared GPU this way
        // (NCCL_DEBUG=WARN: "Duplicate GPU detected"); the receivers cannot see each other's
        // GPUs before it, so only the likely cause can be named.
        abort();
        fail(WSYNC_ERR_PEER,
             where + ": communicator creation failed: " + describe(state) +
                 "; the likely cause: another rank of this group on the same GPU (NCCL refuses "
                 "two ranks of one communicator on one GPU; every receiver needs a GPU of its "
                 "own, apart from the sender's: engines on the trainer's GPU use \"cuda_ipc\"); "
                 "communicator aborted");
    }
    if (state != gpu::ncclSuccess) {
        abort();
        fail(WSYNC_ERR_PEER, where + ": communicator creation failed: " + describe(state) +
                                 "; communicator aborted");
    }
}

void Comm::close() noexcept {
    if (!comm_) return;
    try {
        gpu::Device::Scope scope(dev_);
        const sys::Deadline deadline(teardown_ms_);
        const gpu::ncclResult_t rc = nccl_.ncclCommFinalize(comm_);
        if ((rc == gpu::ncclSuccess || rc == gpu::ncclInProgress) &&
            poll_async(deadline) == gpu::ncclSuccess) {
            nccl_.ncclCommDestroy(comm_);
            comm_ = nullptr;
            return;
        }
    } catch (...) {
    }
    abort();
}

void Comm::abort() noexcept {
    if (!comm_) return;
    try {
        gpu::Device::Scope scope(dev_);
        nccl_.ncclCommAbort(comm_);
    } catch (...) {
    }
    comm_ = nullptr;
}

void Comm::check(const std::string &what) {
    if (!comm_)
        fail(WSYNC_ERR_PEER, who() + ": the communicator was aborted by an earlier failure; "
                                     "make a new sender or receiver from new init info");
    gpu::ncclResult_t state = gpu::ncclSuccess;
    nccl_.ncclCommGetAsyncError(comm_, &state);
    if (state != gpu::ncclSuccess && state != gpu::ncclInProgress) {
        abort();
        fail(WSYNC_ERR_PEER, who() + ": " + what + ": " + describe(state) + "; communicator aborted");
    }
}

void Comm::wait(const gpu::Event &ev, const sys::Deadline &deadline, const std::string &what) {
    gpu::Backoff backoff;
    for (;;) {
        check(what);
        if (ev.done()) return;
        if (deadline.passed()) {
            abort();
            fail(WSYNC_ERR_TIMEOUT, who() + ": " + what + " did not complete within " +
                                        std::to_string(deadline.budget_ms()) +
                                        " ms; communicator aborted");
        }
        backoff.pause();
    }
}

void Comm::broadcast(void *buf, uint64_t bytes, gpu::CUstream stream,
                     const sys::Deadline &deadline, const std::string &what) {
    const gpu::ncclResult_t rc =
        nccl_.ncclBroadcast(buf, buf, bytes, gpu::ncclUint8, 0, comm_, stream);
    if (rc == gpu::ncclSuccess) return;
    if (rc != gpu::ncclInProgress) {
        abort();
        gpu::nccl_fail(nccl_, rc, who() + ": ncclBroadcast, " + what + " (communicator aborted)");
    }
    const gpu::ncclResult_t state = poll_async(deadline);
    if (state == gpu::ncclSuccess) return;
    abort();
    if (state == gpu::ncclInProgress)
        fail(WSYNC_ERR_TIMEOUT, who() + ": ncclBroadcast, " + what +
                                    ", was still ncclInProgress (not yet enqueued) after " +
                                    std::to_string(deadline.budget_ms()) +
                                    " ms; communicator aborted");
    fail(WSYNC_ERR_PEER, who() + ": ncclBroadcast, " + what + ": " + describe(state) +
                             "; communicator aborted");
}

std::string Comm::who() const { return std::string(kKind) + " rank " + std::to_string(rank_); }

gpu::ncclResult_t Comm::poll_async(const sys::Deadline &deadline) {
    gpu::Backoff backoff;
    for (;;) {
        gpu::ncclResult_t state = gpu::ncclInProgress;
        const gpu::ncclResult_t rc = nccl_.ncclCommGetAsyncError(comm_, &state);
        if (rc != gpu::ncclSuccess && rc != gpu::ncclInProgress) return rc;  // the query failed
        if (state != gpu::ncclInProgress || deadline.passed()) return state;
        backoff.pause();
    }
}

std::string Comm::describe(gpu::ncclResult_t r) const {
    const char *text = nccl_.ncclGetErrorString(r);
    return "ncclResult_t " + std::to_string(r) + (text ? std::string(" (") + text + ")" : "");
}

}  // namespace wsync::nccl
