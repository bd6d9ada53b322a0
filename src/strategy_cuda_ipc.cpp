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
// Ordering: a sender finishes its work on the GPU (synchronise, pack, wait for the pack with a
// deadline) before it returns the request, so a request never describes bytes still in flight.
// A receiver synchronises its device before acknowledging, so the loader's copies out of the
// views are complete before the sender may reuse the bucket or the trainer may write its
// tensors. Acknowledgements travel through the acknowledgement board (board.cpp) in a small
// shared-memory segment named in the init info; the GPU bytes never touch host memory.
#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <new>
#include <sys/mman.h>
#include <unistd.h>

#include "board.hpp"
#include "error.hpp"
#include "gpu_util.hpp"
#include "strategy.hpp"

namespace wsync {
namespace {

using gpu::CUdeviceptr;
using gpu::CUipcMemHandle;

constexpr const char *kKind = "cuda_ipc";
constexpr uint32_t kUnpackedSlots = 16;  // chunks in flight before send_chunk waits (packed=false)
constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'I', 'P', 'C'};
constexpr uint32_t kLayoutVersion = 1;

const std::vector<OptionSpec> &ipc_options() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        {"receivers", T::UInt, 1, 1, board::kMaxReceivers, "sender",
         "number of receivers (engines) that must acknowledge every chunk"},
        {"senders", T::UInt, 1, 1, board::kMaxReceivers, "sender",
         "number of senders (trainer processes, one per GPU) whose partial requests are merged "
         "with wsync_request_merge for every chunk"},
        {"packed", T::Bool, 1, 0, 1, "sender",
         "true: pack each chunk into a reusable device bucket, one handle per GPU; false: share "
         "the trainer's own allocations (no copy; tensors must stay untouched until flush)"},
        {"buckets", T::UInt, 2, 1, board::kMaxSlots, "sender",
         "device buckets per sender (packed=true); 2 or more let packing overlap with loading"},
        {"bucket_bytes", T::UInt, uint64_t(256) << 20, 4096, uint64_t(1) << 40, "sender",
         "bytes per device bucket (packed=true); the largest chunk must fit"},
        {"dtype", T::String, 0, 0, 0, "sender",
         "cast float32 tensors while packing: \"bfloat16\" or \"float16\" (packed=true only); "
         "\"\" sends every dtype as it is",
         "", "|bfloat16|float16"},
        {"device", T::UInt, 0, 0, 4095, "receiver",
         "the receiver's GPU as an ordinal in its process (after CUDA_VISIBLE_DEVICES); it takes "
         "the part of each request whose UUID is this GPU's"},
        {"synchronize", T::Bool, 1, 0, 1, "both",
         "sender: synchronise the device before reading tensors, so writes queued on any stream "
         "are done; receiver: synchronise before acknowledging, so copies out of views are done"},
        {"timeout_ms", T::UInt, 60000, 0, uint64_t(1) << 40, "sender",
         "how long send_chunk waits for a free bucket and for its pack to finish"},
    };
    return specs;
}

