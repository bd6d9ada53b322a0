/* Specification of a GPU trainer on the ucx kind, against the fake driver (CTest points
 * WSYNC_CUDA_LIBRARY at tests/fake_gpu): tensors in CUDA device memory are packed by the GPU
 * into the chunk's staging buffer, pinned host memory that UCX serves as host memory, and hashed
 * there by the trainer's CPU; engines pull host bytes as from any ucx trainer. Trainer and engine
 * share this process over loopback tcp (the sender's progress thread serves the GETs), so the
 * fake's "device memory" (host shared memory) is filled and checked directly.
 * tests/gpu/test_gpu_hw.c runs the same path between two processes on a real GPU. */
#include <dlfcn.h>

#include "fake_gpu/fake_gpu.h"
#include "testutil.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static struct {
    void *h;
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(int *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
    CUresult (*cuCtxSetCurrent)(void *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    wsync_fake_stats_fn stats;
    wsync_fake_stream_hold_fn hold;
    wsync_fake_stream_hold_next_fn hold_next;
    wsync_fake_stream_release_held_fn release;
    wsync_fake_set_fail_fn set_fail;
} drv;

#define OPTS "\"transports\":\"tcp\",\"net_devices\":\"lo\""

static int setup(void **state) {
    (void)state;
    const char *path = getenv("WSYNC_CUDA_LIBRARY");
    if (!path || !(drv.h = dlopen(path, RTLD_NOW | RTLD_LOCAL))) return -1;
#define SYM(f, name) \
    if (!(*(void **)&drv.f = dlsym(drv.h, name))) return -1
    SYM(cuInit, "cuInit");
    SYM(cuDeviceGet, "cuDeviceGet");
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuMemAlloc, "cuMemAlloc_v2");
    SYM(cuMemFree, "cuMemFree_v2");
    SYM(stats, "wsync_fake_stats");
    SYM(hold, "wsync_fake_stream_hold");
    SYM(hold_next, "wsync_fake_stream_hold_next");
    SYM(release, "wsync_fake_stream_release_held");
    SYM(set_fail, "wsync_fake_set_fail");
#undef SYM
    return 0;
}

/* Skips where this build or machine has no ucx kind (no UCX header at build time, no libucp). */
static void need_ucx(void) {
    wsync_strategy_t *s = NULL;
    if (wsync_strategy_create("ucx", "{" OPTS "}", &s) != WSYNC_OK) {
        print_message("skipped: %s\n", wsync_last_error());
        skip();
    }
    wsync_strategy_destroy(s);
}

static void use_device(int ordinal) {
    assert_int_equal(drv.cuInit(0), 0);
    int dev;
    void *ctx;
    assert_int_equal(drv.cuDeviceGet(&dev, ordinal), 0);
    assert_int_equal(drv.cuDevicePrimaryCtxRetain(&ctx, dev), 0);
    assert_int_equal(drv.cuCtxSetCurrent(ctx), 0);
}

static struct wsync_fake_stats stats_now(void) {
    struct wsync_fake_stats s;
    drv.stats(&s);
    return s;
}

/* The model: t0 and t2 on cuda:0 (t2 at 4 bytes past a 16-byte boundary, so the pack kernel
 * leaves its 16-byte path), t1 in host memory; chunk 0 holds t0 and t1, chunk 1 holds t2. */
enum { NT = 3 };
static const int64_t shapes[NT][1] = {{300000}, {1000}, {77777}};
static const size_t bytes[NT] = {1200000, 4000, 311108};

typedef struct {
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    wsync_strategy_t *rs;
    wsync_receiver_t *rx;
    CUdeviceptr dev[2]; /* t0's allocation, and t2's (t2 at offset 4) */
    void *host;
} rig;

