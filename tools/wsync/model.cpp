// wsync: the synthetic model the demo and bench sync, its verifiable contents, the engines'
// parameter buffers, and the frames controller and engines exchange.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <poll.h>
#include <unistd.h>

#include "cli.hpp"

namespace wsync_cli {
namespace {

inline uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

bool write_all(int fd, const void *p, size_t n) {
    const char *c = static_cast<const char *>(p);
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w;
        n -= size_t(w);
    }
    return true;
}

bool read_all(int fd, void *p, size_t n, int timeout_ms) {
    char *c = static_cast<char *>(p);
    while (n) {
        pollfd pfd{fd, POLLIN, 0};
        int r = poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        ssize_t got = read(fd, c, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return false;
        c += got;
        n -= size_t(got);
    }
    return true;
}

}  // namespace

std::vector<TensorSpec> make_model(uint64_t bytes) {
    int64_t vocab = bytes >= (uint64_t(512) << 20) ? 32000 : 4096;
    int64_t h = 4096;
    auto layer_bytes = [](int64_t hh) {
        int64_t inter = (hh * 11 / 4 + 63) / 64 * 64;
        return uint64_t(4 * hh * hh + 3 * hh * inter + 2 * hh) * 2;
    };
    while (h > 64 && uint64_t(2 * vocab * h * 2) + layer_bytes(h) > bytes) h /= 2;
    int64_t inter = (h * 11 / 4 + 63) / 64 * 64;
    uint64_t fixed = uint64_t(2 * vocab * h + h) * 2;
    // Rounded, so the model lands within half a layer of the size asked for.
    int64_t layers =
        bytes > fixed ? std::max<int64_t>(1, int64_t((bytes - fixed + layer_bytes(h) / 2) / layer_bytes(h))) : 1;
    std::vector<TensorSpec> m;
    auto add = [&](std::string name, std::vector<int64_t> shape) {
        uint64_t n = 2;
        for (int64_t d : shape) n *= uint64_t(d);
        m.push_back({std::move(name), std::move(shape), n});
    };
    add("model.embed_tokens.weight", {vocab, h});
    for (int64_t l = 0; l < layers; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        add(p + "input_layernorm.weight", {h});
        for (const char *proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
            add(p + "self_attn." + proj + ".weight", {h, h});
        add(p + "post_attention_layernorm.weight", {h});
        add(p + "mlp.gate_proj.weight", {inter, h});
        add(p + "mlp.up_proj.weight", {inter, h});
        add(p + "mlp.down_proj.weight", {h, inter});
    }
    add("model.norm.weight", {h});
    add("lm_head.weight", {vocab, h});
    return m;
}

void fill(uint8_t *p, uint64_t n, uint64_t step, uint64_t t) {
    uint64_t seed = mix(step * 0x100000001b3ull ^ t);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = seed ^ (i * 0x9e3779b97f4a7c15ull);
        std::memcpy(p + i, &v, 8);
    }
    for (; i < n; ++i) p[i] = static_cast<uint8_t>(seed >> (8 * (i & 7)));
}
bool verify(const uint8_t *p, uint64_t n, uint64_t step, uint64_t t) {
    uint64_t seed = mix(step * 0x100000001b3ull ^ t);
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = seed ^ (i * 0x9e3779b97f4a7c15ull), got;
        std::memcpy(&got, p + i, 8);
        if (got != v) return false;
    }
    for (; i < n; ++i)
        if (p[i] != static_cast<uint8_t>(seed >> (8 * (i & 7)))) return false;
    return true;
}

std::vector<std::vector<uint8_t>> allocate(const std::vector<TensorSpec> &m) {
    std::vector<std::vector<uint8_t>> b(m.size());
    for (size_t i = 0; i < m.size(); ++i) b[i].assign(m[i].bytes, 0);
    return b;
}

Params::Params(const std::vector<TensorSpec> &m, uint64_t offset) {
    uint64_t total = 0;
    for (const auto &t : m) total += (t.bytes + offset + 4095) / 4096 * 4096;
    base = static_cast<uint8_t *>(std::aligned_alloc(4096, total));
    if (!base) die("out of memory for engine parameters");
    std::memset(base, 0, total);
    uint64_t off = 0;
    for (const auto &t : m) {
        at.push_back(base + off + offset);
        off += (t.bytes + offset + 4095) / 4096 * 4096;
    }
}
Params::~Params() { std::free(base); }

std::vector<std::vector<wsync_tensor_t>> plan_chunks(const std::vector<wsync_tensor_t> &desc,
                                                     uint64_t chunk_bytes,
                                                     std::vector<std::vector<wsync_part_t>> *parts) {
    wsync_plan_t *plan;
    const std::string opts = "{\"chunk_bytes\": " + std::to_string(chunk_bytes) +
                             (parts ? ", \"split\": true}" : "}");
    check(wsync_plan_create(desc.data(), desc.size(), opts.c_str(), &plan), "plan");
    size_t count = 0;
    check(wsync_plan_chunk_count(plan, &count), "plan");
    std::vector<std::vector<wsync_tensor_t>> chunks(count);
    for (size_t c = 0; c < count; ++c) {
        const size_t *idx;
        size_t n;
        check(wsync_plan_chunk(plan, c, &idx, &n, nullptr), "plan");
        for (size_t k = 0; k < n; ++k) chunks[c].push_back(desc[idx[k]]);
        if (parts) {
            const wsync_part_t *p;
            check(wsync_plan_chunk_parts(plan, c, &p), "plan");
            parts->emplace_back(p, p + n);
        }
    }
    wsync_plan_destroy(plan);
    return chunks;
}

bool send_frame(int fd, uint32_t type, const void *p, uint64_t n) {
    uint64_t hdr[2] = {type, n};
    return write_all(fd, hdr, sizeof hdr) && (n == 0 || write_all(fd, p, n));
}
bool recv_frame(int fd, uint32_t *type, std::vector<uint8_t> *payload, int timeout_ms) {
    uint64_t hdr[2];
    if (!read_all(fd, hdr, sizeof hdr, timeout_ms) || hdr[1] > (uint64_t(1) << 30)) return false;
    *type = uint32_t(hdr[0]);
    payload->resize(hdr[1]);
    return hdr[1] == 0 || read_all(fd, payload->data(), hdr[1], timeout_ms);
}

}  // namespace wsync_cli
