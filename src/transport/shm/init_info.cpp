#include "transport/shm/init_info.hpp"

#include "plan/layout.hpp"
#include "wire.hpp"

namespace wsync::shm {

InitInfo parse_init_info(const json &body) {
    const std::string w = "shm init info";
    InitInfo info;
    info.segment = wire::string_field(body, "segment", w, 255);
    if (info.segment.size() < 2 || info.segment[0] != '/' ||
        info.segment.find('/', 1) != std::string::npos ||
        info.segment.find('\0') != std::string::npos)
        wire::malformed(w + ": segment name is not a POSIX shm name");
    info.rendezvous = wire::string_field(body, "rendezvous", w, 64);
    if (info.rendezvous.empty() || info.rendezvous.find('\0') != std::string::npos)
        wire::malformed(w + ": rendezvous is not a socket name");
    info.receivers =
        static_cast<uint32_t>(wire::uint_field(body, "receivers", w, board::kMaxReceivers));
    info.buckets = static_cast<uint32_t>(wire::uint_field(body, "buckets", w, board::kMaxSlots));
    info.bucket_bytes = wire::uint_field(body, "bucket_bytes", w, uint64_t(1) << 40);
    if (info.receivers == 0 || info.buckets == 0 || info.bucket_bytes == 0 ||
        info.bucket_bytes % layout::kPageBytes != 0)
        wire::malformed(w + ": receivers, buckets or bucket_bytes out of range");
    info.checksum = wire::bool_field(body, "checksum", w);
    if (body.contains("arena_bytes")) {
        info.arena_bytes = wire::uint_field(body, "arena_bytes", w, kMaxArenaBytes);
        if (info.arena_bytes == 0 || info.arena_bytes % layout::kPageBytes != 0)
            wire::malformed(w + ": arena_bytes is not a positive whole number of pages");
    }
    return info;
}

SegmentGeometry segment_geometry(uint32_t receivers, uint32_t buckets, uint64_t bucket_bytes,
                                 uint64_t arena_bytes) {
    return SegmentGeometry{kKind, "wsync-", {'W', 'S', 'Y', 'N', 'C', 'S', 'H', 'M'},
                           arena_bytes ? 4u : 3u, 0, receivers, buckets, bucket_bytes, arena_bytes};
}

}  // namespace wsync::shm
