#include "transport/local/board.hpp"
#include "transport/local/board_words.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <new>
#include <sched.h>
#include <unistd.h>

namespace wsync::board {

using namespace words;

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
// ---------------------------------------------------------------------------------------------
void attach(Board *b, int fd, uint32_t index, const std::string &kind) {
    ReceiverSlot &slot = b->receiver[index];
    if (!sys::lock_try(fd, receiver_lock(index))) {
        // A dropped receiver whose process lives on still holds its index (its lock): it must
        // end first (Rust user trial: a replacement for a frozen, dropped engine was refused
        // with no word of the drop).
        if (slot.state.load(std::memory_order_acquire) == kDropped)
            failf(WSYNC_ERR_WRONG_STATE,
                  "%s: receiver index %" PRIu32 " was dropped by the sender, but its process "
                  "(pid %" PRId32 ") is still alive and holds the index: end that process (or "
                  "destroy its receiver), then attach again",
                  kind.c_str(), index, slot.pid.load());
        failf(WSYNC_ERR_WRONG_STATE,
              "%s: receiver index %" PRIu32 " is already attached by a live process (pid %" PRId32
              "): an index serves one engine at a time; destroy that receiver or end that process "
              "first, or attach another index (a frozen engine: the trainer drops it, "
              "wsync_sender_drop_receiver, then end its process)",
              kind.c_str(), index, slot.pid.load());
    }
    // The index is ours now: nobody else can run this code for it until we close fd. A board
    // whose every sender has died (or was destroyed) gets no version again from them: joining
    // it would wait on nobody (issue 38: a new engine attached to a killed trainer's board as if
    // it were live). Refused before any word changes; closing fd releases the index.
    if (standing(b, fd, index).sender_gone)
        failf(WSYNC_ERR_UNAVAILABLE,
              "%s: the sender of this segment is gone (its process ended or destroyed it; the "
              "segment was made by pid %" PRId32 "): receiver index %" PRIu32 " would wait for "
              "versions nobody sends; attach with the init info of the trainer's new sender",
              kind.c_str(), b->creator_pid, index);
    slot.pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
    slot.released.store(0, std::memory_order_release);  // a new process maps nothing yet
    uint32_t state = slot.state.load(std::memory_order_acquire);
    if (state == kFree) {
        if (slot.state.compare_exchange_strong(state, kAttached)) return;
    }
    // Used before (a restart, or after a drop): join at the next version a sender begins.
    slot.state.store(kJoining, std::memory_order_release);
    wake(b);
}

void detach(Board *b, uint32_t index) noexcept {
    uint32_t st = b->receiver[index].state.load();
    if (st != kDropped) b->receiver[index].state.store(kDetached, std::memory_order_release);
    wake(b);
}

void release(Board *b, uint32_t index, uint64_t version) noexcept {
    std::atomic<uint64_t> &w = b->receiver[index].released;
    uint64_t cur = w.load(std::memory_order_relaxed);
    while (cur < version && !w.compare_exchange_weak(cur, version, std::memory_order_release)) {
    }
    wake(b);
}

uint64_t published_seq(const Board *b, uint32_t slot) {
    return b->slot[slot].seq.load(std::memory_order_acquire);
}

void record_failure(Board *b, uint32_t index, wsync_status_t status, uint64_t version,
                    uint32_t chunk, const std::string &message) noexcept {
    ReceiverSlot &s = b->receiver[index];
    uint64_t k = s.failures.load(std::memory_order_relaxed);
    FailureRecord &rec = s.ring[k % kFailureRing];
    rec.gen.store(static_cast<uint32_t>(2 * k + 1), std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    rec.status = static_cast<uint32_t>(status);
    rec.version = version;
    rec.chunk = chunk;
    rec.pid = static_cast<int32_t>(getpid());
    std::size_t n = std::min(message.size(), kMessageBytes - 1);
    std::memcpy(rec.message, message.data(), n);
    rec.message[n] = '\0';
    rec.gen.store(static_cast<uint32_t>(2 * k + 2), std::memory_order_release);
    s.failures.store(k + 1, std::memory_order_release);
    wake(b);
}

void acknowledge(Board *b, uint32_t index, uint32_t slot, uint64_t seq,
                 wsync_status_t outcome) noexcept {
    // Statuses fit the word's 8 bits (board.hpp); one that did not would read as another, so
    // it is recorded as a failure of the library instead.
    const uint64_t code = static_cast<uint64_t>(outcome) <= 0xff ? static_cast<uint64_t>(outcome)
                                                                 : uint64_t(WSYNC_ERR_INTERNAL);
    b->slot[slot].ack[index].store(seq << 8 | code, std::memory_order_release);
    wake(b);
}

bool dropped(const Board *b, uint32_t index) noexcept {
    std::atomic_thread_fence(std::memory_order_acquire);
    return b->receiver[index].state.load(std::memory_order_relaxed) == kDropped;
}

bool acknowledged(const Board *b, uint32_t index, uint32_t slot, uint64_t seq) noexcept {
    std::atomic_thread_fence(std::memory_order_acquire);
    return ack_seq(b->slot[slot].ack[index].load(std::memory_order_relaxed)) >= seq;
}

namespace {
constexpr uint64_t kApplyNsMax = (uint64_t(1) << kApplyNsBits) - 1;
uint64_t apply_tag(uint64_t seq) { return seq & ((uint64_t(1) << kApplyTagBits) - 1); }
}  // namespace

void report_apply(Board *b, uint32_t slot, uint64_t seq, uint64_t ns) noexcept {
    if (ns == 0) return;
    const uint64_t want = apply_tag(seq) << kApplyNsBits | std::min(ns, kApplyNsMax);
    std::atomic<uint64_t> &w = b->slot[slot].applied;
    uint64_t cur = w.load(std::memory_order_relaxed);
    // Another seq's tag (an earlier chunk in the slot) is replaced; this seq's is raised.
    while ((cur >> kApplyNsBits != apply_tag(seq) || cur < want) &&
           !w.compare_exchange_weak(cur, want, std::memory_order_relaxed)) {
    }
}

uint64_t reported_apply(const Board *b, uint32_t slot, uint64_t seq) noexcept {
    const uint64_t w = b->slot[slot].applied.load(std::memory_order_acquire);
    return w >> kApplyNsBits == apply_tag(seq) ? w & kApplyNsMax : 0;
}

uint64_t taken_seq(const Board *b, uint32_t index, uint32_t slot) noexcept {
    return b->slot[slot].taken[index].load(std::memory_order_seq_cst);
}

void acknowledge_taken(Board *b, uint32_t index, uint32_t slot, uint64_t seq,
                       wsync_status_t outcome) noexcept {
    if (ack_seq(b->slot[slot].ack[index].load(std::memory_order_acquire)) < seq)
        acknowledge(b, index, slot, seq, outcome);
}

bool take(Board *b, uint32_t index, uint32_t slot, uint64_t seq) noexcept {
    b->slot[slot].taken[index].store(seq, std::memory_order_seq_cst);
    return b->slot[slot].seq.load(std::memory_order_seq_cst) == seq;
}

Standing standing(const Board *b, int fd, uint32_t index) {
    Standing s;
    s.state = b->receiver[index].state.load(std::memory_order_acquire);
    s.from_seq = b->receiver[index].from_seq.load(std::memory_order_acquire);
    s.abandoned_version = b->abandoned_version.load(std::memory_order_acquire);
    uint32_t seen = std::min(b->senders_seen.load(std::memory_order_acquire), kMaxSenders);
    s.sender_gone = seen > 0;
    for (uint32_t k = 0; k < seen && s.sender_gone; ++k)
        if (sys::lock_held_elsewhere(fd, sender_lock(k))) s.sender_gone = false;
    return s;
}

}  // namespace wsync::board
