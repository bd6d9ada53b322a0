// shm's init info: what the trainer's strategy publishes once and every receiver is created
// from (the segment's name and rendezvous, the geometry, whether checksums are carried), and the
// segment geometry it implies.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "segment.hpp"

namespace wsync::shm {

using json = nlohmann::json;

inline constexpr const char *kKind = "shm";

struct InitInfo {
    std::string segment, rendezvous;
    uint32_t receivers, buckets;
    uint64_t bucket_bytes;
    bool checksum;
};

// Validates an init-info body; WSYNC_ERR_MALFORMED names the bad field.
InitInfo parse_init_info(const json &body);

// The segment: the board, then `buckets` buckets of bucket_bytes (a whole number of pages).
// Layout 3 (the head of segment.hpp; board layout in board.hpp).
SegmentGeometry segment_geometry(uint32_t receivers, uint32_t buckets, uint64_t bucket_bytes);

}  // namespace wsync::shm
