// The sender's end of the board: claims, publishing, joiners, abandon, drop, withdrawal.
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

SenderEnd::SenderEnd(Board *b, int fd, uint32_t receivers, uint32_t slots, std::string kind)
    : b_(b), fd_(fd), receivers_(std::min(receivers, kMaxReceivers)),
      slots_(std::min(slots, kMaxSlots)), kind_(std::move(kind)) {
    snapshot();
    // A board another sender used (a cuda_ipc sender made again, or beside one still going):
    // what it writes until this one is alone is legitimate, so the audit begins from a fresh
    // look at the board, not from this one.
    stale_ = b_->senders_seen.load(std::memory_order_acquire) > 0;
}

void SenderEnd::snapshot() {
    abandoned_floor_ = b_->abandoned_version.load(std::memory_order_acquire);
    dropped_ = 0;
    for (uint32_t r = 0; r < receivers_; ++r) {
        from_seq_[r] = b_->receiver[r].from_seq.load(std::memory_order_acquire);
        if (b_->receiver[r].state.load(std::memory_order_acquire) == kDropped) dropped_ |= uint64_t(1) << r;
    }
    for (uint32_t s = 0; s < slots_; ++s)
        if (b_->slot[s].seq.load(std::memory_order_acquire) != expect_slot_[s]) expect_slot_[s] = 0;
}

void SenderEnd::register_sender() {
    // An index is claimed by its pid word (so two senders of one process, which share the
    // descriptor and so cannot tell their locks apart, still get two indices) and its lock (so
    // receivers and other senders see it die). A claimer that is not this process and holds no
    // lock is dead: its index is taken over.
    const int32_t self = static_cast<int32_t>(getpid());
    for (uint32_t k = 0; k < kMaxSenders; ++k) {
        int32_t cur = b_->sender_pid[k].load(std::memory_order_acquire);
        if (cur != 0 && (cur == self || sys::lock_held_elsewhere(fd_, sender_lock(k)))) continue;
        if (!b_->sender_pid[k].compare_exchange_strong(cur, self)) continue;
        if (!sys::lock_try(fd_, sender_lock(k))) {  // another process took it meanwhile
            b_->sender_pid[k].store(0, std::memory_order_release);
            continue;
        }
        sender_index_ = k;
        uint32_t seen = b_->senders_seen.load();
        while (seen < k + 1 && !b_->senders_seen.compare_exchange_weak(seen, k + 1)) {
        }
        return;
    }
    // More live senders than indices: this one is simply not watched or counted.
}

void SenderEnd::unregister_sender() noexcept {
    if (sender_index_ == UINT32_MAX) return;
    b_->sender_pid[sender_index_].store(0, std::memory_order_release);
    sender_index_ = UINT32_MAX;
}

uint32_t SenderEnd::attached_senders() const {
    const int32_t self = static_cast<int32_t>(getpid());
    uint32_t n = 0;
    for (uint32_t k = 0; k < kMaxSenders; ++k) {
        int32_t pid = b_->sender_pid[k].load(std::memory_order_acquire);
        if (pid != 0 && (pid == self || sys::lock_held_elsewhere(fd_, sender_lock(k)))) ++n;
    }
    return n;
}

uint32_t SenderEnd::admit_joiners(uint64_t seq) {
    uint32_t admitted = 0;
    for (uint32_t r = 0; r < receivers_; ++r) {
        ReceiverSlot &s = b_->receiver[r];
        if (s.state.load(std::memory_order_acquire) != kJoining) continue;
        // One this sender dropped: its records so far are of versions before it joined (an
        // iteration it ended after the drop), which the trainer stopped listening to. Any
        // other's records stand (review: a receiver that failed a chunk and restarted before
        // the trainer looked had its failure skipped, and the flush said OK).
        if (dropped_ >> r & 1) skip_records(r);
        s.from_seq.store(seq, std::memory_order_release);
        from_seq_[r] = seq;
        uint32_t joining = kJoining;
        if (s.state.compare_exchange_strong(joining, kAttached, std::memory_order_acq_rel)) {
            ++admitted;
            dropped_ &= ~(uint64_t(1) << r);
        }
    }
    return admitted;
}

namespace {
void raise_to(std::atomic<uint64_t> &word, uint64_t value) {
    uint64_t cur = word.load(std::memory_order_relaxed);
    while (cur < value && !word.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
    }
}
}  // namespace

