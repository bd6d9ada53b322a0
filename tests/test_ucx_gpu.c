/* Specification of GPU trainers and GPU engines on the ucx kind, against the fake driver (CTest
 * points WSYNC_CUDA_LIBRARY at tests/fake_gpu): tensors in CUDA device memory are packed by the
 * GPU into the chunk's staging buffer, pinned host memory that UCX serves as host memory, and
 * hashed there by the trainer's CPU; engines pull host bytes as from any ucx trainer, and an
 * engine with a GPU ("device") pulls into pinned memory and has wsync_recv_copy() verify on the
 * host and queue one asynchronous copy into its device memory. Trainer and engine
 * share this process over loopback tcp (the sender's progress thread serves the fetches), so the
 * fake's "device memory" (host shared memory) is filled and checked directly.
 * tests/gpu/test_gpu_hw.c runs the same path between two processes on a real GPU. */
#define _GNU_SOURCE /* memmem */
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
    CUresult (*cuStreamCreate)(void **, unsigned);
    CUresult (*cuCtxSynchronize)(void);
    wsync_fake_stats_fn stats;
    wsync_fake_set_stream_delay_ms_fn set_delay;
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
    SYM(cuStreamCreate, "cuStreamCreate");
    SYM(cuCtxSynchronize, "cuCtxSynchronize");
    SYM(stats, "wsync_fake_stats");
    SYM(set_delay, "wsync_fake_set_stream_delay_ms");
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

static void rig_start_with(rig *r, const char *trainer_extra, const char *engine_extra) {
    need_ucx();
    use_device(0);
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"receivers\":1,\"timeout_ms\":400%s}", trainer_extra);
    OK(wsync_strategy_create("ucx", o, &r->s));
    OK(wsync_strategy_create_init_info(r->s, &r->init));
    OK(wsync_sender_create(r->s, r->init.data, r->init.size, &r->tx));
    snprintf(o, sizeof o, "{" OPTS "%s}", engine_extra);
    OK(wsync_strategy_create("ucx", o, &r->rs));
    OK(wsync_receiver_create(r->rs, r->init.data, r->init.size, 0, &r->rx));
    assert_int_equal(drv.cuMemAlloc(&r->dev[0], bytes[0]), 0);
    assert_int_equal(drv.cuMemAlloc(&r->dev[1], bytes[2] + 4), 0);
    r->host = malloc(bytes[1]);
}

static void rig_start(rig *r, const char *trainer_extra) {
    rig_start_with(r, trainer_extra, ",\"timeout_ms\":5000");
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

/* A device tensor the pack kernel could not read (host memory labelled CUDA; t2's shape one
 * element larger than its allocation) is refused by name before the launch, which would fault
 * and end the trainer's CUDA context; the version goes on with the right tensors. */
static void a_device_tensor_outside_device_memory_is_refused_by_name_and_the_version_goes_on(void **state) {
    (void)state;
    rig r = {0};
    rig_start(&r, "");
    fill(&r, 1, 0);
    wsync_tensor_t t = tensor(&r, 1);
    t.device.type = WSYNC_DEVICE_CUDA; /* r.host, from malloc */
    wsync_chunk_t ch = tu_chunk(&t, 1, 0);
    wsync_blob_t req;
    assert_int_equal(wsync_sender_send_chunk(r.tx, &ch, &req), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "ucx: tensor 't1' (4000 bytes at 0x"));
    assert_non_null(strstr(wsync_last_error(), "is not memory the CUDA driver knows"));
    const int64_t longer[1] = {shapes[2][0] + 1};
    t = tensor(&r, 2);
    t.shape = longer;
    assert_int_equal(wsync_sender_send_chunk(r.tx, &ch, &req), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "'t2' (311112 bytes at 0x"));
    assert_non_null(strstr(wsync_last_error(), "runs past the memory the CUDA driver knows"));
    struct wsync_fake_stats before = stats_now();
    OK(send(&r, 0, &req));
    load(&r, &req, 1, 0, 2);
    wsync_blob_free(&req);
    OK(send(&r, 1, &req));
    load(&r, &req, 1, 0, 1);
    wsync_blob_free(&req);
    OK(wsync_sender_flush(r.tx, 5000));
    assert_int_equal(stats_now().kernel_launches - before.kernel_launches, 2);
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
 * within its deadline naming the chunk; while that pack has not finished, later sends fail at
 * once (nothing queues behind it) and take no buffer; the buffer the stuck pack may still write
 * goes to no other chunk; once the GPU moves, syncs go on bit-exact and that buffer is freed. */
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
    assert_true(tu_now_ms() - t0 < 200);
    assert_non_null(strstr(wsync_last_error(), "packing chunk 0 of version 1 on GPU-"));
    assert_non_null(strstr(wsync_last_error(), "has still not finished"));
    /* One buffer, the stuck pack's; the second send took none. */
    assert_int_equal(stats_now().host_allocs - s0.host_allocs, 1);
    assert_int_equal(stats_now().host_frees - s0.host_frees, 0);
    drv.release(); /* the stuck pack lands, in its own buffer */
    assert_int_equal(drv.cuCtxSynchronize(), 0);
    sync_version(&r, 3, 0);
    sync_version(&r, 4, 0);
    /* The stuck pack's buffer was not handed out again: versions 3 and 4 took their own; it was
     * freed once the stage was idle. */
    assert_true(stats_now().host_allocs - s0.host_allocs >= 3);
    assert_int_equal(stats_now().host_frees - s0.host_frees, 1);
    rig_stop(&r);
    const struct wsync_fake_stats s1 = stats_now();
    assert_int_equal(s1.host_frees - s0.host_frees, s1.host_allocs - s0.host_allocs);
    assert_int_equal(s1.pinned_live, s0.pinned_live);
}

