#include "gpu/delta_coder.hpp"

#include <cstring>

#include "error.hpp"

namespace wsync::gpu {

struct DeviceCoder::Entry {
    std::string name;
    wsync_dtype_t dtype{};
    uint64_t nbytes = 0;
    DeviceBuffer base;  // the tensor in the last committed version that had it
    uint64_t base_hash = 0;  // its tree hash
    bool stale = false;      // base is not the committed bytes (sent bare while cooling)
    uint64_t epoch = 0;      // Staging::epoch() when base was committed dense
    uint64_t cool_until = 0; // auto: the next version that compares again
    enum class Staged { kNone, kPatch, kDense } staged = Staged::kNone;
    DeviceBuffer patch;      // kPatch: the patch sent (capacity kept across versions)
    uint64_t patch_bytes = 0, changed = 0;
    unsigned width = 4;
    DeviceBuffer spare;      // kDense: the bytes sent; becomes the base at commit
    uint64_t staged_hash = 0, staged_nbytes = 0;
    wsync_dtype_t staged_dtype{};
    int64_t wire_shape = 0;  // kPatch: the uint8 tensor's one extent

    void unstage() { staged = Staged::kNone; }
};

DeviceCoder::DeviceCoder(const CudaApi &api, const delta::Config &config, const char *kind,
                         int64_t timeout_ms, bool synchronize)
    : api_(api), config_(config), kind_(kind), timeout_ms_(timeout_ms), synchronize_(synchronize) {}

DeviceCoder::~DeviceCoder() {
    // Device memory is freed once the coder's stream is idle (a fold may still be queued);
    // a stream that cannot drain in time is left to the driver, as the senders' buckets are.
    if (dev_ && stream_) {
        try {
            Device::Scope scope(*dev_);
            ordered_->record(stream_->get());
            poll_until([&] { return ordered_->done(); }, sys::Deadline(timeout_ms_), "delta coder teardown");
        } catch (...) {
            for (auto &kv : entries_) kv.second->base.leak(), kv.second->spare.leak(), kv.second->patch.leak();
            for (DeviceBuffer &b : retired_) b.leak();
        }
    }
    entries_.clear();
    retired_.clear();
    packer_.reset();
    kernels_.reset();
    ordered_.reset();
    stream_.reset();
}

void DeviceCoder::start(int ordinal) {
    if (dev_) {
        if (ordinal != dev_->ordinal())
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 std::string(kind_) + ": delta: this sender compares on cuda:" +
                     std::to_string(dev_->ordinal()) + "; a chunk on cuda:" + std::to_string(ordinal) +
                     " needs a sender of its own");
        return;
    }
    auto dev = std::make_unique<Device>(api_, ordinal, kind_);
    stream_ = std::make_unique<Stream>(*dev);
    ordered_ = std::make_unique<Event>(*dev);
    kernels_ = std::make_unique<DeltaKernels>(*dev);
    // Kernel only: the staged bases may be pinned host memory ("delta_base_memory").
    packer_ = std::make_unique<Packer>(*dev, UINT64_MAX);
    dev_ = std::move(dev);
}

