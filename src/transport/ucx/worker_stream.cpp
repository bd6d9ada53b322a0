// The worker's half of the data stream (stream.hpp): listening, accepting and proving
// connections, connecting an engine's stream, and pumping framed bytes in and out of each
// endpoint's socket without blocking. The rest of the worker (UCX itself) is worker.cpp.
#include "transport/ucx/worker.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "error.hpp"

namespace wsync::ucx {


namespace {

void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}

// Waits for `events` on fd up to the deadline; false when it passed (or poll failed).
bool wait_for(int fd, short events, const sys::Deadline &d) {
    for (;;) {
        pollfd p{fd, events, 0};
        const int ms = static_cast<int>(std::clamp<int64_t>(d.remaining_ms(), 0, 1000));
        const int r = ::poll(&p, 1, ms);
        if (r > 0) return true;
        if (r < 0 && errno != EINTR) return false;
        if (d.passed()) return false;
    }
}

}  // namespace

std::string Worker::listen_stream() {
    sockaddr_storage a{};
    socklen_t len = 0;
    if (!config_.stream || listen_fd_ >= 0 || !device_stream_address(config_.net_devices, &a, &len)) return {};
    const int fd = ::socket(a.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return {};
    reinterpret_cast<sockaddr_in &>(a).sin_port = 0;  // sin6_port sits at the same place
    if (::bind(fd, reinterpret_cast<sockaddr *>(&a), len) != 0 || ::listen(fd, 64) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
        ::close(fd);
        return {};
    }
    listen_fd_ = fd;
    return encode_stream_address(a);
}

// Connections waiting for their proof: each was sent its nonce at accept; a right proof makes it
// the stream of the endpoint stream_auth_ names (answered kStreamAccepted), anything else, or
// nothing by kProofMs, closes it. At most kMaxHalfOpen wait; more are closed at accept.
void Worker::accept_streams() {
    const auto now = std::chrono::steady_clock::now();
    for (int k = 0; k < 64; ++k) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        HalfOpen h{fd, {}, {}, now + std::chrono::milliseconds(kProofMs)};
        sys::random_bytes(h.nonce.data(), h.nonce.size());
        if (half_open_.size() >= kMaxHalfOpen ||
            ::send(fd, h.nonce.data(), h.nonce.size(), MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(h.nonce.size())) {
            ::close(fd);
            continue;
        }
        half_open_.push_back(std::move(h));
    }
    for (std::size_t i = 0; i < half_open_.size();) {
        HalfOpen &h = half_open_[i];
        uint8_t buf[kProofBytes];
        const ssize_t r = ::recv(h.fd, buf, kProofBytes - h.got.size(), MSG_DONTWAIT);
        if (r > 0) h.got.insert(h.got.end(), buf, buf + r);
        const bool gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        Endpoint *ep = nullptr;
        if (!gone && h.got.size() == kProofBytes && get_le(h.got.data(), 4) == kProofMagic && stream_auth_) {
            Mac mac;
            std::memcpy(mac.data(), h.got.data() + 16, kMacBytes);
            ep = stream_auth_(static_cast<uint32_t>(get_le(h.got.data() + 4, 4)), get_le(h.got.data() + 8, 8), h.nonce, mac);
        }
        if (ep) {
            // Frames end in a partial segment; with Nagle's algorithm it would wait for the
            // engine's (delayed) acknowledgement of the one before.
            const int one = 1;
            (void)setsockopt(h.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            const uint8_t ok = kStreamAccepted;
            if (::send(h.fd, &ok, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
                if (ep->stream) forget_stream(ep);  // a second proof for one endpoint replaces the first
                ep->stream = std::make_unique<Stream>();
                ep->streams_with = this;
                ep->stream->fd = h.fd;
                h.fd = -1;
                streamed_.push_back(ep);
            }
        }
        if (ep || gone || h.got.size() == kProofBytes || now >= h.end) {
            if (h.fd >= 0) ::close(h.fd);
            half_open_.erase(half_open_.begin() + static_cast<std::ptrdiff_t>(i));
            continue;
        }
        ++i;
    }
}

bool Worker::connect_stream(Endpoint &ep, const std::string &address, const Key &key, uint32_t index,
                            uint64_t token, const sys::Deadline &deadline, std::string *why) {
    sockaddr_storage a{};
    socklen_t len = 0;
    if (!decode_stream_address(address, &a, &len)) {
        *why = "the trainer's welcome offers a stream address that does not decode";
        return false;
    }
    const std::string at = address_text(a);
    const sys::Deadline d(std::min<int64_t>(deadline.remaining_ms(), kProofMs));
    auto fd = std::make_unique<Stream>();
    fd->fd = ::socket(a.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd->fd < 0) {
        *why = std::string("socket(): ") + std::strerror(errno);
        return false;
    }
    int r = ::connect(fd->fd, reinterpret_cast<sockaddr *>(&a), len);
    if (r != 0 && errno != EINPROGRESS) {
        *why = "connecting to " + at + ": " + std::strerror(errno);
        return false;
    }
    int err = 0;
    socklen_t el = sizeof err;
    if (r != 0 && (!wait_for(fd->fd, POLLOUT, d) || getsockopt(fd->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err)) {
        *why = "connecting to " + at + ": " + (err ? std::strerror(err) : "no answer within " + std::to_string(kProofMs) + " ms");
        return false;
    }
    Nonce nonce;
    std::size_t got = 0;
    while (got < nonce.size()) {
        if (!wait_for(fd->fd, POLLIN, d)) {
            *why = at + " sent no nonce in time";
            return false;
        }
        const ssize_t n = ::recv(fd->fd, nonce.data() + got, nonce.size() - got, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            *why = at + " closed the connection before its nonce";
            return false;
        }
        if (n > 0) got += static_cast<std::size_t>(n);
    }
    uint8_t proof[kProofBytes];
    put_le(proof, kProofMagic, 4);
    put_le(proof + 4, index, 4);
    put_le(proof + 8, token, 8);
    const Mac mac = stream_proof(key, nonce, index, token);
    std::memcpy(proof + 16, mac.data(), kMacBytes);
    if (::send(fd->fd, proof, sizeof proof, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof proof)) {
        *why = "sending the proof to " + at + " failed";
        return false;
    }
    uint8_t ok = 0;
    for (;;) {
        if (!wait_for(fd->fd, POLLIN, d)) {
            *why = at + " did not accept the stream in time";
            return false;
        }
        const ssize_t n = ::recv(fd->fd, &ok, 1, MSG_DONTWAIT);
        if (n == 1) break;
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
            *why = at + " refused the stream";
            return false;
        }
    }
    if (ok != kStreamAccepted) {
        *why = at + " answered the proof with something else";
        return false;
    }
    reader_ = true;
    ep.stream = std::move(fd);
    ep.streams_with = this;
    streamed_.push_back(&ep);
    return true;
}

void Worker::forget_stream(Endpoint *ep) noexcept {
    const ucs_status_t was = ep->error;
    break_stream(*ep);
    ep->error = was;  // closing is not a failure of its peer
    streamed_.erase(std::remove(streamed_.begin(), streamed_.end(), ep), streamed_.end());
    ep->stream.reset();
    ep->streams_with = nullptr;
}

Endpoint::~Endpoint() {
    if (stream && streams_with) streams_with->forget_stream(this);
}

unsigned Worker::pump_streams() {
    unsigned n = 0;
    if (listen_fd_ >= 0) accept_streams();
    for (std::size_t i = 0; i < streamed_.size(); ++i) n += reader_ ? pump_in(*streamed_[i]) : pump_out(*streamed_[i]);
    return n;
}

// The trainer's: writes queued frames until the socket takes no more. Returns frames done.
unsigned Worker::pump_out(Endpoint &ep) {
    Stream &s = *ep.stream;
    unsigned done = 0;
    while (s.fd >= 0 && !s.out.empty()) {
        Stream::Out &o = s.out.front();
        iovec iov[2];
        int k = 0;
        if (o.done < o.head.size()) iov[k++] = {o.head.data() + o.done, o.head.size() - o.done};
        const std::size_t pdone = o.done > o.head.size() ? o.done - o.head.size() : 0;
        if (pdone < o.n)
            iov[k++] = {const_cast<uint8_t *>(o.data) + pdone, o.hashed ? std::min(o.n - pdone, kHashSlice) : o.n - pdone};
        msghdr m{};
        m.msg_iov = iov;
        m.msg_iovlen = static_cast<std::size_t>(k);
        const ssize_t r = ::sendmsg(s.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
            break_stream(ep);
            break;
        }
        o.done += static_cast<std::size_t>(r);
        if (o.hashed && o.done > o.head.size() + pdone) {
            const std::size_t upto = o.done - o.head.size();
            written_(o.tag, o.data + pdone, upto - pdone);
        }
        if (o.done == o.head.size() + o.n) {
            sent_.push_back(o.tag);
            s.out.pop_front();
            ++done;
        }
    }
    return done;
}

// The engine's: reads the next frame's head and header into the inbox (then holds until the
// owner receives or releases it), or the payload being received or discarded. Returns 1 when
// anything moved.
unsigned Worker::pump_in(Endpoint &ep, bool payload_only) {
    Stream &s = *ep.stream;
    unsigned moved = 0;
    static thread_local uint8_t scratch[1 << 16];
    while (s.fd >= 0 && s.in != Stream::In::Held && !(payload_only && s.in == Stream::In::Head)) {
        const bool head = s.in == Stream::In::Head;
        std::size_t want;
        uint8_t *to;
        if (head) {
            if (s.head.size() < kFrameHead + kMaxFrameHeader) s.head.resize(kFrameHead + kMaxFrameHeader);
            const std::size_t need = s.got < kFrameHead ? kFrameHead : kFrameHead + get_le(s.head.data(), 4);
            to = s.head.data() + s.got;
            want = need - s.got;
        } else if (s.in == Stream::In::Payload) {
            // Straight into the runs, as many as one call takes.
            iovec iov[16];
            int k = 0;
            for (std::size_t r = s.run; r < s.runs.size() && k < 16; ++r) {
                const uint64_t skip = r == s.run ? s.run_done : 0;
                iov[k++] = {s.runs[r].dst + skip, static_cast<std::size_t>(s.runs[r].n - skip)};
            }
            msghdr mh{};
            mh.msg_iov = iov;
            mh.msg_iovlen = static_cast<std::size_t>(k);
            const ssize_t r = k ? ::recvmsg(s.fd, &mh, MSG_DONTWAIT) : 0;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
            if (r <= 0) {  // the trainer closed it, or the network failed
                break_stream(ep);
                break;
            }
            moved = 1;
            uint64_t got = static_cast<uint64_t>(r);
            s.left -= got;
            while (got) {
                const uint64_t in_run = std::min(got, s.runs[s.run].n - s.run_done);
                s.run_done += in_run;
                got -= in_run;
                if (s.run_done == s.runs[s.run].n) ++s.run, s.run_done = 0;
            }
            if (s.landed) s.landed(s.payload - s.left);
            if (s.left) continue;
            if (s.req) {
                s.req->status = 0;
                done_reqs_.push_back(s.req);
                s.req = nullptr;
            }
            s.runs.clear();
            s.landed = nullptr;
            s.in = Stream::In::Head;
            continue;
        } else {
            to = scratch;
            want = std::min<uint64_t>(s.left, sizeof scratch);
        }
        const ssize_t r = ::recv(s.fd, to, want, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        if (r <= 0) {  // the trainer closed it, or the network failed
            break_stream(ep);
            break;
        }
        moved = 1;
        if (!head) {  // read away
            s.left -= static_cast<uint64_t>(r);
            if (!s.left) s.in = Stream::In::Head;
            continue;
        }
        s.got += static_cast<std::size_t>(r);
        if (s.got == kFrameHead && get_le(s.head.data(), 4) > kMaxFrameHeader) {
            break_stream(ep);  // no frame of ours is that: nothing after it can be trusted
            break;
        }
        if (s.got < kFrameHead || s.got < kFrameHead + get_le(s.head.data(), 4)) continue;
        s.payload = get_le(s.head.data() + 4, 8);
        Msg m;
        const bool ok = inbox_.size() < 65536 && decode_msg(s.head.data() + kFrameHead, s.got - kFrameHead, m) &&
                        m.type == MsgType::Data && (!admit_ || admit_(m));
        s.got = 0;
        if (!ok) {  // read away unseen
            s.left = s.payload;
            s.in = s.left ? Stream::In::Discard : Stream::In::Head;
            continue;
        }
        m.length = s.payload;
        m.desc = s.payload ? stream_desc() : nullptr;
        inbox_.push_back(std::move(m));
        s.in = s.payload ? Stream::In::Held : Stream::In::Head;
    }
    return moved;
}

// A stream that failed, or fell out of step: closed; what it was sending is done (failed), a
// receive in flight fails, and the endpoint counts as failed (its peer is unreachable on it).
void Worker::break_stream(Endpoint &ep) noexcept {
    Stream &s = *ep.stream;
    if (s.fd >= 0) ::close(s.fd);
    s.fd = -1;
    for (const Stream::Out &o : s.out) sent_.push_back(o.tag);
    s.out.clear();
    if (s.req) {
        s.req->status = UCS_ERR_CONNECTION_RESET;
        done_reqs_.push_back(s.req);
        s.req = nullptr;
    }
    s.runs.clear();
    s.landed = nullptr;
    s.in = Stream::In::Head;  // a message it held: receive() refuses it, release() forgets it
    if (ep.error == UCS_OK) ep.error = UCS_ERR_CONNECTION_RESET;
}

}  // namespace wsync::ucx
