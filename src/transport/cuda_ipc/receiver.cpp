#include "transport/cuda_ipc/receiver.hpp"

#include <cinttypes>
#include <cstring>
#include <mutex>
#include <vector>

#include "error.hpp"
#include "plan/layout.hpp"
#include "gpu/destination.hpp"
#include "gpu/device.hpp"
#include "gpu/diff.hpp"
#include "gpu/pack.hpp"
#include "transport/cuda_ipc/ack_queue.hpp"
#include "transport/cuda_ipc/handle_cache.hpp"
#include "transport/cuda_ipc/request.hpp"
#include "transport/cuda_ipc/stale_work.hpp"
#include "transport/cuda_ipc/vmm.hpp"

namespace wsync::cuda_ipc {
namespace {

using gpu::CUdeviceptr;
using gpu::CUipcMemHandle;

class IpcBacking final : public ChunkBacking {
public:
    IpcBacking(std::shared_ptr<local::ReceiverEnd> end, const gpu::Device &dev, gpu::Event *legacy,
               AckQueue *acks, gpu::CUstream stream, HandleCache &cache, int64_t timeout_ms,
               const ChunkHeader &h, local::ChunkAt at,
               std::vector<CUdeviceptr> ptrs, std::function<gpu::DeltaKernels &()> kernels,
               std::function<gpu::Packer &()> packer, StaleWork *stale)
        : end_(std::move(end)), dev_(dev), legacy_(legacy), acks_(acks), stream_(stream),
          cache_(cache), timeout_ms_(timeout_ms),
          header_(h), at_(at), ptrs_(std::move(ptrs)),
          kernels_(std::move(kernels)), packer_(std::move(packer)), stale_(stale) {}

    const void *data(std::size_t i) const override {
        return reinterpret_cast<const void *>(ptrs_[i]);
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CUDA, dev_.ordinal()}; }
    bool read_only() const override { return true; }

    // The copy goes on the loader's stream (wsync_receiver_set_stream, else the legacy default
    // stream), like a loader's own cudaMemcpyAsync out of a view, so settle()'s event covers it.
    bool copy_to_device(void *dst, const void *src, uint64_t len,
                        const std::function<std::string()> &what) override {
        gpu::queue_copy_to_device(dev_, stream_, dst, src, len, what, kKind);
        return true;
    }

    // wsync_recv_apply: the chunk's dense copies on the loader's stream, small ones as one
    // launch of the pack kernel and large ones by the driver's device copy (gpu::Packer; they
    // read this chunk's mapped memory and write the engine's destinations), so settle()'s
    // event covers them like a copy_to_device().
    bool copy_batch_to_device(const std::vector<DeviceCopy> &copies,
                              const std::function<std::string()> &what, BatchQueued *queued) override {
        // A GPU older than 8.0 runs no libwsync kernel: the entries are copied one by one.
        if (dev_.compute_capability() != 0 && dev_.compute_capability() < 80) return false;
        std::vector<gpu::PackEntry> entries(copies.size());
        uint64_t tile = 0;
        for (std::size_t k = 0; k < copies.size(); ++k) {
            entries[k] = gpu::PackEntry{reinterpret_cast<uint64_t>(copies[k].src),
                                        reinterpret_cast<uint64_t>(copies[k].dst), copies[k].len,
                                        gpu::kPackCopy, static_cast<uint32_t>(tile)};
            tile += gpu::pack_tiles(entries[k]);
            if (tile > UINT32_MAX) return false;  // beyond one launch's tile index: copy one by one
        }
        try {
            const gpu::Packer::Queued q = packer_().pack(entries, stream_);
            queued->launches = q.launches;
            queued->driver_copies = q.driver_copies;
        } catch (const Error &e) {
            fail(e.status(), std::string(kKind) + ": queuing the copies of " + what() + ": " + e.what());
        }
        return true;
    }

    // A patch made on the trainer's GPU, applied on this GPU into the engine's memory with the
    // delta kernels, on the loader's stream (after its earlier work on dst), verified, with no
    // host wait; patch_outcomes() waits once for all of a chunk's when the iteration ends.
    bool queue_patch(void *dst, const DevicePatch &p, const std::string &what) override {
        kernels_().queue_one(dst, p.patch, p.patch_bytes, p.elements, p.esize, p.base_hash,
                             p.result_hash, stream_, sys::Deadline(timeout_ms_), what, kKind);
        return true;
    }
    std::vector<delta::PatchOutcome> patch_outcomes(const std::string &what) override {
        try {
            return kernels_().collect(sys::Deadline(timeout_ms_), std::string(kKind) + ": " + what);
        } catch (const Error &e) {
            if (e.status() == WSYNC_ERR_TIMEOUT) unfinished_ = true;
            throw;
        }
    }

