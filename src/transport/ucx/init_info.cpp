#include "transport/ucx/init_info.hpp"

#include <algorithm>
#include <cstring>
#include <unistd.h>

#include "wire.hpp"
#include "wsync.h"

namespace wsync::ucx {
namespace {

const json::binary_t &binary_field(const json &obj, const char *key, const std::string &w,
                                   std::size_t max) {
    const json &v = wire::field(obj, key, w);
    if (!v.is_binary() || v.get_binary().empty() || v.get_binary().size() > max)
        wire::malformed(w + ": " + key + " is not a byte string of 1.." + std::to_string(max) +
                        " bytes");
    return v.get_binary();
}

// Fixed head of a control message: wire version u16, type u16, index, token, number, seq,
// version, offset, bytes, chunk, status, pid, nonce, text length, address length; all
// little-endian. The MAC follows the text and the address.
constexpr std::size_t kHead = 2 + 2 + 4 + 8 + 8 + 8 + 8 + 8 + 8 + 4 + 4 + 4 + kNonceBytes + 2 + 4;

Mac mac_of(const Msg &m, const uint8_t *bytes, std::size_t n, const Key &key, Dir dir) {
    static const char hello[] = "wsync-ucx-hello";
    std::vector<uint8_t> d;
    d.reserve(n + sizeof hello);
    if (m.type == MsgType::Hello) d.insert(d.end(), hello, hello + sizeof hello - 1);
    else d.push_back(static_cast<uint8_t>(dir));
    d.insert(d.end(), bytes, bytes + n);
    return hmac(key.data(), key.size(), d.data(), d.size());
}

void put(std::vector<uint8_t> &out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get(const uint8_t *&p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
    p += bytes;
    return v;
}

}  // namespace

json encode_init_info(const InitInfo &info) {
    return json{{"wire", kWireVersion},
                {"address", json::binary(info.address)},
                {"key", json::binary(std::vector<uint8_t>(info.key.begin(), info.key.end()))},
                {"session", info.session},
                {"receivers", info.receivers},
                {"keep_versions", info.keep_versions},
                {"checksum", info.checksum}};
}

InitInfo parse_init_info(const json &body) {
    const std::string w = "ucx init info";
    InitInfo info;
    if (!body.contains("wire") || !body.contains("key"))
        wire::malformed(w + " is of ucx wire version 1 (libwsync 0.6 or older: engines attach "
                            "unauthenticated); this library speaks version " +
                        std::to_string(kWireVersion) +
                        " and refuses it: make the init info with the same libwsync as the engines");
    const uint64_t version = wire::uint_field(body, "wire", w, UINT32_MAX);
    if (version != kWireVersion)
        wire::malformed(w + " is of ucx wire version " + std::to_string(version) + "; this library speaks version " +
                        std::to_string(kWireVersion));
    info.address = binary_field(body, "address", w, kMaxAddressBytes);
    const auto &key = binary_field(body, "key", w, kKeyBytes);
    if (key.size() != kKeyBytes) wire::malformed(w + ": key is not " + std::to_string(kKeyBytes) + " bytes");
    std::copy(key.begin(), key.end(), info.key.begin());
    info.session = wire::uint_field(body, "session", w, UINT64_MAX);
    info.receivers = static_cast<uint32_t>(wire::uint_field(body, "receivers", w, kMaxReceivers));
    info.keep_versions =
        static_cast<uint32_t>(wire::uint_field(body, "keep_versions", w, kMaxKeepVersions));
    if (info.receivers == 0 || info.keep_versions == 0)
        wire::malformed(w + ": receivers and keep_versions must be at least 1");
    info.checksum = wire::bool_field(body, "checksum", w);
    return info;
}

json encode_where(const Where &w) {
    json t{{"session", w.session}, {"seq", w.seq}, {"bytes", w.bytes}};
    if (w.block_bytes) {
        std::vector<uint8_t> sums(w.block_sums.size() * 8);
        for (std::size_t i = 0; i < w.block_sums.size(); ++i)
            for (int b = 0; b < 8; ++b) sums[i * 8 + b] = static_cast<uint8_t>(w.block_sums[i] >> (8 * b));
        t["block_bytes"] = w.block_bytes;
        t["block_sums"] = json::binary(std::move(sums));
    }
    if (w.sums_follow) t["sums_follow"] = true;
    return t;
}

Where parse_where(const json &t) {
    const std::string w = "ucx request";
    Where at;
    at.session = wire::uint_field(t, "session", w, UINT64_MAX);
    at.seq = wire::uint_field(t, "seq", w, UINT64_MAX);
    if (at.seq == 0) wire::malformed(w + ": seq is 0 (chunks count from 1)");
    at.bytes = wire::uint_field(t, "bytes", w, uint64_t(1) << 62);
    if (t.contains("block_bytes")) {  // the count is checked against the table by the receiver
        at.block_bytes = wire::uint_field(t, "block_bytes", w, kMaxBlockBytes);
        if (at.block_bytes < kMinBlockBytes)
            wire::malformed(w + ": block_bytes " + std::to_string(at.block_bytes) + " is under " +
                            std::to_string(kMinBlockBytes));
        const uint64_t most = (at.bytes / at.block_bytes + WSYNC_MAX_CHUNK_TENSORS) * 8;
        const json &v = wire::field(t, "block_sums", w);
        if (!v.is_binary() || v.get_binary().size() % 8 || v.get_binary().size() > most)
            wire::malformed(w + ": block_sums is not a byte string of whole 8-byte sums, at most " +
                            std::to_string(most) + " bytes");
        const auto &b = v.get_binary();
        at.block_sums.resize(b.size() / 8);
        for (std::size_t i = 0; i < at.block_sums.size(); ++i)
            for (int k = 0; k < 8; ++k) at.block_sums[i] |= uint64_t(b[i * 8 + k]) << (8 * k);
    }
    if (t.contains("sums_follow")) at.sums_follow = wire::bool_field(t, "sums_follow", w);
    return at;
}

std::vector<uint8_t> seal_msg(const Msg &m, const Key &key, Dir dir) {
    std::vector<uint8_t> out;
    const std::size_t text = std::min(m.text.size(), kMaxText);
    out.reserve(kHead + text + m.address.size() + kMacBytes);
    put(out, kWireVersion, 2);
    put(out, static_cast<uint32_t>(m.type), 2);
    put(out, m.index, 4);
    put(out, m.token, 8);
    put(out, m.number, 8);
    put(out, m.seq, 8);
    put(out, m.version, 8);
    put(out, m.offset, 8);
    put(out, m.bytes, 8);
    put(out, m.chunk, 4);
    put(out, static_cast<uint32_t>(m.status), 4);
    put(out, static_cast<uint32_t>(m.pid), 4);
    out.insert(out.end(), m.nonce.begin(), m.nonce.end());
    put(out, text, 2);
    put(out, m.address.size(), 4);
    out.insert(out.end(), m.text.begin(), m.text.begin() + static_cast<std::ptrdiff_t>(text));
    out.insert(out.end(), m.address.begin(), m.address.end());
    const Mac mac = mac_of(m, out.data(), out.size(), key, dir);
    out.insert(out.end(), mac.begin(), mac.end());
    return out;
}

bool authentic(const Msg &m, const Key &key, Dir dir) {
    const Mac want = mac_of(m, m.signed_bytes.data(), m.signed_bytes.size(), key, dir);
    return same_mac(want.data(), m.mac.data());
}

bool decode_msg(const void *data, std::size_t size, Msg &out) {
    if (!data || size < kHead + kMacBytes) return false;
    const uint8_t *const start = static_cast<const uint8_t *>(data);
    const uint8_t *p = start;
    if (get(p, 2) != kWireVersion) return false;
    const uint32_t type = static_cast<uint32_t>(get(p, 2));
    if (type < uint32_t(MsgType::Hello) || type > uint32_t(MsgType::Data)) return false;
    out.type = static_cast<MsgType>(type);
    out.index = static_cast<uint32_t>(get(p, 4));
    out.token = get(p, 8);
    out.number = get(p, 8);
    out.seq = get(p, 8);
    out.version = get(p, 8);
    out.offset = get(p, 8);
    out.bytes = get(p, 8);
    out.chunk = static_cast<uint32_t>(get(p, 4));
    out.status = static_cast<int32_t>(get(p, 4));
    out.pid = static_cast<int32_t>(get(p, 4));
    std::copy(p, p + kNonceBytes, out.nonce.begin());
    p += kNonceBytes;
    const std::size_t text = get(p, 2), addr = get(p, 4);
    if (text > kMaxText || addr > kMaxAddressBytes || size != kHead + text + addr + kMacBytes) return false;
    if (out.status < 0 || out.status > 0xffff) return false;
    if (addr && out.type != MsgType::Hello) return false;
    out.text = wire::printable(std::string_view(reinterpret_cast<const char *>(p), text), kMaxText);
    out.address.assign(p + text, p + text + addr);
    out.signed_bytes.assign(start, start + (size - kMacBytes));
    std::copy(start + (size - kMacBytes), start + size, out.mac.begin());
    return true;
}

}  // namespace wsync::ucx
