#include "gpu/diff.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "error.hpp"

namespace wsync::gpu {

namespace {
// The PTX is longer than the 65536 characters C++ requires compilers to take in one literal
// (GCC and Clang take any length; Clang says so under -Wpedantic).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
const char kDeltaPtx[] =
#include "gpu/kernels/delta_ptx.inc"
    ;
#pragma GCC diagnostic pop

std::string hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
    return b;
}
uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
// Grids are capped so a huge launch's blocks take several tiles each rather than asking for an
// enormous grid (the kernels loop over tiles with a grid stride).
constexpr uint64_t kMaxGrid = uint64_t(1) << 20;
unsigned grid_for(uint64_t blocks) { return static_cast<unsigned>(std::min(blocks, kMaxGrid)); }

void check_tiles(uint64_t tiles, const std::string &what) {
    if (tiles > UINT32_MAX)
        fail(WSYNC_ERR_INVALID_ARGUMENT, what + ": " + std::to_string(tiles) +
                                             " tiles are more than one launch can index");
}
}  // namespace

DeltaKernels::DeltaKernels(const Device &d) : dev_(d), done_(d), io_(d) {
    d.require_kernels("the delta kernels");
    Device::Scope scope(d);
    WSYNC_CU(d.api(), cuModuleLoadData(&module_, kDeltaPtx),
             "loading the delta kernels (PTX for compute_80) on " + d.uuid_string());
    struct {
        CUfunction *fn;
        const char *name;
    } const fns[] = {{&hash_, kPieceHashKernel},
                     {&count_, kDeltaCountKernel},
                     {&compact_, kDeltaCompactKernel},
                     {&check_, kPatchCheckKernel},
                     {&scatter_, kPatchScatterKernel},
                     {&verdict_, kPatchVerdictKernel}};
    for (const auto &f : fns) {
        const CUresult rc = d.api().cuModuleGetFunction(f.fn, module_, f.name);
        if (rc != CUDA_SUCCESS) {
            d.api().cuModuleUnload(module_);
            cuda_fail(d.api(), rc, std::string("cuModuleGetFunction(") + f.name + ")");
        }
    }
}

DeltaKernels::~DeltaKernels() {
    try {
        Device::Scope scope(dev_);
        dev_.api().cuModuleUnload(module_);
    } catch (...) {
    }
}

bool DeltaKernels::diffable(uint64_t esize, CUdeviceptr now, CUdeviceptr base) {
    return (esize == 1 || esize == 2 || esize == 4 || esize == 8) && now % esize == 0 &&
           base % esize == 0;
}

// ---- plumbing --------------------------------------------------------------------------------
void DeltaKernels::reserve(DeviceBuffer &buf, uint64_t bytes, const char *what) {
    // Callers reserve only after a wait, so the old buffer is no longer in use; it is retired,
    // not freed (see retired_).
    if (buf.size() >= bytes) return;
    DeviceBuffer grown(dev_, std::max<uint64_t>(bytes + bytes / 2, 4096), what);
    if (buf.size()) retired_.push_back(std::move(buf));
    buf = std::move(grown);
}

CUdeviceptr DeltaKernels::upload(DeviceBuffer &buf, const void *data, uint64_t bytes,
                                 CUstream stream, const char *what) {
    reserve(buf, bytes, what);
    if (bytes)
        WSYNC_CU(dev_.api(), cuMemcpyHtoDAsync(buf.ptr(), data, bytes, stream),
                 std::string("uploading the ") + what);
    return buf.ptr();
}

void DeltaKernels::launch(CUfunction fn, unsigned block, uint64_t blocks, CUdeviceptr table,
                          std::size_t count, uint64_t units, CUstream stream, const char *name) {
    if (blocks == 0) return;
    CUdeviceptr t = table;
    unsigned n = static_cast<unsigned>(count);
    unsigned u = static_cast<unsigned>(units);  // check_tiles() kept it below 2^32
    void *params[] = {&t, &n, &u};
    WSYNC_CU(dev_.api(),
             cuLaunchKernel(fn, grid_for(blocks), 1, 1, block, 1, 1, 0, stream, params, nullptr),
             std::string("launching ") + name);
}