    // The loader's copies out of the views must be complete before the sender reuses the
    // memory: they are queued on the legacy default stream (or ordered before it), so an event
    // recorded there and polled against the deadline covers them, without waiting for the
    // engine's other streams. Also after a failure: copies may still be reading the views.
    //
    // A chunk that does not end its version and loaded fine does not wait here: its
    // acknowledgement goes to the AckQueue, published when its event completes, so the loader
    // takes the next chunk meanwhile. The chunk that ends the version (and any failed chunk)
    // first drains the queue: a failed earlier chunk fails it too, so the version never
    // completes on this receiver, and the trainer has heard of that chunk already.
    wsync_status_t settle(wsync_status_t outcome, std::string *message) noexcept override {
        if (acks_ && legacy_ && outcome == WSYNC_OK && !header_.last) {
            deferred_ = true;
            return outcome;
        }
        if (acks_) {
            std::string why;
            const wsync_status_t earlier = acks_->drain(header_.version, &why);
            if (earlier != WSYNC_OK && outcome == WSYNC_OK) {
                outcome = earlier;
                *message = why;
            }
        }
        // A wait for this stream already ended at its deadline (the chunk's patches): waiting
        // again would only double the time the engine waits for the same stuck work.
        if (!legacy_ || unfinished_) return outcome;
        std::string why;
        const wsync_status_t waited = settle_now(&why);
        if (waited != WSYNC_OK && outcome == WSYNC_OK) {
            *message = why;
            return waited;
        }
        // The copies of the whole version are complete (drained above): the iteration asks
        // revoked() now, and if this receiver was not dropped by then, the sender reused none
        // of its buckets under them.
        return outcome;
    }

    std::string revoked() const noexcept override { return end_->dropped_text(); }

    void acknowledge(wsync_status_t outcome) noexcept override {
        if (deferred_) {
            try {
                acks_->defer(stream_, header_, at_.slot, at_.seq);
                return;
            } catch (...) {  // no event to defer on: wait here after all
                deferred_ = false;
                std::string why;
                if (settle_now(&why) != WSYNC_OK) {
                    end_->record_failure(header_, WSYNC_ERR_SYSTEM, why);
                    outcome = WSYNC_ERR_SYSTEM;
                }
            }
        }
        // Work the loader's stream has not run by the deadline may still read memory mapped
        // from the sender: no mapping closes, and no version is released, until it completed
        // (closing would wait for that work without a bound, or pull memory from under it);
        // a later version's release then closes what is unused.
        if (unfinished_) stale_->mark(stream_);
        if (header_.last && stale_->settled())
            release_through(end_->board(), end_->index(), cache_, header_.version);
        end_->acknowledge(at_, outcome);
    }

private:
    // Waits (deadline: the receiver's timeout) for the work queued on the loader's stream so
    // far. WSYNC_OK, or the status and *why of a failed or late wait.
    wsync_status_t settle_now(std::string *why) noexcept {
        const std::string chunk = "chunk " + std::to_string(header_.chunk_index) + " of version " +
                                  std::to_string(header_.version);
        const std::string work = std::string(kKind) + ": receiver " + std::to_string(end_->index()) +
                                 ": the loader's work on " + gpu::stream_text(stream_) + " of " +
                                 dev_.uuid_string();
        try {
            legacy_->record(stream_);
            gpu::poll_until([&] { return legacy_->done(); }, sys::Deadline(timeout_ms_),
                            work + " after " + chunk);
            return WSYNC_OK;
        } catch (const Error &e) {
            if (e.status() == WSYNC_ERR_TIMEOUT) unfinished_ = true;
            *why = e.status() == WSYNC_ERR_TIMEOUT ? std::string(e.what())
                                                   : work + " failed after " + chunk + ": " + e.what();
            return e.status();
        } catch (...) {
            *why = std::string(kKind) + ": " + chunk + ": waiting for the loader's work failed";
            return WSYNC_ERR_SYSTEM;
        }
    }

