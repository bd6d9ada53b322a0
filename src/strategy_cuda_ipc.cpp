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
#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <memory>
#include <new>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "board.hpp"
#include "error.hpp"
#include "gpu/device.hpp"
#include "gpu/pack.hpp"
#include "strategy.hpp"

namespace wsync {
namespace {

using gpu::CUdeviceptr;
using gpu::CUipcMemHandle;

constexpr const char *kKind = "cuda_ipc";
constexpr uint32_t kUnpackedSlots = 16;  // chunks in flight before send_chunk waits (packed=false)
constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'I', 'P', 'C'};
constexpr uint32_t kLayoutVersion = 2;  // 2: senders counted per index on the board

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
         "sender: wait for work queued on the legacy default stream (PyTorch's default stream), "
         "or the stream named with wsync_sender_set_stream, before reading tensors (work on "
         "other streams the caller synchronises); receiver: the same for the loader's stream "
         "(wsync_receiver_set_stream) before acknowledging, so its copies out of views are done"},
        {"timeout_ms", T::UInt, 60000, 0, uint64_t(1) << 40, "both",
         "sender: how long send_chunk waits for a free bucket, for work queued on the legacy "
         "default stream and for its pack; receiver: how long wsync_recv_end waits for the "
         "loader's work queued on the legacy default stream"},
        {"release_timeout_ms", T::UInt, 10000, 0, uint64_t(1) << 40, "sender",
         "how long wsync_sender_destroy waits for receivers to unmap this sender's buckets "
         "(packed=true); buckets still mapped then stay allocated until the process exits"},
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
    board::Board board;  // senders attach per index there (sender_pid), receivers per index
};

class BoardSegment {
public:
    static std::shared_ptr<BoardSegment> create(uint32_t senders, uint32_t receivers,
                                                uint32_t slots) {
        auto seg = std::shared_ptr<BoardSegment>(new BoardSegment());
        seg->name_ = "/wsync-ipc-" + sys::random_hex(16);
        seg->rendezvous_ = "wsync-ipc-" + sys::random_hex(16);
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
        // A restarted engine re-attaches after the name is gone: this process hands the
        // segment's descriptor over an abstract socket (same user only), as shm does.
        seg->server_ = std::make_unique<sys::FdServer>(seg->rendezvous_, seg->fd_, kKind);
        return seg;
    }

    // By name while it exists, else through the creator's rendezvous socket (an engine
    // re-attaching after the name was removed).
    static std::shared_ptr<BoardSegment> attach(const std::string &name,
                                                const std::string &rendezvous, uint32_t senders,
                                                uint32_t receivers, uint32_t slots,
                                                int64_t timeout_ms) {
        auto seg = std::shared_ptr<BoardSegment>(new BoardSegment());
        seg->name_ = name;
        const std::string gone = "the trainer is gone (the name was removed once every sender "
                                 "and receiver had attached, and no live trainer answers for it)";
        int fd;
        try {
            fd = sys::shm_open_existing(name, sizeof(Control), kKind, gone);
        } catch (const Error &e) {
            if (e.status() != WSYNC_ERR_UNAVAILABLE) throw;
            fd = sys::fetch_fd(rendezvous, sys::Deadline(timeout_ms),
                               std::string(kKind) + ": segment '" + name + "'", gone);
            struct stat st;
            if (fstat(fd, &st) != 0 || uint64_t(st.st_size) != sizeof(Control)) {
                close(fd);
                fail(WSYNC_ERR_MISMATCH, std::string(kKind) + ": the segment handed over for '" +
                                             name + "' does not have the size of a board");
            }
        }
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
        server_.reset();  // before the descriptor it serves is closed
        if (owner_) unlink();
        if (c_) munmap(c_, sizeof(Control));
        if (fd_ >= 0) close(fd_);
    }

    // Removes the name once every sender and receiver has mapped the segment (or at the
    // owner's end): after that nothing is left in /dev/shm, even if every process is killed.
    void unlink_if_complete() {
        // Counted per sender index, so a destroyed sender is not counted.
        board::Waiter probe(&c_->board, fd_, receivers_, slots_, kKind);
        if (probe.attached_senders() >= c_->senders && probe.all_present()) unlink();
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
    const std::string &rendezvous() const { return rendezvous_; }

private:
    BoardSegment() = default;
    std::string name_, rendezvous_;
    std::unique_ptr<sys::FdServer> server_;  // the creator's: hands fd_ to re-attaching engines
    Control *c_ = nullptr;
    int fd_ = -1;  // kept open: the liveness locks live on it
    uint32_t receivers_ = 0, slots_ = 0;  // from the init info, never re-read from shared memory
    bool owner_ = false;
    bool unlinked_ = false;
};

struct InitInfo {
    std::string segment, rendezvous, host;
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
    info.rendezvous = wire::string_field(body, "rendezvous", w, 64);
    if (info.rendezvous.empty() || info.rendezvous.find('\0') != std::string::npos)
        wire::malformed(w + ": rendezvous is not a socket name");
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
              bool synchronize, int64_t timeout_ms, int64_t release_timeout_ms)
        : api_(api), seg_(std::move(seg)), info_(info), waiter_(seg_->board(), seg_->fd(), seg_->receivers(), seg_->slots(), kKind),
          cast_(gpu::parse_cast(info.dtype)), synchronize_(synchronize), timeout_ms_(timeout_ms),
          release_timeout_ms_(release_timeout_ms) {
        waiter_.register_sender();
    }

