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
// HMAC-SHA256 is OpenSSL's (libcrypto, src/auth/hmac.hpp), opened with dlopen like UCX itself
// (api.hpp): the ucx kind is unavailable, naming the file, where no libcrypto.so.3 is installed.
#pragma once

#include <cstdint>

#include "auth/hmac.hpp"

namespace wsync::ucx {

// HMAC-SHA256 and its sizes are shared with nccl_broadcast's control channel (src/auth).
using auth::crypto_unavailable_reason;
using auth::hmac;
using auth::kKeyBytes;
using auth::kMacBytes;
using auth::kNonceBytes;
using auth::Key;
using auth::Mac;
using auth::Nonce;
using auth::same_mac;

// The key of one connection, from the init info's key and both nonces.
Key connection_key(const Key &key, uint32_t index, uint64_t token, const Nonce &engine,
                   const Nonce &trainer);

// The checksums that follow a chunk's bytes travel as the payload of a Data message (the
// answer to a Fetch of kFetchSums), which its header's MAC does not cover; the header's nonce
// field carries this instead: the first kNonceBytes of HMAC(connection key, "wsync-ucx-sums" |
// seq | the fetch's number | the payload).
Nonce sums_mac(const Key &connection_key, uint64_t seq, uint64_t number, const uint8_t *payload, std::size_t n);

}  // namespace wsync::ucx
