// shm: host memory through one POSIX shared-memory segment (the CPU twin of packed CUDA IPC).
//
// The trainer's strategy creates the segment when it makes the init info: a control block and
// `buckets` data buckets of `bucket_bytes` each, reserved with posix_fallocate (so a full
// /dev/shm is an error now, not a SIGBUS later) and pre-faulted. The sender packs chunk number
// `seq` (1, 2, ...) into bucket (seq - 1) % buckets after every receiver has acknowledged the
// bucket's previous chunk, then publishes seq in the bucket's slot (release) and returns the
// request. Receivers map the segment once (data read-only), check the request against the slot
// (acquire) and yield views straight into the bucket. Ending an iteration stores
// (seq << 8 | status) in the receiver's ack word for that bucket and wakes the sender through a
// futex. The sender polls receivers' pids while it waits, so a dead receiver is reported as such
// instead of as a slow one. See docs/architecture.md and docs/failure-model.md.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <new>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.hpp"
#include "strategy.hpp"
#include "sys.hpp"

namespace wsync {
namespace {

constexpr uint32_t kMaxReceivers = 64;
constexpr uint32_t kMaxBuckets = 64;
constexpr uint32_t kLayoutVersion = 1;
constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'S', 'H', 'M'};
constexpr uint64_t kTensorAlign = 256;    // offsets of tensors inside a bucket
constexpr uint64_t kBucketAlign = 4096;   // bucket size granularity (page)
constexpr int64_t kLivenessPollMs = 100;  // how often a waiting sender checks receivers' pids

enum SlotState : uint32_t { kFree = 0, kAttached = 1, kDetached = 2 };

struct alignas(64) ReceiverSlot {
    std::atomic<int32_t> pid;
    std::atomic<uint32_t> state;
    std::atomic<uint64_t> failed_seq;     // first chunk this receiver acknowledged as failed
    std::atomic<uint32_t> failed_status;  // and its status
};

struct alignas(64) BucketSlot {
    std::atomic<uint64_t> seq;                  // chunk now held (0: never used)
    std::atomic<uint64_t> ack[kMaxReceivers];   // per receiver: seq << 8 | status
};

struct Control {
    char magic[8];
    uint32_t layout;
    uint32_t receivers;
    uint32_t buckets;
    uint32_t reserved;
    uint64_t bucket_bytes;
    uint64_t data_offset;
    uint64_t total_bytes;
    std::atomic<uint32_t> ack_futex;  // bumped on every acknowledgement and detach
    ReceiverSlot slot[kMaxReceivers];
    BucketSlot bucket[kMaxBuckets];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "acks must be lock-free in shared memory");
static_assert(std::atomic<int32_t>::is_always_lock_free, "pids must be lock-free in shared memory");

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
uint64_t ack_seq(uint64_t word) { return word >> 8; }

const std::vector<OptionSpec> &shm_options() {
    using T = OptionSpec::Type;
    static const std::vector<OptionSpec> specs = {
        {"receivers", T::UInt, 1, 1, kMaxReceivers, "sender",
         "number of receivers (engines) that must acknowledge every chunk"},
        {"buckets", T::UInt, 2, 1, kMaxBuckets, "sender",
         "buckets in the segment; 2 or more let packing overlap with receivers' loading"},
        {"bucket_bytes", T::UInt, uint64_t(256) << 20, kBucketAlign, uint64_t(1) << 40, "sender",
         "bytes per bucket (rounded up to 4096); the largest chunk must fit in one bucket"},
        {"checksum", T::Bool, 1, 0, 1, "sender", "carry an XXH3-64 checksum of every tensor"},
        {"verify", T::Bool, 1, 0, 1, "receiver",
         "verify carried checksums before yielding each tensor"},
        {"timeout_ms", T::UInt, 60000, 0, uint64_t(1) << 40, "sender",
         "how long send_chunk waits for a free bucket before failing"},
    };
    return specs;
}

std::string list_indices(uint64_t mask) {
    std::string s = "[";
    for (uint32_t r = 0; r < 64; ++r)
        if (mask & (uint64_t(1) << r)) s += (s.size() > 1 ? ", " : "") + std::to_string(r);
    return s + "]";
}

// A mapped segment. The creator owns the name and unlinks it at the latest when it goes away.
class Segment {
public:
    static std::shared_ptr<Segment> create(uint32_t receivers, uint32_t buckets,
                                           uint64_t bucket_bytes) {
        auto seg = std::shared_ptr<Segment>(new Segment());
        seg->name_ = "/wsync-" + sys::random_hex(16);
        uint64_t data_offset = round_up(sizeof(Control), 65536);
        auto data = mul_u64(buckets, bucket_bytes);
        auto total = data ? add_u64(data_offset, *data) : std::nullopt;
        if (!total) fail(WSYNC_ERR_INVALID_ARGUMENT, "shm: buckets x bucket_bytes overflows");
        int fd = shm_open(seg->name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) fail_errno("shm: shm_open('" + seg->name_ + "')", errno);
        seg->owner_ = true;
        seg->size_ = *total;
        int err = ftruncate(fd, static_cast<off_t>(*total)) == 0 ? 0 : errno;
        // Reserve every page now: on a too-small /dev/shm the alternative is SIGBUS mid-sync.
        if (!err) err = posix_fallocate(fd, 0, static_cast<off_t>(*total));
        if (err) {
            close(fd);
            if (err == ENOSPC || err == ENOMEM)
                fail(WSYNC_ERR_NO_MEMORY,
                     "shm: cannot reserve " + std::to_string(*total) + " bytes for segment '" +
                         seg->name_ + "' in /dev/shm (" + std::strerror(err) +
                         "); lower buckets x bucket_bytes or enlarge /dev/shm");
            fail_errno("shm: reserving " + std::to_string(*total) + " bytes", err);
        }
        void *p = mmap(nullptr, *total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        err = errno;
        close(fd);
        if (p == MAP_FAILED) fail_errno("shm: mmap of " + std::to_string(*total) + " bytes", err);
        seg->base_ = static_cast<uint8_t *>(p);
        Control *c = new (seg->base_) Control();  // the file is zero; this just starts lifetimes
        std::memcpy(c->magic, kMagic, sizeof kMagic);
        c->layout = kLayoutVersion;
        c->receivers = receivers;
        c->buckets = buckets;
        c->bucket_bytes = bucket_bytes;
        c->data_offset = data_offset;
        c->total_bytes = *total;
        seg->data_ = seg->base_ + data_offset;
        return seg;
    }

    // Maps an existing segment: control read-write (for acks), data read-only.
    static std::shared_ptr<Segment> attach(const std::string &name, uint32_t receivers,
                                           uint32_t buckets, uint64_t bucket_bytes) {
        auto seg = std::shared_ptr<Segment>(new Segment());
        seg->name_ = name;
        int fd = shm_open(name.c_str(), O_RDWR, 0);
        if (fd < 0) {
            if (errno == ENOENT)
                fail(WSYNC_ERR_UNAVAILABLE,
                     "shm: segment '" + name + "' does not exist: the sender is gone, or every "
                     "receiver had already attached and the name was removed");
            fail_errno("shm: shm_open('" + name + "')", errno);
        }
        struct stat st;
        if (fstat(fd, &st) != 0) {
            int err = errno;
            close(fd);
            fail_errno("shm: fstat('" + name + "')", err);
        }
        uint64_t data_offset = round_up(sizeof(Control), 65536);
        uint64_t total = data_offset + uint64_t(buckets) * bucket_bytes;  // bounded by init checks
        if (uint64_t(st.st_size) != total) {
            close(fd);
            fail(WSYNC_ERR_MISMATCH, "shm: segment '" + name + "' has " +
                                         std::to_string(st.st_size) + " bytes, the init info implies " +
                                         std::to_string(total));
        }
        void *ctl = mmap(nullptr, data_offset, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int err = errno;
        if (ctl == MAP_FAILED) {
            close(fd);
            fail_errno("shm: mmap of the control block", err);
        }
        void *data = mmap(nullptr, total - data_offset, PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                          static_cast<off_t>(data_offset));
        err = errno;
        close(fd);
        if (data == MAP_FAILED) {
            munmap(ctl, data_offset);
            fail_errno("shm: mmap of " + std::to_string(total - data_offset) + " data bytes", err);
        }
        seg->base_ = static_cast<uint8_t *>(ctl);
        seg->data_ = static_cast<uint8_t *>(data);
        seg->size_ = total;
        seg->split_ = true;
        const Control *c = seg->control();
        if (std::memcmp(c->magic, kMagic, sizeof kMagic) != 0 || c->layout != kLayoutVersion ||
            c->receivers != receivers || c->buckets != buckets || c->bucket_bytes != bucket_bytes ||
            c->data_offset != data_offset || c->total_bytes != total)
            fail(WSYNC_ERR_MISMATCH, "shm: segment '" + name +
                                         "' does not match its init info (layout or geometry)");
        return seg;
    }

    ~Segment() {
        unlink();
        if (split_) {
            uint64_t off = control()->data_offset;
            munmap(data_, size_ - off);
            munmap(base_, off);
        } else if (base_) {
            munmap(base_, size_);
        }
    }

    void unlink() noexcept {
        if (owner_ && !unlinked_) {
            shm_unlink(name_.c_str());
            unlinked_ = true;
        }
    }

    Control *control() const { return reinterpret_cast<Control *>(base_); }
    uint8_t *bucket(uint32_t b) const { return data_ + uint64_t(b) * control()->bucket_bytes; }
    const std::string &name() const { return name_; }
    bool unlinked() const { return unlinked_; }
    bool sender_made = false;

private:
    Segment() = default;
    std::string name_;
    uint8_t *base_ = nullptr;
    uint8_t *data_ = nullptr;
    uint64_t size_ = 0;
    bool owner_ = false;
    bool unlinked_ = false;
    bool split_ = false;
};

struct InitInfo {
    std::string segment;
    uint32_t receivers, buckets;
    uint64_t bucket_bytes;
    bool checksum;
};

InitInfo parse_init(const json &body) {
    const std::string w = "shm init info";
    InitInfo info;
    info.segment = wire::string_field(body, "segment", w, 255);
    if (info.segment.size() < 2 || info.segment[0] != '/' ||
        info.segment.find('/', 1) != std::string::npos)
        wire::malformed(w + ": segment name '" + info.segment + "' is not a POSIX shm name");
    info.receivers = static_cast<uint32_t>(wire::uint_field(body, "receivers", w, kMaxReceivers));
    info.buckets = static_cast<uint32_t>(wire::uint_field(body, "buckets", w, kMaxBuckets));
    info.bucket_bytes = wire::uint_field(body, "bucket_bytes", w, uint64_t(1) << 40);
    if (info.receivers == 0 || info.buckets == 0 || info.bucket_bytes == 0 ||
        info.bucket_bytes % kBucketAlign != 0)
        wire::malformed(w + ": receivers, buckets or bucket_bytes out of range");
    info.checksum = wire::bool_field(body, "checksum", w);
    return info;
}

// ---------------------------------------------------------------------------------------------
class ShmSender final : public SenderImpl {
public:
    ShmSender(std::shared_ptr<Segment> seg, bool checksum, int64_t timeout_ms)
        : seg_(std::move(seg)), c_(seg_->control()), checksum_(checksum),
          timeout_ms_(timeout_ms) {
        for (auto &r : reported_) r = 0;
    }

    ~ShmSender() override { seg_->unlink(); }

    json send(const ChunkHeader &, const wsync_tensor_t *tensors, TensorTable &table) override {
        const uint64_t cap = c_->bucket_bytes;
        table.offsets.resize(table.metas.size());
        uint64_t end = 0;
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            const TensorMeta &m = table.metas[i];
            if (!device_is_host(tensors[i].device))
                fail(WSYNC_ERR_UNSUPPORTED,
                     "shm: tensor '" + m.name + "' is on " + device_name(tensors[i].device) +
                         "; shm moves host memory (use cuda_ipc or copy it to the CPU)");
            uint64_t off = round_up(end, kTensorAlign);
            if (m.nbytes > cap || off > cap - m.nbytes)
                fail(WSYNC_ERR_INVALID_ARGUMENT,
                     "shm: chunk does not fit in one bucket of " + std::to_string(cap) +
                         " bytes (tensor '" + m.name + "' of " + std::to_string(m.nbytes) +
                         " bytes ends at " + std::to_string(off + std::min(m.nbytes, cap)) +
                         "+); raise bucket_bytes or plan smaller chunks");
            table.offsets[i] = off;
            end = off + m.nbytes;
        }
        maybe_unlink();
        const uint64_t seq = next_seq_;
        const uint32_t b = static_cast<uint32_t>((seq - 1) % c_->buckets);
        BucketSlot &slot = c_->bucket[b];
        // Back-pressure: the bucket's previous chunk must be done with by every receiver.
        wait_for({b}, sys::Deadline(timeout_ms_), "no free bucket", false);

        uint8_t *dst = seg_->bucket(b);
        if (checksum_) table.checksums.resize(table.metas.size());
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            std::memcpy(dst + table.offsets[i], tensors[i].data, table.metas[i].nbytes);
            if (checksum_)
                table.checksums[i] = checksum_bytes(dst + table.offsets[i], table.metas[i].nbytes);
        }
        slot.seq.store(seq, std::memory_order_release);  // publish: the bytes are in place
        ++next_seq_;
        used_buckets_ = std::max<uint32_t>(used_buckets_, b + 1);
        return json{{"segment", seg_->name()}, {"bucket", b}, {"seq", seq}};
    }

