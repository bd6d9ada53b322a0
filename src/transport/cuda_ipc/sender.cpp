#include "transport/cuda_ipc/sender.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "error.hpp"
#include "gpu/delta_coder.hpp"
#include "gpu/device.hpp"
#include "gpu/pack.hpp"
#include "transport/cuda_ipc/request.hpp"
#include "transport/cuda_ipc/vmm.hpp"

namespace wsync::cuda_ipc {
namespace {

using gpu::CUdeviceptr;
using gpu::CUipcMemHandle;

// The one GPU every tensor of a chunk lives on (a sender serves one GPU).
int chunk_device(const wsync_tensor_t *tensors, const TensorTable &table) {
    const wsync_device_t d0 = tensors[0].device;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const wsync_device_t d = tensors[i].device;
        if (d.type != WSYNC_DEVICE_CUDA)
            fail(WSYNC_ERR_UNSUPPORTED, std::string(kKind) + ": tensor '" + table.metas[i].name +
                                            "' is on " + device_name(d) +
                                            "; cuda_ipc moves CUDA device memory (use shm for host memory)");
        if (d.index != d0.index)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 std::string(kKind) + ": tensor '" + table.metas[i].name + "' is on cuda:" +
                     std::to_string(d.index) + " but '" + table.metas[0].name + "' on cuda:" +
                     std::to_string(d0.index) + "; one sender serves one GPU");
    }
    return d0.index;
}

class IpcSender final : public SenderImpl {
public:
    IpcSender(const gpu::CudaApi &api, std::shared_ptr<SharedSegment> seg, const InitInfo &info,
              bool synchronize, int64_t timeout_ms, int64_t release_timeout_ms)
        : api_(api), seg_(std::move(seg)), info_(info), board_(seg_->board(), seg_->lock_fd(), seg_->receivers(), seg_->slots(), kKind),
          cast_(gpu::parse_cast(info.dtype)), synchronize_(synchronize), timeout_ms_(timeout_ms),
          release_timeout_ms_(release_timeout_ms) {
        board_.register_sender();
        // With several senders another may still publish a seq this one withdrew (board.hpp).
        board_.set_sole_sender(info.senders == 1);
        // One sender by design: one made again on this init info (a restarted trainer process,
        // a sender destroyed and re-created) goes on after its predecessor's versions and seqs
        // (board.hpp, resume). Several senders number chunks in lockstep from 1, so they
        // are made together, once per init info.
        if (info.senders == 1) {
            const auto [version, seq] = board_.resume();
            first_version_ = version + 1;
            next_seq_ = seq + 1;
        }
    }

    uint64_t first_version() const override { return first_version_; }

    ~IpcSender() override {
        // Receivers map the buckets until they are destroyed: freeing them first is undefined
        // behaviour (see strategy.cpp). Wait, bounded; what is still mapped then is left
        // to the driver, which frees it when this process exits.
        bool released = true;
        if (!buckets_.empty()) {
            released = false;
            try {
                board_.wait_released(board::kAllReleased, 0, sys::Deadline(release_timeout_ms_),
                                      "destroying the sender: waiting for receivers to unmap its buckets");
                released = true;
            } catch (...) {
            }
            if (!released)
                for (auto &b : buckets_) b.leak();
        }
        // Freed in order: the exports, the pack machinery and buckets before the device they
        // live on. Engines keep what they imported (their own handles), so the exported pieces'
        // handles go now.
        vmm_.reset();
        packer_.reset();
        done_.reset();
        legacy_.reset();
        stream_.reset();
        buckets_.clear();
        // Leaked buckets keep their context too: the last release of a primary context frees
        // its memory.
        if (released) dev_.reset();
        else gpu::keep_until_exit(std::move(dev_));
        board_.unregister_sender();
    }

