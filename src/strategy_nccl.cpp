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
// views into its own bucket. flush waits for the last broadcasts. NCCL has no back channel, so
// flush reports transport completion; a receiver that fails to load a chunk reports that to its
// own caller.
//
// Every wait is bounded: no cuCtxSynchronize, no blocking NCCL call. Events on our own streams
// are polled with cuEventQuery, the communicator's state with ncclCommGetAsyncError, both
// against the deadline, and the communicator is aborted when a deadline passes. A call that
// returns ncclInProgress is polled until NCCL has enqueued it before anything is recorded after
// it (Comm::broadcast), and teardown is ncclCommFinalize polled against "timeout_ms", then
// ncclCommDestroy, or ncclCommAbort at the deadline (Comm::close).
#include <algorithm>
#include <cstring>
#include <memory>

#include "error.hpp"
#include "gpu/device.hpp"
#include "gpu/pack.hpp"
#include "strategy.hpp"

namespace wsync {
namespace {

using gpu::CUdeviceptr;

constexpr const char *kKind = "nccl_broadcast";
constexpr uint32_t kMaxReceivers = 4095;

const std::vector<OptionSpec> &nccl_options() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        {"receivers", T::UInt, 1, 1, kMaxReceivers, "sender",
         "number of receivers; the group has 1 + receivers ranks"},
        {"bucket_bytes", T::UInt, uint64_t(256) << 20, 4096, uint64_t(1) << 40, "sender",
         "bytes per device bucket (the sender has two, each receiver one of the size the init "
         "info carries); the largest chunk must fit"},
        {"dtype", T::String, 0, 0, 0, "sender",
         "cast float32 tensors while packing: \"bfloat16\" or \"float16\"; \"\" sends every dtype "
         "as it is",
         "", "|bfloat16|float16"},
        {"device", T::UInt, 0, 0, 4095, "both",
         "this process's GPU for the communicator, as an ordinal after CUDA_VISIBLE_DEVICES; the "
         "sender's tensors must be on it"},
        {"synchronize", T::Bool, 1, 0, 1, "both",
         "sender: order each pack after the work queued on the legacy default stream (PyTorch's "
         "default stream) or the stream named with wsync_sender_set_stream (work on other "
         "streams the caller synchronises); receiver: the next chunk overwrites its bucket only "
         "after the work queued on the loader's stream (likewise, wsync_receiver_set_stream) "
         "before recv_end (the copies out of views) is done"},
        {"timeout_ms", T::UInt, 60000, 1, uint64_t(1) << 40, "both",
         "deadline for communicator creation, for a free bucket, for each pack and received "
         "chunk, and for finalizing the communicator when the sender or receiver is destroyed"},
        {"nccl_library", T::String, 0, 0, 0, "both",
         "path of libnccl.so.2 to use (e.g. the one PyTorch ships); else $WSYNC_NCCL_LIBRARY, "
         "else the system's libnccl.so.2",
         ""},
    };
    return specs;
}

std::string version_family(int code) {
    std::string v = gpu::nccl_version_text(code);
    return v.substr(0, v.rfind('.'));  // "2.28": ranks must agree on major.minor
}

struct InitInfo {
    gpu::ncclUniqueId id;
    uint32_t nranks;
    uint64_t bucket_bytes;
    std::string dtype;
    int nccl_version;
};

InitInfo parse_init(const json &body) {
    const std::string w = "nccl_broadcast init info";
    InitInfo info{};
    const json &id = wire::field(body, "unique_id", w);
    if (!id.is_binary() || id.get_binary().size() != sizeof(gpu::ncclUniqueId))
        wire::malformed(w + ": unique_id is not a 128-byte NCCL unique id");
    std::memcpy(info.id.internal, id.get_binary().data(), sizeof info.id.internal);
    info.nranks = static_cast<uint32_t>(wire::uint_field(body, "nranks", w, kMaxReceivers + 1));
    if (info.nranks < 2) wire::malformed(w + ": nranks must be at least 2 (a sender and a receiver)");
    info.bucket_bytes = wire::uint_field(body, "bucket_bytes", w, uint64_t(1) << 40);
    if (info.bucket_bytes == 0) wire::malformed(w + ": bucket_bytes is 0");
    info.dtype = wire::string_field(body, "dtype", w, 16);
    if (!info.dtype.empty() && info.dtype != "bfloat16" && info.dtype != "float16")
        wire::malformed(w + ": dtype '" + info.dtype + "' is not one libwsync casts to");
    info.nccl_version = static_cast<int>(wire::uint_field(body, "nccl_version", w, INT32_MAX));
    return info;
}