std::string boot_id() {
    // The kernel's per-boot UUID: two processes share CUDA IPC only if they share a host.
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "unknown";
    char buf[64] = {};
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    std::string s(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s.empty() ? "unknown" : s;
}

// The shared segment: identity, sender count, then the acknowledgement board.
struct Control {
    char magic[8];
    uint32_t layout;
    uint32_t senders;
    std::atomic<uint32_t> senders_attached;
    uint32_t reserved;
    board::Board board;
};

class BoardSegment {
public:
    static std::shared_ptr<BoardSegment> create(uint32_t senders, uint32_t receivers,
                                                uint32_t slots) {
        auto seg = std::shared_ptr<BoardSegment>(new BoardSegment());
        seg->name_ = "/wsync-ipc-" + sys::random_hex(16);
        int fd = sys::shm_create(seg->name_, sizeof(Control), false, kKind);
        seg->owner_ = true;
        seg->fd_ = fd;
        seg->receivers_ = receivers;
        seg->slots_ = slots;
        void *p;
        try {
            p = sys::map_shared(fd, 0, sizeof(Control), true, true, "cuda_ipc: board");
        } catch (...) {
            shm_unlink(seg->name_.c_str());
            throw;
        }
        auto *c = new (p) Control();
        std::memcpy(c->magic, kMagic, sizeof kMagic);
        c->layout = kLayoutVersion;
        c->senders = senders;
        board::init(&c->board, receivers, slots);
        seg->c_ = c;
        return seg;
    }

    static std::shared_ptr<BoardSegment> attach(const std::string &name, uint32_t senders,
                                                uint32_t receivers, uint32_t slots) {
        auto seg = std::shared_ptr<BoardSegment>(new BoardSegment());
        seg->name_ = name;
        int fd = sys::shm_open_existing(name, sizeof(Control), kKind,
                                        "the trainer is gone, or every sender and receiver had "
                                        "already attached and the name was removed");
        seg->fd_ = fd;
        seg->receivers_ = receivers;
        seg->slots_ = slots;
        void *p = sys::map_shared(fd, 0, sizeof(Control), true, false, "cuda_ipc: board");
        seg->c_ = static_cast<Control *>(p);
        const Control *c = seg->c_;
        if (std::memcmp(c->magic, kMagic, sizeof kMagic) != 0 || c->layout != kLayoutVersion ||
            c->senders != senders || !board::matches(&c->board, receivers, slots))
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": segment '" + name +
                                         "' does not match its init info (layout or geometry)");
        return seg;
    }

    ~BoardSegment() {
        if (owner_) unlink();
        if (c_) munmap(c_, sizeof(Control));
        if (fd_ >= 0) close(fd_);
    }

    // Removes the name once every sender and receiver has mapped the segment (or at the
    // owner's end): after that nothing is left in /dev/shm, even if every process is killed.
    void unlink_if_complete() {
        if (c_->senders_attached.load() >= c_->senders) {
            board::Waiter probe(&c_->board, fd_, receivers_, slots_, kKind);
            if (probe.all_present()) unlink();
        }
    }
    void unlink() noexcept {
        if (!unlinked_) {
            shm_unlink(name_.c_str());  // ENOENT when another process removed it first: fine
            unlinked_ = true;
        }
    }

    Control *control() const { return c_; }
    board::Board *board() const { return &c_->board; }
    int fd() const { return fd_; }
    uint32_t receivers() const { return receivers_; }
    uint32_t slots() const { return slots_; }
    const std::string &name() const { return name_; }

private:
    BoardSegment() = default;
    std::string name_;
    Control *c_ = nullptr;
    int fd_ = -1;  // kept open: the liveness locks live on it
    uint32_t receivers_ = 0, slots_ = 0;  // from the init info, never re-read from shared memory
    bool owner_ = false;
    bool unlinked_ = false;
};

struct InitInfo {
    std::string segment, host;
    uint32_t senders, receivers, buckets;
    uint64_t bucket_bytes;
    bool packed;
    std::string dtype;
    uint32_t slots() const { return packed ? buckets : kUnpackedSlots; }
};

InitInfo parse_init(const json &body) {
    const std::string w = "cuda_ipc init info";
    InitInfo info;
    info.segment = wire::string_field(body, "segment", w, 255);
    if (info.segment.size() < 2 || info.segment[0] != '/' ||
        info.segment.find('/', 1) != std::string::npos)
        wire::malformed(w + ": segment name '" + info.segment + "' is not a POSIX shm name");
    info.host = wire::string_field(body, "host", w, 64);
    info.senders = static_cast<uint32_t>(wire::uint_field(body, "senders", w, board::kMaxReceivers));
    info.receivers =
        static_cast<uint32_t>(wire::uint_field(body, "receivers", w, board::kMaxReceivers));
    info.buckets = static_cast<uint32_t>(wire::uint_field(body, "buckets", w, board::kMaxSlots));
    info.bucket_bytes = wire::uint_field(body, "bucket_bytes", w, uint64_t(1) << 40);
    info.packed = wire::bool_field(body, "packed", w);
    info.dtype = wire::string_field(body, "dtype", w, 16);
    if (info.senders == 0 || info.receivers == 0 || info.buckets == 0 || info.bucket_bytes == 0)
        wire::malformed(w + ": senders, receivers, buckets or bucket_bytes is 0");
    if (!info.dtype.empty() && info.dtype != "bfloat16" && info.dtype != "float16")
        wire::malformed(w + ": dtype '" + info.dtype + "' is not one libwsync casts to");
    if (!info.packed && !info.dtype.empty())
        wire::malformed(w + ": a dtype cast needs packed=true");
    if (info.host != boot_id())
        fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": init info comes from another host (boot id " +
                                     info.host + ", this host's is " + boot_id() +
                                     "); CUDA IPC works only between processes of one machine");
    return info;
}

