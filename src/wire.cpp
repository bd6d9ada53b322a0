#include "wire.hpp"

#include <cstdio>
#include <set>
#include <vector>

#include "error.hpp"
#include "tensor.hpp"

namespace wsync::wire {

const char *blob_type_name(BlobType t) { return t == BlobType::Init ? "init" : "request"; }

[[noreturn]] void malformed(const std::string &message) { fail(WSYNC_ERR_MALFORMED, message); }

// Format 2 seals every blob: the CBOR array gets a sixth element, the XXH3-64 of every byte
// before it (the array head included), as a CBOR uint64 (0x1b + 8 bytes big-endian). A flipped
// bit anywhere is WSYNC_ERR_INTEGRITY before a single field is read. XXH3 finds corruption,
// not forgery: a blob is authenticated by the channel it came over, as before.
std::vector<uint8_t> encode(BlobType type, const std::string &kind, json body) {
    json env = json::array({"wsync", kFormatVersion, blob_type_name(type), kind, std::move(body)});
    std::vector<uint8_t> out = json::to_cbor(env);
    out[0] = kSealedHead;  // a 6-element array: the seal follows the body
    uint64_t seal = checksum_bytes(out.data(), out.size());
    out.push_back(0x1b);
    for (int i = 7; i >= 0; --i) out.push_back(static_cast<uint8_t>(seal >> (8 * i)));
    dispose(env);
    return out;
}

namespace {

// nlohmann's binary reader recurses once per nesting level, so an untrusted blob of a few
// hundred kilobytes of nested arrays could exhaust the stack; so do dump() and the messages that
// quote a value. This SAX adaptor builds the same DOM as nlohmann's own and refuses any nesting
// deeper than max_depth before going further. It serves CBOR blobs and JSON option text alike.
class BoundedDom {
public:
    BoundedDom(json &root, std::size_t max_depth) : dom_(root, false), max_depth_(max_depth) {}

    bool null() { return dom_.null(); }
    bool boolean(bool v) { return dom_.boolean(v); }
    bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
    bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
    bool number_float(json::number_float_t v, const std::string &s) { return dom_.number_float(v, s); }
    bool string(std::string &v) { return dom_.string(v); }
    bool binary(json::binary_t &v) { return dom_.binary(v); }
    bool start_object(std::size_t n) {
        if (!enter()) return false;
        keys_.emplace_back();
        return dom_.start_object(n == std::size_t(-1) ? n : 0);
    }
    // A key given twice in one object is refused: JSON leaves it undefined, and keeping the last
    // one (the DOM's way) would let `{"receivers": 1, "receivers": 3}` pass as 3 unnoticed.
    bool key(std::string &k) {
        if (depth_ == 1) top_key_ = k;
        if (!keys_.empty() && !keys_.back().insert(k).second) {
            error_ = "key '" + printable(k, 64) + "' is given twice";
            return false;
        }
        return dom_.key(k);
    }
    bool end_object() {
        --depth_;
        if (!keys_.empty()) keys_.pop_back();
        return dom_.end_object();
    }
    bool start_array(std::size_t n) { return enter() && dom_.start_array(n == std::size_t(-1) ? n : 0); }
    bool end_array() { --depth_; return dom_.end_array(); }
    bool parse_error(std::size_t pos, const std::string &, const nlohmann::detail::exception &ex) {
        error_ = "at byte " + std::to_string(pos) + ": " + printable(ex.what(), 240);
        return false;
    }

    const std::string &error() const { return error_; }
    bool too_deep() const { return depth_ > max_depth_; }
    // The top-level object key being parsed when parsing stopped ("" if none).
    std::string top_key() const { return depth_ >= 1 ? top_key_ : std::string(); }

private:
    bool enter() {
        if (depth_ == 0) top_key_.clear();
        if (++depth_ > max_depth_) {
            error_ = "nesting deeper than " + std::to_string(max_depth_) + " levels";
            return false;
        }
        return true;
    }

