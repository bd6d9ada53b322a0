// Operating-system helpers shared by strategies: deadlines, futex waits on shared memory,
// randomness, process liveness. Linux only.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace wsync::sys {

using Clock = std::chrono::steady_clock;

// A point in time after which a wait gives up. Built from a millisecond budget.
class Deadline {
public:
    // Budgets are clamped to [0, 2^40 ms] (about 35 years): a larger one would overflow the
    // clock's nanosecond count and end at once instead of never.
    explicit Deadline(int64_t timeout_ms)
        : end_(Clock::now() + std::chrono::milliseconds(
                                  timeout_ms < 0 ? 0 : std::min<int64_t>(timeout_ms, int64_t(1) << 40))),
          budget_ms_(timeout_ms) {}
    bool passed() const { return Clock::now() >= end_; }
    // Milliseconds left, at least 0.
    int64_t remaining_ms() const;
    int64_t budget_ms() const { return budget_ms_; }

private:
    Clock::time_point end_;
    int64_t budget_ms_;
};

// Waits until *word != expected, a wake, or max_ms passes (spurious wake-ups are allowed:
// callers re-check their condition). The word may live in memory shared between processes.
void futex_wait(std::atomic<uint32_t> *word, uint32_t expected, int64_t max_ms);
// Wakes every waiter on word, in any process.
void futex_wake_all(std::atomic<uint32_t> *word);

// Fills buf with n bytes from the kernel's CSPRNG (getrandom). Throws on failure.
void random_bytes(void *buf, std::size_t n);
// n random bytes as lowercase hex.
std::string random_hex(std::size_t n);

// Creates the POSIX shared-memory object `name` (O_EXCL, mode 0600) of `size` bytes and
// returns its descriptor. With `reserve`, every page is allocated now (posix_fallocate), so a
// too-small /dev/shm fails here with WSYNC_ERR_NO_MEMORY instead of SIGBUS later. On failure
// nothing is left behind. `who` prefixes messages ("shm", "cuda_ipc").
int shm_create(const std::string &name, uint64_t size, bool reserve, const std::string &who);
// Opens the existing object `name` read-write and checks it has `size` bytes. A missing name is
// WSYNC_ERR_UNAVAILABLE (`gone` says why it may be missing), another size WSYNC_ERR_MISMATCH.
int shm_open_existing(const std::string &name, uint64_t size, const std::string &who,
                      const std::string &gone);
// mmap of a whole descriptor range, MAP_SHARED; throws WSYNC_ERR_SYSTEM naming `what`.
void *map_shared(int fd, uint64_t offset, uint64_t size, bool writable, bool populate,
                 const std::string &what);

// Open-file-description locks (F_OFD_SETLK) on one byte of a file, used as liveness: the
// kernel drops them when the holder's last descriptor of that open closes, which happens when
// its process dies, whatever PID namespace anyone is in. Offsets may lie past the file's end.
// Takes the write lock on byte `at` through fd; false if another open file description holds it.
bool lock_try(int fd, uint64_t at);
// True if an open file description other than fd's holds a lock on byte `at`.
bool lock_held_elsewhere(int fd, uint64_t at);

// Descriptors a forked child must not keep (issue 38). fork() copies every descriptor, and
// with it the open file descriptions that carry this process's liveness locks and the listening
// sockets its rendezvous and exporters answer on: while such a child lived, a killed parent
// looked alive to its peers and its socket names stayed bound with nobody answering. Each such
// descriptor is opened through open_parent_only(), which registers it; a pthread_atfork child
// handler points every registered number at /dev/null in the child (open, dup3 and close only:
// async-signal-safe), so the child's reference is gone and the number stays taken (an object
// the child inherited never closes another file by it). Mappings are inherited as usual, which is
// why no liveness lock lives on a mapped description (SharedSegment::lock_fd). `open` runs under
// the fork handlers' mutex, so no fork falls between opening and registering; it returns the
// descriptor or throws. close_parent_only() unregisters and closes under the same mutex.
int open_parent_only(const std::function<int()> &open);
void close_parent_only(int fd) noexcept;

