#include "transport/ucx/sender_state.hpp"

#include <algorithm>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "error.hpp"
#include "plan/layout.hpp"
#include "sys.hpp"

namespace wsync::ucx {

using layout::round_up;

UcxSender::UcxSender(std::unique_ptr<Worker> w, const InitInfo &info, int64_t timeout_ms, uint64_t block_bytes,
          unsigned copy_threads, uint64_t arena_bytes)
    : w_(std::move(w)), info_(info), timeout_ms_(timeout_ms), block_bytes_(block_bytes),
      copiers_(copy_threads), members_(info.receivers),
      failures_(std::size_t(info.receivers) * 4 + 16) {
    if (arena_bytes) {
        // Pre-faulted (MAP_POPULATE), so no first sync pays for zeroing pages; never registered
        // with UCX: engines get its bytes only as the trainer sends them for a lease.
        const uint64_t n = round_up(arena_bytes, layout::kPageBytes);
        void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED)
            fail(WSYNC_ERR_NO_MEMORY, std::string(kKind) + ": cannot map the " + std::to_string(n) +
                                          "-byte arena (\"arena_bytes\")");
        arena_map_.reset(p, n);
        arena_ = p;
        arena_bytes_ = n;
    }
    stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) fail_errno("ucx sender: eventfd", errno);
    w_->set_admit([this](const Msg &m) { return admit(m); });
    // The data stream (stream.hpp): its address goes in every welcome; a connection becomes a
    // member's stream once it proves that member's connection key.
    stream_address_ = w_->listen_stream();
    w_->set_stream_auth([this](uint32_t index, uint64_t token, const Nonce &nonce, const Mac &mac) -> Endpoint * {
        if (index >= members_.size()) return nullptr;
        Member &mem = members_[index];
        if (!mem.ep || mem.dropped || mem.token != token || mem.ep->error != UCS_OK) return nullptr;
        const Mac want = stream_proof(mem.key, nonce, index, token);
        return same_mac(want.data(), mac.data()) ? mem.ep.get() : nullptr;
    });
    // Checksums that follow the bytes (trail.hpp): each slice the stream wrote of a chunk that
    // has a trail is hashed here, under the mutex (progress runs under it).
    w_->set_written([this](uint64_t tag, const uint8_t *p, std::size_t n) {
        auto f = flights_.find(tag);
        if (f == flights_.end()) return;
        auto c = chunks_.find(f->second.seq);
        // A retired chunk's answers are never sent: an arena's bytes may be the caller's again.
        if (c == chunks_.end() || !c->second.trail || c->second.retired) return;
        const auto *base = static_cast<const uint8_t *>(c->second.buf.base);
        c->second.trail->written(f->second.index, static_cast<uint64_t>(p - base), static_cast<uint64_t>(p - base) + n);
    });
    thread_ = sys::start_thread([this] { serve(); });
}

// Bounded: the progress thread stops at once; endpoints are force-closed with a deadline
// of timeout_ms in total; nothing waits on a receiver.
UcxSender::~UcxSender() {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
    close(stop_fd_);
    const sys::Deadline d(std::min<int64_t>(timeout_ms_, 5000));
    for (auto &m : members_) w_->close(std::move(m.ep), d);
    for (auto &ep : refused_) w_->close(std::move(ep), d);
    for (auto &kv : chunks_) free_buffer(kv.second.buf);
    for (Buffer &b : pool_) free_buffer(b);
    // Pinned memory is freed only if nothing the stage gave up on may still run (freeing may
    // wait for it, and a stuck pack may still write its buffer); else the driver frees it
    // when the process ends, and the stage keeps its machinery (GpuStage's destructor).
    if (gpu_ && !gpu_->idle())
        for (auto &p : retired_) p->leak();
    retired_.clear();
    gpu_.reset();  // after its buffers
    arena_map_.reset();  // nothing reads it now: the progress thread is gone, endpoints closed
}