    // The size hint passed on is 0: a hostile length must not drive a reservation.
    nlohmann::detail::json_sax_dom_parser<json> dom_;
    std::size_t max_depth_;
    std::size_t depth_ = 0;
    std::string top_key_;
    std::string error_;
    std::vector<std::set<std::string>> keys_;  // per open object: the keys seen so far
};

}  // namespace

bool parse_json_text(const char *text, std::size_t max_depth, json &out, TextError &error) {
    out = json();
    BoundedDom sax(out, max_depth);
    bool ok = json::sax_parse(text, &sax, nlohmann::detail::input_format_t::json, /*strict=*/true);
    if (ok && !out.is_discarded()) return true;
    error.too_deep = sax.too_deep();
    error.what = sax.error().empty() ? std::string("parse failed") : sax.error();
    error.key = sax.top_key();
    out = json();
    return false;
}

std::size_t utf8_sequence(std::string_view s, std::size_t i) {
    auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char b = at(i);
    if (b < 0x80) return 1;
    std::size_t len;
    unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte (Unicode table 3-7)
    if (b >= 0xc2 && b <= 0xdf) len = 2;
    else if (b == 0xe0) len = 3, lo = 0xa0;   // no overlongs
    else if (b == 0xed) len = 3, hi = 0x9f;   // no surrogates
    else if (b >= 0xe1 && b <= 0xef) len = 3;
    else if (b == 0xf0) len = 4, lo = 0x90;   // no overlongs
    else if (b == 0xf4) len = 4, hi = 0x8f;   // nothing past U+10FFFF
    else if (b >= 0xf1 && b <= 0xf3) len = 4;
    else return 0;  // continuation bytes, 0xc0, 0xc1 (overlong) and 0xf5..0xff
    if (s.size() - i < len) return 0;
    if (at(i + 1) < lo || at(i + 1) > hi) return 0;
    for (std::size_t k = 2; k < len; ++k)
        if (at(i + k) < 0x80 || at(i + k) > 0xbf) return 0;
    return len;
}

bool is_utf8(std::string_view s) {
    for (std::size_t i = 0; i < s.size();) {
        std::size_t n = utf8_sequence(s, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string printable(std::string_view s, std::size_t max_bytes) {
    static const char hex[] = "0123456789abcdef";
    std::string out;
    for (std::size_t i = 0; i < s.size();) {
        if (out.size() >= max_bytes) return out + "...";
        auto b = static_cast<unsigned char>(s[i]);
        std::size_t n = utf8_sequence(s, i);
        if (b == '\\') {
            out += "\\\\";
        } else if (n > 1 || (n == 1 && b >= 0x20 && b < 0x7f)) {
            out.append(s, i, n);
            i += n;
            continue;
        } else {
            out += "\\x";
            out += hex[b >> 4];
            out += hex[b & 15];
        }
        ++i;
    }
    return out;
}

Envelope decode(const uint8_t *data, std::size_t size) {
    if (!data || size == 0) malformed("blob is empty");
    if (size > kMaxBlobBytes)
        malformed("blob of " + std::to_string(size) + " bytes exceeds the limit of " +
                  std::to_string(kMaxBlobBytes) + " bytes");
    // The seal first: nothing of a blob is parsed before its bytes are known to be the sent ones.
    if (size < 10 || data[0] != kSealedHead || data[size - 9] != 0x1b) {
        if (size >= 2 && data[0] == 0x85)
            malformed("wsync blob is unsealed (format 1, from libwsync 0.1?): this library reads "
                      "only sealed format " + std::to_string(kFormatVersion) + " blobs");
        malformed("not a sealed wsync blob (no 6-element CBOR array ending in its XXH3 seal)");
    }
    uint64_t seal = 0;
    for (std::size_t i = size - 8; i < size; ++i) seal = seal << 8 | data[i];
    uint64_t got = checksum_bytes(data, size - 9);
    if (got != seal) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "blob seal mismatch: the blob says %016llx, its bytes hash to %016llx",
                      static_cast<unsigned long long>(seal), static_cast<unsigned long long>(got));
        fail(WSYNC_ERR_INTEGRITY, std::string(buf) + " (changed in transit or in memory)");
    }
    json root;
    BoundedDom sax(root, kMaxDepth);
    bool ok = json::sax_parse(data, data + size, &sax, nlohmann::detail::input_format_t::cbor, /*strict=*/true);
    if (!ok || root.is_discarded())
        malformed("blob is not valid CBOR (" +
                  (sax.error().empty() ? std::string("parse failed") : sax.error()) + ")");
    if (!root.is_array() || root.size() != 6 || !root[0].is_string() || root[0] != "wsync")
        malformed("not a wsync blob (magic \"wsync\" missing)");
    if (!root[1].is_number_unsigned())
        malformed("wsync blob: format version is not an unsigned integer");
    uint64_t version = root[1].get<uint64_t>();
    if (version != kFormatVersion)
        malformed("wsync blob format version " + std::to_string(version) +
                  " is not supported (this library reads version " +
                  std::to_string(kFormatVersion) + "; trainer and engines run " +
                  (version == 4 ? "libwsync 0.5 builds of different request formats: format 5 "
                                  "(0.5 builds from 2026-11-27) carries tree-hash tensor checksums, "
                                  "which engines verify on several threads)"
                                : std::string("different libwsync minor versions") +
                                      (version == 2   ? ": format 3 (libwsync 0.4) added delta patches)"
                                       : version == 3 ? ": format 4 (libwsync 0.5) added split tensors' parts)"
                                                      : ")")));
    Envelope env;
    if (root[2] == "init") env.type = BlobType::Init;
    else if (root[2] == "request") env.type = BlobType::Request;
    else malformed("wsync blob: unknown blob type");
    if (!root[3].is_string() || root[3].get_ref<const std::string &>().empty() ||
        root[3].get_ref<const std::string &>().size() > 64)
        malformed("wsync blob: strategy kind is not a short string");
    env.kind = root[3].get<std::string>();
    if (!root[4].is_object()) malformed("wsync blob: body is not a map");
    env.body = std::move(root[4]);
    return env;
}

Envelope decode_expect(const uint8_t *data, std::size_t size, BlobType type,
                       const std::string &kind) {
    Envelope env = decode(data, size);
    auto with_article = [](BlobType t) {
        return std::string(t == BlobType::Init ? "an init" : "a request") + " blob";
    };
    if (env.type != type)
        fail(WSYNC_ERR_MISMATCH,
             "expected " + with_article(type) + ", got " + with_article(env.type));
    if (env.kind != kind)
        fail(WSYNC_ERR_MISMATCH, std::string("blob is for strategy '") + env.kind +
                                     "', not '" + kind + "'");
    return env;
}

const json &field(const json &obj, const char *key, const std::string &where) {
    if (!obj.is_object()) malformed(where + ": not a map");
    auto it = obj.find(key);
    if (it == obj.end()) malformed(where + ": missing field '" + key + "'");
    return *it;
}

uint64_t as_uint(const json &v, const std::string &where, uint64_t max) {
    if (!v.is_number_unsigned()) malformed(where + " is not an unsigned integer");
    uint64_t x = v.get<uint64_t>();
    if (x > max)
        malformed(where + " = " + std::to_string(x) + " exceeds " + std::to_string(max));
    return x;
}

uint64_t uint_field(const json &obj, const char *key, const std::string &where, uint64_t max) {
    return as_uint(field(obj, key, where), where + "." + key, max);
}

bool bool_field(const json &obj, const char *key, const std::string &where) {
    const json &v = field(obj, key, where);
    if (!v.is_boolean()) malformed(where + "." + key + " is not a boolean");
    return v.get<bool>();
}

const std::string &string_field(const json &obj, const char *key, const std::string &where,
                                std::size_t max_len) {
    const json &v = field(obj, key, where);
    if (!v.is_string()) malformed(where + "." + key + " is not a string");
    const auto &s = v.get_ref<const std::string &>();
    if (s.size() > max_len)
        malformed(where + "." + key + " is longer than " + std::to_string(max_len) + " bytes");
    if (s.find('\0') != std::string::npos)
        malformed(where + "." + key + " contains a NUL byte: '" + printable(s) + "'");
    return s;
}

const json::array_t &array_field(const json &obj, const char *key, const std::string &where,
                                 std::size_t max_len) {
    const json &v = field(obj, key, where);
    if (!v.is_array()) malformed(where + "." + key + " is not an array");
    const auto &a = v.get_ref<const json::array_t &>();
    if (a.size() > max_len)
        malformed(where + "." + key + " has " + std::to_string(a.size()) +
                  " entries, more than " + std::to_string(max_len));
    return a;
}

const json &object_field(const json &obj, const char *key, const std::string &where) {
    const json &v = field(obj, key, where);
    if (!v.is_object()) malformed(where + "." + key + " is not a map");
    return v;
}

void dispose(json &j) noexcept {
    if (j.is_array()) {
        auto &a = j.get_ref<json::array_t &>();
        for (auto &e : a)
            if (e.is_structured()) dispose(e);
        json::array_t().swap(a);  // scalars and nulls only: each element's destructor is trivial or one free
    } else if (j.is_object()) {
        auto &o = j.get_ref<json::object_t &>();
        for (auto &kv : o)
            if (kv.second.is_structured()) dispose(kv.second);
        json::object_t().swap(o);
    }
    j = nullptr;
}

}  // namespace wsync::wire
