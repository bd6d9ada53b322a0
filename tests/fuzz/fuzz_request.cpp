// Any bytes as a request to a receiver attached to a real segment: the envelope, the tensor
// table and the shm transport checks, then (if accepted) every view is read in full, so an
// offset the checks let through would show up under AddressSanitizer.
//
// Each input gets a sender of its own, on a fresh segment, that has published chunk seq 1 in
// bucket 0 with the seeds' layout. Seeds name the segment "/wsync-000...0" (32 zeros); that text
// is swapped for the live segment's name (same length, so the CBOR stays valid) and the blob
// resealed, so mutations start from accepted requests. A fresh sender and fresh receivers per
// input keep each run independent of the previous one: a receiver index that attached before
// would be a re-attach, which shm admits only from the sender's next version, so every input
// after the first would stop at that refusal (as it did until 2026-11-27).
// Every input is received twice: by a plain receiver (index 0: views into the bucket) and by
// one with the "delta_mirror" option (index 1: every accepted tensor copied whole into the
// receiver's mirror, patches applied there, views of the mirror), so the mirror's copies and
// patch checks see the same mutated tables.
// WSYNC_FUZZ_SEEDS_MUST_PASS=1 (scripts/test-all.sh, replaying the seeds before fuzzing)
// aborts on any input either receiver refuses, so the seeds are known to reach past the checks.
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
wsync_strategy_t *g_plain;   // an engine's strategy
wsync_strategy_t *g_mirror;  // an engine's strategy with "delta_mirror"
const std::string kPlaceholder = "/wsync-" + std::string(32, '0');
bool g_must_pass;

void must(wsync_status_t st) {
    if (st != WSYNC_OK) {
        std::fprintf(stderr, "fuzz_request setup: %s\n", wsync_last_error());
        std::abort();
    }
}

// A trainer's strategy and sender on a fresh segment that has published the seeds' chunk
// (seq 1, bucket 0), its init info and its segment's name. Two receivers (index 0 plain,
// index 1 with a mirror). The segment has an arena (zero, never written), so requests that
// place tensors in it (seed shm_arena.cbor: both tensors at arena offsets 0 and 256) reach
// those checks too.
struct Trainer {
    wsync_strategy_t *strategy = nullptr;
    wsync_sender_t *sender = nullptr;
    wsync_blob_t init{};
    std::string segment;

    Trainer() {
        must(wsync_strategy_create("shm",
                                   "{\"receivers\": 2, \"bucket_bytes\": 65536, \"buckets\": 2, "
                                   "\"arena_bytes\": 65536}",
                                   &strategy));
        must(wsync_strategy_create_init_info(strategy, &init));
        must(wsync_sender_create(strategy, init.data, init.size, &sender));
        char *json;
        must(wsync_blob_describe(init.data, init.size, &json));
        const char *p = std::strstr(json, "/wsync-");
        segment.assign(p, kPlaceholder.size());
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
        must(wsync_sender_send_chunk(sender, &c, &req));
        wsync_blob_free(&req);
    }
    ~Trainer() {
        wsync_sender_destroy(sender);  // removes the segment
        wsync_strategy_destroy(strategy);
        wsync_blob_free(&init);
    }
    Trainer(const Trainer &) = delete;
    Trainer &operator=(const Trainer &) = delete;
};
}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    must(wsync_strategy_create("shm", nullptr, &g_plain));
    must(wsync_strategy_create("shm", "{\"delta_mirror\": true}", &g_mirror));
    const char *env = std::getenv("WSYNC_FUZZ_SEEDS_MUST_PASS");
    g_must_pass = env && std::strcmp(env, "1") == 0;
    std::atexit([] {
        wsync_strategy_destroy(g_mirror);
        wsync_strategy_destroy(g_plain);
    });
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Trainer trainer;
    std::vector<uint8_t> buf(data, data + size);
    auto it_ph = std::search(buf.begin(), buf.end(), kPlaceholder.begin(), kPlaceholder.end());
    if (it_ph != buf.end()) {
        std::copy(trainer.segment.begin(), trainer.segment.end(), it_ph);
        // Reseal (as a writer that knows the format would), so mutated bodies reach the parser
        // and the transport checks instead of stopping at the seal; fuzz_request_oracle covers
        // unsealed edits.
        if (buf.size() >= 9 && buf[buf.size() - 9] == 0x1b) {
            uint64_t h = XXH3_64bits(buf.data(), buf.size() - 9);
            for (int i = 0; i < 8; ++i) buf[buf.size() - 8 + i] = static_cast<uint8_t>(h >> (56 - 8 * i));
        }
    }

    uint32_t index = 0;
    for (wsync_strategy_t *s : {g_plain, g_mirror}) {
        wsync_receiver_t *r = nullptr;
        if (wsync_receiver_create(s, trainer.init.data, trainer.init.size, index++, &r) != WSYNC_OK) {
            std::fprintf(stderr, "fuzz_request: receiver: %s\n", wsync_last_error());
            std::abort();
        }
        wsync_recv_t *it = nullptr;
        const wsync_status_t st = wsync_receiver_receive(r, buf.data(), buf.size(), &it);
        if (st != WSYNC_OK && g_must_pass && size > 0) {  // libFuzzer also runs an empty input
            std::fprintf(stderr, "fuzz_request: a seed was refused by the %s receiver: %s\n",
                         s == g_mirror ? "mirror" : "plain", wsync_last_error());
            std::abort();
        }
        if (st == WSYNC_OK) {
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
