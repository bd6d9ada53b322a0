#include "sys.hpp"

#include <cerrno>
#include <csignal>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "error.hpp"

namespace wsync::sys {

int64_t Deadline::remaining_ms() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return left > 0 ? left : 0;
}

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t),
              "futex words must be plain 32-bit integers");

void futex_wait(std::atomic<uint32_t> *word, uint32_t expected, int64_t max_ms) {
    if (max_ms <= 0) return;
    struct timespec ts;
    ts.tv_sec = static_cast<time_t>(max_ms / 1000);
    ts.tv_nsec = static_cast<long>((max_ms % 1000) * 1000000);
    // Not FUTEX_PRIVATE: the word is in a MAP_SHARED mapping seen by other processes.
    // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "re-check"; callers loop.
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t> *word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

void random_bytes(void *buf, std::size_t n) {
    auto *p = static_cast<unsigned char *>(buf);
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR) continue;
            fail_errno("getrandom", errno);
        }
        p += got;
        n -= static_cast<std::size_t>(got);
    }
}

std::string random_hex(std::size_t n) {
    std::string raw(n, '\0');
    random_bytes(raw.data(), n);
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * n);
    for (unsigned char c : raw) {
        out.push_back(digits[c >> 4]);
        out.push_back(digits[c & 15]);
    }
    return out;
}

bool process_alive(int32_t pid) {
    if (pid <= 0) return false;
    if (kill(pid, 0) == -1 && errno == ESRCH) return false;
    // kill() succeeds on a zombie, whose parent has not reaped it yet: read its state too.
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return true;  // no /proc: trust kill()
    char buf[512];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return true;
    buf[n] = '\0';
    const char *paren = std::strrchr(buf, ')');  // the command name may itself hold ')'
    if (!paren || paren[1] != ' ') return true;
    return paren[2] != 'Z' && paren[2] != 'X';
}

int shm_create(const std::string &name, uint64_t size, bool reserve, const std::string &who) {
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) fail_errno(who + ": shm_open('" + name + "')", errno);
    int err = ftruncate(fd, static_cast<off_t>(size)) == 0 ? 0 : errno;
    if (!err && reserve) err = posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (err) {
        close(fd);
        shm_unlink(name.c_str());
        if (err == ENOSPC || err == ENOMEM)
            fail(WSYNC_ERR_NO_MEMORY, who + ": cannot reserve " + std::to_string(size) +
                                          " bytes for segment '" + name + "' in /dev/shm (" +
                                          std::strerror(err) +
                                          "); lower buckets x bucket_bytes or enlarge /dev/shm");
        fail_errno(who + ": reserving " + std::to_string(size) + " bytes", err);
    }
    return fd;
}

int shm_open_existing(const std::string &name, uint64_t size, const std::string &who,
                      const std::string &gone) {
    int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            fail(WSYNC_ERR_UNAVAILABLE, who + ": segment '" + name + "' does not exist: " + gone);
        fail_errno(who + ": shm_open('" + name + "')", errno);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        fail_errno(who + ": fstat('" + name + "')", err);
    }
    if (uint64_t(st.st_size) != size) {
        close(fd);
        fail(WSYNC_ERR_MISMATCH, who + ": segment '" + name + "' has " +
                                     std::to_string(st.st_size) +
                                     " bytes, the init info implies " + std::to_string(size));
    }
    return fd;
}

void *map_shared(int fd, uint64_t offset, uint64_t size, bool writable, bool populate,
                 const std::string &what) {
    void *p = mmap(nullptr, size, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                   MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, static_cast<off_t>(offset));
    if (p == MAP_FAILED) fail_errno(what + ": mmap of " + std::to_string(size) + " bytes", errno);
    return p;
}

// ---------------------------------------------------------------------------------------------
namespace {
struct flock one_byte(short type, uint64_t at) {
    struct flock fl;
    std::memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(at);
    fl.l_len = 1;
    return fl;
}

sockaddr_un abstract_address(const std::string &name, socklen_t *len) {
    sockaddr_un a;
    std::memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    std::size_t n = std::min(name.size(), sizeof a.sun_path - 1);
    std::memcpy(a.sun_path + 1, name.data(), n);  // sun_path[0] == 0: the abstract namespace
    *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
    return a;
}
}  // namespace

bool lock_try(int fd, uint64_t at) {
    struct flock fl = one_byte(F_WRLCK, at);
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return true;
    if (errno == EAGAIN || errno == EACCES) return false;
    fail_errno("fcntl(F_OFD_SETLK)", errno);
}