std::pair<uint64_t, uint64_t> SenderEnd::resume() {
    const uint64_t v = std::max(b_->newest_version.load(std::memory_order_acquire),
                                b_->abandoned_version.load(std::memory_order_acquire));
    uint64_t seq = b_->newest_seq.load(std::memory_order_acquire);
    for (uint32_t s = 0; s < slots_; ++s) {
        const ChunkSlot &cs = b_->slot[s];
        const uint64_t held = cs.seq.load(std::memory_order_acquire);
        if (held != kWithdrawn) seq = std::max(seq, held);
        for (uint32_t r = 0; r < receivers_; ++r) {
            seq = std::max(seq, ack_seq(cs.ack[r].load(std::memory_order_acquire)));
            const uint64_t taken = cs.taken[r].load(std::memory_order_acquire);
            if (taken != kWithdrawn) seq = std::max(seq, taken);
        }
    }
    if (v >= (uint64_t(1) << 62) - 1 || seq >= (uint64_t(1) << 56) - 1)
        throw Error(WSYNC_ERR_PEER,
                    strf("%s: the board says an earlier sender reached version %" PRIu64
                         " and chunk seq %" PRIu64 ", beyond what a sender writes: another "
                         "process wrote those words; make a new init info",
                         kind_.c_str(), v, seq));
    floor_seq_ = seq + 1;
    floor_version_ = v;
    for (uint32_t r = 0; r < receivers_; ++r) skip_records(r);
    return {v, seq};
}

void SenderEnd::publish(uint32_t slot, uint64_t seq, uint64_t version, uint32_t chunk) {
    if (slot < kMaxSlots) {
        harvest_apply(slot);  // the chunk the slot held is answered (or given up) by now
        published_[slot] = Published{seq, version, chunk}, expect_slot_[slot] = seq;
    }
    raise_to(b_->newest_version, version);
    raise_to(b_->newest_seq, seq);
    b_->slot[slot].seq.store(seq, std::memory_order_release);
}

void SenderEnd::harvest_apply(uint32_t slot) {
    Published &p = published_[slot];
    if (p.seq == 0 || p.abandoned) return;
    const uint64_t ns = reported_apply(b_, slot, p.seq);
    if (ns <= p.applied) return;
    const uint64_t more = ns - p.applied;
    p.applied = ns;
    for (auto &[version, sum] : applied_)
        if (version == p.version) {
            sum = more > UINT64_MAX - sum ? UINT64_MAX : sum + more;
            return;
        }
    if (applied_.size() == kAppliedKept) applied_.erase(applied_.begin());
    applied_.emplace_back(p.version, more);
}

uint64_t SenderEnd::applied_ns(uint64_t version) {
    for (uint32_t s = 0; s < slots_; ++s) harvest_apply(s);
    for (const auto &[v, sum] : applied_)
        if (v == version) return sum;
    return 0;
}

std::string SenderEnd::label(uint64_t seq, Failure &f) const {
    const uint32_t slot = slots_ ? static_cast<uint32_t>((seq - 1) % slots_) : 0;
    if (seq == 0 || slot >= kMaxSlots || published_[slot].seq != seq)
        return "chunk seq " + std::to_string(seq);
    f.version = published_[slot].version;
    f.chunk_index = published_[slot].chunk;
    return strf("chunk %" PRIu32 " of version %" PRIu64 " (seq %" PRIu64 ")", f.chunk_index,
                f.version, seq);
}

bool SenderEnd::abandoned_here(uint64_t version) const {
    return version != 0 && std::find(abandoned_.begin(), abandoned_.end(), version) != abandoned_.end();
}

void SenderEnd::abandon(uint64_t version) {
    for (Published &p : published_)
        if (p.seq != 0 && p.version == version) p.abandoned = true;
    if (abandoned_.size() == kAbandonedKept) abandoned_.erase(abandoned_.begin());
    abandoned_.push_back(version);
    uint64_t cur = b_->abandoned_version.load();
    while (cur < version && !b_->abandoned_version.compare_exchange_weak(cur, version)) {
    }
    abandoned_floor_ = std::max(abandoned_floor_, version);
    wake(b_);
}