json UcxSender::send(const ChunkHeader &h, const wsync_tensor_t *tensors, TensorTable &table) {
    const std::vector<std::size_t> on_gpu = device_tensors(tensors, table);
    if (gpu_) free_retired();
    const uint64_t end = layout::place(table, uint64_t(1) << 62, kKind);
    const std::string chunk = "chunk " + std::to_string(h.chunk_index) + " of version " + std::to_string(h.version);
    if (!on_gpu.empty()) gpu_->require_not_stuck(chunk);
    // Checksums on, a host chunk without patches and a data stream to send it on: hashed as it
    // is sent, and the checksums follow its bytes (trail.hpp; docs/data-path.md). Block sums
    // are read before any byte moves, so they keep the checksums in the request.
    bool follow = info_.checksum && on_gpu.empty() && !block_bytes_ && !stream_address_.empty();
    if (follow) {  // and every engine attached has its stream (else it would be hashed cold, here, under the mutex)
        std::unique_lock<std::mutex> lock = caller_lock();
        for (const Member &m : members_)
            if (m.ep && !m.dropped && m.ep->error == UCS_OK && !w_->streams(*m.ep)) follow = false;
    }
    for (std::size_t i = 0; follow && i < table.metas.size(); ++i) follow = !table.is_patch(i);
    const bool hash_now = info_.checksum && !follow;
    Buffer buf;
    if (const uint8_t *at = on_gpu.empty() ? in_arena(tensors, table, end) : nullptr) {
        // Sent in place: the chunk's bytes are where the caller keeps them; with checksums on
        // they are hashed there (one read, no copy). Borrowed until the flush of its version.
        layout::InPlace all(table.metas.size(), 1);
        if (hash_now) layout::pack_host(const_cast<uint8_t *>(at), tensors, table, true, all, copiers_);
        buf.base = const_cast<uint8_t *>(at);
        buf.cap = end;
        buf.borrowed = true;
    } else {
        buf = take_buffer(std::max<uint64_t>(end, 1), !on_gpu.empty());
    }
    if (!on_gpu.empty()) {
        try {
            gpu_->pack(tensors, table, on_gpu, *buf.pinned, sys::Deadline(timeout_ms_), chunk);
        } catch (...) {
            std::unique_lock<std::mutex> lock = caller_lock();
            if (gpu_->stuck()) free_buffer(buf);  // retired: the stuck pack may still write it
            else put_buffer(buf);
            throw;
        }
    }
    if (!buf.borrowed) stage_host(static_cast<uint8_t *>(buf.base), tensors, table, on_gpu, hash_now);
    std::shared_ptr<Trail> trail;
    if (follow) trail = std::make_shared<Trail>(static_cast<const uint8_t *>(buf.base), table);
    std::vector<uint64_t> blocks;
    if (block_bytes_) {  // a second pass, for engines that pull byte ranges (docs/architecture.md)
        const auto *base = static_cast<const uint8_t *>(buf.base);
        for (std::size_t i = 0; i < table.metas.size(); ++i)
            for (uint64_t o = 0, n = table.wire_bytes(i); o < n; o += block_bytes_)
                blocks.push_back(checksum_bytes(base + table.offsets[i] + o, std::min(block_bytes_, n - o)));
    }
    Where at;
    {
        std::unique_lock<std::mutex> lock = caller_lock();
        at = Where{info_.session, next_seq_++, end, block_bytes_, std::move(blocks), follow};
        Chunk &c = chunks_[at.seq];
        c.trail = std::move(trail);
        c.version = h.version;
        c.index = h.chunk_index;
        c.bytes = end;
        c.last = h.last;
        c.buf = buf;
        last_seq_ = at.seq;
        open_version_ = h.last ? 0 : h.version;
        if (h.last) commit(h.version);
    }
    w_->signal();
    return encode_where(at);
}

