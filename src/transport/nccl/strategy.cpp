// nccl_broadcast: the trainer's rank 0 broadcasts packed buckets to every receiver over a
// dedicated NCCL communicator (the model-update group), for engines on any GPUs or nodes.
//
// create_init_info makes the NCCL unique id; it travels inside the init-info blob, never through
// a side channel. The group has 1 + receivers ranks: the sender is rank 0, receiver i is rank
// i + 1. Communicators are created non-blocking (ncclCommInitRankConfig with blocking = 0) and
// polled with ncclCommGetAsyncError until a deadline; on timeout or error the communicator is
// aborted (ncclCommAbort) and the call fails with WSYNC_ERR_TIMEOUT or WSYNC_ERR_PEER, so a
// missing rank never hangs anyone.
//
// The sender keeps two device buckets. Chunk k is packed (one kernel, optional cast) into
// bucket k % 2 on a pack stream; send_chunk waits (deadline) until that pack has read the
// caller's tensors, which wsync.h lets the caller change once the call returns, then queues the
// broadcast from the bucket on a communication stream and returns, so the broadcast of chunk k
// overlaps the caller's work and the pack of chunk k + 1. Before reusing a bucket the sender
// waits, with the deadline, for that bucket's previous broadcast. A receiver posts its side of
// the broadcast when the loader asks for the chunk and waits for it (deadline) before yielding
// views into its own bucket. NCCL has no back channel, so each receiver reports to the sender
// over the control channel (control.hpp: joined, acknowledged, failed; authenticated with a
// key only the init info holds), and flush waits for those reports (ledger.hpp), naming the
// receiver that failed, died or never joined.
//
// Every wait is bounded: no cuCtxSynchronize, no blocking NCCL call. Events on our own streams
// are polled with cuEventQuery, the communicator's state with ncclCommGetAsyncError, both
// against the deadline, and the communicator is aborted when a deadline passes. A call that
// returns ncclInProgress is polled until NCCL has enqueued it before anything is recorded after
// it (Comm::broadcast), and teardown is ncclCommFinalize polled against "timeout_ms", then
// ncclCommDestroy, or ncclCommAbort at the deadline (Comm::close).
//
// NCCL refuses two ranks of one communicator on one GPU ("invalid usage", reported by the
// asynchronous init on both ranks, after the bootstrap). The init info names the sender's GPU
// ("sender_gpu"), so a receiver on that GPU (an engine colocated with the trainer) is refused
// at creation, before it joins, with WSYNC_ERR_UNSUPPORTED naming both and "cuda_ipc" (the
// kind for engines on the trainer's GPU); the sender then times out at its deadline. Two
// receivers on one GPU cannot be seen before the init; its "invalid usage" names that cause.
//
// The files of this folder: init_info (the init-info body), comm (the communicator: creation,
// bounded waits, broadcast, teardown), control (the control channel's socket and frames),
// ledger (the sender's view of its receivers' reports), sender, receiver, and this one, which ties them into the
// kind (options, strategy, registration).
#include <cstring>
#include <memory>

#include "error.hpp"
#include "gpu/api.hpp"
#include "gpu/pack.hpp"
#include "gpu/device.hpp"
#include "strategy.hpp"
#include "transport/nccl/init_info.hpp"
#include "transport/nccl/receiver.hpp"
#include "transport/nccl/sender.hpp"

