#include "transport/shm/receiver.hpp"

#include <cinttypes>
#include <string>
#include <vector>

#include "board.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "wire.hpp"

namespace wsync::shm {
namespace {

class ShmBacking final : public ChunkBacking {
public:
    ShmBacking(std::shared_ptr<SharedSegment> seg, uint32_t index, uint32_t bucket, uint64_t seq,
               const std::vector<uint64_t> &offsets, layout::InPlace in_arena)
        : seg_(std::move(seg)), index_(index), bucket_(bucket), seq_(seq), offsets_(offsets),
          in_arena_(std::move(in_arena)) {}

    const void *data(std::size_t i) const override {
        const bool arena = !in_arena_.empty() && in_arena_[i];
        return (arena ? seg_->arena() : seg_->bucket(bucket_)) + offsets_[i];
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CPU, 0}; }
    bool read_only() const override { return true; }

    void acknowledge(wsync_status_t outcome) noexcept override {
        answered_ = true;
        board::acknowledge(seg_->board(), index_, bucket_, seq_, outcome);
    }

    // A dropped receiver is not waited for: the sender may pack later chunks into this bucket
    // (and change arena tensors) under it. Nor is one whose acknowledgement another process
    // wrote before it answered (a stray or forged write to its word on the board: hostile-peer
    // trial, where a healthy engine's views then showed the next version and its end said OK).
    std::string revoked() const noexcept override {
        if (board::dropped(seg_->board(), index_)) return "shm: this receiver was dropped by the sender";
        if (!answered_ && board::acknowledged(seg_->board(), index_, bucket_, seq_))
            return "shm: another process wrote this receiver's acknowledgement of chunk seq " +
                   std::to_string(seq_) + " on the board (not this receiver)";
        return {};
    }

    bool maps_read_only(const void *dst, uint64_t len) const noexcept override {
        return seg_->data_overlaps(dst, len);
    }

private:
    std::shared_ptr<SharedSegment> seg_;
    uint32_t index_, bucket_;
    uint64_t seq_;
    std::vector<uint64_t> offsets_;
    layout::InPlace in_arena_;  // entries the sender left in its arena (offsets_ are the arena's)
    bool answered_ = false;     // acknowledge() ran: the word is this receiver's own answer
};

class ShmReceiver final : public ReceiverImpl {
public:
    ShmReceiver(std::shared_ptr<SharedSegment> seg, uint32_t index, bool verify, bool promised,
                unsigned copy_threads)
        : seg_(std::move(seg)), index_(index), verify_(verify), promised_(promised),
          copy_threads_(copy_threads) {}

    ~ShmReceiver() override { board::detach(seg_->board(), index_); }

    bool verify_checksums() const override { return verify_; }
    bool checksums_promised() const override { return promised_; }
    unsigned copy_threads() const override { return copy_threads_; }

    Link link() const override { return seg_->link(index_); }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "shm request";
        Where at = where(transport);
        if (last_seq_ && at.seq <= last_seq_)
            failf(WSYNC_ERR_MISMATCH,
                  "shm: request carries chunk seq %" PRIu64 ", already received seq %" PRIu64,
                  at.seq, last_seq_);
        seg_->check_owed(index_, at.bucket, at.seq, "request");
        seg_->acknowledge_missed(index_, last_seq_, at.seq);
        layout::InPlace in_arena = arena_entries(transport, table);
        layout::check(table, seg_->bucket_bytes(), w, "bucket", in_arena);
        last_seq_ = at.seq;
        return std::make_unique<ShmBacking>(seg_, index_, at.bucket, at.seq, table.offsets,
                                            std::move(in_arena));
    }

    void refuse(const ChunkHeader &h, const json &transport, wsync_status_t status,
                const std::string &message, bool record) noexcept override {
        try {
            Where at = where(transport);
            // Only the chunk now in its bucket, and only one this receiver owes, is answered.
            if (!seg_->may_answer(index_, at.bucket, at.seq)) return;
            if (record)
                board::record_failure(seg_->board(), index_, status, h.version, h.chunk_index,
                                      message);
            // After the record, so a sender those acknowledgements release finds it.
            if (at.seq > last_seq_) {
                seg_->acknowledge_missed(index_, last_seq_, at.seq);
                last_seq_ = at.seq;
            }
            board::acknowledge(seg_->board(), index_, at.bucket, at.seq, status);
        } catch (...) {
        }
    }

    void record_failure(const ChunkHeader &h, wsync_status_t status,
                        const std::string &message) noexcept override {
        board::record_failure(seg_->board(), index_, status, h.version, h.chunk_index, message);
    }

    void check_addressed(const json &transport) const override {
        const std::string &segment = wire::string_field(transport, "segment", "shm request", 255);
        if (segment != seg_->name())
            failf(WSYNC_ERR_MISMATCH, "shm: request is for segment '%s', this receiver is "
                                      "attached to '%s' (another trainer's, or a restarted "
                                      "one's: left unchanged)",
                  segment.c_str(), seg_->name().c_str());
    }

private:
    struct Where {
        uint32_t bucket;
        uint64_t seq;
    };
    Where where(const json &transport) const {
        const std::string w = "shm request";
        check_addressed(transport);
        Where at;
        at.bucket =
            static_cast<uint32_t>(wire::uint_field(transport, "bucket", w, seg_->slots() - 1));
        at.seq = wire::uint_field(transport, "seq", w, UINT64_MAX >> 8);
        if (at.seq == 0 || (at.seq - 1) % seg_->slots() != at.bucket)
            wire::malformed(strf("shm request: seq %" PRIu64 " does not belong in bucket %u",
                                 at.seq, at.bucket));
        return at;
    }

    // The request's optional "arena": strictly increasing entry indices whose offsets are in the
    // sender's arena, each entry kTensorAlign-aligned and inside it. An empty mask when absent.
    layout::InPlace arena_entries(const json &transport, const TensorTable &table) const {
        const std::string w = "shm request";
        if (!transport.contains("arena")) return {};
        const std::size_t n = table.metas.size();
        const json::array_t &list = wire::array_field(transport, "arena", w, n);
        if (!seg_->arena())
            wire::malformed(w + ": it names tensors in the sender's arena, and segment '" +
                            seg_->name() + "' has none");
        layout::InPlace in_arena(n, 0);
        uint64_t next = 0;  // the smallest index the next element may take
        for (const json &v : list) {
            const uint64_t i = wire::as_uint(v, w + " arena", n ? n - 1 : 0);
            if (n == 0 || i < next)
                wire::malformed(w + ": arena entries are not strictly increasing tensor indices");
            next = i + 1;
            in_arena[i] = 1;
            layout::check_entry(table, i, seg_->arena_bytes(), w, "arena");
        }
        return in_arena;
    }

    std::shared_ptr<SharedSegment> seg_;
    uint32_t index_;
    bool verify_, promised_;
    unsigned copy_threads_;
    uint64_t last_seq_ = 0;
};

}  // namespace

std::unique_ptr<ReceiverImpl> make_receiver(std::shared_ptr<SharedSegment> seg, uint32_t index,
                                            bool verify, bool checksums_promised,
                                            unsigned copy_threads) {
    return std::make_unique<ShmReceiver>(std::move(seg), index, verify, checksums_promised,
                                         copy_threads);
}

}  // namespace wsync::shm
