#include "transport/ucx/sender.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>

#include "copy.hpp"
#include "error.hpp"
#include "layout.hpp"
#include "transport/ucx/gpu_stage.hpp"

namespace wsync::ucx {
namespace {

using layout::round_up;

// Staging memory, reused across chunks: anonymous pages, or for chunks with device tensors
// pinned host memory the GPU writes (gpu_stage.hpp). Never registered for peers: the trainer
// sends what an engine fetches (fetch()).
struct Buffer {
    void *base = nullptr;
    std::size_t cap = 0;
    std::shared_ptr<gpu::DeviceBuffer> pinned;  // set: base is pinned->host()
};

struct Chunk {
    uint64_t version = 0;
    uint32_t index = 0;
    uint64_t bytes = 0;    // its size: fetches past it are refused
    Buffer buf;
    uint32_t sending = 0;  // Data sends from its buffer still in flight
    uint32_t leases = 0;   // receivers granted a read and not done with it
    bool retired = false;  // no new leases: its version is no longer kept, or was abandoned
};

struct Member {
    uint64_t token = 0;
    std::string name;  // "receiver 1 (pid 40)"
    int32_t pid = 0;
    std::unique_ptr<Endpoint> ep;
    Key key{};          // the connection's (auth.hpp)
    uint64_t sent = 0;   // the number of the last message sent to it
    uint64_t heard = 0;  // the number of the last authentic message from it
    uint64_t from_version = 0;   // the first version it owes
    uint64_t acked_through = 0;  // highest chunk seq it answered
    std::map<uint64_t, uint32_t> leases;  // seq -> count
    uint64_t failed_version = 0;  // the version whose failure it last reported
    bool dropped = false;
};

class UcxSender final : public SenderImpl {
public:
    UcxSender(std::unique_ptr<Worker> w, const InitInfo &info, int64_t timeout_ms, uint64_t block_bytes,
              unsigned copy_threads)
        : w_(std::move(w)), info_(info), timeout_ms_(timeout_ms), block_bytes_(block_bytes),
          copiers_(copy_threads), members_(info.receivers) {
        stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (stop_fd_ < 0) fail_errno("ucx sender: eventfd", errno);
        thread_ = std::thread([this] { serve(); });
    }

    // Bounded: the progress thread stops at once; endpoints are force-closed with a deadline
    // of timeout_ms in total; nothing waits on a receiver.
    ~UcxSender() override {
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
    }

    json send(const ChunkHeader &h, const wsync_tensor_t *tensors, TensorTable &table) override {
        const std::vector<std::size_t> on_gpu = device_tensors(tensors, table);
        if (gpu_) free_retired();
        const uint64_t end = layout::place(table, uint64_t(1) << 62, kKind);
        const std::string chunk = "chunk " + std::to_string(h.chunk_index) + " of version " + std::to_string(h.version);
        if (!on_gpu.empty()) gpu_->require_not_stuck(chunk);
        Buffer buf = take_buffer(std::max<uint64_t>(end, 1), !on_gpu.empty());
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
        stage_host(static_cast<uint8_t *>(buf.base), tensors, table, on_gpu);
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
            at = Where{info_.session, next_seq_++, end, block_bytes_, std::move(blocks)};
            Chunk &c = chunks_[at.seq];
            c.version = h.version;
            c.index = h.chunk_index;
            c.bytes = end;
            c.buf = buf;
            last_seq_ = at.seq;
            open_version_ = h.last ? 0 : h.version;
            if (h.last) commit(h.version);
        }
        w_->signal();
        return encode_where(at);
    }

    void flush(int64_t timeout_ms) override {
        const sys::Deadline deadline(timeout_ms);
        std::unique_lock<std::mutex> lock = caller_lock();
        for (;;) {
            if (!failures_.empty()) report_failures();
            std::vector<uint32_t> owing = owing_members();
            if (owing.empty()) return;
            if (deadline.passed()) report_timeout(owing, deadline.budget_ms());
            cv_.wait_for(lock, std::chrono::milliseconds(std::clamp<int64_t>(deadline.remaining_ms(), 1, 50)));
        }
    }

