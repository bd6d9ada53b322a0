#include "transport/nccl/receiver.hpp"

#include <cinttypes>

#include "error.hpp"
#include "plan/layout.hpp"
#include "gpu/destination.hpp"
#include "gpu/diff.hpp"
#include "gpu/pack.hpp"
#include "transport/nccl/comm.hpp"

namespace wsync::nccl {
namespace {

using gpu::CUdeviceptr;

// The loader's copies out of a chunk's views, as a fence: recv_end records an event on the
// loader's stream (the legacy default stream, where PyTorch's default stream queues them,
// unless wsync_receiver_set_stream named another), and the next receive
// polls it, against its deadline, before the next broadcast overwrites the bucket. This is
// the receiver's "synchronize" without cuCtxSynchronize, which would wait with no bound for
// every stream of the context, the engine's own kernels and collectives included.
struct LoaderFence {
    explicit LoaderFence(const gpu::Device &d) : dev(d), event(d) {}
    // Called from acknowledge (noexcept): a failure is kept for the next receive to report.
    void arm() noexcept {
        try {
            gpu::Device::Scope scope(dev);
            event.record(stream);
            armed = true;
        } catch (const std::exception &e) {
            error = e.what();
        }
    }
    const gpu::Device &dev;
    gpu::Event event;
    gpu::CUstream stream = gpu::CU_STREAM_LEGACY;  // the loader's (wsync_receiver_set_stream)
    bool armed = false;
    std::string error;  // why arm() failed; "" if it did not
};

class NcclBacking final : public ChunkBacking {
public:
    // `fence`: armed at acknowledge ("synchronize"), else null; `patch_fence`: the same
    // object, armed only when this chunk's patches outlived their wait (whatever "synchronize"
    // says), so the next broadcast cannot overwrite a bucket they may still read.
    NcclBacking(const gpu::Device &dev, CUdeviceptr base, const std::vector<uint64_t> &offsets,
                LoaderFence *fence, LoaderFence *patch_fence, int64_t timeout_ms,
                std::function<gpu::DeltaKernels &()> kernels)
        : dev_(dev), base_(base), offsets_(offsets), fence_(fence), patch_fence_(patch_fence),
          timeout_ms_(timeout_ms), kernels_(std::move(kernels)) {}
    const void *data(std::size_t i) const override {
        return reinterpret_cast<const void *>(base_ + offsets_[i]);
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CUDA, dev_.ordinal()}; }
    bool read_only() const override { return true; }
    // The broadcast into the bucket completed before the views were handed out, so the copy
    // goes straight onto the loader's stream, where the fence armed at acknowledge() covers it
    // like a loader's own copies out of the views.
    bool copy_to_device(void *dst, const void *src, uint64_t len,
                        const std::function<std::string()> &what) override {
        gpu::queue_copy_to_device(dev_, fence_ ? fence_->stream : gpu::CU_STREAM_LEGACY, dst, src,
                                  len, what, "nccl_broadcast");
        return true;
    }
    // A patch made on the trainer's GPU, applied from the bucket into the engine's memory on
    // the loader's stream, verified, with no host wait; patch_outcomes() waits for it when the
    // iteration ends, so the next broadcast never overwrites a bucket a patch is read from.
    bool queue_patch(void *dst, const DevicePatch &p, const std::string &what) override {
        kernels_().queue_one(dst, p.patch, p.patch_bytes, p.elements, p.esize, p.base_hash,
                             p.result_hash, fence_ ? fence_->stream : gpu::CU_STREAM_LEGACY,
                             sys::Deadline(timeout_ms_), what, "nccl_broadcast");
        return true;
    }
    std::vector<delta::PatchOutcome> patch_outcomes(const std::string &what) override {
        try {
            return kernels_().collect(sys::Deadline(timeout_ms_), std::string("nccl_broadcast") + ": " + what);
        } catch (const Error &e) {
            if (e.status() == WSYNC_ERR_TIMEOUT) stale_patches_ = true;
            throw;
        }
    }
    // The next chunk is broadcast into the same bucket: fence the copies out of these views.
    // Does not wait; the next receive does, with its deadline.
    void acknowledge(wsync_status_t) noexcept override {
        if (fence_) fence_->arm();
        else if (stale_patches_ && patch_fence_) patch_fence_->arm();
    }

private:
    const gpu::Device &dev_;
    CUdeviceptr base_;
    std::vector<uint64_t> offsets_;
    LoaderFence *fence_;  // the receiver's, which outlives every iteration; null: no fence
    LoaderFence *patch_fence_;  // the same, for patches that outlived their wait
    bool stale_patches_ = false;
    int64_t timeout_ms_;
    std::function<gpu::DeltaKernels &()> kernels_;  // the receiver's, made at the first patch
};

class NcclReceiver final : public ReceiverImpl {
public:
    NcclReceiver(const gpu::NcclApi &nccl, std::unique_ptr<gpu::Device> dev, const InitInfo &info,
                 uint32_t index, bool synchronize, int64_t timeout_ms)
        : dev_(std::move(dev)), info_(info), rank_(static_cast<int>(index) + 1),
          synchronize_(synchronize), timeout_ms_(timeout_ms),
          comm_(std::make_unique<Comm>(nccl, *dev_, info, rank_, timeout_ms)),
          stream_(*dev_), bucket_(*dev_, info.bucket_bytes, "nccl_broadcast receive bucket"),
          done_(*dev_), fence_(*dev_) {}