// A communicator that is aborted rather than left hanging whenever something goes wrong.
class Comm {
public:
    Comm(const gpu::NcclApi &nccl, const gpu::Device &dev, const InitInfo &info, int rank,
         int64_t timeout_ms)
        : nccl_(nccl), dev_(dev), rank_(rank), teardown_ms_(timeout_ms) {
        const std::string who = std::string(kKind) + " rank " + std::to_string(rank);
        if (version_family(info.nccl_version) != version_family(nccl.version))
            fail(WSYNC_ERR_MISMATCH, who + ": the trainer uses NCCL " +
                                         gpu::nccl_version_text(info.nccl_version) + ", this process " +
                                         gpu::nccl_version_text(nccl.version) + " (" + nccl.path +
                                         "); every rank needs the same major.minor");
        gpu::ncclConfig_t config{};
        config.size = sizeof config;
        config.magic = gpu::kNcclConfigMagic;
        config.version = gpu::kNcclMinVersion;
        config.blocking = 0;  // return at once; progress is polled below, with a deadline
        config.cgaClusterSize = config.minCTAs = config.maxCTAs = gpu::kNcclConfigUndefInt;
        config.netName = nullptr;
        gpu::Device::Scope scope(dev_);
        gpu::ncclResult_t rc = nccl_.ncclCommInitRankConfig(&comm_, static_cast<int>(info.nranks),
                                                            info.id, rank, &config);
        if (rc != gpu::ncclSuccess && rc != gpu::ncclInProgress) {
            if (comm_) nccl_.ncclCommAbort(comm_);
            comm_ = nullptr;
            gpu::nccl_fail(nccl_, rc, who + ": ncclCommInitRankConfig");
        }
        const gpu::ncclResult_t state = poll_async(sys::Deadline(timeout_ms));
        if (state == gpu::ncclInProgress) {
            abort();
            fail(WSYNC_ERR_TIMEOUT,
                 who + ": the group of " + std::to_string(info.nranks) +
                     " ranks was not complete after " + std::to_string(timeout_ms) +
                     " ms (the sender is rank 0, receiver i is rank i + 1; every one must be "
                     "created from this init info); communicator aborted");
        }
        if (state != gpu::ncclSuccess) {
            abort();
            fail(WSYNC_ERR_PEER, who + ": communicator creation failed: " + describe(state) +
                                     "; communicator aborted");
        }
    }

    ~Comm() { close(); }

    // Leaves the group within the teardown bound. ncclCommDestroy alone would first flush the
    // communicator's queued broadcasts with no timeout, so a peer that never posts its side
    // would hang the destructor. nccl.h, ncclCommFinalize: it "flushes all issued
    // communications, and marks communicator state as ncclInProgress. The state will change to
    // ncclSuccess when the communicator is globally quiescent [...]; then, calling
    // ncclCommDestroy can locally free the rest of the resources [...] without blocking" (also
    // NCCL User Guide, "Creating a Communicator: Finalizing a communicator"). So: finalize, poll
    // the state until the bound, then destroy, or abort when the bound passes or NCCL fails.
    void close() noexcept {
        if (!comm_) return;
        try {
            gpu::Device::Scope scope(dev_);
            const sys::Deadline deadline(teardown_ms_);
            const gpu::ncclResult_t rc = nccl_.ncclCommFinalize(comm_);
            if ((rc == gpu::ncclSuccess || rc == gpu::ncclInProgress) &&
                poll_async(deadline) == gpu::ncclSuccess) {
                nccl_.ncclCommDestroy(comm_);
                comm_ = nullptr;
                return;
            }
        } catch (...) {
        }
        abort();
    }