void SenderEnd::drop(uint32_t r) {
    ReceiverSlot &s = b_->receiver[r];
    s.from_seq.store(UINT64_MAX, std::memory_order_release);
    from_seq_[r] = UINT64_MAX;
    dropped_ |= uint64_t(1) << r;
    s.state.store(kDropped, std::memory_order_release);
    // Bytes this sender writes into buckets from now on are ordered after the drop: a dropped
    // receiver that read any of them sees that it was dropped (board::dropped).
    std::atomic_thread_fence(std::memory_order_release);
    wake(b_);
}

bool SenderEnd::all_present(uint32_t self) const {
    for (uint32_t r = 0; r < receivers_; ++r) {
        uint32_t st = b_->receiver[r].state.load(std::memory_order_acquire);
        if (st == kDropped || r == self) continue;
        if (st == kFree || st == kDetached || !sys::lock_held_elsewhere(fd_, receiver_lock(r)))
            return false;
    }
    return true;
}

// The newest chunk up to max_seq that lands in `slot` (chunk seq goes to slot (seq-1) % slots):
// computed, not read from the shared slot word, so neither another sender's newer chunk nor a
// stray write can change what this sender waits for.
uint64_t SenderEnd::want(uint32_t slot, uint64_t max_seq) const {
    if (slot >= slots_ || max_seq < uint64_t(slot) + 1) return 0;
    const uint64_t seq = slot + 1 + (max_seq - (slot + 1)) / slots_ * slots_;
    return seq < floor_seq_ ? 0 : seq;  // an earlier sender's chunk: not this one's to wait for
}

bool SenderEnd::owes(uint32_t r, uint64_t seq) const {
    uint32_t st = b_->receiver[r].state.load(std::memory_order_acquire);
    if (st == kDropped) return false;
    return seq >= b_->receiver[r].from_seq.load(std::memory_order_acquire);
}

bool SenderEnd::awaits(uint32_t r, uint32_t slot, uint64_t want) const {
    if (ack_seq(b_->slot[slot].ack[r].load(std::memory_order_acquire)) >= want) return false;
    const Published &p = published_[slot];
    return !(p.withdrawn && p.seq == want && (p.excused >> r & 1));
}

uint64_t SenderEnd::pending(const std::vector<uint32_t> &slots, uint64_t max_seq) const {
    uint64_t mask = 0;
    for (uint32_t s : slots) {
        uint64_t want = this->want(s, max_seq);
        if (want == 0) continue;
        for (uint32_t r = 0; r < receivers_; ++r)
            if (owes(r, want) && awaits(r, s, want)) mask |= uint64_t(1) << r;
    }
    return mask;
}

uint64_t SenderEnd::oldest_pending_seq(uint32_t r, const std::vector<uint32_t> &slots,
                                    uint64_t max_seq) const {
    uint64_t oldest = 0;
    for (uint32_t s : slots) {
        uint64_t want = this->want(s, max_seq);
        if (want && awaits(r, s, want)) oldest = oldest ? std::min(oldest, want) : want;
    }
    return oldest;
}

void SenderEnd::withdraw_abandoned(const std::vector<uint32_t> &slots, uint64_t max_seq) {
    if (!sole_) return;
    bool any = false;
    for (uint32_t s : slots) {
        if (s >= slots_) continue;
        const Published &p = published_[s];
        const uint64_t want = this->want(s, max_seq);
        any = any || (want != 0 && p.seq == want && p.abandoned && !p.withdrawn);
    }
    // The init info's one sender is also the only one on the board (a second one made from the
    // same blob could publish a seq this one withdraws; withdrawing would then hide its chunk).
    if (!any || attached_senders() > 1) return;
    for (uint32_t s : slots) {
        if (s >= slots_) continue;
        Published &p = published_[s];
        const uint64_t want = this->want(s, max_seq);
        if (want == 0 || p.seq != want || !p.abandoned || p.withdrawn) continue;
        // The handshake of the table's notes: our store, then their words (both seq_cst).
        b_->slot[s].seq.store(kWithdrawn, std::memory_order_seq_cst);
        p.withdrawn = true;
        expect_slot_[s] = kWithdrawn;
        for (uint32_t r = 0; r < receivers_; ++r)
            if (b_->slot[s].taken[r].load(std::memory_order_seq_cst) != want)
                p.excused |= uint64_t(1) << r;
    }
}

int32_t SenderEnd::pid_of(uint32_t r) const { return b_->receiver[r].pid.load(std::memory_order_relaxed); }

}  // namespace wsync::board