void DeltaKernels::wait(CUstream stream, const sys::Deadline &deadline, const std::string &what) {
    done_.record(stream);
    try {
        poll_until([&] { return done_.done(); }, deadline, what);
    } catch (const Error &e) {
        if (e.status() == WSYNC_ERR_TIMEOUT) throw;
        fail(e.status(), what + ": " + e.what());  // a kernel or copy failed: say which step
    }
}

void DeltaKernels::download(void *dst, CUdeviceptr src, uint64_t bytes, const char *what) {
    // Called after wait(), so the bytes are final. The copy into pageable memory returns only
    // once done; on the object's own non-blocking stream it waits for nothing else, not even
    // work another thread of the engine queued on the caller's stream meanwhile.
    if (bytes)
        WSYNC_CU(dev_.api(), cuMemcpyDtoHAsync(dst, src, bytes, io_.get()),
                 std::string("reading back the ") + what);
}

void DeltaKernels::queue_hashes(const std::vector<DeviceRange> &ranges, CUstream stream,
                                std::vector<uint64_t> *piece_at) {
    hash_entries_.resize(ranges.size());
    piece_at->resize(ranges.size());
    uint64_t pieces = 0;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
        (*piece_at)[i] = pieces;
        pieces += hash_pieces(ranges[i].bytes);
    }
    check_tiles(pieces, "hashing device memory");
    reserve(hashes_, pieces * 8, "piece hashes");
    for (std::size_t i = 0; i < ranges.size(); ++i)
        hash_entries_[i] = HashEntry{ranges[i].ptr, ranges[i].bytes, hashes_.ptr() + 8 * (*piece_at)[i],
                                     /*state=*/0, static_cast<uint32_t>((*piece_at)[i]), 0};
    if (pieces == 0) return;
    const CUdeviceptr table = upload(hash_table_, hash_entries_.data(),
                                     hash_entries_.size() * sizeof(HashEntry), stream, "hash table");
    launch(hash_, kHashBlock, (pieces + kHashBlock - 1) / kHashBlock, table, hash_entries_.size(),
           pieces, stream, kPieceHashKernel);
}

std::vector<uint64_t> DeltaKernels::read_hashes(const std::vector<DeviceRange> &ranges,
                                                const std::vector<uint64_t> &piece_at) {
    const uint64_t pieces = ranges.empty() ? 0 : piece_at.back() + hash_pieces(ranges.back().bytes);
    host_hashes_.resize(pieces);
    download(host_hashes_.data(), hashes_.ptr(), pieces * 8, "piece hashes");
    std::vector<uint64_t> out(ranges.size());
    for (std::size_t i = 0; i < ranges.size(); ++i)
        out[i] = delta::combine_piece_hashes(host_hashes_.data() + piece_at[i],
                                             hash_pieces(ranges[i].bytes));
    return out;
}

std::vector<uint64_t> DeltaKernels::tree_hashes(const std::vector<DeviceRange> &ranges,
                                                CUstream stream, const sys::Deadline &deadline,
                                                const std::string &what) {
    Device::Scope scope(dev_);
    std::vector<uint64_t> piece_at;
    queue_hashes(ranges, stream, &piece_at);
    wait(stream, deadline, what + ": hashing on the GPU");
    return read_hashes(ranges, piece_at);
}