    gpu::ncclComm_t get() const { return comm_; }

    void abort() noexcept {
        if (!comm_) return;
        try {
            gpu::Device::Scope scope(dev_);
            nccl_.ncclCommAbort(comm_);
        } catch (...) {
        }
        comm_ = nullptr;
    }

    // Throws WSYNC_ERR_PEER (and aborts) if NCCL reports an asynchronous error.
    void check(const std::string &what) {
        if (!comm_)
            fail(WSYNC_ERR_PEER, std::string(kKind) + " rank " + std::to_string(rank_) +
                                     ": the communicator was aborted by an earlier failure; "
                                     "make a new sender or receiver from new init info");
        gpu::ncclResult_t state = gpu::ncclSuccess;
        nccl_.ncclCommGetAsyncError(comm_, &state);
        if (state != gpu::ncclSuccess && state != gpu::ncclInProgress) {
            abort();
            fail(WSYNC_ERR_PEER, std::string(kKind) + " rank " + std::to_string(rank_) + ": " +
                                     what + ": " + describe(state) + "; communicator aborted");
        }
    }

    // Waits for `ev` while watching the communicator; aborts at the deadline.
    void wait(const gpu::Event &ev, const sys::Deadline &deadline, const std::string &what) {
        for (int round = 0;; ++round) {
            check(what);
            if (ev.done()) return;
            if (deadline.passed()) {
                abort();
                fail(WSYNC_ERR_TIMEOUT, std::string(kKind) + " rank " + std::to_string(rank_) +
                                            ": " + what + " did not complete within " +
                                            std::to_string(deadline.budget_ms()) +
                                            " ms; communicator aborted");
            }
            gpu::poll_sleep(round);
        }
    }

    // Posts this rank's side of a broadcast of `bytes` at `buf` from rank 0 on `stream`, and
    // returns once NCCL has enqueued it, so an event recorded next on `stream` follows it. A
    // non-blocking communicator may return ncclInProgress before the kernel is on the stream;
    // NCCL then requires polling ncclCommGetAsyncError until the state leaves ncclInProgress
    // before the communicator or its stream is used again (NCCL User Guide, "Group Calls:
    // Nonblocking Group Operation"; NCCL API, ncclCommGetAsyncError). Aborts the communicator
    // on an error or when the deadline passes first.
    void broadcast(void *buf, uint64_t bytes, gpu::CUstream stream, const sys::Deadline &deadline,
                   const std::string &what) {
        const gpu::ncclResult_t rc =
            nccl_.ncclBroadcast(buf, buf, bytes, gpu::ncclUint8, 0, comm_, stream);
        if (rc == gpu::ncclSuccess) return;
        if (rc != gpu::ncclInProgress) {
            abort();
            gpu::nccl_fail(nccl_, rc, who() + ": ncclBroadcast, " + what + " (communicator aborted)");
        }
        const gpu::ncclResult_t state = poll_async(deadline);
        if (state == gpu::ncclSuccess) return;
        abort();
        if (state == gpu::ncclInProgress)
            fail(WSYNC_ERR_TIMEOUT, who() + ": ncclBroadcast, " + what +
                                        ", was still ncclInProgress (not yet enqueued) after " +
                                        std::to_string(deadline.budget_ms()) +
                                        " ms; communicator aborted");
        fail(WSYNC_ERR_PEER, who() + ": ncclBroadcast, " + what + ": " + describe(state) +
                                 "; communicator aborted");
    }

private:
    std::string who() const { return std::string(kKind) + " rank " + std::to_string(rank_); }

    // Polls ncclCommGetAsyncError until the state leaves ncclInProgress or the deadline
    // passes. Returns the last state: ncclInProgress means the deadline passed.
    gpu::ncclResult_t poll_async(const sys::Deadline &deadline) {
        for (int round = 0;; ++round) {
            gpu::ncclResult_t state = gpu::ncclInProgress;
            const gpu::ncclResult_t rc = nccl_.ncclCommGetAsyncError(comm_, &state);
            if (rc != gpu::ncclSuccess && rc != gpu::ncclInProgress) return rc;  // the query failed
            if (state != gpu::ncclInProgress || deadline.passed()) return state;
            gpu::poll_sleep(round);
        }
    }

