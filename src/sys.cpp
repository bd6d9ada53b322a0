#include "sys.hpp"

#include <cerrno>
#include <csignal>
#include <ctime>
#include <linux/futex.h>
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
    return !(kill(pid, 0) == -1 && errno == ESRCH);
}

}  // namespace wsync::sys
