#include "transport/ucx/auth.hpp"

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

}  // namespace wsync::ucx