json handle_bin(const CUipcMemHandle &h) {
    return json::binary(std::vector<uint8_t>(h.reserved, h.reserved + sizeof h.reserved));
}

CUipcMemHandle handle_field(const json &v, const std::string &where) {
    if (!v.is_binary() || v.get_binary().size() != sizeof(CUipcMemHandle))
        wire::malformed(where + " is not a 64-byte IPC handle");
    CUipcMemHandle h;
    std::memcpy(h.reserved, v.get_binary().data(), sizeof h.reserved);
    return h;
}

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

// ---------------------------------------------------------------------------------------------
class IpcSender final : public SenderImpl {
public:
    IpcSender(const gpu::CudaApi &api, std::shared_ptr<BoardSegment> seg, const InitInfo &info,
              bool synchronize, int64_t timeout_ms)
        : api_(api), seg_(std::move(seg)), info_(info), waiter_(seg_->board(), seg_->fd(), seg_->receivers(), seg_->slots(), kKind),
          cast_(gpu::parse_cast(info.dtype)), synchronize_(synchronize), timeout_ms_(timeout_ms) {
        seg_->control()->senders_attached.fetch_add(1);
        waiter_.register_sender();
    }

    ~IpcSender() override {
        // Freed in order: the pack machinery and buckets before the device they live on.
        packer_.reset();
        done_.reset();
        stream_.reset();
        buckets_.clear();
        dev_.reset();
    }

    json send(const ChunkHeader &h, const wsync_tensor_t *tensors, TensorTable &table) override {
        const uint64_t first = next_seq_;
        if (h.chunk_index == 0) waiter_.admit_joiners(first);
        if (table.metas.empty()) {
            // A commit without data: a slot and a seq like any chunk, nothing to pack or share.
            const uint32_t slot = static_cast<uint32_t>((first - 1) % info_.slots());
            waiter_.wait({slot}, sys::Deadline(timeout_ms_), "no free slot", first - 1);
            waiter_.publish(slot, first);
            ++next_seq_;
            used_slots_ = std::max<uint32_t>(used_slots_, slot + 1);
            return json{{"seq", first}, {"slot", slot}, {"packed", info_.packed},
                        {"parts", json::array()}};
        }
        const int ordinal = chunk_device(tensors, table);
        start(ordinal);
        const uint64_t seq = next_seq_;
        const uint32_t slot = static_cast<uint32_t>((seq - 1) % info_.slots());
        sys::Deadline deadline(timeout_ms_);
        json part = info_.packed ? pack(tensors, table, slot, deadline)
                                 : share(tensors, table, slot, deadline);
        part["uuid"] = dev_->uuid_string();
        waiter_.publish(slot, seq);
        ++next_seq_;
        used_slots_ = std::max<uint32_t>(used_slots_, slot + 1);
        seg_->unlink_if_complete();
        return json{{"seq", seq}, {"slot", slot}, {"packed", info_.packed},
                    {"parts", json::array({std::move(part)})}};
    }

    void flush(int64_t timeout_ms) override {
        seg_->unlink_if_complete();
        std::vector<uint32_t> all;
        for (uint32_t s = 0; s < used_slots_; ++s) all.push_back(s);
        // This sender's own chunks only: with several senders, others may have published more.
        waiter_.wait(all, sys::Deadline(timeout_ms), "flush timed out", next_seq_ - 1);
    }

    void abandon(uint64_t version) override { waiter_.abandon(version); }

