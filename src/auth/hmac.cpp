#include "auth/hmac.hpp"

#include <dlfcn.h>
#include <mutex>

#include "error.hpp"

namespace wsync::auth {
namespace {

// OpenSSL's one-shot HMAC (not deprecated in 3.0) and the digest; the types are opaque here.
using EvpSha256 = const void *(*)();
using HmacFn = unsigned char *(*)(const void *md, const void *key, int key_len, const unsigned char *d,
                                  std::size_t n, unsigned char *out, unsigned int *out_len);

using InitCrypto = int (*)(uint64_t opts, const void *settings);
// OPENSSL_INIT_NO_ATEXIT (openssl/crypto.h, OpenSSL 3.0): no cleanup handler at exit.
constexpr uint64_t kOpensslInitNoAtexit = 0x00080000;

struct Crypto {
    EvpSha256 sha256 = nullptr;
    HmacFn hmac = nullptr;
    std::string error;
};

// A process may exit while a trainer's serving thread (ucx) or control thread (nccl_broadcast)
// is checking a MAC: a caller that ends without destroying its sender. OpenSSL frees the state
// HMAC reads in an exit handler it registers when first initialised (OpenSSL 3: OPENSSL_cleanup
// via atexit), so libwsync initialises it without one (OPENSSL_INIT_NO_ATEXIT). That holds when
// libwsync is the first to initialise OpenSSL in the process; docs/threading.md says what is
// left when something else was first.
const Crypto &crypto() {
    static Crypto &c = *new Crypto;  // never destroyed: threads may MAC during exit
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
            if (c.sha256 && c.hmac) {  // the handle stays open for the life of the process
                if (auto init = reinterpret_cast<InitCrypto>(dlsym(h, "OPENSSL_init_crypto")))
                    init(kOpensslInitNoAtexit, nullptr);
                return;
            }
            tried += std::string(tried.empty() ? "" : "; ") + name + " lacks HMAC or EVP_sha256";
            c.sha256 = nullptr;
            c.hmac = nullptr;
            dlclose(h);
        }
        c.error = "libwsync authenticates peers (kinds \"ucx\" and \"nccl_broadcast\") with OpenSSL's "
                  "HMAC-SHA256 and cannot load libcrypto (" +
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
        fail(WSYNC_ERR_SYSTEM, "OpenSSL's HMAC-SHA256 failed");
    return out;
}

bool same_mac(const uint8_t *a, const uint8_t *b) {
    volatile uint8_t diff = 0;
    for (std::size_t i = 0; i < kMacBytes; ++i) diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
    return diff == 0;
}

}  // namespace wsync::auth
