#include "sys.hpp"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <vector>
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
#include <sys/resource.h>
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

int shm_create(const std::string &name, uint64_t size, bool reserve, const std::string &who) {
    // Growing a file past RLIMIT_FSIZE makes the kernel send SIGXFSZ (inode_newsize_ok, for
    // ftruncate and fallocate alike), which ends a process that did not ignore it: no signal may
    // cross the C ABI (issue 38), so the limit is checked first and named as a status.
    struct rlimit fsize;
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY &&
        size > uint64_t(fsize.rlim_cur))
        fail(WSYNC_ERR_NO_MEMORY, who + ": segment '" + name + "' needs " + std::to_string(size) +
                                      " bytes, but this process may not grow a file past " +
                                      std::to_string(uint64_t(fsize.rlim_cur)) +
                                      " bytes (RLIMIT_FSIZE, `ulimit -f`); raise that limit or "
                                      "lower buckets x bucket_bytes");
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

// The registry of open_parent_only(): allocated once and never freed (a fork handler may run
// during static destruction), guarded by fork_mu, which the prepare handler holds across fork().
std::mutex fork_mu;
std::vector<int> *parent_only = nullptr;

void fork_prepare() { fork_mu.lock(); }
void fork_parent() { fork_mu.unlock(); }
void fork_child() {
    // The child has one thread, this one, which holds fork_mu: nothing else touches the list.
    const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd : *parent_only) {
        if (null >= 0) (void)dup3(null, fd, O_CLOEXEC);
        else (void)close(fd);  // no /dev/null: the number may be reused, still better than a lock
    }
    if (null >= 0) close(null);
    parent_only->clear();  // keeps its storage: no allocation here
    fork_mu.unlock();
}

}  // namespace

int open_parent_only(const std::function<int()> &open) {
    static const int registered = [] {
        parent_only = new std::vector<int>();
        parent_only->reserve(64);
        return pthread_atfork(fork_prepare, fork_parent, fork_child);
    }();
    if (registered != 0) fail_errno("pthread_atfork", registered);
    std::lock_guard<std::mutex> hold(fork_mu);
    const int fd = open();
    if (fd >= 0) {
        try {
            parent_only->push_back(fd);
        } catch (...) {
            close(fd);
            throw;
        }
    }
    return fd;
}

void close_parent_only(int fd) noexcept {
    if (fd < 0) return;
    std::lock_guard<std::mutex> hold(fork_mu);
    if (parent_only) {
        auto it = std::find(parent_only->begin(), parent_only->end(), fd);
        if (it != parent_only->end()) parent_only->erase(it);
    }
    close(fd);
}

int32_t Owner::current_pid() noexcept { return static_cast<int32_t>(getpid()); }

bool Owner::here() const noexcept { return current_pid() == pid_; }

void Owner::require(const char *what) const {
    if (here()) return;
    fail(WSYNC_ERR_WRONG_STATE,
         std::string("this ") + what + " was created by process " + std::to_string(pid_) +
             "; process " + std::to_string(current_pid()) +
             " (a child forked from it) holds only a copy that it cannot use: the library's "
             "locks and sockets stayed with the parent. Create a new one in this process");
}

int open_own(int fd) noexcept {
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    int own;
    do {
        own = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    } while (own < 0 && errno == EINTR);
    return own;
}

bool same_pid_namespace(int32_t pid) noexcept {
    if (pid <= 0) return false;
    char mine[64], theirs[64];
    const std::string path = "/proc/" + std::to_string(pid) + "/ns/pid";
    const ssize_t a = readlink("/proc/self/ns/pid", mine, sizeof mine);
    const ssize_t b = readlink(path.c_str(), theirs, sizeof theirs);
    return a > 0 && a == b && std::memcmp(mine, theirs, static_cast<std::size_t>(a)) == 0;
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
    // A forked child must not keep the socket: its name would stay bound, answered by nobody.
    listen_fd_ = open_parent_only([&] {
        int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (l < 0) fail_errno(who + ": socket(AF_UNIX)", errno);
        return l;
    });
    socklen_t len;
    sockaddr_un a = abstract_address(name, &len);
    if (bind(listen_fd_, reinterpret_cast<sockaddr *>(&a), len) != 0 || listen(listen_fd_, 16) != 0) {
        int err = errno;
        close_parent_only(listen_fd_);
        fail_errno(who + ": binding the re-attach socket", err);
    }
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (stop_fd_ < 0) {
        int err = errno;
        close_parent_only(listen_fd_);
        fail_errno(who + ": eventfd", err);
    }
    thread_ = start_thread([this] { run(); });
}

std::thread start_thread(std::function<void()> fn) {
    struct Started {
        std::mutex mu;
        std::condition_variable cv;
        bool running = false;
    };
    // Shared, so that a maker that stopped waiting leaves the thread nothing dangling.
    auto started = std::make_shared<Started>();
    std::thread t([started, fn = std::move(fn)]() mutable {
        std::function<void()> body = std::move(fn);
        {
            std::lock_guard<std::mutex> hold(started->mu);
            started->running = true;
        }
        started->cv.notify_one();
        started.reset();
        body();
    });
    std::unique_lock<std::mutex> lock(started->mu);
    started->cv.wait_for(lock, std::chrono::seconds(10), [&] { return started->running; });
    return t;
}

FdServer::~FdServer() {
    uint64_t one = 1;
    if (write(stop_fd_, &one, sizeof one) < 0) { /* the thread still wakes within 100 ms */ }
    if (thread_.joinable()) thread_.join();
    close_parent_only(listen_fd_);
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
    const int own = open_own(fd);
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
             const std::string &gone, int32_t *server_pid) {
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
    // The server's credentials (those of the process that called listen()), before anything it
    // sends is accepted: the segment is the trainer user's, mode 0600, and a socket name can be
    // bound by anyone once its owner is gone.
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
        int err = errno;
        close(s);
        fail_errno(who + ": reading the sender's credentials (SO_PEERCRED)", err);
    }
    if (cred.uid != geteuid()) {
        close(s);
        fail(WSYNC_ERR_UNAVAILABLE,
             who + ": refused the process answering the rendezvous '" + name + "' (pid " +
                 std::to_string(cred.pid) + ", uid " + std::to_string(cred.uid) +
                 "): it is not this user's (uid " + std::to_string(geteuid()) +
                 "), so it is not the trainer; " + gone);
    }
    if (server_pid) *server_pid = cred.pid;
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
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) != 0) {
        const bool known = fstat(fd, &st) == 0;
        close(fd);
        char mode[16];
        std::snprintf(mode, sizeof mode, "%04o", known ? unsigned(st.st_mode & 07777) : 0u);
        fail(WSYNC_ERR_UNAVAILABLE,
             who + ": refused the descriptor handed over by pid " + std::to_string(cred.pid) +
                 (known ? std::string(S_ISREG(st.st_mode) ? " (a file" : " (not a regular file") +
                              " of uid " + std::to_string(st.st_uid) + ", mode " + mode + ")"
                        : std::string(" (cannot stat it)")) +
                 ": a segment is a regular file of this user (uid " +
                 std::to_string(geteuid()) + "), mode 0600");
    }
    return fd;
}

}  // namespace wsync::sys
