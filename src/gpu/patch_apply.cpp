// The receiver's side of src/gpu/diff.hpp: the verified, all-or-nothing apply of patches on
// the GPU, queued on the loader's stream in three launches a patch (delta_abi.hpp, "the
// receiver's verified apply") and collected once a chunk.
#include <algorithm>
#include <cstddef>
#include <cstring>

#include "error.hpp"
#include "gpu/diff.hpp"

namespace wsync::gpu {

// ---- the receiver ------------------------------------------------------------------------
void DeltaKernels::drain(const sys::Deadline &deadline, const std::string &what) {
    std::vector<CUstream> streams;
    for (const Pending &p : pending_)
        if (std::find(streams.begin(), streams.end(), p.stream) == streams.end()) streams.push_back(p.stream);
    for (CUstream s : streams) wait(s, deadline, what);
}

void DeltaKernels::reserve_queued(DeviceBuffer &buf, uint64_t bytes, const sys::Deadline &deadline,
                                  const char *what) {
    if (buf.size() >= bytes) return;
    // Queued applies still read and write the old buffer: let them finish first (rare: the
    // capacity is kept).
    drain(deadline, std::string("growing the ") + what + " of the queued patches on the GPU");
    reserve(buf, bytes, what);
}

bool DeltaKernels::queue_apply(const ApplyJob &j, CUstream stream, const sys::Deadline &deadline,
                               ApplyOut *refused) {
    Device::Scope scope(dev_);
    // What the host can tell from the request alone: a patch made on a GPU has plain indices of
    // 4 bytes while the tensor has at most 2^32 elements, else 8 (DeltaKernels::count), so its
    // size gives its count; the kernels then check that its header says the same.
    const unsigned width = j.elements <= (uint64_t(1) << 32) ? 4 : 8;
    uint64_t count = UINT64_MAX;
    std::string defect;
    if (j.esize != 1 && j.esize != 2 && j.esize != 4 && j.esize != 8) {
        defect = ": the GPU apply takes elements of 1, 2, 4 or 8 bytes, not " + std::to_string(j.esize);
    } else if (j.patch % 8) {
        defect = ": patch does not start on an 8-byte boundary";
    } else if (j.nbytes >= delta::kHeaderBytes && j.elements <= UINT64_MAX / 16) {
        const uint64_t body = j.nbytes - delta::kHeaderBytes;
        for (uint64_t pad : {uint64_t(0), uint64_t(4)}) {  // the indices' padding to 8 bytes
            if (body < pad) continue;
            const uint64_t c = (body - pad) / (width + j.esize);
            if (c <= j.elements && delta::patch_bytes(c, j.esize, width) == j.nbytes) count = c;
        }
    }
    if (defect.empty() && count == UINT64_MAX)
        defect = ": patch of " + std::to_string(j.nbytes) + " bytes is not the size of any patch of " +
                 std::to_string(j.elements) + " elements of " + std::to_string(j.esize) + " bytes with " +
                 std::to_string(width) + "-byte indices";
    if (!defect.empty()) {
        *refused = ApplyOut{Outcome::kMalformed, 0, j.label + defect};
        return false;
    }
    const uint64_t bytes = j.elements * j.esize, pieces = hash_pieces(bytes);
    const uint64_t checks = check_pass_tiles(count), hashes = apply_tiles(pieces);
    check_tiles(checks + hashes, j.label);
    // The piece hashes and saved values are reused patch after patch, which only stream order
    // makes safe: a loader that moved to another stream waits for the first one's applies.
    if (!pending_.empty() && pending_.back().stream != stream)
        drain(deadline, j.label + ": the patches queued on the loader's previous stream");
    reserve_queued(apply_hashes_, pieces * 8, deadline, "piece hashes");
    reserve_queued(saved_, count * j.esize, deadline, "replaced values");
    // The slot: a fresh slab when the ones there are full (kept for later chunks).
    const std::size_t k = pending_.size();
    if (k / kSlabSlots >= slabs_.size())
        slabs_.emplace_back(dev_, kSlotBytes * kSlabSlots, "patch states");
    const CUdeviceptr slot = slabs_[k / kSlabSlots].ptr() + kSlotBytes * (k % kSlabSlots);
    const CUdeviceptr state = slot + offsetof(ApplySlot, state);
    const CUdeviceptr idx = j.patch + delta::kHeaderBytes, values = values_of(j.patch, count, width);
    ApplySlot b{};
    b.state = ApplyState{UINT64_MAX, kGo, 0, j.base_hash, j.result_hash, apply_hashes_.ptr(), pieces, 0};
    b.apply = PatchEntry{j.dst, idx, values, saved_.ptr(), count, j.elements, state, j.esize, width, 0, kGo};
    b.restore = PatchEntry{j.dst, idx, saved_.ptr(), 0, count, j.elements, state, j.esize, width, 0,
                           kResultDiffers};
    b.hash = HashEntry{j.dst, bytes, apply_hashes_.ptr(), state, 0, 0};
    // Once it is in pending_, collect() waits for whatever part of it was queued, and reports
    // it as failed unless all of it was.
    pending_.push_back(Pending{stream, slot, j, false});
    // Pageable memory: the driver stages it before returning (CUDA driver API, "API
    // synchronization behavior"), so `b` may go.
    WSYNC_CU(dev_.api(), cuMemcpyHtoDAsync(slot, &b, sizeof(ApplySlot), stream),
             j.label + ": uploading the patch's state");
    // Three launches (delta_abi.hpp): check + base hash + verdict, scatter, result hash +
    // verdict + restore. Each verdict is taken by its launch's last block, so none waits for
    // the host and none runs on one thread.
    const uint64_t tiles = patch_tiles(count);
    launch(begin_, kApplyBlock, checks + hashes, slot, 1, checks + hashes, stream, kApplyBeginKernel);
    launch(scatter_, kPatchBlock, tiles, slot + offsetof(ApplySlot, apply), 1, tiles, stream,
           kPatchScatterKernel);
    // The end kernel always runs (its last block takes the verdict and may restore), on one
    // tile at least.
    const uint64_t ends = std::max<uint64_t>(hashes, 1);
    launch(end_, kApplyBlock, ends, slot, 1, ends, stream, kApplyEndKernel);
    pending_.back().whole = true;
    return true;
}

std::vector<DeltaKernels::ApplyOut> DeltaKernels::collect(const sys::Deadline &deadline,
                                                          const std::string &what) {
    Device::Scope scope(dev_);
    struct Clear {  // the queue is empty afterwards, whatever happens
        std::vector<Pending> &p;
        ~Clear() { p.clear(); }
    } clear{pending_};
    std::vector<ApplyOut> out(pending_.size());
    if (pending_.empty()) return out;
    try {
        drain(deadline, what);
    } catch (const Error &e) {
        if (e.status() == WSYNC_ERR_TIMEOUT) {
            // The queued steps may still run whenever the stream moves, reading and writing
            // the slots, the piece hashes and the saved values: those buffers are given up to
            // them (never freed: freeing would wait for the stuck work, without a bound) and
            // later applies get fresh ones. One model's worth of scratch per timeout at most.
            for (DeviceBuffer &b : slabs_) b.leak();
            slabs_.clear();
            apply_hashes_.leak();
            saved_.leak();
            apply_hashes_ = DeviceBuffer();
            saved_ = DeviceBuffer();
        }
        throw;
    }
    const std::vector<Pending> &pending = pending_;
    // Every slot, one read-back per slab.
    std::vector<ApplySlot> got(pending.size());
    std::vector<uint8_t> raw;
    for (std::size_t at = 0; at < pending.size(); at += kSlabSlots) {
        const std::size_t n = std::min<std::size_t>(kSlabSlots, pending.size() - at);
        raw.resize(n * kSlotBytes);
        download(raw.data(), slabs_[at / kSlabSlots].ptr(), raw.size(), "patch states");
        for (std::size_t k = 0; k < n; ++k)
            std::memcpy(&got[at + k], raw.data() + k * kSlotBytes, sizeof(ApplySlot));
    }
    for (std::size_t k = 0; k < pending.size(); ++k) {
        const ApplyJob &j = pending[k].job;
        const ApplyState &st = got[k].state;
        ApplyOut &o = out[k];
        if (!pending[k].whole) {
            o = ApplyOut{Outcome::kMalformed, 0,
                         j.label + ": its apply could not be queued whole on the GPU, so what the "
                                   "destination holds is unspecified"};
            continue;
        }
        switch (st.verdict) {
        case kGo: break;
        case kBaseDiffers:
            o = ApplyOut{Outcome::kBaseDiffers, st.got, j.label + ": the destination does not hold the patch's base"};
            break;
        case kResultDiffers:
            o = ApplyOut{Outcome::kResultDiffers, st.got,
                         j.label + ": the patched result does not match its checksum"};
            break;
        case kMalformed:
            o.outcome = Outcome::kMalformed;
            try {
                if (st.bad != UINT64_MAX) delta::bad_index(j.label, st.bad);
                // The header: read back now (the patch is there until the chunk is acknowledged)
                // so the host's own check names the defect.
                uint8_t header[delta::kHeaderBytes];
                download(header, j.patch, sizeof header, "patch header");
                const delta::Header h = delta::check_header(header, j.nbytes, j.elements, j.esize, j.label);
                if (h.coding != delta::kPlain)
                    fail(WSYNC_ERR_MALFORMED, j.label + ": patch is gap-coded; the GPU apply takes plain indices");
                fail(WSYNC_ERR_MALFORMED, j.label + ": patch has " + std::to_string(h.width) +
                                              "-byte indices, where a patch made on a GPU for a tensor of " +
                                              std::to_string(j.elements) + " elements has " +
                                              std::to_string(got[k].apply.width));
            } catch (const Error &e) {
                o.message = e.what();
            }
            break;
        default:
            o = ApplyOut{Outcome::kMalformed, 0,
                         j.label + ": the GPU apply left an unknown verdict " + std::to_string(st.verdict)};
        }
    }
    return out;
}

std::vector<DeltaKernels::ApplyOut> DeltaKernels::apply(const std::vector<ApplyJob> &jobs,
                                                        CUstream stream,
                                                        const sys::Deadline &deadline) {
    std::vector<ApplyOut> out(jobs.size());
    std::vector<std::size_t> queued_at;
    for (std::size_t i = 0; i < jobs.size(); ++i)
        if (queue_apply(jobs[i], stream, deadline, &out[i])) queued_at.push_back(i);
    const std::vector<ApplyOut> got =
        collect(deadline, "applying " + std::to_string(queued_at.size()) + " patches on the GPU");
    for (std::size_t k = 0; k < queued_at.size(); ++k) out[queued_at[k]] = got[k];
    return out;
}

void DeltaKernels::queue_one(void *dst, const void *patch, uint64_t patch_bytes, uint64_t elements,
                             uint64_t esize, uint64_t base_hash, uint64_t result_hash,
                             CUstream stream, const sys::Deadline &deadline,
                             const std::string &what, const char *kind) {
    check_device_destination(dev_, dst, elements * esize, [&] { return what; }, kind);
    if (esize && reinterpret_cast<uintptr_t>(dst) % esize)
        fail(WSYNC_ERR_INVALID_ARGUMENT, "wsync_recv_copy: the destination of " + what +
                                             " is not aligned to its " + std::to_string(esize) +
                                             "-byte elements");
    ApplyJob j;
    j.dst = reinterpret_cast<CUdeviceptr>(dst);
    j.elements = elements;
    j.esize = static_cast<uint32_t>(esize);
    j.patch = reinterpret_cast<CUdeviceptr>(patch);
    j.nbytes = patch_bytes;
    j.base_hash = base_hash;
    j.result_hash = result_hash;
    j.label = what;
    ApplyOut refused;
    if (!queue_apply(j, stream, deadline, &refused)) fail(WSYNC_ERR_MALFORMED, refused.message);
}

}  // namespace wsync::gpu
