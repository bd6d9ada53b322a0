// The UCX side of one sender or receiver (the counterpart of nccl/comm): a UCP context and
// worker, endpoints to peers with their error state, control messages as active messages,
// memory regions with remote keys, and bounded waits. Not thread-safe: the sender serialises
// every call under its own mutex, a receiver is used by one thread at a time (wsync.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <poll.h>
#include <string>
#include <vector>

#include "sys.hpp"
#include "transport/ucx/api.hpp"
#include "transport/ucx/init_info.hpp"
#include "transport/ucx/stream.hpp"

namespace wsync::ucx {

// How long waits keep progressing without sleeping after UCX last reported work.
inline constexpr std::chrono::microseconds kSpin{50000};

struct Config {
    std::string library;      // "" : $WSYNC_UCX_LIBRARY, else libucp.so.0
    std::string transports;   // UCX_TLS for this context ("" : UCX's own choice)
    std::string net_devices;  // UCX_NET_DEVICES for this context ("" : UCX's own choice)
    // "data_path": a trainer offers a data stream (stream.hpp) on the first device of
    // net_devices; an engine takes one a trainer offers.
    bool stream = false;
};

// One connection to a peer. Its address is stable (the error handler holds it).
struct Endpoint {
    ucp_ep_h ep = nullptr;
    ucs_status_t error = UCS_OK;  // set by UCX's error handler: the peer is gone or unreachable
    std::string peer;             // "the trainer (session 0123456789abcdef)", "receiver 1 (pid 40)"
    // Its data stream (stream.hpp), once one is proven: Data messages then travel on it.
    std::unique_ptr<Stream> stream;
    class Worker *streams_with = nullptr;  // the worker that pumps it
    Endpoint() = default;
    Endpoint(const Endpoint &) = delete;
    Endpoint &operator=(const Endpoint &) = delete;
    ~Endpoint();  // one with a stream leaves its worker's list (close() does that first)
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
    // Sleeps on the worker's wakeup descriptor (and its streams) up to `ms`, unless events are
    // already pending.
    void sleep(int ms) {
        if (inbox_.empty() && arm()) wait_fd(ms, -1);
    }
    // Arms the wakeup descriptor; false when events are pending (ucp_worker_arm says
    // UCS_ERR_BUSY), and the descriptor would not fire for them: progress again instead.
    bool arm();
    // What a sleep waits on: the armed descriptor, `extra_fd` (if >= 0), the stream listener,
    // connections waiting for their proof, streams with frames to write or to read. Taken
    // under the owner's lock; poll_on() needs none.
    std::vector<pollfd> poll_set(int extra_fd) const;
    static void poll_on(std::vector<pollfd> &fds, int ms);
    void wait_fd(int ms, int extra_fd) const {
        std::vector<pollfd> fds = poll_set(extra_fd);
        poll_on(fds, ms);
    }
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
    // unchanged and allocated until take_sent() names `tag`) as the payload: on the endpoint's
    // stream if it has one, else eager or rendezvous as UCX chooses.
    // `hashed`: over a data stream, the payload goes to the socket at most kHashSlice bytes a
    // call, each slice reported to set_written()'s function right after it was written (while
    // the kernel's read of it has left it in the cache: trail.hpp).
    void send_data(Endpoint &ep, std::vector<uint8_t> sealed, const void *data, std::size_t n, uint64_t tag,
                   bool hashed = false);
    static constexpr std::size_t kHashSlice = 256 << 10;
    // Told (tag, first byte, bytes) of each slice of a `hashed` payload the stream wrote; runs
    // inside progress(), on whichever thread called it.
    void set_written(std::function<void(uint64_t, const uint8_t *, std::size_t)> f) { written_ = std::move(f); }
    // The tags of the Data sends that completed or failed since the last call.
    std::vector<uint64_t> take_sent();
    // Whether Data sends completed since the last take_sent() (one that completed in place
    // raises no event a later progress would report).
    bool has_sent() const { return !sent_.empty(); }
    // Receives a rendezvous or stream Data message's payload (Msg::desc) into dst (Msg::length
    // bytes); returns the request (null: done), or throws WSYNC_ERR_PEER naming `what`.
    void *receive(void *desc, void *dst, std::size_t n, const std::string &what);
    // The same for a stream Data message only (is_stream_desc), its payload scattered over
    // `runs` in order (their lengths sum to Msg::length): the kernel copies each byte once, into
    // its run. `landed`, if set, is called on this thread after every read with the count of
    // payload bytes in place so far (wsync_receiver_land's hashing as the bytes land).
    void *receive_scattered(void *desc, std::vector<Stream::Run> runs, std::function<void(uint64_t)> landed,
                            const std::string &what);
    // Whether the endpoint has a data stream open (its Data comes on it).
    bool streams(const Endpoint &ep) const { return ep.stream && ep.stream->fd >= 0; }
    // Whether a Data message's descriptor is the data stream's (else UCX's, or none: eager).
    bool is_stream_desc(void *desc) const { return desc && desc == stream_desc(); }
    // A request receive() returned: UCS_INPROGRESS, UCS_OK, or why it failed.
    ucs_status_t request_status(void *req) const;
    // Frees it. One still in progress ends with its endpoint's close (a stream's is broken:
    // the rest of its payload would be read as the next frame, so it is closed at once).
    void request_free(void *req) noexcept;
    // Gives back a rendezvous or stream Data message not received.
    void release(void *desc) noexcept;

