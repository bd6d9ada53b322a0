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

}  // namespace

void DeltaKernels::check_tiles(uint64_t tiles, const std::string &what) {
    if (tiles > UINT32_MAX)
        fail(WSYNC_ERR_INVALID_ARGUMENT, what + ": " + std::to_string(tiles) +
                                             " tiles are more than one launch can index");
}

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
                     {&scatter_, kPatchScatterKernel},
                     {&begin_, kApplyBeginKernel},
                     {&end_, kApplyEndKernel}};
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
    launch(hash_, kHashBlock, (pieces + kPiecesPerBlock - 1) / kPiecesPerBlock, table,
           hash_entries_.size(), pieces, stream, kPieceHashKernel);
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
                                     static_cast<uint32_t>(tiles), vector16(j.now, j.base)};
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

CUdeviceptr DeltaKernels::values_of(CUdeviceptr patch, uint64_t changed, unsigned width) {
    return patch + delta::kHeaderBytes + round_up(changed * width, 8);
}

void DeltaKernels::fold(const std::vector<FoldJob> &jobs, CUstream stream) {
    Device::Scope scope(dev_);
    patch_entries_.clear();
    for (const FoldJob &j : jobs)
        patch_entries_.push_back(PatchEntry{j.base, j.patch + delta::kHeaderBytes,
                                            values_of(j.patch, j.changed, j.width), 0, j.changed,
                                            j.elements, 0, j.esize, j.width, 0, 0});
    launch_patches(scatter_, stream, kPatchScatterKernel);
}

}  // namespace wsync::gpu
