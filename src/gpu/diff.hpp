// Delta sync on the GPU (docs/delta.md, "On the GPU"): the launch logic of the kernels in
// gpu/kernels/delta.cu. The trainer's compare + stream compaction (diff), the receiver's
// verified, all-or-nothing apply (apply), the trainer's fold of a committed patch into its base
// (fold), and tree hashes of device memory (tree_hashes). Patches are delta.hpp's format with
// plain indices, so a patch made here is byte for byte the one the host encoder makes of the
// same tensors when it chooses plain coding; checksums are tree hashes (delta::tree_hash),
// which GPU threads compute in parallel.
//
// Every call takes one stream: work is queued on it after what the caller queued there, and a
// call that needs results on the host (counts, hashes, flags) waits for the stream with the
// deadline (WSYNC_ERR_TIMEOUT naming `what`), polling an event, before it copies them back; a
// failed kernel or copy is the driver's error (WSYNC_ERR_SYSTEM naming the step). Not
// thread-safe: one DeltaKernels per stream user.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "delta/delta.hpp"
#include "gpu/device.hpp"
#include "gpu/kernels/delta_abi.hpp"
#include "sys.hpp"

namespace wsync::gpu {

struct DeviceRange {
    CUdeviceptr ptr = 0;
    uint64_t bytes = 0;
};

class DeltaKernels {
public:
    explicit DeltaKernels(const Device &d);  // loads the module (WSYNC_ERR_SYSTEM if it cannot)
    ~DeltaKernels();
    DeltaKernels(const DeltaKernels &) = delete;
    DeltaKernels &operator=(const DeltaKernels &) = delete;

    // The tree hash of each range, in order. Blocks until computed or the deadline.
    std::vector<uint64_t> tree_hashes(const std::vector<DeviceRange> &ranges, CUstream stream,
                                      const sys::Deadline &deadline, const std::string &what);

    // ---- the trainer ---------------------------------------------------------------------
    // One tensor: its new bytes and its committed base on the device (elements of esize 1, 2,
    // 4 or 8 bytes, both aligned to esize), and the most changed elements a patch may carry.
    struct DiffJob {
        CUdeviceptr now = 0, base = 0;
        uint64_t elements = 0;
        uint32_t esize = 0;
        uint64_t limit = 0;
    };
    struct DiffOut {
        uint64_t changed = 0;      // elements that differ bitwise
        bool patch = false;        // changed <= limit: a patch was written
        CUdeviceptr bytes = 0;     // the patch (device memory this object owns), 8-byte aligned
        uint64_t nbytes = 0;
        unsigned width = 0;        // its index width: 4 while elements <= 2^32, else 8
        uint64_t result_hash = 0;  // tree hash of `now`
    };
    // Counts the changes of every job and hashes `now` (one wait): fills each out's changed,
    // patch (changed <= limit, and the tensor not empty), width, nbytes and result_hash; bytes
    // stays 0. Throws WSYNC_ERR_INVALID_ARGUMENT naming `what` for an element size or alignment
    // the kernels do not take (callers send such tensors dense).
    void count(const std::vector<DiffJob> &jobs, CUstream stream, const sys::Deadline &deadline,
               const std::string &what, std::vector<DiffOut> *out);
    // Queues the compaction of the jobs count() just counted (the same jobs, and nothing else
    // counted since) into the patches: out[i].bytes, set by the caller for each out[i].patch,
    // is device memory of at least out[i].nbytes bytes, 8-byte aligned. Returns once queued.
    void compact(const std::vector<DiffJob> &jobs, const std::vector<DiffOut> &out,
                 CUstream stream);
    // count() then compact() into patches this object owns: valid until the next diff() (whose
    // first wait follows whatever the caller queued after them on the same stream).
    void diff(const std::vector<DiffJob> &jobs, CUstream stream, const sys::Deadline &deadline,
              const std::string &what, std::vector<DiffOut> *out);
    // Whether diff() takes a tensor of this element size at these addresses.
    static bool diffable(uint64_t esize, CUdeviceptr now, CUdeviceptr base);

