#include "transport/shm/receiver.hpp"

#include <cinttypes>
#include <string>
#include <vector>

#include "transport/local/receiver_end.hpp"
#include "error.hpp"
#include "plan/layout.hpp"
#include "wire.hpp"

namespace wsync::shm {
namespace {

class ShmBacking final : public ChunkBacking {
public:
    ShmBacking(std::shared_ptr<local::ReceiverEnd> end, local::ChunkAt at,
               const std::vector<uint64_t> &offsets, layout::InPlace in_arena)
        : end_(std::move(end)), at_(at), offsets_(offsets), in_arena_(std::move(in_arena)) {}

    const void *data(std::size_t i) const override {
        const SharedSegment &seg = end_->segment();
        const bool arena = !in_arena_.empty() && in_arena_[i];
        return (arena ? seg.arena() : seg.bucket(at_.slot)) + offsets_[i];
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CPU, 0}; }
    bool read_only() const override { return true; }

    void report_apply(uint64_t ns) noexcept override {
        board::report_apply(end_->board(), at_.slot, at_.seq, ns);
    }

    void acknowledge(wsync_status_t outcome) noexcept override {
        answered_ = true;
        end_->acknowledge(at_, outcome);
    }

    // A dropped receiver is not waited for: the sender may pack later chunks into this bucket
    // (and change arena tensors) under it. Nor is one whose acknowledgement another process
    // wrote before it answered (a stray or forged write to its word on the board: hostile-peer
    // trial, where a healthy engine's views then showed the next version and its end said OK).
    std::string revoked() const noexcept override {
        std::string dropped = end_->dropped_text();
        if (!dropped.empty()) return dropped;
        if (!answered_ && end_->acknowledged(at_))
            return "shm: another process wrote this receiver's acknowledgement of chunk seq " +
                   std::to_string(at_.seq) + " on the board (not this receiver)";
        return {};
    }

    bool maps_read_only(const void *dst, uint64_t len) const noexcept override {
        return end_->segment().data_overlaps(dst, len);
    }

private:
    std::shared_ptr<local::ReceiverEnd> end_;
    local::ChunkAt at_;
    std::vector<uint64_t> offsets_;
    layout::InPlace in_arena_;  // entries the sender left in its arena (offsets_ are the arena's)
    bool answered_ = false;     // acknowledge() ran: the word is this receiver's own answer
};

class ShmReceiver final : public ReceiverImpl {
public:
    ShmReceiver(std::shared_ptr<SharedSegment> seg, uint32_t index, bool verify, bool promised,
                unsigned copy_threads)
        : end_(std::make_shared<local::ReceiverEnd>(std::move(seg), index, "bucket")),
          verify_(verify), promised_(promised), copy_threads_(copy_threads) {}

    ~ShmReceiver() override { end_->detach(); }

    bool verify_checksums() const override { return verify_; }
    bool checksums_promised() const override { return promised_; }
    unsigned copy_threads() const override { return copy_threads_; }

    Link link() const override { return end_->link(); }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "shm request";
        const local::ChunkAt at = where(transport);
        end_->take(at, "request");
        layout::InPlace in_arena = arena_entries(transport, table);
        layout::check(table, end_->segment().bucket_bytes(), w, "bucket", in_arena);
        end_->given(at);
        return std::make_unique<ShmBacking>(end_, at, table.offsets, std::move(in_arena));
    }

    void refuse(const ChunkHeader &h, const json &transport, wsync_status_t status,
                const std::string &message, bool record) noexcept override {
        try {
            end_->refuse(h, where(transport), status, message, record);
        } catch (...) {
        }
    }

    void record_failure(const ChunkHeader &h, wsync_status_t status,
                        const std::string &message) noexcept override {
        end_->record_failure(h, status, message);
    }

    void check_addressed(const json &transport) const override {
        const std::string &segment = wire::string_field(transport, "segment", "shm request", 255);
        const std::string &mine = end_->segment().name();
        if (segment != mine)
            failf(WSYNC_ERR_MISMATCH, "shm: request is for segment '%s', this receiver is "
                                      "attached to '%s' (another trainer's, or a restarted "
                                      "one's: left unchanged)",
                  segment.c_str(), mine.c_str());
    }

private:
    local::ChunkAt where(const json &transport) const {
        check_addressed(transport);
        return end_->locate(transport, "shm request");
    }

    // The request's optional "arena": strictly increasing entry indices whose offsets are in the
    // sender's arena, each entry kTensorAlign-aligned and inside it. An empty mask when absent.
    layout::InPlace arena_entries(const json &transport, const TensorTable &table) const {
        const std::string w = "shm request";
        if (!transport.contains("arena")) return {};
        const std::size_t n = table.metas.size();
        const json::array_t &list = wire::array_field(transport, "arena", w, n);
        if (!end_->segment().arena())
            wire::malformed(w + ": it names tensors in the sender's arena, and segment '" +
                            end_->segment().name() + "' has none");
        layout::InPlace in_arena(n, 0);
        uint64_t next = 0;  // the smallest index the next element may take
        for (const json &v : list) {
            const uint64_t i = wire::as_uint(v, w + " arena", n ? n - 1 : 0);
            if (n == 0 || i < next)
                wire::malformed(w + ": arena entries are not strictly increasing tensor indices");
            next = i + 1;
            in_arena[i] = 1;
            layout::check_entry(table, i, end_->segment().arena_bytes(), w, "arena");
        }
        return in_arena;
    }

    std::shared_ptr<local::ReceiverEnd> end_;
    bool verify_, promised_;
    unsigned copy_threads_;
};

}  // namespace

std::unique_ptr<ReceiverImpl> make_receiver(std::shared_ptr<SharedSegment> seg, uint32_t index,
                                            bool verify, bool checksums_promised,
                                            unsigned copy_threads) {
    return std::make_unique<ShmReceiver>(std::move(seg), index, verify, checksums_promised,
                                         copy_threads);
}

}  // namespace wsync::shm
