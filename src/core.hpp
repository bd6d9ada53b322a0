// The core objects behind the ABI handles. They hold the logic every strategy shares; abi.cpp
// only translates C calls into these.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "delta/delta.hpp"
#include "delta/auto.hpp"
#include "error.hpp"
#include "plan/parts.hpp"
#include "plan/select.hpp"
#include "strategy.hpp"
#include "sys.hpp"
#include "version_state.hpp"

namespace wsync {

namespace copy {
class Pool;
}
namespace delta {
class Coder;
}

class Strategy {
public:
    Strategy(const KindInfo &kind, const char *options_json);
    const KindInfo &kind() const { return kind_; }
    std::vector<uint8_t> create_init_info();
    std::unique_ptr<class Sender> create_sender(const uint8_t *init, std::size_t len);
    std::unique_ptr<class Receiver> create_receiver(const uint8_t *init, std::size_t len,
                                                    uint32_t index);
    // Whether this strategy made init info (it then holds the segment or endpoint it serves).
    bool made_init() const { return init_made_; }
    const sys::Owner owner;  // the ABI's fork rule (sys.hpp)

private:
    const KindInfo &kind_;
    Options options_;
    delta::Config delta_;
    std::unique_ptr<StrategyImpl> impl_;
    bool init_made_ = false;
};

class Sender {
public:
    Sender(const KindInfo &kind, std::unique_ptr<SenderImpl> impl, const delta::Config &delta);
    ~Sender();
    // parts: NULL, or chunk.count ranges (wsync_sender_send_parts).
    std::vector<uint8_t> send_chunk(const wsync_chunk_t &chunk, const wsync_part_t *parts);
    std::vector<uint8_t> commit();
    void abandon();
    void flush(int64_t timeout_ms);
    void wait_released(uint64_t version, int64_t timeout_ms);
    void drop_receiver(uint32_t index);
    void set_stream(void *stream);
    std::pair<void *, uint64_t> arena() const { return impl_->arena(); }
    uint64_t version() const { return version_; }
    const std::vector<Failure> &failures() const { return failures_; }
    // The engines' apply time of committed `version` as they reported it with their
    // acknowledgements so far (SenderImpl::applied_ns; 0: none reported). What "auto" learns
    // from; no public ABI (white-box tests read it).
    uint64_t engines_apply_ns(uint64_t version);
    // Delta "auto" by cost: what it learned so far (nullptr without it). White-box tests.
    const delta::AutoState *auto_state() const { return auto_ ? &auto_->state() : nullptr; }
    const sys::Owner owner;  // the ABI's fork rule (sys.hpp)

private:
    std::vector<uint8_t> send(const wsync_tensor_t *tensors, std::size_t count, bool last,
                              const wsync_part_t *parts);
    template <class F> auto noting_failures(F &&f) -> decltype(f());
    // Delta "auto": the plan of the version a first chunk begins, and what the last one cost.
    void begin_plan();
    // Whether the coder takes this version (delta on, and not a bare "auto" version).
    bool coding() const { return delta_ && plan_ != delta::Plan::kBare; }
    // `flushed`: the time includes a flush (the engines' acknowledgements, after their apply).
    void measured(double flush_seconds, bool flushed);