    // ---- the data stream (stream.hpp) ----------------------------------------------------
    // The trainer's: when its Config says so, listens on the first address of its net_devices
    // and returns it as a welcome carries it; empty when it does not, no device has an address,
    // or the socket cannot be made: Data then travels over UCX.
    std::string listen_stream();
    bool offers_stream() const { return config_.stream; }
    // Decides whether a connection's proof (index, token, the nonce it was sent, its MAC) is
    // right, and for which endpoint (null: it is closed). Called during progress().
    void set_stream_auth(std::function<Endpoint *(uint32_t, uint64_t, const Nonce &, const Mac &)> auth) {
        stream_auth_ = std::move(auth);
    }
    // The engine's: connects to the trainer's stream `address` (from its authenticated welcome)
    // and proves the connection key, bounded by the deadline (and kProofMs). False, with *why
    // set, when it could not: Data then keeps travelling over UCX.
    bool connect_stream(Endpoint &ep, const std::string &address, const Key &key, uint32_t index,
                        uint64_t token, const sys::Deadline &deadline, std::string *why);

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
    unsigned pump_streams();
    void accept_streams();
    unsigned pump_out(Endpoint &ep);
    unsigned pump_in(Endpoint &ep, bool payload_only = false);
    void break_stream(Endpoint &ep) noexcept;
    Stream *stream_of(void *desc) const;
    friend struct Endpoint;
    void forget_stream(Endpoint *ep) noexcept;
    void *stream_desc() const { return const_cast<char *>(&stream_desc_); }

    const Api &api_;
    Config config_;
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
    std::function<void(uint64_t, const uint8_t *, std::size_t)> written_;
    // The data stream's side (stream.hpp).
    int listen_fd_ = -1;
    struct HalfOpen {
        int fd;
        Nonce nonce;
        std::vector<uint8_t> got;
        std::chrono::steady_clock::time_point end;
    };
    std::vector<HalfOpen> half_open_;
    std::vector<Endpoint *> streamed_;  // endpoints with a stream (close() takes them out)
    std::function<Endpoint *(uint32_t, uint64_t, const Nonce &, const Mac &)> stream_auth_;
    bool reader_ = false;  // the engine's side: streams are read, not written
    std::vector<Stream::Req *> done_reqs_;  // stream receives ended, not yet freed
    char stream_desc_ = 0;                  // its address: a stream message's Msg::desc
};

// The most ucp_worker_progress calls one Worker::progress() makes.
inline constexpr int kMaxProgressCalls = 1024;

// Waits for a UCX request (null: already complete) up to the deadline, progressing; returns
// its status, or UCS_ERR_TIMED_OUT after cancelling it at the deadline. Frees the request.
ucs_status_t finish(Worker &w, void *request, const Endpoint &ep, const sys::Deadline &deadline);

}  // namespace wsync::ucx
