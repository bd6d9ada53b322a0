#include "transport/nccl/sender.hpp"

#include <vector>

#include "error.hpp"
#include "gpu/delta_coder.hpp"
#include "gpu/pack.hpp"
#include "transport/nccl/comm.hpp"
#include "transport/nccl/ledger.hpp"

namespace wsync::nccl {
namespace {

void check_device(const wsync_tensor_t *tensors, const TensorTable &table, int ordinal) {
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const wsync_device_t d = tensors[i].device;
        if (d.type != WSYNC_DEVICE_CUDA || d.index != ordinal)
            fail(WSYNC_ERR_UNSUPPORTED, std::string(kKind) + ": tensor '" + table.metas[i].name +
                                            "' is on " + device_name(d) + "; this sender broadcasts from cuda:" +
                                            std::to_string(ordinal) + " (option 'device')");
    }
}

class NcclSender final : public SenderImpl {
public:
    NcclSender(const gpu::NcclApi &nccl, std::unique_ptr<gpu::Device> dev, const InitInfo &info,
               std::unique_ptr<Listener> listener, bool synchronize, int64_t timeout_ms)
        : dev_(std::move(dev)), info_(info), cast_(gpu::parse_cast(info.dtype)),
          synchronize_(synchronize), timeout_ms_(timeout_ms),
          ledger_(std::move(listener), info.nranks - 1, info.group),
          comm_(std::make_unique<Comm>(nccl, *dev_, info, 0, timeout_ms)),
          pack_stream_(*dev_), comm_stream_(*dev_), packer_(*dev_), packed_(*dev_), legacy_(*dev_) {
        for (int b = 0; b < 2; ++b) {
            buckets_[b] = gpu::DeviceBuffer(*dev_, info.bucket_bytes, "nccl_broadcast bucket");
            sent_[b] = std::make_unique<gpu::Event>(*dev_);
        }
    }

    ~NcclSender() override { comm_.reset(); }  // bounded: Comm::close

    void set_stream(void *stream) override { order_stream_ = gpu::ordering_stream(stream); }

    std::unique_ptr<delta::Coder> delta_coder(const delta::Config &config) override {
        return std::make_unique<gpu::DeviceCoder>(dev_->api(), config, kKind, timeout_ms_, synchronize_);
    }

    json send(const ChunkHeader &header, const wsync_tensor_t *tensors, TensorTable &table) override {
        ledger_.pump(0);
        if (table.metas.empty()) {
            // A commit without data moves nothing: both sides skip the broadcast.
            comm_->check("before committing");
            json out = request(next_seq_, 0);
            ledger_.sent(next_seq_++, header.version, header.chunk_index, 0);
            return out;
        }
        check_device(tensors, table, dev_->ordinal());
        gpu::check_sources(*dev_, tensors, table.metas, kKind);
        std::vector<gpu::PackOp> ops;
        const uint64_t bytes = gpu::layout_bucket(table, cast_, info_.bucket_bytes, &ops, kKind);
        comm_->check("before sending");
        const uint64_t seq = next_seq_;
        const int b = static_cast<int>(seq % 2);
        const std::string chunk = "chunk seq " + std::to_string(seq);
        sys::Deadline deadline(timeout_ms_);
        // The bucket's previous broadcast (chunk seq - 2) must be complete before we overwrite it,
        // unless its version was abandoned: receivers that have not drained it yet (the requests
        // from this one on tell them to) discard what they get, and NCCL runs it before this
        // chunk's broadcast, which is queued after it on the same stream.
        if (seq > 2 && !ledger_.abandoned_bytes(seq - 2))
            comm_->wait(*sent_[b], deadline,
                        "broadcast of chunk seq " + std::to_string(seq - 2) + " (its bucket is needed for " +
                            chunk + ")");
        gpu::Device::Scope scope(*dev_);
        pack(tensors, table, ops, b, deadline, chunk);
        comm_->broadcast(reinterpret_cast<void *>(buckets_[b].ptr()), bytes, comm_stream_.get(),
                         deadline, "sending " + chunk + " (" + std::to_string(bytes) + " bytes)");
        sent_[b]->record(comm_stream_.get());  // after the broadcast: Comm::broadcast enqueued it
        json out = request(seq, bytes);
        ledger_.sent(seq, header.version, header.chunk_index, bytes);
        ++next_seq_;
        return out;
    }

