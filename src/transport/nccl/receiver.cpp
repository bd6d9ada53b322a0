#include "transport/nccl/receiver.hpp"

#include <cinttypes>
#include <unistd.h>

#include "error.hpp"
#include "plan/layout.hpp"
#include "gpu/destination.hpp"
#include "gpu/diff.hpp"
#include "gpu/pack.hpp"
#include "transport/nccl/comm.hpp"
#include "transport/nccl/control.hpp"

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
                std::function<gpu::DeltaKernels &()> kernels, std::function<void(wsync_status_t)> ack)
        : dev_(dev), base_(base), offsets_(offsets), fence_(fence), patch_fence_(patch_fence),
          timeout_ms_(timeout_ms), kernels_(std::move(kernels)), ack_(std::move(ack)) {}
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
    // Then tells the sender the chunk's outcome (the control channel).
    void acknowledge(wsync_status_t outcome) noexcept override {
        if (fence_) fence_->arm();
        else if (stale_patches_ && patch_fence_) patch_fence_->arm();
        ack_(outcome);
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
    std::function<void(wsync_status_t)> ack_;       // noexcept: Control::tell
};

class NcclReceiver final : public ReceiverImpl {
public:
    NcclReceiver(const gpu::NcclApi &nccl, std::unique_ptr<gpu::Device> dev, const InitInfo &info,
                 uint32_t index, bool synchronize, int64_t timeout_ms)
        : dev_(std::move(dev)), info_(info), rank_(static_cast<int>(index) + 1),
          synchronize_(synchronize), timeout_ms_(timeout_ms),
          control_(connect(info, index, timeout_ms)),
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

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &h, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "nccl_broadcast request";
        const uint64_t seq = wire::uint_field(transport, "seq", w, UINT64_MAX);
        const uint64_t bytes = wire::uint_field(transport, "bytes", w, info_.bucket_bytes);
        layout::check(table, bytes, w, "broadcast");
        const sys::Deadline deadline(timeout_ms_);
        drain(transport, seq, deadline);
        if (h.version == abandoned_version_)
            fail(WSYNC_ERR_ABANDONED, std::string(kKind) + ": version " + std::to_string(h.version) +
                                          " was abandoned by the sender; chunk seq " + std::to_string(seq) +
                                          " is not taken (the next request has it joined and discarded)");
        if (seq != last_seq_ + 1)
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": request carries chunk seq " +
                                         std::to_string(seq) + ", expected seq " +
                                         std::to_string(last_seq_ + 1) +
                                         " (every broadcast must be received, in order)");
        const std::string chunk = "chunk seq " + std::to_string(seq);
        comm_->check("before receiving " + chunk);
        auto ack = [this, seq](wsync_status_t outcome) { tell(Msg::Ack, seq, 0, outcome, ""); };
        if (table.metas.empty()) {  // a commit without data: no broadcast was posted
            last_seq_ = seq;
            return std::make_unique<NcclBacking>(*dev_, bucket_.ptr(), table.offsets, nullptr, nullptr,
                                                 timeout_ms_, delta_kernels(), ack);
        }
        join(seq, bytes, deadline);
        return std::make_unique<NcclBacking>(*dev_, bucket_.ptr(), table.offsets,
                                             synchronize_ ? &fence_ : nullptr, &fence_, timeout_ms_,
                                             delta_kernels(), ack);
    }

    // A request the core refuses (its version failed here, or it is out of order) is still a
    // broadcast every rank must join: joined into the bucket and discarded when it is the next
    // one, and its outcome told to the sender, so neither the collective nor the trainer's
    // flush waits for this rank. One of an abandoned version is left to the drain.
    void refuse(const ChunkHeader &h, const json &transport, wsync_status_t status,
                const std::string &message, bool record) noexcept override {
        try {
            const std::string w = "nccl_broadcast request";
            const uint64_t seq = wire::uint_field(transport, "seq", w, UINT64_MAX);
            const uint64_t bytes = wire::uint_field(transport, "bytes", w, info_.bucket_bytes);
            const sys::Deadline deadline(timeout_ms_);
            drain(transport, seq, deadline);
            if (seq == last_seq_ + 1 && h.version != abandoned_version_) {
                if (bytes) join(seq, bytes, deadline);
                else last_seq_ = seq;
            }
            if (seq != last_seq_) return;  // not this rank's to answer
            if (record) record_failure(h, status, message);
            tell(Msg::Ack, seq, 0, status, "");
        } catch (...) {
        }
    }

    void record_failure(const ChunkHeader &h, wsync_status_t status,
                        const std::string &message) noexcept override {
        tell(Msg::Failed, h.version, h.chunk_index, status, message);
    }

    // The sender's notices (abandoned versions) and whether it is still there.
    Link link() const override {
        if (control_ && !control_->closed()) {
            std::vector<Received> got;
            control_->read(&got);
            for (const Received &r : got)
                if (r.frame.type == static_cast<uint32_t>(Msg::Abandoned))
                    abandoned_version_ = std::max(abandoned_version_, r.frame.a);
        }
        Link l;
        l.sender_gone = control_ && control_->closed();
        l.abandoned_version = abandoned_version_;
        return l;
    }