void DeviceCoder::encode(uint64_t version, const wsync_tensor_t *tensors,
                         const std::vector<TensorMeta> &metas, std::vector<wsync_tensor_t> &wire,
                         std::vector<PatchInfo> &patches) {
    staging_.begin_chunk(config_, version);
    wire.assign(tensors, tensors + metas.size());
    patches.assign(metas.size(), PatchInfo{});
    if (metas.empty()) return;
    for (std::size_t i = 0; i < metas.size(); ++i)
        if (tensors[i].device.type != WSYNC_DEVICE_CUDA || tensors[i].device.index != tensors[0].device.index)
            fail(WSYNC_ERR_UNSUPPORTED, std::string(kind_) + ": delta: " +
                                            tensor_label(i, metas[i].name.c_str()) + " is in " +
                                            device_name(tensors[i].device) +
                                            " memory; this sender compares on one GPU");
    start(tensors[0].device.index);
    check_sources(*dev_, tensors, metas, kind_);  // the compare kernels read them
    Device::Scope scope(*dev_);
    const sys::Deadline deadline(timeout_ms_);
    const std::string what = std::string(kind_) + ": delta: version " + std::to_string(version);
    if (synchronize_) {
        // The trainer's writes to its tensors, queued on its stream, come first.
        ordered_->record(order_stream_);
        poll_until([&] { return ordered_->done(); }, deadline,
                   what + ": work queued on " + stream_text(order_stream_) + " of " + dev_->uuid_string());
    }

    // Which tensors are compared and which go dense.
    std::vector<DeltaKernels::DiffJob> jobs;
    std::vector<std::size_t> compared, dense;
    std::vector<Entry *> of(metas.size());  // each tensor's entry, looked up once
    for (std::size_t i = 0; i < metas.size(); ++i) {
        const TensorMeta &m = metas[i];
        auto &slot = entries_[m.name];
        if (!slot) slot = std::make_unique<Entry>(), slot->name = m.name;
        Entry &e = *slot;
        of[i] = &e;
        if (e.staged != Entry::Staged::kNone)
            fail(WSYNC_ERR_INVALID_ARGUMENT, std::string(kind_) + ": delta: " +
                                                 tensor_label(i, m.name.c_str()) +
                                                 " is sent twice in version " + std::to_string(version));
        if (version + 1 < e.cool_until) {
            e.stale = true;  // auto, changed too much lately: dense, no compare, no base kept
            continue;
        }
        staging_.stage(&e);
        const uint64_t esize = dtype_size(m.dtype);
        const auto now = reinterpret_cast<CUdeviceptr>(tensors[i].data);
        const bool same = e.base.size() && !e.stale && staging_.current(e.epoch) && e.nbytes == m.nbytes &&
                          std::memcmp(&e.dtype, &m.dtype, sizeof e.dtype) == 0;
        if (staging_.patches_allowed() && same && DeltaKernels::diffable(esize, now, e.base.ptr())) {
            const uint64_t limit = config_.mode == delta::Mode::kOn
                                       ? UINT64_MAX
                                       : delta::patch_limit(m.nbytes, esize, config_.max_percent);
            jobs.push_back({now, e.base.ptr(), m.nbytes / esize, static_cast<uint32_t>(esize), limit});
            compared.push_back(i);
        } else {
            dense.push_back(i);
        }
    }
    std::vector<DeltaKernels::DiffOut> out;
    if (!jobs.empty()) kernels_->count(jobs, stream_->get(), deadline, what, &out);
    std::vector<uint64_t> known(metas.size(), 0);
    std::vector<bool> hashed(metas.size(), false);
    for (std::size_t k = 0; k < jobs.size(); ++k) {
        const std::size_t i = compared[k];
        Entry &e = *of[i];
        DeltaKernels::DiffOut &o = out[k];
        known[i] = o.result_hash;
        hashed[i] = true;
        if (o.patch && (config_.mode == delta::Mode::kOn ||
                        o.nbytes <= delta::budget(metas[i].nbytes, config_.max_percent))) {
            if (e.patch.size() < o.nbytes) {  // count() waited: no earlier use is in flight
                DeviceBuffer grown(*dev_, o.nbytes + o.nbytes / 4, "delta patch of '" + e.name + "'");
                if (e.patch.size()) retired_.push_back(std::move(e.patch));  // not freed: see retired_
                e.patch = std::move(grown);
            }
            o.bytes = e.patch.ptr();
            e.staged = Entry::Staged::kPatch;
            e.patch_bytes = o.nbytes;
            e.changed = o.changed;
            e.width = o.width;
            e.staged_hash = o.result_hash;
            continue;
        }
        o.patch = false;
        if (config_.mode == delta::Mode::kAuto) e.cool_until = version + delta::kCoolDown;
        dense.push_back(i);
    }
    if (!jobs.empty()) kernels_->compact(jobs, out, stream_->get());

    // Dense tensors: copied aside in one pack launch (they become the bases at commit), and
    // tree-hashed where the compare did not already.
    copies_.clear();
    std::vector<DeviceRange> to_hash;
    std::vector<std::size_t> hash_of;
    uint64_t tile = 0;
    for (std::size_t i : dense) {
        Entry &e = *of[i];
        if (e.spare.size() < metas[i].nbytes || !e.spare.size()) {
            DeviceBuffer grown(*dev_, std::max<uint64_t>(metas[i].nbytes, 1), "delta base of '" + e.name + "'",
                               config_.pinned_bases ? DeviceBuffer::Where::kPinnedHost
                                                    : DeviceBuffer::Where::kDevice);
            if (e.spare.size()) retired_.push_back(std::move(e.spare));  // not freed: see retired_
            e.spare = std::move(grown);
        }
        PackEntry c{reinterpret_cast<uint64_t>(tensors[i].data), e.spare.ptr(), metas[i].nbytes,
                    kPackCopy, static_cast<uint32_t>(tile)};
        tile += pack_tiles(c);
        copies_.push_back(c);
        e.staged = Entry::Staged::kDense;
        e.staged_nbytes = metas[i].nbytes;
        e.staged_dtype = metas[i].dtype;
        if (hashed[i]) {
            e.staged_hash = known[i];
        } else {
            to_hash.push_back({reinterpret_cast<CUdeviceptr>(tensors[i].data), metas[i].nbytes});
            hash_of.push_back(i);
        }
    }
    packer_->pack(copies_, stream_->get());
    // One wait covers the compaction, the copies and the hashes: the patches are complete
    // before the transport moves them on its own stream.
    const std::vector<uint64_t> sums =
        kernels_->tree_hashes(to_hash, stream_->get(), deadline, what + ": staging dense tensors");
    for (std::size_t k = 0; k < hash_of.size(); ++k) of[hash_of[k]]->staged_hash = sums[k];

    for (std::size_t i = 0; i < metas.size(); ++i) {
        // A cooling tensor (of[i] set, nothing staged) and dense ones keep the caller's tensor.
        if (of[i]->staged != Entry::Staged::kPatch) continue;
        Entry &e = *of[i];
        e.wire_shape = int64_t(e.patch_bytes);
        wsync_tensor_t &w = wire[i];
        w.data = reinterpret_cast<void *>(e.patch.ptr());
        w.dtype = {WSYNC_DTYPE_UINT, 8, 1};
        w.ndim = 1;
        w.shape = &e.wire_shape;
        w.strides = nullptr;
        PatchInfo p;
        p.wire_bytes = e.patch_bytes;
        p.base_version = staging_.committed();
        p.base_xxh3 = e.base_hash;
        p.result_xxh3 = e.staged_hash;
        p.tree = true;
        patches[i] = p;
    }
}

void DeviceCoder::chunk_refused() { staging_.chunk_refused(); }
void DeviceCoder::chunk_sent() { staging_.chunk_sent(); }
void DeviceCoder::abandon() { staging_.abandon(); }
void DeviceCoder::dense_next() { staging_.dense_next(); }

void DeviceCoder::commit(uint64_t version) {
    std::vector<DeltaKernels::FoldJob> folds;
    for (Entry *e : staging_.staged()) {
        e->base_hash = e->staged_hash;
        if (e->staged == Entry::Staged::kPatch) {
            folds.push_back({e->base.ptr(), e->nbytes / dtype_size(e->dtype),
                             static_cast<uint32_t>(dtype_size(e->dtype)), e->patch.ptr(), e->changed,
                             e->width});
        } else {
            std::swap(e->base, e->spare);
            e->nbytes = e->staged_nbytes;
            e->dtype = e->staged_dtype;
            e->stale = false;
            e->epoch = staging_.epoch();
        }
        e->unstage();
    }
    // Queued on the coder's stream, so the next compare (which waits for it) sees the new bases.
    if (!folds.empty()) kernels_->fold(folds, stream_->get());
    staging_.committed(version);
}

}  // namespace wsync::gpu
