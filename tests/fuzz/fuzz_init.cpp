// Any bytes as init info: the receiver side parses them, and may try to map a segment named in
// them (only names of the form "/x" reach shm_open, and a missing one is UNAVAILABLE).
#include <cstddef>
#include <cstdint>

#include "wsync.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    wsync_strategy_t *s = nullptr;
    if (wsync_strategy_create("shm", nullptr, &s) != WSYNC_OK) return 0;
    wsync_receiver_t *r = nullptr;
    if (wsync_receiver_create(s, data, size, 0, &r) == WSYNC_OK) wsync_receiver_destroy(r);
    wsync_sender_t *snd = nullptr;
    if (wsync_sender_create(s, data, size, &snd) == WSYNC_OK) wsync_sender_destroy(snd);
    wsync_strategy_destroy(s);
    return 0;
}
