#include "transport/ucx/auth.hpp"

#include <dlfcn.h>
#include <mutex>

#include "error.hpp"

namespace wsync::ucx {
namespace {

// OpenSSL's one-shot HMAC (not deprecated in 3.0) and the digest; the types are opaque here.
using EvpSha256 = const void *(*)();
using HmacFn = unsigned char *(*)(const void *md, const void *key, int key_len, const unsigned char *d,
                                  std::size_t n, unsigned char *out, unsigned int *out_len);

struct Crypto {
    EvpSha256 sha256 = nullptr;
    HmacFn hmac = nullptr;
    std::string error;
};

const Crypto &crypto() {
    static Crypto c;
    static std::once_flag once;
    std::call_once(once, [] {
        std::string tried;
        for (const char *name : {"libcrypto.so.3", "libcrypto.so"}) {
            void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char *why = dlerror();
                tried += std::string(tried.empty() ? "" : "; ") + name + ": " + (why ? why : "cannot load");
                continue;
            }
            c.sha256 = reinterpret_cast<EvpSha256>(dlsym(h, "EVP_sha256"));
            c.hmac = reinterpret_cast<HmacFn>(dlsym(h, "HMAC"));
            if (c.sha256 && c.hmac) return;  // the handle stays open for the life of the process
            tried += std::string(tried.empty() ? "" : "; ") + name + " lacks HMAC or EVP_sha256";
            c.sha256 = nullptr;
            c.hmac = nullptr;
            dlclose(h);
        }
        c.error = "the ucx kind authenticates its peers with OpenSSL's HMAC-SHA256 and cannot load libcrypto (" +
                  tried + "; Debian: apt install libssl3)";
    });
    return c;
}

}  // namespace

std::string crypto_unavailable_reason() { return crypto().error; }

Mac hmac(const uint8_t *key, std::size_t key_len, const uint8_t *data, std::size_t n) {
    const Crypto &c = crypto();
    if (!c.error.empty()) fail(WSYNC_ERR_UNAVAILABLE, c.error);
    Mac out{};
    unsigned int len = 0;
    static const uint8_t empty = 0;
    if (!c.hmac(c.sha256(), key, static_cast<int>(key_len), n ? data : &empty, n, out.data(), &len) ||
        len != out.size())
        fail(WSYNC_ERR_SYSTEM, "ucx: OpenSSL's HMAC-SHA256 failed");
    return out;
}

bool same_mac(const uint8_t *a, const uint8_t *b) {
    volatile uint8_t diff = 0;
    for (std::size_t i = 0; i < kMacBytes; ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
    return diff == 0;
}

Key connection_key(const Key &key, uint32_t index, uint64_t token, const Nonce &engine, const Nonce &trainer) {
    static const char label[] = "wsync-ucx-conn";
    std::vector<uint8_t> d(label, label + sizeof label - 1);
    for (int i = 0; i < 4; ++i) d.push_back(static_cast<uint8_t>(index >> (8 * i)));
    for (int i = 0; i < 8; ++i) d.push_back(static_cast<uint8_t>(token >> (8 * i)));
    d.insert(d.end(), engine.begin(), engine.end());
    d.insert(d.end(), trainer.begin(), trainer.end());
    return hmac(key.data(), key.size(), d.data(), d.size());
}

}  // namespace wsync::ucx
