// Writes a real request blob (shm, one chunk, one tensor per dtype: bfloat16, float32, uint8) to
// argv[1], for the CLI's inspect tests: made by the library at test time, so the blob follows
// the current wire format instead of a checked-in copy of an older one. No receiver attaches:
// the first chunk fills a free bucket and needs none.
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "wsync.h"

namespace {
int fail(const char *what, wsync_status_t st) {
    std::fprintf(stderr, "make_request: %s: %s: %s\n", what, wsync_status_string(st), wsync_last_error());
    return 1;
}
}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_request FILE\n");
        return 2;
    }
    wsync_strategy_t *strategy = nullptr;
    wsync_status_t st = wsync_strategy_create(
        "shm", "{\"receivers\": 1, \"buckets\": 1, \"bucket_bytes\": 65536}", &strategy);
    if (st != WSYNC_OK) return fail("wsync_strategy_create", st);
    wsync_blob_t init = {nullptr, 0};
    if ((st = wsync_strategy_create_init_info(strategy, &init)) != WSYNC_OK)
        return fail("wsync_strategy_create_init_info", st);
    wsync_sender_t *sender = nullptr;
    if ((st = wsync_sender_create(strategy, init.data, init.size, &sender)) != WSYNC_OK)
        return fail("wsync_sender_create", st);

    static uint8_t bytes[3][64];
    const int64_t shape[] = {4, 8};
    const char *names[] = {"embed.weight", "norm.weight", "mask"};
    const wsync_dtype_t dtypes[] = {
        {WSYNC_DTYPE_BFLOAT, 16, 1}, {WSYNC_DTYPE_FLOAT, 32, 1}, {WSYNC_DTYPE_UINT, 8, 1}};
    const int64_t elements[] = {32, 16, 64};  // 64 bytes each
    wsync_tensor_t t[3];
    std::memset(t, 0, sizeof t);
    for (int i = 0; i < 3; ++i) {
        t[i].name = names[i];
        t[i].data = bytes[i];
        t[i].shape = i == 0 ? shape : &elements[i];
        t[i].ndim = i == 0 ? 2 : 1;
        t[i].dtype = dtypes[i];
        t[i].device = {WSYNC_DEVICE_CPU, 0};
    }
    wsync_chunk_t chunk = {t, 3, WSYNC_CHUNK_LAST, 0};
    wsync_blob_t request = {nullptr, 0};
    if ((st = wsync_sender_send_chunk(sender, &chunk, &request)) != WSYNC_OK)
        return fail("wsync_sender_send_chunk", st);

    FILE *f = std::fopen(argv[1], "wb");
    if (!f || std::fwrite(request.data, 1, request.size, f) != request.size || std::fclose(f) != 0) {
        std::perror(argv[1]);
        return 1;
    }
    wsync_blob_free(&request);
    wsync_sender_destroy(sender);
    wsync_blob_free(&init);
    wsync_strategy_destroy(strategy);
    return 0;
}