static void rig_start(rig *r, const char *trainer_extra) {
    need_ucx();
    use_device(0);
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"receivers\":1,\"timeout_ms\":400%s}", trainer_extra);
    OK(wsync_strategy_create("ucx", o, &r->s));
    OK(wsync_strategy_create_init_info(r->s, &r->init));
    OK(wsync_sender_create(r->s, r->init.data, r->init.size, &r->tx));
    OK(wsync_strategy_create("ucx", "{" OPTS ",\"timeout_ms\":5000}", &r->rs));
    OK(wsync_receiver_create(r->rs, r->init.data, r->init.size, 0, &r->rx));
    assert_int_equal(drv.cuMemAlloc(&r->dev[0], bytes[0]), 0);
    assert_int_equal(drv.cuMemAlloc(&r->dev[1], bytes[2] + 4), 0);
    r->host = malloc(bytes[1]);
}

static void rig_stop(rig *r) {
    wsync_receiver_destroy(r->rx);
    wsync_strategy_destroy(r->rs);
    wsync_sender_destroy(r->tx);
    wsync_blob_free(&r->init);
    wsync_strategy_destroy(r->s);
    drv.cuMemFree(r->dev[0]);
    drv.cuMemFree(r->dev[1]);
    free(r->host);
}

static void *data_of(rig *r, int k) {
    return k == 0 ? (void *)(uintptr_t)r->dev[0] : k == 1 ? r->host : (void *)(uintptr_t)(r->dev[1] + 4);
}

/* Writes version v's bytes (salted) into the three tensors, as the trainer's optimizer step. */
static void fill(rig *r, uint64_t v, uint64_t salt) {
    for (int k = 0; k < NT; ++k) tu_fill(data_of(r, k), bytes[k], v + salt, (uint64_t)k);
}

static wsync_tensor_t tensor(rig *r, int k) {
    static const char *const names[NT] = {"t0", "t1", "t2"};
    wsync_tensor_t t = tu_tensor(names[k], data_of(r, k), shapes[k], 1, WSYNC_DTYPE_FLOAT, 32);
    if (k != 1) t.device.type = WSYNC_DEVICE_CUDA;
    return t;
}

/* Sends chunk c (0: t0 + t1, 1: t2, committing) and returns its status; the request in *req. */
static wsync_status_t send(rig *r, int c, wsync_blob_t *req) {
    wsync_tensor_t t[2] = {tensor(r, c ? 2 : 0), tensor(r, 1)};
    wsync_chunk_t ch = tu_chunk(t, c ? 1 : 2, c ? WSYNC_CHUNK_LAST : 0);
    return wsync_sender_send_chunk(r->tx, &ch, req);
}

/* The engine loads one request: every view must be host memory holding version v (salted). */
static void load(rig *r, const wsync_blob_t *req, uint64_t v, uint64_t salt, size_t want_tensors) {
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r->rx, req->data, req->size, &it));
    wsync_tensor_t view;
    bool has;
    size_t n = 0;
    while (wsync_recv_next(it, &view, &has) == WSYNC_OK && has) {
        const uint64_t k = strtoull(view.name + 1, NULL, 10);
        assert_int_equal(view.device.type, WSYNC_DEVICE_CPU);
        assert_true(tu_check(view.data, bytes[k], v + salt, k));
        ++n;
    }
    OK(wsync_recv_end(it));
    assert_int_equal(n, want_tensors);
}

static void sync_version(rig *r, uint64_t v, uint64_t salt) {
    fill(r, v, salt);
    for (int c = 0; c < 2; ++c) {
        wsync_blob_t req;
        OK(send(r, c, &req));
        load(r, &req, v, salt, c ? 1 : 2);
        wsync_blob_free(&req);
    }
    OK(wsync_sender_flush(r->tx, 5000));
}

