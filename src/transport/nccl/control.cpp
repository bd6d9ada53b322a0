#include "transport/nccl/control.hpp"

#include <arpa/inet.h>
#include <cinttypes>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.hpp"

namespace wsync::nccl {

namespace {

int clamp_ms(int64_t ms) { return ms < 0 ? 0 : ms > 1000 ? 1000 : static_cast<int>(ms); }

// The up IPv4 addresses of `interface` or, for "", of the host other than loopback (loopback
// only when there is no other: a receiver on another host would reach its own loopback).
std::vector<std::string> host_addresses(const std::string &interface) {
    std::vector<std::string> out;
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) == 0) {
        for (ifaddrs *i = list; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                (interface.empty() ? (i->ifa_flags & IFF_LOOPBACK) != 0 : interface != i->ifa_name))
                continue;
            char text[INET_ADDRSTRLEN];
            const auto *in = reinterpret_cast<const sockaddr_in *>(i->ifa_addr);
            if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) out.emplace_back(text);
            if (out.size() == 8) break;
        }
        freeifaddrs(list);
    }
    if (out.empty() && interface.empty()) out.emplace_back("127.0.0.1");
    if (out.empty())
        fail(WSYNC_ERR_INVALID_ARGUMENT, "nccl_broadcast: option 'control_interface' names \"" +
                                             interface + "\", which has no IPv4 address that is up here");
    return out;
}

void put(std::string *d, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) d->push_back(static_cast<char>(v >> (8 * i)));
}

auth::Mac mac_of(const auth::Key &key, const std::string &d) {
    return auth::hmac(key.data(), key.size(), reinterpret_cast<const uint8_t *>(d.data()), d.size());
}

}  // namespace

auth::Mac hello_mac(const auth::Key &key, const Frame &f, const std::string &nonce) {
    std::string d = "wsync-nccl-hello";
    d.append(reinterpret_cast<const char *>(&f), sizeof f);
    d += nonce;
    return mac_of(key, d);
}

auth::Key connection_key(const auth::Key &key, uint32_t index, uint64_t group, const std::string &nonce) {
    std::string d = "wsync-nccl-conn";
    put(&d, index, 4);
    put(&d, group, 8);
    d += nonce;
    return mac_of(key, d);
}

Listener::Listener(const std::string &interface) {
    address_.hosts = host_addresses(interface);
    sys::random_bytes(address_.key.data(), address_.key.size());
    // A forked child must not keep the socket (sys.hpp, open_parent_only): receivers of a
    // trainer that is gone would connect to it and wait, instead of being refused.
    fd_ = sys::open_parent_only([] {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) fail_errno("nccl_broadcast: the control channel's socket", errno);
        return fd;
    });
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    if (!interface.empty()) inet_pton(AF_INET, address_.hosts[0].c_str(), &addr.sin_addr);
    socklen_t len = sizeof addr;
    if (bind(fd_, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0 || listen(fd_, 256) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr *>(&addr), &len) != 0) {
        const int err = errno;
        sys::close_parent_only(fd_);
        fail_errno("nccl_broadcast: listening for the control channel", err);
    }
    address_.port = ntohs(addr.sin_port);
    if (!interface.empty()) address_.hosts.resize(1);  // bound to that one
}

Listener::~Listener() {
    if (fd_ >= 0) sys::close_parent_only(fd_);
}

// Connections too stay with this process: a forked child holding one would keep a dead peer's
// connection open, so its death would never be seen.
int Listener::accept_one() noexcept {
    int fd = -1;
    try {
        fd = sys::open_parent_only([this] { return accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC); });
    } catch (...) {
        return -1;
    }
    if (fd >= 0) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

Conn::~Conn() {
    if (fd_ >= 0) sys::close_parent_only(fd_);
}

void Conn::close(const std::string &why) noexcept {
    if (fd_ < 0) return;
    sys::close_parent_only(fd_);
    fd_ = -1;
    try {
        why_ = why;
    } catch (...) {
    }
}

void Conn::authenticate(const auth::Key &key, char sends) noexcept {
    key_ = key;
    sends_ = sends;
    keyed_ = true;
}

auth::Mac Conn::frame_mac(char dir, uint64_t number, const uint8_t *frame, std::size_t n) const {
    std::string d(1, dir);
    put(&d, number, 8);
    d.append(reinterpret_cast<const char *>(frame), n);
    return mac_of(key_, d);
}

bool Conn::send_hello(const auth::Key &key, uint64_t group, uint64_t index_pid, const std::string &nonce,
                      const sys::Deadline &deadline) noexcept {
    try {
        Frame f;
        f.magic = kFrameMagic;
        f.type = static_cast<uint32_t>(Msg::Hello);
        f.a = group;
        f.b = index_pid;
        f.text_len = static_cast<uint32_t>(nonce.size());
        std::string buf(reinterpret_cast<const char *>(&f), sizeof f);
        buf += nonce;
        const auth::Mac m = hello_mac(key, f, nonce);
        buf.append(reinterpret_cast<const char *>(m.data()), m.size());
        return write(reinterpret_cast<const uint8_t *>(buf.data()), buf.size(), deadline);
    } catch (const std::exception &e) {
        close(e.what());
        return false;
    }
}