    const KindInfo &kind_;
    std::unique_ptr<SenderImpl> impl_;
    std::unique_ptr<delta::Coder> delta_;  // null: delta "off"
    // Delta "auto" (src/delta/auto.hpp): null for "off" and "on". plan_ is the open version's
    // (kPatches for "on"); cost_ sums its time in send_chunk and the coder, and once it
    // committed waits (costed_) for the flush after it, or for the next version's first chunk.
    std::unique_ptr<delta::Auto> auto_;
    delta::Plan plan_ = delta::Plan::kPatches;
    delta::VersionCost cost_;
    bool costed_ = false;
    uint64_t cost_version_ = 0;  // the version cost_ measures
    uint64_t version_ = 1;
    uint64_t first_version_ = 1;  // impl_->first_version()
    uint32_t next_index_ = 0;
    Manifest tally_;  // of the chunks of version_ published so far
    parts::Tracker parts_;  // split tensors of version_ still sending
    std::vector<Failure> failures_;
};

class Iteration;
class DestTable;

class Receiver {
public:
    // mirror: the "delta_mirror" option (docs/delta.md).
    Receiver(const KindInfo &kind, std::unique_ptr<ReceiverImpl> impl, bool mirror = false);
    ~Receiver();
    // The iteration is owned by the receiver until end() (or the receiver's destruction).
    Iteration *receive(const uint8_t *request, std::size_t len);
    // Ends and frees the open iteration; throws its failure after freeing it.
    void end(Iteration *it);
    // Fails and frees the open iteration with the caller's status and message.
    void fail_iteration(Iteration *it, wsync_status_t status, const char *message);
    uint64_t completed_version() const { return state_.completed(); }
    wsync_receiver_state_t poll();
    // Not while an iteration is open: its chunk is released after the stream it began with.
    void set_stream(void *stream);
    // wsync_receiver_land (apply.cpp): lands the table's host destinations as chunks arrive;
    // nullptr stops. Not while an iteration is open.
    void land(const DestTable *table);
    // The transport, for what a destination table asks of it (apply.cpp).
    ReceiverImpl &transport() const { return *impl_; }
    const sys::Owner owner;  // the ABI's fork rule (sys.hpp)

private:
    friend class Iteration;
    void lose_chunk(const ChunkHeader &h, const json &transport, wsync_status_t status,
                    const std::string &why);
    void catch_up(const Link &link);
    void fail_open_version(wsync_status_t status);
    // Chunk `next` of a newer version arrived while a committed version is still open here:
    // that version's remaining chunks were lost; fails it with a record for the sender.
    void lose_open_version(const ChunkHeader &next);
    // Chunk `next` of a version past the next one: the versions between, none of whose chunks
    // reached this receiver, fail here with a record for the sender, as one lost in part does.
    void skip_versions(const ChunkHeader &next, const Link &link);
    void before_ack(const ChunkHeader &h, wsync_status_t outcome, const std::string &message);
    void finished(const ChunkHeader &h, const TensorTable &table, wsync_status_t outcome);