// The process that made a library object (issue 38). A child forked from it inherits a copy
// of the object but none of its threads, and (open_parent_only) none of its locks or listening
// sockets: it must neither use the copy nor tear it down (that would abandon the parent's
// version, unlink its segment, or join a thread that does not exist here). The ABI refuses the
// copy's use with WSYNC_ERR_WRONG_STATE and its destroy functions leave it be (wsync.h,
// "Processes").
class Owner {
public:
    bool here() const noexcept;
    // Throws WSYNC_ERR_WRONG_STATE naming `what` ("sender") and both pids when not here().
    void require(const char *what) const;
    int32_t pid() const noexcept { return pid_; }

private:
    int32_t pid_ = current_pid();
    static int32_t current_pid() noexcept;
};

// A second open file description of the file `fd` refers to, read-write, close-on-exec (through
// /proc/self/fd), or -1 with errno set; `fd` stays open.
int open_own(int fd) noexcept;

// Starts `fn` on a new thread and returns once that thread runs it, so its start-up (in the C
// library and in a sanitizer runtime) is over: the library's helper threads are idle in a wait
// when their maker returns. A process that forks right after making a sender must not hand its
// child a lock such a start-up held: GCC 12's AddressSanitizer allocator does not take its
// locks across fork(), and a child forked while a starting thread held one hung at its first
// allocation (test_transactions under ASan, about 1 run in 100; glibc's own malloc is fork-safe).
// The wait is bounded (10 s; past it the thread is returned running or not). Throws what
// std::thread throws.
std::thread start_thread(std::function<void()> fn);

// Hands one descriptor to processes of the same user that ask for it over an abstract Unix
// socket (no file is ever created, and the name vanishes with the process). A helper thread
// accepts connections and wakes at least every 100 ms to see whether it must stop.
class FdServer {
public:
    // `name` is the abstract socket name without the leading NUL; `fd` is borrowed and must
    // outlive the server. Throws WSYNC_ERR_SYSTEM if the socket cannot be made.
    FdServer(const std::string &name, int fd, const std::string &who);
    ~FdServer();
    FdServer(const FdServer &) = delete;
    FdServer &operator=(const FdServer &) = delete;

private:
    void run();
    int listen_fd_ = -1;
    int stop_fd_ = -1;
    int fd_;
    std::thread thread_;
};

// Asks the FdServer `name` for its descriptor, waiting up to the deadline. No server is
// WSYNC_ERR_UNAVAILABLE (`gone` says why), no answer in time WSYNC_ERR_TIMEOUT. The server must
// run as this process's effective user (SO_PEERCRED, checked before any descriptor is
// accepted), and the descriptor must be a file of that user, mode 0600 (issue 38: after the
// trainer died, another user's process bound its rendezvous name and served its own memory);
// otherwise WSYNC_ERR_UNAVAILABLE naming the server's pid and uid. `server_pid`, when not null,
// receives the server's pid as this process sees it (0: in a PID namespace not visible here).
int fetch_fd(const std::string &name, const Deadline &deadline, const std::string &who,
             const std::string &gone, int32_t *server_pid = nullptr);

// Whether process `pid` (as this process sees it) is in this process's PID namespace, so that
// the pid it wrote of itself in shared memory is the one seen here. False when it cannot tell.
bool same_pid_namespace(int32_t pid) noexcept;

// A descriptor of the same file as `fd` with an open file description of this process's own
// (through /proc/self/fd), read-write; `fd` is closed either way. A descriptor received over a
// socket shares the sender's open file description, and OFD locks belong to the description:
// a liveness lock taken through it would look to the sender like its own (so the receiver
// would seem dead to it, and the sender gone to the receiver), and two processes holding such
// descriptors could both claim one index. WSYNC_ERR_UNAVAILABLE without /proc.
int reopen_own(int fd, const std::string &who);

}  // namespace wsync::sys
