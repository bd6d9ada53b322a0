// Any bytes as a request to a receiver attached to a real segment: the envelope, the tensor
// table and the shm transport checks, then (if accepted) every view is read in full, so an
// offset the checks let through would show up under AddressSanitizer.
//
// Seeds name the segment "/wsync-000...0" (32 zeros); that text is swapped for the live
// segment's name (same length, so the CBOR stays valid) and the blob resealed, and the live sender has published
// chunk seq 1 in bucket 0 with the seeds' layout, so mutations start from accepted requests.
// A fresh receiver per input keeps each run independent of the previous one's chunk order.
// Every input is received twice: by a plain receiver (views into the bucket) and by one with
// the "delta_mirror" option (every accepted tensor copied whole into the receiver's mirror,
// patches applied there, views of the mirror), so the mirror's copies and patch checks see the
// same mutated tables.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "wsync.h"

namespace {
wsync_strategy_t *g_strategy;
wsync_strategy_t *g_mirror;  // an engine's strategy with "delta_mirror"
wsync_sender_t *g_sender;  // kept for the whole run; destroyed at exit, removing the segment
wsync_blob_t g_init;
std::string g_segment;
const std::string kPlaceholder = "/wsync-" + std::string(32, '0');

void must(wsync_status_t st) {
    if (st != WSYNC_OK) {
        std::fprintf(stderr, "fuzz_request setup: %s\n", wsync_last_error());
        std::abort();
    }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    // Two receivers, only index 0 ever attaches: the segment's name stays available. The
    // segment has an arena (zero, never written), so requests that place tensors in it
    // (seed shm_arena.cbor: both tensors at arena offsets 0 and 256) reach those checks too.
    must(wsync_strategy_create("shm", "{\"receivers\": 2, \"bucket_bytes\": 65536, \"buckets\": 2, "
                                      "\"arena_bytes\": 65536}",
                               &g_strategy));
    must(wsync_strategy_create_init_info(g_strategy, &g_init));
    must(wsync_sender_create(g_strategy, g_init.data, g_init.size, &g_sender));
    must(wsync_strategy_create("shm", "{\"delta_mirror\": true}", &g_mirror));
    std::atexit([] {
        wsync_sender_destroy(g_sender);
        wsync_strategy_destroy(g_mirror);
        wsync_strategy_destroy(g_strategy);
        wsync_blob_free(&g_init);
    });
    char *json;
    must(wsync_blob_describe(g_init.data, g_init.size, &json));
    const char *p = std::strstr(json, "/wsync-");
    g_segment.assign(p, kPlaceholder.size());
    wsync_string_free(json);
    static float a[6] = {1, 2, 3, 4, 5, 6};
    static int64_t sh[2] = {2, 3}, sh1[1] = {6};
    wsync_tensor_t t[2] = {};
    t[0].name = "layers.0.attn.q.weight";
    t[0].data = a;
    t[0].shape = sh;
    t[0].ndim = 2;
    t[0].dtype = {WSYNC_DTYPE_FLOAT, 32, 1};
    t[0].device = {WSYNC_DEVICE_CPU, 0};
    t[1] = t[0];
    t[1].name = "layers.0.attn.k.weight";
    t[1].shape = sh1;
    t[1].ndim = 1;
    wsync_chunk_t c = {t, 2, WSYNC_CHUNK_LAST, 0};
    wsync_blob_t req;
    must(wsync_sender_send_chunk(g_sender, &c, &req));
    wsync_blob_free(&req);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::vector<uint8_t> buf(data, data + size);
    auto it_ph = std::search(buf.begin(), buf.end(), kPlaceholder.begin(), kPlaceholder.end());
    if (it_ph != buf.end()) {
        std::copy(g_segment.begin(), g_segment.end(), it_ph);
        // Reseal (as a writer that knows the format would), so mutated bodies reach the parser
        // and the transport checks instead of stopping at the seal; fuzz_request_oracle covers
        // unsealed edits.
        if (buf.size() >= 9 && buf[buf.size() - 9] == 0x1b) {
            uint64_t h = XXH3_64bits(buf.data(), buf.size() - 9);
            for (int i = 0; i < 8; ++i) buf[buf.size() - 8 + i] = static_cast<uint8_t>(h >> (56 - 8 * i));
        }
    }

    for (wsync_strategy_t *s : {g_strategy, g_mirror}) {
        wsync_receiver_t *r = nullptr;
        if (wsync_receiver_create(s, g_init.data, g_init.size, 0, &r) != WSYNC_OK) std::abort();
        wsync_recv_t *it = nullptr;
        if (wsync_receiver_receive(r, buf.data(), buf.size(), &it) == WSYNC_OK) {
            wsync_recv_info_t info{};
            wsync_recv_info(it, &info);
            uint64_t sum = 0;
            for (;;) {
                wsync_tensor_t v;
                bool has = false;
                if (wsync_recv_next(it, &v, &has) != WSYNC_OK || !has) break;
                // Touch the first and last byte of every view the checks accepted.
                uint64_t n = 1;
                for (int32_t d = 0; d < v.ndim; ++d) n *= static_cast<uint64_t>(v.shape[d]);
                n = n * v.dtype.bits * v.dtype.lanes / 8;
                const auto *b = static_cast<const uint8_t *>(v.data);
                sum += b[0] + b[n - 1];
            }
            static volatile uint64_t sink;
            sink = sum;
            wsync_recv_end(it);
        }
        wsync_receiver_destroy(r);
    }
    return 0;
}