    void drop_receiver(uint32_t index) override {
        check_receiver_index(kKind, index, info_.receivers);
        waiter_.drop(index);
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

    void sync_device() {
        if (!synchronize_) return;
        gpu::Device::Scope scope(*dev_);
        WSYNC_CU(api_, cuCtxSynchronize(), "cuda_ipc: synchronising " + dev_->uuid_string() +
                                               " before reading the chunk's tensors");
    }

    json pack(const wsync_tensor_t *tensors, TensorTable &table, uint32_t b,
              const sys::Deadline &deadline) {
        std::vector<gpu::PackOp> ops;
        gpu::layout_bucket(table, cast_, info_.bucket_bytes, &ops, kKind);
        // Back-pressure: the bucket's previous chunk must be done with by every receiver.
        waiter_.wait({b}, deadline, "no free bucket", next_seq_ - 1);
        sync_device();
        entries_.resize(table.metas.size());
        const CUdeviceptr base = buckets_[b].ptr();
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            const uint64_t elems = ops[i] == gpu::kPackCopy ? table.metas[i].nbytes
                                                            : table.metas[i].nbytes / 2;
            entries_[i] = gpu::PackEntry{reinterpret_cast<uint64_t>(tensors[i].data),
                                         base + table.offsets[i], elems,
                                         static_cast<uint32_t>(ops[i]), 0};
        }
        packer_->pack(entries_, stream_->get());
        done_->record(stream_->get());
        gpu::poll_until([&] { return done_->done(); }, deadline,
                        "cuda_ipc: packing chunk into bucket " + std::to_string(b));
        return json{{"handle", handle_bin(bucket_handles_[b])}, {"bytes", info_.bucket_bytes}};
    }

    struct Allocation {
        CUdeviceptr base;
        uint64_t size;
        CUipcMemHandle handle;
    };

    json share(const wsync_tensor_t *tensors, TensorTable &table, uint32_t slot,
               const sys::Deadline &deadline) {
        // The core's table keeps a compact virtual layout (identical for every sender, so parts
        // merge); where each tensor really is travels in this sender's part.
        uint64_t end = 0;
        table.offsets.resize(table.metas.size());
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            table.offsets[i] = end;
            end += table.metas[i].nbytes;
        }
        json handles = json::array(), sizes = json::array(), alloc = json::array(),
             offset = json::array();
        std::map<uint64_t, std::size_t> in_chunk;  // buffer id -> index in handles
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
                handles.push_back(handle_bin(a.handle));
                sizes.push_back(a.size);
            }
            alloc.push_back(slot_it->second);
            offset.push_back(p - a.base);
        }
        waiter_.wait({slot}, deadline, "too many chunks in flight", next_seq_ - 1);
        sync_device();
        return json{{"handles", std::move(handles)}, {"sizes", std::move(sizes)},
                    {"alloc", std::move(alloc)}, {"offset", std::move(offset)}};
    }

    const gpu::CudaApi &api_;
    std::shared_ptr<BoardSegment> seg_;
    InitInfo info_;
    board::Waiter waiter_;
    gpu::Cast cast_;
    bool synchronize_;
    int64_t timeout_ms_;
    uint64_t next_seq_ = 1;
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
};

// ---------------------------------------------------------------------------------------------
// Opened IPC handles of one receiver, by handle bytes. Each is opened once and closed exactly
// once: when it was not used for a whole version (the trainer freed or moved that memory), or
// when the receiver goes away.
class HandleCache {
public:
    explicit HandleCache(const gpu::Device &dev) : dev_(dev) {}
    ~HandleCache() {
        try {
            gpu::Device::Scope scope(dev_);
            for (auto &kv : open_) dev_.api().cuIpcCloseMemHandle(kv.second.ptr);
        } catch (...) {
            // No context to close them in: the driver releases them with the process.
        }
    }

    CUdeviceptr get(const CUipcMemHandle &h, uint64_t version, const std::string &what) {
        std::string key(h.reserved, sizeof h.reserved);
        auto it = open_.find(key);
        if (it == open_.end()) {
            CUdeviceptr p = 0;
            WSYNC_CU(dev_.api(),
                     cuIpcOpenMemHandle(&p, h, gpu::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                     "cuda_ipc: cuIpcOpenMemHandle for " + what + " on " + dev_.uuid_string());
            it = open_.emplace(std::move(key), Entry{p, version}).first;
        }
        it->second.last_version = version;
        return it->second.ptr;
    }

    // Called between iterations: no view is alive.
    void evict_older_than(uint64_t version) {
        gpu::Device::Scope scope(dev_);
        for (auto it = open_.begin(); it != open_.end();) {
            if (it->second.last_version < version) {
                dev_.api().cuIpcCloseMemHandle(it->second.ptr);
                it = open_.erase(it);
            } else {
                ++it;
            }
        }
    }

private:
    struct Entry {
        CUdeviceptr ptr;
        uint64_t last_version;
    };
    const gpu::Device &dev_;
    std::map<std::string, Entry> open_;
};

class IpcBacking final : public ChunkBacking {
public:
    IpcBacking(std::shared_ptr<BoardSegment> seg, const gpu::Device &dev, bool synchronize,
               uint32_t index, uint32_t slot, uint64_t seq, std::vector<CUdeviceptr> ptrs)
        : seg_(std::move(seg)), dev_(dev), synchronize_(synchronize), index_(index), slot_(slot),
          seq_(seq), ptrs_(std::move(ptrs)) {}