    void flush(int64_t timeout_ms) override {
        maybe_unlink();
        std::vector<uint32_t> all;
        for (uint32_t b = 0; b < used_buckets_; ++b) all.push_back(b);
        wait_for(all, sys::Deadline(timeout_ms), "flush timed out", true);
    }

private:
    // Once every receiver has mapped the segment its name is no longer needed; removing it now
    // means nothing is left in /dev/shm even if this process is killed.
    void maybe_unlink() {
        if (seg_->unlinked()) return;
        for (uint32_t r = 0; r < c_->receivers; ++r)
            if (c_->slot[r].state.load(std::memory_order_acquire) == kFree) return;
        seg_->unlink();
    }

    // Receivers that have not acknowledged the newest chunk of every bucket in `buckets`.
    uint64_t pending(const std::vector<uint32_t> &buckets) const {
        uint64_t mask = 0;
        for (uint32_t b : buckets) {
            uint64_t want = c_->bucket[b].seq.load(std::memory_order_relaxed);
            if (want == 0) continue;
            for (uint32_t r = 0; r < c_->receivers; ++r)
                if (ack_seq(c_->bucket[b].ack[r].load(std::memory_order_acquire)) < want)
                    mask |= uint64_t(1) << r;
        }
        return mask;
    }

    uint64_t oldest_pending_seq(uint32_t r, const std::vector<uint32_t> &buckets) const {
        uint64_t oldest = 0;
        for (uint32_t b : buckets) {
            uint64_t want = c_->bucket[b].seq.load(std::memory_order_relaxed);
            if (want && ack_seq(c_->bucket[b].ack[r].load(std::memory_order_acquire)) < want)
                oldest = oldest ? std::min(oldest, want) : want;
        }
        return oldest;
    }

