// The planner: tensors -> chunks that keep a module's tensors together and batch under a byte
// threshold, each of at most WSYNC_MAX_CHUNK_TENSORS tensors (what a receiver accepts). Any
// number of tensors may be planned. Pure function of its input; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "wsync.h"

namespace wsync {

struct PlannedChunk {
    std::vector<std::size_t> indices;  // ascending
    std::vector<wsync_part_t> parts;   // per index: its range, {0, 0} for the whole tensor
    uint64_t bytes = 0;                // payload
};

class Plan {
public:
    Plan(const wsync_tensor_t *metas, std::size_t n, const char *options_json);
    const std::vector<PlannedChunk> &chunks() const { return chunks_; }

    // The module a tensor belongs to: its name without the last `depth` dotted parts, or ""
    // (no group) when the name has no more parts than that.
    static std::string group_key(const std::string &name, uint64_t depth);

private:
    std::vector<PlannedChunk> chunks_;
};

}  // namespace wsync
