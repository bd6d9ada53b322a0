// The sender's end of the board: waiting for acknowledgements and releases.
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

void SenderEnd::wait(const std::vector<uint32_t> &slots, const sys::Deadline &deadline,
                  const char *what, uint64_t max_seq, bool gather) {
    audit();
    withdraw_abandoned(slots, max_seq);
    int64_t last_liveness = -1;
    // gather: the failures found so far (the core's policy, src/failures.hpp); the receivers
    // they name are not waited for further.
    FailureGather held(kMaxHeldFailures);
    uint64_t failed = 0;
    // Runs a check; with gather, holds the failures it throws instead of letting them end the
    // wait (a receiver's failures are each reported once: the next look finds new ones only;
    // review: another process flipping a receiver's failure count made every pass add records,
    // 284550 in 2 s).
    auto checked = [&](auto &&check) {
        if (!gather) return check();
        try {
            check();
        } catch (Error &e) {
            if (e.status() != WSYNC_ERR_PEER || e.failures().empty()) throw;
            held.add(e.failures());
            for (const Failure &f : held.held())
                if (f.receiver < kMaxReceivers) failed |= uint64_t(1) << f.receiver;
        }
    };
    auto throw_held = [&](std::vector<Failure> more, const std::string &tail) {
        held.report(kind_, std::move(more), tail);
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

}  // namespace wsync::board