    std::string describe(gpu::ncclResult_t r) const {
        const char *text = nccl_.ncclGetErrorString(r);
        return "ncclResult_t " + std::to_string(r) + (text ? std::string(" (") + text + ")" : "");
    }

    const gpu::NcclApi &nccl_;
    const gpu::Device &dev_;
    int rank_;
    int64_t teardown_ms_;  // the bound of close(): the "timeout_ms" option
    gpu::ncclComm_t comm_ = nullptr;
};

void check_device(const wsync_tensor_t *tensors, const TensorTable &table, int ordinal) {
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const wsync_device_t d = tensors[i].device;
        if (d.type != WSYNC_DEVICE_CUDA || d.index != ordinal)
            fail(WSYNC_ERR_UNSUPPORTED, std::string(kKind) + ": tensor '" + table.metas[i].name +
                                            "' is on " + device_name(d) + "; this sender broadcasts from cuda:" +
                                            std::to_string(ordinal) + " (option 'device')");
    }
}

// ---------------------------------------------------------------------------------------------
class NcclSender final : public SenderImpl {
public:
    NcclSender(const gpu::NcclApi &nccl, std::unique_ptr<gpu::Device> dev, const InitInfo &info,
               bool synchronize, int64_t timeout_ms)
        : dev_(std::move(dev)), info_(info), cast_(gpu::parse_cast(info.dtype)),
          synchronize_(synchronize), timeout_ms_(timeout_ms),
          comm_(std::make_unique<Comm>(nccl, *dev_, info, 0, timeout_ms)),
          pack_stream_(*dev_), comm_stream_(*dev_), packer_(*dev_), packed_(*dev_), legacy_(*dev_) {
        for (int b = 0; b < 2; ++b) {
            buckets_[b] = gpu::DeviceBuffer(*dev_, info.bucket_bytes, "nccl_broadcast bucket");
            sent_[b] = std::make_unique<gpu::Event>(*dev_);
        }
    }

    ~NcclSender() override { comm_.reset(); }  // bounded: Comm::close

    void set_stream(void *stream) override { order_stream_ = gpu::ordering_stream(stream); }

    json send(const ChunkHeader &, const wsync_tensor_t *tensors, TensorTable &table) override {
        if (table.metas.empty()) {
            // A commit without data moves nothing: both sides skip the broadcast.
            comm_->check("before committing");
            return json{{"seq", next_seq_++}, {"bytes", 0}};
        }
        check_device(tensors, table, dev_->ordinal());
        std::vector<gpu::PackOp> ops;
        const uint64_t bytes = gpu::layout_bucket(table, cast_, info_.bucket_bytes, &ops, kKind);
        comm_->check("before sending");
        const uint64_t seq = next_seq_;
        const int b = static_cast<int>(seq % 2);
        const std::string chunk = "chunk seq " + std::to_string(seq);
        sys::Deadline deadline(timeout_ms_);
        // The bucket's previous broadcast (chunk seq - 2) must be complete before we overwrite it.
        if (seq > 2)
            comm_->wait(*sent_[b], deadline,
                        "broadcast of chunk seq " + std::to_string(seq - 2) + " (its bucket is needed for " +
                            chunk + ")");
        gpu::Device::Scope scope(*dev_);
        pack(tensors, table, ops, b, deadline, chunk);
        comm_->broadcast(reinterpret_cast<void *>(buckets_[b].ptr()), bytes, comm_stream_.get(),
                         deadline, "sending " + chunk + " (" + std::to_string(bytes) + " bytes)");
        sent_[b]->record(comm_stream_.get());  // after the broadcast: Comm::broadcast enqueued it
        ++next_seq_;
        return json{{"seq", seq}, {"bytes", bytes}};
    }