    void abandon(uint64_t version) override {
        std::unique_lock<std::mutex> lock = caller_lock();
        open_version_ = 0;
        if (abandoned_.size() == kAbandonedKept) abandoned_.erase(abandoned_.begin());
        abandoned_.push_back(version);
        for (auto &kv : chunks_)
            if (kv.second.version == version) kv.second.retired = true;
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
    bool begin_version(uint64_t version) override {
        std::unique_lock<std::mutex> lock = caller_lock();
        began_ = std::max(began_, version);
        for (const Member &m : members_)
            if (m.ep && !m.dropped && m.from_version >= version) return true;
        return false;
    }

    void set_stream(void *stream) override {
        order_stream_ = stream;
        if (gpu_) gpu_->set_stream(stream);
    }

    void drop_receiver(uint32_t index) override {
        check_receiver_index(kKind, index, info_.receivers);
        std::unique_lock<std::mutex> lock = caller_lock();
        Member &m = members_[index];
        if (!m.ep) return;
        Msg msg;
        msg.type = MsgType::Dropped;
        tell(index, m, msg);
        // Its leased chunks stay registered (see forget()): a frozen receiver may still read.
        m.dropped = true;
        forget(index, false);
        w_->signal();
    }

private:
    // ---- staging ----------------------------------------------------------------------------
    // The indices of the chunk's tensors in CUDA device memory (all of one GPU: the sender's,
    // set by the first such chunk); every other tensor must be host memory.
    // The stage is made only once the whole chunk is known to be acceptable, so a refused
    // chunk binds the sender to no GPU.
    std::vector<std::size_t> device_tensors(const wsync_tensor_t *tensors, const TensorTable &table) {
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
    void free_retired() {
        std::vector<std::shared_ptr<gpu::DeviceBuffer>> done;
        {
            std::unique_lock<std::mutex> lock = caller_lock();
            if (retired_.empty()) return;
            if (!gpu_->idle()) return;
            done.swap(retired_);
        }
        done.clear();
    }

    // Copies the chunk's host tensors into the staging buffer and, with checksums on, hashes
    // every tensor (tree hashes, large tensors on the copy threads): a host one in the same pass
    // as its copy, a device one where the GPU put it.
    void stage_host(uint8_t *base, const wsync_tensor_t *tensors, TensorTable &table,
                    const std::vector<std::size_t> &on_gpu) {
        if (on_gpu.empty()) {
            layout::pack_host(base, tensors, table, info_.checksum, {}, copiers_);  // one pass
            return;
        }
        std::vector<wsync_tensor_t> staged(tensors, tensors + table.metas.size());
        layout::InPlace in_place(table.metas.size(), 0);
        for (std::size_t i : on_gpu) {
            in_place[i] = 1;
            staged[i].data = base + table.offsets[i];
        }
        layout::pack_host(base, staged.data(), table, info_.checksum, in_place, copiers_);
    }

    // ---- the progress thread ------------------------------------------------------------
    // Fetches are served here (their data messages, and UCX's rendezvous protocol under them,
    // need the trainer's worker to progress), and so is every control message. This thread
    // progresses whenever the worker's descriptor fires, and every 100 ms.
    void serve() {
        std::unique_lock<std::mutex> lock(mu_);
        auto busy = std::chrono::steady_clock::now();
        for (;;) {
            const unsigned n = w_->progress();
            for (uint64_t seq : w_->take_sent()) {
                auto c = chunks_.find(seq);
                if (c != chunks_.end() && c->second.sending) --c->second.sending;
            }
            handle(w_->take_inbox());
            check_members();
            cv_.notify_all();
            uint64_t v;
            if (read(stop_fd_, &v, sizeof v) == sizeof v) return;
            const auto now = std::chrono::steady_clock::now();
            if (n) busy = now;
            if (now - busy <= kSpin || !w_->arm()) {  // busy, or events pending: progress again
                lock.unlock();                        // callers first: see caller_lock()
                while (callers_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
                lock.lock();
                continue;
            }
            lock.unlock();  // callers may use the worker while this one sleeps
            w_->wait_fd(100, stop_fd_);
            lock.lock();
        }
    }

    // The mutex for a caller's thread. The progress thread re-takes the mutex between rounds
    // while it spins; std::mutex is not fair, so a caller announces itself and the progress
    // thread waits for it rather than starving it (send_chunk would stall behind fetches).
    std::unique_lock<std::mutex> caller_lock() {
        callers_.fetch_add(1, std::memory_order_acq_rel);
        std::unique_lock<std::mutex> lock(mu_);
        callers_.fetch_sub(1, std::memory_order_acq_rel);
        return lock;
    }

    // Sends a member a message sealed with its connection's key, numbered.
    void tell(uint32_t index, Member &mem, Msg m) {
        m.index = index;
        m.token = mem.token;
        m.number = ++mem.sent;
        w_->send(*mem.ep, seal_msg(m, mem.key, Dir::ToEngine));
    }

    // Only authentic messages are acted on: a hello MACed with the init info's key and never
    // seen before, or a member's message MACed with its connection's key and numbered above
    // the last one. Anything else is dropped unanswered (nobody is connected to, nothing is
    // said back: a peer without the key learns nothing).
    void handle(std::vector<Msg> inbox) {
        for (Msg &m : inbox) {
            if (m.type == MsgType::Hello) {
                if (authentic(m, info_.key, Dir::ToTrainer) && seen_hellos_.insert(m.nonce).second) hello(m);
                continue;
            }
            if (m.index >= members_.size() || members_[m.index].token != m.token || !members_[m.index].ep)
                continue;  // a stale or forged sender of this message: ignored
            Member &mem = members_[m.index];
            if (m.number <= mem.heard || !authentic(m, mem.key, Dir::ToTrainer)) continue;  // replayed or forged
            mem.heard = m.number;
            switch (m.type) {
            case MsgType::Lease: lease(m.index, mem, m.seq); break;
            case MsgType::Fetch: fetch(m.index, mem, m); break;
            case MsgType::Ack: ack(m.index, mem, m); break;
            case MsgType::Bye: leave(m.index, WSYNC_FAILURE_DETACHED, "was destroyed"); break;
            default: break;
            }
        }
        release();
    }

    void hello(const Msg &m) {
        std::string why;
        wsync_status_t st = WSYNC_OK;
        if (m.seq != info_.session) {
            st = WSYNC_ERR_MISMATCH;
            why = "its init info is from another trainer session";
        } else if (m.index >= members_.size()) {
            st = WSYNC_ERR_INVALID_ARGUMENT;
            // Read the same in every language ("0..0" read as a Rust range is empty).
            const std::size_t n = members_.size();
            why = "receiver index " + std::to_string(m.index) + " is out of range: this sync has " +
                  (n == 1 ? std::string("1 receiver, index 0")
                          : std::to_string(n) + " receivers, indices 0 to " + std::to_string(n - 1));
        } else if (members_[m.index].ep && members_[m.index].ep->error == UCS_OK && !members_[m.index].dropped) {
            st = WSYNC_ERR_WRONG_STATE;  // as every kind says of an index in use (wsync.h)
            // Not who holds it: a refusal names no other engine (issue 37); what to do instead.
            why = "receiver index " + std::to_string(m.index) +
                  " is already attached: an index serves one engine at a time: destroy that "
                  "receiver or end its process first, or attach another index (a frozen engine: "
                  "the trainer drops it, wsync_sender_drop_receiver, then end its process)";
        }
        std::unique_ptr<Endpoint> ep;
        const std::string name = "receiver " + std::to_string(m.index) + " (pid " + std::to_string(m.pid) + ")";
        try {
            ep = w_->connect(m.address, name);
        } catch (const Error &) {
            return;  // cannot answer it; it times out naming the trainer
        }
        Msg reply;
        reply.type = MsgType::Welcome;
        reply.index = m.index;
        reply.token = m.token;
        reply.number = 1;
        reply.status = st;
        reply.text = why;
        sys::random_bytes(reply.nonce.data(), reply.nonce.size());
        const Key key = connection_key(info_.key, m.index, m.token, m.nonce, reply.nonce);
        w_->send(*ep, seal_msg(reply, key, Dir::ToEngine));
        if (st != WSYNC_OK) {
            refused_.push_back(std::move(ep));  // closed by the destructor, after the reply
            return;
        }
        Member &mem = members_[m.index];
        // A predecessor at this index is dead (its leases end) or dropped (they stay: it may be
        // frozen, not dead, and still read).
        if (mem.ep) forget(m.index, mem.ep->error != UCS_OK);
        w_->close(std::move(mem.ep), sys::Deadline(0));
        mem = Member{};
        mem.token = m.token;
        mem.name = name;
        mem.pid = m.pid;
        mem.ep = std::move(ep);
        mem.key = key;
        mem.sent = 1;  // the welcome
        // It owes versions that begin after it attached (a version the core has begun,
        // began_, counts as begun even before its first chunk is published); it may still pull
        // any kept one. It holds no base: its first owed version goes dense (begin_version).
        mem.from_version = std::max({open_version_, began_, last_committed_}) + 1;
        mem.acked_through = last_seq_;
    }

    void lease(uint32_t index, Member &mem, uint64_t seq) {
        Msg reply;
        reply.type = MsgType::Grant;
        reply.seq = seq;
        auto it = chunks_.find(seq);
        if (mem.dropped) {
            reply.status = WSYNC_ERR_PEER;
            reply.text = "this receiver was dropped by the trainer";
        } else if (it == chunks_.end() || it->second.retired) {
            reply.status = WSYNC_ERR_ABANDONED;
            reply.text = "chunk seq " + std::to_string(seq) +
                         " is no longer kept (abandoned, or older than the last " +
                         std::to_string(info_.keep_versions) + " committed versions; the latest is " +
                         std::to_string(last_committed_) + ")";
        } else {
            ++it->second.leases;
            ++mem.leases[seq];
        }
        tell(index, mem, reply);
    }

    // Serves bytes [offset, offset + bytes) of chunk seq to a member that holds a lease on it,
    // as one Data message (eager or rendezvous, as UCX chooses) straight from the staging
    // buffer, which stays until the send is done (release()). Anything else, a range past the
    // chunk's end included, is answered with why not and no byte.
    void fetch(uint32_t index, Member &mem, const Msg &m) {
        Msg reply;
        reply.type = MsgType::Data;
        reply.seq = m.seq;
        reply.version = m.version;  // the fetch's number
        reply.offset = m.offset;
        reply.bytes = m.bytes;
        auto it = chunks_.find(m.seq);
        if (mem.dropped) {
            reply.status = WSYNC_ERR_PEER;
            reply.text = "this receiver was dropped by the trainer";
        } else if (it == chunks_.end() || mem.leases.count(m.seq) == 0) {
            reply.status = WSYNC_ERR_WRONG_STATE;
            reply.text = "chunk seq " + std::to_string(m.seq) + " is not leased to this receiver";
        } else if (m.bytes == 0 || m.offset > it->second.bytes || m.bytes > it->second.bytes - m.offset) {
            reply.status = WSYNC_ERR_MALFORMED;
            reply.text = "bytes [" + std::to_string(m.offset) + ", +" + std::to_string(m.bytes) +
                         ") are not within the " + std::to_string(it->second.bytes) + "-byte chunk seq " +
                         std::to_string(m.seq);
        }
        reply.index = index;
        reply.token = mem.token;
        // Data messages carry no rising number: the engine takes one only as the answer to a
        // fetch it has outstanding (its own number, in `version`, never reused).
        std::vector<uint8_t> sealed = seal_msg(reply, mem.key, Dir::ToEngine);
        if (reply.status != WSYNC_OK) {
            w_->send_data(*mem.ep, std::move(sealed), nullptr, 0, 0);
            return;
        }
        ++it->second.sending;
        w_->send_data(*mem.ep, std::move(sealed), static_cast<const uint8_t *>(it->second.buf.base) + m.offset,
                      m.bytes, m.seq);
    }

    bool abandoned_here(uint64_t version) const {
        return std::find(abandoned_.begin(), abandoned_.end(), version) != abandoned_.end();
    }

    void ack(uint32_t index, Member &mem, const Msg &m) {
        auto l = mem.leases.find(m.seq);
        if (l != mem.leases.end()) {
            auto c = chunks_.find(m.seq);
            if (c != chunks_.end() && c->second.leases) --c->second.leases;
            if (--l->second == 0) mem.leases.erase(l);
        }
        mem.acked_through = std::max(mem.acked_through, m.seq);
        // Named once per version: the later chunks of a version that failed here are refused
        // by the receiver's core with the same status. Not named: a receiver this sender
        // dropped (it stopped listening to it), and a version this sender abandoned (a late
        // request of it refused tells the trainer nothing it does not know; review: both
        // failed the trainer's next flush with PEER, and a controller following wsync.h would
        // then drop a healthy engine).
        if (m.status == WSYNC_OK || mem.dropped || m.version < mem.from_version ||
            m.version == mem.failed_version || abandoned_here(m.version))
            return;
        mem.failed_version = m.version;
        const auto st = static_cast<wsync_status_t>(m.status);
        failures_.push_back(Failure{WSYNC_FAILURE_FAILED, st, index, m.version, m.chunk, mem.pid,
                                    mem.name + " failed chunk " + std::to_string(m.chunk) + " of version " +
                                        std::to_string(m.version) + ": " + status_name(st) + ": " + m.text});
    }

    // A member's connection failed (UCX's error handler): it died, or the network between us
    // did. Named once if it owed a chunk (a dropped one owes nothing); its leases end.
    void check_members() {
        for (uint32_t i = 0; i < members_.size(); ++i) {
            Member &m = members_[i];
            if (m.ep && m.ep->error != UCS_OK)
                leave(i, WSYNC_FAILURE_DIED,
                      std::string("is unreachable (") + w_->api().ucs_status_string(m.ep->error) +
                          "): its process died or the network to it failed");
        }
    }

    void leave(uint32_t index, uint32_t what, const std::string &why) {
        Member &m = members_[index];
        if (owes(m))
            failures_.push_back(Failure{what, WSYNC_ERR_PEER,
                                        index, last_version(), WSYNC_NO_CHUNK, m.pid,
                                        m.name + " " + why + " owing chunk seq " + std::to_string(last_seq_)});
        forget(index, true);
        w_->close(std::move(m.ep), sys::Deadline(0));
        m = Member{};
    }

    // Ends a member's standing. Its leases are released only when its connection is known
    // dead (`gone`): a dropped receiver that is merely frozen could still read its leased
    // chunks when it wakes, so those stay registered until its connection fails (or, if it
    // re-attaches first, until the sender is destroyed).
    void forget(uint32_t index, bool gone) {
        Member &m = members_[index];
        if (gone) {
            for (auto &kv : m.leases) {
                auto c = chunks_.find(kv.first);
                if (c != chunks_.end()) c->second.leases -= std::min(c->second.leases, kv.second);
            }
            m.leases.clear();
        }
    }

    // ---- versions ---------------------------------------------------------------------------
    void commit(uint64_t version) {
        last_committed_ = version;
        committed_.push_back(version);
        while (committed_.size() > info_.keep_versions) {
            const uint64_t old = committed_.front();
            committed_.erase(committed_.begin());
            for (auto &kv : chunks_)
                if (kv.second.version <= old) kv.second.retired = true;
        }
        release();
    }

    // Retired chunks go back to the pool once no lease holds them and no send reads them.
    void release() {
        for (auto it = chunks_.begin(); it != chunks_.end();) {
            if (it->second.retired && it->second.leases == 0 && it->second.sending == 0) {
                put_buffer(it->second.buf);
                it = chunks_.erase(it);
            } else {
                ++it;
            }
        }
    }

    // A staging buffer of at least `bytes` (rounded up to 2 MiB): from the pool when one of the
    // right kind is at most twice that size, else new. `pinned`: for a chunk with device tensors.
    Buffer take_buffer(uint64_t bytes, bool pinned) {
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
            madvise(b.base, b.cap, MADV_HUGEPAGE);
        }
        return b;
    }

    void put_buffer(Buffer &b) {
        if (pool_.size() < 64) pool_.push_back(b);
        else free_buffer(b);
        b = Buffer{};
    }

    // Frees a buffer. Pinned memory is only retired here (free_retired() frees
    // it): this runs under the mutex, on the progress thread too, and freeing pinned memory may
    // wait for the GPU.
    void free_buffer(Buffer &b) noexcept {
        if (b.pinned) {
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

    // ---- flush ------------------------------------------------------------------------------
    uint64_t last_version() const {
        auto it = chunks_.find(last_seq_);
        return it == chunks_.end() ? 0 : it->second.version;
    }
    bool owes(const Member &m) const {
        return m.ep && !m.dropped && last_seq_ && m.acked_through < last_seq_ &&
               last_version() >= m.from_version;
    }
    std::vector<uint32_t> owing_members() const {
        std::vector<uint32_t> out;
        for (uint32_t i = 0; i < members_.size(); ++i)
            if (owes(members_[i])) out.push_back(i);
        return out;
    }

    [[noreturn]] void report_failures() {
        std::vector<Failure> f;
        f.swap(failures_);
        std::string msg = std::string(kKind) + ": " + f.front().message;
        if (f.size() > 1) msg += " (and " + std::to_string(f.size() - 1) + " more failures)";
        throw Error(WSYNC_ERR_PEER, msg, std::move(f));
    }

    [[noreturn]] void report_timeout(const std::vector<uint32_t> &owing, int64_t budget) {
        std::vector<Failure> f;
        std::string names;
        for (uint32_t i : owing) {
            const Member &m = members_[i];
            names += (names.empty() ? "" : ", ") + m.name + " (answered through chunk seq " +
                     std::to_string(m.acked_through) + ")";
            f.push_back(Failure{WSYNC_FAILURE_TIMEOUT, WSYNC_ERR_TIMEOUT, i, last_version(), WSYNC_NO_CHUNK,
                                m.pid, m.name + " did not acknowledge chunk seq " + std::to_string(last_seq_)});
        }
        throw Error(WSYNC_ERR_TIMEOUT, std::string(kKind) + ": flush timed out after " + std::to_string(budget) +
                                           " ms waiting for chunk seq " + std::to_string(last_seq_) + " from " + names,
                    std::move(f));
    }

    std::unique_ptr<Worker> w_;
    InitInfo info_;
    int64_t timeout_ms_;
    uint64_t block_bytes_;  // 0: no block checksums
    copy::Pool copiers_;    // "copy_threads": pack and hash large tensors (the caller's thread only)
    std::unique_ptr<GpuStage> gpu_;  // made by the first chunk with device tensors
    std::vector<std::shared_ptr<gpu::DeviceBuffer>> retired_;  // pinned, to free (free_retired)
    void *order_stream_ = nullptr;   // set_stream(), for the stage
    std::mutex mu_;
    std::atomic<int> callers_{0};
    std::condition_variable cv_;
    std::thread thread_;
    int stop_fd_ = -1;
    std::vector<Member> members_;
    // Versions this sender abandoned (the newest kAbandonedKept): receivers' failures of them
    // are not reported (ack()).
    static constexpr std::size_t kAbandonedKept = 256;
    std::vector<uint64_t> abandoned_;
    std::vector<std::unique_ptr<Endpoint>> refused_;
    std::set<Nonce> seen_hellos_;  // the nonces of authentic hellos: a replayed one is dropped
    std::map<uint64_t, Chunk> chunks_;
    std::vector<Buffer> pool_;
    std::vector<uint64_t> committed_;
    std::vector<Failure> failures_;
    uint64_t next_seq_ = 1, last_seq_ = 0, last_committed_ = 0, open_version_ = 0;
    uint64_t began_ = 0;  // the newest version begin_version() was called for
};

}  // namespace

std::unique_ptr<SenderImpl> make_sender(std::unique_ptr<Worker> worker, const InitInfo &info,
                                        int64_t timeout_ms, uint64_t block_bytes,
                                        unsigned copy_threads) {
    return std::make_unique<UcxSender>(std::move(worker), info, timeout_ms, block_bytes, copy_threads);
}

}  // namespace wsync::ucx
