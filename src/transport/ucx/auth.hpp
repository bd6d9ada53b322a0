// Who may talk to a ucx trainer or engine (issue 37; the trust model is written in wsync.h and
// docs/failure-model.md): every control message carries an HMAC-SHA256 made with a secret that
// only the init info holds.
//
// create_init_info draws a random 32-byte key. An engine's hello is MACed with it (over the
// whole hello: its index, token, session, a fresh 16-byte nonce of the engine's and its worker
// address), so the trainer connects to an address only once the hello is authenticated, and a
// hello seen before (its nonce) is dropped. The trainer's welcome carries a fresh nonce of its
// own; from then on both sides MAC every message with the connection's key, HMAC(key,
// "wsync-ucx-conn" | index | token | engine nonce | trainer nonce), over the direction, a
// per-direction message number that must rise, and the message's bytes. Requests never carry
// the key; the key never travels on the wire.
//
// HMAC-SHA256 is OpenSSL's (libcrypto), opened with dlopen like UCX itself (api.hpp): the ucx
// kind is unavailable, naming the file, where no libcrypto.so.3 is installed (Debian: libssl3).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace wsync::ucx {

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

// The key of one connection, from the init info's key and both nonces.
Key connection_key(const Key &key, uint32_t index, uint64_t token, const Nonce &engine,
                   const Nonce &trainer);

}  // namespace wsync::ucx
