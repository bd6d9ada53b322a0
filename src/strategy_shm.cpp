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
// futex; that protocol, with the liveness checks that tell a dead receiver from a slow one, is the
// acknowledgement board (board.cpp) at the head of the segment. See docs/architecture.md and
// docs/failure-model.md.
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

#include "board.hpp"
#include "copy.hpp"
#include "error.hpp"
#include "strategy.hpp"
#include "sys.hpp"

namespace wsync {
namespace {

constexpr uint32_t kMaxReceivers = board::kMaxReceivers;
constexpr uint32_t kMaxBuckets = board::kMaxSlots;
constexpr uint32_t kLayoutVersion = 3;
constexpr char kMagic[8] = {'W', 'S', 'Y', 'N', 'C', 'S', 'H', 'M'};
constexpr uint64_t kTensorAlign = 256;    // offsets of tensors inside a bucket
constexpr uint64_t kBucketAlign = 4096;   // bucket size granularity (page)

// The segment's head: its geometry, then the acknowledgement board (one board slot per bucket).
struct Control {
    char magic[8];
    uint32_t layout;
    uint32_t reserved;
    uint64_t bucket_bytes;
    uint64_t data_offset;
    uint64_t total_bytes;
    board::Board board;
};

uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

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
        {"copy_threads", T::UInt, 0, 0, 64, "receiver",
         "threads one wsync_recv_copy of 8 MiB or more is split between (the caller's included; "
         "made once per receiver, on first use); 0: one per CPU this process may use, at most 8"},
        {"timeout_ms", T::UInt, 60000, 0, uint64_t(1) << 40, "sender",
         "how long send_chunk waits for a free bucket before failing"},
    };
    return specs;
}

// A mapped segment. The creator owns the name and removes it at the latest when it goes away;
// it also serves the segment's descriptor to receivers that attach after the name is gone. Every
// process keeps its own descriptor open: the liveness locks live on it. The geometry used for
// addressing is this object's own copy, never re-read from the shared control block.
class Segment {
public:
    static std::shared_ptr<Segment> create(uint32_t receivers, uint32_t buckets,
                                           uint64_t bucket_bytes) {
        auto seg = std::shared_ptr<Segment>(new Segment());
        seg->name_ = "/wsync-" + sys::random_hex(16);
        seg->rendezvous_ = "wsync-" + sys::random_hex(16);
        seg->receivers_ = receivers;
        seg->buckets_ = buckets;
        seg->bucket_bytes_ = bucket_bytes;
        seg->data_offset_ = round_up(sizeof(Control), 65536);
        auto data = mul_u64(buckets, bucket_bytes);
        auto total = data ? add_u64(seg->data_offset_, *data) : std::nullopt;
        if (!total) fail(WSYNC_ERR_INVALID_ARGUMENT, "shm: buckets x bucket_bytes overflows");
        seg->fd_ = sys::shm_create(seg->name_, *total, /*reserve=*/true, "shm");
        seg->owner_ = true;
        seg->size_ = *total;
        void *p = sys::map_shared(seg->fd_, 0, *total, true, true, "shm: segment");
        seg->base_ = static_cast<uint8_t *>(p);
        Control *c = new (seg->base_) Control();  // the file is zero; this just starts lifetimes
        std::memcpy(c->magic, kMagic, sizeof kMagic);
        c->layout = kLayoutVersion;
        board::init(&c->board, receivers, buckets);
        c->bucket_bytes = bucket_bytes;
        c->data_offset = seg->data_offset_;
        c->total_bytes = *total;
        seg->data_ = seg->base_ + seg->data_offset_;
        seg->server_ = std::make_unique<sys::FdServer>(seg->rendezvous_, seg->fd_, "shm");
        return seg;
    }

