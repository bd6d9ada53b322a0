#include "transport/ucx/auth.hpp"

#include <algorithm>
#include <vector>

namespace wsync::ucx {

Key connection_key(const Key &key, uint32_t index, uint64_t token, const Nonce &engine, const Nonce &trainer) {
    static const char label[] = "wsync-ucx-conn";
    std::vector<uint8_t> d(label, label + sizeof label - 1);
    for (int i = 0; i < 4; ++i) d.push_back(static_cast<uint8_t>(index >> (8 * i)));
    for (int i = 0; i < 8; ++i) d.push_back(static_cast<uint8_t>(token >> (8 * i)));
    d.insert(d.end(), engine.begin(), engine.end());
    d.insert(d.end(), trainer.begin(), trainer.end());
    return hmac(key.data(), key.size(), d.data(), d.size());
}

Nonce sums_mac(const Key &connection_key, uint64_t seq, uint64_t number, const uint8_t *payload, std::size_t n) {
    static const char label[] = "wsync-ucx-sums";
    std::vector<uint8_t> d(label, label + sizeof label - 1);
    for (int i = 0; i < 8; ++i) d.push_back(static_cast<uint8_t>(seq >> (8 * i)));
    for (int i = 0; i < 8; ++i) d.push_back(static_cast<uint8_t>(number >> (8 * i)));
    d.insert(d.end(), payload, payload + n);
    const Mac mac = hmac(connection_key.data(), connection_key.size(), d.data(), d.size());
    Nonce out;
    std::copy(mac.begin(), mac.begin() + kNonceBytes, out.begin());
    return out;
}

}  // namespace wsync::ucx
