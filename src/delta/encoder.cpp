// The trainer's side of delta sync: the options, the committed bases and the per-chunk choice
// between a patch and the dense bytes (docs/delta.md).
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <cstring>
#include <map>
#include <mutex>

#include "copy/copy.hpp"
#include "delta/delta.hpp"
#include "error.hpp"
#include "options.hpp"

namespace wsync {
namespace delta {

const std::vector<OptionSpec> &option_specs() {
    using T = OptionSpec::Type;
    // Experimental (docs/abi-policy.md): the patch format and the fallback may change in a
    // minor version while the GPU kernels and per-receiver fallback are built.
    static const std::vector<OptionSpec> specs = experimental({
        {"delta", T::String, 0, 0, 0, "sender",
         "send tensors that changed little as patches against the receivers' last committed "
         "version: off, auto (a patch when it is at most delta_max_percent of the dense bytes), "
         "on (a patch whenever there is a base, even one larger than the tensor: for "
         "tests and measurements); kinds shm and ucx (compared on the host), cuda_ipc "
         "(packed) and nccl_broadcast (compared on the GPU) (docs/delta.md)",
         "off", "off|auto|on"},
        {"delta_decide", T::String, 0, 0, 0, "sender",
         "delta auto: how a version is chosen: cost (measured per version: dense without a "
         "compare while a patch would not finish sooner than the dense bytes, on this link and "
         "host; docs/delta.md, how auto decides) or size (every version compared, each tensor a "
         "patch when within delta_max_percent, whatever it costs)",
         "cost", "cost|size"},
        {"delta_anchor_every", T::UInt, 0, 0, uint64_t(1) << 32, "sender",
         "with delta: versions 1, N+1, 2N+1, ... are sent dense (0: only when needed)"},
        {"delta_max_percent", T::UInt, 50, 0, 100, "sender",
         "delta auto: a tensor goes as a patch when the patch is at most this percent of its "
         "dense bytes"},
        {"delta_base_memory", T::String, 0, 0, 0, "sender",
         "with delta on a GPU kind: where the trainer keeps its bases (the last committed bytes "
         "of every compared tensor, the model's size) and the staged copies of tensors sent "
         "dense: device (the trainer's GPU memory; the compare reads them at memory speed) or "
         "pinned_host (host memory the compare kernels read across PCIe or NVLink-C2C: no GPU "
         "memory, a slower compare); shm and ucx keep them in host memory and take only device "
         "(docs/delta.md, memory cost)",
         "device", "device|pinned_host"},
        {"delta_threads", T::UInt, 0, 0, 64, "sender",
         "with delta on shm or ucx: how many threads compare a chunk's tensors with their bases and "
         "copy aside the dense ones, several tensors at once (each tensor on one thread, its "
         "XXH3 being sequential); 0: one per CPU this process may run on, at most 8; 1: the "
         "sending thread only (docs/delta.md)"},
        {"delta_mirror", T::Bool, 0, 0, 1, "receiver",
         "the receiver keeps its own copy of every tensor it loads (host memory of the model's "
         "size) and applies patches to it, verified: a patched tensor then has views, copies of "
         "any byte range, and wsync_recv_patch results the library has checked, for engines "
         "that load from views or by shards (docs/delta.md); kinds shm and ucx"},
    });
    return specs;
}

const std::vector<OptionSpec> &with_delta_options(const std::vector<OptionSpec> &(*kind)()) {
    // One list per kind, made once and never moved (kinds are static objects).
    static std::mutex mu;
    static std::map<decltype(kind), std::vector<OptionSpec>> made;
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = made.try_emplace(kind);
    if (fresh) {
        it->second = kind();
        for (const OptionSpec &s : option_specs()) it->second.push_back(s);
    }
    return it->second;
}

Config config_from(const Options &o, const char *kind_name, bool kind_has_delta, bool on_device) {
    Config c;
    const std::string &mode = o.text("delta");
    c.mode = mode == "on" ? Mode::kOn : mode == "auto" ? Mode::kAuto : Mode::kOff;
    c.by_cost = o.text("delta_decide") == "cost";
    c.anchor_every = o.uint("delta_anchor_every");
    c.max_percent = o.uint("delta_max_percent");
    c.mirror = o.boolean("delta_mirror");
    c.pinned_bases = o.text("delta_base_memory") == "pinned_host";
    c.threads = static_cast<unsigned>(o.uint("delta_threads"));
    if (c.pinned_bases && !on_device)
        failf(WSYNC_ERR_UNSUPPORTED,
              "%s: option 'delta_base_memory' is \"pinned_host\", but this kind compares host "
              "memory and keeps its bases there already: leave it \"device\" (it applies to "
              "the GPU kinds)",
              kind_name);
    if (c.mirror && !kind_has_delta)
        failf(WSYNC_ERR_UNSUPPORTED,
              "%s: option 'delta_mirror' is true, but delta sync is carried by kinds 'shm', "
              "'ucx', 'cuda_ipc' and 'nccl_broadcast' only, so no patch ever reaches this "
              "kind's receivers: leave it false",
              kind_name);
    if (c.mirror && on_device)
        failf(WSYNC_ERR_UNSUPPORTED,
              "%s: option 'delta_mirror' is true, but this kind applies patches on the GPU, "
              "into the engine's own memory, verified (a host mirror would be a second copy "
              "of the model that no loader reads): leave it false",
              kind_name);
    if (c.mode != Mode::kOff && !kind_has_delta)
        failf(WSYNC_ERR_UNSUPPORTED,
              "%s: option 'delta' is \"%s\", but delta sync is carried by kinds 'shm', "
              "'ucx', 'cuda_ipc' and 'nccl_broadcast' only: leave 'delta' \"off\"",
              kind_name, mode.c_str());
    return c;
}

// ------------------------------------------------------------------------------------------
namespace {
struct FreeBytes {
    void operator()(uint8_t *p) const { std::free(p); }
};
using Bytes = std::unique_ptr<uint8_t, FreeBytes>;

Bytes allocate(uint64_t n, const std::string &name) {
    void *p = std::aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p)
        fail(WSYNC_ERR_NO_MEMORY, "delta: cannot allocate " + std::to_string(n) +
                                      " bytes to keep tensor '" + name + "' as a base");
    return Bytes(static_cast<uint8_t *>(p));
}

}  // namespace

// `percent` of `nbytes`, without overflow (nbytes <= 2^62).
uint64_t budget(uint64_t nbytes, uint64_t percent) {
    return nbytes / 100 * percent + nbytes % 100 * percent / 100;
}

uint64_t patch_limit(uint64_t nbytes, uint64_t esize, uint64_t percent) {
    const uint64_t b = budget(nbytes, percent), fixed = kHeaderBytes + 8;
    return b <= fixed ? 0 : (b - fixed) / (4 + esize);
}

bool patches_allowed(const Config &config, uint64_t version, uint64_t committed, bool dense_next) {
    const bool anchor = config.anchor_every && (version - 1) % config.anchor_every == 0;
    return !dense_next && committed != 0 && committed + 1 == version && !anchor;
}

struct Encoder::Entry {
    std::string name;
    wsync_dtype_t dtype{};
    uint64_t nbytes = 0;
    Bytes base;  // the tensor's bytes in the last committed version that had it
    uint64_t base_hash = 0;
    enum class Staged { kNone, kPatch, kDense } staged = Staged::kNone;
    std::vector<uint8_t> patch;  // kPatch: the bytes sent
    Patch parsed;                // kPatch: its indices and values, for the fold
    bool fold = false;           // parsed is committed but not yet written into base
    bool stale = false;          // base is not the committed bytes (sent bare while cooling)
    uint64_t epoch = 0;          // Staging::epoch() when base was committed dense
    uint64_t cool_until = 0;     // auto: the next version that compares again
    Bytes spare;                 // kDense: the bytes sent; becomes the base at commit
    uint64_t spare_bytes = 0;
    uint64_t staged_hash = 0;
    wsync_dtype_t staged_dtype{};
    int64_t wire_shape = 0;  // kPatch: the uint8 tensor's one extent

