// The blob envelope and bounded decoding. A blob is one CBOR array
//   ["wsync", <format version>, "init" | "request", <kind>, <body map>, <seal>]
// where the seal is the XXH3-64 of every byte before it (see encode()).
// so its first bytes (0x85 0x65 'w' 's' 'y' 'n' 'c') double as a magic. The body belongs to the
// strategy (init) or to the core's tensor table plus the strategy's "transport" map (request).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "wsync.h"

namespace wsync::wire {

using json = nlohmann::json;

// 3: requests may carry patches (the tensor table's "patches" column, docs/delta.md), which a
// format 2 reader would take for dense bytes. 4: requests may carry parts of split tensors (the
// "parts" column, src/plan/parts.hpp), which a format 3 reader would take for whole tensors.
// 5: shm and ucx requests carry tree-hash checksums (the "tree" column), in which a format 4
// reader would find no checksums and fail every chunk with INTEGRITY (docs/wire-format.md).
constexpr uint64_t kFormatVersion = 5;
constexpr uint8_t kSealedHead = 0x86;  // CBOR array of 6: magic, format, type, kind, body, seal
constexpr std::size_t kMaxBlobBytes = WSYNC_MAX_BLOB_BYTES;  // 256 MiB
constexpr std::size_t kMaxDepth = 16;                          // nesting of arrays and maps

enum class BlobType { Init, Request };
const char *blob_type_name(BlobType t);

struct Envelope {
    BlobType type = BlobType::Init;
    std::string kind;
    json body;  // always an object
};

// Takes the body (a caller done with it moves it in: no copy of a large table).
std::vector<uint8_t> encode(BlobType type, const std::string &kind, json body);

// Parses and checks the envelope. Throws WSYNC_ERR_MALFORMED (garbage, truncation, trailing
// bytes, too deep, too large, not a wsync blob, another format version) naming what is wrong.
Envelope decode(const uint8_t *data, std::size_t size);

// Like decode, then checks the type and kind: a blob of another type or kind is
// WSYNC_ERR_MISMATCH naming both.
Envelope decode_expect(const uint8_t *data, std::size_t size, BlobType type,
                       const std::string &kind);

// Parses untrusted JSON text (options) as decode parses CBOR: nesting deeper than max_depth is
// refused before the parser goes further. On failure returns false and fills `error`.
struct TextError {
    bool too_deep = false;  // nesting deeper than max_depth
    std::string what;       // "nesting deeper than N levels", or "at byte N: ..." (bounded)
    std::string key;        // the top-level object key the failure is under; "" if none
};
bool parse_json_text(const char *text, std::size_t max_depth, json &out, TextError &error);

// The length of the well-formed UTF-8 sequence (RFC 3629) starting at s[i], or 0 when there is
// none there: overlong forms, surrogates (U+D800..U+DFFF), code points past U+10FFFF, stray
// continuation bytes and truncated sequences are not well-formed.
std::size_t utf8_sequence(std::string_view s, std::size_t i);
// True when every byte of s belongs to a well-formed UTF-8 sequence.
bool is_utf8(std::string_view s);
// s for a message: well-formed UTF-8 other than control characters is kept, every other byte is
// written as \xNN (a backslash as \\), and the result is cut to about max_bytes with "...", so an
// untrusted string can be quoted without flooding or corrupting the message.
std::string printable(std::string_view s, std::size_t max_bytes = 80);

// Bounded field access for bodies. Each throws WSYNC_ERR_MALFORMED naming `where` and the key.
[[noreturn]] void malformed(const std::string &message);
const json &field(const json &obj, const char *key, const std::string &where);
uint64_t as_uint(const json &v, const std::string &where, uint64_t max);
uint64_t uint_field(const json &obj, const char *key, const std::string &where, uint64_t max);
bool bool_field(const json &obj, const char *key, const std::string &where);
// A string of at most max_len bytes and without NUL bytes (C consumers would see it cut).
const std::string &string_field(const json &obj, const char *key, const std::string &where,
                                std::size_t max_len);
const json::array_t &array_field(const json &obj, const char *key, const std::string &where,
                                 std::size_t max_len);
const json &object_field(const json &obj, const char *key, const std::string &where);
// The same checks, on a DOM the caller owns and may take values out of.
inline json::array_t &array_field(json &obj, const char *key, const std::string &where,
                                  std::size_t max_len) {
    return const_cast<json::array_t &>(array_field(static_cast<const json &>(obj), key, where, max_len));
}
inline json &object_field(json &obj, const char *key, const std::string &where) {
    return const_cast<json &>(object_field(static_cast<const json &>(obj), key, where));
}

// Empties a DOM (leaving it null) without nlohmann's own destructor walk, which first moves
// every element of every array onto a heap-allocated stack (json_value::destroy): for a request
// of 10,000 tensors that walk was about a tenth of the sender's and the receiver's metadata time
// (docs/data-path.md, "Metadata"). Recursive; our DOMs are at most 16 levels deep (decode
// refuses deeper blobs, and encoders build shallow ones).
void dispose(json &j) noexcept;

}  // namespace wsync::wire
