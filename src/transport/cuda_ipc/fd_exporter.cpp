#include "transport/cuda_ipc/fd_exporter.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "error.hpp"
#include "sys.hpp"

namespace wsync::sys {
namespace {

sockaddr_un address(const std::string &name, socklen_t *len) {
    sockaddr_un a;
    std::memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    std::size_t n = std::min(name.size(), sizeof a.sun_path - 1);
    std::memcpy(a.sun_path + 1, name.data(), n);  // sun_path[0] == 0: the abstract namespace
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
    return a;
}

bool same_user(int s) {
    struct ucred cred;
    socklen_t cl = sizeof cred;
    return getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.uid == geteuid();
}

// Waits for `s` to be readable (POLLIN) until `ms` milliseconds pass; false on timeout or a
// hang-up without data.
bool readable(int s, int64_t ms) {
    struct pollfd p = {s, POLLIN, 0};
    int n;
    do {
        n = poll(&p, 1, static_cast<int>(std::min<int64_t>(std::max<int64_t>(ms, 0), INT32_MAX)));
    } while (n < 0 && errno == EINTR);
    return n > 0 && (p.revents & POLLIN);
}

}  // namespace

FdExporter::FdExporter(const std::string &name, const std::string &who) : name_(name) {
    // A forked child must not keep the socket (sys.hpp, open_parent_only).
    listen_fd_ = open_parent_only([&] {
        int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (l < 0) fail_errno(who + ": socket(AF_UNIX)", errno);
        return l;
    });
    socklen_t len;
    sockaddr_un a = address(name, &len);
    if (bind(listen_fd_, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(listen_fd_, 16) != 0) {
        int err = errno;
        close_parent_only(listen_fd_);
        fail_errno(who + ": binding the descriptor socket '" + name + "'", err);
    }
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (stop_fd_ < 0) {
        int err = errno;
        close_parent_only(listen_fd_);
        fail_errno(who + ": eventfd", err);
    }
    thread_ = sys::start_thread([this] { run(); });
}

FdExporter::~FdExporter() {
    uint64_t one = 1;
    if (write(stop_fd_, &one, sizeof one) < 0) { /* the thread still wakes within 100 ms */ }
    if (thread_.joinable()) thread_.join();
    close_parent_only(listen_fd_);
    close(stop_fd_);
    for (auto &kv : fds_) close(kv.second);
}

void FdExporter::add(uint64_t key, int fd) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = fds_.find(key);
    if (it != fds_.end()) close(it->second);
    fds_[key] = fd;
}

void FdExporter::remove(uint64_t key) noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = fds_.find(key);
    if (it == fds_.end()) return;
    close(it->second);
    fds_.erase(it);
}

void FdExporter::run() {
    for (;;) {
        struct pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
        int n = poll(p, 2, 100);
        if (n < 0 && errno != EINTR) return;
        if (p[1].revents) return;
        if (!(p[0].revents & POLLIN)) continue;
        int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        if (same_user(c)) serve(c);
        close(c);
    }
}

void FdExporter::serve(int c) {
    const Deadline deadline(kFdExporterConnectionMs);
    for (;;) {
        if (!readable(c, std::min<int64_t>(deadline.remaining_ms(), 100))) {
            if (deadline.passed()) return;
            struct pollfd stop = {stop_fd_, POLLIN, 0};
            if (poll(&stop, 1, 0) > 0) return;
            // Nothing yet: a peer that hung up ends the connection.
            char probe;
            ssize_t got = recv(c, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
            if (got == 0) return;
            continue;
        }
        uint64_t key = 0;
        ssize_t got = recv(c, &key, sizeof key, 0);
        if (got != static_cast<ssize_t>(sizeof key)) return;  // closed, or not a request
        char byte = 'N';
        struct iovec iov = {&byte, 1};
        alignas(struct cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
        struct msghdr m = {};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        {
            std::lock_guard<std::mutex> lk(mu_);
            auto it = fds_.find(key);
            if (it != fds_.end()) {
                byte = 'W';
                m.msg_control = ctl;
                m.msg_controllen = sizeof ctl;
                struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int));
                std::memcpy(CMSG_DATA(cm), &it->second, sizeof(int));
            }
            // Sent under the lock: remove() cannot close the descriptor while it travels.
            if (sendmsg(c, &m, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return;
        }
    }
}

std::vector<int> fetch_fds(const std::string &name, const std::vector<uint64_t> &keys,
                           const Deadline &deadline, const std::string &who, const std::string &gone) {
    std::vector<int> out;
    if (keys.empty()) return out;
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) fail_errno(who + ": socket(AF_UNIX)", errno);
    auto give_up = [&](wsync_status_t status, const std::string &why) {
        for (int fd : out) close(fd);
        close(s);
        fail(status, who + ": " + why);
    };
    socklen_t len;
    sockaddr_un a = address(name, &len);
    if (connect(s, reinterpret_cast<sockaddr *>(&a), len) != 0) {
        int err = errno;
        if (err == ECONNREFUSED || err == ENOENT) give_up(WSYNC_ERR_UNAVAILABLE, gone);
        give_up(WSYNC_ERR_SYSTEM, "connecting to the descriptor socket '" + name + "': " + std::strerror(err));
    }
    if (!same_user(s))
        give_up(WSYNC_ERR_UNAVAILABLE, "the descriptor socket '" + name + "' is served by another user");
    for (uint64_t key : keys) {
        if (send(s, &key, sizeof key, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof key))
            give_up(WSYNC_ERR_UNAVAILABLE, gone);
        if (!readable(s, deadline.remaining_ms()))
            give_up(WSYNC_ERR_TIMEOUT, "the sender did not hand over its allocations' descriptors within " +
                                           std::to_string(deadline.budget_ms()) + " ms");
        char byte = 0;
        struct iovec iov = {&byte, 1};
        alignas(struct cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
        struct msghdr m = {};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
        ssize_t got = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
        struct cmsghdr *cm = got == 1 ? CMSG_FIRSTHDR(&m) : nullptr;
        if (got == 1 && byte == 'W' && cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
            cm->cmsg_len == CMSG_LEN(sizeof(int))) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
            out.push_back(fd);
            continue;
        }
        if (cm && cm->cmsg_type == SCM_RIGHTS) {  // an answer we do not take: its descriptor closes
            int fd;
            std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
            close(fd);
        }
        give_up(WSYNC_ERR_UNAVAILABLE,
                got == 1 && byte == 'N'
                    ? "the sender no longer shares allocation " + std::to_string(key) +
                          " (it released that memory; a later version names its new allocation)"
                    : gone);
    }
    close(s);
    return out;
}

}  // namespace wsync::sys
