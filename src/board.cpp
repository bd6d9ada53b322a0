#include "board.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <new>
#include <sched.h>
#include <unistd.h>

namespace wsync::board {

namespace {
constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'B', 'R', 'D'};
// 3: released words, sender claims; 4: taken words; 5: newest_version and newest_seq
constexpr uint32_t kLayoutVersion = 5;
constexpr int64_t kLivenessPollMs = 100;  // how often a waiting sender checks receivers' locks
constexpr int kSeqlockTries = 4;  // a record changed while copied is re-read this often at most
uint64_t ack_seq(uint64_t word) { return word >> 8; }
uint64_t receiver_lock(uint32_t r) { return kLockBase + r; }
uint64_t sender_lock(uint32_t k) { return kLockBase + kMaxReceivers + k; }

void wake(Board *b) {
    b->ack_futex.fetch_add(1, std::memory_order_release);
    sys::futex_wake_all(&b->ack_futex);
}

// Control characters in a peer's message would garble logs: show them as '?'.
std::string printable(const char *p, std::size_t cap) {
    std::size_t n = strnlen(p, cap);
    std::string s(p, n);
    for (char &c : s)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    return s;
}
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
    if (slot < kMaxSlots) published_[slot] = Published{seq, version, chunk}, expect_slot_[slot] = seq;
    raise_to(b_->newest_version, version);
    raise_to(b_->newest_seq, seq);
    b_->slot[slot].seq.store(seq, std::memory_order_release);
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

void SenderEnd::collect_failures(std::vector<Failure> &out) {
    for (uint32_t r = 0; r < receivers_; ++r) {
        ReceiverSlot &s = b_->receiver[r];
        uint64_t n = s.failures.load(std::memory_order_acquire);
        if (n < reported_[r]) {
            // The count only grows (the receiver's own word): another process wrote it. Say
            // so, and read its records from there on, so that later failures still arrive.
            Failure f;
            f.what = WSYNC_FAILURE_FAILED;
            f.status = WSYNC_ERR_PEER;
            f.receiver = r;
            f.pid = pid_of(r);
            f.message = strf("this receiver's count of failure records went back from %" PRIu64
                             " to %" PRIu64 ": its words on the board were written by another "
                             "process",
                             reported_[r], n);
            reported_[r] = n;
            out.push_back(std::move(f));
            continue;
        }
        if (n == reported_[r]) continue;
        const uint32_t state = s.state.load(std::memory_order_acquire);
        if (state == kDropped || (state == kJoining && (dropped_ >> r & 1))) {
            // Dropped: the trainer stopped listening to it (a dropped engine ending the chunk
            // it was reading fails it: not the others' concern). Joining after this sender
            // dropped it: the same records, read late (a re-attached engine's failure
            // from before its drop reached the trainer's next send and abandoned that version
            // for every engine: C++ user trial).
            reported_[r] = n;
            continue;
        }
        uint64_t first = reported_[r];
        if (n - first > kFailureRing) {
            Failure lost;
            lost.what = WSYNC_FAILURE_FAILED;
            lost.status = WSYNC_ERR_PEER;
            lost.receiver = r;
            lost.pid = pid_of(r);
            lost.message = strf("%" PRIu64 " earlier failure records of this receiver were "
                                "overwritten before this sender read them",
                                n - first - kFailureRing);
            out.push_back(std::move(lost));
            first = n - kFailureRing;
        }
        for (uint64_t k = first; k < n; ++k) {
            const FailureRecord &rec = s.ring[k % kFailureRing];
            const uint32_t done = static_cast<uint32_t>(2 * k + 2);
            Failure f;
            f.what = WSYNC_FAILURE_FAILED;
            f.receiver = r;
            bool ok = false;
            for (int t = 0; t < kSeqlockTries && !ok; ++t) {
                uint32_t g1 = rec.gen.load(std::memory_order_acquire);
                // A receiver completes record k (gen 2k+2) before it publishes failures = k+1,
                // so any other generation means a later record overwrote it, or a stray write
                // did: never worth waiting for (a scribbled gen once cost seconds of spinning).
                if (g1 != done) break;
                uint32_t status = rec.status;
                uint64_t version = rec.version;
                uint32_t chunk = rec.chunk;
                int32_t pid = rec.pid;
                char msg[kMessageBytes];
                std::memcpy(msg, rec.message, sizeof msg);
                std::atomic_thread_fence(std::memory_order_acquire);
                if (rec.gen.load(std::memory_order_relaxed) != g1) continue;
                msg[kMessageBytes - 1] = '\0';
                f.status = status >= 1 && status <= 0xff ? static_cast<wsync_status_t>(status)
                                                         : WSYNC_ERR_PEER;
                f.version = version;
                f.chunk_index = chunk;
                f.pid = pid;
                f.message = printable(msg, sizeof msg);
                ok = true;
            }
            if (!ok) {
                f.status = WSYNC_ERR_PEER;
                f.pid = pid_of(r);
                f.message = strf("failure record %" PRIu64
                                 " was unreadable (overwritten, torn or corrupt)", k);
            }
            // A version this sender abandoned failed everywhere already; one up to
            // floor_version_ is an earlier sender's (resume(): a trainer killed mid-version
            // never abandoned it, and an engine that stayed records it lost only when this
            // sender's first chunk reaches it: review).
            if (ok && (abandoned_here(f.version) || (f.version != 0 && f.version <= floor_version_)))
                continue;
            out.push_back(std::move(f));
        }
        reported_[r] = n;
    }
}

namespace {
std::string describe(const std::string &kind, const std::vector<Failure> &fs) {
    std::string msg;
    for (const Failure &f : fs) {
        if (!msg.empty()) msg += "; ";
        msg += strf("%s: receiver %" PRIu32, kind.c_str(), f.receiver);
        if (f.pid) msg += strf(" (pid %" PRId32 ")", f.pid);
        switch (f.what) {
        case WSYNC_FAILURE_FAILED:
            msg += " failed";
            if (f.chunk_index != WSYNC_NO_CHUNK)
                msg += strf(" chunk %" PRIu32 " of version %" PRIu64, f.chunk_index, f.version);
            msg += strf(": %s: %s", status_name(f.status), f.message.c_str());
            break;
        default:
            msg += " " + f.message;
        }
    }
    return msg;
}
}  // namespace

void SenderEnd::check_alive(uint64_t mask, const std::vector<uint32_t> &slots, uint64_t max_seq) {
    std::vector<Failure> fs;
    for (uint32_t r = 0; r < receivers_; ++r) {
        if (!(mask & (uint64_t(1) << r))) continue;
        uint32_t state = b_->receiver[r].state.load(std::memory_order_acquire);
        uint64_t seq = oldest_pending_seq(r, slots, max_seq);
        // `mask` was read before `state`: a receiver that has since acknowledged its last chunk
        // and then detached or exited (an engine finishing its final version) owes nothing and
        // is no failure. Its acknowledgements were stored before its state changed, so having
        // read the new state (acquire) we also see them.
        if (seq == 0) continue;
        Failure f;
        f.receiver = r;
        f.pid = pid_of(r);
        f.status = WSYNC_ERR_PEER;
        if (state == kDetached) {
            f.what = WSYNC_FAILURE_DETACHED;
            f.message = "detached without acknowledging " + label(seq, f);
        } else if (state == kJoining) {
            // The pid word is the new process's now: name it as such, not as the one that went
            // away (delta user trial: "receiver 0 (pid NEW) went away" named the restarted
            // engine). f.pid is 0: the dead process's pid is not known here.
            f.what = WSYNC_FAILURE_DIED;
            f.message = "went away without acknowledging " + label(seq, f) +
                        strf(" and a new process (pid %" PRId32 ") has re-attached with its index "
                             "since (it takes part again from the next version)",
                             f.pid);
            f.pid = 0;
        } else if (state == kAttached && !sys::lock_held_elsewhere(fd_, receiver_lock(r))) {
            f.what = WSYNC_FAILURE_DIED;
            f.message = "died without acknowledging " + label(seq, f);
        } else {
            continue;
        }
        fs.push_back(std::move(f));
    }
    if (!fs.empty()) {
        std::string msg = describe(kind_, fs);
        throw Error(WSYNC_ERR_PEER, msg, std::move(fs));
    }
}

void SenderEnd::skip_records(uint32_t r) {
    const uint64_t n = b_->receiver[r].failures.load(std::memory_order_acquire);
    if (n > reported_[r]) reported_[r] = n;
}

void SenderEnd::throw_new_failures() {
    std::vector<Failure> fs;
    collect_failures(fs);
    if (!fs.empty()) {
        std::string msg = describe(kind_, fs);
        throw Error(WSYNC_ERR_PEER, msg, std::move(fs));
    }
}

void SenderEnd::audit_claims(std::vector<std::string> &words) {
    const int32_t self = static_cast<int32_t>(getpid());
    for (uint32_t k = 0; k < kMaxSenders; ++k) {
        const int32_t want = k == sender_index_ ? self : 0;
        int32_t got = b_->sender_pid[k].load(std::memory_order_acquire);
        if (got == want) continue;
        words.push_back(strf("sender index %" PRIu32 " said pid %" PRId32 ", %s", k, got,
                             k == sender_index_ ? "this sender's is its own"
                                                : "this board has one sender"));
        b_->sender_pid[k].compare_exchange_strong(got, want, std::memory_order_acq_rel);
    }
}

void SenderEnd::audit() {
    if (!sole_) return;
    std::vector<std::string> words;
    if (exclusive_) {
        // No other sender exists by design: a claim is a finding, never a reason to stand aside.
        audit_claims(words);
    } else if (attached_senders() > 1) {
        // Judged only while this sender is alone on the board, and not right after another one
        // was (its writes were legitimate: review, a cuda_ipc sender made beside one that then
        // dropped a receiver and went away).
        stale_ = true;
        return;
    }
    if (stale_) {
        // The board as it is now is what this sender expects from here on; a claim found
        // above (exclusive) is still reported below.
        snapshot();
        stale_ = false;
    }
    // First only look (cheap: a few loads per slot and receiver); act only on a difference.
    // expect_slot_[s] == 0: not known (not published here since the last look).
    bool differs = b_->abandoned_version.load(std::memory_order_acquire) != abandoned_floor_;
    for (uint32_t s = 0; s < slots_ && !differs; ++s)
        differs = expect_slot_[s] != 0 && b_->slot[s].seq.load(std::memory_order_acquire) != expect_slot_[s];
    for (uint32_t r = 0; r < receivers_ && !differs; ++r) {
        const ReceiverSlot &rs = b_->receiver[r];
        differs = rs.from_seq.load(std::memory_order_acquire) != from_seq_[r] ||
                  (rs.state.load(std::memory_order_acquire) == kDropped && !(dropped_ >> r & 1));
    }
    if (!differs && words.empty()) return;
    std::vector<Failure> fs;
    const uint64_t av = b_->abandoned_version.load(std::memory_order_acquire);
    if (av != abandoned_floor_) {
        words.push_back(strf("abandoned_version said %" PRIu64 ", this sender's is %" PRIu64, av,
                             abandoned_floor_));
        b_->abandoned_version.store(abandoned_floor_, std::memory_order_release);
    }
    for (uint32_t s = 0; s < slots_; ++s) {
        const uint64_t want = expect_slot_[s], got = b_->slot[s].seq.load(std::memory_order_acquire);
        if (want == 0 || got == want) continue;
        words.push_back(strf("slot %" PRIu32 " said chunk seq %" PRIu64 ", this sender %s %" PRIu64,
                             s, got, published_[s].withdrawn ? "withdrew" : "published",
                             published_[s].seq));
        b_->slot[s].seq.store(want, std::memory_order_seq_cst);
    }
    for (uint32_t r = 0; r < receivers_; ++r) {
        ReceiverSlot &rs = b_->receiver[r];
        std::string what;
        const uint64_t from = rs.from_seq.load(std::memory_order_acquire);
        if (from != from_seq_[r]) {
            what = strf("its from_seq said %" PRIu64 ", this sender wrote %" PRIu64, from, from_seq_[r]);
            rs.from_seq.store(from_seq_[r], std::memory_order_release);
        }
        uint32_t st = kDropped;
        if (!(dropped_ >> r & 1) && rs.state.compare_exchange_strong(st, kAttached, std::memory_order_acq_rel))
            what += std::string(what.empty() ? "" : "; ") + "its state said dropped, which this sender did not do";
        if (what.empty()) continue;
        Failure f;
        f.what = WSYNC_FAILURE_FAILED;
        f.status = WSYNC_ERR_PEER;
        f.receiver = r;
        f.pid = pid_of(r);
        f.message = "another process wrote this receiver's words on the board (" + what + "; put back)";
        words.push_back(strf("receiver %" PRIu32 ": ", r) + what);
        fs.push_back(std::move(f));
    }
    if (words.empty()) return;  // it changed back meanwhile
    wake(b_);
    std::string msg;
    for (const std::string &w : words) msg += (msg.empty() ? "" : "; ") + w;
    throw Error(WSYNC_ERR_PEER, kind_ + ": words on the board that only this sender writes were "
                                        "written by another process (" + msg + "; each put back): "
                                        "receivers may have acted on them, so the version in "
                                        "flight is not trusted",
                std::move(fs));
}

void SenderEnd::check_abandoned_acks(const std::vector<uint32_t> &slots, uint64_t max_seq) {
    if (!sole_) return;  // with several senders, another one may have abandoned the version
    std::vector<Failure> fs;
    for (uint32_t s : slots) {
        const uint64_t want = this->want(s, max_seq);
        if (want == 0 || s >= kMaxSlots) continue;
        Published &p = published_[s];
        if (p.seq != want || p.abandoned) continue;
        for (uint32_t r = 0; r < receivers_; ++r) {
            const uint64_t a = b_->slot[s].ack[r].load(std::memory_order_acquire);
            if (ack_seq(a) != want || (a & 0xff) != uint64_t(WSYNC_ERR_ABANDONED) ||
                (p.odd_acks >> r & 1) || !owes(r, want))
                continue;
            p.odd_acks |= uint64_t(1) << r;
            Failure f;
            f.what = WSYNC_FAILURE_FAILED;
            f.status = WSYNC_ERR_PEER;
            f.receiver = r;
            f.pid = pid_of(r);
            f.version = p.version;
            f.chunk_index = p.chunk;
            f.message = strf("refused chunk %" PRIu32 " of version %" PRIu64 " as abandoned, "
                             "which this sender never abandoned: another process wrote the "
                             "board's abandoned_version word or this chunk's slot word (as "
                             "withdrawn), and that version is not complete on this receiver",
                             p.chunk, p.version);
            fs.push_back(std::move(f));
        }
    }
    if (!fs.empty()) {
        std::string msg = describe(kind_, fs);
        throw Error(WSYNC_ERR_PEER, msg, std::move(fs));
    }
}

void SenderEnd::wait(const std::vector<uint32_t> &slots, const sys::Deadline &deadline,
                  const char *what, uint64_t max_seq, bool gather) {
    audit();
    withdraw_abandoned(slots, max_seq);
    int64_t last_liveness = -1;
    // gather: the failures found so far and the receivers they name (not waited for further).
    std::vector<Failure> held;
    uint64_t failed = 0;
    // Runs a check; with gather, holds the failures it throws instead of letting them end the
    // wait (a receiver's failures are each reported once: the next look finds new ones only).
    auto checked = [&](auto &&check) {
        if (!gather) return check();
        try {
            check();
        } catch (Error &e) {
            if (e.status() != WSYNC_ERR_PEER || e.failures().empty()) throw;
            // A receiver is reported by the look that first finds it failed; what later looks
            // find of it is not added (review: another process flipping a receiver's failure
            // count made every pass add records, 284550 in 2 s), nor anything past a bound.
            const uint64_t before = failed;
            for (const Failure &f : e.failures()) {
                const bool indexed = f.receiver < kMaxReceivers;
                if ((indexed && (before >> f.receiver & 1)) || held.size() >= kMaxHeldFailures)
                    continue;
                if (indexed) failed |= uint64_t(1) << f.receiver;
                held.push_back(f);
            }
        }
    };
    auto throw_held = [&](std::vector<Failure> more, const std::string &tail) {
        std::string msg = describe(kind_, held) + tail;
        for (Failure &f : more) held.push_back(std::move(f));
        throw Error(WSYNC_ERR_PEER, msg, std::move(held));
    };
    for (;;) {
        checked([&] { throw_new_failures(); });
        checked([&] { check_abandoned_acks(slots, max_seq); });
        uint32_t word = b_->ack_futex.load(std::memory_order_acquire);
        uint64_t mask = pending(slots, max_seq) & ~failed;
        if (!mask) {
            // A receiver writes its failure record before the acknowledgement it concerns: one
            // written after the check above but before those acknowledgements is reported now,
            // not by the next call.
            checked([&] { throw_new_failures(); });
            checked([&] { check_abandoned_acks(slots, max_seq); });
            if (!held.empty()) throw_held({}, "");
            return;
        }
        int64_t left = deadline.remaining_ms();
        if (last_liveness < 0 || last_liveness - left >= kLivenessPollMs) {
            checked([&] { check_alive(mask, slots, max_seq); });
            last_liveness = left;
            mask &= ~failed;
            if (!mask) continue;  // every receiver still owing has failed: look once more
        }
        if (deadline.passed()) {
            std::vector<Failure> fs;
            std::string never;
            for (uint32_t r = 0; r < receivers_; ++r) {
                if (!(mask >> r & 1)) continue;
                Failure f;
                f.what = WSYNC_FAILURE_TIMEOUT;
                f.status = WSYNC_ERR_TIMEOUT;
                f.receiver = r;
                f.pid = pid_of(r);
                const std::string chunk = label(oldest_pending_seq(r, slots, max_seq), f);
                f.message = strf("did not acknowledge %s within %" PRId64 " ms", chunk.c_str(),
                                 deadline.budget_ms());
                fs.push_back(std::move(f));
                if (b_->receiver[r].state.load() == kFree)
                    never += (never.empty() ? "" : ", ") + std::to_string(r);
            }
            uint32_t first = static_cast<uint32_t>(__builtin_ctzll(mask));
            if (!held.empty())
                throw_held(std::move(fs),
                           strf("; and receivers %s did not acknowledge within %" PRId64 " ms%s%s%s",
                                list_indices(mask).c_str(), deadline.budget_ms(),
                                never.empty() ? "" : " (never attached: [", never.c_str(),
                                never.empty() ? "" : "])"));
            Failure scratch;
            const std::string behind = label(oldest_pending_seq(first, slots, max_seq), scratch);
            throw Error(WSYNC_ERR_TIMEOUT,
                        strf("%s: %s after %" PRId64 " ms: receivers %s did not acknowledge "
                             "(receiver %" PRIu32 " is behind on %s)%s%s%s",
                             kind_.c_str(), what, deadline.budget_ms(), list_indices(mask).c_str(),
                             first, behind.c_str(),
                             never.empty() ? "" : "; never attached: [", never.c_str(),
                             never.empty() ? "" : "]"),
                        std::move(fs));
        }
        sys::futex_wait(&b_->ack_futex, word, std::min(left, kLivenessPollMs));
    }
}

uint64_t SenderEnd::releases_pending(uint64_t version, uint64_t last_seq) const {
    uint64_t mask = 0;
    for (uint32_t r = 0; r < receivers_; ++r) {
        const ReceiverSlot &s = b_->receiver[r];
        uint32_t st = s.state.load(std::memory_order_acquire);
        // Joining receivers refuse every chunk until they are admitted: they map nothing.
        if (st != kAttached) continue;
        if (version != kAllReleased && s.from_seq.load(std::memory_order_acquire) > last_seq) continue;
        if (s.released.load(std::memory_order_acquire) >= version) continue;
        // A dead process's mappings went with it.
        if (!sys::lock_held_elsewhere(fd_, receiver_lock(r))) continue;
        mask |= uint64_t(1) << r;
    }
    return mask;
}

void SenderEnd::wait_released(uint64_t version, uint64_t last_seq, const sys::Deadline &deadline,
                           const char *what) {
    for (;;) {
        uint32_t word = b_->ack_futex.load(std::memory_order_acquire);
        uint64_t mask = releases_pending(version, last_seq);
        if (!mask) return;
        int64_t left = deadline.remaining_ms();
        if (deadline.passed()) {
            std::vector<Failure> fs;
            std::string detail;
            for (uint32_t r = 0; r < receivers_; ++r) {
                if (!(mask >> r & 1)) continue;
                uint64_t rel = b_->receiver[r].released.load(std::memory_order_acquire);
                Failure f;
                f.what = WSYNC_FAILURE_TIMEOUT;
                f.status = WSYNC_ERR_TIMEOUT;
                f.receiver = r;
                f.version = version == kAllReleased ? 0 : version;
                f.pid = pid_of(r);
                f.message = strf("still maps memory: it has released through version %" PRIu64
                                 " (it releases a version when it ends the version's last "
                                 "chunk, and everything when it is destroyed)",
                                 rel);
                fs.push_back(std::move(f));
                detail += strf("%sreceiver %" PRIu32 " released through version %" PRIu64,
                               detail.empty() ? "" : ", ", r, rel);
            }
            const std::string mapped =
                version == kAllReleased
                    ? std::string("this sync's memory (not destroyed yet)")
                    : strf("memory that version %" PRIu64 " no longer uses", version);
            throw Error(WSYNC_ERR_TIMEOUT,
                        strf("%s: %s after %" PRId64 " ms: receivers %s still map %s (%s)",
                             kind_.c_str(), what, deadline.budget_ms(), list_indices(mask).c_str(),
                             mapped.c_str(), detail.c_str()),
                        std::move(fs));
        }
        sys::futex_wait(&b_->ack_futex, word, std::min(left, kLivenessPollMs));
    }
}

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
    // The index is ours now: nobody else can run this code for it until we close fd.
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
    b->slot[slot].ack[index].store(seq << 8 | (static_cast<uint64_t>(outcome) & 0xff),
                                   std::memory_order_release);
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
