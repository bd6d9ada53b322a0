// The UCX side of one sender or receiver (the counterpart of nccl/comm): a UCP context and
// worker, endpoints to peers with their error state, control messages as active messages,
// memory regions with remote keys, and bounded waits. Not thread-safe: the sender serialises
// every call under its own mutex, a receiver is used by one thread at a time (wsync.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sys.hpp"
#include "transport/ucx/api.hpp"
#include "transport/ucx/init_info.hpp"

namespace wsync::ucx {

// How long waits keep progressing without sleeping after UCX last reported work.
inline constexpr std::chrono::microseconds kSpin{50000};

struct Config {
    std::string library;      // "" : $WSYNC_UCX_LIBRARY, else libucp.so.0
    std::string transports;   // UCX_TLS for this context ("" : UCX's own choice)
    std::string net_devices;  // UCX_NET_DEVICES for this context ("" : UCX's own choice)
};

// One connection to a peer. Its address is stable (the error handler holds it).
struct Endpoint {
    ucp_ep_h ep = nullptr;
    ucs_status_t error = UCS_OK;  // set by UCX's error handler: the peer is gone or unreachable
    std::string peer;             // "the trainer (session 0123456789abcdef)", "receiver 1 (pid 40)"
};

class Worker {
public:
    // `who` names the owner in messages ("ucx sender"). Throws WSYNC_ERR_UNAVAILABLE or
    // WSYNC_ERR_SYSTEM naming the UCX call that failed.
    Worker(const Config &config, std::string who);
    ~Worker();
    Worker(const Worker &) = delete;
    Worker &operator=(const Worker &) = delete;

    const Api &api() const { return api_; }
    const std::string &who() const { return who_; }
    std::vector<uint8_t> address() const;

    // One round of progress: UCX callbacks run, finished sends are freed, control messages
    // are decoded into the inbox (their MACs are the owner's to check: authentic()). Returns UCX's count of events.
    // A round is bounded (kMaxProgressCalls calls of ucp_worker_progress): a peer that keeps
    // sending cannot keep the owner from handling what arrived.
    unsigned progress();
    std::vector<Msg> take_inbox();
    // Decides, as each control or Data message arrives, whether it enters the inbox (the
    // owner checks its MAC and its sender's share there): what is not admitted is dropped at
    // once, so a flood of forged messages, or one peer's flood, cannot fill the inbox's
    // 65536 places ahead of honest peers' messages. None set: every decodable message enters.
    void set_admit(std::function<bool(const Msg &)> admit) { admit_ = std::move(admit); }
    // Sleeps on the worker's wakeup descriptor up to `ms`, unless events are already pending.
    void sleep(int ms) {
        if (arm()) wait_fd(ms, -1);
    }
    // Arms the wakeup descriptor; false when events are pending (ucp_worker_arm says
    // UCS_ERR_BUSY), and the descriptor would not fire for them: progress again instead.
    bool arm();
    // Polls the armed descriptor (and `extra_fd`, if >= 0) up to `ms`; needs no progress lock.
    void wait_fd(int ms, int extra_fd) const;
    // Wakes a sleep() in another thread (ucp_worker_signal may be called from any thread).
    void signal();
    // Progresses until done() or the deadline; false when the deadline passed first.
    bool wait(const std::function<bool()> &done, const sys::Deadline &deadline) { return wait(done, deadline, kSpin); }
    // The same, spinning only `spin` after UCX last reported work before it sleeps on the
    // wakeup descriptor (a thread beside the loader's, on few cores, spins not at all).
    bool wait(const std::function<bool()> &done, const sys::Deadline &deadline, std::chrono::microseconds spin);

    // An endpoint to a peer's worker address, failures reported through Endpoint::error
    // (UCP_ERR_HANDLING_MODE_PEER). Throws WSYNC_ERR_PEER if the address is unusable.
    std::unique_ptr<Endpoint> connect(const std::vector<uint8_t> &address, const std::string &peer);
    // Force-closes (UCP_EP_CLOSE_FLAG_FORCE: no flush, nothing waits on the peer), progressing
    // up to the deadline; never throws.
    void close(std::unique_ptr<Endpoint> ep, const sys::Deadline &deadline) noexcept;
    // Queues a sealed control message (seal_msg); it completes (or fails with the endpoint)
    // during progress.
    void send(Endpoint &ep, std::vector<uint8_t> sealed);
    // Queues a Data message: the sealed message as the header, n bytes at `data` (which stay
    // unchanged and allocated until take_sent() names `tag`) as the payload, eager or
    // rendezvous as UCX chooses.
    void send_data(Endpoint &ep, std::vector<uint8_t> sealed, const void *data, std::size_t n, uint64_t tag);
    // The tags of the Data sends that completed or failed since the last call.
    std::vector<uint64_t> take_sent();
    // Whether Data sends completed since the last take_sent() (one that completed in place
    // raises no event a later progress would report).
    bool has_sent() const { return !sent_.empty(); }
    // Receives a rendezvous Data message's payload (Msg::desc) into dst (Msg::length bytes);
    // returns the request (null: done), or throws WSYNC_ERR_PEER naming `what`.
    void *receive(void *desc, void *dst, std::size_t n, const std::string &what);
    // Gives back a rendezvous Data message not received.
    void release(void *desc) noexcept;

    // Memory types this context can move ("host", "cuda", ...), for `wsync kinds`.
    std::string memory_types() const;
    // The transports this context found ("tcp, posix, sysv, cma"), for `wsync kinds`.
    std::string transports() const;

private:
    static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data,
                              size_t length, const ucp_am_recv_param_t *param);
    static ucs_status_t on_data(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param);
    static ucs_status_t on_stray(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param);
    void reap() noexcept;

    const Api &api_;
    std::string who_;
    ucp_context_h context_ = nullptr;
    ucp_worker_h worker_ = nullptr;
    int efd_ = -1;
    struct Pending {
        std::vector<uint8_t> bytes;
        void *request;
        uint64_t tag = 0;  // a Data send's (0: a control message)
    };
    std::vector<Pending> sends_;
    std::vector<uint64_t> sent_;  // tags of Data sends done
    std::vector<Msg> inbox_;
    std::function<bool(const Msg &)> admit_;
};

// The most ucp_worker_progress calls one Worker::progress() makes.
inline constexpr int kMaxProgressCalls = 1024;

// Waits for a UCX request (null: already complete) up to the deadline, progressing; returns
// its status, or UCS_ERR_TIMED_OUT after cancelling it at the deadline. Frees the request.
ucs_status_t finish(Worker &w, void *request, const Endpoint &ep, const sys::Deadline &deadline);

}  // namespace wsync::ucx