    // Maps an existing segment: control read-write (for acks), data read-only. By name while
    // it exists, else through the owner's rendezvous socket (a receiver re-attaching).
    static std::shared_ptr<Segment> attach(const std::string &name, const std::string &rendezvous,
                                           uint32_t receivers, uint32_t buckets,
                                           uint64_t bucket_bytes, int64_t timeout_ms) {
        auto seg = std::shared_ptr<Segment>(new Segment());
        seg->name_ = name;
        seg->receivers_ = receivers;
        seg->buckets_ = buckets;
        seg->bucket_bytes_ = bucket_bytes;
        seg->data_offset_ = round_up(sizeof(Control), 65536);
        const uint64_t total = seg->data_offset_ + uint64_t(buckets) * bucket_bytes;  // bounded by init checks
        const std::string gone = "the sender is gone (the segment's name was removed once every "
                                 "receiver had attached, and no live sender answers for it)";
        try {
            seg->fd_ = sys::shm_open_existing(name, total, "shm", gone);
        } catch (const Error &e) {
            if (e.status() != WSYNC_ERR_UNAVAILABLE) throw;
            seg->fd_ = sys::fetch_fd(rendezvous, sys::Deadline(timeout_ms), "shm: segment '" + name + "'", gone);
            struct stat st;
            if (fstat(seg->fd_, &st) != 0 || uint64_t(st.st_size) != total)
                fail(WSYNC_ERR_MISMATCH, "shm: the segment handed over for '" + name +
                                             "' does not have the size its init info implies");
        }
        void *ctl = sys::map_shared(seg->fd_, 0, seg->data_offset_, true, false, "shm: control block");
        seg->base_ = static_cast<uint8_t *>(ctl);
        seg->split_ = true;
        seg->size_ = total;
        void *data = sys::map_shared(seg->fd_, seg->data_offset_, total - seg->data_offset_, false,
                                     true, "shm: data buckets");
        seg->data_ = static_cast<uint8_t *>(data);
        const Control *c = seg->control();
        if (std::memcmp(c->magic, kMagic, sizeof kMagic) != 0 || c->layout != kLayoutVersion ||
            !board::matches(&c->board, receivers, buckets) || c->bucket_bytes != bucket_bytes ||
            c->data_offset != seg->data_offset_ || c->total_bytes != total)
            fail(WSYNC_ERR_MISMATCH, "shm: segment '" + name +
                                         "' does not match its init info (layout or geometry)");
        return seg;
    }

    ~Segment() {
        server_.reset();
        unlink();
        if (split_) {
            if (data_) munmap(data_, size_ - data_offset_);
            if (base_) munmap(base_, data_offset_);
        } else if (base_) {
            munmap(base_, size_);
        }
        if (fd_ >= 0) close(fd_);
    }

    void unlink() noexcept {
        if (owner_ && !unlinked_) {
            shm_unlink(name_.c_str());
            unlinked_ = true;
        }
    }
    // Removes the name once every receiver holds its index (any process may: the name is
    // only a rendezvous). ENOENT when someone else removed it first is fine.
    void unlink_if_complete(uint32_t self) noexcept {
        try {
            board::Waiter probe(&control()->board, fd_, receivers_, buckets_, "shm");
            if (probe.all_present(self)) {
                shm_unlink(name_.c_str());
                unlinked_ = true;
            }
        } catch (...) {
        }
    }

    Control *control() const { return reinterpret_cast<Control *>(base_); }
    board::Board *board() const { return &control()->board; }
    uint8_t *bucket(uint32_t b) const { return data_ + uint64_t(b) * bucket_bytes_; }
    const std::string &name() const { return name_; }
    const std::string &rendezvous() const { return rendezvous_; }
    int fd() const { return fd_; }
    uint32_t receivers() const { return receivers_; }
    uint32_t buckets() const { return buckets_; }
    uint64_t bucket_bytes() const { return bucket_bytes_; }
    bool unlinked() const { return unlinked_; }
    bool sender_made = false;

private:
    Segment() = default;
    std::string name_, rendezvous_;
    int fd_ = -1;
    uint8_t *base_ = nullptr;
    uint8_t *data_ = nullptr;
    uint64_t size_ = 0, data_offset_ = 0, bucket_bytes_ = 0;
    uint32_t receivers_ = 0, buckets_ = 0;
    bool owner_ = false;
    bool unlinked_ = false;
    bool split_ = false;
    std::unique_ptr<sys::FdServer> server_;
};

struct InitInfo {
    std::string segment, rendezvous;
    uint32_t receivers, buckets;
    uint64_t bucket_bytes;
    bool checksum;
};

