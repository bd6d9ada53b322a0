// The sender's end of the board: what it reads of receivers (failure records, liveness) and
// its audit of the words only it writes.
#include "transport/local/board.hpp"
#include "transport/local/board_words.hpp"
#include "failures.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <new>
#include <sched.h>
#include <unistd.h>

namespace wsync::board {

using namespace words;

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
        std::string msg = describe_failures(kind_, fs);
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
        std::string msg = describe_failures(kind_, fs);
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
        std::string msg = describe_failures(kind_, fs);
        throw Error(WSYNC_ERR_PEER, msg, std::move(fs));
    }
}

}  // namespace wsync::board