namespace wsync {
namespace nccl {
namespace {

// The UUID of the GPU with `ordinal` in this process, read without making a context (the init
// info names the sender's GPU before the sender exists; a refused receiver makes none).
// WSYNC_ERR_INVALID_ARGUMENT for an ordinal this process does not see, as gpu::Device.
gpu::CUuuid gpu_uuid(const gpu::CudaApi &api, int ordinal) {
    int count = 0;
    WSYNC_CU(api, cuDeviceGetCount(&count), std::string(kKind) + ": cuDeviceGetCount");
    if (ordinal < 0 || ordinal >= count)
        fail(WSYNC_ERR_INVALID_ARGUMENT,
             std::string(kKind) + ": device " + std::to_string(ordinal) +
                 " does not exist: this process sees " + std::to_string(count) +
                 " GPU(s) (after CUDA_VISIBLE_DEVICES)");
    gpu::CUdevice dev = 0;
    WSYNC_CU(api, cuDeviceGet(&dev, ordinal), std::string(kKind) + ": cuDeviceGet");
    gpu::CUuuid uuid{};
    WSYNC_CU(api, cuDeviceGetUuid(&uuid, dev), std::string(kKind) + ": cuDeviceGetUuid");
    return uuid;
}

bool same_gpu(const gpu::CUuuid &a, const gpu::CUuuid &b) {
    return std::memcmp(a.bytes, b.bytes, sizeof a.bytes) == 0;
}

const std::vector<OptionSpec> &option_specs() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        option::receivers(kMaxReceivers, "number of receivers; the group has 1 + receivers ranks"),
        gpu::bucket_bytes_option("bytes per device bucket (the sender has two, each receiver one "
                                 "of the size the init info carries); the largest chunk must fit"),
        gpu::cast_option("cast float32 tensors while packing: \"bfloat16\" or \"float16\"; \"\" "
                         "sends every dtype as it is"),
        option::device("both", "this process's GPU for the communicator, as an ordinal after "
                               "CUDA_VISIBLE_DEVICES; the sender's tensors must be on it"),
        option::synchronize(
         "sender: order each pack after the work queued on the legacy default stream (PyTorch's "
         "default stream) or the stream named with wsync_sender_set_stream (work on other "
         "streams the caller synchronises); receiver: the next chunk overwrites its bucket only "
         "after the work queued on the loader's stream (likewise, wsync_receiver_set_stream) "
         "before recv_end (the copies out of views) is done"),
        option::timeout_ms(1, "both",
                           "deadline for communicator creation, for a free bucket, for each pack "
                           "and received chunk, and for finalizing the communicator when the "
                           "sender or receiver is destroyed"),
        {"control_interface", T::String, 0, 0, 0, "sender",
         "network interface (e.g. \"eth0\", \"lo\" when every rank is on this host) whose IPv4 address "
         "the trainer listens on for its receivers' reports (the control channel: outcomes, "
         "failures, stalls); \"\": every address of this host but loopback (receivers try each)",
         ""},
        {"nccl_library", T::String, 0, 0, 0, "both",
         "path of libnccl.so.2 to use (e.g. the one PyTorch ships); else $WSYNC_NCCL_LIBRARY, "
         "else the system's libnccl.so.2",
         ""},
    };
    return specs;
}

class NcclStrategy final : public StrategyImpl {
public:
    explicit NcclStrategy(const Options &o)
        : cuda_(gpu::cuda()), nccl_(gpu::nccl(o.text("nccl_library"))),
          receivers_(static_cast<uint32_t>(o.uint("receivers"))),
          bucket_bytes_((o.uint("bucket_bytes") + 4095) / 4096 * 4096), dtype_(o.text("dtype")),
          device_(static_cast<int>(o.uint("device"))), synchronize_(o.boolean("synchronize")),
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))), interface_(o.text("control_interface")) {
        gpu::refuse_cast_with_delta(kKind, o);
    }

    json create_init_info() override {
        gpu::ncclUniqueId id;
        gpu::ncclResult_t rc = nccl_.ncclGetUniqueId(&id);
        if (rc != gpu::ncclSuccess) gpu::nccl_fail(nccl_, rc, std::string(kKind) + ": ncclGetUniqueId");
        const gpu::CUuuid gpu = gpu_uuid(cuda_, device_);  // the sender's, checked there
        listener_ = std::make_unique<Listener>(interface_);  // the sender made from this init info takes it
        const ControlAddress &at = listener_->address();
        const json key = json::binary(std::vector<uint8_t>(at.key.begin(), at.key.end()));
        return json{{"control", {{"port", at.port}, {"hosts", at.hosts}, {"key", key}}},{"unique_id", json::binary(std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal))},
                    {"nranks", receivers_ + 1}, {"bucket_bytes", bucket_bytes_}, {"dtype", dtype_},
                    {"nccl_version", nccl_.version}, {"sender_gpu", gpu::uuid_text(gpu)}};
    }

    // The init info's "sender_gpu" is a promise receivers act on: a sender on another GPU (made
    // by a strategy with another "device" than the one that made the init info) is refused
    // before it joins, so no receiver is refused for a GPU the sender is not on.
    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init_info(body);
        const gpu::CUuuid mine = gpu_uuid(cuda_, device_);
        if (info.has_sender_gpu && !same_gpu(mine, info.sender_gpu))
            fail(WSYNC_ERR_MISMATCH,
                 std::string(kKind) + ": the init info names the sender's GPU as " +
                     gpu::uuid_text(info.sender_gpu) +
                     " (the \"device\" of the strategy that made it), but this sender's device " +
                     std::to_string(device_) + " is " + gpu::uuid_text(mine) +
                     "; create the sender from the strategy that made the init info, or give "
                     "both the same \"device\" (receivers refuse that GPU, not this one)");
        // Receivers report to the control channel named in the init info: only the strategy
        // that opened it can hand it to a sender.
        if (!info.has_control || !listener_ || listener_->address().port != info.control.port)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 std::string(kKind) + ": this strategy did not make the init info" +
                     (info.has_control ? " (its control channel, port " + std::to_string(info.control.port) +
                                             ", is another strategy's)"
                                       : " (it names no control channel: an older trainer's)") +
                     ", or made a sender from it already; create the sender from the strategy that "
                     "made the init info, once (receivers report to that strategy's channel)");
        auto dev = std::make_unique<gpu::Device>(cuda_, device_, kKind);
        return make_sender(nccl_, std::move(dev), info, std::move(listener_), synchronize_, timeout_ms_);
    }

    // A receiver on the sender's GPU is refused here, before it makes a context or joins the
    // group: NCCL would fail both ranks' init with "invalid usage" (ncclResult_t 5), which
    // names no cause. WSYNC_ERR_UNSUPPORTED: the layout is valid (the GPU exists, the init info
    // is sound), but nccl_broadcast cannot serve it; cuda_ipc can.
    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init_info(body);
        check_receiver_index(kKind, index, info.nranks - 1);
        if (info.has_sender_gpu) {
            const gpu::CUuuid mine = gpu_uuid(cuda_, device_);
            if (same_gpu(mine, info.sender_gpu))
                fail(WSYNC_ERR_UNSUPPORTED,
                     std::string(kKind) + ": the sender (rank 0) is on " +
                         gpu::uuid_text(info.sender_gpu) + ", and this receiver index " +
                         std::to_string(index) + " (rank " + std::to_string(index + 1) +
                         ", device " + std::to_string(device_) +
                         ") is on the same GPU: NCCL refuses two ranks of one communicator on "
                         "one GPU. An engine on the trainer's GPU takes the weights with "
                         "\"cuda_ipc\" (nccl_broadcast needs a GPU of its own for every "
                         "receiver). Not joined: the sender's creation times out without this "
                         "rank");
        }
        auto dev = std::make_unique<gpu::Device>(cuda_, device_, kKind);
        return make_receiver(nccl_, std::move(dev), info, index, synchronize_, timeout_ms_);
    }