/* Destroying the sender while its pack is stuck returns within its bound: the stage's stream,
 * pack table, module and pinned buffers are left to the driver (freeing any of them could wait
 * for the stuck pack, or pull memory from under it). */
static void destroying_the_sender_while_its_pack_is_stuck_is_bounded(void **state) {
    (void)state;
    rig r = {0};
    drv.hold_next(1);
    rig_start(&r, "");
    const struct wsync_fake_stats s0 = stats_now();
    fill(&r, 1, 0);
    wsync_blob_t req;
    assert_int_equal(send(&r, 0, &req), WSYNC_ERR_TIMEOUT);
    const long t0 = tu_now_ms();
    wsync_sender_destroy(r.tx);
    r.tx = NULL;
    assert_true(tu_now_ms() - t0 < 2000);
    assert_int_equal(stats_now().host_frees - s0.host_frees, 0);
    assert_int_equal(stats_now().pinned_live - s0.pinned_live, 1);
    drv.release(); /* the kept stream's pack finishes into memory still allocated */
    rig_stop(&r);  /* (the fake's cuMemFree of the tensors waits for every stream, as cudaFree) */
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

/* ---- an engine with a GPU ("device": 0) ------------------------------------------------- */
/* The engine's own parameters, as a loader holds them: t0 and t2 on its GPU, t1 on the host. */
typedef struct {
    CUdeviceptr dev[NT];
    void *host;
} params;

static void params_make(params *p) {
    memset(p, 0, sizeof *p);
    assert_int_equal(drv.cuMemAlloc(&p->dev[0], bytes[0]), 0);
    assert_int_equal(drv.cuMemAlloc(&p->dev[2], bytes[2]), 0);
    p->host = calloc(1, bytes[1]);
}

static void params_free(params *p) {
    drv.cuMemFree(p->dev[0]);
    drv.cuMemFree(p->dev[2]);
    free(p->host);
}

static void *param(params *p, uint64_t k) { return k == 1 ? p->host : (void *)(uintptr_t)p->dev[k]; }

/* Loads one request by wsync_recv_copy into the parameters; returns recv_end's status. With
 * `late` (a version), the fake GPU runs each queued operation only after 300 ms unless waited
 * for, and the test checks that the device parameters do not hold that version yet when the
 * copies return. */
static wsync_status_t load_into(rig *r, params *p, const wsync_blob_t *req, uint64_t late) {
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r->rx, req->data, req->size, &it));
    wsync_recv_info_t info = {0};
    wsync_recv_info(it, &info);
    if (late) drv.set_delay(300);
    for (size_t i = 0; i < info.count; ++i) {
        wsync_tensor_t t;
        OK(wsync_recv_peek(it, i, &t));
        const uint64_t k = strtoull(t.name + 1, NULL, 10);
        memset(param(p, k), 0, bytes[k]);
        const wsync_status_t st = wsync_recv_copy(it, i, 0, param(p, k), bytes[k]);
        if (st != WSYNC_OK) {
            drv.set_delay(0);
            wsync_recv_end(it);
            return st;
        }
        if (late && k != 1) assert_false(tu_check(param(p, k), bytes[k], late, k));
    }
    const wsync_status_t end = wsync_recv_end(it);
    drv.set_delay(0);
    return end;
}