    // Reports, once each, the chunks a receiver acknowledged as failed.
    void check_failures() {
        for (uint32_t r = 0; r < c_->receivers; ++r) {
            uint64_t fseq = c_->slot[r].failed_seq.load(std::memory_order_acquire);
            if (fseq > reported_[r]) {
                reported_[r] = fseq;
                auto st = static_cast<wsync_status_t>(c_->slot[r].failed_status.load());
                c_->slot[r].failed_seq.store(0, std::memory_order_relaxed);
                fail(WSYNC_ERR_PEER, "shm: receiver " + std::to_string(r) + " failed chunk seq " +
                                         std::to_string(fseq) + " with " + status_name(st) +
                                         " (see that receiver's error for the cause)");
            }
        }
    }

    void check_alive(uint64_t mask, const std::vector<uint32_t> &buckets) {
        for (uint32_t r = 0; r < c_->receivers; ++r) {
            if (!(mask & (uint64_t(1) << r))) continue;
            uint32_t state = c_->slot[r].state.load(std::memory_order_acquire);
            int32_t pid = c_->slot[r].pid.load(std::memory_order_relaxed);
            std::string seq = std::to_string(oldest_pending_seq(r, buckets));
            if (state == kDetached)
                fail(WSYNC_ERR_PEER, "shm: receiver " + std::to_string(r) + " (pid " +
                                         std::to_string(pid) +
                                         ") detached without acknowledging chunk seq " + seq);
            if (state == kAttached && !sys::process_alive(pid))
                fail(WSYNC_ERR_PEER, "shm: receiver " + std::to_string(r) + " (pid " +
                                         std::to_string(pid) +
                                         ") died without acknowledging chunk seq " + seq);
        }
    }