// A version is reported whole (the core's policy, src/failures.hpp): a receiver that failed
// it, died or detached owing it is held and not waited for; the flush ends once no other
// receiver owes anything, and names every held failure at once (with the receivers still owing
// at the deadline, as timeouts).
void UcxSender::flush(int64_t timeout_ms) {
    const sys::Deadline deadline(timeout_ms);
    std::unique_lock<std::mutex> lock = caller_lock();
    for (;;) {
        for (uint32_t i = 0; i < members_.size(); ++i) name_dead(i, members_[i]);
        std::vector<uint32_t> owing;
        for (uint32_t i : owing_members())
            if (!failures_.holds(i)) owing.push_back(i);
        if (owing.empty()) {
            if (!failures_.empty()) failures_.report(kKind);
            // Everything published is complete everywhere it was owed: what was borrowed from
            // the arena goes back to the caller, who may write it from now on (no later lease
            // or fetch reads it; every version's, as an OK flush covers all of them).
            retire_borrowed();
            return;
        }
        if (deadline.passed()) report_timeout(owing, deadline.budget_ms());
        cv_.wait_for(lock, std::chrono::milliseconds(std::clamp<int64_t>(deadline.remaining_ms(), 1, 50)));
    }
}
uint64_t UcxSender::applied_ns(uint64_t version) {
    std::unique_lock<std::mutex> lock = caller_lock();
    for (const auto &[v, ns] : applied_)
        if (v == version) return ns;
    return 0;
}

void UcxSender::abandon(uint64_t version) {
    std::unique_lock<std::mutex> lock = caller_lock();
    open_version_ = 0;
    if (abandoned_.size() == kAbandonedKept) abandoned_.erase(abandoned_.begin());
    abandoned_.push_back(version);
    failures_.withdraw_version(version);  // it failed everywhere already: nothing to report
    for (auto &kv : chunks_)
        if (kv.second.version == version) retire(kv.second, kv.first);
    Msg m;
    m.type = MsgType::Abandon;
    m.version = version;
    for (uint32_t i = 0; i < members_.size(); ++i)
        if (members_[i].ep) tell(i, members_[i], m);
    release();
    w_->signal();
}

// Delta sync: a receiver that owes this version as its first (it attached or re-attached
// after the previous version began) holds no base, so the version goes dense. From here on
// an attach owes only later versions (hello() reads began_), even before this version's
// first chunk is published: this one may already be encoded as patches. One that attaches
// later and pulls a kept version of patches fails it with MISMATCH, unreported (it did not
// owe it), and gets its first owed version dense. Stateless: a repeated call for the same
// version answers alike.
bool UcxSender::begin_version(uint64_t version) {
    std::unique_lock<std::mutex> lock = caller_lock();
    began_ = std::max(began_, version);
    for (const Member &m : members_)
        if (m.ep && !m.dropped && m.from_version >= version) return true;
    return false;
}

void UcxSender::set_stream(void *stream) {
    order_stream_ = stream;
    if (gpu_) gpu_->set_stream(stream);
}

void UcxSender::drop_receiver(uint32_t index) {
    check_receiver_index(kKind, index, info_.receivers);
    std::unique_lock<std::mutex> lock = caller_lock();
    Member &m = members_[index];
    if (!m.ep) {
        if (m.dead) m = Member{};  // dead: no longer a receiver the trainer publishes for
        return;
    }
    Msg msg;
    msg.type = MsgType::Dropped;
    tell(index, m, msg);
    // Its leases end: its fetches are refused from now on (a frozen one that wakes is told
    // it was dropped), so nothing of the trainer's memory is held for it.
    m.dropped = true;
    forget(index);
    release();
    w_->signal();
}