static void check_params(params *p, uint64_t v, int c) {
    if (c) {
        assert_true(tu_check(param(p, 2), bytes[2], v, 2));
    } else {
        assert_true(tu_check(param(p, 0), bytes[0], v, 0));
        assert_true(tu_check(param(p, 1), bytes[1], v, 1));
    }
}

static void a_gpu_engine_copies_verified_chunks_into_device_memory_asynchronously(void **state) {
    (void)state;
    rig r = {0};
    rig_start_with(&r, "", ",\"timeout_ms\":5000,\"device\":0");
    wsync_receiver_state_t rs = {sizeof rs, 0, 0, 0, 0, WSYNC_OK, 0};
    OK(wsync_receiver_poll(r.rx, &rs));
    assert_true(rs.flags & WSYNC_RECEIVER_ORDERS_LOADER_WORK);
    params p;
    params_make(&p);
    const struct wsync_fake_stats before = stats_now();
    for (uint64_t v = 1; v <= 3; ++v) {
        fill(&r, v, 0);
        for (int c = 0; c < 2; ++c) {
            wsync_blob_t req;
            OK(send(&r, c, &req));
            /* The copies return before the GPU ran them; recv_end waits for them. */
            OK(load_into(&r, &p, &req, v == 2 ? v : 0));
            check_params(&p, v, c);
            wsync_blob_free(&req);
        }
        OK(wsync_sender_flush(r.tx, 5000));
    }
    const struct wsync_fake_stats after = stats_now();
    /* Two device tensors a version (one copy each, from pinned memory) plus the trainer's
     * pack tables; the engine's host parameter took the host copy loop. */
    assert_int_equal(after.memcpy_calls - before.memcpy_calls, 3 * 2 + 3 * 2);
    rig_stop(&r);
    params_free(&p);
    assert_int_equal(stats_now().pinned_live, 0);
}

/* Flips a bit of tensor k's tree hash in a request (version v's bytes) and re-seals it: the
 * chunk then arrives with bytes that do not match what the request says, as bytes changed on
 * the way would. (Requests carry no staging address to corrupt the trainer's copy through:
 * chunks are fetched, issue 37.) */
static void corrupt_tree_hash(wsync_blob_t *req, uint64_t v, int k) {
    uint8_t *host = malloc(bytes[k]), be[8];
    tu_fill(host, bytes[k], v, (uint64_t)k);
    const uint64_t h = tu_tree_hash(host, bytes[k]);
    free(host);
    for (int i = 0; i < 8; ++i) be[i] = (uint8_t)(h >> (56 - 8 * i));
    uint8_t *at = memmem(req->data, req->size, be, sizeof be);
    assert_non_null(at);
    at[7] ^= 0x40;
    tu_reseal(req->data, req->size);
}

static void a_corrupted_chunk_is_refused_before_any_device_copy_and_both_sides_hear_of_it(void **state) {
    (void)state;
    rig r = {0};
    rig_start_with(&r, "", ",\"timeout_ms\":5000,\"device\":0");
    params p;
    params_make(&p);
    fill(&r, 1, 0);
    wsync_blob_t req;
    OK(send(&r, 0, &req));
    corrupt_tree_hash(&req, 1, 0); /* t0's */
    const struct wsync_fake_stats before = stats_now();
    assert_int_equal(load_into(&r, &p, &req, 0), WSYNC_ERR_INTEGRITY);
    assert_non_null(strstr(wsync_last_error(), "'t0'"));
    assert_int_equal(stats_now().memcpy_calls, before.memcpy_calls); /* nothing queued */
    assert_int_equal(((uint8_t *)param(&p, 0))[100], 0);
    wsync_blob_free(&req);
    assert_int_equal(wsync_sender_flush(r.tx, 5000), WSYNC_ERR_PEER);
    assert_non_null(strstr(wsync_last_error(), "WSYNC_ERR_INTEGRITY"));
    rig_stop(&r);
    params_free(&p);
}

