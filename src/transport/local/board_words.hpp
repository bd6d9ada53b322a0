// Helpers the board's two halves share (board.cpp: words and the receiver side; sender_end.cpp:
// the sender side). Internal to src/transport/local.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "transport/local/board.hpp"

namespace wsync::board::words {

constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'B', 'R', 'D'};
// 3: released words, sender claims; 4: taken words; 5: newest_version and newest_seq
constexpr uint32_t kLayoutVersion = 5;
constexpr int64_t kLivenessPollMs = 100;  // how often a waiting sender checks receivers' locks
constexpr int kSeqlockTries = 4;  // a record changed while copied is re-read this often at most
inline uint64_t ack_seq(uint64_t word) { return word >> 8; }
inline uint64_t receiver_lock(uint32_t r) { return kLockBase + r; }
inline uint64_t sender_lock(uint32_t k) { return kLockBase + kMaxReceivers + k; }

inline void wake(Board *b) {
    b->ack_futex.fetch_add(1, std::memory_order_release);
    sys::futex_wake_all(&b->ack_futex);
}

// Control characters in a peer's message would garble logs: show them as '?'.
inline std::string printable(const char *p, std::size_t cap) {
    std::size_t n = strnlen(p, cap);
    std::string s(p, n);
    for (char &c : s)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return s;
}

}  // namespace wsync::board::words