    const void *data(std::size_t i) const override {
        return reinterpret_cast<const void *>(ptrs_[i]);
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CUDA, dev_.ordinal()}; }
    bool read_only() const override { return true; }

    void acknowledge(wsync_status_t outcome) noexcept override {
        if (synchronize_ && outcome == WSYNC_OK) {
            // The loader's copies out of the views must be complete before the sender reuses
            // the memory. This waits on this process's own GPU work only, never on a peer.
            try {
                gpu::Device::Scope scope(dev_);
                if (dev_.api().cuCtxSynchronize() != gpu::CUDA_SUCCESS) outcome = WSYNC_ERR_SYSTEM;
            } catch (...) {
                outcome = WSYNC_ERR_SYSTEM;
            }
        }
        board::acknowledge(seg_->board(), index_, slot_, seq_, outcome);
    }

private:
    std::shared_ptr<BoardSegment> seg_;
    const gpu::Device &dev_;
    bool synchronize_;
    uint32_t index_, slot_;
    uint64_t seq_;
    std::vector<CUdeviceptr> ptrs_;
};

class IpcReceiver final : public ReceiverImpl {
public:
    IpcReceiver(const gpu::CudaApi &api, std::shared_ptr<BoardSegment> seg, const InitInfo &info,
                uint32_t index, int ordinal, bool synchronize)
        : seg_(std::move(seg)), info_(info), index_(index),
          dev_(std::make_unique<gpu::Device>(api, ordinal, kKind)), cache_(*dev_),
          synchronize_(synchronize) {
        board::attach(seg_->board(), seg_->fd(), index_, kKind);
    }

    ~IpcReceiver() override { board::detach(seg_->board(), index_); }

    bool verify_checksums() const override { return false; }

    Link link() const override {
        board::Standing s = board::standing(seg_->board(), seg_->fd(), index_);
        Link l;
        l.dropped = s.state == board::kDropped;
        l.sender_gone = s.sender_gone;
        l.abandoned_version = s.abandoned_version;
        return l;
    }

    void refuse(const ChunkHeader &h, const json &transport, wsync_status_t status,
                const std::string &message, bool record) noexcept override {
        try {
            const uint32_t slots = info_.slots();
            uint64_t seq = wire::uint_field(transport, "seq", "cuda_ipc request", UINT64_MAX >> 8);
            uint32_t slot = static_cast<uint32_t>(wire::uint_field(transport, "slot", "cuda_ipc request", slots - 1));
            board::Standing st = board::standing(seg_->board(), seg_->fd(), index_);
            if (seq == 0 || (seq - 1) % slots != slot || board::held(seg_->board(), slot) != seq ||
                st.state != board::kAttached || seq < st.from_seq)
                return;
            if (record) board::record_failure(seg_->board(), index_, status, h.version, h.chunk_index, message);
            board::acknowledge(seg_->board(), index_, slot, seq, status);
        } catch (...) {
        }
    }