    void wait_for(const std::vector<uint32_t> &buckets, const sys::Deadline &deadline,
                  const char *what, bool report_failures) {
        int64_t last_liveness = -1;
        for (;;) {
            if (report_failures) check_failures();
            uint32_t word = c_->ack_futex.load(std::memory_order_acquire);
            uint64_t mask = pending(buckets);
            if (!mask) return;
            int64_t left = deadline.remaining_ms();
            if (last_liveness < 0 || last_liveness - left >= kLivenessPollMs) {
                check_alive(mask, buckets);
                last_liveness = left;
            }
            if (deadline.passed()) {
                std::string never;
                for (uint32_t r = 0; r < c_->receivers; ++r)
                    if ((mask >> r & 1) && c_->slot[r].state.load() == kFree)
                        never += (never.empty() ? "" : ", ") + std::to_string(r);
                uint32_t first = static_cast<uint32_t>(__builtin_ctzll(mask));
                fail(WSYNC_ERR_TIMEOUT,
                     std::string("shm: ") + what + " after " +
                         std::to_string(deadline.budget_ms()) + " ms: receivers " +
                         list_indices(mask) + " did not acknowledge (receiver " +
                         std::to_string(first) + " is behind on chunk seq " +
                         std::to_string(oldest_pending_seq(first, buckets)) + ")" +
                         (never.empty() ? "" : "; never attached: [" + never + "]"));
            }
            sys::futex_wait(&c_->ack_futex, word, std::min(left, kLivenessPollMs));
        }
    }

