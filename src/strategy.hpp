// What a strategy supplies. The core (core.cpp) owns everything common to all kinds: option
// validation, the envelope, the tensor table, chunk order, sync versions, the receive iteration
// and checksum verification. A strategy (a flat file strategy_<kind>.cpp, or a folder
// transport/<kind>/ once it outgrows one) owns only its transport: its init-info body, the
// "transport" map of its requests, and moving the bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "delta/delta.hpp"
#include "options.hpp"
#include "tensor.hpp"
#include "wire.hpp"

namespace wsync {

using json = nlohmann::json;

// What a committed version holds: carried by its last chunk's request, tallied by receivers.
struct Manifest {
    uint64_t tensors = 0;
    uint64_t bytes = 0;
    uint32_t chunks = 0;
    uint64_t digest = 0;  // chained XXH3 of every chunk's name/dtype/shape table
    bool operator==(const Manifest &o) const {
        return tensors == o.tensors && bytes == o.bytes && chunks == o.chunks && digest == o.digest;
    }
};

// Where a chunk sits in the stream of syncs.
struct ChunkHeader {
    uint64_t version = 0;      // sync version, from 1
    uint32_t chunk_index = 0;  // position within the version
    bool last = false;         // commits the version
    Manifest manifest;         // when last: the whole version's
};

// Bytes [offset, offset + bytes) of a chunk's buffer.
struct ByteRange {
    uint64_t offset = 0;
    uint64_t bytes = 0;
};

namespace select {
struct Spec;
}

// What a receiver's transport knows of its standing with the senders.
struct Link {
    bool dropped = false;
    bool sender_gone = false;
    bool joining = false;            // (re)attached; no version has begun for it yet
    uint64_t abandoned_version = 0;  // newest version a sender abandoned
};

// The transport side of one received chunk: where each tensor's bytes are, and how the
// receiver tells the sender it is done with them.
class ChunkBacking {
public:
    virtual ~ChunkBacking() = default;
    virtual const void *data(std::size_t i) const = 0;
    // Blocks until entry i's bytes are in place at data(i), for a transport that moves a chunk
    // while the loader reads it (ucx pulls a large chunk in pieces); bounded by the receiver's
    // deadline. Throws the Error that kept them from arriving (the trainer unreachable, the
    // deadline, a refused fetch), naming the chunk; the iteration then fails the chunk with it.
    // Bytes that arrived stay valid whatever later pieces do. The iteration calls it before every
    // read of data(i): a view, a verification, a copy, a patch.
    virtual void await(std::size_t /*i*/) {}
    virtual wsync_device_t device() const = 0;
    virtual bool read_only() const = 0;
    // wsync_recv_copy() for a backing in device memory: checks `dst` (device memory of this
    // backing's GPU, [dst, dst + len) inside one allocation; else WSYNC_ERR_INVALID_ARGUMENT
    // naming `what`, nothing queued) and queues the copy of `len` bytes from `src` (inside the
    // chunk) on the loader's stream, which settle() waits for. Returns false where the transport
    // has no such copy (the iteration then refuses it as WSYNC_ERR_UNSUPPORTED).
    // `what` makes the tensor's label, called only for a message.
    virtual bool copy_to_device(void * /*dst*/, const void * /*src*/, uint64_t /*len*/,
                                const std::function<std::string()> & /*what*/) {
        return false;
    }
    // wsync_recv_apply() for a backing in device memory: the dense copies of a chunk (each
    // `src` inside the chunk, each `dst` checked by the receiver's describe_destination() when
    // its table was made and rechecked since) queued as one kernel launch on the loader's
    // stream, which settle() waits for as for copy_to_device(): small copies by one kernel
    // launch, large ones by the driver's device copy (gpu::Packer). Returns false where the
    // transport has no such path (the iteration then copies one by one); else fills *queued.
    // `what` names the chunk, for messages only.
    struct DeviceCopy {
        const void *src;
        void *dst;
        uint64_t len;
    };
    struct BatchQueued {
        uint32_t launches = 0;       // kernel launches (0 or 1)
        uint64_t driver_copies = 0;  // driver device copies
    };
    virtual bool copy_batch_to_device(const std::vector<DeviceCopy> & /*copies*/,
                                      const std::function<std::string()> & /*what*/,
                                      BatchQueued * /*queued*/) {
        return false;
    }
    // wsync_recv_copy() from a backing in host memory whose receiver has a GPU (ucx with
    // "device"): true when `dst` is device memory, which the iteration then verifies on the host
    // and fills through copy_to_device() (`src` is then host memory). False: host memory.
    virtual bool device_destination(const void * /*dst*/) const { return false; }
    // wsync_recv_copy() of a patch made on a GPU (tree-hashed, docs/delta.md "On the GPU"):
    // queues the verified, all-or-nothing apply of the patch at `patch` (inside the chunk,
    // `patch_bytes`) onto `dst`, which must be device memory of this backing's GPU holding the
    // tensor (`elements` of `esize` bytes) as of the patch's base, on the loader's stream, and
    // returns without waiting for the GPU: the loader's later work on that stream sees dst
    // final. Returns false where the transport has no such apply. Throws
    // WSYNC_ERR_INVALID_ARGUMENT for a destination that is not such memory, or
    // WSYNC_ERR_MALFORMED naming `what` for a patch whose size already shows a defect (nothing
    // queued either way), or a driver error's status. The patch's memory stays valid until
    // patch_outcomes() returns.
    struct DevicePatch {
        const void *patch = nullptr;
        uint64_t patch_bytes = 0, elements = 0, esize = 0, base_hash = 0, result_hash = 0;
    };
    virtual bool queue_patch(void * /*dst*/, const DevicePatch & /*p*/, const std::string & /*what*/) {
        return false;
    }
    // How the patches queue_patch() queued went, in queue order: waits once, bounded by the
    // receiver's timeout, for the loader's stream to run them (WSYNC_ERR_TIMEOUT, or a failed
    // kernel's status, naming the step; `what` says which chunk's patches). Called once, when
    // an iteration that queued any ends, before settle().
    virtual std::vector<delta::PatchOutcome> patch_outcomes(const std::string & /*what*/) { return {}; }
    // Called exactly once, when the iteration ends, before anything is told to the sender:
    // finishes the transport's own part of the chunk (cuda_ipc: waits, with a deadline, for the
    // loader's GPU copies out of the views) and returns the final outcome, which may turn
    // WSYNC_OK into a failure (then *message says why). The core reports that outcome to the
    // engine's caller and records it for the sender, so both sides see the same result.
    virtual wsync_status_t settle(wsync_status_t outcome, std::string * /*message*/) noexcept {
        return outcome;
    }
    // Non-empty when the sender may have reused this chunk's memory while the receiver still
    // reads it, because it dropped this receiver (wsync_sender_drop_receiver) meanwhile: says
    // why ("shm: this receiver was dropped by the sender"; the iteration names the chunk). The
    // chunk then fails with WSYNC_ERR_PEER and its version is never
    // completed here, however its bytes looked. Reads of the chunk's memory made before the
    // call are covered by its answer (board::revoked).
    virtual std::string revoked() const noexcept { return {}; }
    // Whether [dst, dst + len) overlaps memory this process maps from the sender read-only
    // (shm: the segment's data region, every bucket and the arena): a caller passing another
    // tensor's view as a destination would crash there, so wsync_recv_copy refuses it.
    virtual bool maps_read_only(const void * /*dst*/, uint64_t /*len*/) const noexcept { return false; }
    // Called at most once, before acknowledge(WSYNC_OK): this receiver spent `ns` (> 0)
    // nanoseconds in the verified apply of the chunk's patches on the host, which the kind
    // reports to the sender with the acknowledgement where it can (the board, ucx's Ack).
    virtual void report_apply(uint64_t /*ns*/) noexcept {}
    // Whether the transport landed entry i's bytes in the engine's own memory as they arrived
    // (wsync_receiver_land): data(i) is then that memory, a destination of the landing table.
    virtual bool in_place(std::size_t /*i*/) const { return false; }
    // For an entry in_place(), after await(i): its checksum (as the request's checksums are
    // computed: the tree hash) over the bytes as they landed, computed while they were still
    // in the cache; false when it was not computed (the iteration then hashes data(i)).
    virtual bool landed_sum(std::size_t /*i*/, uint64_t * /*sum*/) { return false; }
    // Entry i's checksum (i of the table the transport was given) when the request said they
    // follow the bytes (TensorTable::sums_follow), blocking (within the receiver's deadline)
    // until it arrived. Throws the Error that kept it from arriving.
    virtual uint64_t trailing_sum(std::size_t i);
    // Called exactly once, after settle() and after a failure was recorded: publishes the final
    // outcome (WSYNC_OK or the status the chunk failed with) to the sender.
    virtual void acknowledge(wsync_status_t outcome) noexcept = 0;
};

class SenderImpl {
public:
    virtual ~SenderImpl() = default;
    // Moves the validated chunk (table.metas already checked; the strategy fills
    // table.offsets and, if it computes them, table.checksums) and returns the request's
    // "transport" map. Must publish nothing if it throws.
    virtual json send(const ChunkHeader &header, const wsync_tensor_t *tensors,
                      TensorTable &table) = 0;
    virtual void flush(int64_t timeout_ms) = 0;
    // Called by the core before the first chunk of a version is encoded: receivers that
    // attached or re-attached since the last version are admitted from this version on, and
    // the answer says whether any was (a delta sender then sends the version dense, since a
    // newcomer holds no base). Kinds without such admission answer false.
    // `version` is the version about to begin; the call may repeat for it (a first chunk
    // refused and sent again) and must then answer alike.
    virtual bool begin_version(uint64_t /*version*/) { return false; }
    // The version this sender's first chunk belongs to: 1, or for a sender made again where
    // an earlier one left receivers attached (cuda_ipc, one sender) the version after the
    // newest that one began, so those receivers take it as newer. Asked once, at creation.
    virtual uint64_t first_version() const { return 1; }
    // Waits until no receiver maps memory of this sender that `version` (committed) does not
    // use any more (WSYNC_ALL_VERSIONS: no memory at all), so the trainer may free it. Kinds that
    // copy the caller's tensors during send have nothing to wait for.
    virtual void wait_released(uint64_t /*version*/, int64_t /*timeout_ms*/) {}
    // The version will get no more chunks: tell receivers (shm, cuda_ipc: the board).
    virtual void abandon(uint64_t /*version*/) {}
    // Stop waiting for receiver `index`; throws WSYNC_ERR_UNSUPPORTED where the kind cannot.
    virtual void drop_receiver(uint32_t index);
    // The stream whose queued work GPU reads are ordered after (nullptr: the legacy default
    // stream). Host kinds read no GPU memory: nothing to order.
    virtual void set_stream(void * /*stream*/) {}
    // The trainer's side of delta sync for this transport's memory, or nullptr for the host's
    // (delta::Encoder). Called once, when the sender is made with a "delta" other than "off".
    virtual std::unique_ptr<delta::Coder> delta_coder(const delta::Config & /*config*/) {
        return nullptr;
    }
    // The engines' apply time of committed `version` (docs/delta.md, "How auto decides"), in
    // nanoseconds, as they reported it with their acknowledgements so far: per chunk the
    // slowest engine's, summed over the version's chunks. 0 where none reported (older
    // engines, no patches) or the kind carries no report. Untrusted (other processes): the
    // caller bounds what it makes of it.
    virtual uint64_t applied_ns(uint64_t /*version*/) { return 0; }
    // Host memory the caller may keep its tensors in, which are then sent in place (shm's
    // "arena_bytes"): its first byte and size, {nullptr, 0} where the kind has none.
    virtual std::pair<void *, uint64_t> arena() const { return {nullptr, 0}; }
};

// A destination a receiver lands a wire tensor's bytes in as they arrive (wsync_receiver_land):
// byte `offset` of the tensor `meta` describes goes to `data`, `len` bytes of it (host memory
// the engine owns and keeps writable while landing is set).
struct Landing {
    TensorMeta meta;
    uint8_t *data = nullptr;
    uint64_t offset = 0, len = 0;
};

class ReceiverImpl {
public:
    virtual ~ReceiverImpl() = default;
    // wsync_receiver_land(): from the next chunk on, land each dense entry whose name has
    // exactly one of `dests` (same dtype and shape, covering the entry's bytes) straight in
    // it; an empty list stops. False where the kind does not land bytes (nothing changes).
    virtual bool land(std::vector<Landing> /*dests*/) { return false; }
    // Validates the transport map against the table (every offset and length in bounds, the
    // chunk still current) and returns its backing. Throws WSYNC_ERR_MALFORMED or
    // WSYNC_ERR_MISMATCH; touches no tensor bytes.
    virtual std::unique_ptr<ChunkBacking> open(const ChunkHeader &header, const TensorTable &table,
                                               const json &transport) = 0;
    // The receiver's selection (src/plan/select.hpp), or nullptr: it pulls every tensor.
    virtual const select::Spec *selection() const { return nullptr; }
    // With a selection, instead of open(): `table` is the chunk's whole wire table (checked as
    // open() checks it), and only `fetch` is moved, range k becoming the backing's data(k);
    // an empty `fetch` moves nothing. Kinds without a selection never get this call.
    virtual std::unique_ptr<ChunkBacking> open_ranges(const ChunkHeader &header,
                                                      const TensorTable &table,
                                                      const std::vector<ByteRange> &fetch,
                                                      const json &transport);
    // Throws WSYNC_ERR_MISMATCH, naming both, when the request belongs to another sync than
    // this receiver's (another shm segment, another ucx trainer session). Called before the
    // core looks at the request's version and chunk, so such a request (a controller that
    // routed it to the wrong engine, a restarted trainer's request given to a receiver of the
    // old one) changes nothing here (delta user trial: it failed a version and wedged the
    // engine). Kinds whose requests carry no sync identity ("cuda_ipc", "nccl_broadcast")
    // accept every request here.
    virtual void check_addressed(const json & /*transport*/) const {}
    // Whether carried checksums are verified before tensors are yielded.
    virtual bool verify_checksums() const = 0;
    // Whether the init info promised tensor checksums in every request.
    virtual bool checksums_promised() const { return false; }
    // Whether this request's checksums follow its bytes (ChunkBacking::trailing_sums) rather
    // than travel in its table. `transport` is checked later by open().
    virtual bool sums_follow(const json & /*transport*/) const { return false; }
    // Whether chunks are acknowledged only after the loader's work queued on its stream before
    // wsync_recv_end() ran (WSYNC_RECEIVER_ORDERS_LOADER_WORK).
    virtual bool orders_loader_work() const { return false; }
    // Threads a large wsync_recv_copy is split between (0: sized to the machine).
    virtual unsigned copy_threads() const { return 1; }
    // The core refuses a well-formed, authentic request (out of order, its version already
    // failed here): if the chunk is current and owed by this receiver, acknowledge it as failed
    // (so the sender does not wait for it) and, with `record`, tell the sender why.
    virtual void refuse(const ChunkHeader & /*header*/, const json & /*transport*/,
                        wsync_status_t /*status*/, const std::string & /*message*/,
                        bool /*record*/) noexcept {}
    // A chunk of `header`'s version failed here for the first time: tell the sender why, before
    // the failed acknowledgement.
    virtual void record_failure(const ChunkHeader & /*header*/, wsync_status_t /*status*/,
                                const std::string & /*message*/) noexcept {}
    virtual Link link() const { return {}; }
    // The stream the loader queues its copies out of views on (nullptr: the legacy default
    // stream); chunks are released after that work. Host kinds: nothing to order.
    virtual void set_stream(void * /*stream*/) {}
    // wsync_dest_table_create(): where `len` bytes at `data` are for this receiver. Host
    // memory: an empty list (nothing to check; the CPU writes it). Device memory of this
    // receiver's GPU: the allocations that hold it (checked with the driver, a span of mapped
    // allocations accepted), which recheck_destination() compares again before each apply.
    // Throws WSYNC_ERR_INVALID_ARGUMENT naming what() for memory this receiver cannot fill.
    struct DestMemory {
        bool device = false;
        std::vector<std::pair<uint64_t, uint64_t>> pieces;  // (base, size) per allocation
        std::vector<unsigned long long> ids;                // each one's driver buffer id
    };
    virtual DestMemory describe_destination(void * /*data*/, uint64_t /*len*/,
                                            const std::function<std::string()> & /*what*/) const {
        return {};
    }
    virtual void recheck_destination(const DestMemory & /*mem*/,
                                     const std::function<std::string()> & /*what*/) const {}
};

class StrategyImpl {
public:
    virtual ~StrategyImpl() = default;
    virtual json create_init_info() = 0;  // the init-info body
    virtual std::unique_ptr<SenderImpl> create_sender(const json &init_body) = 0;
    virtual std::unique_ptr<ReceiverImpl> create_receiver(const json &init_body,
                                                          uint32_t index) = 0;
};

// A registered kind. Each strategy defines one (a folder: in its strategy.cpp) and lists it in
// registry.cpp.
// What a kind does differently, as data (wsync_strategy_kinds' "capabilities"; the conformance
// suite, tests/conformance, reads it to know which specifications apply and how).
struct KindCapabilities {
    // Where the sender's tensors and the receivers' views live: "host", "cuda", or "host,cuda".
    const char *tensor_memory = "host";
    // wsync_sender_drop_receiver() lets the sender go on without a receiver.
    bool drop_receiver = true;
    // A process made later with a receiver index another held (a restarted or replacement
    // engine) takes part from the next version.
    bool reattach = true;
    // The receivers take each chunk together: one receiver that dies, stalls or fails fails the
    // chunk on every receiver and ends the sender (it reports the reason from then on).
    bool collective = false;
    // The sender and each receiver must be on GPUs of their own.
    bool gpu_per_receiver = false;
};

struct KindInfo {
    const char *name;
    const std::vector<OptionSpec> &(*options)();
    // "" when the kind can be created here with these options (nullptr: the defaults), else
    // what is missing (e.g. "cannot load libcuda.so.1").
    std::string (*unavailable_reason)(const Options *options);
    std::unique_ptr<StrategyImpl> (*create)(const Options &options);
    // Merges the transport maps of several senders' requests for one chunk; nullptr for kinds
    // with a single sender (then only n == 1 is accepted).
    json (*merge_transports)(const std::vector<const json *> &transports);
    // What the kind would run on here with default options ("CUDA driver 13000 (libcuda.so.1);
    // NCCL 2.28.9 (libnccl.so.2)"), or nullptr when there is nothing to report.
    std::string (*runtime)();
    // Whether the kind carries delta sync (docs/delta.md): "shm" and "ucx" on the host, the GPU
    // kinds on the device.
    bool delta_sync = false;
    // Whether the kind is experimental: its options and wire may change in any minor version
    // (docs/abi-policy.md, "Experimental"); wsync_strategy_kinds says so.
    bool experimental = false;
    // Whether delta sync runs on the GPU (its SenderImpl provides the coder; receivers apply
    // patches on the device, into the engine's memory, so "delta_mirror" does not apply).
    bool delta_on_device = false;
    KindCapabilities capabilities{};
};

// The kind's own options followed by those every kind takes (delta sync's).
const std::vector<OptionSpec> &option_specs(const KindInfo &kind);

// For create_receiver: throws WSYNC_ERR_INVALID_ARGUMENT unless index < receivers, naming the
// valid range ("shm: receiver index 3 is out of range: this sync has 2 receivers (0..1)").
void check_receiver_index(const char *kind, uint32_t index, uint32_t receivers);

const std::vector<const KindInfo *> &registered_kinds();
// Throws WSYNC_ERR_UNSUPPORTED naming the kind and listing the known ones.
const KindInfo &find_kind(const std::string &name);

extern const KindInfo kShmKind;
extern const KindInfo kCudaIpcKind;
extern const KindInfo kNcclBroadcastKind;
extern const KindInfo kUcxKind;  // built only with UCX's header (WSYNC_HAVE_UCX)

}  // namespace wsync