    void record_failure(const ChunkHeader &h, wsync_status_t status,
                        const std::string &message) noexcept override {
        board::record_failure(seg_->board(), index_, status, h.version, h.chunk_index, message);
    }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &header, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "cuda_ipc request";
        const uint32_t slots = info_.slots();
        uint64_t seq = wire::uint_field(transport, "seq", w, UINT64_MAX >> 8);
        uint32_t slot = static_cast<uint32_t>(wire::uint_field(transport, "slot", w, slots - 1));
        if (seq == 0 || (seq - 1) % slots != slot)
            wire::malformed(w + ": seq " + std::to_string(seq) + " does not belong in slot " +
                            std::to_string(slot));
        if (wire::bool_field(transport, "packed", w) != info_.packed)
            fail(WSYNC_ERR_MISMATCH, w + ": packed mode differs from the init info's");
        const auto &parts = wire::array_field(transport, "parts", w, board::kMaxReceivers);
        board::Standing st = board::standing(seg_->board(), seg_->fd(), index_);
        if (st.state == board::kJoining || seq < st.from_seq)
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": this receiver (re)attached while chunk seq " +
                                         std::to_string(seq) +
                                         "'s version was in flight; it takes part from the next version on");
        if (table.metas.empty()) {  // a commit without data
            if (board::held(seg_->board(), slot) != seq)
                fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": stale or replayed commit request");
            last_seq_ = seq;
            return std::make_unique<IpcBacking>(seg_, *dev_, false, index_, slot, seq,
                                                std::vector<CUdeviceptr>{});
        }
        const json &part = my_part(parts, w);
        if (last_seq_ && seq != last_seq_ + 1)
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": request carries chunk seq " +
                                         std::to_string(seq) + ", expected seq " +
                                         std::to_string(last_seq_ + 1));
        uint64_t held = board::held(seg_->board(), slot);
        if (held != seq)
            fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": stale or replayed request: slot " +
                                         std::to_string(slot) + " holds chunk seq " +
                                         std::to_string(held) + ", the request is for seq " +
                                         std::to_string(seq));
        // Views of the previous version are gone: handles it did not use can be closed.
        if (header.chunk_index == 0 && header.version > 1) cache_.evict_older_than(header.version - 1);
        std::vector<CUdeviceptr> ptrs = info_.packed ? packed_views(part, table, header, w)
                                                     : shared_views(part, table, header, w);
        last_seq_ = seq;
        return std::make_unique<IpcBacking>(seg_, *dev_, synchronize_, index_, slot, seq,
                                            std::move(ptrs));
    }

private:
    // The one part for this receiver's GPU, chosen by exact UUID.
    const json &my_part(const json::array_t &parts, const std::string &w) {
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
        CUipcMemHandle h = handle_field(wire::field(part, "handle", w), w + ".handle");
        uint64_t bytes = wire::uint_field(part, "bytes", w, uint64_t(1) << 40);
        if (bytes != info_.bucket_bytes)
            wire::malformed(w + ": bucket of " + std::to_string(bytes) + " bytes, the init info says " +
                            std::to_string(info_.bucket_bytes));
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            uint64_t off = table.offsets[i], n = table.metas[i].nbytes;
            if (off % 256 != 0 || n > bytes || off > bytes - n)
                wire::malformed(w + ": tensor '" + table.metas[i].name + "' at offset " +
                                std::to_string(off) + " (+" + std::to_string(n) +
                                " bytes) is misaligned or outside the " + std::to_string(bytes) +
                                "-byte bucket");
        }
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
        if (handles.empty() || sizes.size() != handles.size() || alloc.size() != n || offset.size() != n)
            wire::malformed(w + ": handles/sizes/alloc/offset columns have inconsistent lengths");
        // Validate every column before opening anything.
        std::vector<uint64_t> size(handles.size());
        for (std::size_t k = 0; k < handles.size(); ++k)
            size[k] = wire::as_uint(sizes[k], w + ".sizes[" + std::to_string(k) + "]", uint64_t(1) << 48);
        std::vector<std::size_t> which(n);
        std::vector<uint64_t> off(n);
        for (std::size_t i = 0; i < n; ++i) {
            const std::string where = w + ": tensor '" + table.metas[i].name + "'";
            which[i] = wire::as_uint(alloc[i], where + " alloc", handles.size() - 1);
            off[i] = wire::as_uint(offset[i], where + " offset", uint64_t(1) << 48);
            uint64_t nb = table.metas[i].nbytes, cap = size[which[i]];
            if (nb > cap || off[i] > cap - nb)
                wire::malformed(where + " at offset " + std::to_string(off[i]) + " (+" +
                                std::to_string(nb) + " bytes) is outside its " +
                                std::to_string(cap) + "-byte allocation");
        }
        std::vector<CUipcMemHandle> hs;
        for (std::size_t k = 0; k < handles.size(); ++k)
            hs.push_back(handle_field(handles[k], w + ".handles[" + std::to_string(k) + "]"));
        gpu::Device::Scope scope(*dev_);
        std::vector<CUdeviceptr> bases(hs.size());
        for (std::size_t k = 0; k < hs.size(); ++k)
            bases[k] = cache_.get(hs[k], header.version, "allocation " + std::to_string(k));
        std::vector<CUdeviceptr> ptrs(n);
        for (std::size_t i = 0; i < n; ++i) ptrs[i] = bases[which[i]] + off[i];
        return ptrs;
    }

    std::shared_ptr<BoardSegment> seg_;
    InitInfo info_;
    uint32_t index_;
    std::unique_ptr<gpu::Device> dev_;
    HandleCache cache_;
    bool synchronize_;
    uint64_t last_seq_ = 0;
};

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
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))) {
        if (!packed_ && !dtype_.empty())
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 "cuda_ipc: option 'dtype' needs packed=true (a cast needs a buffer to cast into)");
    }

    json create_init_info() override {
        InitInfo info{};
        info.packed = packed_;
        info.buckets = buckets_;
        seg_ = BoardSegment::create(senders_, receivers_, info.slots());
        return json{{"segment", seg_->name()}, {"host", boot_id()}, {"senders", senders_},
                    {"receivers", receivers_}, {"buckets", buckets_},
                    {"bucket_bytes", bucket_bytes_}, {"packed", packed_}, {"dtype", dtype_}};
    }

    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init(body);
        auto seg = seg_ && seg_->name() == info.segment
                       ? seg_
                       : BoardSegment::attach(info.segment, info.senders, info.receivers, info.slots());
        return std::make_unique<IpcSender>(api_, std::move(seg), info, synchronize_, timeout_ms_);
    }

    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init(body);
        check_receiver_index(kKind, index, info.receivers);
        auto seg = BoardSegment::attach(info.segment, info.senders, info.receivers, info.slots());
        return std::make_unique<IpcReceiver>(api_, std::move(seg), info, index, device_, synchronize_);
    }

