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
// one thread a piece; the host combines them (a 2 GB model is 32768 pieces, 256 KiB of hashes).
constexpr uint64_t kHashPieceBytes = 65536;
struct HashEntry {
    uint64_t src;          // device bytes to hash
    uint64_t bytes;
    uint64_t out;          // device uint64_t[pieces]: XXH3-64 of each piece, in order
    uint32_t first_piece;  // the sum of hash_pieces() over the entries before this one
    uint32_t reserved;
};
static_assert(sizeof(HashEntry) == 32, "HashEntry is part of the kernel ABI");
inline uint64_t hash_pieces(uint64_t bytes) { return (bytes + kHashPieceBytes - 1) / kHashPieceBytes; }
// A tile of wsync_piece_hash is one piece; kHashBlock threads a block.
constexpr unsigned kHashBlock = 128;

// ---- compare and compact (the trainer) -----------------------------------------------------
// wsync_delta_count: per tile of kDiffTileElems elements, how many differ bitwise between `now`
// and `base` (into counts[tile - first_tile]). wsync_delta_compact: the same compare again,
// writing each changed element's flat index (plain, `width` bytes) and value, in index order,
// at offsets[tile - first_tile] within the patch whose header, indices and values begin at
// `patch` (delta.hpp's format, plain coding; the kernel writes the header and the zero padding
// after the indices). Elements are 1, 2, 4 or 8 bytes; now, base and patch aligned to that.
constexpr uint64_t kDiffTileElems = 8192;
constexpr unsigned kDiffBlock = 256;  // 32 elements a thread
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
    uint32_t reserved;
};
static_assert(sizeof(DiffEntry) == 72, "DiffEntry is part of the kernel ABI");
inline uint64_t diff_tiles(uint64_t elements) { return (elements + kDiffTileElems - 1) / kDiffTileElems; }

// ---- check and scatter (the receiver; the trainer's fold) ----------------------------------
// wsync_patch_check: every index must be below `elements` and above the one before it; the
// first position (in patch order) that is not lowers *bad (atomicMin; the host sets it to
// UINT64_MAX first). wsync_patch_scatter: for each change i, when `save` is set, save[i] =
// dst[idx[i]] first, then dst[idx[i]] = values[i]; an index at or past `elements` is skipped
// (the check pass refuses such a patch before any scatter; this keeps a bad one from writing
// outside the tensor). A restore is a scatter of `save` back with save = 0.
constexpr uint64_t kPatchTileChanges = 4096;
constexpr unsigned kPatchBlock = 256;
struct PatchEntry {
    uint64_t dst;
    uint64_t idx;       // `count` indices of `width` bytes
    uint64_t values;    // `count` values of `esize` bytes
    uint64_t save;      // 0, or device bytes for the replaced values
    uint64_t count;
    uint64_t elements;
    uint64_t bad;       // device uint64_t (check pass)
    uint32_t esize;     // 1, 2, 4 or 8
    uint32_t width;     // 4 or 8
    uint32_t first_tile;
    uint32_t reserved;
};
static_assert(sizeof(PatchEntry) == 72, "PatchEntry is part of the kernel ABI");
inline uint64_t patch_tiles(uint64_t count) { return (count + kPatchTileChanges - 1) / kPatchTileChanges; }

constexpr const char *kPieceHashKernel = "wsync_piece_hash";
constexpr const char *kDeltaCountKernel = "wsync_delta_count";
constexpr const char *kDeltaCompactKernel = "wsync_delta_compact";
constexpr const char *kPatchCheckKernel = "wsync_patch_check";
constexpr const char *kPatchScatterKernel = "wsync_patch_scatter";

}  // namespace wsync::gpu