    ~NcclReceiver() override { comm_.reset(); }  // bounded: Comm::close

    bool verify_checksums() const override { return false; }

    void set_stream(void *stream) override { fence_.stream = gpu::ordering_stream(stream); }

    DestMemory describe_destination(void *data, uint64_t len,
                                    const std::function<std::string()> &what) const override {
        return gpu::describe_device_destination(*dev_, data, len, what, kKind);
    }
    void recheck_destination(const DestMemory &mem, const std::function<std::string()> &what) const override {
        gpu::recheck_device_destination(*dev_, mem, what);
    }

    // A request of another model-update group is refused before its seq is looked at (no
    // broadcast is posted, nothing changes here). One without "group" (a sender from before
    // the field) is judged by its seq alone, as it was then.
    void check_addressed(const json &transport) const override {
        if (!transport.is_object() || !transport.contains("group")) return;
        const uint64_t group = wire::uint_field(transport, "group", "nccl_broadcast request", UINT64_MAX);
        if (group != info_.group)
            failf(WSYNC_ERR_MISMATCH,
                  "%s: request is of model-update group %016" PRIx64 ", this receiver's is %016" PRIx64
                  " (another trainer's, or a restarted one's: left unchanged; no broadcast was posted)",
                  kKind, group, info_.group);
    }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "nccl_broadcast request";
        const uint64_t seq = wire::uint_field(transport, "seq", w, UINT64_MAX);
        const uint64_t bytes = wire::uint_field(transport, "bytes", w, info_.bucket_bytes);
        if (seq != last_seq_ + 1)
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": request carries chunk seq " +
                                         std::to_string(seq) + ", expected seq " +
                                         std::to_string(last_seq_ + 1) +
                                         " (every broadcast must be received, in order)");
        layout::check(table, bytes, w, "broadcast");
        const std::string chunk = "chunk seq " + std::to_string(seq);
        comm_->check("before receiving " + chunk);
        if (table.metas.empty()) {  // a commit without data: no broadcast was posted
            last_seq_ = seq;
            return std::make_unique<NcclBacking>(*dev_, bucket_.ptr(), table.offsets, nullptr, nullptr,
                                                 timeout_ms_, delta_kernels());
        }
        const sys::Deadline deadline(timeout_ms_);
        {
            gpu::Device::Scope scope(*dev_);
            wait_for_loader(deadline, chunk);
            comm_->broadcast(reinterpret_cast<void *>(bucket_.ptr()), bytes, stream_.get(), deadline,
                             "receiving " + chunk);
            done_.record(stream_.get());  // after the broadcast: Comm::broadcast enqueued it
        }
        last_seq_ = seq;
        comm_->wait(done_, deadline,
                    "receiving " + chunk + " (" + std::to_string(bytes) + " bytes) from rank 0");
        return std::make_unique<NcclBacking>(*dev_, bucket_.ptr(), table.offsets,
                                             synchronize_ ? &fence_ : nullptr, &fence_, timeout_ms_,
                                             delta_kernels());
    }

private:
    // With "synchronize", the previous chunk's views may still be read by copies the loader
    // queued before recv_end; they must be done before `chunk` overwrites the bucket.
    void wait_for_loader(const sys::Deadline &deadline, const std::string &chunk) {
        const std::string who = std::string(kKind) + " rank " + std::to_string(rank_);
        if (!fence_.error.empty()) {
            comm_->abort();
            fail(WSYNC_ERR_SYSTEM, who + ": fencing the loader's copies out of chunk seq " +
                                       std::to_string(last_seq_) + " failed: " + fence_.error +
                                       "; communicator aborted");
        }
        if (!fence_.armed) return;
        gpu::Backoff backoff;
        while (!fence_.event.done()) {
            if (deadline.passed()) {
                comm_->abort();
                fail(WSYNC_ERR_TIMEOUT,
                     who + ": the work queued on " + gpu::stream_text(fence_.stream) + " before chunk seq " +
                         std::to_string(last_seq_) + "'s wsync_recv_end (the loader's copies out "
                         "of its views) did not finish within " +
                         std::to_string(deadline.budget_ms()) + " ms, so " + chunk +
                         " cannot overwrite the bucket; communicator aborted");
            }
            backoff.pause();
        }
        fence_.armed = false;
    }

    // The delta kernels on this receiver's GPU, loaded at the first patch it applies.
    std::function<gpu::DeltaKernels &()> delta_kernels() {
        return [this]() -> gpu::DeltaKernels & {
            if (!delta_) delta_ = std::make_unique<gpu::DeltaKernels>(*dev_);
            return *delta_;
        };
    }

    std::unique_ptr<gpu::Device> dev_;
    std::unique_ptr<gpu::DeltaKernels> delta_;  // after dev_: destroyed before it
    InitInfo info_;
    int rank_;
    bool synchronize_;
    int64_t timeout_ms_;
    std::unique_ptr<Comm> comm_;
    gpu::Stream stream_;
    gpu::DeviceBuffer bucket_;
    gpu::Event done_;
    LoaderFence fence_;
    uint64_t last_seq_ = 0;
};

}  // namespace

std::unique_ptr<ReceiverImpl> make_receiver(const gpu::NcclApi &nccl,
                                            std::unique_ptr<gpu::Device> dev, const InitInfo &info,
                                            uint32_t index, bool synchronize, int64_t timeout_ms) {
    return std::make_unique<NcclReceiver>(nccl, std::move(dev), info, index, synchronize,
                                          timeout_ms);
}

}  // namespace wsync::nccl
