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
// bucket k % 2 on a pack stream, and broadcast from it on a communication stream that waits for
// the pack; send_chunk returns as soon as both are queued, so packing chunk k + 1 overlaps the
// broadcast of chunk k. Before reusing a bucket the sender waits, with the deadline, for that
// bucket's previous broadcast. A receiver posts its side of the broadcast when the loader asks
// for the chunk and waits for it (deadline) before yielding views into its own bucket.
// flush waits for the last broadcasts. NCCL has no back channel, so flush reports transport
// completion; a receiver that fails to load a chunk reports that to its own caller.
#include <algorithm>
#include <cstring>
#include <memory>

#include "error.hpp"
#include "gpu_util.hpp"
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
         "default stream; work on other streams the caller synchronises); receiver: synchronise "
         "before the next chunk overwrites its bucket, so copies out of views are done"},
        {"timeout_ms", T::UInt, 60000, 1, uint64_t(1) << 40, "both",
         "deadline for communicator creation, for a free bucket and for each received chunk"},
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
        : nccl_(nccl), dev_(dev), rank_(rank) {
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
        sys::Deadline deadline(timeout_ms);
        for (int round = 0;; ++round) {
            gpu::ncclResult_t state = gpu::ncclInProgress;
            nccl_.ncclCommGetAsyncError(comm_, &state);
            if (state == gpu::ncclSuccess) break;
            if (state != gpu::ncclInProgress) {
                abort();
                fail(WSYNC_ERR_PEER, who + ": communicator creation failed: " +
                                         describe(state) + "; communicator aborted");
            }
            if (deadline.passed()) {
                abort();
                fail(WSYNC_ERR_TIMEOUT,
                     who + ": the group of " + std::to_string(info.nranks) +
                         " ranks was not complete after " + std::to_string(timeout_ms) +
                         " ms (the sender is rank 0, receiver i is rank i + 1; every one must be "
                         "created from this init info); communicator aborted");
            }
            gpu::poll_sleep(round);
        }
    }

    ~Comm() {
        if (!comm_) return;
        try {
            gpu::Device::Scope scope(dev_);
            nccl_.ncclCommDestroy(comm_);
        } catch (...) {
        }
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

private:
    std::string describe(gpu::ncclResult_t r) const {
        const char *text = nccl_.ncclGetErrorString(r);
        return "ncclResult_t " + std::to_string(r) + (text ? std::string(" (") + text + ")" : "");
    }

    const gpu::NcclApi &nccl_;
    const gpu::Device &dev_;
    int rank_;
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
          comm_(std::make_unique<Comm>(nccl, *dev_, info, 0, timeout_ms)), nccl_(nccl),
          pack_stream_(*dev_), comm_stream_(*dev_), packer_(*dev_) {
        for (int b = 0; b < 2; ++b) {
            buckets_[b] = gpu::DeviceBuffer(*dev_, info.bucket_bytes, "nccl_broadcast bucket");
            packed_[b] = std::make_unique<gpu::Event>(*dev_);
            sent_[b] = std::make_unique<gpu::Event>(*dev_);
        }
        legacy_ = std::make_unique<gpu::Event>(*dev_);
    }

    ~NcclSender() override { comm_.reset(); }

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
        sys::Deadline deadline(timeout_ms_);
        // The bucket's previous broadcast (chunk seq - 2) must be complete before we overwrite it.
        if (seq > 2) comm_->wait(*sent_[b], deadline, "broadcast of chunk seq " + std::to_string(seq - 2));
        gpu::Device::Scope scope(*dev_);
        if (synchronize_) {
            // Not cuCtxSynchronize: that would also wait for our own queued broadcasts, which
            // complete only when receivers post theirs. Ordering the pack after the legacy
            // default stream (PyTorch's default) waits for the trainer's work and nothing else.
            legacy_->record(nullptr);
            WSYNC_CU(dev_->api(), cuStreamWaitEvent(pack_stream_.get(), legacy_->get(), 0),
                     "ordering the pack after the default stream");
        }
        // The pack table upload of the previous chunk shares the packer's staging: wait for it.
        if (seq > 1) comm_->wait(*packed_[1 - b], deadline, "packing chunk seq " + std::to_string(seq - 1));
        std::vector<gpu::PackEntry> entries(table.metas.size());
        for (std::size_t i = 0; i < entries.size(); ++i) {
            const uint64_t n = ops[i] == gpu::kPackCopy ? table.metas[i].nbytes : table.metas[i].nbytes / 2;
            entries[i] = gpu::PackEntry{reinterpret_cast<uint64_t>(tensors[i].data),
                                        buckets_[b].ptr() + table.offsets[i], n,
                                        static_cast<uint32_t>(ops[i]), 0};
        }
        packer_.pack(entries, pack_stream_.get());
        packed_[b]->record(pack_stream_.get());
        WSYNC_CU(dev_->api(), cuStreamWaitEvent(comm_stream_.get(), packed_[b]->get(), 0),
                 "ordering the broadcast after its pack");
        void *buf = reinterpret_cast<void *>(buckets_[b].ptr());
        gpu::ncclResult_t rc = nccl_.ncclBroadcast(buf, buf, bytes, gpu::ncclUint8, 0, comm_->get(),
                                                   comm_stream_.get());
        if (rc != gpu::ncclSuccess && rc != gpu::ncclInProgress) {
            comm_->abort();
            gpu::nccl_fail(nccl_, rc, std::string(kKind) + ": ncclBroadcast of chunk seq " +
                                          std::to_string(seq) + " (communicator aborted)");
        }
        sent_[b]->record(comm_stream_.get());
        ++next_seq_;
        return json{{"seq", seq}, {"bytes", bytes}};
    }

    void flush(int64_t timeout_ms) override {
        sys::Deadline deadline(timeout_ms);
        for (uint64_t s = next_seq_ > 2 ? next_seq_ - 2 : 1; s < next_seq_; ++s)
            comm_->wait(*sent_[s % 2], deadline, "flush: broadcast of chunk seq " + std::to_string(s));
    }