    std::shared_ptr<local::ReceiverEnd> end_;
    const gpu::Device &dev_;
    gpu::Event *legacy_;  // null: "synchronize" is off
    AckQueue *acks_;      // null: acknowledged when the iteration ends, as "synchronize" says
    bool deferred_ = false;  // settle() left the acknowledgement to acks_
    bool unfinished_ = false;  // a wait for the loader's stream ended at its deadline
    gpu::CUstream stream_;  // the loader's stream, whose work releases the chunk
    HandleCache &cache_;
    int64_t timeout_ms_;
    ChunkHeader header_;
    local::ChunkAt at_;
    std::vector<CUdeviceptr> ptrs_;
    std::function<gpu::DeltaKernels &()> kernels_;  // the receiver's, made at the first patch
    std::function<gpu::Packer &()> packer_;          // the receiver's, made at the first apply
    StaleWork *stale_;                               // the receiver's
};

class IpcReceiver final : public ReceiverImpl {
public:
    IpcReceiver(const gpu::CudaApi &api, std::shared_ptr<SharedSegment> seg, const InitInfo &info,
                uint32_t index, int ordinal, bool synchronize, int64_t timeout_ms)
        : end_(std::make_shared<local::ReceiverEnd>(std::move(seg), index, "slot")), info_(info),
          dev_(std::make_unique<gpu::Device>(api, ordinal, kKind)), cache_(*dev_),
          timeout_ms_(timeout_ms), stale_(*dev_) {
        if (synchronize) {
            legacy_ = std::make_unique<gpu::Event>(*dev_);
            acks_ = std::make_unique<AckQueue>(*dev_, end_, timeout_ms_);
        }
        board::attach(end_->board(), end_->segment().lock_fd(), index, kKind);
    }

    ~IpcReceiver() override {
        // Chunks still being copied are waited for (bounded) and acknowledged before any
        // mapping closes; every mapping is closed before the sender learns that this receiver
        // is gone.
        acks_.reset();
        // Work a wait gave up on may still read the mappings: wait for it (bounded), else
        // leave them to the driver rather than close them under it.
        try {
            gpu::poll_until([&] { return stale_.settled(); }, sys::Deadline(timeout_ms_), "stale work");
        } catch (...) {
        }
        if (!stale_.settled()) {
            // That work may still read the trainer's memory when its stream moves: this
            // receiver stays on the board attached and unreleased (its segment, and with it its
            // liveness lock, kept until the process exits), so the sender keeps that memory (a
            // sender's destroy waits "release_timeout_ms" and then leaves its buckets
            // allocated) instead of freeing it under the work. The mappings, and the modules
            // of kernels the work may run, are left to the driver at exit.
            cache_.abandon();
            (void)packer_.release();
            (void)delta_.release();
            gpu::keep_until_exit(std::move(dev_));
            keep_segment_until_exit(end_->segment_ptr());
            return;
        }
        cache_.close_all();
        board::release(end_->board(), end_->index(), board::kAllReleased);
        end_->detach();
    }

    bool verify_checksums() const override { return false; }
    bool orders_loader_work() const override { return legacy_ != nullptr; }  // "synchronize"

    void set_stream(void *stream) override { order_stream_ = gpu::ordering_stream(stream); }

    DestMemory describe_destination(void *data, uint64_t len,
                                    const std::function<std::string()> &what) const override {
        return gpu::describe_device_destination(*dev_, data, len, what, kKind);
    }
    void recheck_destination(const DestMemory &mem, const std::function<std::string()> &what) const override {
        gpu::recheck_device_destination(*dev_, mem, what);
    }

    Link link() const override { return end_->link(); }

    // A request of another sync (another trainer's board, or a restarted trainer's) is refused
    // before its seq is looked at, leaving this receiver as it was. A request without
    // "segment" (a sender from before the field) is judged by its seq alone, as it was then.
    void check_addressed(const json &transport) const override {
        const std::string segment = segment_of(transport);
        if (!segment.empty() && segment != info_.segment)
            failf(WSYNC_ERR_MISMATCH,
                  "cuda_ipc: request is of the sync of board '%s', this receiver is attached to "
                  "'%s' (another trainer's, or a restarted one's: left unchanged)",
                  wire::printable(segment).c_str(), info_.segment.c_str());
    }

    void refuse(const ChunkHeader &h, const json &transport, wsync_status_t status,
                const std::string &message, bool record) noexcept override {
        try {
            end_->refuse(h, end_->locate(transport, "cuda_ipc request"), status, message, record, [&] {
                if (h.last && stale_.settled())
                    release_through(end_->board(), end_->index(), cache_, h.version);
            });
        } catch (...) {
        }
    }

