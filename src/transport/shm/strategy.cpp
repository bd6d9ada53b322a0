// shm: host memory through one POSIX shared-memory segment (the CPU twin of packed CUDA IPC).
//
// The trainer's strategy creates the segment when it makes the init info: a control block,
// `buckets` data buckets of `bucket_bytes` each and, with "arena_bytes", the sender's arena (the
// trainer keeps tensors there, which are then sent in place: docs/data-path.md), reserved with
// posix_fallocate (so a full /dev/shm is an error now, not a SIGBUS later) and pre-faulted. The
// sender packs chunk number `seq` (1, 2, ...) into bucket (seq - 1) % buckets after every
// receiver has acknowledged the bucket's previous chunk (a tensor in the arena is hashed, if
// checksums are on, not copied), then publishes seq in the bucket's slot (release) and returns
// the request. Receivers map the segment once (data read-only), check the request against the slot
// (acquire) and yield views straight into the bucket. Ending an iteration stores
// (seq << 8 | status) in the receiver's ack word for that bucket and wakes the sender through a
// futex; that protocol, with the liveness checks that tell a dead receiver from a slow one, is the
// acknowledgement board (board.cpp) at the head of the segment (segment.hpp). See
// docs/architecture.md and docs/failure-model.md.
//
// Files: init_info (the init-info body, the segment geometry), sender, receiver, and this one
// (options, the strategy, kShmKind).
#include <memory>
#include <sys/stat.h>

#include "transport/local/board.hpp"
#include "error.hpp"
#include "plan/layout.hpp"
#include "strategy.hpp"
#include "transport/shm/init_info.hpp"
#include "transport/shm/receiver.hpp"
#include "transport/shm/sender.hpp"

namespace wsync {
namespace shm {
namespace {

const std::vector<OptionSpec> &shm_options() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        option::receivers(board::kMaxReceivers,
                          "number of receivers (engines) that must acknowledge every chunk"),
        {"buckets", T::UInt, 2, 1, board::kMaxSlots, "sender",
         "buckets in the segment; 2 or more let packing overlap with receivers' loading"},
        {"bucket_bytes", T::UInt, uint64_t(256) << 20, layout::kPageBytes, uint64_t(1) << 40, "sender",
         "bytes per bucket (rounded up to 4096); the largest chunk must fit in one bucket"},
        {"arena_bytes", T::UInt, 0, 0, kMaxArenaBytes, "sender",
         "bytes of host memory in the segment for the trainer's own tensors (rounded up to "
         "4096; 0: none): wsync_sender_arena() hands it out, and a tensor that lies in it is "
         "sent in place, read by the engines straight from it, not packed into a bucket"},
        option::checksum(),
        option::verify(),
        option::copy_threads(),
        option::timeout_ms(0, "both",
                           "sender: how long send_chunk waits for a free bucket before failing; receiver: how long "
                           "wsync_receiver_create waits for the trainer's rendezvous socket when "
                           "the segment's name is gone (a restarted engine)"),
    };
    return specs;
}

class ShmStrategy final : public StrategyImpl {
public:
    explicit ShmStrategy(const Options &o)
        : receivers_(static_cast<uint32_t>(o.uint("receivers"))),
          buckets_(static_cast<uint32_t>(o.uint("buckets"))),
          bucket_bytes_(layout::round_up(o.uint("bucket_bytes"), layout::kPageBytes)),
          arena_bytes_(layout::round_up(o.uint("arena_bytes"), layout::kPageBytes)),
          checksum_(o.boolean("checksum")), verify_(o.boolean("verify")),
          copy_threads_(static_cast<unsigned>(o.uint("copy_threads"))),
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))) {}

    json create_init_info() override {
        seg_ = SharedSegment::create(
            segment_geometry(receivers_, buckets_, bucket_bytes_, arena_bytes_));
        json body{{"segment", seg_->name()},   {"rendezvous", seg_->rendezvous()},
                  {"receivers", receivers_},   {"buckets", buckets_},
                  {"bucket_bytes", bucket_bytes_}, {"checksum", checksum_}};
        // Only with an arena, so a segment without one keeps the blob (and layout 3) of 0.4.
        if (arena_bytes_) body["arena_bytes"] = arena_bytes_;
        return body;
    }

    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init_info(body);
        if (!seg_)
            fail(WSYNC_ERR_WRONG_STATE, "shm: a sender must be made by the strategy that created "
                                        "the init info (this one has not created any)");
        if (info.segment != seg_->name())
            fail(WSYNC_ERR_MISMATCH, "shm: init info names segment '" + info.segment +
                                         "' but this strategy created '" + seg_->name() + "'");
        if (seg_->sender_made)
            fail(WSYNC_ERR_WRONG_STATE, "shm: segment '" + seg_->name() + "' already has a sender");
        seg_->sender_made = true;
        return make_sender(seg_, info.checksum, timeout_ms_, copy_threads_);
    }

    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init_info(body);
        check_receiver_index("shm", index, info.receivers);
        auto seg = SharedSegment::attach(
            info.segment, info.rendezvous,
            segment_geometry(info.receivers, info.buckets, info.bucket_bytes, info.arena_bytes),
            timeout_ms_);
        try {
            board::attach(seg->board(), seg->lock_fd(), index, "shm");
        } catch (const Error &e) {
            // shm's one sender is gone for good (a strategy makes one sender): its name goes too,
            // so a trainer killed before every engine attached leaves nothing in /dev/shm.
            if (e.status() == WSYNC_ERR_UNAVAILABLE) seg->unlink();
            throw;
        }
        // The last receiver to attach removes the name: a trainer killed from now on leaves
        // nothing in /dev/shm.
        seg->unlink_if_complete(index);
        return make_receiver(std::move(seg), index, verify_, info.checksum, copy_threads_);
    }

private:
    uint32_t receivers_, buckets_;
    uint64_t bucket_bytes_, arena_bytes_;
    bool checksum_, verify_;
    unsigned copy_threads_;
    int64_t timeout_ms_;
    std::shared_ptr<SharedSegment> seg_;
};

std::string shm_unavailable(const Options *) {
    // /dev/shm is where glibc's shm_open puts segments; without it nothing here can work.
    struct stat st;
    if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode)) return "/dev/shm is not mounted";
    return "";
}

std::unique_ptr<StrategyImpl> shm_create(const Options &o) {
    return std::make_unique<ShmStrategy>(o);
}

}  // namespace
}  // namespace shm

const KindInfo kShmKind = {"shm", shm::shm_options, shm::shm_unavailable, shm::shm_create,
                           nullptr, nullptr, /*delta_sync=*/true, /*experimental=*/false,
                           /*delta_on_device=*/false, {/*tensor_memory=*/"host"}};

}  // namespace wsync