    // Writes the changes of patches diff() made onto their bases, unchecked (the trainer's own
    // committed versions). Queued only.
    struct FoldJob {
        CUdeviceptr base = 0;
        uint64_t elements = 0;
        uint32_t esize = 0;
        CUdeviceptr patch = 0;  // as diff() made it
        uint64_t changed = 0;
        unsigned width = 4;
    };
    void fold(const std::vector<FoldJob> &jobs, CUstream stream);

    // ---- the receiver ----------------------------------------------------------------------
    // One patched tensor: the engine's device memory that holds the base version, and the
    // patch's bytes in device memory (plain coding) with the tree hashes of base and result.
    struct ApplyJob {
        CUdeviceptr dst = 0;
        uint64_t elements = 0;
        uint32_t esize = 0;
        CUdeviceptr patch = 0;
        uint64_t nbytes = 0;
        uint64_t base_hash = 0, result_hash = 0;
        std::string label;  // names the tensor in messages ("tensor 3 'w' in chunk 0 of version 2")
    };
    using Outcome = delta::PatchOutcome::Kind;
    using ApplyOut = delta::PatchOutcome;
    // Queues the verified, all-or-nothing apply of one patch on `stream`, after the work queued
    // there before, and returns without waiting for the GPU (docs/delta.md, "On the GPU"): the
    // kernels check the header and indices (else kMalformed, dst untouched), tree-hash dst and
    // compare with base_hash (else kBaseDiffers, untouched), scatter saving the replaced values,
    // tree-hash the result and compare with result_hash (else kResultDiffers, and the saved
    // values are scattered back), each step gated on the device-side verdict of the one
    // before. Work the caller queues on `stream` afterwards sees dst final. Returns false with
    // *refused (kMalformed) when the patch's size, alignment or element size shows a defect
    // before anything runs; nothing is queued then. Needs the patch's and dst's memory until
    // collect(). Grows its buffers only after waiting (deadline) for the work queued before;
    // a failed launch or upload is the driver's error naming the step.
    bool queue_apply(const ApplyJob &job, CUstream stream, const sys::Deadline &deadline,
                     ApplyOut *refused);
    // Patches queued and not yet collected.
    std::size_t queued() const { return pending_.size(); }
    // Waits once (bounded by the deadline; WSYNC_ERR_TIMEOUT naming `what`, or a failed
    // kernel's WSYNC_ERR_SYSTEM naming it) for every patch queued since the last collect() and
    // returns their outcomes in queue order. The queue is empty afterwards, whatever happens;
    // after a timeout the queued work may still run once its stream moves, so its buffers are
    // given up to it (not freed) and the caller must keep dst and the patch memory until that
    // stream has drained (the transports fence it).
    std::vector<ApplyOut> collect(const sys::Deadline &deadline, const std::string &what);
    // queue_apply() of each job, then collect(): one wait for all.
    std::vector<ApplyOut> apply(const std::vector<ApplyJob> &jobs, CUstream stream,
                                const sys::Deadline &deadline);