InitInfo parse_init(const json &body) {
    const std::string w = "shm init info";
    InitInfo info;
    info.segment = wire::string_field(body, "segment", w, 255);
    if (info.segment.size() < 2 || info.segment[0] != '/' ||
        info.segment.find('/', 1) != std::string::npos ||
        info.segment.find('\0') != std::string::npos)
        wire::malformed(w + ": segment name is not a POSIX shm name");
    info.rendezvous = wire::string_field(body, "rendezvous", w, 64);
    if (info.rendezvous.empty() || info.rendezvous.find('\0') != std::string::npos)
        wire::malformed(w + ": rendezvous is not a socket name");
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
        : seg_(std::move(seg)),
          waiter_(seg_->board(), seg_->fd(), seg_->receivers(), seg_->buckets(), "shm"),
          checksum_(checksum), timeout_ms_(timeout_ms) {
        waiter_.register_sender();
    }

    ~ShmSender() override { seg_->unlink(); }

    json send(const ChunkHeader &h, const wsync_tensor_t *tensors, TensorTable &table) override {
        const uint64_t cap = seg_->bucket_bytes();
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
        const uint32_t b = static_cast<uint32_t>((seq - 1) % seg_->buckets());
        // Receivers that (re)attached take part from a version's first chunk on.
        if (h.chunk_index == 0) waiter_.admit_joiners(seq);
        // Back-pressure: the bucket's previous chunk must be done with by every receiver.
        waiter_.wait({b}, sys::Deadline(timeout_ms_), "no free bucket", seq - 1);

        uint8_t *dst = seg_->bucket(b);
        if (checksum_) table.checksums.resize(table.metas.size());
        // The pack and the checksum in one pass over each tensor (src/copy.hpp).
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            const uint64_t n = table.metas[i].nbytes;
            if (checksum_)
                table.checksums[i] = copy::copy_hashing(dst + table.offsets[i], tensors[i].data, n, 0, n);
            else
                copy::copy_bytes(dst + table.offsets[i], tensors[i].data, n);
        }
        waiter_.publish(b, seq);  // the bytes are in place
        ++next_seq_;
        used_buckets_ = std::max<uint32_t>(used_buckets_, b + 1);
        return json{{"segment", seg_->name()}, {"bucket", b}, {"seq", seq}};
    }

    void flush(int64_t timeout_ms) override {
        maybe_unlink();
        std::vector<uint32_t> all;
        for (uint32_t b = 0; b < used_buckets_; ++b) all.push_back(b);
        waiter_.wait(all, sys::Deadline(timeout_ms), "flush timed out", next_seq_ - 1);
    }

    void abandon(uint64_t version) override { waiter_.abandon(version); }

    void drop_receiver(uint32_t index) override {
        check_receiver_index("shm", index, seg_->receivers());
        waiter_.drop(index);
    }

private:
    // Once every receiver holds its index the name is no longer needed; removing it means
    // nothing is left in /dev/shm even if this process is killed (receivers that attach later
    // get the segment from this process over its rendezvous socket).
    void maybe_unlink() {
        if (!seg_->unlinked()) seg_->unlink_if_complete(UINT32_MAX);
    }

    std::shared_ptr<Segment> seg_;
    board::Waiter waiter_;
    bool checksum_;
    int64_t timeout_ms_;
    uint64_t next_seq_ = 1;
    uint32_t used_buckets_ = 0;
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
        board::acknowledge(seg_->board(), index_, bucket_, seq_, outcome);
    }

private:
    std::shared_ptr<Segment> seg_;
    uint32_t index_, bucket_;
    uint64_t seq_;
    std::vector<uint64_t> offsets_;
};

class ShmReceiver final : public ReceiverImpl {
public:
    ShmReceiver(std::shared_ptr<Segment> seg, uint32_t index, bool verify, bool promised,
                unsigned copy_threads)
        : seg_(std::move(seg)), index_(index), verify_(verify), promised_(promised),
          copy_threads_(copy_threads) {}

    ~ShmReceiver() override { board::detach(seg_->board(), index_); }

    bool verify_checksums() const override { return verify_; }
    bool checksums_promised() const override { return promised_; }
    unsigned copy_threads() const override { return copy_threads_; }

