// shm's init info: what the trainer's strategy publishes once and every receiver is created
// from (the segment's name and rendezvous, the geometry, whether checksums are carried), and the
// segment geometry it implies.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "transport/local/segment.hpp"

namespace wsync::shm {

using json = nlohmann::json;

inline constexpr const char *kKind = "shm";

struct InitInfo {
    std::string segment, rendezvous;
    uint32_t receivers, buckets;
    uint64_t bucket_bytes;
    uint64_t arena_bytes = 0;  // the sender's arena (option "arena_bytes"); absent in the blob: 0
    bool checksum;
};

// Validates an init-info body; WSYNC_ERR_MALFORMED names the bad field.
InitInfo parse_init_info(const json &body);

// The segment: the board, then `buckets` buckets of bucket_bytes (a whole number of pages), then
// the sender's arena of arena_bytes (a whole number of pages; 0: none). Layout 3 without an
// arena, 4 with one, so a receiver that knows no arena refuses the segment by its layout rather
// than misreading a request whose tensors lie in it (the head of segment.hpp; board layout in
// board.hpp).
SegmentGeometry segment_geometry(uint32_t receivers, uint32_t buckets, uint64_t bucket_bytes,
                                 uint64_t arena_bytes);

// The largest arena: the same bound as a bucket.
inline constexpr uint64_t kMaxArenaBytes = uint64_t(1) << 40;

}  // namespace wsync::shm