    json send(const ChunkHeader &h, const wsync_tensor_t *tensors, TensorTable &table) override {
        const uint64_t first = next_seq_;
        // Receivers that (re)attached were admitted by begin_version(), which the core calls
        // before it encodes a version's first chunk: a delta sender then knows every newcomer
        // before it encodes (and sends that version dense); one that attaches later waits for
        // the next version.
        if (table.metas.empty()) {
            // A commit without data: a slot and a seq like any chunk, nothing to pack or share.
            const uint32_t slot = static_cast<uint32_t>((first - 1) % info_.slots());
            board_.wait({slot}, sys::Deadline(timeout_ms_), "no free slot", first - 1);
            board_.publish(slot, first, h.version, h.chunk_index);
            note_version(h.version, first);
            ++next_seq_;
            used_slots_ = std::max<uint32_t>(used_slots_, slot + 1);
            return json{{"segment", info_.segment}, {"seq", first}, {"slot", slot},
                        {"packed", info_.packed}, {"parts", json::array()}};
        }
        const int ordinal = chunk_device(tensors, table);
        start(ordinal);
        const uint64_t seq = next_seq_;
        const uint32_t slot = static_cast<uint32_t>((seq - 1) % info_.slots());
        sys::Deadline deadline(timeout_ms_);
        const std::string chunk = "chunk " + std::to_string(h.chunk_index) + " of version " +
                                  std::to_string(h.version);
        json part = info_.packed ? pack(tensors, table, slot, deadline, chunk)
                                 : share(tensors, table, slot, deadline, chunk, h.version);
        part["uuid"] = dev_->uuid_string();
        board_.publish(slot, seq, h.version, h.chunk_index);
        note_version(h.version, seq);
        ++next_seq_;
        used_slots_ = std::max<uint32_t>(used_slots_, slot + 1);
        seg_->unlink_if_complete();
        // "segment" names the sync (its board): a receiver of another sync refuses the request
        // before it looks at the seq (IpcReceiver::check_addressed).
        return json{{"segment", info_.segment}, {"seq", seq}, {"slot", slot},
                    {"packed", info_.packed}, {"parts", json::array({std::move(part)})}};
    }

    void flush(int64_t timeout_ms) override {
        seg_->unlink_if_complete();
        std::vector<uint32_t> all;
        for (uint32_t s = 0; s < used_slots_; ++s) all.push_back(s);
        // This sender's own chunks only: with several senders, others may have published more.
        board_.wait(all, sys::Deadline(timeout_ms), "flush timed out", next_seq_ - 1,
                    /*gather=*/true);
    }

    void abandon(uint64_t version) override { board_.abandon(version); }

    // The version's first chunk will be published as next_seq_ (it only grows on publish).
    bool begin_version(uint64_t version) override {
        if (vmm_) {  // pieces the trainer's allocator gave back are no longer exported
            gpu::Device::Scope scope(*dev_);
            vmm_->sweep(version);
        }
        return board_.admit_joiners(next_seq_) > 0;
    }

    void set_stream(void *stream) override { order_stream_ = gpu::ordering_stream(stream); }

    std::unique_ptr<delta::Coder> delta_coder(const delta::Config &config) override {
        return std::make_unique<gpu::DeviceCoder>(api_, config, kKind, timeout_ms_, synchronize_);
    }

    void wait_released(uint64_t version, int64_t timeout_ms) override {
        // packed=true copied the trainer's tensors into our buckets: nothing of theirs is mapped.
        if (info_.packed && version != board::kAllReleased) return;
        auto it = last_seq_.find(version);
        const uint64_t last = it != last_seq_.end() ? it->second : UINT64_MAX;  // unknown: all owe
        board_.wait_released(version, last, sys::Deadline(timeout_ms),
                              ("waiting for receivers to release version " +
                               (version == board::kAllReleased ? std::string("(all)")
                                                               : std::to_string(version)))
                                  .c_str());
    }