    Link link() const override {
        board::Standing s = board::standing(seg_->board(), seg_->fd(), index_);
        Link l;
        l.dropped = s.state == board::kDropped;
        l.sender_gone = s.sender_gone;
        l.abandoned_version = s.abandoned_version;
        return l;
    }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "shm request";
        Where at = where(transport);
        board::Standing st = board::standing(seg_->board(), seg_->fd(), index_);
        if (st.state == board::kJoining || at.seq < st.from_seq)
            fail(WSYNC_ERR_MISMATCH,
                 "shm: this receiver (re)attached while chunk seq " + std::to_string(at.seq) +
                     "'s version was in flight; it takes part from the next version on");
        if (last_seq_ && at.seq <= last_seq_)
            fail(WSYNC_ERR_MISMATCH, "shm: request carries chunk seq " + std::to_string(at.seq) +
                                         ", already received seq " + std::to_string(last_seq_));
        uint64_t held = board::held(seg_->board(), at.bucket);
        if (held != at.seq)
            fail(WSYNC_ERR_MISMATCH, "shm: stale or replayed request: bucket " +
                                         std::to_string(at.bucket) + " holds chunk seq " +
                                         std::to_string(held) + ", the request is for seq " +
                                         std::to_string(at.seq));
        const uint64_t cap = seg_->bucket_bytes();
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            uint64_t off = table.offsets[i], n = table.metas[i].nbytes;
            if (off % kTensorAlign != 0 || n > cap || off > cap - n)
                wire::malformed(w + ": tensor '" + table.metas[i].name + "' at offset " +
                                std::to_string(off) + " (+" + std::to_string(n) +
                                " bytes) is misaligned or outside the " + std::to_string(cap) +
                                "-byte bucket");
        }
        last_seq_ = at.seq;
        return std::make_unique<ShmBacking>(seg_, index_, at.bucket, at.seq, table.offsets);
    }

    void refuse(const ChunkHeader &h, const json &transport, wsync_status_t status,
                const std::string &message, bool record) noexcept override {
        try {
            Where at = where(transport);
            board::Standing st = board::standing(seg_->board(), seg_->fd(), index_);
            // Only the chunk now in its bucket, and only one this receiver owes, is answered.
            if (board::held(seg_->board(), at.bucket) != at.seq || st.state != board::kAttached ||
                at.seq < st.from_seq)
                return;
            if (record) board::record_failure(seg_->board(), index_, status, h.version, h.chunk_index, message);
            board::acknowledge(seg_->board(), index_, at.bucket, at.seq, status);
        } catch (...) {
        }
    }

    void record_failure(const ChunkHeader &h, wsync_status_t status,
                        const std::string &message) noexcept override {
        board::record_failure(seg_->board(), index_, status, h.version, h.chunk_index, message);
    }

private:
    struct Where {
        uint32_t bucket;
        uint64_t seq;
    };
    Where where(const json &transport) const {
        const std::string w = "shm request";
        const std::string &segment = wire::string_field(transport, "segment", w, 255);
        if (segment != seg_->name())
            fail(WSYNC_ERR_MISMATCH, "shm: request is for segment '" + segment +
                                         "', this receiver is attached to '" + seg_->name() + "'");
        Where at;
        at.bucket = static_cast<uint32_t>(wire::uint_field(transport, "bucket", w, seg_->buckets() - 1));
        at.seq = wire::uint_field(transport, "seq", w, UINT64_MAX >> 8);
        if (at.seq == 0 || (at.seq - 1) % seg_->buckets() != at.bucket)
            wire::malformed(w + ": seq " + std::to_string(at.seq) + " does not belong in bucket " +
                            std::to_string(at.bucket));
        return at;
    }

    std::shared_ptr<Segment> seg_;
    uint32_t index_;
    bool verify_, promised_;
    unsigned copy_threads_;
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
          copy_threads_(static_cast<unsigned>(o.uint("copy_threads"))),
          timeout_ms_(static_cast<int64_t>(o.uint("timeout_ms"))) {}

    json create_init_info() override {
        seg_ = Segment::create(receivers_, buckets_, bucket_bytes_);
        return json{{"segment", seg_->name()},   {"rendezvous", seg_->rendezvous()},
                    {"receivers", receivers_},   {"buckets", buckets_},
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
        check_receiver_index("shm", index, info.receivers);
        auto seg = Segment::attach(info.segment, info.rendezvous, info.receivers, info.buckets,
                                   info.bucket_bytes, timeout_ms_);
        board::attach(seg->board(), seg->fd(), index, "shm");
        // The last receiver to attach removes the name: a trainer killed from now on leaves
        // nothing in /dev/shm.
        seg->unlink_if_complete(index);
        return std::make_unique<ShmReceiver>(std::move(seg), index, verify_, info.checksum,
                                             copy_threads_);
    }

private:
    uint32_t receivers_, buckets_;
    uint64_t bucket_bytes_;
    bool checksum_, verify_;
    unsigned copy_threads_;
    int64_t timeout_ms_;
    std::shared_ptr<Segment> seg_;
};

std::string shm_unavailable(const Options *) {
    // /dev/shm is where glibc's shm_open puts segments; without it nothing here can work.
    struct stat st;
    if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode)) return "/dev/shm is not mounted";
    return "";
}

std::unique_ptr<StrategyImpl> shm_create(const Options &o) {
    return std::make_unique<ShmStrategy>(o);
}

}  // namespace

const KindInfo kShmKind = {"shm", shm_options, shm_unavailable, shm_create, nullptr, nullptr};

}  // namespace wsync
