// The binary interface of the delta kernels (src/gpu/kernels/delta.cu), shared by the library's
// launch logic (src/gpu/diff.cpp) and by the fake driver that emulates them in CI. Like the
// pack kernel, every kernel takes (const Entry *table, unsigned count, unsigned tiles): a table
// of per-tensor entries in device memory, cut into tiles of equal work over all entries, and
// each entry's first tile; blocks take launch tiles and find their entry by binary search over
// first_tile. docs/delta.md ("On the GPU") says what each is for.
#pragma once

#include <cstdint>

namespace wsync::gpu {

// ---- tree hashes ---------------------------------------------------------------------------
// A tensor's tree hash (delta::tree_hash) is XXH3-64 over the little-endian array of XXH3-64 of
// each kHashPieceBytes piece (the last one shorter). wsync_piece_hash computes the pieces' hashes,
// one warp a piece (xxh3.h, "the lane-parallel form": each round of the warp reads 256
// contiguous bytes); the host combines them (a 2 GB model is 32768 pieces, 256 KiB of hashes).
constexpr uint64_t kHashPieceBytes = 65536;
struct HashEntry {
    uint64_t src;          // device bytes to hash
    uint64_t bytes;
    uint64_t out;          // device uint64_t[pieces]: XXH3-64 of each piece, in order
    uint64_t state;        // 0, or a device ApplyState: hash only while its verdict is kGo
    uint32_t first_piece;  // the sum of hash_pieces() over the entries before this one
    uint32_t reserved;
};
static_assert(sizeof(HashEntry) == 40, "HashEntry is part of the kernel ABI");
inline uint64_t hash_pieces(uint64_t bytes) { return (bytes + kHashPieceBytes - 1) / kHashPieceBytes; }
// A tile of wsync_piece_hash is one piece; kHashBlock threads a block, kPiecesPerBlock warps.
constexpr unsigned kHashBlock = 256;
constexpr unsigned kPiecesPerBlock = kHashBlock / 32;

// ---- compare and compact (the trainer) -----------------------------------------------------
// wsync_delta_count: per tile of kDiffTileElems elements, how many differ bitwise between `now`
// and `base` (into counts[tile - first_tile]). wsync_delta_compact: the same compare again,
// writing each changed element's flat index (plain, `width` bytes) and value, in index order,
// at offsets[tile - first_tile] within the patch whose header, indices and values begin at
// `patch` (delta.hpp's format, plain coding; the kernel writes the header and the zero padding
// after the indices). Elements are 1, 2, 4 or 8 bytes; now, base and patch aligned to that.
// Each warp of a tile's block compares 1024 elements, 32 a lane, in 2 * esize rounds of 512
// contiguous bytes: in round r lane l takes the 16 / esize elements at 32 * (16 / esize) * r +
// (16 / esize) * l with one 16-byte load from each side when `vector16` is set (the host sets it
// only when now and base are both 16-byte aligned; a vector load at any other address faults,
// CUDA_ERROR_MISALIGNED_ADDRESS) and the vector lies inside the tensor, else element by element.
// The compaction places each round's changes by a warp-wide prefix sum, so they land in index
// order whatever the layout.
constexpr uint64_t kDiffTileElems = 8192;
constexpr unsigned kDiffBlock = 256;  // 8 warps of 1024 elements
struct DiffEntry {
    uint64_t now;
    uint64_t base;
    uint64_t elements;
    uint64_t counts;    // device uint32_t[tiles of this entry] (count pass)
    uint64_t offsets;   // device uint64_t[tiles of this entry] (compact pass)
    uint64_t patch;     // device bytes of the patch (compact pass)
    uint64_t changed;   // the entry's changed elements (compact pass: the header's count)
    uint32_t esize;     // 1, 2, 4 or 8
    uint32_t width;     // 4 or 8 (compact pass)
    uint32_t first_tile;
    uint32_t vector16;  // 1: now and base are 16-byte aligned, compare in 16-byte loads
};
static_assert(sizeof(DiffEntry) == 72, "DiffEntry is part of the kernel ABI");
inline uint64_t diff_tiles(uint64_t elements) { return (elements + kDiffTileElems - 1) / kDiffTileElems; }
inline uint32_t vector16(uint64_t now, uint64_t base) { return now % 16 == 0 && base % 16 == 0; }

// ---- the receiver's verified apply, queued with no host wait -------------------------------
// Each patch applied on an engine has an ApplySlot in device memory (its state, its scatter and
// restore entries, its destination's hash entry), uploaded at once, which three launches read
// and write in stream order, so the whole apply is queued on the loader's stream and the host
// reads every state once, when the chunk ends (src/gpu/apply.cpp, DeltaKernels::collect):
//   wsync_apply_begin   tiles [0, check_pass_tiles(count)): header and indices sound, else
//                       verdict kMalformed (and `bad`); the next apply_tiles(n_pieces) tiles:
//                       the destination's pieces, kPiecesPerBlock a tile; then the launch's
//                       last block: their tree hash is base_hash, else kBaseDiffers (`got`)
//   wsync_patch_scatter the `apply` entry, saving the replaced values (PatchEntry::when kGo)
//   wsync_apply_end     apply_tiles(n_pieces) tiles: while kGo, the result's pieces; then the
//                       last block: their tree hash is result_hash, else kResultDiffers (`got`),
//                       and then it scatters the `restore` entry (the saved values back)
// Both apply kernels take (const ApplySlot *slot, unsigned count = 1, unsigned tiles). A
// launch's last block is the one whose atomicAdd on `arrived` returns gridDim.x - 1, after a
// __threadfence (so it sees every block's stores); it takes the verdict with one warp (XXH3 of
// the pieces' hashes, the lane-parallel form) and sets `arrived` back to 0, so the host writes
// it 0 once, with the state. Who writes each word: the host the whole slot before the first
// kernel and reads the state after the last; `bad` and `verdict` kMalformed the check tiles
// (atomicMin / plain stores of the same value); `verdict` and `got` otherwise the last block.
// A verdict only ever moves away from kGo.
enum Verdict : uint64_t { kGo = 0, kMalformed = 1, kBaseDiffers = 2, kResultDiffers = 3 };
struct ApplyState {
    uint64_t bad;          // the first index position out of order or outside (UINT64_MAX: none)
    uint64_t verdict;      // Verdict
    uint64_t got;          // the tree hash that did not match
    uint64_t base_hash;    // the patch's, from the request
    uint64_t result_hash;  // the same
    uint64_t pieces;       // device uint64_t[n_pieces]: the destination's piece hashes
    uint64_t n_pieces;
    uint64_t arrived;      // blocks of the running launch that finished (0 between launches)
};
static_assert(sizeof(ApplyState) == 64, "ApplyState is part of the kernel ABI");
inline uint64_t apply_tiles(uint64_t pieces) { return (pieces + kPiecesPerBlock - 1) / kPiecesPerBlock; }
// The apply kernels' block size.
constexpr unsigned kApplyBlock = 256;

// ---- check and scatter (the receiver; the trainer's fold) ----------------------------------
// The check (wsync_apply_begin's first tiles): the header (at idx - 32) must be delta.hpp's for plain coding, `width`,
// `esize`, `count` and `elements`, and every index below `elements` and above the one before
// it; else state->verdict = kMalformed, and the first index position (in patch order) that is
// not sound lowers state->bad (atomicMin). Every entry has at least one tile (the header's).
// wsync_patch_scatter: for each change i, when `save` is set, save[i] = dst[idx[i]] first, then
// dst[idx[i]] = values[i]; an index at or past `elements` is skipped (the check refuses such a
// patch first; this keeps a bad one from writing outside the tensor). With `state` set the
// entry runs only when state->verdict == `when` (the apply); with state 0 always (the fold). A
// restore is a scatter of `save` back with save = 0.
constexpr uint64_t kPatchTileChanges = 4096;
constexpr unsigned kPatchBlock = 256;
struct PatchEntry {
    uint64_t dst;
    uint64_t idx;       // `count` indices of `width` bytes
    uint64_t values;    // `count` values of `esize` bytes
    uint64_t save;      // 0, or device bytes for the replaced values
    uint64_t count;
    uint64_t elements;
    uint64_t state;     // 0, or the patch's device ApplyState
    uint32_t esize;     // 1, 2, 4 or 8
    uint32_t width;     // 4 or 8
    uint32_t first_tile;
    uint32_t when;      // scatter with a state: the verdict it runs at
};
static_assert(sizeof(PatchEntry) == 72, "PatchEntry is part of the kernel ABI");
inline uint64_t patch_tiles(uint64_t count) { return (count + kPatchTileChanges - 1) / kPatchTileChanges; }
inline uint64_t check_pass_tiles(uint64_t count) { return count ? patch_tiles(count) : 1; }

struct ApplySlot {
    ApplyState state;
    PatchEntry apply;    // dst, the patch's indices and values, save: the replaced values; when kGo
    PatchEntry restore;  // dst, the same indices, values: the saved ones, save 0; when kResultDiffers
    HashEntry hash;      // dst, its bytes, out: state.pieces; first_piece 0
};
static_assert(sizeof(ApplySlot) == 248, "ApplySlot is part of the kernel ABI");

constexpr const char *kPieceHashKernel = "wsync_piece_hash";
constexpr const char *kDeltaCountKernel = "wsync_delta_count";
constexpr const char *kDeltaCompactKernel = "wsync_delta_compact";
constexpr const char *kPatchScatterKernel = "wsync_patch_scatter";
constexpr const char *kApplyBeginKernel = "wsync_apply_begin";
constexpr const char *kApplyEndKernel = "wsync_apply_end";

}  // namespace wsync::gpu