// ---- staging ----------------------------------------------------------------------------
// The indices of the chunk's tensors in CUDA device memory (all of one GPU: the sender's,
// set by the first such chunk); every other tensor must be host memory.
// The stage is made only once the whole chunk is known to be acceptable, so a refused
// chunk binds the sender to no GPU.
std::vector<std::size_t> UcxSender::device_tensors(const wsync_tensor_t *tensors, const TensorTable &table) {
    std::vector<std::size_t> out;
    int ordinal = gpu_ ? gpu_->ordinal() : -1;
    std::size_t first = 0;  // the tensor that set `ordinal` in this chunk
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        const wsync_device_t d = tensors[i].device;
        if (device_is_host(d)) continue;
        if (d.type != WSYNC_DEVICE_CUDA)
            fail(WSYNC_ERR_UNSUPPORTED, std::string(kKind) + ": tensor '" + table.metas[i].name + "' is on " +
                                            device_name(d) + "; ucx stages host memory and CUDA device memory");
        if (ordinal < 0) ordinal = d.index, first = i;
        if (d.index != ordinal)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 std::string(kKind) + ": tensor '" + table.metas[i].name + "' is on cuda:" + std::to_string(d.index) +
                     " but " + (gpu_ ? "this sender serves cuda:" + std::to_string(ordinal) + " (" + gpu_->uuid() + ")"
                                     : "'" + table.metas[first].name + "' on cuda:" + std::to_string(ordinal)) +
                     "; one sender serves one GPU");
        out.push_back(i);
    }
    if (!out.empty() && !gpu_) {
        gpu_ = std::make_unique<GpuStage>(ordinal, kKind);
        gpu_->set_stream(order_stream_);
    }
    return out;
}

// Frees the pinned buffers free_buffer() retired, on the caller's thread and outside the
// mutex (freeing pinned memory may wait for the GPU), once the stage is idle.
void UcxSender::free_retired() {
    std::vector<std::shared_ptr<gpu::DeviceBuffer>> done;
    {
        std::unique_lock<std::mutex> lock = caller_lock();
        if (retired_.empty()) return;
        if (!gpu_->idle()) return;
        done.swap(retired_);
    }
    done.clear();
}

// Copies the chunk's host tensors into the staging buffer and, with `checksum`, hashes
// every tensor (tree hashes, large tensors on the copy threads): a host one in the same pass
// as its copy, a device one where the GPU put it.
void UcxSender::stage_host(uint8_t *base, const wsync_tensor_t *tensors, TensorTable &table,
                const std::vector<std::size_t> &on_gpu, bool checksum) {
    if (on_gpu.empty()) {
        layout::pack_host(base, tensors, table, checksum, {}, copiers_);  // one pass
        return;
    }
    std::vector<wsync_tensor_t> staged(tensors, tensors + table.metas.size());
    layout::InPlace in_place(table.metas.size(), 0);
    for (std::size_t i : on_gpu) {
        in_place[i] = 1;
        staged[i].data = base + table.offsets[i];
    }
    layout::pack_host(base, staged.data(), table, checksum, in_place, copiers_);
}

void UcxSender::Mapping::reset(void *to, std::size_t bytes) noexcept {
    if (p) munmap(p, n);
    p = to;
    n = bytes;
}

// Where the chunk lies in the arena when the caller laid it out there exactly as it would be
// packed (layout::place: each tensor at the next multiple of 256 bytes after the previous one's
// end, in the order given), starting at a multiple of 256 bytes from the arena's base; else
// nullptr (the chunk is packed into a staging buffer as usual). Patches (delta) never are: their
// bytes are the encoder's. A tensor of no bytes may be anywhere.
const uint8_t *UcxSender::in_arena(const wsync_tensor_t *tensors, const TensorTable &table, uint64_t end) const {
    if (!arena_ || table.metas.empty() || end == 0 || end > arena_bytes_) return nullptr;
    const auto a = reinterpret_cast<uintptr_t>(arena_);
    const auto first = reinterpret_cast<uintptr_t>(tensors[0].data);
    if (first < a || first - a < table.offsets[0]) return nullptr;
    const uintptr_t start = first - table.offsets[0];
    if ((start - a) % layout::kTensorAlign != 0 || start - a > arena_bytes_ - end) return nullptr;
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        if (table.is_patch(i)) return nullptr;
        if (table.metas[i].nbytes == 0) continue;
        if (reinterpret_cast<uintptr_t>(tensors[i].data) != start + table.offsets[i]) return nullptr;
    }
    return reinterpret_cast<const uint8_t *>(start);
}

