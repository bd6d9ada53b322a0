#include "sys.hpp"

#include <cerrno>
#include <csignal>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <linux/futex.h>
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

}  // namespace wsync::sys