    const KindInfo &kind_;
    std::unique_ptr<ReceiverImpl> impl_;
    std::unique_ptr<copy::Pool> pool_;  // wsync_recv_copy's threads, started on first need
    delta::Patch patch_;             // a patch being applied, and the bytes it replaced: kept,
    std::vector<uint8_t> replaced_;  // so steady versions allocate nothing
    // "delta_mirror": per tensor name, this receiver's own copy of the tensor as it last
    // loaded it (dense bytes copied in, patches applied onto it, both verified). A patch only
    // ever applies onto a mirror that hashes to its base, so a mirror left behind by a failed
    // version is refused by name, never patched into a mix.
    struct Mirror {
        struct Free {
            void operator()(uint8_t *p) const { std::free(p); }
        };
        std::unique_ptr<uint8_t, Free> bytes;
        uint64_t nbytes = 0;
    };
    bool mirror_on_ = false;
    std::unordered_map<std::string, Mirror> mirrors_;
    std::unique_ptr<Iteration> open_;
    VersionState state_;           // the version whose chunks arrive now (version_state.hpp)
    parts::Tracker parts_;         // split tensors of that version still arriving
    select::Version chosen_;       // with a selection: its state within that version
    bool dropped_ = false, sender_gone_ = false;
};

// A chunk seen through a receiver's selection (src/plan/select.hpp): the iteration's table holds the
// selected entries; `whole` is the chunk's own table (the version's tally counts it), and
// `unverified` marks the entries no carried checksum covers (byte ranges).
struct Subset {
    bool active = false;
    TensorTable whole;
    std::vector<uint8_t> unverified;
};

class Iteration {
public:
    Iteration(Receiver &owner, ChunkHeader header, TensorTable table,
              std::unique_ptr<ChunkBacking> backing, bool verify, Subset subset = {});
    ~Iteration();
    Receiver *owner() const { return owner_; }
    void info(wsync_recv_info_t *out) const;
    void peek(std::size_t i, wsync_tensor_t *view) const;
    // part NULL (wsync_recv_next): a part of a split tensor fails the iteration.
    bool next(wsync_tensor_t *view, wsync_part_t *part);
    void part(std::size_t i, wsync_part_t *out) const;
    // wsync_recv_copy: bytes [offset, offset + len) of tensor i into dst, verifying the whole
    // tensor in the same pass the first time any of it is taken (host memory), or queued on
    // the loader's stream by the transport (device memory).
    void copy(std::size_t i, uint64_t offset, void *dst, uint64_t len);
    // wsync_recv_apply: the chunk into the table's destinations (apply.cpp); *out zeroed first.
    void apply(DestTable &table, uint32_t flags, wsync_apply_result_t *out);
    // wsync_recv_patch: tensor i's patch as flat indices and values, checked without the base.
    void patch(std::size_t i, wsync_patch_t *out);
    // Acknowledges; throws the iteration's failure, if any. Called once, by Receiver::end.
    void end();
    // Acknowledges as failed with the loader's own status and message.
    void fail(wsync_status_t status, std::string message);

private:
    void fill(std::size_t i, wsync_tensor_t *view, bool with_data) const;
    // Fails the iteration with WSYNC_ERR_INTEGRITY naming tensor i unless `got` is its checksum;
    // else marks it verified.
    void check_sum(std::size_t i, uint64_t got);
    uint64_t expected_sum(std::size_t i);
    // The checksum of the table's kind (XXH3-64, or the tree hash on the receiver's copy
    // threads) of n bytes at p.
    uint64_t sum_of(const void *p, uint64_t n);
    // Entry i's checksum over its bytes at `bytes` (data(i), in place): the one the transport
    // took as they landed (wsync_receiver_land), else sum_of them.
    uint64_t sum_in_place(std::size_t i, const uint8_t *bytes);
    // Copies bytes [off, off + len) of the `total` bytes at src to dst and returns the checksum
    // of the table's kind of all of them, in one pass (copy::copy_hashing, or
    // Pool::copy_tree_hashing on the copy threads).
    uint64_t copy_summing(void *dst, const void *src, uint64_t total, uint64_t off, uint64_t len);
    // Entry i's share of the whole-tensor range [*offset, *offset + *len) a caller's *dst holds
    // from its byte 0: for a part, the bytes it carries, with *dst moved to their place and
    // *offset in the part's coordinates. False when the entry carries none of the range.
    bool share_of_entry(std::size_t i, uint64_t *offset, void **dst, uint64_t *len) const;
    // Fails the iteration with this status and message (throws).
    [[noreturn]] void fail_chunk(wsync_status_t status, std::string message);
    // Entry i's bytes, once the transport has them in place (ChunkBacking::await); a transport
    // that cannot bring them fails the chunk with its status and message.
    const uint8_t *landed(std::size_t i);
    // A view, copy or patch asked of an iteration that failed: its status, saying so.
    [[noreturn]] void already_failed() const;
    // Why the chunk cannot load any more because the sender dropped this receiver while it was
    // open (ChunkBacking::revoked), naming the chunk; empty if it was not dropped.
    std::string revoked_reason() const;
    // Fails the chunk with WSYNC_ERR_PEER and revoked_reason() if there is one.
    void check_revoked();
    // wsync_recv_copy of a patched tensor: applies it onto dst, which must hold its base.
    void apply_patch(std::size_t i, uint64_t offset, void *dst, uint64_t len);
    // Checks patch i (base version, checksum, structure) and applies it onto dst (nbytes of
    // the tensor), verified; `where` names dst in messages. Fails the iteration on any defect.
    void apply_onto(std::size_t i, void *dst, const char *where);
    // A tree-hashed patch (made on a GPU) onto device memory: queued by the transport
    // (ChunkBacking::queue_patch), its outcome read when the iteration ends.
    void apply_on_device(std::size_t i, void *dst, const std::string &what);
    // Waits for the patches queued on the GPU (once) and fails the chunk, with the first
    // failure's status and message, unless every one applied.
    void settle_device_patches() noexcept;
    // The status and message of a patch that did not apply onto `where`.
    std::pair<wsync_status_t, std::string> apply_failure(std::size_t i, delta::Applied outcome,
                                                         uint64_t got, const std::string &what,
                                                         const char *where) const;
    // Fails the chunk for a patch that did not apply onto `where` (MISMATCH for a base that
    // differs, INTEGRITY for a result that does), naming the hash kind, both sums and versions.
    [[noreturn]] void fail_apply(std::size_t i, delta::Applied outcome, uint64_t got,
                                 const std::string &what, const char *where);
    // "delta_mirror": whether tensor i goes through the receiver's mirror, and the mirror's
    // bytes of it once this chunk's version of it is there (copied or patched, verified).
    bool mirrored(std::size_t i) const;
    const uint8_t *mirror(std::size_t i);
    // Settles, records and acknowledges the chunk; returns the final outcome (the transport
    // may turn WSYNC_OK into a failure, which then becomes the iteration's failure).
    wsync_status_t finish(wsync_status_t outcome) noexcept;

