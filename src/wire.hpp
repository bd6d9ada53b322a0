// The blob envelope and bounded decoding. A blob is one CBOR array
//   ["wsync", <format version>, "init" | "request", <kind>, <body map>, <seal>]
// where the seal is the XXH3-64 of every byte before it (see encode()).
// so its first bytes (0x85 0x65 'w' 's' 'y' 'n' 'c') double as a magic. The body belongs to the
// strategy (init) or to the core's tensor table plus the strategy's "transport" map (request).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace wsync::wire {

using json = nlohmann::json;

constexpr uint64_t kFormatVersion = 2;
constexpr uint8_t kSealedHead = 0x86;  // CBOR array of 6: magic, format, type, kind, body, seal
constexpr std::size_t kMaxBlobBytes = std::size_t(256) << 20;  // 256 MiB
constexpr std::size_t kMaxDepth = 16;                          // nesting of arrays and maps

enum class BlobType { Init, Request };
const char *blob_type_name(BlobType t);

struct Envelope {
    BlobType type = BlobType::Init;
    std::string kind;
    json body;  // always an object
};

std::vector<uint8_t> encode(BlobType type, const std::string &kind, const json &body);

// Parses and checks the envelope. Throws WSYNC_ERR_MALFORMED (garbage, truncation, trailing
// bytes, too deep, too large, not a wsync blob, another format version) naming what is wrong.
Envelope decode(const uint8_t *data, std::size_t size);

// Like decode, then checks the type and kind: a blob of another type or kind is
// WSYNC_ERR_MISMATCH naming both.
Envelope decode_expect(const uint8_t *data, std::size_t size, BlobType type,
                       const std::string &kind);

// Bounded field access for bodies. Each throws WSYNC_ERR_MALFORMED naming `where` and the key.
[[noreturn]] void malformed(const std::string &message);
const json &field(const json &obj, const char *key, const std::string &where);
uint64_t as_uint(const json &v, const std::string &where, uint64_t max);
uint64_t uint_field(const json &obj, const char *key, const std::string &where, uint64_t max);
bool bool_field(const json &obj, const char *key, const std::string &where);
const std::string &string_field(const json &obj, const char *key, const std::string &where,
                                std::size_t max_len);
const json::array_t &array_field(const json &obj, const char *key, const std::string &where,
                                 std::size_t max_len);
const json &object_field(const json &obj, const char *key, const std::string &where);

}  // namespace wsync::wire
