#include "transport/shm/sender.hpp"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "transport/local/board.hpp"
#include "copy/copy.hpp"
#include "error.hpp"
#include "plan/layout.hpp"
#include "transport/shm/init_info.hpp"

namespace wsync::shm {
namespace {

class ShmSender final : public SenderImpl {
public:
    ShmSender(std::shared_ptr<SharedSegment> seg, bool checksum, int64_t timeout_ms,
              unsigned copy_threads)
        : seg_(std::move(seg)),
          board_(seg_->board(), seg_->lock_fd(), seg_->receivers(), seg_->slots(), kKind),
          checksum_(checksum), timeout_ms_(timeout_ms), pool_(copy_threads) {
        board_.register_sender();
        // A segment has one sender, ever (ShmStrategy refuses a second, and a segment is never
        // handed to another trainer): any other sender claim on its board is a stray write.
        board_.set_sole_sender(true, /*exclusive=*/true);
    }

    ~ShmSender() override { seg_->unlink(); }

    json send(const ChunkHeader &header, const wsync_tensor_t *tensors, TensorTable &table) override {
        for (std::size_t i = 0; i < table.metas.size(); ++i)
            if (!device_is_host(tensors[i].device))
                fail(WSYNC_ERR_UNSUPPORTED,
                     "shm: tensor '" + table.metas[i].name + "' is on " +
                         device_name(tensors[i].device) +
                         "; shm moves host memory (use cuda_ipc or copy it to the CPU)");
        // Tensors that lie in the arena cross in place, at their offset in it: the engines read
        // them where they are. place() lays out the rest in the bucket.
        layout::InPlace in_place;
        json arena_entries = json::array();
        if (seg_->arena()) {
            in_place.assign(table.metas.size(), 0);
            table.offsets.assign(table.metas.size(), 0);
            for (std::size_t i = 0; i < table.metas.size(); ++i) {
                if (const auto off = arena_offset(tensors[i].data, table.metas[i].nbytes)) {
                    in_place[i] = 1;
                    table.offsets[i] = *off;
                    arena_entries.push_back(i);
                }
            }
        }
        layout::place(table, seg_->bucket_bytes(), kKind, in_place);
        maybe_unlink();
        const uint64_t seq = next_seq_;
        const uint32_t b = static_cast<uint32_t>((seq - 1) % seg_->slots());
        // Receivers that (re)attached were admitted by begin_version(), which the core calls
        // before it encodes a version's first chunk: one that attaches after that waits for
        // the next version (so a delta sender knows every newcomer before it encodes).
        // Back-pressure: the bucket's previous chunk must be done with by every receiver.
        board_.wait({b}, sys::Deadline(timeout_ms_), "no free bucket", seq - 1);

        // Pack + checksum, one pass, large tensors on the copy threads (tree hashes, which the
        // engines verify on theirs); arena tensors are only hashed.
        layout::pack_host(seg_->bucket(b), tensors, table, checksum_, in_place, pool_);
        board_.publish(b, seq, header.version, header.chunk_index);  // the bytes are in place
        ++next_seq_;
        used_buckets_ = std::max<uint32_t>(used_buckets_, b + 1);
        json transport{{"segment", seg_->name()}, {"bucket", b}, {"seq", seq}};
        if (!arena_entries.empty()) transport["arena"] = std::move(arena_entries);
        return transport;
    }

    // The version's first chunk will be published as next_seq_ (it only grows on publish).
    bool begin_version(uint64_t) override { return board_.admit_joiners(next_seq_) > 0; }

    std::pair<void *, uint64_t> arena() const override {
        return {seg_->arena(), seg_->arena_bytes()};
    }

    void flush(int64_t timeout_ms) override {
        maybe_unlink();
        std::vector<uint32_t> all;
        for (uint32_t b = 0; b < used_buckets_; ++b) all.push_back(b);
        board_.wait(all, sys::Deadline(timeout_ms), "flush timed out", next_seq_ - 1,
                    /*gather=*/true);
    }

    void abandon(uint64_t version) override { board_.abandon(version); }
    uint64_t applied_ns(uint64_t version) override { return board_.applied_ns(version); }

    void drop_receiver(uint32_t index) override {
        check_receiver_index(kKind, index, seg_->receivers());
        board_.drop(index);
    }

private:
    // The offset in the arena of a tensor of n bytes at p that lies wholly in it, starting on the
    // bucket's tensor alignment (256 bytes; the engines' views keep the same alignment rule
    // whichever region they point into). Anything else is packed into the bucket as usual.
    std::optional<uint64_t> arena_offset(const void *p, uint64_t n) const {
        const auto a = reinterpret_cast<uintptr_t>(seg_->arena());
        const auto t = reinterpret_cast<uintptr_t>(p);
        const uint64_t size = seg_->arena_bytes();
        if (!a || n == 0 || t < a || n > size || t - a > size - n) return std::nullopt;
        if ((t - a) % layout::kTensorAlign != 0) return std::nullopt;
        return uint64_t(t - a);
    }

    // Once every receiver holds its index the name is no longer needed; removing it means
    // nothing is left in /dev/shm even if this process is killed (receivers that attach later
    // get the segment from this process over its rendezvous socket).
    void maybe_unlink() {
        if (!seg_->unlinked()) seg_->unlink_if_complete(UINT32_MAX);
    }

    std::shared_ptr<SharedSegment> seg_;
    board::SenderEnd board_;
    bool checksum_;
    int64_t timeout_ms_;
    copy::Pool pool_;  // "copy_threads": started on the first large tensor
    uint64_t next_seq_ = 1;
    uint32_t used_buckets_ = 0;
};

}  // namespace

std::unique_ptr<SenderImpl> make_sender(std::shared_ptr<SharedSegment> seg, bool checksum,
                                        int64_t timeout_ms, unsigned copy_threads) {
    return std::make_unique<ShmSender>(std::move(seg), checksum, timeout_ms, copy_threads);
}

}  // namespace wsync::shm