private:
    const gpu::CudaApi &api_;
    uint32_t senders_, receivers_, buckets_;
    uint64_t bucket_bytes_;
    bool packed_;
    std::string dtype_;
    int device_;
    bool synchronize_;
    int64_t timeout_ms_;
    std::shared_ptr<BoardSegment> seg_;
};

// Concatenates the senders' parts; each GPU may appear once.
json merge_ipc(const std::vector<const json *> &transports) {
    const std::string w = "cuda_ipc merge";
    const json &first = *transports[0];
    json parts = json::array();
    std::vector<std::string> seen;
    for (std::size_t i = 0; i < transports.size(); ++i) {
        const json &t = *transports[i];
        const std::string where = w + ": part " + std::to_string(i);
        if (wire::uint_field(t, "seq", where, UINT64_MAX) != wire::uint_field(first, "seq", w, UINT64_MAX) ||
            wire::uint_field(t, "slot", where, UINT32_MAX) != wire::uint_field(first, "slot", w, UINT32_MAX) ||
            wire::bool_field(t, "packed", where) != wire::bool_field(first, "packed", w))
            fail(WSYNC_ERR_MISMATCH, where + " is for another chunk seq, slot or mode than part 0");
        for (const json &p : wire::array_field(t, "parts", where, board::kMaxReceivers)) {
            const std::string &text = wire::string_field(p, "uuid", where, 64);
            gpu::CUuuid u;
            if (!gpu::parse_uuid(text, &u)) wire::malformed(where + ": uuid '" + text + "' is not a GPU UUID");
            std::string canon = gpu::uuid_text(u);
            if (std::find(seen.begin(), seen.end(), canon) != seen.end())
                fail(WSYNC_ERR_MISMATCH, w + ": " + canon + " appears in two parts (part " +
                                             std::to_string(i) + " repeats it); each GPU is served by one sender");
            seen.push_back(canon);
            parts.push_back(p);
        }
    }
    if (parts.size() > board::kMaxReceivers)
        fail(WSYNC_ERR_INVALID_ARGUMENT, w + ": more than 64 parts");
    json out = first;
    out["parts"] = std::move(parts);
    return out;
}

std::unique_ptr<StrategyImpl> ipc_create(const Options &o) { return std::make_unique<IpcStrategy>(o); }
std::string ipc_unavailable(const Options *) { return gpu::cuda_unavailable_reason(); }

}  // namespace

const KindInfo kCudaIpcKind = {kKind,     ipc_options, ipc_unavailable,
                               ipc_create, merge_ipc,   gpu::cuda_runtime_text};

}  // namespace wsync
