// Partial pulls: an engine that loads only some tensors of each version, or byte ranges of them
// (its tensor-parallel shards), declares that selection when its strategy is created (the ucx
// kind's "select" option; docs/architecture.md, "Partial pulls"). This file holds the rules: the
// selection as declared and checked, and, per chunk of a version, the plan a receiver follows
// before any byte moves: which entries the loader sees (whole tensors, or ranges as parts, the
// split-tensor model), which bytes of the chunk's buffer to fetch, and which of those can be
// verified against the request's checksums (whole tensors and whole parts only).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategy.hpp"
#include "tensor.hpp"

namespace wsync::select {

using json = nlohmann::json;

// One declared entry: a whole tensor, a byte range of it, or rank `rank` of `ranks` equal slices
// along dimension 0 (a contiguous byte range once the tensor's shape is known).
struct Entry {
    enum class Kind { Whole, Range, Shard };
    Kind kind = Kind::Whole;
    std::string tensor;
    std::string key;  // "select[2]" in messages
    uint64_t offset = 0, bytes = 0;     // Range
    uint64_t rank = 0, ranks = 1;       // Shard
    std::string dtype;                  // "" : any; else the dtype name it must have
    bool has_shape = false;
    std::vector<int64_t> shape;         // with has_shape: the shape it must have
};

struct Spec {
    std::vector<Entry> entries;  // as declared
    // Per tensor name, its entries ordered by offset (several only for explicit ranges, which
    // then do not overlap).
    std::unordered_map<std::string, std::vector<std::size_t>> by_name;
    bool rest_whole = false;  // tensors no entry names: pulled whole ("whole") or skipped
};

// Parses the option `value` ("select", an array of entries) and the rest rule ("skip" or
// "whole"). WSYNC_ERR_INVALID_ARGUMENT naming the option and the entry's key on any defect:
// unknown keys, a missing or empty "tensor", a range of 0 bytes or that overflows, rank >= ranks,
// overlapping ranges of one tensor, a tensor named by a whole or shard entry and another entry.
std::shared_ptr<const Spec> parse(const json &value, const std::string &rest, const std::string &owner);

// What a receiver does with one chunk.
struct Plan {
    TensorTable view;               // what the loader sees: whole metas, ranges as parts
    std::vector<ByteRange> fetch;   // per view entry: its bytes in the chunk's (wire) buffer
    std::vector<uint8_t> unverified;  // per view entry: 1 when no carried checksum covers it
};

// The selection's state within one version: which selected tensors have appeared.
class Version {
public:
    // Plans `full` (a chunk's whole table as decoded) against the selection. Throws
    // WSYNC_ERR_MISMATCH naming the tensor, the entry and the version when a selected tensor's
    // dtype or shape differs from the declared one, a range lies past the tensor's end or is not
    // whole elements, a shard's dimension 0 does not divide by its ranks, or, at the committing
    // chunk, a selected tensor did not appear in the version at all; WSYNC_ERR_UNSUPPORTED for a
    // selected tensor carried as a patch. On a throw the state is unchanged.
    Plan plan(const Spec &spec, const ChunkHeader &h, const TensorTable &full, const std::string &what);

private:
    std::unordered_set<std::string> seen_;
};

}  // namespace wsync::select
