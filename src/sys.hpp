// Operating-system helpers shared by strategies: deadlines, futex waits on shared memory,
// randomness, process liveness. Linux only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace wsync::sys {

using Clock = std::chrono::steady_clock;

// A point in time after which a wait gives up. Built from a millisecond budget.
class Deadline {
public:
    explicit Deadline(int64_t timeout_ms)
        : end_(Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms)),
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

// True unless the kernel says the process does not exist (ESRCH).
bool process_alive(int32_t pid);

}  // namespace wsync::sys
