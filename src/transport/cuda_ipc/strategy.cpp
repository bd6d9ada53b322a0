// cuda_ipc: GPU memory shared between processes on one machine through CUDA IPC handles, for
// trainers and engines colocated on the same GPUs.
//
// Two modes (option "packed"):
// - packed=true: each sender owns `buckets` device buckets on its GPU. A chunk is gathered into
//   bucket (seq - 1) % buckets with one kernel launch (optionally casting float32 to bfloat16 or
//   float16); each bucket's IPC handle is made once and reused for every chunk. The request's
//   part for that GPU carries (handle, bucket size); the core's tensor table carries offsets.
// - packed=false: nothing is copied. Each tensor is named by (allocation handle, offset): the
//   allocation's base comes from cuMemGetAddressRange, its handle from cuIpcGetMemHandle, cached
//   per allocation by the driver's never-reused buffer id. Receivers cache opened handles by
//   their bytes, so a steady-state sync whose trainer tensors have not moved opens nothing.
//
// Several senders (one per trainer GPU) each produce a partial request for the same chunk;
// wsync_request_merge concatenates their parts, refusing a UUID twice. A receiver takes the one
// part whose GPU UUID is its own device's: none or two is an error naming the UUID.
//
// Ordering: a sender finishes its work on the GPU (the work queued on the legacy default
// stream, then the pack, each waited for through an event polled against the deadline) before
// it returns the request, so a request never describes bytes still in flight. A receiver waits
// the same way for its legacy default stream before acknowledging, so the loader's copies out
// of the views are complete before the sender may reuse the bucket or the trainer may write its
// tensors. Never cuCtxSynchronize: it waits for the whole context (training collectives,
// inference streams) with no deadline. What the settle decides is the chunk's outcome on both
// sides: the engine's wsync_recv_end and the trainer's flush report the same failure.
//
// Lifetimes: "Calling cuMemFree on an exported memory region before calling
// cuIpcCloseMemHandle in the importing context will result in undefined behavior" (CUDA Driver
// API, cuIpcOpenMemHandle; cuda.h of CUDA 13.0). So each receiver closes the handles a version
// it ends no longer uses and then writes "released through version v" on the board; a trainer
// frees moved memory after wsync_sender_wait_released, and a sender's destroy waits (bounded)
// for receivers to unmap its buckets before it frees them, and leaks them to the driver
// otherwise. Acknowledgements travel through the acknowledgement board (board.cpp) in a small
// shared-memory segment named in the init info; the GPU bytes never touch host memory.
//
// The files of this folder: init_info (the init-info body), segment (the shared board
// segment), request (the request's handle codec and the senders' merge), sender, handle_cache
// and receiver, and this one, which ties them into the kind (options, strategy, registration).
#include <memory>

#include "error.hpp"
#include "gpu/api.hpp"
#include "gpu/pack.hpp"
#include "transport/local/segment.hpp"
#include "strategy.hpp"
#include "transport/cuda_ipc/init_info.hpp"
#include "transport/cuda_ipc/receiver.hpp"
#include "transport/cuda_ipc/request.hpp"
#include "transport/cuda_ipc/sender.hpp"

