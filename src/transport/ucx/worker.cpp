#include "transport/ucx/worker.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <mutex>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "error.hpp"

namespace wsync::ucx {
namespace {

// UCP_ERR_HANDLING_MODE_PEER: UCX reports a failed peer through this handler (called during
// ucp_worker_progress) and fails the endpoint's outstanding requests; the endpoint may then
// only be closed (ucp.h, ucp_err_handler_cb_t). We note the status; the owner closes it.
void on_ep_error(void *arg, ucp_ep_h, ucs_status_t status) {
    auto *ep = static_cast<Endpoint *>(arg);
    if (ep->error == UCS_OK) ep->error = status;
}

void check(const Api &a, ucs_status_t st, const std::string &what) {
    if (st != UCS_OK) ucs_fail(a, st, what, WSYNC_ERR_PEER);
}

// TCP connections made without blocking, so attaching is bounded by our deadline: with UCX's
// default (a blocking connect() inside ucp_ep_create) an engine whose packets to the trainer's
// port a firewall drops was held in wsync_receiver_create for the kernel's SYN retries, 134 s
// against a timeout_ms of 5000 (ucx user trial; with UCX_TCP_CONN_NB=y: TIMEOUT at 5.0 s).
// UCX 1.13 takes the transport's settings from the environment only (ucp_config_modify
// accepts "TCP_CONN_NB" and does not apply it), so it is set there, once per process, before
// the first UCX context, and never over the caller's own value (wsync.h says so).
void nonblocking_tcp_connect() {
    static std::once_flag once;
    std::call_once(once, [] { (void)setenv("UCX_TCP_CONN_NB", "y", 0); });
}

}  // namespace

Worker::Worker(const Config &config, std::string who)
    : api_(ucx::api(config.library)), config_(config), who_(std::move(who)) {
    nonblocking_tcp_connect();
    ucp_config_t *cfg = nullptr;
    check(api_, api_.ucp_config_read(nullptr, nullptr, &cfg), who_ + ": ucp_config_read");
    try {
        if (!config.transports.empty())
            check(api_, api_.ucp_config_modify(cfg, "TLS", config.transports.c_str()),
                  who_ + ": UCX transports '" + config.transports + "'");
        if (!config.net_devices.empty())
            check(api_, api_.ucp_config_modify(cfg, "NET_DEVICES", config.net_devices.c_str()),
                  who_ + ": UCX net devices '" + config.net_devices + "'");
    } catch (...) {
        api_.ucp_config_release(cfg);
        throw;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    // No UCP_FEATURE_RMA: with it UCX serves GET and PUT requests of any peer in software over
    // tcp (and shared memory) without checking that the memory was registered, so anyone who
    // reached the port could read and write this process (issue 37). Chunks move as active
    // messages the trainer sends after checking the engine's lease and the range (sender.cpp).
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    ucs_status_t st = api_.ucp_init_version(UCP_API_MAJOR, 13, &params, cfg, &context_);
    api_.ucp_config_release(cfg);
    if (st == UCS_ERR_NO_DEVICE && !(config.transports.empty() && config.net_devices.empty())) {
        // The options named what UCX cannot find here (ucx user trial: "eth9", "foo" or "rc"
        // on a host without them came back as SYSTEM "ucp_init: No such device").
        const char *s = api_.ucs_status_string ? api_.ucs_status_string(st) : "No such device";
        fail(WSYNC_ERR_UNAVAILABLE,
             who_ + ": UCX has no device for option 'transports' = \"" + config.transports +
                 "\" and 'net_devices' = \"" + config.net_devices + "\" on this host (ucp_init: " + s +
                 "; `ucx_info -d` lists what it has; \"\" lets UCX choose)");
    }
    check(api_, st, who_ + ": ucp_init");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // callers serialise (see worker.hpp)
    st = api_.ucp_worker_create(context_, &wp, &worker_);
    if (st == UCS_OK) st = api_.ucp_worker_get_efd(worker_, &efd_);
    if (st == UCS_OK) {
        ucp_am_handler_param_t hp{};
        hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                        UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
        hp.flags = UCP_AM_FLAG_WHOLE_MSG;
        hp.arg = this;
        // UCX 1.13.1 reads the handler-table entry of the id a message names before it checks
        // the id against the table's length, and leaves entries it grew the table by
        // uninitialised: an unregistered id past the table (28000) read past it, and one
        // inside it may find a stale callback; either killed the trainer (issue 37;
        // test_ucx_trust). So every id the wire can carry (16 bits) gets a handler, the
        // largest first (the table grows once, about 1.5 MiB): ours at kAmId, one that drops
        // the message at every other.
        hp.cb = &Worker::on_stray;
        for (unsigned id = kAmTableEnd + 1; id-- > 0 && st == UCS_OK;) {
            if (id == kAmId || id == kAmDataId) continue;
            hp.id = id;
            st = api_.ucp_worker_set_am_recv_handler(worker_, &hp);
        }
        if (st == UCS_OK) {
            hp.id = kAmId;
            hp.cb = &Worker::on_am;
            st = api_.ucp_worker_set_am_recv_handler(worker_, &hp);
        }
        if (st == UCS_OK) {
            hp.id = kAmDataId;
            hp.cb = &Worker::on_data;
            st = api_.ucp_worker_set_am_recv_handler(worker_, &hp);
        }
    }
    if (st != UCS_OK) {
        if (worker_) api_.ucp_worker_destroy(worker_);
        api_.ucp_cleanup(context_);
        check(api_, st, who_ + ": creating the UCP worker");
    }
}

Worker::~Worker() {
    for (Pending &p : sends_) api_.ucp_request_free(p.request);
    for (Msg &m : inbox_) release(m.desc);
    inbox_.clear();
    for (Endpoint *ep : streamed_) ep->streams_with = nullptr;  // their owners close them first
    for (Stream::Req *r : done_reqs_) delete r;
    for (HalfOpen &h : half_open_) ::close(h.fd);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    api_.ucp_worker_destroy(worker_);
    api_.ucp_cleanup(context_);
}

std::vector<uint8_t> Worker::address() const {
    ucp_address_t *addr = nullptr;
    size_t len = 0;
    check(api_, api_.ucp_worker_get_address(worker_, &addr, &len), who_ + ": worker address");
    std::vector<uint8_t> out(reinterpret_cast<uint8_t *>(addr), reinterpret_cast<uint8_t *>(addr) + len);
    api_.ucp_worker_release_address(worker_, addr);
    if (out.size() > kMaxAddressBytes)
        fail(WSYNC_ERR_UNSUPPORTED, who_ + ": the UCP worker address is " + std::to_string(out.size()) +
                                        " bytes, more than the " + std::to_string(kMaxAddressBytes) +
                                        " an init info may carry (narrow option 'net_devices')");
    return out;
}

// Control messages are small and sent eagerly (UCP_AM_SEND_FLAG_EAGER); with
// UCP_AM_FLAG_WHOLE_MSG the callback sees the whole message, and returning UCS_OK means UCX
// may drop the data once we return (ucp_def.h, ucp_am_recv_callback_t), so it is decoded here.
// A rendezvous message, or one with a user header, is nothing we sent: returning an error
// status drops it. So is a message whose bytes do not decode; one that decodes is still
// unauthenticated until its owner checks the MAC. Messages to every other id reach on_stray,
// which drops them (see the constructor).
ucs_status_t Worker::on_am(void *arg, const void *, size_t header_length, void *data, size_t length,
                           const ucp_am_recv_param_t *param) {
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_ERR_MESSAGE_TRUNCATED;
    if (header_length != 0) return UCS_OK;
    auto *self = static_cast<Worker *>(arg);
    Msg m;
    // Bounded between two progress rounds of the owner, whoever floods it.
    if (self->inbox_.size() < 65536 && decode_msg(data, length, m) && (!self->admit_ || self->admit_(m)))
        self->inbox_.push_back(std::move(m));
    return UCS_OK;
}

// A Data message: the sealed message in the header, the bytes as the payload. An eager one is
// copied (UCX may drop it once we return); a rendezvous one is kept (UCS_INPROGRESS) for the
// owner to receive into place, or give back. One whose header does not decode is dropped.
ucs_status_t Worker::on_data(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param) {
    auto *self = static_cast<Worker *>(arg);
    Msg m;
    if (self->inbox_.size() >= 65536 || !decode_msg(header, header_length, m) || m.type != MsgType::Data ||
        (self->admit_ && !self->admit_(m)))
        return UCS_OK;
    m.length = length;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        m.desc = data;
        self->inbox_.push_back(std::move(m));
        return UCS_INPROGRESS;
    }
    m.payload.assign(static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + length);
    self->inbox_.push_back(std::move(m));
    return UCS_OK;
}

ucs_status_t Worker::on_stray(void *, const void *, size_t, void *, size_t, const ucp_am_recv_param_t *param) {
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
}

unsigned Worker::progress() {
    unsigned n = 0, k;
    for (int i = 0; i < kMaxProgressCalls && (k = api_.ucp_worker_progress(worker_)) != 0; ++i) n += k;
    reap();
    return n + pump_streams();
}

void Worker::reap() noexcept {
    auto done = [&](Pending &p) {
        if (api_.ucp_request_check_status(p.request) == UCS_INPROGRESS) return false;
        api_.ucp_request_free(p.request);
        if (p.tag) sent_.push_back(p.tag);
        return true;
    };
    sends_.erase(std::remove_if(sends_.begin(), sends_.end(), done), sends_.end());
}

std::vector<Msg> Worker::take_inbox() {
    std::vector<Msg> out;
    out.swap(inbox_);
    return out;
}

bool Worker::arm() { return api_.ucp_worker_arm(worker_) == UCS_OK; }

std::vector<pollfd> Worker::poll_set(int extra_fd) const {
    std::vector<pollfd> fds{{efd_, POLLIN, 0}};
    if (extra_fd >= 0) fds.push_back({extra_fd, POLLIN, 0});
    if (listen_fd_ >= 0) fds.push_back({listen_fd_, POLLIN, 0});
    for (const HalfOpen &h : half_open_) fds.push_back({h.fd, POLLIN, 0});
    for (const Endpoint *ep : streamed_) {
        const Stream &s = *ep->stream;
        if (s.fd < 0) continue;
        if (reader_ ? s.in != Stream::In::Held : !s.out.empty())
            fds.push_back({s.fd, static_cast<short>(reader_ ? POLLIN : POLLOUT), 0});
    }
    return fds;
}

void Worker::poll_on(std::vector<pollfd> &fds, int ms) { (void)::poll(fds.data(), fds.size(), ms); }

void Worker::signal() { api_.ucp_worker_signal(worker_); }

bool Worker::wait(const std::function<bool()> &done, const sys::Deadline &deadline, std::chrono::microseconds spin) {
    // Spin while UCX reports work and for a short while after: a large transfer over tcp arrives as
    // many fragments, and a sleep on the wakeup descriptor per fragment would halve its rate.
    auto busy = std::chrono::steady_clock::now();
    for (;;) {
        const unsigned n = progress();
        if (done()) return true;
        if (deadline.passed()) return false;
        const auto now = std::chrono::steady_clock::now();
        if (n) busy = now;
        else if (now - busy >= spin)
            sleep(static_cast<int>(std::clamp<int64_t>(deadline.remaining_ms(), 1, 20)));
    }
}

std::unique_ptr<Endpoint> Worker::connect(const std::vector<uint8_t> &address, const std::string &peer) {
    auto ep = std::make_unique<Endpoint>();
    ep->peer = peer;
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t *>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = on_ep_error;
    p.err_handler.arg = ep.get();
    ucs_status_t st = api_.ucp_ep_create(worker_, &p, &ep->ep);
    if (st != UCS_OK) ucs_fail(api_, st, who_ + ": connecting to " + peer, WSYNC_ERR_PEER);
    return ep;
}

void Worker::close(std::unique_ptr<Endpoint> ep, const sys::Deadline &deadline) noexcept {
    if (ep && ep->stream) forget_stream(ep.get());
    if (!ep || !ep->ep) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void *req = api_.ucp_ep_close_nbx(ep->ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
        while (api_.ucp_request_check_status(req) == UCS_INPROGRESS && !deadline.passed()) {
            progress();
            if (api_.ucp_request_check_status(req) == UCS_INPROGRESS) sleep(1);
        }
        api_.ucp_request_free(req);
    }
    progress();  // the endpoint's error callback may still be queued; it holds `ep`
}

void Worker::send(Endpoint &ep, std::vector<uint8_t> sealed) {
    if (ep.error != UCS_OK) return;  // the peer is gone; the caller learns it from ep.error
    Pending p{std::move(sealed), nullptr};
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    rp.flags = UCP_AM_SEND_FLAG_EAGER;
    void *req = api_.ucp_am_send_nbx(ep.ep, kAmId, nullptr, 0, p.bytes.data(), p.bytes.size(), &rp);
    if (UCS_PTR_IS_ERR(req)) {
        if (ep.error == UCS_OK) ep.error = UCS_PTR_STATUS(req);
        return;
    }
    if (req == nullptr) return;  // sent in place
    p.request = req;             // the bytes stay alive until the send completes (reap)
    sends_.push_back(std::move(p));
}

void Worker::send_data(Endpoint &ep, std::vector<uint8_t> sealed, const void *data, std::size_t n, uint64_t tag,
                       bool hashed) {
    if (ep.error != UCS_OK) {
        sent_.push_back(tag);
        return;
    }
    if (ep.stream && ep.stream->fd >= 0) {
        Stream::Out o;
        o.head.resize(kFrameHead);
        const uint32_t hl = static_cast<uint32_t>(sealed.size());
        const uint64_t pl = n;
        for (int i = 0; i < 4; ++i) o.head[i] = static_cast<uint8_t>(hl >> (8 * i));
        for (int i = 0; i < 8; ++i) o.head[4 + i] = static_cast<uint8_t>(pl >> (8 * i));
        o.head.insert(o.head.end(), sealed.begin(), sealed.end());
        o.data = static_cast<const uint8_t *>(data);
        o.n = n;
        o.tag = tag;
        o.hashed = hashed && written_;
        ep.stream->out.push_back(std::move(o));
        pump_out(ep);
        return;
    }
    Pending p{std::move(sealed), nullptr, tag};
    ucp_request_param_t rp{};
    void *req = api_.ucp_am_send_nbx(ep.ep, kAmDataId, p.bytes.data(), p.bytes.size(), data, n, &rp);
    if (UCS_PTR_IS_ERR(req)) {
        if (ep.error == UCS_OK) ep.error = UCS_PTR_STATUS(req);
        sent_.push_back(tag);
        return;
    }
    if (req == nullptr) {
        sent_.push_back(tag);
        return;
    }
    p.request = req;  // the header and the payload stay alive until it completes (reap)
    sends_.push_back(std::move(p));
}

std::vector<uint64_t> Worker::take_sent() {
    std::vector<uint64_t> out;
    out.swap(sent_);
    return out;
}

void *Worker::receive(void *desc, void *dst, std::size_t n, const std::string &what) {
    if (desc == stream_desc()) return receive_scattered(desc, {Stream::Run{static_cast<uint8_t *>(dst), n}}, nullptr, what);
    ucp_request_param_t p{};
    void *req = api_.ucp_am_recv_data_nbx(worker_, desc, dst, n, &p);
    if (UCS_PTR_IS_ERR(req)) ucs_fail(api_, UCS_PTR_STATUS(req), who_ + ": receiving " + what, WSYNC_ERR_PEER);
    return req;
}

void *Worker::receive_scattered(void *desc, std::vector<Stream::Run> runs, std::function<void(uint64_t)> landed,
                                const std::string &what) {
    {
        uint64_t n = 0;
        for (const Stream::Run &r : runs) n += r.n;
        Stream *s = stream_of(desc);
        if (!s || n != s->payload)
            fail(WSYNC_ERR_PEER, who_ + ": receiving " + what + ": its stream was closed");
        runs.erase(std::remove_if(runs.begin(), runs.end(), [](const Stream::Run &r) { return r.n == 0; }), runs.end());
        auto *req = new Stream::Req;
        req->stream = s;
        s->req = req;
        s->runs = std::move(runs);
        s->run = 0;
        s->run_done = 0;
        s->landed = std::move(landed);
        s->left = n;
        s->in = n ? Stream::In::Payload : Stream::In::Head;
        if (!n) req->status = 0;
        for (Endpoint *ep : streamed_)  // the payload only: a header read now would wait unseen in the inbox
            if (ep->stream.get() == s) pump_in(*ep, /*payload_only=*/true);
        if (req->status == 1) return req;
        const int st = req->status;  // done already: pump_in() put it with the ended ones
        done_reqs_.erase(std::remove(done_reqs_.begin(), done_reqs_.end(), req), done_reqs_.end());
        delete req;
        if (st < 0)
            ucs_fail(api_, static_cast<ucs_status_t>(st), who_ + ": receiving " + what, WSYNC_ERR_PEER);
        return nullptr;
    }
}

void Worker::release(void *desc) noexcept {
    if (!desc) return;
    if (desc == stream_desc()) {
        Stream *s = stream_of(desc);
        if (!s) return;  // its stream is gone
        s->left = s->payload;
        s->in = s->left ? Stream::In::Discard : Stream::In::Head;
        return;  // the next progress round reads the payload away
    }
    api_.ucp_am_data_release(worker_, desc);
}

// A stream's receive is a Stream::Req (its stream knows it while it runs); anything else is
// UCX's request.
ucs_status_t Worker::request_status(void *req) const {
    for (const Endpoint *ep : streamed_)
        if (ep->stream->req == req) return UCS_INPROGRESS;
    for (const Stream::Req *r : done_reqs_)
        if (r == req) return r->status == 0 ? UCS_OK : static_cast<ucs_status_t>(r->status);
    return api_.ucp_request_check_status(req);
}

void Worker::request_free(void *req) noexcept {
    for (Endpoint *ep : streamed_)
        if (ep->stream->req == req) {  // still in progress: the stream is out of step from here
            break_stream(*ep);
            break;
        }
    for (auto it = done_reqs_.begin(); it != done_reqs_.end(); ++it)
        if (*it == req) {
            delete *it;
            done_reqs_.erase(it);
            return;
        }
    api_.ucp_request_free(req);
}

// A stream message's descriptor is the worker's own sentinel (an engine has one stream); it
// names the stream still held for it, or none once that stream broke or closed.
Stream *Worker::stream_of(void *desc) const {
    if (desc != stream_desc()) return nullptr;
    for (const Endpoint *ep : streamed_)
        if (ep->stream->in == Stream::In::Held) return ep->stream.get();
    return nullptr;
}

std::string Worker::memory_types() const {
    ucp_context_attr_t attr{};
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (api_.ucp_context_query(context_, &attr) != UCS_OK) return "unknown";
    static const char *names[] = {"host", "cuda", "cuda-managed", "rocm", "rocm-managed"};
    std::string out;
    for (unsigned t = 0; t < sizeof names / sizeof *names; ++t)
        if (attr.memory_types & (uint64_t(1) << t)) out += (out.empty() ? "" : ", ") + std::string(names[t]);
    return out.empty() ? "none" : out;
}

std::string Worker::transports() const {
    // ucp_context_print_info writes one "# resource N : md M dev D flags -- <tl>/<device>" line
    // per transport resource; we list each transport once.
    char *text = nullptr;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return "unknown";
    api_.ucp_context_print_info(context_, f);
    std::fclose(f);
    std::string all(text, len), out;
    std::free(text);
    for (std::size_t at = all.find("resource"); at != std::string::npos; at = all.find("resource", at + 1)) {
        const std::size_t dash = all.find("-- ", at), eol = all.find('\n', at);
        if (dash == std::string::npos || dash > eol) continue;
        const std::string tl = all.substr(dash + 3, all.find('/', dash) - dash - 3);
        if (out.find(tl) == std::string::npos) out += (out.empty() ? "" : ", ") + tl;
    }
    return out.empty() ? "none" : out;
}

ucs_status_t finish(Worker &w, void *request, const Endpoint &ep, const sys::Deadline &deadline) {
    if (request == nullptr) return UCS_OK;
    const bool done = w.wait([&] { return w.request_status(request) != UCS_INPROGRESS || ep.error != UCS_OK; },
                             deadline);
    ucs_status_t st = w.request_status(request);
    w.request_free(request);  // released on completion if still in flight (ucp.h)
    if (st == UCS_INPROGRESS) return done ? ep.error : UCS_ERR_TIMED_OUT;
    return st;
}

}  // namespace wsync::ucx
