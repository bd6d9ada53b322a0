// Any bytes as init info: the receiver side parses them, and may try to map a segment named in
// them (only names of the form "/x" reach shm_open, and a missing one is UNAVAILABLE).
// An input that ends like a seal (0x1b and 8 bytes) is resealed first, as a writer that knows
// the format would, so mutated bodies reach the parser instead of stopping at the seal
// (fuzz_request_oracle covers unsealed edits).
#include <cstddef>
#include <cstdint>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "wsync.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *bytes, size_t size) {
    std::vector<uint8_t> buf(bytes, bytes + size);
    if (size >= 10 && buf[size - 9] == 0x1b) {
        uint64_t h = XXH3_64bits(buf.data(), size - 9);
        for (int i = 0; i < 8; ++i) buf[size - 8 + i] = static_cast<uint8_t>(h >> (56 - 8 * i));
    }
    const uint8_t *data = buf.data();
    wsync_strategy_t *s = nullptr;
    if (wsync_strategy_create("shm", nullptr, &s) != WSYNC_OK) return 0;
    wsync_receiver_t *r = nullptr;
    if (wsync_receiver_create(s, data, size, 0, &r) == WSYNC_OK) wsync_receiver_destroy(r);
    wsync_sender_t *snd = nullptr;
    if (wsync_sender_create(s, data, size, &snd) == WSYNC_OK) wsync_sender_destroy(snd);
    wsync_strategy_destroy(s);
    return 0;
}