static void device_and_host_tensors_in_one_chunk_arrive_bit_for_bit_with_one_launch_per_chunk(void **state) {
    (void)state;
    rig r = {0};
    rig_start(&r, "");
    const struct wsync_fake_stats before = stats_now();
    for (uint64_t v = 1; v <= 4; ++v) sync_version(&r, v, 0);
    const struct wsync_fake_stats after = stats_now();
    /* One pack launch per chunk with device tensors; no device copy, no device allocation:
     * the GPU writes straight into pinned staging memory, made once per buffer and reused. */
    assert_int_equal(after.kernel_launches - before.kernel_launches, 8);
    assert_int_equal(after.allocs - before.allocs, 1); /* the pack table */
    assert_true(after.host_allocs - before.host_allocs >= 1);
    assert_true(after.host_allocs - before.host_allocs <= 6); /* keep_versions 2 + 1, two chunk sizes */
    const long long pinned = after.pinned_live;
    rig_stop(&r);
    assert_int_equal(stats_now().pinned_live, pinned - (after.host_allocs - before.host_allocs));
}

/* With "checksum": false the staged bytes are not hashed: the GPU's pack alone must be right. */
static void device_tensors_without_checksums_arrive_bit_for_bit(void **state) {
    (void)state;
    rig r = {0};
    rig_start(&r, ",\"checksum\":false");
    for (uint64_t v = 1; v <= 2; ++v) sync_version(&r, v, 7);
    rig_stop(&r);
}

static void a_tensor_on_another_gpu_is_refused_by_name_and_the_version_goes_on(void **state) {
    (void)state;
    rig r = {0};
    rig_start(&r, "");
    fill(&r, 1, 0);
    wsync_blob_t req;
    OK(send(&r, 0, &req));
    load(&r, &req, 1, 0, 2);
    wsync_blob_free(&req);
    wsync_tensor_t t = tensor(&r, 2);
    t.device.index = 1;
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    assert_int_equal(wsync_sender_send_chunk(r.tx, &ch, &req), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "'t2' is on cuda:1"));
    assert_non_null(strstr(wsync_last_error(), "one sender serves one GPU"));
    /* Bad input loses nothing: the same chunk from the right GPU commits version 1. */
    OK(send(&r, 1, &req));
    load(&r, &req, 1, 0, 1);
    wsync_blob_free(&req);
    OK(wsync_sender_flush(r.tx, 5000));
    sync_version(&r, 2, 0);
    rig_stop(&r);
}

static void managed_memory_is_refused_by_name(void **state) {
    (void)state;
    rig r = {0};
    rig_start(&r, "");
    wsync_tensor_t t = tensor(&r, 0);
    t.device.type = WSYNC_DEVICE_CUDA_MANAGED;
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    assert_int_equal(wsync_sender_send_chunk(r.tx, &ch, &req), WSYNC_ERR_UNSUPPORTED);
    assert_non_null(strstr(wsync_last_error(), "'t0'"));
    sync_version(&r, 1, 0);
    rig_stop(&r);
}

/* The trainer's own work on its stream does not finish (a hung collective): the send waits for
 * it up to timeout_ms, then fails naming the stream and the chunk. Nothing was queued, so the
 * staging buffer is reused and freed normally; once the stream moves, syncs go on. */
static void a_stalled_trainer_stream_times_out_the_send_naming_it_and_leaks_nothing(void **state) {
    (void)state;
    rig r = {0};
    rig_start(&r, "");
    const long long pinned_at_start = stats_now().pinned_live;
    sync_version(&r, 1, 0); /* the stage exists, its buffers are pooled */
    const struct wsync_fake_stats before = stats_now();
    assert_int_equal(drv.hold((void *)(uintptr_t)1), 0); /* the legacy default stream */
    fill(&r, 2, 0);
    wsync_blob_t req;
    const long t0 = tu_now_ms();
    assert_int_equal(send(&r, 0, &req), WSYNC_ERR_TIMEOUT);
    const long took = tu_now_ms() - t0;
    assert_true(took >= 350 && took < 2000);
    assert_non_null(strstr(wsync_last_error(), "the legacy default stream"));
    assert_non_null(strstr(wsync_last_error(), "chunk 0 of version 2"));
    assert_int_equal(stats_now().host_allocs - before.host_allocs, 1); /* version 1 holds the others */
    drv.release();
    /* The version was abandoned; the next one syncs, its first chunk in the failed send's
     * buffer (back in the pool), its second in a new one. */
    sync_version(&r, 3, 0);
    const struct wsync_fake_stats after = stats_now();
    assert_int_equal(after.host_allocs - before.host_allocs, 2);
    const long long pinned = after.pinned_live;
    rig_stop(&r);
    assert_true(stats_now().pinned_live < pinned); /* freed at destroy, none leaked */
    assert_int_equal(stats_now().pinned_live, pinned_at_start);
}