private:
    static std::unique_ptr<Conn> connect(const InitInfo &info, uint32_t index, int64_t timeout_ms) {
        if (!info.has_control) return nullptr;  // an older trainer: no channel
        const sys::Deadline deadline(timeout_ms);
        const std::string who = std::string(kKind) + " receiver " + std::to_string(index);
        auto c = std::make_unique<Conn>(connect_control(info.control, deadline, who));
        std::string nonce(auth::kNonceBytes, '\0');
        sys::random_bytes(nonce.data(), nonce.size());
        if (!c->send_hello(info.control.key, info.group, (uint64_t(index) << 32) | uint32_t(getpid()), nonce,
                           deadline))
            fail(WSYNC_ERR_PEER, who + ": the sender's control channel closed at once: " + c->why());
        c->authenticate(connection_key(info.control.key, index, info.group, nonce), 'R');
        return c;
    }

    // One frame to the sender, within this receiver's timeout. A sender that is gone or does
    // not read changes nothing here: the communicator tells that.
    void tell(Msg type, uint64_t a, uint64_t b, wsync_status_t status, const std::string &text) noexcept {
        if (control_) control_->send(type, a, b, status, text, sys::Deadline(timeout_ms_));
    }

    // Posts this rank's side of broadcast `seq` into the bucket, tells the sender it joined, and
    // waits for it (the deadline; the communicator aborted when it passes).
    void join(uint64_t seq, uint64_t bytes, const sys::Deadline &deadline) {
        const std::string chunk = "chunk seq " + std::to_string(seq);
        {
            gpu::Device::Scope scope(*dev_);
            wait_for_loader(deadline, chunk);
            comm_->broadcast(reinterpret_cast<void *>(bucket_.ptr()), bytes, stream_.get(), deadline,
                             "receiving " + chunk);
            done_.record(stream_.get());  // after the broadcast: Comm::broadcast enqueued it
        }
        last_seq_ = seq;
        tell(Msg::Joined, seq, 0, WSYNC_OK, "");
        comm_->wait(done_, deadline,
                    "receiving " + chunk + " (" + std::to_string(bytes) + " bytes) from rank 0");
    }

    // Joins and discards the broadcasts of abandoned versions the request lists ("drain":
    // [seq, bytes] pairs, oldest first) that this rank has not joined; all checked first.
    void drain(const json &transport, uint64_t seq, const sys::Deadline &deadline) {
        if (!transport.contains("drain")) return;
        const std::string w = "nccl_broadcast request drain";
        std::vector<std::pair<uint64_t, uint64_t>> list;
        uint64_t prev = 0;
        for (const json &e : wire::array_field(transport, "drain", w, 4096)) {
            if (!e.is_array() || e.size() != 2) wire::malformed(w + ": an entry is not [seq, bytes]");
            const uint64_t s = wire::as_uint(e[0], w, seq - 1), b = wire::as_uint(e[1], w, info_.bucket_bytes);
            if (s <= prev) wire::malformed(w + ": seqs are not increasing");
            prev = s;
            list.emplace_back(s, b);
        }
        for (const auto &[s, b] : list) {
            if (s <= last_seq_) continue;
            if (s != last_seq_ + 1)
                fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": the request has abandoned chunk seq " +
                                             std::to_string(s) + " drained, but this rank expects seq " +
                                             std::to_string(last_seq_ + 1) + " (a request was lost)");
            if (b) join(s, b, deadline);
            else last_seq_ = s;
        }
    }

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
    std::unique_ptr<Conn> control_;  // the sender's control channel; null: an older trainer's
    std::unique_ptr<Comm> comm_;
    gpu::Stream stream_;
    gpu::DeviceBuffer bucket_;
    gpu::Event done_;
    LoaderFence fence_;
    uint64_t last_seq_ = 0;
    mutable uint64_t abandoned_version_ = 0;  // the newest the sender said it abandoned
};

}  // namespace

std::unique_ptr<ReceiverImpl> make_receiver(const gpu::NcclApi &nccl,
                                            std::unique_ptr<gpu::Device> dev, const InitInfo &info,
                                            uint32_t index, bool synchronize, int64_t timeout_ms) {
    return std::make_unique<NcclReceiver>(nccl, std::move(dev), info, index, synchronize,
                                          timeout_ms);
}

}  // namespace wsync::nccl