    std::shared_ptr<Segment> seg_;
    Control *c_;
    bool checksum_;
    int64_t timeout_ms_;
    uint64_t next_seq_ = 1;
    uint32_t used_buckets_ = 0;
    uint64_t reported_[kMaxReceivers];
};

// ---------------------------------------------------------------------------------------------
class ShmBacking final : public ChunkBacking {
public:
    ShmBacking(std::shared_ptr<Segment> seg, uint32_t index, uint32_t bucket, uint64_t seq,
               const std::vector<uint64_t> &offsets)
        : seg_(std::move(seg)), index_(index), bucket_(bucket), seq_(seq), offsets_(offsets) {}

    const void *data(std::size_t i) const override { return seg_->bucket(bucket_) + offsets_[i]; }
    wsync_device_t device() const override { return {WSYNC_DEVICE_CPU, 0}; }
    bool read_only() const override { return true; }

    void acknowledge(wsync_status_t outcome) noexcept override {
        Control *c = seg_->control();
        if (outcome != WSYNC_OK) {
            uint64_t zero = 0;
            c->slot[index_].failed_status.store(static_cast<uint32_t>(outcome));
            c->slot[index_].failed_seq.compare_exchange_strong(zero, seq_);
        }
        c->bucket[bucket_].ack[index_].store(seq_ << 8 | (static_cast<uint64_t>(outcome) & 0xff),
                                             std::memory_order_release);
        c->ack_futex.fetch_add(1, std::memory_order_release);
        sys::futex_wake_all(&c->ack_futex);
    }

private:
    std::shared_ptr<Segment> seg_;
    uint32_t index_, bucket_;
    uint64_t seq_;
    std::vector<uint64_t> offsets_;
};

class ShmReceiver final : public ReceiverImpl {
public:
    ShmReceiver(std::shared_ptr<Segment> seg, uint32_t index, bool verify)
        : seg_(std::move(seg)), index_(index), verify_(verify) {}

    ~ShmReceiver() override {
        Control *c = seg_->control();
        c->slot[index_].state.store(kDetached, std::memory_order_release);
        c->ack_futex.fetch_add(1, std::memory_order_release);
        sys::futex_wake_all(&c->ack_futex);
    }

    bool verify_checksums() const override { return verify_; }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "shm request";
        const Control *c = seg_->control();
        const std::string &segment = wire::string_field(transport, "segment", w, 255);
        if (segment != seg_->name())
            fail(WSYNC_ERR_MISMATCH, "shm: request is for segment '" + segment +
                                         "', this receiver is attached to '" + seg_->name() + "'");
        uint32_t b = static_cast<uint32_t>(wire::uint_field(transport, "bucket", w, c->buckets - 1));
        uint64_t seq = wire::uint_field(transport, "seq", w, UINT64_MAX >> 8);
        if (seq == 0 || (seq - 1) % c->buckets != b)
            wire::malformed(w + ": seq " + std::to_string(seq) + " does not belong in bucket " +
                            std::to_string(b));
        if (last_seq_ && seq != last_seq_ + 1)
            fail(WSYNC_ERR_MISMATCH, "shm: request carries chunk seq " + std::to_string(seq) +
                                         ", expected seq " + std::to_string(last_seq_ + 1));
        uint64_t held = c->bucket[b].seq.load(std::memory_order_acquire);
        if (held != seq)
            fail(WSYNC_ERR_MISMATCH, "shm: stale or replayed request: bucket " + std::to_string(b) +
                                         " holds chunk seq " + std::to_string(held) +
                                         ", the request is for seq " + std::to_string(seq));
        const uint64_t cap = c->bucket_bytes;
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            uint64_t off = table.offsets[i], n = table.metas[i].nbytes;
            if (off % kTensorAlign != 0 || n > cap || off > cap - n)
                wire::malformed(w + ": tensor '" + table.metas[i].name + "' at offset " +
                                std::to_string(off) + " (+" + std::to_string(n) +
                                " bytes) is misaligned or outside the " + std::to_string(cap) +
                                "-byte bucket");
        }
        last_seq_ = seq;
        return std::make_unique<ShmBacking>(seg_, index_, b, seq, table.offsets);
    }