// A staging buffer of at least `bytes` (rounded up to 2 MiB): from the pool when one of the
// right kind is at most twice that size, else new. `pinned`: for a chunk with device tensors.
Buffer UcxSender::take_buffer(uint64_t bytes, bool pinned) {
    const uint64_t want = round_up(bytes, 2 << 20);
    {
        std::unique_lock<std::mutex> lock = caller_lock();
        for (auto it = pool_.begin(); it != pool_.end(); ++it)
            if (bool(it->pinned) == pinned && it->cap >= want && it->cap / 2 <= want) {
                Buffer b = *it;
                pool_.erase(it);
                return b;
            }
    }
    Buffer b;
    b.cap = want;
    if (pinned) {
        b.pinned = gpu_->alloc(b.cap, std::string(kKind) + ": a chunk's staging buffer");
        b.base = b.pinned->host();
    } else {
        b.base = mmap(nullptr, b.cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b.base == MAP_FAILED)
            fail(WSYNC_ERR_NO_MEMORY, std::string(kKind) + ": cannot map " + std::to_string(b.cap) +
                                          " bytes to stage a chunk");
        // No MADV_HUGEPAGE: on the CI VM the first touch of 618 MiB advised so took 4.1-5.2 s
        // (huge-page zeroing and compaction) against 0.28-0.36 s without, and it landed in a
        // sync (docs/delta.md, "Crossover cells where auto lost").
    }
    return b;
}

void UcxSender::put_buffer(Buffer &b) {
    if (!b.borrowed) {  // a borrowed one is the caller's arena: it only goes
        if (pool_.size() < 64) pool_.push_back(b);
        else free_buffer(b);
    }
    b = Buffer{};
}

// Frees a buffer. Pinned memory is only retired here (free_retired() frees
// it): this runs under the mutex, on the progress thread too, and freeing pinned memory may
// wait for the GPU.
void UcxSender::free_buffer(Buffer &b) noexcept {
    if (b.borrowed) {
        // the caller's arena: nothing to free
    } else if (b.pinned) {
        try {
            retired_.push_back(std::move(b.pinned));
        } catch (...) {
            b.pinned->leak();  // no memory for the list: the driver frees it at exit
        }
    } else if (b.base) {
        munmap(b.base, b.cap);
    }
    b = Buffer{};
}

void UcxSender::report_timeout(const std::vector<uint32_t> &owing, int64_t budget) {
    std::vector<Failure> f;
    std::string names;
    for (uint32_t i : owing) {
        const Member &m = members_[i];
        names += (names.empty() ? "" : ", ") + m.name + " (answered through chunk seq " +
                 std::to_string(m.acked_through) + ")";
        f.push_back(Failure{WSYNC_FAILURE_TIMEOUT, WSYNC_ERR_TIMEOUT, i, last_version(), WSYNC_NO_CHUNK,
                            m.pid, "did not acknowledge chunk seq " + std::to_string(last_seq_) + " within " +
                                       std::to_string(budget) + " ms"});
    }
    if (!failures_.empty())
        failures_.report(kKind, std::move(f),
                         "; and " + names + " did not acknowledge chunk seq " + std::to_string(last_seq_) +
                             " within " + std::to_string(budget) + " ms");
    throw Error(WSYNC_ERR_TIMEOUT, std::string(kKind) + ": flush timed out after " + std::to_string(budget) +
                                       " ms waiting for chunk seq " + std::to_string(last_seq_) + " from " + names,
                std::move(f));
}

std::unique_ptr<SenderImpl> make_sender(std::unique_ptr<Worker> worker, const InitInfo &info,
                                        int64_t timeout_ms, uint64_t block_bytes,
                                        unsigned copy_threads, uint64_t arena_bytes) {
    return std::make_unique<UcxSender>(std::move(worker), info, timeout_ms, block_bytes, copy_threads, arena_bytes);
}

}  // namespace wsync::ucx
