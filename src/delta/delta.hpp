// Delta sync (docs/delta.md): the patch format, the trainer's committed bases and the receiver's
// verified, all-or-nothing apply. A patch is, to a transport, an opaque uint8 tensor: only the
// core (core.cpp on the sender, iteration.cpp on the receiver) and this file know its layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "copy/copy.hpp"
#include "tensor.hpp"
#include "wsync.h"

namespace wsync {
namespace copy {
class Pool;
}

class Options;
struct OptionSpec;

namespace delta {

// The patch bytes, all little-endian:
//   0  u32 magic "WDP1"        4  u8 coding (kPlain, kGaps)   5  u8 index width (4 or 8)
//   6  u16 0                   8  u32 element size             12 u32 0
//   16 u64 changed elements    24 u64 tensor elements
//   32 indices (count x width), zero-padded to a multiple of 8, then values (count x esize).
// kPlain: each index is the element's flat index. kGaps: each is the distance from the
// previous changed element (the first from element 0), so 32 bits suffice for tensors of more
// than 2^32 elements whenever no two changes are 2^32 or more apart.
constexpr uint32_t kMagic = 0x31504457;  // "WDP1"
constexpr uint64_t kHeaderBytes = 32;
enum Coding : uint8_t { kPlain = 0, kGaps = 1 };

struct IndexCoding {
    Coding coding;
    unsigned width;  // bytes per index: 4 or 8
};
// The narrowest coding for these (strictly increasing) flat indices of a tensor of `elements`:
// plain 32-bit while every index fits in 32 bits (vLLM's int32 flat indices), else 32-bit gaps
// when every gap fits, else plain 64-bit.
IndexCoding choose_coding(const uint64_t *idx, std::size_t count, uint64_t elements);
// Bytes of a patch of `count` elements of `esize` bytes with `width`-byte indices.
uint64_t patch_bytes(uint64_t count, uint64_t esize, unsigned width);

// The changed elements find_changes() found: flat indices (strictly increasing) and, beside
// them, their new bytes (esize each). The vectors only grow (their sizes are capacities);
// `count` is what holds.
struct Changes {
    std::vector<uint64_t> idx;
    std::vector<uint8_t> values;
    std::size_t count = 0;
    uint64_t esize = 0;
};

// Writes the patch of `c` for a tensor of `elements` into `out` (whose capacity is kept across
// versions).
void encode(const Changes &c, uint64_t elements, std::vector<uint8_t> &out);

// Where the values of a patch written by encode() begin.
const uint8_t *patch_values(const uint8_t *bytes);

// A parsed patch: absolute indices (validated: strictly increasing, inside the tensor) and its
// values. Throws WSYNC_ERR_MALFORMED naming `what` on any defect.
struct Patch {
    std::vector<uint64_t> idx;
    const uint8_t *values = nullptr;
    uint64_t esize = 0;
};
Patch parse(const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
            const std::string &what);
// The same into `p`, reusing its index storage.
void parse_into(Patch &p, const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
                const std::string &what);

// The header of a patch, checked against the tensor (element count and size) and against `n`,
// the bytes at hand (exact length): WSYNC_ERR_MALFORMED naming `what` on any defect. The indices
// are not read.
struct Header {
    Coding coding;
    unsigned width;
    uint64_t count;
};
Header check_header(const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
                    const std::string &what);
// WSYNC_ERR_MALFORMED: "<what>: patch index k is out of order or outside the tensor".
[[noreturn]] void bad_index(const std::string &what, uint64_t k);

// The tree hash, the checksum of patches made and applied on a GPU (docs/delta.md, "On the
// GPU"): XXH3-64 over the little-endian array of the XXH3-64 of each kTreePieceBytes piece of
// the bytes (the last piece shorter; no bytes: XXH3-64 of nothing). Pieces hash in parallel,
// on GPU threads (gpu/kernels/delta.cu) or host threads; this is the host's, for tests and for
// combining the pieces' hashes a GPU computed.
constexpr uint64_t kTreePieceBytes = copy::kTreePieceBytes;  // defined with the hash, src/copy/copy.hpp
uint64_t tree_hash(const void *data, uint64_t nbytes);
uint64_t combine_piece_hashes(const uint64_t *hashes, uint64_t count);

// A patch checked where it lies (wsync_recv_patch): header, exact length, and every index
// strictly increasing and inside the tensor, without decoding the indices into a copy. Throws
// WSYNC_ERR_MALFORMED naming `what` on any defect, as parse() does.
struct PatchView {
    Coding coding = kPlain;
    unsigned width = 4;              // bytes per index on the wire
    uint64_t count = 0;              // changed elements
    const uint8_t *indices = nullptr;  // count x width, little-endian
    const uint8_t *values = nullptr;   // count x esize
};
PatchView check(const uint8_t *bytes, uint64_t n, uint64_t elements, uint64_t esize,
                const std::string &what);
// Whether the view's indices already are the flat indices in the host's own signed integer of
// their width (plain coding on a little-endian host, and for 4-byte indices every index below
// 2^31), so a caller may read them in place as int32_t / int64_t.
bool flat_in_place(const PatchView &v, uint64_t elements);
// The view's flat indices as int64_t (gaps summed, 32-bit ones widened): count of them.
void flat_indices(const PatchView &v, int64_t *out);

// Finds the elements where `now` and `base` (nbytes each, elements of esize bytes) differ
// bitwise (a NaN payload or -0.0 vs 0.0 is a change) and hashes `now` (XXH3-64) in the same
// pass. With `fold`, first writes that patch into base (a committed version's changes), block
// by block just ahead of the compare. Stops and returns false once more than `limit` elements
// differ, within the 16 KiB block where that happens (*hash is then not set, out.count is
// above `limit`, and base holds only part of the fold).
bool find_changes(const void *now, void *base, uint64_t nbytes, uint64_t esize, uint64_t limit,
                  const Patch *fold, Changes &out, uint64_t *hash);

// Applies `p` to dst (nbytes) in one pass that patches and hashes it; keeps the result only if
// it hashes to result_hash (then dst holds the trainer's tensor, bit for bit), else puts dst
// back as it was and hashes it again to say why: kBaseDiffers (dst did not hash to base_hash)
// or kResultDiffers, with the hash that did not match in *got. Returns kApplied otherwise.
enum class Applied { kApplied, kBaseDiffers, kResultDiffers };
// `old` is scratch for the changed elements' previous bytes (resized as needed, kept).
Applied apply_verified(void *dst, uint64_t nbytes, const Patch &p, uint64_t base_hash,
                       uint64_t result_hash, uint64_t *got, std::vector<uint8_t> &old);
// How a patch applied on a GPU went (gpu::DeltaKernels reports it; the transport hands it to the
// core, which fails the chunk for anything but kApplied).
struct PatchOutcome {
    enum class Kind { kApplied, kMalformed, kBaseDiffers, kResultDiffers };
    Kind outcome = Kind::kApplied;
    uint64_t got = 0;     // the hash that did not match
    std::string message;  // why, naming the tensor (kMalformed: the defect)
};
// Writes the patch's values into dst without any check (the trainer's own bases).
void scatter(void *dst, const Patch &p);

// ------------------------------------------------------------------------------------------
// The sender's options (every kind accepts them; only host kinds take a value but "off").
enum class Mode { kOff, kAuto, kOn };
struct Config {
    Mode mode = Mode::kOff;
    bool by_cost = true;        // auto: versions chosen by measured cost ("delta_decide")
    uint64_t anchor_every = 0;  // 0: no periodic dense versions
    uint64_t max_percent = 50;  // auto: a patch is sent when at most this % of the dense bytes
    bool mirror = false;        // receiver: keep a copy of every tensor, apply patches to it
    bool pinned_bases = false;  // GPU kinds: bases in pinned host memory ("delta_base_memory")
    unsigned threads = 0;       // host compare: threads ("delta_threads"; 0: one per CPU, <= 8)
};
const std::vector<OptionSpec> &option_specs();
// The kind's own options followed by the delta options.
const std::vector<OptionSpec> &with_delta_options(const std::vector<OptionSpec> &(*kind)());
// Reads and checks the options for `kind_name`: throws WSYNC_ERR_UNSUPPORTED for a delta mode
// other than "off" on a kind that does not carry delta sync (KindInfo::delta_sync), and for
// "delta_mirror" where no patch reaches host memory (such kinds, and the ones that apply
// patches on the GPU: KindInfo::delta_on_device).
Config config_from(const Options &o, const char *kind_name, bool kind_has_delta, bool on_device);

// The trainer's side of delta sync as the core drives it, chunk by chunk: the host's Encoder
// (below) for host memory, gpu::DeviceCoder (gpu/delta_coder.hpp) for the GPU kinds, which a
// SenderImpl provides (SenderImpl::delta_coder).
class Coder {
public:
    virtual ~Coder() = default;
    // Encodes one chunk of `version` (the first call of a version decides whether it may carry
    // patches). Fills `wire` with the descriptors to move (patches as uint8 tensors over bytes
    // the coder owns until the version ends) and `patches` per tensor (wire_bytes 0: dense).
    virtual void encode(uint64_t version, const wsync_tensor_t *tensors,
                        const std::vector<TensorMeta> &metas, std::vector<wsync_tensor_t> &wire,
                        std::vector<PatchInfo> &patches) = 0;
    // Whether the version being encoded may carry patches (it follows the last committed one
    // directly, no dense version was asked for, it is not an anchor); valid after encode().
    virtual bool patching() const = 0;
    // The chunk just encoded was refused before it moved: forget what it staged.
    virtual void chunk_refused() = 0;
    // The chunk just encoded was published.
    virtual void chunk_sent() = 0;
    // The version committed: its staged bytes become the bases.
    virtual void commit(uint64_t version) = 0;
    // The version was abandoned: its staged bytes are dropped; the next version is dense.
    virtual void abandon() = 0;
    // A receiver failed (or may have missed) something: the next version is dense.
    virtual void dense_next() = 0;
    // The stream the caller's writes to its tensors are queued on (wsync_sender_set_stream);
    // the host coder has none.
    virtual void set_stream(void * /*stream*/) {}
};

// Whether version `version` may carry patches: it directly follows the last committed one,
// no dense version was asked for, and it is not an anchor.
bool patches_allowed(const Config &config, uint64_t version, uint64_t committed, bool dense_next);
// Auto mode: a tensor whose changes made its patch too large is sent dense without compare or
// base for this many versions, then probed again (docs/delta.md: when dense is chosen).
constexpr uint64_t kCoolDown = 8;
// The largest number of changed elements whose patch stays within `percent` of `nbytes`
// (estimated with 32-bit indices; the encoded size is checked again), and that budget in bytes.
uint64_t patch_limit(uint64_t nbytes, uint64_t esize, uint64_t percent);
uint64_t budget(uint64_t nbytes, uint64_t percent);

// The version bookkeeping every coder shares: whether the version being sent may carry
// patches, which entries the last chunk and the open version staged, and what a refused chunk,
// a published one, a commit and an abandon do to them. E is a coder's per-tensor entry, with
// unstage() (forget what was staged for it).
template <class E>
class Staging {
public:
    // At each chunk of `version`; the first one decides whether the version may carry patches.
    void begin_chunk(const Config &config, uint64_t version) {
        if (open_ != version) {
            open_ = version;
            version_.clear();
            allowed_ = delta::patches_allowed(config, version, committed_, dense_next_);
            dense_next_ = false;
            if (!allowed_) ++epoch_;  // every base now predates what some receiver holds
        }
        chunk_.clear();
    }
    // Which dense versions a tensor's base has followed: an entry committed dense records
    // epoch() at its commit, and may be compared (sent as a patch) only while that is still
    // epoch(). A version that may not carry patches (a receiver failed, missed or re-attached;
    // an abandon; an anchor) begins a new epoch, so *every* tensor's next send is dense, also
    // one that version does not carry (delta user trial: after engines re-attached, a version
    // carrying one chunk went dense, and the next sent patches of the other tensors against
    // bases those engines never had; an engine that applies patches itself served them).
    uint64_t epoch() const { return epoch_; }
    bool current(uint64_t entry_epoch) const { return entry_epoch == epoch_; }