static void a_destination_on_another_gpu_is_refused_and_the_copy_can_be_retried(void **state) {
    (void)state;
    rig r = {0};
    rig_start_with(&r, "", ",\"timeout_ms\":5000,\"device\":0");
    params p;
    params_make(&p);
    fill(&r, 1, 0);
    wsync_blob_t req;
    OK(send(&r, 0, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r.rx, req.data, req.size, &it));
    /* cuda:1's memory: allocated in its own context. */
    use_device(1);
    CUdeviceptr other = 0;
    assert_int_equal(drv.cuMemAlloc(&other, bytes[0]), 0);
    use_device(0);
    assert_int_equal(wsync_recv_copy(it, 0, 0, (void *)(uintptr_t)other, bytes[0]), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "not of this receiver's GPU"));
    /* A range past the allocation's end is refused too, nothing queued. */
    assert_int_equal(wsync_recv_copy(it, 0, 0, (void *)(uintptr_t)(p.dev[2]), bytes[0]), WSYNC_ERR_INVALID_ARGUMENT);
    OK(wsync_recv_copy(it, 0, 0, param(&p, 0), bytes[0]));
    OK(wsync_recv_copy(it, 1, 0, param(&p, 1), bytes[1]));
    OK(wsync_recv_end(it));
    check_params(&p, 1, 0);
    wsync_blob_free(&req);
    use_device(1);
    drv.cuMemFree(other);
    use_device(0);
    rig_stop(&r);
    params_free(&p);
    /* An ordinal this process does not have: the engine is not made, and says why. */
    wsync_strategy_t *s;
    OK(wsync_strategy_create("ucx", "{" OPTS ",\"device\":7}", &s));
    rig r2 = {0};
    rig_start(&r2, "");
    wsync_receiver_t *rx = NULL;
    assert_int_equal(wsync_receiver_create(s, r2.init.data, r2.init.size, 0, &rx), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "7"));
    assert_null(rx);
    wsync_strategy_destroy(s);
    rig_stop(&r2);
}

/* A trainer and a GPU engine ("device": 0, timeout 400 ms) whose loader works on a stream of its
 * own (returned), with the engine's parameters. */
static void *gpu_engine_on_its_own_stream(rig *r, params *p) {
    rig_start_with(r, "", ",\"timeout_ms\":400,\"device\":0");
    params_make(p);
    void *loader = NULL;
    assert_int_equal(drv.cuStreamCreate(&loader, 1), 0);
    OK(wsync_receiver_set_stream(r->rx, loader));
    return loader;
}

/* The loader's stream does not move (a stuck kernel of the engine's): recv_end fails with
 * TIMEOUT within the deadline naming the stream and the chunk, and the trainer's flush names the
 * engine. While that stream is still stuck, the next chunk fails at once, before anything is
 * pulled into the buffer those copies may still read (both sides hear of it); once the stream
 * moves, the buffer is reused and the next version lands bit-exact; nothing is left behind. */
static void a_stalled_loader_stream_fails_recv_end_in_time_and_its_buffer_is_not_reused(void **state) {
    (void)state;
    rig r = {0};
    params p;
    void *loader = gpu_engine_on_its_own_stream(&r, &p);
    sync_version(&r, 1, 0); /* views only: settles on the loader's stream too */
    const struct wsync_fake_stats before = stats_now();
    assert_int_equal(drv.hold(loader), 0);
    fill(&r, 2, 0);
    wsync_blob_t req;
    OK(send(&r, 0, &req));
    long t0 = tu_now_ms();
    assert_int_equal(load_into(&r, &p, &req, 0), WSYNC_ERR_TIMEOUT);
    const long took = tu_now_ms() - t0;
    assert_true(took >= 350 && took < 2000);
    assert_non_null(strstr(wsync_last_error(), "the loader's work on the caller's stream"));
    assert_non_null(strstr(wsync_last_error(), "chunk 0 of version 2"));
    wsync_blob_free(&req);
    assert_int_equal(wsync_sender_flush(r.tx, 5000), WSYNC_ERR_PEER);
    assert_non_null(strstr(wsync_last_error(), "WSYNC_ERR_TIMEOUT"));
    OK(wsync_sender_abandon(r.tx)); /* the trainer gives version 2 up */
    /* Still stuck: version 3's first chunk fails at once, nothing read into the buffer. */
    fill(&r, 3, 0);
    OK(send(&r, 0, &req));
    wsync_recv_t *it = NULL;
    t0 = tu_now_ms();
    assert_int_equal(wsync_receiver_receive(r.rx, req.data, req.size, &it), WSYNC_ERR_TIMEOUT);
    assert_true(tu_now_ms() - t0 < 200);
    assert_non_null(strstr(wsync_last_error(), "for chunk 0 of version 2 has still not finished"));
    wsync_blob_free(&req);
    assert_int_equal(wsync_sender_flush(r.tx, 5000), WSYNC_ERR_PEER);
    assert_non_null(strstr(wsync_last_error(), "has still not finished"));
    OK(wsync_sender_abandon(r.tx));
    drv.release(); /* the late copies land from the buffer, which nothing overwrote */
    assert_int_equal(drv.cuCtxSynchronize(), 0);
    fill(&r, 4, 0);
    for (int c = 0; c < 2; ++c) {
        OK(send(&r, c, &req));
        OK(load_into(&r, &p, &req, 0));
        check_params(&p, 4, c);
        wsync_blob_free(&req);
    }
    OK(wsync_sender_flush(r.tx, 5000));
    const struct wsync_fake_stats after = stats_now();
    /* The engine took no new buffer: its one buffer was free again once the stream moved. */
    const long long trainer_allocs = after.host_allocs - before.host_allocs;
    assert_true(trainer_allocs <= 3);
    rig_stop(&r);
    assert_int_equal(stats_now().pinned_live, 0);
    params_free(&p);
}

