#include "board.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <unistd.h>

#include "error.hpp"

namespace wsync::board {

namespace {
constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'B', 'R', 'D'};
constexpr uint32_t kLayoutVersion = 1;
constexpr int64_t kLivenessPollMs = 100;  // how often a waiting sender checks receivers' pids
uint64_t ack_seq(uint64_t word) { return word >> 8; }
}  // namespace

Board *init(void *zeroed_memory, uint32_t receivers, uint32_t slots) {
    Board *b = new (zeroed_memory) Board();
    std::memcpy(b->magic, kMagic, sizeof kMagic);
    b->layout = kLayoutVersion;
    b->receivers = receivers;
    b->slots = slots;
    return b;
}

bool matches(const Board *b, uint32_t receivers, uint32_t slots) {
    return std::memcmp(b->magic, kMagic, sizeof kMagic) == 0 && b->layout == kLayoutVersion &&
           b->receivers == receivers && b->slots == slots;
}

std::string list_indices(uint64_t mask) {
    std::string s = "[";
    for (uint32_t r = 0; r < 64; ++r)
        if (mask & (uint64_t(1) << r)) s += (s.size() > 1 ? ", " : "") + std::to_string(r);
    return s + "]";
}

// ---------------------------------------------------------------------------------------------
Waiter::Waiter(Board *b, std::string kind) : b_(b), kind_(std::move(kind)) {}

void Waiter::publish(uint32_t slot, uint64_t seq) {
    b_->slot[slot].seq.store(seq, std::memory_order_release);
}

bool Waiter::all_attached() const {
    for (uint32_t r = 0; r < b_->receivers; ++r)
        if (b_->receiver[r].state.load(std::memory_order_acquire) == kFree) return false;
    return true;
}

uint64_t Waiter::want(uint32_t slot) const {
    return std::min(b_->slot[slot].seq.load(std::memory_order_relaxed), max_seq_);
}

uint64_t Waiter::pending(const std::vector<uint32_t> &slots) const {
    uint64_t mask = 0;
    for (uint32_t s : slots) {
        uint64_t want = this->want(s);
        if (want == 0) continue;
        for (uint32_t r = 0; r < b_->receivers; ++r)
            if (ack_seq(b_->slot[s].ack[r].load(std::memory_order_acquire)) < want)
                mask |= uint64_t(1) << r;
    }
    return mask;
}

uint64_t Waiter::oldest_pending_seq(uint32_t r, const std::vector<uint32_t> &slots) const {
    uint64_t oldest = 0;
    for (uint32_t s : slots) {
        uint64_t want = this->want(s);
        if (want && ack_seq(b_->slot[s].ack[r].load(std::memory_order_acquire)) < want)
            oldest = oldest ? std::min(oldest, want) : want;
    }
    return oldest;
}

void Waiter::check_failures() {
    for (uint32_t r = 0; r < b_->receivers; ++r) {
        uint64_t fseq = b_->receiver[r].failed_seq.load(std::memory_order_acquire);
        if (fseq > reported_[r]) {
            reported_[r] = fseq;
            auto st = static_cast<wsync_status_t>(b_->receiver[r].failed_status.load());
            b_->receiver[r].failed_seq.store(0, std::memory_order_relaxed);
            fail(WSYNC_ERR_PEER, kind_ + ": receiver " + std::to_string(r) +
                                     " failed chunk seq " + std::to_string(fseq) + " with " +
                                     status_name(st) + " (see that receiver's error for the cause)");
        }
    }
}