    void stage(E *e) { chunk_.push_back(e); }
    bool patches_allowed() const { return allowed_; }
    uint64_t committed() const { return committed_; }  // last committed version (0: none)
    // The chunk just encoded was refused before it moved: forget what it staged.
    void chunk_refused() {
        for (E *e : chunk_) e->unstage();
        chunk_.clear();
    }
    // The chunk just encoded was published: its entries belong to the open version.
    void chunk_sent() {
        version_.insert(version_.end(), chunk_.begin(), chunk_.end());
        chunk_.clear();
    }
    // The open version's entries, for the coder's commit; then committed(version).
    const std::vector<E *> &staged() const { return version_; }
    void committed(uint64_t version) {
        version_.clear();
        committed_ = version;
        open_ = 0;
    }
    // The version was abandoned: nothing it staged stays, and the next version is dense.
    void abandon() {
        for (E *e : version_) e->unstage();
        chunk_refused();
        version_.clear();
        open_ = 0;
        dense_next_ = true;
    }
    void dense_next() { dense_next_ = true; }

private:
    std::vector<E *> chunk_, version_;  // staged by the last chunk / by the open version
    uint64_t committed_ = 0;            // last committed version (0: none)
    uint64_t open_ = 0;                 // version being encoded (0: none)
    uint64_t epoch_ = 0;                // see epoch()
    bool allowed_ = false;
    bool dense_next_ = false;
};

// The host's coder: per tensor name, the bytes of the last committed version and its hash;
// what a version being sent will change is kept apart and folded in only at its commit, so an
// abandoned or failed version never touches a base.
class Encoder final : public Coder {
public:
    explicit Encoder(Config config);
    ~Encoder() override;
    void encode(uint64_t version, const wsync_tensor_t *tensors,
                const std::vector<TensorMeta> &metas, std::vector<wsync_tensor_t> &wire,
                std::vector<PatchInfo> &patches) override;
    bool patching() const override { return staging_.patches_allowed(); }
    void chunk_refused() override;
    void chunk_sent() override;
    void commit(uint64_t version) override;
    void abandon() override;
    void dense_next() override;

private:
    struct Entry;
    // One tensor of a chunk, as encode() plans it and its workers carry it out.
    struct Job;
    void run(Job &j, const wsync_tensor_t &t, unsigned worker);
    Config config_;
    std::unordered_map<std::string, std::unique_ptr<Entry>> entries_;
    Staging<Entry> staging_;
    std::unique_ptr<copy::Pool> pool_;  // the compare's threads, made at the first chunk
    std::vector<Changes> scratch_;      // per worker: what find_changes found; capacity kept
};

}  // namespace delta
}  // namespace wsync