    ~IpcSender() override {
        // Receivers map the buckets until they are destroyed: freeing them first is undefined
        // behaviour (see the top of the file). Wait, bounded; what is still mapped then is left
        // to the driver, which frees it when this process exits.
        bool released = true;
        if (!buckets_.empty()) {
            released = false;
            try {
                waiter_.wait_released(board::kAllReleased, 0, sys::Deadline(release_timeout_ms_),
                                      "destroying the sender: waiting for receivers to unmap its buckets");
                released = true;
            } catch (...) {
            }
            if (!released)
                for (auto &b : buckets_) b.leak();
        }
        // Freed in order: the pack machinery and buckets before the device they live on.
        packer_.reset();
        done_.reset();
        legacy_.reset();
        stream_.reset();
        buckets_.clear();
        // Leaked buckets keep their context too: the last release of a primary context frees
        // its memory.
        if (released) dev_.reset();
        else (void)dev_.release();
        waiter_.unregister_sender();
    }

    json send(const ChunkHeader &h, const wsync_tensor_t *tensors, TensorTable &table) override {
        const uint64_t first = next_seq_;
        if (h.chunk_index == 0) waiter_.admit_joiners(first);
        if (table.metas.empty()) {
            // A commit without data: a slot and a seq like any chunk, nothing to pack or share.
            const uint32_t slot = static_cast<uint32_t>((first - 1) % info_.slots());
            waiter_.wait({slot}, sys::Deadline(timeout_ms_), "no free slot", first - 1);
            waiter_.publish(slot, first);
            note_version(h.version, first);
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
        const std::string chunk = "chunk " + std::to_string(h.chunk_index) + " of version " +
                                  std::to_string(h.version);
        json part = info_.packed ? pack(tensors, table, slot, deadline, chunk)
                                 : share(tensors, table, slot, deadline, chunk);
        part["uuid"] = dev_->uuid_string();
        waiter_.publish(slot, seq);
        note_version(h.version, seq);
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

    void set_stream(void *stream) override { order_stream_ = gpu::ordering_stream(stream); }

    void wait_released(uint64_t version, int64_t timeout_ms) override {
        // packed=true copied the trainer's tensors into our buckets: nothing of theirs is mapped.
        if (info_.packed && version != board::kAllReleased) return;
        auto it = last_seq_.find(version);
        const uint64_t last = it != last_seq_.end() ? it->second : UINT64_MAX;  // unknown: all owe
        waiter_.wait_released(version, last, sys::Deadline(timeout_ms),
                              ("waiting for receivers to release version " +
                               (version == board::kAllReleased ? std::string("(all)")
                                                               : std::to_string(version)))
                                  .c_str());
    }

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
        std::vector<gpu::PackOp> ops;
        gpu::layout_bucket(table, cast_, info_.bucket_bytes, &ops, kKind);
        // Back-pressure: the bucket's previous chunk must be done with by every receiver.
        waiter_.wait({b}, deadline, "no free bucket", next_seq_ - 1);
        wait_default_stream(deadline, chunk);
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
                        "cuda_ipc: packing " + chunk + " into bucket " + std::to_string(b));
        return json{{"handle", handle_bin(bucket_handles_[b])}, {"bytes", info_.bucket_bytes}};
    }

    struct Allocation {
        CUdeviceptr base;
        uint64_t size;
        CUipcMemHandle handle;
    };

    json share(const wsync_tensor_t *tensors, TensorTable &table, uint32_t slot,
               const sys::Deadline &deadline, const std::string &chunk) {
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
                check_exportable(base, table.metas[i].name);
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
        wait_default_stream(deadline, chunk);
        return json{{"handles", std::move(handles)}, {"sizes", std::move(sizes)},
                    {"alloc", std::move(alloc)}, {"offset", std::move(offset)}};
    }