    void drop_receiver(uint32_t index) override {
        check_receiver_index(kKind, index, info_.receivers);
        board_.drop(index);
    }

private:
    void start(int ordinal) {
        if (dev_) {
            if (ordinal != dev_->ordinal())
                fail(WSYNC_ERR_INVALID_ARGUMENT,
                     std::string(kKind) + ": this sender serves cuda:" + std::to_string(dev_->ordinal()) +
                         " (" + dev_->uuid_string() + "); a chunk on cuda:" +
                         std::to_string(ordinal) + " needs a sender of its own");
            return;
        }
        dev_ = std::make_unique<gpu::Device>(api_, ordinal, kKind);
        if (!info_.packed) return;
        stream_ = std::make_unique<gpu::Stream>(*dev_);
        done_ = std::make_unique<gpu::Event>(*dev_);
        packer_ = std::make_unique<gpu::Packer>(*dev_);
        gpu::Device::Scope scope(*dev_);
        for (uint32_t b = 0; b < info_.buckets; ++b) {
            buckets_.emplace_back(*dev_, info_.bucket_bytes, "cuda_ipc bucket " + std::to_string(b));
            CUipcMemHandle h;
            WSYNC_CU(api_, cuIpcGetMemHandle(&h, buckets_.back().ptr()),
                     "cuda_ipc: cuIpcGetMemHandle for bucket " + std::to_string(b));
            bucket_handles_.push_back(h);  // made once, reused for every chunk
        }
    }

    void note_version(uint64_t version, uint64_t seq) {
        last_seq_[version] = seq;
        while (last_seq_.size() > 1024) last_seq_.erase(last_seq_.begin());
    }

    // Waits, up to the deadline, for the work queued on the caller's stream (the legacy
    // default stream unless set_stream named one): the trainer's writes to the tensors. Not for
    // the whole context: training collectives on other streams would hold a cuCtxSynchronize
    // without bound.
    void wait_default_stream(const sys::Deadline &deadline, const std::string &chunk) {
        if (!synchronize_) return;
        if (!legacy_) legacy_ = std::make_unique<gpu::Event>(*dev_);
        legacy_->record(order_stream_);
        gpu::poll_until([&] { return legacy_->done(); }, deadline,
                        "cuda_ipc: work queued on " + gpu::stream_text(order_stream_) + " of " +
                            dev_->uuid_string() + " before " + chunk);
    }

    json pack(const wsync_tensor_t *tensors, TensorTable &table, uint32_t b,
              const sys::Deadline &deadline, const std::string &chunk) {
        gpu::check_sources(*dev_, tensors, table.metas, kKind);
        std::vector<gpu::PackOp> ops;
        gpu::layout_bucket(table, cast_, info_.bucket_bytes, &ops, kKind);
        // Back-pressure: the bucket's previous chunk must be done with by every receiver.
        board_.wait({b}, deadline, "no free bucket", next_seq_ - 1);
        wait_default_stream(deadline, chunk);
        gpu::fill_pack_entries(tensors, table, ops, buckets_[b].ptr(), &entries_);
        packer_->pack(entries_, stream_->get());
        done_->record(stream_->get());
        gpu::poll_until([&] { return done_->done(); }, deadline,
                        "cuda_ipc: packing " + chunk + " into bucket " + std::to_string(b));
        return json{{"handle", encode_handle(bucket_handles_[b])}, {"bytes", info_.bucket_bytes}};
    }

    struct Allocation {
        CUdeviceptr base;
        uint64_t size;
        CUipcMemHandle handle;
    };