    void record_failure(const ChunkHeader &h, wsync_status_t status,
                        const std::string &message) noexcept override {
        end_->record_failure(h, status, message);
    }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &header, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "cuda_ipc request";
        const local::ChunkAt at = end_->locate(transport, w);
        if (wire::bool_field(transport, "packed", w) != info_.packed)
            fail(WSYNC_ERR_MISMATCH, w + ": packed mode differs from the init info's");
        const auto &parts = wire::array_field(transport, "parts", w, board::kMaxReceivers);
        const bool commit = table.metas.empty();  // a commit without data
        end_->take(at, commit ? "commit request" : "request", commit);
        if (commit) {
            end_->given(at);
            return std::make_unique<IpcBacking>(end_, *dev_, nullptr, acks_.get(), order_stream_,
                                                cache_, timeout_ms_, header, at,
                                                std::vector<CUdeviceptr>{}, delta_kernels(), packer(), &stale_);
        }
        const json &part = part_for_this_gpu(parts, w);
        std::vector<CUdeviceptr> ptrs = info_.packed ? packed_views(part, table, header, w)
                                                     : shared_views(part, table, header, w);
        end_->given(at);
        return std::make_unique<IpcBacking>(end_, *dev_, legacy_.get(), acks_.get(), order_stream_,
                                            cache_, timeout_ms_, header, at,
                                            std::move(ptrs), delta_kernels(), packer(), &stale_);
    }

private:
    // The one part for this receiver's GPU, chosen by exact UUID.
    const json &part_for_this_gpu(const json::array_t &parts, const std::string &w) {
        const json *mine = nullptr;
        std::string seen;
        for (std::size_t i = 0; i < parts.size(); ++i) {
            const std::string where = w + ".parts[" + std::to_string(i) + "]";
            const std::string &text = wire::string_field(parts[i], "uuid", where, 64);
            gpu::CUuuid u;
            if (!gpu::parse_uuid(text, &u)) wire::malformed(where + ".uuid '" + text + "' is not a GPU UUID");
            seen += (seen.empty() ? "" : ", ") + text;
            if (std::memcmp(u.bytes, dev_->uuid().bytes, 16) != 0) continue;
            if (mine)
                wire::malformed(w + ": two parts for " + dev_->uuid_string() +
                                " (each GPU must appear once)");
            mine = &parts[i];
        }
        if (!mine)
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": the request has no part for this receiver's GPU " +
                                         dev_->uuid_string() + " (device " +
                                         std::to_string(dev_->ordinal()) + "); it has parts for [" +
                                         seen + "]");
        return *mine;
    }

    std::vector<CUdeviceptr> packed_views(const json &part, const TensorTable &table,
                                          const ChunkHeader &header, const std::string &w) {
        CUipcMemHandle h = decode_handle(wire::field(part, "handle", w), w + ".handle");
        uint64_t bytes = wire::uint_field(part, "bytes", w, uint64_t(1) << 40);
        if (bytes != info_.bucket_bytes)
            wire::malformed(w + ": bucket of " + std::to_string(bytes) + " bytes, the init info says " +
                            std::to_string(info_.bucket_bytes));
        layout::check(table, bytes, w, "bucket");
        gpu::Device::Scope scope(*dev_);
        CUdeviceptr base = cache_.get(h, header.version, "a packed bucket");
        std::vector<CUdeviceptr> ptrs(table.metas.size());
        for (std::size_t i = 0; i < ptrs.size(); ++i) ptrs[i] = base + table.offsets[i];
        return ptrs;
    }

    std::vector<CUdeviceptr> shared_views(const json &part, const TensorTable &table,
                                          const ChunkHeader &header, const std::string &w) {
        const std::size_t n = table.metas.size();
        const auto &handles = wire::array_field(part, "handles", w, n);
        const auto &sizes = wire::array_field(part, "sizes", w, n);
        const auto &alloc = wire::array_field(part, "alloc", w, n);
        const auto &offset = wire::array_field(part, "offset", w, n);
        // Virtual-memory runs (vmm.hpp): "alloc" past the handles picks one.
        VmmRuns vmm;
        std::vector<uint64_t> run_bytes;
        if (part.contains("vmm")) {
            vmm = read_vmm_runs(wire::object_field(part, "vmm", w), w + ".vmm");
            for (const auto &run : vmm.runs) {
                uint64_t bytes = 0;
                for (const VmmPiece &piece : run) bytes += piece.bytes;
                run_bytes.push_back(bytes);
            }
        }
        const std::size_t places = handles.size() + vmm.runs.size();
        if (places == 0 || sizes.size() != handles.size() || alloc.size() != n || offset.size() != n)
            wire::malformed(w + ": handles/sizes/alloc/offset columns have inconsistent lengths");
        // Validate every column before opening anything.
        std::vector<uint64_t> size(places);
        for (std::size_t k = 0; k < handles.size(); ++k)
            size[k] = wire::as_uint(sizes[k], w + ".sizes[" + std::to_string(k) + "]", uint64_t(1) << 48);
        for (std::size_t r = 0; r < vmm.runs.size(); ++r) size[handles.size() + r] = run_bytes[r];
        std::vector<std::size_t> which(n);
        std::vector<uint64_t> off(n);
        for (std::size_t i = 0; i < n; ++i) {
            const std::string where = w + ": tensor '" + table.metas[i].name + "'";
            which[i] = wire::as_uint(alloc[i], where + " alloc", places - 1);
            off[i] = wire::as_uint(offset[i], where + " offset", uint64_t(1) << 48);
            uint64_t nb = table.metas[i].nbytes, cap = size[which[i]];
            if (nb > cap || off[i] > cap - nb)
                wire::malformed(where + " at offset " + std::to_string(off[i]) + " (+" +
                                std::to_string(nb) + " bytes) is outside its " +
                                std::to_string(cap) + "-byte allocation");
        }
        std::vector<CUipcMemHandle> hs;
        for (std::size_t k = 0; k < handles.size(); ++k)
            hs.push_back(decode_handle(handles[k], w + ".handles[" + std::to_string(k) + "]"));
        gpu::Device::Scope scope(*dev_);
        std::vector<CUdeviceptr> bases(places);
        for (std::size_t k = 0; k < hs.size(); ++k)
            bases[k] = cache_.get(hs[k], header.version, "allocation " + std::to_string(k));
        const sys::Deadline deadline(timeout_ms_);
        for (std::size_t r = 0; r < vmm.runs.size(); ++r)
            bases[handles.size() + r] = cache_.get_run(vmm.socket, vmm.runs[r], header.version, deadline,
                                                       "virtual-memory run " + std::to_string(r));
        std::vector<CUdeviceptr> ptrs(n);
        for (std::size_t i = 0; i < n; ++i) ptrs[i] = bases[which[i]] + off[i];
        return ptrs;
    }

    // The pack kernel on this receiver's GPU (wsync_recv_apply's launches), loaded at the
    // first apply.
    std::function<gpu::Packer &()> packer() {
        return [this]() -> gpu::Packer & {
            if (!packer_) packer_ = std::make_unique<gpu::Packer>(*dev_);
            return *packer_;
        };
    }

    // The delta kernels on this receiver's GPU, loaded at the first patch it applies.
    std::function<gpu::DeltaKernels &()> delta_kernels() {
        return [this]() -> gpu::DeltaKernels & {
            if (!delta_) delta_ = std::make_unique<gpu::DeltaKernels>(*dev_);
            return *delta_;
        };
    }

    std::shared_ptr<local::ReceiverEnd> end_;  // before acks_, whose thread uses it
    InitInfo info_;
    std::unique_ptr<gpu::Device> dev_;
    std::unique_ptr<gpu::DeltaKernels> delta_;  // after dev_: destroyed before it
    std::unique_ptr<gpu::Packer> packer_;       // likewise
    HandleCache cache_;
    int64_t timeout_ms_;
    StaleWork stale_;                     // work a wait gave up on (see StaleWork)
    std::unique_ptr<gpu::Event> legacy_;  // for settle(); null when "synchronize" is off
    std::unique_ptr<AckQueue> acks_;      // chunks acknowledged once copied; with legacy_
    gpu::CUstream order_stream_ = gpu::CU_STREAM_LEGACY;  // set_stream(): the loader's stream
};

}  // namespace

std::unique_ptr<ReceiverImpl> make_receiver(const gpu::CudaApi &api,
                                            std::shared_ptr<SharedSegment> seg,
                                            const InitInfo &info, uint32_t index, int ordinal,
                                            bool synchronize, int64_t timeout_ms) {
    return std::make_unique<IpcReceiver>(api, std::move(seg), info, index, ordinal, synchronize,
                                         timeout_ms);
}

}  // namespace wsync::cuda_ipc
