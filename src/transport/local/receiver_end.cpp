#include "transport/local/receiver_end.hpp"

#include <cinttypes>

#include "error.hpp"
#include "wire.hpp"

namespace wsync::local {

ReceiverEnd::ReceiverEnd(std::shared_ptr<SharedSegment> seg, uint32_t index, const char *slot_field)
    : seg_(std::move(seg)), index_(index), slot_field_(slot_field) {}

const char *ReceiverEnd::kind() const { return seg_->kind(); }

ChunkAt ReceiverEnd::locate(const json &transport, const std::string &what) const {
    ChunkAt at;
    at.slot = static_cast<uint32_t>(wire::uint_field(transport, slot_field_, what, seg_->slots() - 1));
    at.seq = wire::uint_field(transport, "seq", what, UINT64_MAX >> 8);
    if (at.seq == 0 || (at.seq - 1) % seg_->slots() != at.slot)
        wire::malformed(strf("%s: seq %" PRIu64 " does not belong in %s %u", what.c_str(), at.seq,
                             slot_field_, at.slot));
    return at;
}

void ReceiverEnd::take(ChunkAt at, const char *what, bool commit) {
    if (!commit && last_seq_ && at.seq <= last_seq_)
        failf(WSYNC_ERR_MISMATCH,
              "%s: request carries chunk seq %" PRIu64 ", already received seq %" PRIu64
              " (stale or replayed)",
              kind(), at.seq, last_seq_);
    seg_->check_owed(index_, at.slot, at.seq, what);
    // Chunks between the last one given here and this one were never given (lost, or of a
    // version the sender abandoned before delivering them): acknowledged as missed, so the
    // sender does not wait for them.
    if (!commit && at.seq > last_seq_ + 1) seg_->acknowledge_missed(index_, last_seq_, at.seq);
}

void ReceiverEnd::given(ChunkAt at) noexcept {
    if (at.seq > last_seq_) last_seq_ = at.seq;
}

void ReceiverEnd::refuse(const ChunkHeader &h, ChunkAt at, wsync_status_t status,
                         const std::string &message, bool record,
                         const std::function<void()> &before_ack) noexcept {
    try {
        // Only the chunk now in its slot, and only one this receiver owes, is answered.
        if (!seg_->may_answer(index_, at.slot, at.seq)) return;
        if (record) record_failure(h, status, message);
        // After the record, so a sender those acknowledgements release finds it.
        if (at.seq > last_seq_) {
            seg_->acknowledge_missed(index_, last_seq_, at.seq);
            last_seq_ = at.seq;
        }
        if (before_ack) before_ack();
        acknowledge(at, status);
    } catch (...) {
    }
}

void ReceiverEnd::fail(const ChunkHeader &h, ChunkAt at, wsync_status_t status,
                       const std::string &why) noexcept {
    record_failure(h, status, why);
    acknowledge(at, status);
}

void ReceiverEnd::record_failure(const ChunkHeader &h, wsync_status_t status,
                                 const std::string &message) noexcept {
    try {
        std::lock_guard<std::mutex> lk(board_mu_);
        board::record_failure(seg_->board(), index_, status, h.version, h.chunk_index, message);
    } catch (...) {  // std::system_error from the lock: nothing recorded
    }
}

void ReceiverEnd::acknowledge(ChunkAt at, wsync_status_t outcome) noexcept {
    board::acknowledge(seg_->board(), index_, at.slot, at.seq, outcome);
}

std::string ReceiverEnd::dropped_text() const noexcept {
    try {
        if (board::dropped(seg_->board(), index_))
            return std::string(kind()) + ": this receiver was dropped by the sender";
    } catch (...) {
    }
    return {};
}

bool ReceiverEnd::acknowledged(ChunkAt at) const noexcept {
    return board::acknowledged(seg_->board(), index_, at.slot, at.seq);
}

void ReceiverEnd::detach() noexcept {
    if (detached_) return;
    detached_ = true;
    board::detach(seg_->board(), index_);
}

}  // namespace wsync::local