/* The pack itself does not finish (the sender's own stream stalls): the send fails with TIMEOUT
 * within its deadline naming the chunk; the buffer the stuck pack may still write is never given
 * to another chunk; a later send queues behind it and times out too; once the GPU moves, syncs
 * go on bit-exact, and at destroy pinned memory is left to the driver rather than freed under
 * the late writes. */
static void a_stuck_pack_times_out_and_its_buffer_is_never_reused(void **state) {
    (void)state;
    rig r = {0};
    drv.hold_next(1); /* the stage's stream, made by the first chunk with device tensors */
    rig_start(&r, "");
    const struct wsync_fake_stats s0 = stats_now();
    fill(&r, 1, 0);
    wsync_blob_t req;
    long t0 = tu_now_ms();
    assert_int_equal(send(&r, 0, &req), WSYNC_ERR_TIMEOUT);
    long took = tu_now_ms() - t0;
    assert_true(took >= 350 && took < 2000);
    assert_non_null(strstr(wsync_last_error(), "packing the device tensors of chunk 0 of version 1"));
    t0 = tu_now_ms();
    fill(&r, 2, 0);
    assert_int_equal(send(&r, 0, &req), WSYNC_ERR_TIMEOUT);
    took = tu_now_ms() - t0;
    assert_true(took >= 350 && took < 2000);
    /* Two chunks, two buffers: the first one was not handed out again. */
    assert_int_equal(stats_now().host_allocs - s0.host_allocs, 2);
    drv.release(); /* the stuck packs land, in their own buffers */
    sync_version(&r, 3, 0);
    sync_version(&r, 4, 0);
    const long long pinned = stats_now().pinned_live;
    rig_stop(&r);
    /* Every pinned buffer of a stage that got stuck stays allocated (the driver frees it at
     * exit): freeing pinned memory may wait for the stuck work. */
    assert_int_equal(stats_now().pinned_live, pinned);
    assert_int_equal(stats_now().host_frees - s0.host_frees, 0);
}

/* A launch the driver refuses names the chunk; the trainer tries again and the sync goes on. */
static void a_refused_launch_names_the_chunk_and_the_next_send_works(void **state) {
    (void)state;
    rig r = {0};
    rig_start(&r, "");
    const long long pinned_at_start = stats_now().pinned_live;
    sync_version(&r, 1, 0);
    drv.set_fail("cuLaunchKernel", 0, 2 /* CUDA_ERROR_OUT_OF_MEMORY */);
    fill(&r, 2, 0);
    wsync_blob_t req;
    assert_int_equal(send(&r, 0, &req), WSYNC_ERR_NO_MEMORY);
    assert_non_null(strstr(wsync_last_error(), "pack kernel"));
    sync_version(&r, 3, 0);
    rig_stop(&r);
    assert_int_equal(stats_now().pinned_live, pinned_at_start);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* CTest runs each test as its own process */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_and_host_tensors_in_one_chunk_arrive_bit_for_bit_with_one_launch_per_chunk),
        cmocka_unit_test(device_tensors_without_checksums_arrive_bit_for_bit),
        cmocka_unit_test(a_tensor_on_another_gpu_is_refused_by_name_and_the_version_goes_on),
        cmocka_unit_test(managed_memory_is_refused_by_name),
        cmocka_unit_test(a_stalled_trainer_stream_times_out_the_send_naming_it_and_leaks_nothing),
        cmocka_unit_test(a_stuck_pack_times_out_and_its_buffer_is_never_reused),
        cmocka_unit_test(a_refused_launch_names_the_chunk_and_the_next_send_works),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
