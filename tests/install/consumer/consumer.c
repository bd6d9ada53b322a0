/* A program written against the installed library only: syncs one tensor to itself over shm. */
#include <stdio.h>
#include <string.h>
#include <wsync.h>

static int check(wsync_status_t st, const char *what) {
    if (st == WSYNC_OK) return 0;
    fprintf(stderr, "%s: %s: %s\n", what, wsync_status_string(st), wsync_last_error());
    return 1;
}

int main(void) {
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    wsync_receiver_t *rx;
    wsync_recv_t *it;
    float w[4] = {0.5f, 1.5f, 2.5f, 3.5f};
    int64_t shape[1] = {4};
    wsync_tensor_t t;
    memset(&t, 0, sizeof t);
    t.name = "w";
    t.data = w;
    t.shape = shape;
    t.ndim = 1;
    t.dtype.code = WSYNC_DTYPE_FLOAT;
    t.dtype.bits = 32;
    t.dtype.lanes = 1;
    t.device.type = WSYNC_DEVICE_CPU;
    wsync_chunk_t c = {&t, 1, WSYNC_CHUNK_LAST, 0};
    if (check(wsync_strategy_create("shm", NULL, &s), "create") ||
        check(wsync_strategy_create_init_info(s, &init), "init") ||
        check(wsync_sender_create(s, init.data, init.size, &tx), "sender") ||
        check(wsync_receiver_create(s, init.data, init.size, 0, &rx), "receiver") ||
        check(wsync_sender_send_chunk(tx, &c, &req), "send") ||
        check(wsync_receiver_receive(rx, req.data, req.size, &it), "receive"))
        return 1;
    wsync_tensor_t v;
    bool has;
    if (check(wsync_recv_next(it, &v, &has), "next") || !has || memcmp(v.data, w, sizeof w) != 0)
        return 1;
    if (check(wsync_recv_end(it), "end") || check(wsync_sender_flush(tx, 1000), "flush")) return 1;
    printf("consumer OK: libwsync %s\n", wsync_version_string());
    wsync_blob_free(&req);
    wsync_blob_free(&init);
    wsync_receiver_destroy(rx);
    wsync_sender_destroy(tx);
    wsync_strategy_destroy(s);
    return 0;
}