bool Conn::send(Msg type, uint64_t a, uint64_t b, int32_t status, const std::string &text,
                const sys::Deadline &deadline) noexcept {
    if (fd_ < 0 || !keyed_) return false;
    uint8_t buf[sizeof(Frame) + kMaxText + auth::kMacBytes];
    Frame f;
    f.magic = kFrameMagic;
    f.type = static_cast<uint32_t>(type);
    f.a = a;
    f.b = b;
    f.status = status;
    f.text_len = static_cast<uint32_t>(std::min<std::size_t>(text.size(), kMaxText));
    std::memcpy(buf, &f, sizeof f);
    std::memcpy(buf + sizeof f, text.data(), f.text_len);
    const std::size_t n = sizeof f + f.text_len;
    try {
        const auth::Mac m = frame_mac(sends_, ++sent_, buf, n);
        std::memcpy(buf + n, m.data(), m.size());
    } catch (const std::exception &e) {
        close(e.what());
        return false;
    }
    return write(buf, n + auth::kMacBytes, deadline);
}

bool Conn::write(const uint8_t *buf, std::size_t total, const sys::Deadline &deadline) noexcept {
    std::size_t done = 0;
    while (done < total) {
        const ssize_t n = ::send(fd_, buf + done, total - done, MSG_NOSIGNAL);
        if (n > 0) {
            done += static_cast<std::size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !deadline.passed()) {
            pollfd p{fd_, POLLOUT, 0};
            poll(&p, 1, clamp_ms(deadline.remaining_ms()));
            continue;
        }
        close(n < 0 && errno != EAGAIN && errno != EWOULDBLOCK
                  ? std::string("the peer is gone (") + std::strerror(errno) + ")"
                  : "a frame could not be written within its deadline (the peer does not read)");
        return false;
    }
    return true;
}

void Conn::read(std::vector<Received> *out) noexcept {
    try {
        while (fd_ >= 0) {
            uint8_t chunk[4096];
            const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
            if (n > 0) {
                in_.insert(in_.end(), chunk, chunk + n);
                if (in_.size() > (1u << 20)) close("it sent over 1 MiB that is not whole frames");
            } else if (n == 0) {
                close("the peer closed the connection (its process ended, or it was destroyed)");
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            } else if (errno != EINTR) {
                close(std::string("the connection failed: ") + std::strerror(errno));
            }
        }
        std::size_t at = 0, taken = 0;
        while (in_.size() - at >= sizeof(Frame) && (keyed_ || taken == 0)) {
            Frame f;
            std::memcpy(&f, in_.data() + at, sizeof f);
            if (f.magic != kFrameMagic || f.type < 1 || f.type > 5 || f.text_len > kMaxText) {
                close(strf("it sent bytes that are not a control frame (magic %08x, type %u, "
                           "payload %u bytes)", f.magic, f.type, f.text_len));
                in_.clear();
                return;
            }
            const std::size_t n = sizeof f + f.text_len;
            if (in_.size() - at < n + auth::kMacBytes) break;
            Received r{f, std::string(reinterpret_cast<const char *>(in_.data() + at + sizeof f), f.text_len), {}};
            std::memcpy(r.mac.data(), in_.data() + at + n, auth::kMacBytes);
            if (keyed_) {
                const auth::Mac want = frame_mac(sends_ == 'S' ? 'R' : 'S', ++read_, in_.data() + at, n);
                if (!auth::same_mac(want.data(), r.mac.data())) {
                    close(strf("its frame %" PRIu64 " does not carry this connection's MAC (not the "
                               "peer that said hello, or altered on the way)", read_));
                    in_.clear();
                    return;
                }
            }
            out->push_back(std::move(r));
            ++taken;
            at += n + auth::kMacBytes;
        }
        in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(at));
    } catch (const std::exception &e) {
        close(std::string("reading the control channel: ") + e.what());
    }
}

int connect_control(const ControlAddress &to, const sys::Deadline &deadline, const std::string &who) {
    std::string tried;
    for (std::size_t i = 0; i < to.hosts.size(); ++i) {
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(to.port);
        if (inet_pton(AF_INET, to.hosts[i].c_str(), &addr.sin_addr) != 1) continue;
        const int fd = sys::open_parent_only([&] {
            const int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (s < 0) fail_errno(who + ": the control channel's socket", errno);
            return s;
        });
        const int64_t share = deadline.remaining_ms() / static_cast<int64_t>(to.hosts.size() - i);
        const sys::Deadline mine(share);
        int err = 0;
        if (connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) != 0) {
            err = errno;
            while (err == EINPROGRESS || err == EINTR) {
                pollfd p{fd, POLLOUT, 0};
                if (poll(&p, 1, clamp_ms(mine.remaining_ms())) > 0) {
                    socklen_t len = sizeof err;
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                } else if (mine.passed()) {
                    err = ETIMEDOUT;
                }
            }
        }
        // TCP lets a socket connect to itself when its ephemeral port is the one it dials (a
        // port the sender just freed is a likely pick): that is nobody listening.
        sockaddr_in self{};
        socklen_t self_len = sizeof self;
        if (err == 0 && getsockname(fd, reinterpret_cast<sockaddr *>(&self), &self_len) == 0 &&
            self.sin_port == addr.sin_port && self.sin_addr.s_addr == addr.sin_addr.s_addr)
            err = ECONNREFUSED;
        if (err == 0) {
            const int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        sys::close_parent_only(fd);
        tried += (tried.empty() ? "" : ", ") + to.hosts[i] + ": " + std::strerror(err);
    }
    fail(deadline.passed() ? WSYNC_ERR_TIMEOUT : WSYNC_ERR_PEER,
         who + ": could not reach the sender's control channel on port " + std::to_string(to.port) +
             " (" + tried + "); is the trainer's sender process there, and is the port reachable "
             "from this host?");
}

void wait_readable(const std::vector<int> &fds, int64_t ms) noexcept {
    std::vector<pollfd> p;
    for (int fd : fds)
        if (fd >= 0) p.push_back({fd, POLLIN, 0});
    poll(p.data(), p.size(), clamp_ms(ms));
}

}  // namespace wsync::nccl