/* The same engine destroyed while its loader's stream is still stuck: bounded, and the buffer
 * those copies read is left to the driver rather than freed under them. */
static void destroying_an_engine_whose_loader_stream_is_stuck_is_bounded(void **state) {
    (void)state;
    rig r = {0};
    params p;
    void *loader = gpu_engine_on_its_own_stream(&r, &p);
    assert_int_equal(drv.hold(loader), 0);
    fill(&r, 1, 0);
    wsync_blob_t req;
    OK(send(&r, 0, &req));
    assert_int_equal(load_into(&r, &p, &req, 0), WSYNC_ERR_TIMEOUT);
    wsync_blob_free(&req);
    const long long pinned = stats_now().pinned_live;
    const long t0 = tu_now_ms();
    wsync_receiver_destroy(r.rx);
    r.rx = NULL;
    assert_true(tu_now_ms() - t0 < 2000);
    assert_int_equal(stats_now().pinned_live, pinned); /* not freed */
    drv.release();
    rig_stop(&r);
    params_free(&p);
}

/* Delta sync to a GPU engine: the CPU cannot apply a patch onto device memory, so without a
 * mirror a patch into device memory is refused by name (the iteration goes on: the loader may
 * take the patch with wsync_recv_patch instead); with "delta_mirror" the receiver applies it to
 * its own host copy and copies the verified result into device memory, bit-exact. */
static void patches_reach_a_gpu_engine_only_through_its_mirror(void **state) {
    (void)state;
    for (int mirror = 0; mirror <= 1; ++mirror) {
        rig r = {0};
        rig_start_with(&r, ",\"delta\":\"on\"",
                       mirror ? ",\"timeout_ms\":5000,\"device\":0,\"delta_mirror\":true"
                              : ",\"timeout_ms\":5000,\"device\":0");
        params p;
        params_make(&p);
        uint8_t *host = malloc(bytes[1]);
        for (uint64_t v = 1; v <= 3; ++v) {
            /* The trainer's model in host memory (delta compares host tensors). */
            for (int k = 0; k < NT; ++k)
                if (v == 1) tu_fill(k == 1 ? r.host : data_of(&r, k), bytes[k], 1, (uint64_t)k);
            wsync_tensor_t t[NT];
            void *src[NT] = {malloc(bytes[0]), r.host, malloc(bytes[2])};
            for (int k = 0; k < NT; ++k) {
                if (k != 1) memcpy(src[k], data_of(&r, k), bytes[k]);
                if (v > 1) ((uint8_t *)src[k])[4 * v] ^= 1; /* one element changes */
                t[k] = tensor(&r, k);
                t[k].data = src[k];
                t[k].device.type = WSYNC_DEVICE_CPU;
            }
            wsync_chunk_t ch = tu_chunk(t, NT, WSYNC_CHUNK_LAST);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(r.tx, &ch, &req));
            wsync_recv_t *it;
            const long long copies = stats_now().memcpy_calls;
            OK(wsync_receiver_receive(r.rx, req.data, req.size, &it));
            wsync_status_t st = WSYNC_OK;
            for (size_t i = 0; i < NT && st == WSYNC_OK; ++i) {
                wsync_tensor_t view;
                OK(wsync_recv_peek(it, i, &view));
                const uint64_t k = strtoull(view.name + 1, NULL, 10);
                st = wsync_recv_copy(it, i, 0, param(&p, k), bytes[k]);
                if (st != WSYNC_OK) {
                    assert_int_equal(v, 2); /* the first patch version */
                    assert_int_equal(mirror, 0);
                    assert_true(view.flags & WSYNC_TENSOR_PATCH);
                    assert_int_equal(st, WSYNC_ERR_UNSUPPORTED);
                    assert_non_null(strstr(wsync_last_error(), "delta_mirror"));
                }
            }
            if (!mirror && v == 2) assert_int_equal(st, WSYNC_ERR_UNSUPPORTED);
            if (st == WSYNC_OK) {
                OK(wsync_recv_end(it));
                /* t0 and t2 went to device memory by the driver's copy, patched or not */
                assert_int_equal(stats_now().memcpy_calls - copies, 2);
                for (int k = 0; k < NT; ++k)
                    assert_memory_equal(param(&p, (uint64_t)k), src[k], bytes[k]);
            } else {
                OK(wsync_recv_fail(it, st, "the loader cannot apply it"));
            }
            wsync_blob_free(&req);
            const wsync_status_t fl = wsync_sender_flush(r.tx, 5000);
            assert_int_equal(fl, st == WSYNC_OK ? WSYNC_OK : WSYNC_ERR_PEER);
            for (int k = 0; k < NT; ++k) {
                if (k != 1) memcpy(data_of(&r, k), src[k], bytes[k]), free(src[k]);
            }
            if (!mirror && v == 2) break;
        }
        free(host);
        rig_stop(&r);
        params_free(&p);
    }
}