// ---- the trainer -------------------------------------------------------------------------
void DeltaKernels::count(const std::vector<DiffJob> &jobs, CUstream stream,
                         const sys::Deadline &deadline, const std::string &what,
                         std::vector<DiffOut> *out) {
    Device::Scope scope(dev_);
    out->assign(jobs.size(), DiffOut{});
    diff_entries_.resize(jobs.size());
    std::vector<DeviceRange> now(jobs.size());
    uint64_t tiles = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        const DiffJob &j = jobs[i];
        if (!diffable(j.esize, j.now, j.base) || j.elements > (UINT64_MAX / 8))
            fail(WSYNC_ERR_INVALID_ARGUMENT,
                 what + ": tensor " + std::to_string(i) + " (elements of " + std::to_string(j.esize) +
                     " bytes at " + hex(j.now) + " and " + hex(j.base) +
                     ") is not one the GPU compare takes: elements of 1, 2, 4 or 8 bytes, aligned to their size");
        diff_entries_[i] = DiffEntry{j.now, j.base, j.elements, 0, 0, 0, 0, j.esize, 0,
                                     static_cast<uint32_t>(tiles), 0};
        now[i] = DeviceRange{j.now, j.elements * j.esize};
        tiles += diff_tiles(j.elements);
    }
    check_tiles(tiles, what);
    // Count pass, and the hashes of the new bytes (the next base's checksum).
    reserve(counts_, tiles * 4, "change counts");
    for (DiffEntry &e : diff_entries_) e.counts = counts_.ptr() + 4 * uint64_t(e.first_tile);
    const CUdeviceptr table = upload(diff_table_, diff_entries_.data(),
                                     diff_entries_.size() * sizeof(DiffEntry), stream, "compare table");
    launch(count_, kDiffBlock, tiles, table, diff_entries_.size(), tiles, stream, kDeltaCountKernel);
    std::vector<uint64_t> piece_at;
    queue_hashes(now, stream, &piece_at);
    wait(stream, deadline, what + ": comparing with the bases on the GPU");
    host_counts_.resize(tiles);
    download(host_counts_.data(), counts_.ptr(), tiles * 4, "change counts");
    const std::vector<uint64_t> hashes = read_hashes(now, piece_at);
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        const DiffEntry &e = diff_entries_[i];
        DiffOut &o = (*out)[i];
        o.result_hash = hashes[i];
        const uint64_t n = diff_tiles(e.elements);
        for (uint64_t t = 0; t < n; ++t) o.changed += host_counts_[e.first_tile + t];
        // An empty tensor has no tile to write a header from; it goes dense (0 bytes).
        o.patch = o.changed <= jobs[i].limit && e.elements > 0;
        if (!o.patch) continue;
        o.width = e.elements <= (uint64_t(1) << 32) ? 4 : 8;
        o.nbytes = delta::patch_bytes(o.changed, e.esize, o.width);
    }
}

void DeltaKernels::compact(const std::vector<DiffJob> &jobs, const std::vector<DiffOut> &out,
                           CUstream stream) {
    Device::Scope scope(dev_);
    if (jobs.size() != diff_entries_.size() || out.size() != jobs.size())
        fail(WSYNC_ERR_INVALID_ARGUMENT, "DeltaKernels::compact: not the jobs count() counted");
    // Where each tile's changes begin within its patch.
    std::vector<DiffEntry> compact;
    host_offsets_.clear();
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        const DiffEntry &e = diff_entries_[i];
        if (e.now != jobs[i].now || e.base != jobs[i].base || e.elements != jobs[i].elements)
            fail(WSYNC_ERR_INVALID_ARGUMENT, "DeltaKernels::compact: not the jobs count() counted");
        const DiffOut &o = out[i];
        if (!o.patch) continue;
        if (!o.bytes || o.bytes % 8)
            fail(WSYNC_ERR_INVALID_ARGUMENT, "DeltaKernels::compact: patch " + std::to_string(i) +
                                                 " has no 8-byte aligned memory");
        DiffEntry c = e;
        c.first_tile = static_cast<uint32_t>(host_offsets_.size());
        c.changed = o.changed;
        c.width = o.width;
        c.patch = o.bytes;
        uint64_t pos = 0;
        const uint64_t n = diff_tiles(e.elements);
        for (uint64_t t = 0; t < n; ++t) {
            host_offsets_.push_back(pos);
            pos += host_counts_[e.first_tile + t];
        }
        compact.push_back(c);
    }
    if (compact.empty()) return;
    // count() waited for the stream, so its buffers are free to grow or be rewritten.
    reserve(offsets_, host_offsets_.size() * 8, "change offsets");
    for (DiffEntry &c : compact) c.offsets = offsets_.ptr() + 8 * uint64_t(c.first_tile);
    upload(offsets_, host_offsets_.data(), host_offsets_.size() * 8, stream, "change offsets");
    compact_entries_ = std::move(compact);  // kept until the stream has passed the upload
    const CUdeviceptr table = upload(compact_table_, compact_entries_.data(),
                                     compact_entries_.size() * sizeof(DiffEntry), stream, "compact table");
    launch(compact_, kDiffBlock, host_offsets_.size(), table, compact_entries_.size(),
           host_offsets_.size(), stream, kDeltaCompactKernel);
}