    // One patch onto dst (device memory of this GPU, checked first as a dense copy's is:
    // WSYNC_ERR_INVALID_ARGUMENT naming `what` and `kind`, and for a dst not aligned to its
    // elements), queued as queue_apply() queues it, as the GPU kinds' ChunkBacking::queue_patch
    // does it; a patch refused before anything runs is thrown as WSYNC_ERR_MALFORMED.
    void queue_one(void *dst, const void *patch, uint64_t patch_bytes, uint64_t elements,
                   uint64_t esize, uint64_t base_hash, uint64_t result_hash, CUstream stream,
                   const sys::Deadline &deadline, const std::string &what, const char *kind);

private:
    // Launches `fn`(table, count, units) on `blocks` blocks of `block` threads.
    void launch(CUfunction fn, unsigned block, uint64_t blocks, CUdeviceptr table,
                std::size_t count, uint64_t units, CUstream stream, const char *name);
    CUdeviceptr upload(DeviceBuffer &buf, const void *data, uint64_t bytes, CUstream stream,
                       const char *what);
    void reserve(DeviceBuffer &buf, uint64_t bytes, const char *what);
    void wait(CUstream stream, const sys::Deadline &deadline, const std::string &what);
    void download(void *dst, CUdeviceptr src, uint64_t bytes, const char *what);
    // Queues the piece hashes of `ranges` into hashes_ (first piece of range i at piece_at[i]).
    void queue_hashes(const std::vector<DeviceRange> &ranges, CUstream stream,
                      std::vector<uint64_t> *piece_at);
    // After a wait: reads back the piece hashes queue_hashes() made and combines them.
    std::vector<uint64_t> read_hashes(const std::vector<DeviceRange> &ranges,
                                      const std::vector<uint64_t> &piece_at);
    // Where a plain patch's values are (after its header and padded indices).
    static CUdeviceptr values_of(CUdeviceptr patch, uint64_t changed, unsigned width);
    // WSYNC_ERR_INVALID_ARGUMENT naming `what` when one launch cannot index `tiles`.
    static void check_tiles(uint64_t tiles, const std::string &what);
    // Uploads patch_entries_ and launches `fn` over their changes.
    void launch_patches(CUfunction fn, CUstream stream, const char *name);
    // Waits (deadline) for every stream with queued applies: their buffers may then change.
    void drain(const sys::Deadline &deadline, const std::string &what);
    // For queued applies: grows `buf` to `bytes`, draining first when it is in use.
    void reserve_queued(DeviceBuffer &buf, uint64_t bytes, const sys::Deadline &deadline,
                        const char *what);

    const Device &dev_;
    CUmodule module_ = nullptr;
    CUfunction hash_ = nullptr, count_ = nullptr, compact_ = nullptr, scatter_ = nullptr,
               begin_ = nullptr, end_ = nullptr;
    Event done_;
    Stream io_;  // the read-backs' own stream (non-blocking: it waits for no other)
    // Device memory, grown as needed and kept: entry tables, per-tile counts and offsets, piece
    // hashes, the patches diff() makes; for queued applies, the destination's piece hashes and
    // the values replaced (reused patch after patch in stream order).
    DeviceBuffer hash_table_, diff_table_, compact_table_, patch_table_, counts_, offsets_, hashes_,
        patches_, apply_hashes_, saved_;
    // Buffers that grew out of use, kept until the kernels go: freeing device memory waits for
    // the whole device, and on a nccl_broadcast sender that includes an earlier broadcast
    // waiting for its receivers, without a deadline (issue 33). A buffer grows by half again
    // its need, so the retired ones hold less than twice the largest.
    std::vector<DeviceBuffer> retired_;
    // A queued apply's device slot (kSlotBytes in a slab of kSlabSlots, kept until collect()):
    // its ApplyState, its scatter and restore entries and its hash entry, uploaded at once.
    static constexpr uint64_t kSlotBytes = 256, kSlabSlots = 64;
    static_assert(sizeof(ApplySlot) <= kSlotBytes, "a slot holds its ApplySlot");
    std::vector<DeviceBuffer> slabs_;
    struct Pending {
        CUstream stream;
        CUdeviceptr slot;
        ApplyJob job;
        bool whole;  // every step was queued
    };
    std::vector<Pending> pending_;
    // Host copies of what is uploaded (kept until the stream has passed the upload) and read back.
    std::vector<HashEntry> hash_entries_;
    std::vector<DiffEntry> diff_entries_, compact_entries_;
    std::vector<PatchEntry> patch_entries_;
    std::vector<uint64_t> host_hashes_, host_offsets_;
    std::vector<uint32_t> host_counts_;
};

}  // namespace wsync::gpu