    // Waits for every receiver's outcome of every chunk (the control channel), so a failure, a
    // death or a stall is named by receiver; then for this rank's own last broadcasts.
    void flush(int64_t timeout_ms) override {
        sys::Deadline deadline(timeout_ms);
        comm_->check("flush");
        ledger_.wait(deadline, [this](bool died) { return give_up(died); });
        for (uint64_t s = next_seq_ > 2 ? next_seq_ - 2 : 1; s < next_seq_; ++s)
            if (!ledger_.abandoned_bytes(s))
                comm_->wait(*sent_[s % 2], deadline, "flush: broadcast of chunk seq " + std::to_string(s));
    }

    void abandon(uint64_t version) override { ledger_.abandon(version); }

private:
    // A request's transport map. "drain" lists the broadcasts of abandoned versions that some
    // receiver may not have joined yet ([seq, bytes] pairs): every rank must join each
    // broadcast, in order, so a receiver joins and discards those before this one.
    json request(uint64_t seq, uint64_t bytes) const {
        json out{{"group", info_.group}, {"seq", seq}, {"bytes", bytes}};
        json drain = json::array();
        for (uint64_t s : ledger_.undrained(seq)) drain.push_back({s, ledger_.abandoned_bytes(s)});
        if (!drain.empty()) out["drain"] = std::move(drain);
        return out;
    }

    // A receiver died or stalled (flush): a rank that died can join no later broadcast, and
    // one of this rank's broadcasts that a stalled rank never joined never completes, so the
    // communicator is aborted rather than left with a queued broadcast (later calls report
    // that). Returns the text the flush's error ends with.
    std::string give_up(bool died) {
        bool pending = false;
        for (uint64_t s = next_seq_ > 2 ? next_seq_ - 2 : 1; s < next_seq_; ++s)
            if (!sent_[s % 2]->done()) pending = true;
        if (!died && !pending) return "";
        comm_->abort();
        return std::string("; communicator aborted (") +
               (died ? "a rank that died can join no later broadcast"
                     : "a broadcast the stalled receiver never joined cannot complete") +
               "): make a new sender and receivers from new init info";
    }

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
        std::vector<gpu::PackEntry> entries;
        gpu::fill_pack_entries(tensors, table, ops, buckets_[b].ptr(), &entries);
        packer_.pack(entries, pack_stream_.get());
        packed_.record(pack_stream_.get());
        gpu::Backoff backoff;
        while (!packed_.done()) {
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
            backoff.pause();
        }
    }

    std::unique_ptr<gpu::Device> dev_;
    InitInfo info_;
    gpu::Cast cast_;
    bool synchronize_;
    int64_t timeout_ms_;
    Ledger ledger_;
    std::unique_ptr<Comm> comm_;
    gpu::Stream pack_stream_, comm_stream_;
    gpu::Packer packer_;
    gpu::Event packed_, legacy_;
    gpu::CUstream order_stream_ = gpu::CU_STREAM_LEGACY;  // set_stream(): the trainer's writes
    gpu::DeviceBuffer buckets_[2];
    std::unique_ptr<gpu::Event> sent_[2];
    uint64_t next_seq_ = 1;
};

}  // namespace

std::unique_ptr<SenderImpl> make_sender(const gpu::NcclApi &nccl, std::unique_ptr<gpu::Device> dev,
                                        const InitInfo &info, std::unique_ptr<Listener> listener,
                                        bool synchronize, int64_t timeout_ms) {
    return std::make_unique<NcclSender>(nccl, std::move(dev), info, std::move(listener), synchronize,
                                        timeout_ms);
}

}  // namespace wsync::nccl