void DeltaKernels::diff(const std::vector<DiffJob> &jobs, CUstream stream,
                        const sys::Deadline &deadline, const std::string &what,
                        std::vector<DiffOut> *out) {
    count(jobs, stream, deadline, what, out);
    uint64_t bytes = 0;
    for (const DiffOut &o : *out)
        if (o.patch) bytes += round_up(o.nbytes, 256);
    reserve(patches_, bytes, "patches");  // count() waited: the old patches are done with
    bytes = 0;
    for (DiffOut &o : *out) {
        if (!o.patch) continue;
        o.bytes = patches_.ptr() + bytes;
        bytes += round_up(o.nbytes, 256);
    }
    compact(jobs, *out, stream);
}

void DeltaKernels::launch_patches(CUfunction fn, CUstream stream, const char *name) {
    uint64_t tiles = 0;
    for (PatchEntry &e : patch_entries_) {
        e.first_tile = static_cast<uint32_t>(tiles);
        tiles += patch_tiles(e.count);
    }
    check_tiles(tiles, name);
    if (tiles == 0) return;
    const CUdeviceptr table = upload(patch_table_, patch_entries_.data(),
                                     patch_entries_.size() * sizeof(PatchEntry), stream, "patch table");
    launch(fn, kPatchBlock, tiles, table, patch_entries_.size(), tiles, stream, name);
}

namespace {
// Where a plain patch's indices and values are.
CUdeviceptr values_of(CUdeviceptr patch, uint64_t changed, unsigned width) {
    return patch + delta::kHeaderBytes + round_up(changed * width, 8);
}
}  // namespace

void DeltaKernels::fold(const std::vector<FoldJob> &jobs, CUstream stream) {
    Device::Scope scope(dev_);
    patch_entries_.clear();
    for (const FoldJob &j : jobs)
        patch_entries_.push_back(PatchEntry{j.base, j.patch + delta::kHeaderBytes,
                                            values_of(j.patch, j.changed, j.width), 0, j.changed,
                                            j.elements, 0, j.esize, j.width, 0, 0});
    launch_patches(scatter_, stream, kPatchScatterKernel);
}

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
    check_tiles(std::max(pieces, check_pass_tiles(count)), j.label);
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
    const CUdeviceptr state = slot + offsetof(SlotBlock, state);
    const CUdeviceptr idx = j.patch + delta::kHeaderBytes, values = values_of(j.patch, count, width);
    SlotBlock b{};
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
    WSYNC_CU(dev_.api(), cuMemcpyHtoDAsync(slot, &b, sizeof(SlotBlock), stream),
             j.label + ": uploading the patch's state");
    const CUdeviceptr apply = slot + offsetof(SlotBlock, apply), restore = slot + offsetof(SlotBlock, restore),
                      hash = slot + offsetof(SlotBlock, hash);
    const uint64_t tiles = patch_tiles(count), checks = check_pass_tiles(count);
    auto verdict = [&](unsigned stage) {
        launch(verdict_, kVerdictBlock, 1, state, 1, stage, stream, kPatchVerdictKernel);
    };
    launch(check_, kPatchBlock, checks, apply, 1, checks, stream, kPatchCheckKernel);
    launch(hash_, kHashBlock, (pieces + kHashBlock - 1) / kHashBlock, hash, 1, pieces, stream, kPieceHashKernel);
    verdict(0);
    launch(scatter_, kPatchBlock, tiles, apply, 1, tiles, stream, kPatchScatterKernel);
    launch(hash_, kHashBlock, (pieces + kHashBlock - 1) / kHashBlock, hash, 1, pieces, stream, kPieceHashKernel);
    verdict(1);
    launch(scatter_, kPatchBlock, tiles, restore, 1, tiles, stream, kPatchScatterKernel);
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
    std::vector<SlotBlock> got(pending.size());
    std::vector<uint8_t> raw;
    for (std::size_t at = 0; at < pending.size(); at += kSlabSlots) {
        const std::size_t n = std::min<std::size_t>(kSlabSlots, pending.size() - at);
        raw.resize(n * kSlotBytes);
        download(raw.data(), slabs_[at / kSlabSlots].ptr(), raw.size(), "patch states");
        for (std::size_t k = 0; k < n; ++k)
            std::memcpy(&got[at + k], raw.data() + k * kSlotBytes, sizeof(SlotBlock));
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