    void flush(int64_t timeout_ms) override {
        sys::Deadline deadline(timeout_ms);
        for (uint64_t s = next_seq_ > 2 ? next_seq_ - 2 : 1; s < next_seq_; ++s)
            comm_->wait(*sent_[s % 2], deadline, "flush: broadcast of chunk seq " + std::to_string(s));
    }

private:
    // Packs the chunk into bucket b and returns once the kernel has read the caller's tensors:
    // wsync.h lets the caller change them as soon as send_chunk returns, and nothing orders the
    // caller's later work after our pack stream. The wait polls an event on that stream
    // (cuEventQuery) until the deadline. On a timeout nothing is broadcast; the pack may still
    // run later (the GPU cannot take it back), which the message says.
    void pack(const wsync_tensor_t *tensors, const TensorTable &table,
              const std::vector<gpu::PackOp> &ops, int b, const sys::Deadline &deadline,
              const std::string &chunk) {
        if (synchronize_) {
            // Not cuCtxSynchronize: that would also wait for our own queued broadcasts, which
            // complete only when receivers post theirs. Ordering the pack after the caller's
            // stream (the legacy default stream, PyTorch's default, unless set_stream named
            // one) waits for the trainer's work and nothing else.
            legacy_.record(order_stream_);
            WSYNC_CU(dev_->api(), cuStreamWaitEvent(pack_stream_.get(), legacy_.get(), 0),
                     "ordering the pack after " + gpu::stream_text(order_stream_));
        }
        std::vector<gpu::PackEntry> entries(table.metas.size());
        for (std::size_t i = 0; i < entries.size(); ++i) {
            const uint64_t n = ops[i] == gpu::kPackCopy ? table.metas[i].nbytes : table.metas[i].nbytes / 2;
            entries[i] = gpu::PackEntry{reinterpret_cast<uint64_t>(tensors[i].data),
                                        buckets_[b].ptr() + table.offsets[i], n,
                                        static_cast<uint32_t>(ops[i]), 0};
        }
        packer_.pack(entries, pack_stream_.get());
        packed_.record(pack_stream_.get());
        for (int round = 0; !packed_.done(); ++round) {
            if (deadline.passed())
                fail(WSYNC_ERR_TIMEOUT,
                     std::string(kKind) + ": the pack of " + chunk + " on cuda:" +
                         std::to_string(dev_->ordinal()) + " did not finish within " +
                         std::to_string(deadline.budget_ms()) + " ms" +
                         (synchronize_ ? " (it runs after the work queued on " +
                                             gpu::stream_text(order_stream_) + ": is that work stuck?)"
                                       : std::string()) +
                         "; nothing was broadcast, and the GPU may still read the tensors when "
                         "the pack runs");
            gpu::poll_sleep(round);
        }
    }

    std::unique_ptr<gpu::Device> dev_;
    InitInfo info_;
    gpu::Cast cast_;
    bool synchronize_;
    int64_t timeout_ms_;
    std::unique_ptr<Comm> comm_;
    gpu::Stream pack_stream_, comm_stream_;
    gpu::Packer packer_;
    gpu::Event packed_, legacy_;
    gpu::CUstream order_stream_ = gpu::CU_STREAM_LEGACY;  // set_stream(): the trainer's writes
    gpu::DeviceBuffer buckets_[2];
    std::unique_ptr<gpu::Event> sent_[2];
    uint64_t next_seq_ = 1;
};

// ---------------------------------------------------------------------------------------------
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
    NcclBacking(const gpu::Device &dev, CUdeviceptr base, const std::vector<uint64_t> &offsets,
                LoaderFence *fence)
        : dev_(dev), base_(base), offsets_(offsets), fence_(fence) {}
    const void *data(std::size_t i) const override {
        return reinterpret_cast<const void *>(base_ + offsets_[i]);
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CUDA, dev_.ordinal()}; }
    bool read_only() const override { return true; }
    // The next chunk is broadcast into the same bucket: fence the copies out of these views.
    // Does not wait; the next receive does, with its deadline.
    void acknowledge(wsync_status_t) noexcept override {
        if (fence_) fence_->arm();
    }