private:
    const gpu::CudaApi &cuda_;
    const gpu::NcclApi &nccl_;
    uint32_t receivers_;
    uint64_t bucket_bytes_;
    std::string dtype_;
    int device_;
    bool synchronize_;
    int64_t timeout_ms_;
    std::string interface_;               // "control_interface"
    std::unique_ptr<Listener> listener_;  // opened by create_init_info, taken by create_sender
};

std::unique_ptr<StrategyImpl> create_strategy(const Options &o) { return std::make_unique<NcclStrategy>(o); }

std::string unavailable_reason(const Options *o) {
    std::string why = gpu::cuda_unavailable_reason();
    if (why.empty()) why = gpu::nccl_unavailable_reason(o ? o->text("nccl_library") : "");
    return why.empty() ? auth::crypto_unavailable_reason() : why;  // the control channel's MACs
}

std::string runtime_text() {
    const gpu::NcclApi &n = gpu::nccl("");
    return gpu::cuda_runtime_text() + "; NCCL " + gpu::nccl_version_text(n.version) + " (" + n.path + ")";
}

}  // namespace
}  // namespace nccl

const KindInfo kNcclBroadcastKind = {nccl::kKind,            nccl::option_specs,
                                     nccl::unavailable_reason, nccl::create_strategy,
                                     nullptr,                nccl::runtime_text,
                                     /*delta_sync=*/true,    /*experimental=*/false,
                                     /*delta_on_device=*/true,
                                     {/*tensor_memory=*/"cuda", /*drop_receiver=*/false,
                                      /*reattach=*/false, /*collective=*/true,
                                      /*gpu_per_receiver=*/true}};

}  // namespace wsync