    json share(const wsync_tensor_t *tensors, TensorTable &table, uint32_t slot,
               const sys::Deadline &deadline, const std::string &chunk, uint64_t version) {
        // The core's table keeps a compact virtual layout (identical for every sender, so parts
        // merge); where each tensor really is travels in this sender's part.
        uint64_t end = 0;
        table.offsets.resize(table.metas.size());
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            table.offsets[i] = end;
            end += table.metas[i].nbytes;
        }
        json handles = json::array(), sizes = json::array();
        std::vector<uint64_t> offset(table.metas.size());
        std::vector<std::pair<bool, std::size_t>> where(table.metas.size());  // (run?, index)
        std::map<uint64_t, std::size_t> in_chunk;  // buffer id -> index in handles
        // Virtual memory (vmm.hpp): each such tensor's pieces, merged into the chunk's runs below.
        std::vector<std::pair<std::size_t, VmmExports::Run>> in_vmm;
        gpu::Device::Scope scope(*dev_);
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            const auto p = reinterpret_cast<CUdeviceptr>(tensors[i].data);
            const std::string who = "cuda_ipc: tensor '" + table.metas[i].name + "'";
            CUdeviceptr base = 0;
            std::size_t size = 0;
            WSYNC_CU(api_, cuMemGetAddressRange(&base, &size, p),
                     who + ": cuMemGetAddressRange (is it device memory from cuMemAlloc or a "
                           "caching allocator on it?)");
            unsigned long long id = 0;
            WSYNC_CU(api_, cuPointerGetAttribute(&id, gpu::CU_POINTER_ATTRIBUTE_BUFFER_ID, base),
                     who + ": buffer id");
            auto known = cache_.find(id);
            if (known == cache_.end() && !legacy_ipc_capable(base)) {
                if (!vmm_) vmm_ = std::make_unique<VmmExports>(*dev_, vmm_socket_name());
                in_vmm.emplace_back(i, vmm_->cover(p, table.metas[i].nbytes, table.metas[i].name, version));
                continue;
            }
            if (known == cache_.end()) {
                Allocation a{base, size, {}};
                WSYNC_CU(api_, cuIpcGetMemHandle(&a.handle, base), who + ": cuIpcGetMemHandle");
                known = cache_.emplace(id, a).first;
            }
            const Allocation &a = known->second;
            if (p - a.base + table.metas[i].nbytes > a.size)
                fail(WSYNC_ERR_INVALID_ARGUMENT, who + " runs past the end of its allocation");
            auto slot_it = in_chunk.find(id);
            if (slot_it == in_chunk.end()) {
                slot_it = in_chunk.emplace(id, handles.size()).first;
                handles.push_back(encode_handle(a.handle));
                sizes.push_back(a.size);
            }
            where[i] = {false, slot_it->second};
            offset[i] = p - a.base;
        }
        json pieces = json::array(), runs = json::array();
        merge_runs(tensors, in_vmm, &where, &offset, &pieces, &runs);
        // A tensor's "alloc": its handle's index, or for a run the number of handles plus the
        // run's index.
        json alloc = json::array();
        for (const auto &[run, index] : where) alloc.push_back(run ? handles.size() + index : index);
        board_.wait({slot}, deadline, "too many chunks in flight", next_seq_ - 1);
        wait_default_stream(deadline, chunk);
        json part = {{"handles", std::move(handles)}, {"sizes", std::move(sizes)},
                     {"alloc", std::move(alloc)}, {"offset", offset}};
        if (!runs.empty())
            part["vmm"] = {{"socket", vmm_->socket()}, {"pieces", std::move(pieces)}, {"runs", std::move(runs)}};
        return part;
    }

    // The chunk's virtual-memory runs: the tensors' pieces merged where they touch or overlap in
    // the trainer's range, so a model in one expandable segment maps as one run a chunk (one
    // reserved range, one descriptor fetch, each boundary piece once) rather than one a tensor.
    // Sets each such tensor's run and offset, and lists each piece once.
    static void merge_runs(const wsync_tensor_t *tensors,
                           std::vector<std::pair<std::size_t, VmmExports::Run>> &in_vmm,
                           std::vector<std::pair<bool, std::size_t>> *where, std::vector<uint64_t> *offset,
                           json *pieces, json *runs) {
        std::sort(in_vmm.begin(), in_vmm.end(), [&](const auto &a, const auto &b) {
            return reinterpret_cast<uintptr_t>(tensors[a.first].data) < reinterpret_cast<uintptr_t>(tensors[b.first].data);
        });
        struct Merged {
            CUdeviceptr base, end;
            std::vector<VmmPiece> pieces;
        };
        std::vector<Merged> merged;
        for (const auto &[i, run] : in_vmm) {
            CUdeviceptr end = run.base;
            for (const VmmPiece &piece : run.pieces) end += piece.bytes;
            if (merged.empty() || run.base > merged.back().end) {
                merged.push_back({run.base, end, run.pieces});
            } else {  // touches or overlaps the run before: its pieces past that run's end join it
                CUdeviceptr at = run.base;
                for (const VmmPiece &piece : run.pieces) {
                    if (at >= merged.back().end) {
                        merged.back().pieces.push_back(piece);
                        merged.back().end = at + piece.bytes;
                    }
                    at += piece.bytes;
                }
            }
            (*where)[i] = {true, merged.size() - 1};
            (*offset)[i] = reinterpret_cast<CUdeviceptr>(tensors[i].data) - merged.back().base;
        }
        std::map<uint64_t, std::size_t> piece_at;  // key -> index in pieces
        for (const Merged &m : merged) {
            json indices = json::array();
            for (const VmmPiece &piece : m.pieces) {
                auto at = piece_at.find(piece.key);
                if (at == piece_at.end()) {
                    at = piece_at.emplace(piece.key, pieces->size()).first;
                    pieces->push_back(json::array({piece.key, piece.bytes}));
                }
                indices.push_back(at->second);
            }
            runs->push_back(std::move(indices));
        }
    }

    // Memory from a stream-ordered pool (cudaMallocAsync) or the virtual memory management API
    // (PyTorch's expandable segments) cannot be exported with cuIpcGetMemHandle: the driver
    // says so through CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ("1 if this pointer maps
    // to an allocation that is suitable for cudaIpcGetMemHandle, 0 otherwise"; CUDA Driver API,
    // cuPointerGetAttribute). Such memory goes by its virtual-memory handles (vmm.hpp), which
    // a pool's is refused by name. A driver too old to know the attribute answers
    // CUDA_ERROR_INVALID_VALUE: then cuIpcGetMemHandle decides.
    bool legacy_ipc_capable(CUdeviceptr base) {
        int capable = 1;
        if (api_.cuPointerGetAttribute(&capable, gpu::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                       base) != gpu::CUDA_SUCCESS)
            return true;
        return capable != 0;
    }

    // The abstract socket that serves this sender's virtual-memory descriptors: unique per
    // sync, process and sender.
    std::string vmm_socket_name() const {
        static std::atomic<uint64_t> made{0};
        return "wsync-vmm-" + info_.segment + "-" + std::to_string(getpid()) + "-" +
               std::to_string(++made);
    }

    const gpu::CudaApi &api_;
    std::shared_ptr<SharedSegment> seg_;
    InitInfo info_;
    board::SenderEnd board_;
    gpu::Cast cast_;
    bool synchronize_;
    gpu::CUstream order_stream_ = gpu::CU_STREAM_LEGACY;  // set_stream(); writes to order after
    int64_t timeout_ms_;
    int64_t release_timeout_ms_;
    std::map<uint64_t, uint64_t> last_seq_;  // version -> seq of its last chunk sent here
    std::unique_ptr<gpu::Event> legacy_;     // marks the legacy default stream's queued work
    uint64_t next_seq_ = 1;
    uint64_t first_version_ = 1;
    uint32_t used_slots_ = 0;
    std::unique_ptr<gpu::Device> dev_;
    std::unique_ptr<gpu::Stream> stream_;
    std::unique_ptr<gpu::Event> done_;
    std::unique_ptr<gpu::Packer> packer_;
    std::vector<gpu::DeviceBuffer> buckets_;
    std::vector<CUipcMemHandle> bucket_handles_;
    std::vector<gpu::PackEntry> entries_;
    // packed=false: allocation handles by the driver's buffer id, which is never reused in a
    // process, so a freed and re-made allocation at the same address cannot hit a stale entry.
    std::map<unsigned long long, Allocation> cache_;
    std::unique_ptr<VmmExports> vmm_;  // packed=false: virtual-memory pieces (at the first)
};

}  // namespace

std::unique_ptr<SenderImpl> make_sender(const gpu::CudaApi &api, std::shared_ptr<SharedSegment> seg,
                                        const InitInfo &info, bool synchronize, int64_t timeout_ms,
                                        int64_t release_timeout_ms) {
    return std::make_unique<IpcSender>(api, std::move(seg), info, synchronize, timeout_ms,
                                       release_timeout_ms);
}

}  // namespace wsync::cuda_ipc