namespace wsync {
namespace cuda_ipc {
namespace {

// The board segment every sender and receiver of one sync maps: the board alone (the GPU bytes
// never touch it), with the sender count, so its name goes once every sender has attached.
// Layout 3: the head shared with shm (segment.hpp).
SegmentGeometry segment_geometry(uint32_t senders, uint32_t receivers, uint32_t slots) {
    return SegmentGeometry{kKind, "wsync-ipc-", {'W', 'S', 'Y', 'N', 'C', 'I', 'P', 'C'}, 3,
                           senders, receivers, slots, 0};
}

const std::vector<OptionSpec> &option_specs() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        option::receivers(board::kMaxReceivers,
                          "number of receivers (engines) that must acknowledge every chunk"),
        {"senders", T::UInt, 1, 1, board::kMaxReceivers, "sender",
         "number of senders (trainer processes, one per GPU) whose partial requests are merged "
         "with wsync_request_merge for every chunk"},
        {"packed", T::Bool, 1, 0, 1, "sender",
         "true: pack each chunk into a reusable device bucket, one handle per GPU; false: share "
         "the trainer's own allocations (no copy; tensors must stay untouched until flush)"},
        {"buckets", T::UInt, 2, 1, board::kMaxSlots, "sender",
         "device buckets per sender (packed=true); 2 or more let packing overlap with loading"},
        gpu::bucket_bytes_option("bytes per device bucket (packed=true); the largest chunk must fit"),
        gpu::cast_option("cast float32 tensors while packing: \"bfloat16\" or \"float16\" "
                         "(packed=true only); \"\" sends every dtype as it is"),
        option::device("receiver", "the receiver's GPU as an ordinal in its process (after "
                                   "CUDA_VISIBLE_DEVICES); it takes the part of each request "
                                   "whose UUID is this GPU's"),
        option::synchronize(
         "sender: wait for work queued on the legacy default stream (PyTorch's default stream), "
         "or the stream named with wsync_sender_set_stream, before reading tensors (work on "
         "other streams the caller synchronises); receiver: the same for the loader's stream "
         "(wsync_receiver_set_stream) before acknowledging, so its copies out of views are done"),
        option::timeout_ms(0, "both",
                           "sender: how long send_chunk waits for a free bucket, for work queued "
                           "on the legacy default stream and for its pack; receiver: how long "
                           "wsync_recv_end waits for the loader's work queued on the legacy "
                           "default stream"),
        {"release_timeout_ms", T::UInt, 10000, 0, uint64_t(1) << 40, "sender",
         "how long wsync_sender_destroy waits for receivers to unmap this sender's buckets "
         "(packed=true); buckets still mapped then stay allocated until the process exits"},
    };
    return specs;
}

// ---------------------------------------------------------------------------------------------
class IpcStrategy final : public StrategyImpl {
public:
    explicit IpcStrategy(const Options &o)
        : api_(gpu::cuda()), senders_(static_cast<uint32_t>(o.uint("senders"))),
          receivers_(static_cast<uint32_t>(o.uint("receivers"))),
          buckets_(static_cast<uint32_t>(o.uint("buckets"))),
          bucket_bytes_((o.uint("bucket_bytes") + 4095) / 4096 * 4096),
          packed_(o.boolean("packed")), dtype_(o.text("dtype")),
          device_(static_cast<int>(o.uint("device"))), synchronize_(o.boolean("synchronize")),
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))),
          release_timeout_ms_(static_cast<int64_t>(o.uint("release_timeout_ms"))) {
        if (!packed_ && !dtype_.empty())
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 "cuda_ipc: option 'dtype' needs packed=true (a cast needs a buffer to cast into)");
        const std::string &delta = o.text("delta");
        if (delta != "off" && !packed_)
            fail(WSYNC_ERR_UNSUPPORTED,
                 "cuda_ipc: option 'delta' is \"" + delta + "\", which needs packed=true (patches "
                 "are made in the sender's own device memory and travel in its buckets; with "
                 "packed=false receivers would map memory the sender regrows and frees)");
        if (delta != "off" && senders_ > 1)
            fail(WSYNC_ERR_UNSUPPORTED,
                 "cuda_ipc: option 'delta' is \"" + delta + "\" with " + std::to_string(senders_) +
                     " senders: each sender's patches differ (what changed on its GPU), while a "
                     "merged request carries one tensor table for all; use senders=1 per engine "
                     "group, or delta \"off\"");
        gpu::refuse_cast_with_delta(kKind, o);
    }

    json create_init_info() override {
        InitInfo info{};
        info.packed = packed_;
        info.buckets = buckets_;
        seg_ = SharedSegment::create(segment_geometry(senders_, receivers_, info.slots()));
        return json{{"segment", seg_->name()}, {"rendezvous", seg_->rendezvous()},
                    {"host", host_boot_id()}, {"senders", senders_},
                    {"receivers", receivers_}, {"buckets", buckets_},
                    {"bucket_bytes", bucket_bytes_}, {"packed", packed_}, {"dtype", dtype_}};
    }

    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init_info(body);
        auto seg = seg_ && seg_->name() == info.segment
                       ? seg_
                       : SharedSegment::attach(info.segment, info.rendezvous,
                                               segment_geometry(info.senders, info.receivers,
                                                                info.slots()),
                                               timeout_ms_);
        return make_sender(api_, std::move(seg), info, synchronize_, timeout_ms_,
                           release_timeout_ms_);
    }

    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init_info(body);
        check_receiver_index(kKind, index, info.receivers);
        auto seg = SharedSegment::attach(
            info.segment, info.rendezvous,
            segment_geometry(info.senders, info.receivers, info.slots()), timeout_ms_);
        return make_receiver(api_, std::move(seg), info, index, device_, synchronize_,
                             timeout_ms_);
    }

private:
    const gpu::CudaApi &api_;
    uint32_t senders_, receivers_, buckets_;
    uint64_t bucket_bytes_;
    bool packed_;
    std::string dtype_;
    int device_;
    bool synchronize_;
    int64_t timeout_ms_, release_timeout_ms_;
    std::shared_ptr<SharedSegment> seg_;
};

std::unique_ptr<StrategyImpl> create_strategy(const Options &o) { return std::make_unique<IpcStrategy>(o); }
std::string unavailable_reason(const Options *) { return gpu::cuda_unavailable_reason(); }

}  // namespace
}  // namespace cuda_ipc

const KindInfo kCudaIpcKind = {cuda_ipc::kKind,          cuda_ipc::option_specs,
                               cuda_ipc::unavailable_reason, cuda_ipc::create_strategy,
                               cuda_ipc::merge_requests, gpu::cuda_runtime_text,
                               /*delta_sync=*/true,       /*experimental=*/false,
                               /*delta_on_device=*/true,     {/*tensor_memory=*/"cuda"}};

}  // namespace wsync