private:
    std::shared_ptr<Segment> seg_;
    uint32_t index_;
    bool verify_;
    uint64_t last_seq_ = 0;
};

// ---------------------------------------------------------------------------------------------
class ShmStrategy final : public StrategyImpl {
public:
    explicit ShmStrategy(const Options &o)
        : receivers_(static_cast<uint32_t>(o.uint("receivers"))),
          buckets_(static_cast<uint32_t>(o.uint("buckets"))),
          bucket_bytes_(round_up(o.uint("bucket_bytes"), kBucketAlign)),
          checksum_(o.boolean("checksum")), verify_(o.boolean("verify")),
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))) {}

    json create_init_info() override {
        seg_ = Segment::create(receivers_, buckets_, bucket_bytes_);
        return json{{"segment", seg_->name()}, {"receivers", receivers_}, {"buckets", buckets_},
                    {"bucket_bytes", bucket_bytes_}, {"checksum", checksum_}};
    }

    std::unique_ptr<SenderImpl> create_sender(const json &body) override {
        InitInfo info = parse_init(body);
        if (!seg_)
            fail(WSYNC_ERR_WRONG_STATE, "shm: a sender must be made by the strategy that created "
                                        "the init info (this one has not created any)");
        if (info.segment != seg_->name())
            fail(WSYNC_ERR_MISMATCH, "shm: init info names segment '" + info.segment +
                                         "' but this strategy created '" + seg_->name() + "'");
        if (seg_->sender_made)
            fail(WSYNC_ERR_WRONG_STATE, "shm: segment '" + seg_->name() + "' already has a sender");
        seg_->sender_made = true;
        return std::make_unique<ShmSender>(seg_, info.checksum, timeout_ms_);
    }

    std::unique_ptr<ReceiverImpl> create_receiver(const json &body, uint32_t index) override {
        InitInfo info = parse_init(body);
        if (index >= info.receivers)
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 "shm: receiver index " + std::to_string(index) + " is out of range: this sync has " +
                     std::to_string(info.receivers) + " receivers (0.." +
                     std::to_string(info.receivers - 1) + ")");
        auto seg = Segment::attach(info.segment, info.receivers, info.buckets, info.bucket_bytes);
        ReceiverSlot &slot = seg->control()->slot[index];
        const int32_t me = static_cast<int32_t>(getpid());
        int32_t prev = slot.pid.load();
        // Take the slot if it is free or its previous holder is gone.
        for (;;) {
            uint32_t state = slot.state.load(std::memory_order_acquire);
            if (state == kAttached && prev != 0 && sys::process_alive(prev))
                fail(WSYNC_ERR_WRONG_STATE, "shm: receiver index " + std::to_string(index) +
                                                " is already attached (pid " + std::to_string(prev) +
                                                ")");
            if (slot.pid.compare_exchange_weak(prev, me)) break;
        }
        slot.state.store(kAttached, std::memory_order_release);
        return std::make_unique<ShmReceiver>(std::move(seg), index, verify_);
    }

private:
    uint32_t receivers_, buckets_;
    uint64_t bucket_bytes_;
    bool checksum_, verify_;
    int64_t timeout_ms_;
    std::shared_ptr<Segment> seg_;
};

std::string shm_unavailable() {
    // /dev/shm is where glibc's shm_open puts segments; without it nothing here can work.
    struct stat st;
    if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode)) return "/dev/shm is not mounted";
    return "";
}

std::unique_ptr<StrategyImpl> shm_create(const Options &o) {
    return std::make_unique<ShmStrategy>(o);
}

}  // namespace

const KindInfo kShmKind = {"shm", shm_options, shm_unavailable, shm_create, nullptr};

}  // namespace wsync