void Waiter::check_alive(uint64_t mask, const std::vector<uint32_t> &slots) {
    for (uint32_t r = 0; r < b_->receivers; ++r) {
        if (!(mask & (uint64_t(1) << r))) continue;
        uint32_t state = b_->receiver[r].state.load(std::memory_order_acquire);
        int32_t pid = b_->receiver[r].pid.load(std::memory_order_relaxed);
        std::string seq = std::to_string(oldest_pending_seq(r, slots));
        if (state == kDetached)
            fail(WSYNC_ERR_PEER, kind_ + ": receiver " + std::to_string(r) + " (pid " +
                                     std::to_string(pid) +
                                     ") detached without acknowledging chunk seq " + seq);
        if (state == kAttached && !sys::process_alive(pid))
            fail(WSYNC_ERR_PEER, kind_ + ": receiver " + std::to_string(r) + " (pid " +
                                     std::to_string(pid) +
                                     ") died without acknowledging chunk seq " + seq);
    }
}

void Waiter::wait(const std::vector<uint32_t> &slots, const sys::Deadline &deadline,
                  const char *what, bool report_failures, uint64_t max_seq) {
    max_seq_ = max_seq;
    int64_t last_liveness = -1;
    for (;;) {
        if (report_failures) check_failures();
        uint32_t word = b_->ack_futex.load(std::memory_order_acquire);
        uint64_t mask = pending(slots);
        if (!mask) return;
        int64_t left = deadline.remaining_ms();
        if (last_liveness < 0 || last_liveness - left >= kLivenessPollMs) {
            check_alive(mask, slots);
            last_liveness = left;
        }
        if (deadline.passed()) {
            std::string never;
            for (uint32_t r = 0; r < b_->receivers; ++r)
                if ((mask >> r & 1) && b_->receiver[r].state.load() == kFree)
                    never += (never.empty() ? "" : ", ") + std::to_string(r);
            uint32_t first = static_cast<uint32_t>(__builtin_ctzll(mask));
            fail(WSYNC_ERR_TIMEOUT,
                 kind_ + ": " + what + " after " + std::to_string(deadline.budget_ms()) +
                     " ms: receivers " + list_indices(mask) + " did not acknowledge (receiver " +
                     std::to_string(first) + " is behind on chunk seq " +
                     std::to_string(oldest_pending_seq(first, slots)) + ")" +
                     (never.empty() ? "" : "; never attached: [" + never + "]"));
        }
        sys::futex_wait(&b_->ack_futex, word, std::min(left, kLivenessPollMs));
    }
}

// ---------------------------------------------------------------------------------------------
void attach(Board *b, uint32_t index, const std::string &kind) {
    ReceiverSlot &slot = b->receiver[index];
    const int32_t me = static_cast<int32_t>(getpid());
    int32_t prev = slot.pid.load();
    // Take the slot if it is free or its previous holder is gone.
    for (;;) {
        uint32_t state = slot.state.load(std::memory_order_acquire);
        if (state == kAttached && prev != 0 && sys::process_alive(prev))
            fail(WSYNC_ERR_WRONG_STATE, kind + ": receiver index " + std::to_string(index) +
                                            " is already attached (pid " + std::to_string(prev) +
                                            ")");
        if (slot.pid.compare_exchange_weak(prev, me)) break;
    }
    slot.state.store(kAttached, std::memory_order_release);
}

void detach(Board *b, uint32_t index) noexcept {
    b->receiver[index].state.store(kDetached, std::memory_order_release);
    b->ack_futex.fetch_add(1, std::memory_order_release);
    sys::futex_wake_all(&b->ack_futex);
}

uint64_t held(const Board *b, uint32_t slot) {
    return b->slot[slot].seq.load(std::memory_order_acquire);
}

void acknowledge(Board *b, uint32_t index, uint32_t slot, uint64_t seq,
                 wsync_status_t outcome) noexcept {
    if (outcome != WSYNC_OK) {
        uint64_t zero = 0;
        b->receiver[index].failed_status.store(static_cast<uint32_t>(outcome));
        b->receiver[index].failed_seq.compare_exchange_strong(zero, seq);
    }
    b->slot[slot].ack[index].store(seq << 8 | (static_cast<uint64_t>(outcome) & 0xff),
                                   std::memory_order_release);
    b->ack_futex.fetch_add(1, std::memory_order_release);
    sys::futex_wake_all(&b->ack_futex);
}

}  // namespace wsync::board