private:
    std::unique_ptr<gpu::Device> dev_;
    InitInfo info_;
    gpu::Cast cast_;
    bool synchronize_;
    int64_t timeout_ms_;
    std::unique_ptr<Comm> comm_;
    const gpu::NcclApi &nccl_;
    gpu::Stream pack_stream_, comm_stream_;
    gpu::Packer packer_;
    gpu::DeviceBuffer buckets_[2];
    std::unique_ptr<gpu::Event> packed_[2], sent_[2], legacy_;
    uint64_t next_seq_ = 1;
};

// ---------------------------------------------------------------------------------------------
class NcclBacking final : public ChunkBacking {
public:
    NcclBacking(const gpu::Device &dev, CUdeviceptr base, const std::vector<uint64_t> &offsets,
                bool synchronize)
        : dev_(dev), base_(base), offsets_(offsets), synchronize_(synchronize) {}
    const void *data(std::size_t i) const override {
        return reinterpret_cast<const void *>(base_ + offsets_[i]);
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CUDA, dev_.ordinal()}; }
    bool read_only() const override { return true; }
    void acknowledge(wsync_status_t) noexcept override {
        // The next chunk is broadcast into the same bucket: copies out of these views first.
        if (!synchronize_) return;
        try {
            gpu::Device::Scope scope(dev_);
            dev_.api().cuCtxSynchronize();
        } catch (...) {
        }
    }

private:
    const gpu::Device &dev_;
    CUdeviceptr base_;
    std::vector<uint64_t> offsets_;
    bool synchronize_;
};

class NcclReceiver final : public ReceiverImpl {
public:
    NcclReceiver(const gpu::NcclApi &nccl, std::unique_ptr<gpu::Device> dev, const InitInfo &info,
                 uint32_t index, bool synchronize, int64_t timeout_ms)
        : dev_(std::move(dev)), info_(info), rank_(static_cast<int>(index) + 1),
          synchronize_(synchronize), timeout_ms_(timeout_ms),
          comm_(std::make_unique<Comm>(nccl, *dev_, info, rank_, timeout_ms)), nccl_(nccl),
          stream_(*dev_), bucket_(*dev_, info.bucket_bytes, "nccl_broadcast receive bucket"),
          done_(*dev_) {}

    ~NcclReceiver() override { comm_.reset(); }

    bool verify_checksums() const override { return false; }

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
        comm_->check("before receiving chunk seq " + std::to_string(seq));
        if (table.metas.empty()) {  // a commit without data: no broadcast was posted
            last_seq_ = seq;
            return std::make_unique<NcclBacking>(*dev_, bucket_.ptr(), table.offsets, false);
        }
        {
            gpu::Device::Scope scope(*dev_);
            void *buf = reinterpret_cast<void *>(bucket_.ptr());
            gpu::ncclResult_t rc = nccl_.ncclBroadcast(buf, buf, bytes, gpu::ncclUint8, 0,
                                                       comm_->get(), stream_.get());
            if (rc != gpu::ncclSuccess && rc != gpu::ncclInProgress) {
                comm_->abort();
                gpu::nccl_fail(nccl_, rc, std::string(kKind) + ": ncclBroadcast receiving chunk seq " +
                                              std::to_string(seq) + " (communicator aborted)");
            }
            done_.record(stream_.get());
        }
        last_seq_ = seq;
        comm_->wait(done_, sys::Deadline(timeout_ms_),
                    "receiving chunk seq " + std::to_string(seq) + " (" + std::to_string(bytes) +
                        " bytes) from rank 0");
        return std::make_unique<NcclBacking>(*dev_, bucket_.ptr(), table.offsets, synchronize_);
    }

private:
    std::unique_ptr<gpu::Device> dev_;
    InitInfo info_;
    int rank_;
    bool synchronize_;
    int64_t timeout_ms_;
    std::unique_ptr<Comm> comm_;
    const gpu::NcclApi &nccl_;
    gpu::Stream stream_;
    gpu::DeviceBuffer bucket_;
    gpu::Event done_;
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
