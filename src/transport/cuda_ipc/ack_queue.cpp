#include "transport/cuda_ipc/ack_queue.hpp"

#include <cinttypes>

#include "error.hpp"
#include "sys.hpp"

namespace wsync::cuda_ipc {

AckQueue::AckQueue(const gpu::Device &dev, std::shared_ptr<local::ReceiverEnd> end, int64_t timeout_ms)
    : dev_(dev), end_(std::move(end)), index_(end_->index()), timeout_ms_(timeout_ms),
      thread_(sys::start_thread([this] { run(); })) {}

AckQueue::~AckQueue() {
    std::string ignored;
    drain(0, &ignored);  // bounded; what is left the thread fails at each chunk's own deadline
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void AckQueue::defer(gpu::CUstream stream, const ChunkHeader &h, uint32_t slot, uint64_t seq) {
    std::unique_ptr<gpu::Event> ev;
    {
        std::lock_guard<std::mutex> lk(mu_);
        if (!spare_.empty()) {
            ev = std::move(spare_.back());
            spare_.pop_back();
        }
    }
    if (!ev) ev = std::make_unique<gpu::Event>(dev_);
    ev->record(stream);  // after every copy the loader queued for this chunk
    {
        std::lock_guard<std::mutex> lk(mu_);
        pending_.push_back(Pending{std::move(ev), h, slot, seq, sys::Deadline(timeout_ms_)});
    }
    cv_.notify_all();
}

wsync_status_t AckQueue::drain(uint64_t version, std::string *message) {
    std::unique_lock<std::mutex> lk(mu_);
    const sys::Deadline deadline(timeout_ms_);
    while (!pending_.empty()) {
        if (deadline.passed()) {
            *message = strf("cuda_ipc: receiver %u: the loader's work for %zu earlier chunk(s) "
                             "(the first: chunk %u of version %" PRIu64 ") is still running on "
                             "%s after %" PRId64 " ms",
                             index_, pending_.size(), pending_.front().header.chunk_index,
                             pending_.front().header.version, dev_.uuid_string().c_str(),
                             timeout_ms_);
            return WSYNC_ERR_TIMEOUT;
        }
        cv_.wait_for(lk, std::chrono::milliseconds(std::min<int64_t>(deadline.remaining_ms() + 1, 100)));
    }
    const wsync_status_t failed = failed_version_ == version ? failed_ : WSYNC_OK;
    if (failed != WSYNC_OK) *message = failure_;
    failed_ = WSYNC_OK;
    failed_version_ = 0;
    failure_.clear();
    return failed;
}

void AckQueue::fail_front(wsync_status_t status, const std::string &why) {
    Pending &p = pending_.front();
    end_->fail(p.header, local::ChunkAt{p.slot, p.seq}, status, why);
    if (failed_ == WSYNC_OK) failed_ = status, failed_version_ = p.header.version, failure_ = why;
    pending_.pop_front();  // its event may be in an error state: not reused
    cv_.notify_all();
}

void AckQueue::run() {
    std::unique_ptr<gpu::Device::Scope> scope;  // the device's context, for the thread's life
    try {
        scope = std::make_unique<gpu::Device::Scope>(dev_);
    } catch (...) {
    }
    std::unique_lock<std::mutex> lk(mu_);
    gpu::Backoff backoff;
    for (;;) {
        if (pending_.empty()) {  // idle: the next chunk's wait starts afresh
            cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
            backoff.restart();
        }
        if (pending_.empty()) return;  // stop_, nothing owed
        Pending &p = pending_.front();  // only this thread pops; push_back keeps references
        const std::string chunk = strf("chunk %u of version %" PRIu64, p.header.chunk_index,
                                       p.header.version);
        bool done = false;
        try {
            done = p.event->done();
        } catch (const Error &e) {
            fail_front(e.status(), strf("cuda_ipc: receiver %u: the loader's work on %s after %s "
                                        "failed: %s",
                                        index_, dev_.uuid_string().c_str(), chunk.c_str(), e.what()));
            backoff.restart();
            continue;
        }
        if (done) {
            end_->acknowledge(local::ChunkAt{p.slot, p.seq}, WSYNC_OK);
            spare_.push_back(std::move(p.event));
            pending_.pop_front();
            cv_.notify_all();
            backoff.restart();
            continue;
        }
        if (p.deadline.passed()) {
            fail_front(WSYNC_ERR_TIMEOUT,
                       strf("cuda_ipc: receiver %u: the loader's work on %s after %s did not "
                            "finish in %" PRId64 " ms",
                            index_, dev_.uuid_string().c_str(), chunk.c_str(), timeout_ms_));
            backoff.restart();
            continue;
        }
        lk.unlock();
        backoff.pause();
        lk.lock();
    }
}

}  // namespace wsync::cuda_ipc