bool lock_held_elsewhere(int fd, uint64_t at) {
    struct flock fl = one_byte(F_WRLCK, at);
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) fail_errno("fcntl(F_OFD_GETLK)", errno);
    return fl.l_type != F_UNLCK;
}

namespace {

// One byte plus room for one descriptor (SCM_RIGHTS): the message a re-attach socket carries,
// both ways. Not copyable: m points into the object.
struct FdMessage {
    char byte = 'W';
    struct iovec iov = {&byte, 1};
    alignas(struct cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
    struct msghdr m = {};
    FdMessage() {
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl;
        m.msg_controllen = sizeof ctl;
    }
    FdMessage(const FdMessage &) = delete;
    FdMessage &operator=(const FdMessage &) = delete;
};

}  // namespace

FdServer::FdServer(const std::string &name, int fd, const std::string &who) : fd_(fd) {
    listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (listen_fd_ < 0) fail_errno(who + ": socket(AF_UNIX)", errno);
    socklen_t len;
    sockaddr_un a = abstract_address(name, &len);
    if (bind(listen_fd_, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(listen_fd_, 16) != 0) {
        int err = errno;
        close(listen_fd_);
        fail_errno(who + ": binding the re-attach socket", err);
    }
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (stop_fd_ < 0) {
        int err = errno;
        close(listen_fd_);
        fail_errno(who + ": eventfd", err);
    }
    thread_ = std::thread([this] { run(); });
}

FdServer::~FdServer() {
    uint64_t one = 1;
    if (write(stop_fd_, &one, sizeof one) < 0) { /* the thread still wakes within 100 ms */ }
    if (thread_.joinable()) thread_.join();
    close(listen_fd_);
    close(stop_fd_);
}

void FdServer::run() {
    for (;;) {
        struct pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
        int n = poll(p, 2, 100);
        if (n < 0 && errno != EINTR) return;
        if (p[1].revents) return;
        if (!(p[0].revents & POLLIN)) continue;
        int c = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        struct ucred cred;
        socklen_t cl = sizeof cred;
        // The segment is mode 0600: hand it to the same user only, as the file system would.
        if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.uid == geteuid()) {
            FdMessage msg;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg.m);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            std::memcpy(CMSG_DATA(cm), &fd_, sizeof(int));
            (void)sendmsg(c, &msg.m, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        close(c);
    }
}

int reopen_own(int fd, const std::string &who) {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    int own;
    do {
        own = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    } while (own < 0 && errno == EINTR);
    const int err = errno;
    close(fd);
    if (own < 0)
        fail(WSYNC_ERR_UNAVAILABLE,
             who + ": cannot open the handed-over segment as this process's own file (" + path +
                 ": " + std::strerror(err) +
                 "); re-attaching after the segment's name is gone needs /proc mounted");
    return own;
}

int fetch_fd(const std::string &name, const Deadline &deadline, const std::string &who,
             const std::string &gone) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) fail_errno(who + ": socket(AF_UNIX)", errno);
    socklen_t len;
    sockaddr_un a = abstract_address(name, &len);
    if (connect(s, reinterpret_cast<sockaddr *>(&a), len) != 0) {
        int err = errno;
        close(s);
        if (err == ECONNREFUSED || err == ENOENT)
            fail(WSYNC_ERR_UNAVAILABLE, who + ": " + gone);
        fail_errno(who + ": connecting to the sender", err);
    }
    struct pollfd p = {s, POLLIN, 0};
    int n;
    do {
        n = poll(&p, 1, static_cast<int>(std::min<int64_t>(deadline.remaining_ms(), INT32_MAX)));
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
        close(s);
        fail(WSYNC_ERR_TIMEOUT, who + ": the sender did not hand over the segment within " +
                                    std::to_string(deadline.budget_ms()) + " ms");
    }
    FdMessage msg;
    ssize_t got = recvmsg(s, &msg.m, MSG_CMSG_CLOEXEC);
    close(s);
    struct cmsghdr *cm = got == 1 ? CMSG_FIRSTHDR(&msg.m) : nullptr;
    if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS ||
        cm->cmsg_len != CMSG_LEN(sizeof(int)))
        fail(WSYNC_ERR_UNAVAILABLE, who + ": the sender refused to hand over the segment "
                                          "(another user?) or closed the connection");
    int fd;
    std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    return fd;
}

}  // namespace wsync::sys
