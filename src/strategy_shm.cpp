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
#include "error.hpp"
#include "strategy.hpp"
#include "sys.hpp"

namespace wsync {
namespace {

constexpr uint32_t kMaxReceivers = board::kMaxReceivers;
constexpr uint32_t kMaxBuckets = board::kMaxSlots;
constexpr uint32_t kLayoutVersion = 2;
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
        {"timeout_ms", T::UInt, 60000, 0, uint64_t(1) << 40, "sender",
         "how long send_chunk waits for a free bucket before failing"},
    };
    return specs;
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
        int fd = sys::shm_create(seg->name_, *total, /*reserve=*/true, "shm");
        seg->owner_ = true;
        seg->size_ = *total;
        void *p;
        try {
            p = sys::map_shared(fd, 0, *total, true, true, "shm: segment");
        } catch (...) {
            close(fd);
            throw;
        }
        close(fd);
        seg->base_ = static_cast<uint8_t *>(p);
        Control *c = new (seg->base_) Control();  // the file is zero; this just starts lifetimes
        std::memcpy(c->magic, kMagic, sizeof kMagic);
        c->layout = kLayoutVersion;
        board::init(&c->board, receivers, buckets);
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
        uint64_t data_offset = round_up(sizeof(Control), 65536);
        uint64_t total = data_offset + uint64_t(buckets) * bucket_bytes;  // bounded by init checks
        int fd = sys::shm_open_existing(
            name, total, "shm",
            "the sender is gone, or every receiver had already attached and the name was removed");
        void *ctl = nullptr, *data = nullptr;
        try {
            ctl = sys::map_shared(fd, 0, data_offset, true, false, "shm: control block");
            data = sys::map_shared(fd, data_offset, total - data_offset, false, true,
                                   "shm: data buckets");
        } catch (...) {
            if (ctl) munmap(ctl, data_offset);
            close(fd);
            throw;
        }
        close(fd);
        seg->base_ = static_cast<uint8_t *>(ctl);
        seg->data_ = static_cast<uint8_t *>(data);
        seg->size_ = total;
        seg->split_ = true;
        const Control *c = seg->control();
        if (std::memcmp(c->magic, kMagic, sizeof kMagic) != 0 || c->layout != kLayoutVersion ||
            !board::matches(&c->board, receivers, buckets) || c->bucket_bytes != bucket_bytes ||
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
        : seg_(std::move(seg)), c_(seg_->control()), waiter_(&c_->board, "shm"),
          checksum_(checksum), timeout_ms_(timeout_ms) {}

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
        const uint32_t b = static_cast<uint32_t>((seq - 1) % c_->board.slots);
        // Back-pressure: the bucket's previous chunk must be done with by every receiver.
        waiter_.wait({b}, sys::Deadline(timeout_ms_), "no free bucket", false);

        uint8_t *dst = seg_->bucket(b);
        if (checksum_) table.checksums.resize(table.metas.size());
        for (std::size_t i = 0; i < table.metas.size(); ++i) {
            std::memcpy(dst + table.offsets[i], tensors[i].data, table.metas[i].nbytes);
            if (checksum_)
                table.checksums[i] = checksum_bytes(dst + table.offsets[i], table.metas[i].nbytes);
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
        waiter_.wait(all, sys::Deadline(timeout_ms), "flush timed out", true);
    }

private:
    // Once every receiver has mapped the segment its name is no longer needed; removing it now
    // means nothing is left in /dev/shm even if this process is killed.
    void maybe_unlink() {
        if (!seg_->unlinked() && waiter_.all_attached()) seg_->unlink();
    }

    std::shared_ptr<Segment> seg_;
    Control *c_;
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
        board::acknowledge(&seg_->control()->board, index_, bucket_, seq_, outcome);
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

    ~ShmReceiver() override { board::detach(&seg_->control()->board, index_); }

    bool verify_checksums() const override { return verify_; }

    std::unique_ptr<ChunkBacking> open(const ChunkHeader &, const TensorTable &table,
                                       const json &transport) override {
        const std::string w = "shm request";
        const Control *c = seg_->control();
        const std::string &segment = wire::string_field(transport, "segment", w, 255);
        if (segment != seg_->name())
            fail(WSYNC_ERR_MISMATCH, "shm: request is for segment '" + segment +
                                         "', this receiver is attached to '" + seg_->name() + "'");
        uint32_t b =
            static_cast<uint32_t>(wire::uint_field(transport, "bucket", w, c->board.slots - 1));
        uint64_t seq = wire::uint_field(transport, "seq", w, UINT64_MAX >> 8);
        if (seq == 0 || (seq - 1) % c->board.slots != b)
            wire::malformed(w + ": seq " + std::to_string(seq) + " does not belong in bucket " +
                            std::to_string(b));
        if (last_seq_ && seq != last_seq_ + 1)
            fail(WSYNC_ERR_MISMATCH, "shm: request carries chunk seq " + std::to_string(seq) +
                                         ", expected seq " + std::to_string(last_seq_ + 1));
        uint64_t held = board::held(&c->board, b);
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
        check_receiver_index("shm", index, info.receivers);
        auto seg = Segment::attach(info.segment, info.receivers, info.buckets, info.bucket_bytes);
        board::attach(&seg->control()->board, index, "shm");
        return std::make_unique<ShmReceiver>(std::move(seg), index, verify_);
    }

private:
    uint32_t receivers_, buckets_;
    uint64_t bucket_bytes_;
    bool checksum_, verify_;
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