    // Memory from a stream-ordered pool (cudaMallocAsync) or the virtual memory management API
    // (PyTorch's expandable segments) cannot be exported with cuIpcGetMemHandle: the driver
    // says so through CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE ("1 if this pointer maps
    // to an allocation that is suitable for cudaIpcGetMemHandle, 0 otherwise"; CUDA Driver API,
    // cuPointerGetAttribute). Refused by name before anything is published. A driver too old
    // to know the attribute answers CUDA_ERROR_INVALID_VALUE: then cuIpcGetMemHandle decides.
    void check_exportable(CUdeviceptr base, const std::string &name) {
        int capable = 1;
        if (api_.cuPointerGetAttribute(&capable, gpu::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                       base) != gpu::CUDA_SUCCESS)
            return;
        if (!capable)
            fail(WSYNC_ERR_UNSUPPORTED,
                 std::string(kKind) + ": tensor '" + name + "' lives in memory that cannot be "
                 "exported with cuIpcGetMemHandle (a cudaMallocAsync pool, or PyTorch's "
                 "expandable segments: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); use "
                 "packed: true, which copies it into exportable buckets");
    }

    const gpu::CudaApi &api_;
    std::shared_ptr<BoardSegment> seg_;
    InitInfo info_;
    board::Waiter waiter_;
    gpu::Cast cast_;
    bool synchronize_;
    gpu::CUstream order_stream_ = gpu::CU_STREAM_LEGACY;  // set_stream(); writes to order after
    int64_t timeout_ms_;
    int64_t release_timeout_ms_;
    std::map<uint64_t, uint64_t> last_seq_;  // version -> seq of its last chunk sent here
    std::unique_ptr<gpu::Event> legacy_;     // marks the legacy default stream's queued work
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
// once: when a version this receiver ends does not use it (the trainer moved that memory and
// may want to free it: see wsync_sender_wait_released), or when the receiver goes away.
class HandleCache {
public:
    explicit HandleCache(const gpu::Device &dev) : dev_(dev) {}
    ~HandleCache() { close_all(); }