    Receiver *owner_;
    ChunkHeader header_;
    TensorTable table_;
    std::unique_ptr<ChunkBacking> backing_;
    Subset subset_;
    bool verify_;
    std::size_t next_ = 0;
    // What the version's tally counts: the chunk's whole table.
    const TensorTable &tallied() const { return subset_.active ? subset_.whole : table_; }
    // Per tensor: kVerified (its checksum matched, or a selection's range has none to match),
    // kTaken (yielded or copied), kMirrored (in the receiver's mirror at this chunk's version).
    enum : uint8_t { kVerified = 1, kTaken = 2, kMirrored = 4 };
    std::vector<uint8_t> state_;
    // wsync_recv_patch's answers by entry: the same pointers on every call; flat indices the
    // received bytes do not hold as such are decoded into `wide`.
    struct HandedPatch {
        wsync_patch_t out;
        std::vector<int64_t> wide;
    };
    std::unordered_map<std::size_t, HandedPatch> handed_;
    std::vector<std::size_t> device_patches_;  // tensors whose patches are queued on the GPU
    bool device_queued_ = false;               // the transport may hold queued patch work
    // Nanoseconds spent in the host's verified applies of this chunk's patches (onto a
    // destination or the mirror: checksum of the patch, parse, apply), reported to the sender
    // with an OK acknowledgement (docs/delta.md, "How auto decides").
    uint64_t apply_ns_ = 0;
    std::size_t taken_ = 0;
    wsync_status_t failed_ = WSYNC_OK;
    std::string failure_;
    bool finished_ = false;
};

// Shared by core.cpp and iteration.cpp: "chunk 2 of version 7"; a manifest in words; a
// chunk's tensors added to a version's tally.
std::string chunk_label(const ChunkHeader &h);
std::string manifest_text(const Manifest &m);
void tally(Manifest &m, const TensorTable &table);

// Chains a chunk's name/dtype/shape table into a version digest (both sides compute it).
uint64_t chain_digest(uint64_t digest, const TensorTable &table);

// The request body's chunk header (version, chunk, last, manifest), checked.
ChunkHeader decode_header(const json &body);

// wsync_request_merge.
std::vector<uint8_t> merge_requests(const std::vector<std::pair<const uint8_t *, std::size_t>> &parts);

// wsync_blob_describe: the envelope and body as JSON text.
std::string describe_blob(const uint8_t *data, std::size_t size);

}  // namespace wsync