/* "device" has no default: unset, an engine has no GPU (and loads no CUDA driver); described
 * as such; out-of-range or negative values are refused by name. */
static void the_engine_device_option_is_unset_by_default_and_checked(void **state) {
    (void)state;
    need_ucx();
    char *json = NULL;
    OK(wsync_strategy_describe_options("ucx", &json));
    const char *d = strstr(json, "\"device\":");
    assert_non_null(d);
    const char *end = strchr(d, '}');
    const char *dflt = strstr(d, "\"default\": null");
    assert_true(dflt && dflt < end);
    wsync_string_free(json);
    wsync_strategy_t *s = NULL;
    assert_int_equal(wsync_strategy_create("ucx", "{\"device\": 4096}", &s), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "'device'"));
    assert_int_equal(wsync_strategy_create("ucx", "{\"device\": -1}", &s), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "'device'"));
    OK(wsync_strategy_create("ucx", "{\"device\": 0, \"net_devices\": \"lo\"}", &s));
    wsync_strategy_destroy(s);
}

int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* CTest runs each test as its own process */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(device_and_host_tensors_in_one_chunk_arrive_bit_for_bit_with_one_launch_per_chunk),
        cmocka_unit_test(device_tensors_without_checksums_arrive_bit_for_bit),
        cmocka_unit_test(a_tensor_on_another_gpu_is_refused_by_name_and_the_version_goes_on),
        cmocka_unit_test(a_device_tensor_outside_device_memory_is_refused_by_name_and_the_version_goes_on),
    cmocka_unit_test(managed_memory_is_refused_by_name),
        cmocka_unit_test(a_stalled_trainer_stream_times_out_the_send_naming_it_and_leaks_nothing),
        cmocka_unit_test(a_stuck_pack_times_out_and_its_buffer_is_never_reused),
        cmocka_unit_test(destroying_the_sender_while_its_pack_is_stuck_is_bounded),
        cmocka_unit_test(a_refused_launch_names_the_chunk_and_the_next_send_works),
        cmocka_unit_test(a_gpu_engine_copies_verified_chunks_into_device_memory_asynchronously),
        cmocka_unit_test(a_corrupted_chunk_is_refused_before_any_device_copy_and_both_sides_hear_of_it),
        cmocka_unit_test(a_destination_on_another_gpu_is_refused_and_the_copy_can_be_retried),
        cmocka_unit_test(a_stalled_loader_stream_fails_recv_end_in_time_and_its_buffer_is_not_reused),
        cmocka_unit_test(destroying_an_engine_whose_loader_stream_is_stuck_is_bounded),
        cmocka_unit_test(the_engine_device_option_is_unset_by_default_and_checked),
        cmocka_unit_test(patches_reach_a_gpu_engine_only_through_its_mirror),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