    void unstage() {
        staged = Staged::kNone;
        patch.clear();
        parsed.idx.clear();
    }
};

Encoder::Encoder(Config config) : config_(config) {}
Encoder::~Encoder() = default;

struct Encoder::Job {
    std::size_t i = 0;           // the tensor's position in the chunk
    uint64_t version = 0;
    Entry *e = nullptr;
    const Patch *fold = nullptr;  // a committed patch not yet in e->base
    bool compare = false;        // else dense
    uint64_t esize = 0, elements = 0, nbytes = 0;
    wsync_dtype_t dtype{};
    bool patch = false;             // the outcome: a patch was staged
    uint64_t hash = 0;              // its result's XXH3
    std::exception_ptr error;       // what run() threw
};

void Encoder::encode(uint64_t version, const wsync_tensor_t *tensors,
                     const std::vector<TensorMeta> &metas, std::vector<wsync_tensor_t> &wire,
                     std::vector<PatchInfo> &patches) {
    staging_.begin_chunk(config_, version);
    wire.assign(tensors, tensors + metas.size());
    patches.assign(metas.size(), PatchInfo{});
    // 1. The plan, in the chunk's order: which entry each tensor has, whether it is compared
    //    (against a base of the same size and dtype, in a version that may carry patches) or
    //    sent dense, and the committed patch still to fold into its base.
    std::vector<Job> jobs;
    jobs.reserve(metas.size());
    for (std::size_t i = 0; i < metas.size(); ++i) {
        const TensorMeta &m = metas[i];
        if (!device_is_host(tensors[i].device))
            fail(WSYNC_ERR_UNSUPPORTED, "delta: " + tensor_label(i, m.name.c_str()) + " is in " +
                                            device_name(tensors[i].device) +
                                            " memory; delta sync compares host memory only");
        auto &slot = entries_[m.name];
        if (!slot) slot = std::make_unique<Entry>(), slot->name = m.name;
        Entry &e = *slot;
        if (e.staged != Entry::Staged::kNone)
            fail(WSYNC_ERR_INVALID_ARGUMENT, "delta: " + tensor_label(i, m.name.c_str()) +
                                                 " is sent twice in version " +
                                                 std::to_string(version));
        if (version + 1 < e.cool_until) {
            // Auto mode, a tensor that changed too much lately: sent dense with no compare and
            // no base kept, until the version before the next probe rebuilds the base.
            if (e.fold) scatter(e.base.get(), e.parsed), e.fold = false;
            e.stale = true;
            continue;
        }
        staging_.stage(&e);
        Job j;
        j.i = i;
        j.version = version;
        j.e = &e;
        j.esize = dtype_size(m.dtype);
        j.elements = m.nbytes / j.esize;
        j.nbytes = m.nbytes;
        j.dtype = m.dtype;
        j.compare = staging_.patches_allowed() && e.base && !e.stale && staging_.current(e.epoch) &&
                    e.nbytes == m.nbytes && std::memcmp(&e.dtype, &m.dtype, sizeof e.dtype) == 0;
        // A committed patch not yet folded into the base is folded by the compare, block by
        // block; anything that skips or cuts the compare folds it (run()).
        j.fold = e.fold ? &e.parsed : nullptr;
        e.fold = false;
        jobs.push_back(j);
    }
    // 2. The compares and dense copies, each tensor on one thread, several tensors at once
    //    ("delta_threads"): the largest first, so no thread is left with a big one at the end.
    if (!pool_) pool_ = std::make_unique<copy::Pool>(config_.threads);
    if (scratch_.size() < pool_->threads()) scratch_.resize(pool_->threads());
    std::vector<std::size_t> order(jobs.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return jobs[a].nbytes > jobs[b].nbytes; });
    pool_->parallel(order.size(), [&](std::size_t k, unsigned worker) {
        Job &j = jobs[order[k]];
        try {
            run(j, tensors[j.i], worker);
        } catch (...) {
            j.error = std::current_exception();
        }
    });
    // 3. The wire, in the chunk's order; the first tensor that failed fails the chunk (the
    //    core then calls chunk_refused(), which unstages every entry).
    for (Job &j : jobs)
        if (j.error) std::rethrow_exception(j.error);
    for (const Job &j : jobs) {
        if (!j.patch) continue;
        Entry &e = *j.e;
        wsync_tensor_t &w = wire[j.i];
        w.data = e.patch.data();
        w.dtype = {WSYNC_DTYPE_UINT, 8, 1};
        w.ndim = 1;
        w.shape = &e.wire_shape;
        w.strides = nullptr;
        patches[j.i] = {e.patch.size(), staging_.committed(), e.base_hash, j.hash};
    }
}

