#include "gpu/diff.hpp"

#include <algorithm>
#include <cstdio>

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

DeltaKernels::DeltaKernels(const Device &d) : dev_(d), done_(d), io_(d), packer_(d) {
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
                     {&scatter_, kPatchScatterKernel}};
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
    // Callers reserve only after a wait, so the old buffer is no longer in use.
    if (buf.size() < bytes) buf = DeviceBuffer(dev_, std::max<uint64_t>(bytes + bytes / 2, 4096), what);
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
                                     static_cast<uint32_t>((*piece_at)[i]), 0};
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
std::vector<DeltaKernels::ApplyOut> DeltaKernels::apply(const std::vector<ApplyJob> &jobs,
                                                        CUstream stream,
                                                        const sys::Deadline &deadline) {
    Device::Scope scope(dev_);
    std::vector<ApplyOut> out(jobs.size());
    auto malformed = [&](std::size_t i, const std::string &message) {
        out[i].outcome = Outcome::kMalformed;
        out[i].message = message;
    };
    // 1. The headers, gathered into one buffer by the pack kernel and read back in one copy.
    gather_.clear();
    reserve(headers_, jobs.size() * delta::kHeaderBytes, "patch headers");
    uint64_t tile = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        if (jobs[i].nbytes < delta::kHeaderBytes) continue;  // check_header says why, below
        PackEntry e{jobs[i].patch, headers_.ptr() + delta::kHeaderBytes * i, delta::kHeaderBytes,
                    kPackCopy, static_cast<uint32_t>(tile)};
        tile += pack_tiles(e);
        gather_.push_back(e);
    }
    packer_.pack(gather_, stream);
    wait(stream, deadline, "reading " + std::to_string(jobs.size()) + " patch headers on the GPU");
    host_headers_.assign(jobs.size() * delta::kHeaderBytes, 0);
    download(host_headers_.data(), headers_.ptr(), host_headers_.size(), "patch headers");

    // 2. Sound headers: check every index, and hash what each destination holds now.
    std::vector<std::size_t> live;
    std::vector<unsigned> widths(jobs.size(), 4);
    std::vector<uint64_t> counts(jobs.size(), 0);
    for (std::size_t i = 0; i < jobs.size(); ++i) {
        const ApplyJob &j = jobs[i];
        const std::string &what = j.label;
        try {
            if (j.esize != 1 && j.esize != 2 && j.esize != 4 && j.esize != 8)
                fail(WSYNC_ERR_UNSUPPORTED, what + ": the GPU apply takes elements of 1, 2, 4 or 8 bytes, not " +
                                                std::to_string(j.esize));
            std::vector<uint8_t> header(host_headers_.begin() + delta::kHeaderBytes * i,
                                        host_headers_.begin() + delta::kHeaderBytes * (i + 1));
            if (j.nbytes < delta::kHeaderBytes) header.resize(j.nbytes);
            const delta::Header h = delta::check_header(header.data(), j.nbytes, j.elements, j.esize, what);
            if (h.coding != delta::kPlain)
                fail(WSYNC_ERR_MALFORMED, what + ": patch is gap-coded; the GPU apply takes plain indices");
            if (j.dst % j.esize)
                fail(WSYNC_ERR_INVALID_ARGUMENT, what + ": the destination is not aligned to its elements");
            if (j.patch % 8)
                fail(WSYNC_ERR_MALFORMED, what + ": patch does not start on an 8-byte boundary");
            widths[i] = h.width;
            counts[i] = h.count;
            live.push_back(i);
        } catch (const Error &e) {
            malformed(i, e.what());
        }
    }
    if (live.empty()) return out;
    host_flags_.assign(live.size(), UINT64_MAX);
    upload(flags_, host_flags_.data(), host_flags_.size() * 8, stream, "check flags");
    patch_entries_.clear();
    std::vector<DeviceRange> dsts;
    for (std::size_t k = 0; k < live.size(); ++k) {
        const ApplyJob &j = jobs[live[k]];
        patch_entries_.push_back(PatchEntry{j.dst, j.patch + delta::kHeaderBytes,
                                            values_of(j.patch, counts[live[k]], widths[live[k]]), 0,
                                            counts[live[k]], j.elements, flags_.ptr() + 8 * k, j.esize,
                                            widths[live[k]], 0, 0});
        dsts.push_back(DeviceRange{j.dst, j.elements * j.esize});
    }
    launch_patches(check_, stream, kPatchCheckKernel);
    std::vector<uint64_t> piece_at;
    queue_hashes(dsts, stream, &piece_at);
    wait(stream, deadline, "checking " + std::to_string(live.size()) + " patches on the GPU");
    download(host_flags_.data(), flags_.ptr(), host_flags_.size() * 8, "check flags");
    std::vector<uint64_t> before = read_hashes(dsts, piece_at);

    // 3. Scatter where all is well, saving what is replaced; hash the results.
    std::vector<std::size_t> go;  // positions in live
    uint64_t saved = 0;
    for (std::size_t k = 0; k < live.size(); ++k) {
        const std::size_t i = live[k];
        if (host_flags_[k] != UINT64_MAX) {
            try {
                delta::bad_index(jobs[i].label, host_flags_[k]);
            } catch (const Error &e) {
                malformed(i, e.what());
            }
        } else if (before[k] != jobs[i].base_hash) {
            out[i] = ApplyOut{Outcome::kBaseDiffers, before[k],
                              jobs[i].label + ": the destination does not hold the patch's base"};
        } else {
            go.push_back(k);
            saved += round_up(counts[i] * jobs[i].esize, 8);
        }
    }
    if (go.empty()) return out;
    reserve(saved_, saved, "replaced values");
    std::vector<PatchEntry> scatter;
    dsts.clear();
    saved = 0;
    for (std::size_t k : go) {
        PatchEntry e = patch_entries_[k];
        e.save = saved_.ptr() + saved;
        e.bad = 0;
        saved += round_up(e.count * e.esize, 8);
        scatter.push_back(e);
        dsts.push_back(DeviceRange{e.dst, e.elements * e.esize});
    }
    patch_entries_ = scatter;
    launch_patches(scatter_, stream, kPatchScatterKernel);
    queue_hashes(dsts, stream, &piece_at);
    wait(stream, deadline, "applying " + std::to_string(go.size()) + " patches on the GPU");
    const std::vector<uint64_t> after = read_hashes(dsts, piece_at);

    // 4. Put back every destination whose result is not what the trainer sent.
    patch_entries_.clear();
    for (std::size_t n = 0; n < go.size(); ++n) {
        const std::size_t i = live[go[n]];
        if (after[n] == jobs[i].result_hash) continue;
        out[i] = ApplyOut{Outcome::kResultDiffers, after[n],
                          jobs[i].label + ": the patched result does not match its checksum"};
        PatchEntry e = scatter[n];
        e.values = e.save;
        e.save = 0;
        patch_entries_.push_back(e);
    }
    if (patch_entries_.empty()) return out;
    launch_patches(scatter_, stream, kPatchScatterKernel);
    wait(stream, deadline, "putting back " + std::to_string(patch_entries_.size()) + " destinations on the GPU");
    return out;
}

delta::Applied DeltaKernels::apply_one(void *dst, const void *patch, uint64_t patch_bytes,
                                       uint64_t elements, uint64_t esize, uint64_t base_hash,
                                       uint64_t result_hash, CUstream stream,
                                       const sys::Deadline &deadline, const std::string &what,
                                       const char *kind, uint64_t *got) {
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
    const std::vector<ApplyOut> out = apply({j}, stream, deadline);
    *got = out[0].got;
    switch (out[0].outcome) {
    case Outcome::kApplied: break;
    case Outcome::kBaseDiffers: return delta::Applied::kBaseDiffers;
    case Outcome::kResultDiffers: return delta::Applied::kResultDiffers;
    case Outcome::kMalformed: fail(WSYNC_ERR_MALFORMED, out[0].message);
    }
    return delta::Applied::kApplied;
}

}  // namespace wsync::gpu
