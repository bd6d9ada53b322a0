// HMAC-SHA256 for the kinds that take connections from other processes over a network ("ucx",
// and "nccl_broadcast"'s control channel): a key only the init info holds authenticates each
// peer. OpenSSL's libcrypto is opened with dlopen, so libwsync has no load-time dependency on
// it; a kind that needs it is unavailable, naming the file, where no libcrypto.so.3 is
// installed (Debian: libssl3).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace wsync::auth {

inline constexpr std::size_t kKeyBytes = 32;
inline constexpr std::size_t kNonceBytes = 16;
inline constexpr std::size_t kMacBytes = 32;
using Key = std::array<uint8_t, kKeyBytes>;
using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// "" when HMAC-SHA256 can be loaded, else why not (the file, and what is missing).
std::string crypto_unavailable_reason();
// HMAC-SHA256(key, data). Throws WSYNC_ERR_UNAVAILABLE when libcrypto cannot be loaded.
Mac hmac(const uint8_t *key, std::size_t key_len, const uint8_t *data, std::size_t n);
// Compares in time independent of where they differ.
bool same_mac(const uint8_t *a, const uint8_t *b);

}  // namespace wsync::auth