private:
    const gpu::Device &dev_;
    CUdeviceptr base_;
    std::vector<uint64_t> offsets_;
    LoaderFence *fence_;  // the receiver's, which outlives every iteration; null: no fence
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
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            uint64_t off = table.offsets[i], n = table.metas[i].nbytes;
            if (off % 256 != 0 || n > bytes || off > bytes - n)
                wire::malformed(w + ": tensor '" + table.metas[i].name + "' at offset " +
                                std::to_string(off) + " (+" + std::to_string(n) +
                                " bytes) is misaligned or outside the " + std::to_string(bytes) +
                                "-byte broadcast");
        }
        const std::string chunk = "chunk seq " + std::to_string(seq);
        comm_->check("before receiving " + chunk);
        if (table.metas.empty()) {  // a commit without data: no broadcast was posted
            last_seq_ = seq;
            return std::make_unique<NcclBacking>(*dev_, bucket_.ptr(), table.offsets, nullptr);
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
                                             synchronize_ ? &fence_ : nullptr);
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
        for (int round = 0; !fence_.event.done(); ++round) {
            if (deadline.passed()) {
                comm_->abort();
                fail(WSYNC_ERR_TIMEOUT,
                     who + ": the work queued on " + gpu::stream_text(fence_.stream) + " before chunk seq " +
                         std::to_string(last_seq_) + "'s wsync_recv_end (the loader's copies out "
                         "of its views) did not finish within " +
                         std::to_string(deadline.budget_ms()) + " ms, so " + chunk +
                         " cannot overwrite the bucket; communicator aborted");
            }
            gpu::poll_sleep(round);
        }
        fence_.armed = false;
    }

    std::unique_ptr<gpu::Device> dev_;
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

// ---------------------------------------------------------------------------------------------
class NcclStrategy final : public StrategyImpl {
public:
    explicit NcclStrategy(const Options &o)
        : cuda_(gpu::cuda()), nccl_(gpu::nccl(o.text("nccl_library"))),
          receivers_(static_cast<uint32_t>(o.uint("receivers"))),
          bucket_bytes_((o.uint("bucket_bytes") + 4095) / 4096 * 4096), dtype_(o.text("dtype")),
          device_(static_cast<int>(o.uint("device"))), synchronize_(o.boolean("synchronize")),
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))) {}

    json create_init_info() override {
        gpu::ncclUniqueId id;
        gpu::ncclResult_t rc = nccl_.ncclGetUniqueId(&id);
        if (rc != gpu::ncclSuccess) gpu::nccl_fail(nccl_, rc, std::string(kKind) + ": ncclGetUniqueId");
        return json{{"unique_id", json::binary(std::vector<uint8_t>(id.internal, id.internal + sizeof id.internal))},
                    {"nranks", receivers_ + 1}, {"bucket_bytes", bucket_bytes_}, {"dtype", dtype_},
                    {"nccl_version", nccl_.version}};
    }

    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init(body);
        auto dev = std::make_unique<gpu::Device>(cuda_, device_, kKind);
        return std::make_unique<NcclSender>(nccl_, std::move(dev), info, synchronize_, timeout_ms_);
    }

    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init(body);
        check_receiver_index(kKind, index, info.nranks - 1);
        auto dev = std::make_unique<gpu::Device>(cuda_, device_, kKind);
        return std::make_unique<NcclReceiver>(nccl_, std::move(dev), info, index, synchronize_,
                                              timeout_ms_);
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
};

std::unique_ptr<StrategyImpl> nccl_create(const Options &o) { return std::make_unique<NcclStrategy>(o); }

std::string nccl_unavailable(const Options *o) {
    std::string why = gpu::cuda_unavailable_reason();
    return why.empty() ? gpu::nccl_unavailable_reason(o ? o->text("nccl_library") : "") : why;
}

std::string nccl_runtime() {
    const gpu::NcclApi &n = gpu::nccl("");
    return gpu::cuda_runtime_text() + "; NCCL " + gpu::nccl_version_text(n.version) + " (" + n.path + ")";
}

}  // namespace

const KindInfo kNcclBroadcastKind = {kKind,       nccl_options, nccl_unavailable,
                                     nccl_create, nullptr,      nccl_runtime};

}  // namespace wsync