    void close_all() noexcept {
        try {
            gpu::Device::Scope scope(dev_);
            for (auto &kv : open_) dev_.api().cuIpcCloseMemHandle(kv.second.ptr);
        } catch (...) {
            // No context to close them in: the driver releases them with the process.
        }
        open_.clear();
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

    // Closes every handle `version` did not use. Called as a version's last chunk ends: views of
    // older versions are gone, and this version's views use only handles it keeps.
    void evict_older_than(uint64_t version) noexcept {
        try {
            gpu::Device::Scope scope(dev_);
            for (auto it = open_.begin(); it != open_.end();) {
                if (it->second.last_version < version) {
                    dev_.api().cuIpcCloseMemHandle(it->second.ptr);
                    it = open_.erase(it);
                } else {
                    ++it;
                }
            }
        } catch (...) {
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

// Closes the handles version `version` no longer uses, then says so on the board (before the
// acknowledgement, so a trainer whose flush returned finds the version released).
void release_through(board::Board *b, uint32_t index, HandleCache &cache, uint64_t version) noexcept {
    cache.evict_older_than(version);
    board::release(b, index, version);
}

class IpcBacking final : public ChunkBacking {
public:
    IpcBacking(std::shared_ptr<BoardSegment> seg, const gpu::Device &dev, gpu::Event *legacy,
               gpu::CUstream stream, HandleCache &cache, int64_t timeout_ms, const ChunkHeader &h,
               uint32_t index, uint32_t slot, uint64_t seq, std::vector<CUdeviceptr> ptrs)
        : seg_(std::move(seg)), dev_(dev), legacy_(legacy), stream_(stream), cache_(cache),
          timeout_ms_(timeout_ms),
          header_(h), index_(index), slot_(slot), seq_(seq), ptrs_(std::move(ptrs)) {}

    const void *data(std::size_t i) const override {
        return reinterpret_cast<const void *>(ptrs_[i]);
    }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CUDA, dev_.ordinal()}; }
    bool read_only() const override { return true; }

    // The loader's copies out of the views must be complete before the sender reuses the
    // memory: they are queued on the legacy default stream (or ordered before it), so an event
    // recorded there and polled against the deadline covers them, without waiting for the
    // engine's other streams. Also after a failure: copies may still be reading the views.
    wsync_status_t settle(wsync_status_t outcome, std::string *message) noexcept override {
        if (!legacy_) return outcome;
        const std::string chunk = "chunk " + std::to_string(header_.chunk_index) + " of version " +
                                  std::to_string(header_.version);
        try {
            legacy_->record(stream_);
            gpu::poll_until([&] { return legacy_->done(); }, sys::Deadline(timeout_ms_),
                            std::string(kKind) + ": receiver " + std::to_string(index_) +
                                ": the loader's work on " + gpu::stream_text(stream_) + " of " +
                                dev_.uuid_string() + " after " + chunk);
            return outcome;
        } catch (const Error &e) {
            if (outcome != WSYNC_OK) return outcome;
            *message = e.status() == WSYNC_ERR_TIMEOUT
                           ? std::string(e.what())
                           : std::string(kKind) + ": receiver " + std::to_string(index_) +
                                 ": the loader's work on " + gpu::stream_text(stream_) + " of " +
                                 dev_.uuid_string() + " failed after " + chunk + ": " + e.what();
            return e.status();
        } catch (...) {
            if (outcome != WSYNC_OK) return outcome;
            *message = std::string(kKind) + ": " + chunk + ": waiting for the loader's work failed";
            return WSYNC_ERR_SYSTEM;
        }
    }

    void acknowledge(wsync_status_t outcome) noexcept override {
        if (header_.last) release_through(seg_->board(), index_, cache_, header_.version);
        board::acknowledge(seg_->board(), index_, slot_, seq_, outcome);
    }

private:
    std::shared_ptr<BoardSegment> seg_;
    const gpu::Device &dev_;
    gpu::Event *legacy_;  // null: "synchronize" is off
    gpu::CUstream stream_;  // the loader's stream, whose work releases the chunk
    HandleCache &cache_;
    int64_t timeout_ms_;
    ChunkHeader header_;
    uint32_t index_, slot_;
    uint64_t seq_;
    std::vector<CUdeviceptr> ptrs_;
};

class IpcReceiver final : public ReceiverImpl {
public:
    IpcReceiver(const gpu::CudaApi &api, std::shared_ptr<BoardSegment> seg, const InitInfo &info,
                uint32_t index, int ordinal, bool synchronize, int64_t timeout_ms)
        : seg_(std::move(seg)), info_(info), index_(index),
          dev_(std::make_unique<gpu::Device>(api, ordinal, kKind)), cache_(*dev_),
          timeout_ms_(timeout_ms) {
        if (synchronize) legacy_ = std::make_unique<gpu::Event>(*dev_);
        board::attach(seg_->board(), seg_->fd(), index_, kKind);
    }

    ~IpcReceiver() override {
        // Every mapping is closed before the sender learns that this receiver is gone.
        cache_.close_all();
        board::release(seg_->board(), index_, board::kAllReleased);
        board::detach(seg_->board(), index_);
    }

    bool verify_checksums() const override { return false; }

    void set_stream(void *stream) override { order_stream_ = gpu::ordering_stream(stream); }

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
            if (h.last) release_through(seg_->board(), index_, cache_, h.version);
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
            return std::make_unique<IpcBacking>(seg_, *dev_, nullptr, order_stream_, cache_, timeout_ms_, header,
                                                index_, slot, seq, std::vector<CUdeviceptr>{});
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
        std::vector<CUdeviceptr> ptrs = info_.packed ? packed_views(part, table, header, w)
                                                     : shared_views(part, table, header, w);
        last_seq_ = seq;
        return std::make_unique<IpcBacking>(seg_, *dev_, legacy_.get(), order_stream_, cache_,
                                            timeout_ms_, header, index_, slot, seq, std::move(ptrs));
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
    int64_t timeout_ms_;
    std::unique_ptr<gpu::Event> legacy_;  // for settle(); null when "synchronize" is off
    gpu::CUstream order_stream_ = gpu::CU_STREAM_LEGACY;  // set_stream(): the loader's stream
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
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))),
          release_timeout_ms_(static_cast<int64_t>(o.uint("release_timeout_ms"))) {
        if (!packed_ && !dtype_.empty())
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 "cuda_ipc: option 'dtype' needs packed=true (a cast needs a buffer to cast into)");
    }

    json create_init_info() override {
        InitInfo info{};
        info.packed = packed_;
        info.buckets = buckets_;
        seg_ = BoardSegment::create(senders_, receivers_, info.slots());
        return json{{"segment", seg_->name()}, {"rendezvous", seg_->rendezvous()},
                    {"host", boot_id()}, {"senders", senders_},
                    {"receivers", receivers_}, {"buckets", buckets_},
                    {"bucket_bytes", bucket_bytes_}, {"packed", packed_}, {"dtype", dtype_}};
    }

    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init(body);
        auto seg = seg_ && seg_->name() == info.segment
                       ? seg_
                       : BoardSegment::attach(info.segment, info.rendezvous, info.senders,
                                              info.receivers, info.slots(), timeout_ms_);
        return std::make_unique<IpcSender>(api_, std::move(seg), info, synchronize_, timeout_ms_,
                                           release_timeout_ms_);
    }

    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init(body);
        check_receiver_index(kKind, index, info.receivers);
        auto seg = BoardSegment::attach(info.segment, info.rendezvous, info.senders,
                                        info.receivers, info.slots(), timeout_ms_);
        return std::make_unique<IpcReceiver>(api_, std::move(seg), info, index, device_, synchronize_,
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
