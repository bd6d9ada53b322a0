#include "core.hpp"

#include <algorithm>
#include <cstring>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "copy/copy.hpp"
#include "error.hpp"

namespace wsync {

namespace {

// Request body layout shared by all kinds (docs/wire-format.md):
//   {"version": u64, "chunk": u32, "last": bool, "tensors": {table}, "transport": {kind's}}
constexpr const char *kReq = "request";

}  // namespace

ChunkHeader decode_header(const json &body) {
    ChunkHeader h;
    h.version = wire::uint_field(body, "version", kReq, UINT64_MAX - 1);
    if (h.version == 0) wire::malformed("request.version is 0 (versions start at 1)");
    h.chunk_index = static_cast<uint32_t>(wire::uint_field(body, "chunk", kReq, UINT32_MAX - 1));
    h.last = wire::bool_field(body, "last", kReq);
    if (h.last) {
        const json &m = wire::object_field(body, "manifest", kReq);
        const std::string w = "request.manifest";
        h.manifest.tensors = wire::uint_field(m, "tensors", w, UINT64_MAX);
        h.manifest.bytes = wire::uint_field(m, "bytes", w, UINT64_MAX);
        h.manifest.chunks = static_cast<uint32_t>(wire::uint_field(m, "chunks", w, UINT32_MAX));
        h.manifest.digest = wire::uint_field(m, "digest", w, UINT64_MAX);
        if (h.manifest.chunks != uint64_t(h.chunk_index) + 1)
            wire::malformed(w + ": chunks " + std::to_string(h.manifest.chunks) +
                            " does not match the committing chunk's index " +
                            std::to_string(h.chunk_index));
    } else if (body.contains("manifest")) {
        wire::malformed("request.manifest on a chunk that does not commit its version");
    }
    return h;
}


std::string chunk_label(const ChunkHeader &h) {
    return "chunk " + std::to_string(h.chunk_index) + " of version " + std::to_string(h.version);
}

void tally(Manifest &m, const TensorTable &table) {
    for (std::size_t i = 0; i < table.metas.size(); ++i) {
        // Each chunk is capped at 2^62 bytes; versions at 2^32 chunks. A split tensor counts
        // once (at its first part), its bytes part by part.
        m.bytes += table.payload_bytes(i);
        if (!table.is_part(i) || table.parts[i].offset == 0) m.tensors += 1;
    }
    m.chunks += 1;
    m.digest = chain_digest(m.digest, table);
}

std::string manifest_text(const Manifest &m) {
    char d[24];
    std::snprintf(d, sizeof d, "%016llx", static_cast<unsigned long long>(m.digest));
    return std::to_string(m.tensors) + " tensors, " + std::to_string(m.bytes) + " bytes in " +
           std::to_string(m.chunks) + " chunks, table digest " + d;
}

// ----------------------------------------------------------------------------------------------
Strategy::Strategy(const KindInfo &kind, const char *options_json)
    : kind_(kind), options_(kind.name, option_specs(kind), options_json),
      delta_(delta::config_from(options_, kind.name, kind.delta_sync, kind.delta_on_device)) {
    std::string missing = kind.unavailable_reason(&options_);
    if (!missing.empty())
        fail(WSYNC_ERR_UNAVAILABLE, std::string(kind.name) + ": unavailable: " + missing);
    impl_ = kind.create(options_);
}

std::vector<uint8_t> Strategy::create_init_info() {
    if (init_made_)
        fail(WSYNC_ERR_WRONG_STATE, std::string(kind_.name) +
                                        ": init info was already created by this strategy");
    json body = impl_->create_init_info();
    init_made_ = true;
    return wire::encode(wire::BlobType::Init, kind_.name, std::move(body));
}

std::unique_ptr<Sender> Strategy::create_sender(const uint8_t *init, std::size_t len) {
    auto env = wire::decode_expect(init, len, wire::BlobType::Init, kind_.name);
    return std::make_unique<Sender>(kind_, impl_->create_sender(env.body), delta_);
}

std::unique_ptr<Receiver> Strategy::create_receiver(const uint8_t *init, std::size_t len,
                                                    uint32_t index) {
    auto env = wire::decode_expect(init, len, wire::BlobType::Init, kind_.name);
    return std::make_unique<Receiver>(kind_, impl_->create_receiver(env.body, index), delta_.mirror);
}

}  // namespace wsync
