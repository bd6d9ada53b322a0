#include "transport/ucx/init_info.hpp"

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

// Fixed head of a control message: type, index, token, seq, version, chunk, status, pid,
// text length, address length; all little-endian.
constexpr std::size_t kHead = 4 + 4 + 8 + 8 + 8 + 4 + 4 + 4 + 2 + 4;

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
    return json{{"address", json::binary(info.address)}, {"trainer", info.trainer},
                {"session", info.session},               {"receivers", info.receivers},
                {"keep_versions", info.keep_versions},   {"checksum", info.checksum}};
}

InitInfo parse_init_info(const json &body) {
    const std::string w = "ucx init info";
    InitInfo info;
    info.address = binary_field(body, "address", w, kMaxAddressBytes);
    info.trainer = wire::string_field(body, "trainer", w, kMaxText);
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
    json t{{"session", w.session}, {"seq", w.seq}, {"addr", w.addr}, {"bytes", w.bytes},
           {"rkey", json::binary(w.rkey)}};
    if (w.block_bytes) {
        std::vector<uint8_t> sums(w.block_sums.size() * 8);
        for (std::size_t i = 0; i < w.block_sums.size(); ++i)
            for (int b = 0; b < 8; ++b) sums[i * 8 + b] = static_cast<uint8_t>(w.block_sums[i] >> (8 * b));
        t["block_bytes"] = w.block_bytes;
        t["block_sums"] = json::binary(std::move(sums));
    }
    return t;
}

Where parse_where(const json &t) {
    const std::string w = "ucx request";
    Where at;
    at.session = wire::uint_field(t, "session", w, UINT64_MAX);
    at.seq = wire::uint_field(t, "seq", w, UINT64_MAX);
    if (at.seq == 0) wire::malformed(w + ": seq is 0 (chunks count from 1)");
    at.addr = wire::uint_field(t, "addr", w, UINT64_MAX);
    at.bytes = wire::uint_field(t, "bytes", w, uint64_t(1) << 62);
    at.rkey = binary_field(t, "rkey", w, kMaxRkeyBytes);
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
    return at;
}

std::vector<uint8_t> encode_msg(const Msg &m) {
    std::vector<uint8_t> out;
    const std::size_t text = std::min(m.text.size(), kMaxText);
    out.reserve(kHead + text + m.address.size());
    put(out, static_cast<uint32_t>(m.type), 4);
    put(out, m.index, 4);
    put(out, m.token, 8);
    put(out, m.seq, 8);
    put(out, m.version, 8);
    put(out, m.chunk, 4);
    put(out, static_cast<uint32_t>(m.status), 4);
    put(out, static_cast<uint32_t>(m.pid), 4);
    put(out, text, 2);
    put(out, m.address.size(), 4);
    out.insert(out.end(), m.text.begin(), m.text.begin() + static_cast<std::ptrdiff_t>(text));
    out.insert(out.end(), m.address.begin(), m.address.end());
    return out;
}

bool decode_msg(const void *data, std::size_t size, Msg &out) {
    if (!data || size < kHead) return false;
    const uint8_t *p = static_cast<const uint8_t *>(data);
    const uint32_t type = static_cast<uint32_t>(get(p, 4));
    if (type < uint32_t(MsgType::Hello) || type > uint32_t(MsgType::Dropped)) return false;
    out.type = static_cast<MsgType>(type);
    out.index = static_cast<uint32_t>(get(p, 4));
    out.token = get(p, 8);
    out.seq = get(p, 8);
    out.version = get(p, 8);
    out.chunk = static_cast<uint32_t>(get(p, 4));
    out.status = static_cast<int32_t>(get(p, 4));
    out.pid = static_cast<int32_t>(get(p, 4));
    const std::size_t text = get(p, 2), addr = get(p, 4);
    if (text > kMaxText || addr > kMaxAddressBytes || size != kHead + text + addr) return false;
    if (out.status < 0 || out.status > 0xffff) return false;
    out.text = wire::printable(std::string_view(reinterpret_cast<const char *>(p), text), kMaxText);
    out.address.assign(p + text, p + text + addr);
    return true;
}

std::string self_name() {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
    return std::string(host) + " pid " + std::to_string(getpid());
}

}  // namespace wsync::ucx