// One tensor: compare and encode, or copy aside dense. Touches only its own entry and the
// worker's scratch, so tensors run on several threads at once.
void Encoder::run(Job &j, const wsync_tensor_t &t, unsigned worker) {
    Entry &e = *j.e;
    const Patch *fold = j.fold;
    if (j.compare) {
        Changes &scratch = scratch_[worker];
        const uint64_t limit = config_.mode == Mode::kOn
                                   ? UINT64_MAX
                                   : patch_limit(j.nbytes, j.esize, config_.max_percent);
        uint64_t hash = 0;
        const bool found = find_changes(t.data, e.base.get(), j.nbytes, j.esize, limit, fold, scratch, &hash);
        if (!found && fold) scatter(e.base.get(), *fold);
        fold = nullptr;
        if (!found && config_.mode == Mode::kAuto) e.cool_until = j.version + kCoolDown;
        if (found) {
            delta::encode(scratch, j.elements, e.patch);
            if (config_.mode == Mode::kOn || e.patch.size() <= budget(j.nbytes, config_.max_percent)) {
                e.parsed.values = patch_values(e.patch.data());
                e.parsed.esize = j.esize;
                e.parsed.idx.assign(scratch.idx.begin(), scratch.idx.begin() + scratch.count);
                e.staged = Entry::Staged::kPatch;
                e.staged_hash = hash;
                e.wire_shape = int64_t(e.patch.size());
                j.patch = true;
                j.hash = hash;
                return;
            }
        }
    }
    if (fold) scatter(e.base.get(), *fold);
    // Dense: kept aside until the version commits.
    if (!e.spare || e.spare_bytes != j.nbytes) e.spare = allocate(j.nbytes, e.name), e.spare_bytes = j.nbytes;
    e.staged_hash = copy::copy_hashing(e.spare.get(), t.data, j.nbytes, 0, j.nbytes);
    e.staged = Entry::Staged::kDense;
    e.staged_dtype = j.dtype;
}

void Encoder::chunk_refused() { staging_.chunk_refused(); }
void Encoder::chunk_sent() { staging_.chunk_sent(); }
void Encoder::abandon() { staging_.abandon(); }
void Encoder::dense_next() { staging_.dense_next(); }

void Encoder::commit(uint64_t version) {
    for (Entry *e : staging_.staged()) {
        e->base_hash = e->staged_hash;
        if (e->staged == Entry::Staged::kPatch) {
            e->fold = true;  // written into the base by the next compare (or by a dense send)
            e->staged = Entry::Staged::kNone;
            continue;
        }
        std::swap(e->base, e->spare);
        std::swap(e->nbytes, e->spare_bytes);
        e->dtype = e->staged_dtype;
        e->stale = false;
        e->epoch = staging_.epoch();
        e->unstage();
    }
    staging_.committed(version);
}

}  // namespace delta
}  // namespace wsync
