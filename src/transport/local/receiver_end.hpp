// A receiver's end of the same-host protocol (the board of a SharedSegment), beside the
// sender's board::SenderEnd. shm and cuda_ipc receivers delegate to it everything they say on
// the board, so the receive half of the protocol is written once:
//
// - where a request's chunk lies (its slot and seq, checked against this process's geometry);
// - taking a chunk before reading it (stale, replayed, withdrawn and not-owed requests refused
//   by name; chunks never given before it acknowledged as missed);
// - answering a chunk it will not load: the one place that records a failure and then
//   acknowledges (the record first, so a sender that sees the acknowledgement finds it);
// - its acknowledgements, failure records and detach.
//
// Thread rules: the receiver's owner thread calls everything, except that record_failure and
// fail() may also run on a helper thread (cuda_ipc's AckQueue): they hold board_mutex(), so
// failure records (a seqlocked ring per receiver, one writer at a time) never interleave.
// Acknowledgement words are one atomic store each and need no lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "strategy.hpp"
#include "transport/local/segment.hpp"

namespace wsync::local {

// Where a request's chunk lies on the board.
struct ChunkAt {
    uint32_t slot = 0;
    uint64_t seq = 0;
};

class ReceiverEnd {
public:
    // `seg` is attached and `index` claimed on its board (board::attach). `slot_field` is the
    // request's name for the slot ("bucket" for shm, "slot" for cuda_ipc).
    ReceiverEnd(std::shared_ptr<SharedSegment> seg, uint32_t index, const char *slot_field);
    ReceiverEnd(const ReceiverEnd &) = delete;
    ReceiverEnd &operator=(const ReceiverEnd &) = delete;

    SharedSegment &segment() const { return *seg_; }
    const std::shared_ptr<SharedSegment> &segment_ptr() const { return seg_; }
    board::Board *board() const { return seg_->board(); }
    uint32_t index() const { return index_; }
    const char *kind() const;
    // The newest chunk seq given to this receiver (0: none).
    uint64_t last_seq() const { return last_seq_; }

    // The request's slot and seq: WSYNC_ERR_PROTOCOL when absent, out of range, or when the
    // seq does not belong in the slot ((seq - 1) % slots == slot). `what` names the request.
    ChunkAt locate(const json &transport, const std::string &what) const;

    // Takes chunk `at` for reading: refused WSYNC_ERR_MISMATCH when not newer than the last one
    // given here (stale or replayed), when this receiver (re)attached during its version, or
    // when its slot holds another chunk; WSYNC_ERR_ABANDONED when the sender withdrew it
    // (SharedSegment::check_owed). On success the chunks between the last one given and this
    // one are acknowledged as missed (SharedSegment::acknowledge_missed). `commit` (a cuda_ipc
    // commit without data): only the board's check, neither the order check nor missed
    // acknowledgements. `what` names the request in messages ("request", "commit request").
    void take(ChunkAt at, const char *what, bool commit = false);
    // The request for `at` is valid whole and its chunk is handed to the loader: it is the last
    // given (a request refused as malformed after take() is not, so the intact one that
    // follows it with the same seq is still taken).
    void given(ChunkAt at) noexcept;

    // Answers chunk `at` (of `h`) with `status` without loading it: nothing when the slot no
    // longer holds it or this receiver does not owe it; else the failure record first (when
    // `record`), then the chunks never given before it acknowledged as missed, then
    // `before_ack` (cuda_ipc: release mappings at a version's last chunk), then the
    // acknowledgement. Never throws.
    void refuse(const ChunkHeader &h, ChunkAt at, wsync_status_t status, const std::string &message,
                bool record, const std::function<void()> &before_ack = {}) noexcept;
    // A chunk this receiver took and failed after all (its loader's work failed or outlived
    // its deadline): the failure record, then the acknowledgement with `status`. Never throws.
    void fail(const ChunkHeader &h, ChunkAt at, wsync_status_t status, const std::string &why) noexcept;
    // A failure record for the sender to report (version and chunk of `h`). Never throws.
    void record_failure(const ChunkHeader &h, wsync_status_t status, const std::string &message) noexcept;
    // The acknowledgement of chunk `at` with `outcome` (one atomic store). Never throws.
    void acknowledge(ChunkAt at, wsync_status_t outcome) noexcept;

    // "<kind>: this receiver was dropped by the sender" once a sender dropped it (it may then
    // reuse the memory this receiver reads), else empty. Reads made before the call are
    // covered (board::dropped).
    std::string dropped_text() const noexcept;
    // Whether this receiver's acknowledgement word already answers `at` (board::acknowledged).
    bool acknowledged(ChunkAt at) const noexcept;
    // What the board says of this receiver's link (dropped, joining, sender gone).
    Link link() const { return seg_->link(index_); }
    // Marks this receiver detached on the board and wakes senders. Idempotent.
    void detach() noexcept;

    // Held around every failure record (see the thread rules).
    std::mutex &board_mutex() { return board_mu_; }

private:
    std::shared_ptr<SharedSegment> seg_;
    uint32_t index_;
    const char *slot_field_;
    uint64_t last_seq_ = 0;
    bool detached_ = false;
    std::mutex board_mu_;
};

}  // namespace wsync::local
