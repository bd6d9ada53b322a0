/* Specifications of the GPU strategies (cuda_ipc, nccl_broadcast), run against the fake driver
 * and NCCL in tests/fake_gpu (CTest points WSYNC_CUDA_LIBRARY and WSYNC_NCCL_LIBRARY at it).
 * "Device memory" of the fake is host shared memory, so a test fills and checks it directly.
 * The fake proves the strategies' logic (UUID selection, merge, offsets, handle caching and
 * open/close balance, ordering, deadlines and aborts); docs/gpu-validation.md records runs on
 * real GPUs. Engines are forked before they touch CUDA, as a real CUDA process must be. */
#include <dirent.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <math.h>
#include <pthread.h>
#include <sys/resource.h>

#include "fake_gpu/fake_gpu.h"
#include "testutil.h"
#include "fork_util.h"

/* ---- the parts of the (fake) driver the test itself uses --------------------------------- */
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
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, void *);
    CUresult (*cuCtxSynchronize)(void);
    wsync_fake_stats_fn stats;
    wsync_fake_set_fail_fn set_fail;
    long long (*freed_while_imported)(void);
    int (*alloc_unexportable)(CUdeviceptr *, size_t);
    int (*alloc_span)(CUdeviceptr *, size_t, size_t);
    wsync_fake_stream_hold_fn stream_hold;
    wsync_fake_stream_release_held_fn stream_release_held;
} drv;

static void load_driver(void) {
    if (drv.h) return;
    const char *path = getenv("WSYNC_CUDA_LIBRARY");
    assert_non_null(path);
    drv.h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(drv.h);
#define SYM(f, name) *(void **)&drv.f = dlsym(drv.h, name), assert_non_null(drv.f)
    SYM(cuInit, "cuInit");
    SYM(cuDeviceGet, "cuDeviceGet");
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuMemAlloc, "cuMemAlloc_v2");
    SYM(cuMemFree, "cuMemFree_v2");
    SYM(cuStreamCreate, "cuStreamCreate");
    SYM(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    SYM(cuCtxSynchronize, "cuCtxSynchronize");
    SYM(stats, "wsync_fake_stats");
    SYM(set_fail, "wsync_fake_set_fail");
    SYM(freed_while_imported, "wsync_fake_freed_while_imported");
    SYM(alloc_unexportable, "wsync_fake_mem_alloc_unexportable");
    SYM(alloc_span, "wsync_fake_mem_alloc_span");
    SYM(stream_hold, "wsync_fake_stream_hold");
    SYM(stream_release_held, "wsync_fake_stream_release_held");
#undef SYM
}

/* Makes `ordinal` current on this thread (the trainer's "torch.cuda.set_device"). */
static void use_device(int ordinal) {
    load_driver();
    assert_int_equal(drv.cuInit(0), 0);
    int dev;
    void *ctx;
    assert_int_equal(drv.cuDeviceGet(&dev, ordinal), 0);
    assert_int_equal(drv.cuDevicePrimaryCtxRetain(&ctx, dev), 0);
    assert_int_equal(drv.cuCtxSetCurrent(ctx), 0);
}

static void *dalloc(size_t n) {
    CUdeviceptr p = 0;
    assert_int_equal(drv.cuMemAlloc(&p, n), 0);
    return (void *)(uintptr_t)p;
}

static struct wsync_fake_stats stats_now(void) {
    struct wsync_fake_stats s;
    drv.stats(&s);
    return s;
}

static wsync_tensor_t gpu_tensor(const char *name, void *data, const int64_t *shape, int32_t ndim,
                                 uint8_t code, uint8_t bits, int device) {
    wsync_tensor_t t = tu_tensor(name, data, shape, ndim, code, bits);
    t.device.type = WSYNC_DEVICE_CUDA;
    t.device.index = device;
    return t;
}

/* ---- a forked engine ------------------------------------------------------------------------
 * Reads frames: the init info, then requests; an empty frame ends it. Answers each request with
 * one status byte (0: every tensor arrived as expected). Tensors are named "t<k>"; tensor k of
 * version v must hold tu_fill(step = v + salt, t = k), or, with `cast`, the bfloat16 rounding
 * of tu_floats(v, k). Finally it writes its fake-driver stats, taken after the receiver is
 * destroyed, and exits. */
typedef struct {
    const char *kind;
    const char *options;  /* strategy options of the engine side */
    const char *visible;  /* CUDA_VISIBLE_DEVICES for the engine, or NULL */
    uint32_t index;
    uint64_t salt;
    int cast;
    uint64_t fail_version; /* the loader fails every chunk of this version (wsync_recv_fail) */
    int copy_faults;       /* the loader's copy out of the first view faults on the GPU */
    int linger_ms;         /* waits this long after the empty frame before destroying */
} engine_cfg;

typedef tu_peer_t engine_t;

/* Set by a test before it starts engines (they are forked): each engine then takes tensor 0 of
 * every chunk with wsync_recv_copy into device memory (engine_device_copies) instead of a view. */
static int g_engines_try_copy;
/* Set by a test before it starts engines: they take views with wsync_recv_next_part and check
 * each part's range against the whole tensor. */
static int g_engines_take_parts;

/* float32 values of tensor k at version v: a spread of magnitudes, signs and ties. */
static float tu_float(uint64_t v, uint64_t k, size_t i) {
    uint64_t r = tu_splitmix((v << 40) ^ (k << 24) ^ i);
    float mant = (float)(r & 0xffffff) / 16777216.0f;
    int exp = (int)((r >> 24) % 40) - 20;
    float x = ldexpf(1.0f + mant, exp);
    return (r >> 63) ? -x : x;
}

static uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static int engine_check_view(const engine_cfg *cfg, const wsync_tensor_t *v, uint64_t version) {
    if (v->device.type != WSYNC_DEVICE_CUDA || !(v->flags & WSYNC_TENSOR_READ_ONLY)) return 0;
    uint64_t k = strtoull(v->name + 1, NULL, 10);
    size_t elems = 1;
    for (int d = 0; d < v->ndim; ++d) elems *= (size_t)v->shape[d];
    if (cfg->cast) {
        if (v->dtype.code != WSYNC_DTYPE_BFLOAT || v->dtype.bits != 16) return 0;
        const uint16_t *got = (const uint16_t *)v->data;
        for (size_t i = 0; i < elems; ++i)
            if (got[i] != bf16_rne(tu_float(version, k, i))) return 0;
        return 1;
    }
    return tu_check(v->data, elems * v->dtype.bits / 8, version + cfg->salt, k);
}

/* A view of a part (or a whole tensor) against the bytes the whole tensor holds at `version`. */
static int engine_check_part(const wsync_tensor_t *v, const wsync_part_t *p, uint64_t version) {
    if (v->device.type != WSYNC_DEVICE_CUDA) return 0;
    size_t whole = (size_t)v->dtype.bits / 8;
    for (int d = 0; d < v->ndim; ++d) whole *= (size_t)v->shape[d];
    if (p->offset + p->bytes > whole) return 0;
    uint8_t *want = malloc(whole);
    tu_fill(want, whole, version, strtoull(v->name + 1, NULL, 10));
    int ok = memcmp(v->data, want + p->offset, p->bytes) == 0;
    free(want);
    return ok;
}

static int engine_next(const engine_cfg *cfg, wsync_recv_t *it, wsync_tensor_t *v,
                       wsync_part_t *p, bool *has) {
    (void)cfg;
    if (g_engines_take_parts) return wsync_recv_next_part(it, v, p, has) == WSYNC_OK && *has;
    return wsync_recv_next(it, v, has) == WSYNC_OK && *has;
}

/* wsync_recv_copy into device memory, as a GPU loader takes the tensors it keeps. Wrong
 * destinations are refused by name and the iteration goes on; then tensor 0 is copied whole with
 * the default stream held (nothing may land before that stream runs: the copy is queued on the
 * loader's stream, not done by the call) and bytes [100, 1100) into a second buffer. Returns 0
 * or a verdict; *whole and *range are checked after wsync_recv_end, which waits for the stream. */
static int engine_device_copies(wsync_recv_t *it, CUdeviceptr *whole, CUdeviceptr *range,
                                size_t *bytes) {
    wsync_tensor_t t;
    if (wsync_recv_peek(it, 0, &t) != WSYNC_OK) return 20;
    size_t n = (size_t)t.dtype.bits / 8;
    for (int d = 0; d < t.ndim; ++d) n *= (size_t)t.shape[d];
    *bytes = n;
    const int own = t.device.index; /* the engine's GPU; the other fake GPU is not its */
    use_device(own ^ 1);
    CUdeviceptr other = (CUdeviceptr)(uintptr_t)dalloc(n);
    use_device(own);
    CUdeviceptr small = (CUdeviceptr)(uintptr_t)dalloc(16);
    uint8_t host[64];
    if (wsync_recv_copy(it, 0, 0, host, sizeof host) != WSYNC_ERR_INVALID_ARGUMENT ||
        !strstr(wsync_last_error(), "is not device memory") || !strstr(wsync_last_error(), "'t0'"))
        return 21;
    if (wsync_recv_copy(it, 0, 0, (void *)(uintptr_t)small, 64) != WSYNC_ERR_INVALID_ARGUMENT ||
        !strstr(wsync_last_error(), "64 bytes do not fit in its allocation (16 bytes"))
        return 22;
    if (wsync_recv_copy(it, 0, 0, (void *)(uintptr_t)other, n) != WSYNC_ERR_INVALID_ARGUMENT ||
        !strstr(wsync_last_error(), "not of this receiver's GPU"))
        return 23;
    drv.cuMemFree(other);
    drv.cuMemFree(small);
    *whole = (CUdeviceptr)(uintptr_t)dalloc(n);
    memset((void *)(uintptr_t)*whole, 0, n);
    if (drv.stream_hold(NULL) != 0) return 24;
    if (wsync_recv_copy(it, 0, 0, (void *)(uintptr_t)*whole, n) != WSYNC_OK) return 25;
    static const uint8_t zeros[64];
    const int landed = memcmp((const void *)(uintptr_t)*whole, zeros, sizeof zeros) != 0;
    drv.stream_release_held();
    if (landed) return 26; /* written before the loader's stream ran */
    *range = (CUdeviceptr)(uintptr_t)dalloc(1000);
    if (wsync_recv_copy(it, 0, 100, (void *)(uintptr_t)*range, 1000) != WSYNC_OK) return 27;
    return 0;
}

static int engine_main(const engine_cfg *cfg, int in, int out) {
    if (cfg->visible) setenv("CUDA_VISIBLE_DEVICES", cfg->visible, 1);
    uint8_t *init;
    size_t init_len;
    if (tu_recv_frame(in, &init, &init_len, 20000) || !init) return 10;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    if (wsync_strategy_create(cfg->kind, cfg->options, &s) != WSYNC_OK ||
        wsync_receiver_create(s, init, init_len, cfg->index, &r) != WSYNC_OK) {
        fprintf(stderr, "engine %u: %s\n", cfg->index, wsync_last_error());
        return 11;
    }
    free(init);
    for (;;) {
        uint8_t *req;
        size_t len;
        if (tu_recv_frame(in, &req, &len, 20000)) return 12;
        if (!req) break;
        if (len == 4 && !memcmp(req, "FORK", 4)) { /* a worker keeping every descriptor: its pid */
            free(req);
            pid_t w = fork();
            if (w == 0) {
                tu_detach_stdio(); /* keeps every other descriptor; the test kills it */
                for (;;) pause();
            }
            int32_t wp = (int32_t)w;
            if (tu_write_all(out, &wp, sizeof wp)) return 13;
            continue;
        }
        if (len == 4 && !memcmp(req, "COPY", 4)) { /* a forked child tries the receiver: 0 if refused */
            free(req);
            pid_t c = fork();
            if (c == 0) {
                wsync_receiver_state_t stt = {.struct_size = sizeof stt};
                int ok = wsync_receiver_poll(r, &stt) == WSYNC_ERR_WRONG_STATE &&
                         strstr(wsync_last_error(), "forked") != NULL;
                wsync_receiver_destroy(r); /* a copy: left as it is */
                _exit(ok ? 0 : 1);
            }
            uint8_t b = (uint8_t)tu_wait_child(c, 5000);
            if (tu_write_all(out, &b, 1)) return 13;
            continue;
        }
        uint8_t verdict = 0;
        wsync_recv_t *it;
        wsync_status_t got = wsync_receiver_receive(r, req, len, &it);
        if (got != WSYNC_OK) {
            fprintf(stderr, "engine %u: receive: %s\n", cfg->index, wsync_last_error());
            /* 6: refused as another sync's request, the receiver left as it was */
            verdict = got == WSYNC_ERR_MISMATCH && strstr(wsync_last_error(), "(another trainer's")
                          ? 6 : 1;
        } else {
            wsync_recv_info_t info = {0};
            wsync_recv_info(it, &info);
            wsync_tensor_t v;
            wsync_part_t part;
            bool has;
            int first = 1;
            CUdeviceptr whole = 0, range = 0;
            size_t whole_bytes = 0;
            if (g_engines_try_copy) verdict = (uint8_t)engine_device_copies(it, &whole, &range, &whole_bytes);
            while (engine_next(cfg, it, &v, &part, &has)) {
                if (g_engines_take_parts ? !engine_check_part(&v, &part, info.version)
                               : !engine_check_view(cfg, &v, info.version)) {
                    fprintf(stderr, "engine %u: tensor %s of version %llu differs\n", cfg->index,
                            v.name, (unsigned long long)info.version);
                    verdict = 2;
                }
                if (cfg->copy_faults && first) { /* copy it out, as a loader does; it faults */
                    use_device(v.device.index);
                    size_t n = (size_t)v.dtype.bits / 8;
                    for (int d = 0; d < v.ndim; ++d) n *= (size_t)v.shape[d];
                    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)dalloc(n);
                    drv.set_fail("cuMemcpyDtoDAsync@async", 0, 0);
                    if (drv.cuMemcpyDtoDAsync(dst, (CUdeviceptr)(uintptr_t)v.data, n, NULL)) verdict = 5;
                }
                first = 0;
            }
            if (cfg->fail_version && info.version == cfg->fail_version) {
                wsync_recv_fail(it, WSYNC_ERR_MISMATCH, "the loader refused tensor t0");
                verdict = 4;
            } else {
                wsync_status_t end = wsync_recv_end(it);
                if (end != WSYNC_OK) {
                    fprintf(stderr, "engine %u: recv_end: %s\n", cfg->index, wsync_last_error());
                    verdict = (uint8_t)(0x80 | end); /* the status, for the test to compare */
                }
            }
            /* cuda_ipc: the copies landed once recv_end of the version's last chunk returned;
             * nccl_broadcast: recv_end only fences them for the next receive, so wait here. */
            if (whole && !strcmp(cfg->kind, "nccl_broadcast") && drv.cuCtxSynchronize() != 0)
                verdict = 29;
            if (whole) {
                uint8_t *want = malloc(whole_bytes);
                tu_fill(want, whole_bytes, info.version, 0);
                if (memcmp((const void *)(uintptr_t)whole, want, whole_bytes) ||
                    memcmp((const void *)(uintptr_t)range, want + 100, 1000))
                    verdict = 28;
                free(want);
                drv.cuMemFree(whole);
                drv.cuMemFree(range);
            }
        }
        free(req);
        if (tu_write_all(out, &verdict, 1)) return 13;
    }
    if (cfg->linger_ms) usleep((useconds_t)cfg->linger_ms * 1000);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    struct wsync_fake_stats st;
    load_driver();
    drv.stats(&st);
    return tu_write_all(out, &st, sizeof st) ? 14 : 0;
}

static int engine_entry(const void *cfg, int in, int out) {
    return engine_main((const engine_cfg *)cfg, in, out);
}

static engine_t engine_start(const engine_cfg *cfg) { return tu_fork_peer(engine_entry, cfg); }

/* A cuda_ipc engine on GPU 0 as receiver `index`, checking every version as sent. */
static engine_t ipc_engine(uint32_t index) {
    engine_cfg cfg = {"cuda_ipc", "{\"device\": 0}", NULL, index, 0, 0, 0, 0, 0};
    return engine_start(&cfg); /* the child reads cfg from its copy of this frame */
}

static void engine_send(engine_t *e, const wsync_blob_t *b) {
    assert_int_equal(tu_send_frame(e->to, b->data, b->size), 0);
}

static uint8_t engine_verdict(engine_t *e) { return tu_peer_byte(e, 20000); }

/* Makes the engine fork a worker that keeps every descriptor until killed; returns its pid. */
static pid_t engine_fork_worker(engine_t *e) {
    assert_int_equal(tu_send_frame(e->to, "FORK", 4), 0);
    int32_t pid = 0;
    assert_int_equal(tu_read_all(e->from, &pid, sizeof pid, 5000), 0);
    assert_true(pid > 0);
    return (pid_t)pid;
}

/* Ends the engine; returns its stats after its receiver was destroyed. */
static struct wsync_fake_stats engine_finish(engine_t *e) {
    struct wsync_fake_stats st;
    memset(&st, 0, sizeof st);
    assert_int_equal(tu_send_frame(e->to, NULL, 0), 0);
    assert_int_equal(tu_read_all(e->from, &st, sizeof st, 20000), 0);
    assert_int_equal(tu_wait_child(e->pid, 20000), 0);
    close(e->to);
    close(e->from);
    return st;
}

/* A cuda_ipc trainer: its strategy with `options`, the init info (sent to the first `engines`
 * engines, none if 0) and its sender. trainer_end() destroys a trainer of any kind. */
static void ipc_trainer(const char *options, engine_t *e, int engines, wsync_strategy_t **s,
                        wsync_blob_t *init, wsync_sender_t **tx) {
    OK(wsync_strategy_create("cuda_ipc", options, s));
    OK(wsync_strategy_create_init_info(*s, init));
    for (int i = 0; i < engines; ++i) engine_send(&e[i], init);
    OK(wsync_sender_create(*s, init->data, init->size, tx));
}
static void trainer_end(wsync_sender_t *tx, wsync_strategy_t *s, wsync_blob_t *init) {
    wsync_sender_destroy(tx);
    wsync_strategy_destroy(s);
    wsync_blob_free(init);
}

/* NCCL refuses two ranks of one communicator on one GPU, and so do libwsync (a receiver on the
 * sender's GPU) and the fake. So the nccl_broadcast tests run with three fake GPUs: the trainer
 * on GPU 0 (its device 0), engines on GPUs 1 and 2 (started with CUDA_VISIBLE_DEVICES
 * NCCL_ENGINE_GPUS, their devices 0 and 1). Called before the test forks an engine or touches
 * the driver: the fake reads the list at cuInit. */
#define NCCL_ENGINE_GPUS "1,2"
static void nccl_three_gpus(void) {
    setenv("WSYNC_FAKE_CUDA_DEVICES",
           "GPU-0fa6e000-0000-4000-8000-000000000000,GPU-1fa6e000-0000-4000-8000-000000000001,"
           "GPU-2fa6e000-0000-4000-8000-000000000002", 1);
}

/* ---- cuda_ipc, packed ---------------------------------------------------------------------- */
#define NT 6
static int64_t shapes[NT][2] = {{64, 32}, {7, 3}, {1000, 1}, {16, 16}, {5, 5}, {300, 2}};
static const char *names[NT] = {"t0", "t1", "t2", "t3", "t4", "t5"};

static void packed_sync_reaches_two_engines_bit_for_bit_with_one_launch_per_chunk(void **state) {
    (void)state;
    engine_t e[2] = {ipc_engine(0), ipc_engine(1)};
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"receivers\": 2, \"bucket_bytes\": 65536}", e, 2, &s, &init, &tx);
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    struct wsync_fake_stats before = stats_now();
    const int versions = 5;
    for (uint64_t v = 1; v <= (uint64_t)versions; ++v) {
        wsync_tensor_t t[NT];
        for (int k = 0; k < NT; ++k) {
            tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        for (int c = 0; c < 2; ++c) { /* two chunks per version, three tensors each */
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(tx, &ch, &req));
            for (int i = 0; i < 2; ++i) engine_send(&e[i], &req);
            for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
            wsync_blob_free(&req);
        }
        OK(wsync_sender_flush(tx, 5000));
    }
    struct wsync_fake_stats after = stats_now();
    assert_int_equal(after.kernel_launches - before.kernel_launches, 2 * versions);
    /* Both buckets' handles were made once, at the first chunk, and reused. */
    assert_int_equal(after.ipc_get_handle - before.ipc_get_handle, 2);
    for (int i = 0; i < 2; ++i) {
        struct wsync_fake_stats es = engine_finish(&e[i]);
        assert_int_equal(es.ipc_open, 2);  /* one per bucket, for all 10 chunks */
        assert_int_equal(es.ipc_close, 2); /* and each closed exactly once */
        assert_int_equal(es.ipc_live, 0);
    }
    trainer_end(tx, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* Chunks that never reach the engine must not wedge the trainer (until 2026-11-27 the engine
 * refused every request after a gap, "expected seq 3", for good):
 * 1. Version 1's chunk 0 is published but delivered to nobody (the controller's RPC failed) and
 *    the trainer abandons it. Version 2 reaches the engine: it acknowledges the undelivered chunk
 *    as missed, the trainer's sends do not wait for it, and version 2 completes bit-exact.
 * 2. Version 3's chunk 0 is lost; its chunk 1 reaches the engine, which refuses it (MISMATCH,
 *    "expected chunk 0") and, refusing it, acknowledges the lost chunk 0 as missed. The
 *    trainer's next send reports the refusal (PEER naming version 3); the one after goes through
 *    at once, and version 4 completes bit-exact. */
static void cuda_ipc_chunks_nobody_was_given_do_not_wedge_the_trainer(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"buckets\": 2, \"timeout_ms\": 3000}", &e, 1, &s,
                &init, &tx);
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    long t0 = tu_now_ms();
    for (uint64_t v = 1; v <= 4; ++v) {
        for (int k = 0; k < NT; ++k) {
            tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            if (v == 4 && c == 0) /* the refusal of version 3's chunk 1, reported once */
                EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_PEER,
                           "failed chunk 1 of version 3");
            OK(wsync_sender_send_chunk(tx, &ch, &req));
            if ((v == 1 || v == 3) && c == 0) { /* published, delivered to nobody */
                wsync_blob_free(&req);
                if (v == 1) {
                    OK(wsync_sender_abandon(tx));
                    break;
                }
                continue;
            }
            engine_send(&e, &req);
            assert_int_equal(engine_verdict(&e), v == 3 ? 1 : 0); /* 1: refused */
            wsync_blob_free(&req);
        }
    }
    OK(wsync_sender_flush(tx, 3000));
    assert_true(tu_now_ms() - t0 < 2000);
    uint64_t next = 0;
    OK(wsync_sender_version(tx, &next));
    assert_int_equal(next, 5);
    engine_finish(&e);
    trainer_end(tx, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* The cuda_ipc twin of test_transactions.a_version_skipped_whole_is_reported_like_one_skipped_in_
 * part (issue 38): version 2 is published whole and given to nobody; the engine, given version
 * 3's first chunk, records version 2 as failed (MISMATCH) before it acknowledges; the trainer's
 * flush fails with PEER naming receiver 0 and version 2, at once, and only once; version 3 then
 * completes bit-exact. */
static void cuda_ipc_a_version_skipped_whole_is_reported_like_one_skipped_in_part(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"buckets\": 4, \"timeout_ms\": 3000}", &e, 1, &s,
                &init, &tx);
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    for (uint64_t v = 1; v <= 3; ++v) {
        for (int k = 0; k < NT; ++k) {
            tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            OK(wsync_sender_send_chunk(tx, &ch, &req));
            if (v == 2) { /* published, given to nobody */
                wsync_blob_free(&req);
                continue;
            }
            engine_send(&e, &req);
            assert_int_equal(engine_verdict(&e), 0);
            wsync_blob_free(&req);
            if (v == 3 && c == 0) {
                long t0 = tu_now_ms();
                EXPECT_ERR(wsync_sender_flush(tx, 3000), WSYNC_ERR_PEER,
                           "no chunk of version 2 reached this receiver");
                assert_true(tu_now_ms() - t0 < 1000);
                size_t n = 0;
                OK(wsync_sender_failure_count(tx, &n));
                assert_int_equal(n, 1);
                wsync_failure_t f = {.struct_size = sizeof f};
                OK(wsync_sender_failure(tx, 0, &f));
                assert_int_equal(f.receiver, 0);
                assert_int_equal(f.version, 2);
                assert_int_equal(f.status, WSYNC_ERR_MISMATCH);
                assert_int_equal(f.pid, e.pid);
                OK(wsync_sender_flush(tx, 3000)); /* reported once */
            }
        }
    }
    OK(wsync_sender_flush(tx, 3000));
    engine_finish(&e);
    trainer_end(tx, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* With one bucket, a chunk of an abandoned version that nobody was given is withdrawn
 * (board.hpp): the flush after the abandon and the next version go through at once (before, both
 * ended in TIMEOUT naming the engine, for every later version). Version 2 completes bit-exact. */
static void cuda_ipc_an_abandoned_chunk_nobody_began_does_not_hold_the_only_slot(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"buckets\": 1, \"timeout_ms\": 3000}", &e, 1, &s,
                &init, &tx);
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    long t0 = tu_now_ms();
    for (uint64_t v = 1; v <= 2; ++v) {
        for (int k = 0; k < NT; ++k) {
            tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            OK(wsync_sender_send_chunk(tx, &ch, &req));
            if (v == 1) { /* published, delivered to nobody, abandoned */
                wsync_blob_free(&req);
                OK(wsync_sender_abandon(tx));
                OK(wsync_sender_flush(tx, 3000));
                break;
            }
            engine_send(&e, &req);
            assert_int_equal(engine_verdict(&e), 0);
            wsync_blob_free(&req);
        }
    }
    OK(wsync_sender_flush(tx, 3000));
    assert_true(tu_now_ms() - t0 < 2000);
    engine_finish(&e);
    trainer_end(tx, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* Sends version `v` of the six tensors as two chunks to `n` engines; each must verify it. */
static void ipc_send_version(wsync_sender_t *tx, void **data, uint64_t v, engine_t *e, int n) {
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) {
        tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
        t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    }
    for (int c = 0; c < 2; ++c) {
        wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        for (int i = 0; i < n; ++i) engine_send(&e[i], &req);
        for (int i = 0; i < n; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
        wsync_blob_free(&req);
    }
}

/* One sender by design, made again on the same init info (a restarted trainer process): it
 * goes on after the versions and chunk seqs its predecessor published, abandoned one included.
 * An engine that stayed attached takes them as newer versions, a restarted one joins, and no
 * answer to the old sender's chunks counts for the new one's (review: versions and seqs
 * restarted at 1, so the engine that stayed refused versions 1 and 2 as stale, version 2 was
 * refused as abandoned by the board's word of the old sender, and the new sender blamed a
 * forger; the old sender's acknowledgement of seq 1 answered the new seq 1). */
static void cuda_ipc_a_sole_sender_made_again_goes_on_after_its_predecessors_versions(void **state) {
    (void)state;
    engine_t e[2] = {ipc_engine(0), ipc_engine(1)};
    engine_t restarted = ipc_engine(1); /* forked now: later this process uses the driver */
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *a, *b;
    ipc_trainer("{\"receivers\": 2, \"senders\": 1, \"bucket_bytes\": 65536, \"timeout_ms\": 3000, \"release_timeout_ms\": 300}",
                e, 2, &s, &init, &a);
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    ipc_send_version(a, data, 1, e, 2);
    OK(wsync_sender_flush(a, 3000));
    /* Version 2: its first chunk reaches both engines, then the trainer gives up on it. */
    wsync_tensor_t t = gpu_tensor(names[0], data[0], shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    tu_fill(data[0], (size_t)shapes[0][0] * shapes[0][1] * 4, 2, 0);
    wsync_chunk_t first = tu_chunk(&t, 1, 0);
    OK(wsync_sender_send_chunk(a, &first, &req));
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &req);
    for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
    wsync_blob_free(&req);
    OK(wsync_sender_abandon(a));
    OK(wsync_sender_flush(a, 3000));
    wsync_sender_destroy(a);
    /* Engine 1 restarts; engine 0 stays attached. The trainer makes its sender again. */
    engine_finish(&e[1]);
    e[1] = restarted;
    engine_send(&e[1], &init);
    usleep(200 * 1000); /* it attaches (joining) before the new sender begins a version */
    OK(wsync_sender_create(s, init.data, init.size, &b));
    uint64_t v = 0;
    OK(wsync_sender_version(b, &v));
    assert_int_equal(v, 3);
    /* Its first chunk, given to nobody yet: no earlier answer counts for it. */
    for (int k = 0; k < NT; ++k)
        tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, 3, (uint64_t)k);
    wsync_tensor_t t3[NT];
    for (int k = 0; k < NT; ++k)
        t3[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t c0 = tu_chunk(t3, 3, 0), c1 = tu_chunk(t3 + 3, 3, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(b, &c0, &req));
    assert_int_equal(wsync_sender_flush(b, 200), WSYNC_ERR_TIMEOUT);
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &req);
    for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
    wsync_blob_free(&req);
    OK(wsync_sender_send_chunk(b, &c1, &req));
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &req);
    for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
    wsync_blob_free(&req);
    OK(wsync_sender_flush(b, 3000));
    ipc_send_version(b, data, 4, e, 2);
    OK(wsync_sender_flush(b, 3000));
    OK(wsync_sender_wait_released(b, 3, 3000));
    assert_int_equal(wsync_sender_wait_released(b, 2, 0), WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "versions 3..4"));
    for (int i = 0; i < 2; ++i) engine_finish(&e[i]);
    trainer_end(b, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* The same with one bucket, an engine that failed the old sender's last delivered version
 * (reported by that sender) and a chunk of the old sender nobody was given: the new sender
 * waits for neither (its buckets are its own; that failure was reported) and its first version
 * completes (review: its first send timed out for good on the old sender's undelivered chunk,
 * and its first send failed with the old sender's reported failure). */
static void cuda_ipc_a_sole_sender_made_again_waits_only_for_its_own_chunks(void **state) {
    (void)state;
    engine_cfg cfg = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 0, 2 /* fails version 2 */, 0, 0};
    engine_t e[1] = {engine_start(&cfg)};
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *a, *b;
    ipc_trainer("{\"senders\": 1, \"buckets\": 1, \"bucket_bytes\": 65536, \"timeout_ms\": 1000, "
                "\"release_timeout_ms\": 300}", e, 1, &s, &init, &a);
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    ipc_send_version(a, data, 1, e, 1);
    OK(wsync_sender_flush(a, 3000));
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k)
        t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t c0 = tu_chunk(t, 3, 0);
    OK(wsync_sender_send_chunk(a, &c0, &req)); /* version 2: the engine's loader refuses it */
    engine_send(&e[0], &req);
    assert_int_equal(engine_verdict(&e[0]), 4);
    wsync_blob_free(&req);
    EXPECT_ERR(wsync_sender_flush(a, 3000), WSYNC_ERR_PEER, "the loader refused tensor t0");
    OK(wsync_sender_abandon(a));
    OK(wsync_sender_send_chunk(a, &c0, &req)); /* version 3: never forwarded */
    wsync_blob_free(&req);
    wsync_sender_destroy(a); /* abandons version 3 */
    OK(wsync_sender_create(s, init.data, init.size, &b));
    uint64_t v = 0;
    OK(wsync_sender_version(b, &v));
    assert_int_equal(v, 4);
    long t0 = tu_now_ms();
    ipc_send_version(b, data, 4, e, 1);
    OK(wsync_sender_flush(b, 3000));
    assert_true(tu_now_ms() - t0 < 900); /* no send waited out its 1000 ms */
    engine_finish(&e[0]);
    trainer_end(b, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* A trainer process that sends version 1 and chunk 0 of version 2, each forwarded by the test,
 * then waits to be SIGKILLed (version 2 stays open: it never abandons it). */
static int killed_trainer_main(const void *cfg, int in, int out) {
    (void)cfg;
    uint8_t *init; size_t len;
    if (tu_recv_frame(in, &init, &len, 20000)) return 1;
    use_device(0);
    wsync_strategy_t *s; wsync_sender_t *a;
    if (wsync_strategy_create("cuda_ipc", "{\"senders\": 1, \"bucket_bytes\": 65536, \"timeout_ms\": 3000}", &s)) return 2;
    if (wsync_sender_create(s, init, len, &a)) { fprintf(stderr, "child: %s\n", wsync_last_error()); return 3; }
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    for (uint64_t v = 1; v <= 2; ++v) {
        for (int k = 0; k < NT; ++k) {
            tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        for (int c = 0; c < (v == 1 ? 2 : 1); ++c) { /* version 2: chunk 0 only */
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t req;
            if (wsync_sender_send_chunk(a, &ch, &req)) { fprintf(stderr, "child: %s\n", wsync_last_error()); return 4; }
            tu_send_frame(out, req.data, req.size);
            wsync_blob_free(&req);
            uint8_t *ok; size_t n; /* the parent says the engine took it */
            if (tu_recv_frame(in, &ok, &n, 20000)) return 5;
            free(ok);
        }
        if (v == 1 && wsync_sender_flush(a, 3000)) return 6;
    }
    for (;;) pause(); /* killed here, version 2 open */
}

/* A trainer process SIGKILLed mid-version and a sender made again on its init info in another
 * process (a restarted trainer): the engine that stayed attached still has the killed version
 * open and records it lost when the new sender's first chunk arrives. That record is of the
 * predecessor's version: the new sender does not report it, and its first version completes
 * (review: its second send failed with PEER naming version 2 and abandoned version 3). */
static void cuda_ipc_a_sender_made_again_after_its_trainer_was_killed_mid_version_completes_its_first(
    void **state) {
    (void)state;
    engine_t e[1] = {ipc_engine(0)};
    tu_peer_t old = tu_fork_peer(killed_trainer_main, NULL);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *b;
    OK(wsync_strategy_create("cuda_ipc", "{\"senders\": 1, \"bucket_bytes\": 65536, \"timeout_ms\": 3000}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    engine_send(&e[0], &init);
    assert_int_equal(tu_send_frame(old.to, init.data, init.size), 0);
    for (int i = 0; i < 3; ++i) { /* version 1 chunks 0 and 1, version 2 chunk 0 */
        uint8_t *r;
        size_t n;
        assert_int_equal(tu_recv_frame(old.from, &r, &n, 20000), 0);
        assert_int_equal(tu_send_frame(e[0].to, r, n), 0);
        assert_int_equal(engine_verdict(&e[0]), 0);
        free(r);
        uint8_t one = 1;
        assert_int_equal(tu_send_frame(old.to, &one, 1), 0);
    }
    usleep(100 * 1000);
    kill(old.pid, SIGKILL);
    assert_int_equal(waitpid(old.pid, NULL, 0), old.pid);
    /* A real driver frees a dead process's memory; the fake's lies in named files, which the
     * killed process never unlinked (the engine keeps what it opened). */
    char pattern[64];
    snprintf(pattern, sizeof pattern, "wsync-fakecuda-%d-", (int)old.pid);
    DIR *shm = opendir("/dev/shm");
    assert_non_null(shm);
    for (struct dirent *d; (d = readdir(shm)) != NULL;)
        if (strncmp(d->d_name, pattern, strlen(pattern)) == 0) {
            char path[320];
            snprintf(path, sizeof path, "/dev/shm/%s", d->d_name);
            unlink(path);
        }
    closedir(shm);
    OK(wsync_sender_create(s, init.data, init.size, &b));
    uint64_t v = 0;
    OK(wsync_sender_version(b, &v));
    assert_int_equal(v, 3);
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    ipc_send_version(b, data, 3, e, 1); /* each send returns OK, each chunk verified */
    OK(wsync_sender_flush(b, 3000));
    ipc_send_version(b, data, 4, e, 1);
    OK(wsync_sender_flush(b, 3000));
    engine_finish(&e[0]);
    trainer_end(b, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* A split tensor goes through the core like any other: each part is a tensor of its own to the
 * transport, packed or shared per allocation, and arrives as one view per part. */
static void cuda_ipc_moves_a_split_tensor_as_one_view_per_part_packed_or_not(void **state) {
    (void)state;
    static const char *opts[2] = {"{\"bucket_bytes\": 65536}",
                                  "{\"bucket_bytes\": 65536, \"packed\": false}"};
    /* One engine per mode, both forked before this process touches the driver (a child forked
     * after cuInit cannot use it). */
    g_engines_take_parts = 1;
    engine_t engines[2] = {ipc_engine(0), ipc_engine(0)};
    for (int mode = 0; mode < 2; ++mode) {
        engine_t e = engines[mode];
        use_device(0);
        wsync_strategy_t *s;
        wsync_blob_t init;
        wsync_sender_t *tx;
        ipc_trainer(opts[mode], &e, 1, &s, &init, &tx);
        void *data[2];
        wsync_tensor_t t[2];
        for (int k = 0; k < 2; ++k) {
            data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        for (uint64_t v = 1; v <= 3; ++v) {
            for (int k = 0; k < 2; ++k)
                tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            /* t0 (8192 bytes) in two parts; its second part shares the last chunk with t1 */
            wsync_part_t first = {0, 4096}, rest[2] = {{4096, 4096}, {0, 0}};
            wsync_chunk_t c0 = tu_chunk(t, 1, 0), c1 = tu_chunk(t, 2, WSYNC_CHUNK_LAST);
            wsync_blob_t req;
            OK(wsync_sender_send_parts(tx, &c0, &first, &req));
            engine_send(&e, &req);
            assert_int_equal(engine_verdict(&e), 0);
            wsync_blob_free(&req);
            OK(wsync_sender_send_parts(tx, &c1, rest, &req));
            engine_send(&e, &req);
            assert_int_equal(engine_verdict(&e), 0);
            wsync_blob_free(&req);
            OK(wsync_sender_flush(tx, 5000));
        }
        struct wsync_fake_stats es = engine_finish(&e);
        assert_int_equal(es.ipc_open, es.ipc_close);
        trainer_end(tx, s, &init);
        for (int k = 0; k < 2; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
    }
    g_engines_take_parts = 0;
}

static void recv_copy_into_device_memory_is_queued_on_the_loaders_stream_and_bit_exact(void **state) {
    (void)state;
    g_engines_try_copy = 1;
    engine_t e = ipc_engine(0);
    g_engines_try_copy = 0;
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"receivers\": 1, \"bucket_bytes\": 65536}", &e, 1, &s, &init, &tx);
    void *data = dalloc((size_t)shapes[0][0] * shapes[0][1] * 4);
    tu_fill(data, (size_t)shapes[0][0] * shapes[0][1] * 4, 1, 0);
    wsync_tensor_t t = gpu_tensor(names[0], data, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e, &req);
    assert_int_equal(engine_verdict(&e), 0); /* see engine_device_copies for each verdict */
    wsync_blob_free(&req);
    OK(wsync_sender_flush(tx, 5000));
    engine_finish(&e);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)data);
}

static void packed_cast_to_bfloat16_rounds_to_nearest_even(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 1, 0, 0, 0};
    engine_t e = engine_start(&c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"dtype\": \"bfloat16\", \"bucket_bytes\": 65536}", &e, 1, &s, &init, &tx);
    float *data[3];
    for (int k = 0; k < 3; ++k) data[k] = (float *)dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    for (uint64_t v = 1; v <= 3; ++v) {
        wsync_tensor_t t[3];
        for (int k = 0; k < 3; ++k) {
            size_t n = (size_t)shapes[k][0] * shapes[k][1];
            for (size_t i = 0; i < n; ++i) data[k][i] = tu_float(v, (uint64_t)k, i);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        wsync_chunk_t ch = tu_chunk(t, 3, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        engine_send(&e, &req);
        assert_int_equal(engine_verdict(&e), 0);
        wsync_blob_free(&req);
        OK(wsync_sender_flush(tx, 5000));
    }
    engine_finish(&e);
    trainer_end(tx, s, &init);
}

/* ---- cuda_ipc, per allocation -------------------------------------------------------------- */
static void unpacked_steady_state_opens_no_new_handle_over_1000_syncs(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", &e, 1, &s, &init, &tx);
    /* Six tensors in three allocations, at offsets inside them, as a caching allocator does. */
    uint8_t *pool[3];
    for (int a = 0; a < 3; ++a) pool[a] = (uint8_t *)dalloc(1 << 16);
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = pool[k % 3] + (k / 3) * 20000 + 512 * (k % 2);
    struct wsync_fake_stats before = stats_now();
    const uint64_t syncs = 1000;
    for (uint64_t v = 1; v <= syncs; ++v) {
        wsync_tensor_t t[NT];
        for (int k = 0; k < NT; ++k) {
            if (v <= 3 || v == syncs) tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        wsync_chunk_t ch = tu_chunk(t, NT, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        engine_send(&e, &req);
        uint8_t verdict = engine_verdict(&e);
        /* Only versions whose bytes were rewritten can be checked against their pattern. */
        if (v <= 3 || v == syncs) assert_int_equal(verdict, 0);
        else assert_true(verdict == 0 || verdict == 2);
        wsync_blob_free(&req);
        OK(wsync_sender_flush(tx, 5000));
    }
    struct wsync_fake_stats after = stats_now();
    assert_int_equal(after.ipc_get_handle - before.ipc_get_handle, 3); /* per allocation, once */
    assert_int_equal(after.kernel_launches - before.kernel_launches, 0); /* nothing copied */
    struct wsync_fake_stats es = engine_finish(&e);
    assert_int_equal(es.ipc_open, 3);
    assert_int_equal(es.ipc_close, 3);
    assert_int_equal(es.ipc_live, 0);
    trainer_end(tx, s, &init);
}

/* PyTorch's expandable segments: tensors in virtual memory mapped as 1 MiB physical pieces (t1,
 * t2 and t4 cross piece boundaries), which cuIpcGetMemHandle cannot export. The sender exports
 * each piece once as a file descriptor, the engine maps each run of pieces once; when the
 * trainer's allocator gives the memory back and maps new pieces, the old ones are no longer
 * exported (the sender's handles go) and the engine unmaps what no version uses; at the end
 * nothing is left mapped, imported or reserved on either side. */
static void unpacked_virtual_memory_is_exported_and_mapped_once_and_let_go_when_moved(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", &e, 1, &s, &init, &tx);
    const size_t piece = 1u << 20, span_bytes = 4 * piece;
    CUdeviceptr span = 0;
    assert_int_equal(drv.alloc_span(&span, span_bytes, piece), 0);
    struct wsync_fake_stats before = stats_now();
    /* t1, t2 and t4 straddle the boundaries between pieces 0|1, 1|2 and 2|3. */
    const size_t at[NT] = {0, piece - 40, 2 * piece - 2000, 2 * piece + 4096, 3 * piece - 52,
                           3 * piece + 4096};
    for (uint64_t v = 1; v <= 12; ++v) {
        if (v == 7) { /* the allocator releases the segment and maps new pieces */
            for (size_t off = 0; off < span_bytes; off += piece) drv.cuMemFree(span + off);
            assert_int_equal(drv.alloc_span(&span, span_bytes, piece), 0);
        }
        wsync_tensor_t t[NT];
        for (int k = 0; k < NT; ++k) {
            void *data = (void *)(uintptr_t)(span + at[k]);
            tu_fill(data, (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data, shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        wsync_chunk_t ch = tu_chunk(t, NT, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        engine_send(&e, &req);
        assert_int_equal(engine_verdict(&e), 0);
        wsync_blob_free(&req);
        OK(wsync_sender_flush(tx, 5000));
    }
    struct wsync_fake_stats after = stats_now();
    assert_int_equal(after.ipc_get_handle - before.ipc_get_handle, 0);
    assert_int_equal(after.vmm_exports - before.vmm_exports, 8); /* four pieces, twice */
    /* The first span's pieces are no longer exported: only the second's handles are held. */
    assert_int_equal(after.vmm_handles_live, 4);
    struct wsync_fake_stats es = engine_finish(&e);
    /* The chunk's tensors lie in pieces 0-3 side by side (t1, t2 and t4 over boundaries): one
     * run of the four pieces a span, each imported once over six versions. */
    assert_int_equal(es.vmm_imports, 8);
    assert_int_equal(es.vmm_maps_live, 0);
    assert_int_equal(es.vmm_handles_live, 0);
    assert_int_equal(es.vmm_reserved_live, 0);
    trainer_end(tx, s, &init);
    assert_int_equal(stats_now().vmm_handles_live, 0);
    for (size_t off = 0; off < span_bytes; off += piece) drv.cuMemFree(span + off);
}

/* A request whose virtual-memory descriptors can no longer be fetched (the trainer destroyed
 * its sender, or its process exited, after publishing): the engine's receive fails at once
 * instead of waiting, and it keeps nothing imported or mapped. */
static void unpacked_virtual_memory_of_a_sender_gone_fails_the_engines_receive_at_once(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false, \"timeout_ms\": 5000}", &e, 1, &s, &init, &tx);
    CUdeviceptr span = 0;
    assert_int_equal(drv.alloc_span(&span, 2u << 20, 1u << 20), 0);
    void *data = (void *)(uintptr_t)(span + (1u << 20) - 64); /* over both pieces */
    tu_fill(data, (size_t)shapes[0][0] * shapes[0][1] * 4, 1, 0);
    wsync_tensor_t t = gpu_tensor(names[0], data, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    wsync_sender_destroy(tx);
    const long t0 = tu_now_ms();
    engine_send(&e, &req);
    assert_int_equal(engine_verdict(&e), 1); /* the receive failed */
    assert_true(tu_now_ms() - t0 < 2000);     /* not its 5 s deadline: the socket is gone */
    wsync_blob_free(&req);
    struct wsync_fake_stats es = engine_finish(&e);
    assert_int_equal(es.vmm_imports, 0);
    assert_int_equal(es.vmm_maps_live, 0);
    assert_int_equal(es.vmm_reserved_live, 0);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    assert_int_equal(stats_now().vmm_handles_live, 0);
    drv.cuMemFree(span);
    drv.cuMemFree(span + (1u << 20));
}

/* Virtual memory whose handles cannot become file descriptors (made without
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR): refused by name before anything is published. */
static void unpacked_refuses_virtual_memory_it_cannot_export_naming_the_tensor(void **state) {
    (void)state;
    use_device(0);
    CUdeviceptr span = 0;
    assert_int_equal(drv.alloc_span(&span, 2u << 20, 1u << 20), 0);
    wsync_tensor_t t = gpu_tensor("layers.0.w", (void *)(uintptr_t)span, shapes[0], 2,
                                  WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", NULL, 0, &s, &init, &tx);
    drv.set_fail("cuMemExportToShareableHandle", 0, 101 /* CUDA_ERROR_INVALID_DEVICE */);
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_UNSUPPORTED,
               "tensor 'layers.0.w' lives in virtual memory that cannot be exported as a file descriptor");
    assert_non_null(strstr(wsync_last_error(), "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"));
    assert_non_null(strstr(wsync_last_error(), "packed: true"));
    assert_int_equal(stats_now().vmm_handles_live, 0); /* the retained handle went back */
    uint64_t v = 0;
    OK(wsync_sender_version(tx, &v));
    assert_int_equal(v, 1);
    /* The next try exports it. */
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    wsync_blob_free(&req);
    trainer_end(tx, s, &init);
    drv.cuMemFree(span);
    drv.cuMemFree(span + (1u << 20));
}

static void unpacked_moved_tensor_gets_a_new_handle_and_the_old_one_is_closed(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", &e, 1, &s, &init, &tx);
    void *a = dalloc(4096), *b = dalloc(4096);
    for (uint64_t v = 1; v <= 4; ++v) {
        if (v == 2) { /* the trainer re-allocates t1 */
            drv.cuMemFree((CUdeviceptr)(uintptr_t)b);
            b = dalloc(4096);
        }
        tu_fill(a, 7 * 3 * 4, v, 1);
        tu_fill(b, 64 * 32 * 2, v, 0);
        wsync_tensor_t t[2] = {gpu_tensor("t0", b, shapes[0], 2, WSYNC_DTYPE_BFLOAT, 16, 0),
                               gpu_tensor("t1", a, shapes[1], 2, WSYNC_DTYPE_FLOAT, 32, 0)};
        wsync_chunk_t ch = tu_chunk(t, 2, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        engine_send(&e, &req);
        assert_int_equal(engine_verdict(&e), 0);
        wsync_blob_free(&req);
        OK(wsync_sender_flush(tx, 5000));
    }
    struct wsync_fake_stats es = engine_finish(&e);
    assert_int_equal(es.ipc_open, 3);  /* a, the first b, the second b */
    assert_int_equal(es.ipc_close, 3); /* the first b after a version unused; the rest at exit */
    trainer_end(tx, s, &init);
}

/* ---- several senders, UUID selection ------------------------------------------------------- */
static void each_engine_takes_the_part_of_its_own_gpu_even_when_remapped(void **state) {
    (void)state;
    /* Engine 1 sees only GPU 1, as its ordinal 0 (CUDA_VISIBLE_DEVICES remapping). */
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 0, 0, 0, 0};
    engine_cfg c1 = {"cuda_ipc", "{\"device\": 0}", "1", 1, 1000, 0, 0, 0, 0};
    engine_t e[2] = {engine_start(&c0), engine_start(&c1)};
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx[2];
    OK(wsync_strategy_create("cuda_ipc", "{\"senders\": 2, \"receivers\": 2, \"bucket_bytes\": 65536}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &init);
    void *data[2][2];
    for (int g = 0; g < 2; ++g) {
        use_device(g);
        OK(wsync_sender_create(s, init.data, init.size, &tx[g]));
        for (int k = 0; k < 2; ++k) data[g][k] = dalloc(64 * 32 * 4);
    }
    for (uint64_t v = 1; v <= 3; ++v) {
        wsync_blob_t parts[2], merged;
        for (int g = 0; g < 2; ++g) {
            wsync_tensor_t t[2];
            for (int k = 0; k < 2; ++k) {
                tu_fill(data[g][k], 64 * 32 * 4, v + (g ? 1000 : 0), (uint64_t)k);
                t[k] = gpu_tensor(names[k], data[g][k], shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, g);
            }
            wsync_chunk_t ch = tu_chunk(t, 2, WSYNC_CHUNK_LAST);
            OK(wsync_sender_send_chunk(tx[g], &ch, &parts[g]));
        }
        OK(wsync_request_merge(parts, 2, &merged));
        for (int i = 0; i < 2; ++i) engine_send(&e[i], &merged);
        for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
        for (int g = 0; g < 2; ++g) OK(wsync_sender_flush(tx[g], 5000));
        /* A merge of one GPU twice is refused, naming the GPU. */
        wsync_blob_t twice[2] = {parts[0], parts[0]}, bad;
        EXPECT_ERR(wsync_request_merge(twice, 2, &bad), WSYNC_ERR_MISMATCH, "appears in two parts");
        for (int g = 0; g < 2; ++g) wsync_blob_free(&parts[g]);
        wsync_blob_free(&merged);
    }
    for (int i = 0; i < 2; ++i) engine_finish(&e[i]);
    for (int g = 0; g < 2; ++g) wsync_sender_destroy(tx[g]);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

static void a_request_without_this_gpu_is_a_mismatch_naming_the_uuid(void **state) {
    (void)state;
    use_device(0);
    wsync_strategy_t *s, *rs;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    wsync_receiver_t *rx;
    ipc_trainer("{\"bucket_bytes\": 65536}", NULL, 0, &s, &init, &tx);
    OK(wsync_strategy_create("cuda_ipc", "{\"device\": 1}", &rs));
    OK(wsync_receiver_create(rs, init.data, init.size, 0, &rx));
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    wsync_recv_t *it = (wsync_recv_t *)1;
    EXPECT_ERR(wsync_receiver_receive(rx, req.data, req.size, &it), WSYNC_ERR_MISMATCH,
               "no part for this receiver's GPU GPU-");
    assert_null(it);
    /* A chunk on host memory is refused by name, and nothing is published. */
    float host[4] = {0};
    int64_t four = 4;
    wsync_tensor_t h = tu_tensor("host", host, &four, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t hc = tu_chunk(&h, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t r2;
    EXPECT_ERR(wsync_sender_send_chunk(tx, &hc, &r2), WSYNC_ERR_UNSUPPORTED, "tensor 'host' is on");
    wsync_blob_free(&req);
    wsync_receiver_destroy(rx);
    wsync_sender_destroy(tx);
    wsync_strategy_destroy(rs);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* Review finding: a cuda_ipc request carried nothing of its sync, so an engine handed another
 * trainer's request of the version it expects next (a controller serving two models that routes
 * a request to the wrong engines) opened that trainer's memory, loaded it as its own version,
 * and then refused its own trainer's request of that version as a replay. Engine: the foreign
 * request is refused with MISMATCH as another trainer's (verdict 6) before any handle is
 * opened, and its own trainer's request then completes the version bit for bit. The other
 * trainer's engine takes the same request as usual; both flushes are OK; the two requests do
 * not merge into one. */
static void cuda_ipc_a_request_of_another_sync_is_refused_and_changes_nothing(void **state) {
    (void)state;
    engine_t ea = ipc_engine(0), eb = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *sa, *sb;
    wsync_blob_t ia, ib, qa, qb;
    wsync_sender_t *ta, *tb;
    ipc_trainer("{\"bucket_bytes\": 65536}", &ea, 1, &sa, &ia, &ta);
    ipc_trainer("{\"bucket_bytes\": 65536}", &eb, 1, &sb, &ib, &tb);
    const size_t n = 64 * 32 * 4;
    void *da = dalloc(n), *db = dalloc(n);
    wsync_tensor_t ta0 = gpu_tensor("t0", da, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_tensor_t tb0 = gpu_tensor("t0", db, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t cha = tu_chunk(&ta0, 1, WSYNC_CHUNK_LAST), chb = tu_chunk(&tb0, 1, WSYNC_CHUNK_LAST);
    for (uint64_t v = 1; v <= 2; ++v) {
        tu_fill(da, n, v, 0); /* both trainers hold what an engine expects of version v */
        tu_fill(db, n, v, 0);
        OK(wsync_sender_send_chunk(ta, &cha, &qa));
        OK(wsync_sender_send_chunk(tb, &chb, &qb));
        engine_send(&ea, &qb);
        assert_int_equal(engine_verdict(&ea), 6);
        engine_send(&ea, &qa);
        assert_int_equal(engine_verdict(&ea), 0);
        engine_send(&eb, &qb);
        assert_int_equal(engine_verdict(&eb), 0);
        /* Nor do the two syncs' parts merge into one request. */
        wsync_blob_t both[2] = {qa, qb}, merged;
        EXPECT_ERR(wsync_request_merge(both, 2, &merged), WSYNC_ERR_MISMATCH,
                   "part 1 is of the sync of board '/wsync-ipc-");
        wsync_blob_free(&qa);
        wsync_blob_free(&qb);
        OK(wsync_sender_flush(ta, 5000));
        OK(wsync_sender_flush(tb, 5000));
    }
    engine_finish(&ea);
    engine_finish(&eb);
    trainer_end(ta, sa, &ia);
    trainer_end(tb, sb, &ib);
}

/* A receiver says whether it acknowledges chunks only after the loader's queued work (so a
 * loader such as Python's ModuleLoader need not wait for its own copies): cuda_ipc with
 * "synchronize" (the default) does, with it off it does not, and shm never does. */
static void a_receiver_says_whether_it_orders_the_loaders_work(void **state) {
    (void)state;
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"receivers\": 2, \"bucket_bytes\": 65536}", NULL, 0, &s, &init, &tx);
    const char *engine_opts[2] = {"{\"device\": 0}", "{\"device\": 0, \"synchronize\": false}"};
    for (uint32_t i = 0; i < 2; ++i) {
        wsync_strategy_t *rs;
        wsync_receiver_t *rx;
        OK(wsync_strategy_create("cuda_ipc", engine_opts[i], &rs));
        OK(wsync_receiver_create(rs, init.data, init.size, i, &rx));
        wsync_receiver_state_t st = {0};
        OK(wsync_receiver_poll(rx, &st));
        assert_int_equal(!!(st.flags & WSYNC_RECEIVER_ORDERS_LOADER_WORK), i == 0);
        wsync_receiver_destroy(rx);
        wsync_strategy_destroy(rs);
    }
    trainer_end(tx, s, &init);
    wsync_strategy_t *hs, *hr;
    wsync_blob_t hinit;
    wsync_receiver_t *hrx;
    OK(wsync_strategy_create("shm", NULL, &hs));
    OK(wsync_strategy_create_init_info(hs, &hinit));
    OK(wsync_strategy_create("shm", NULL, &hr));
    OK(wsync_receiver_create(hr, hinit.data, hinit.size, 0, &hrx));
    wsync_receiver_state_t hst = {0};
    OK(wsync_receiver_poll(hrx, &hst));
    assert_int_equal(hst.flags & WSYNC_RECEIVER_ORDERS_LOADER_WORK, 0);
    wsync_receiver_destroy(hrx);
    wsync_strategy_destroy(hr);
    wsync_strategy_destroy(hs);
    wsync_blob_free(&hinit);
}

/* An engine that takes every view of its first chunk and holds them until the parent says go
 * (an empty frame), as a loader slower than the trainer's flush deadline does; then answers 0 if
 * wsync_recv_end failed with PEER saying it was dropped while it read chunk 0 of version 1 and
 * nothing completed. */
static int engine_attach(const engine_cfg *cfg, int in, wsync_strategy_t **s, wsync_receiver_t **r);

static int held_views_engine_main(const engine_cfg *cfg, int in, int out) {
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    int attached = engine_attach(cfg, in, &s, &r);
    if (attached) return attached;
    use_device(0);
    uint8_t *req;
    size_t len;
    if (tu_recv_frame(in, &req, &len, 20000) || !req) return 13;
    wsync_recv_t *it;
    if (wsync_receiver_receive(r, req, len, &it) != WSYNC_OK) return 14;
    free(req);
    wsync_tensor_t v;
    bool has = true;
    while (has)
        if (wsync_recv_next(it, &v, &has) != WSYNC_OK) return 15;
    uint8_t verdict = 0;
    if (tu_write_all(out, &verdict, 1)) return 16; /* holding the views */
    if (tu_recv_frame(in, &req, &len, 20000) || req) return 17;
    wsync_status_t st = wsync_recv_end(it);
    fprintf(stderr, "held engine: end: %s\n", wsync_last_error());
    if (st != WSYNC_ERR_PEER ||
        !strstr(wsync_last_error(), "dropped by the sender while it read chunk 0 of version 1"))
        verdict = 1;
    wsync_receiver_state_t ps = {.struct_size = sizeof ps};
    if (wsync_receiver_poll(r, &ps) != WSYNC_OK || ps.completed_version != 0 ||
        !(ps.flags & WSYNC_RECEIVER_DROPPED))
        verdict = 2;
    if (tu_write_all(out, &verdict, 1)) return 18;
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    return 0;
}

static int held_views_engine_entry(const void *cfg, int in, int out) {
    return held_views_engine_main((const engine_cfg *)cfg, in, out);
}

/* cuda_ipc, one device bucket: engine 0 holds its views of version 1 past the flush deadline;
 * the trainer drops it and packs version 2 into that bucket for engine 1. Engine 0's
 * wsync_recv_end fails with PEER (dropped while it read the chunk), nothing completes there, and
 * the trainer, no longer listening to it, completes version 3 on engine 1 undisturbed. */
static void cuda_ipc_a_receiver_dropped_while_it_reads_never_completes_the_version(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 0, 0, 0, 0};
    engine_t e[2] = {tu_fork_peer(held_views_engine_entry, &c0), ipc_engine(1)};
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"receivers\": 2, \"bucket_bytes\": 65536, \"buckets\": 1, \"timeout_ms\": 3000}",
                e, 2, &s, &init, &tx);
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < 3; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    for (uint64_t v = 1; v <= 3; ++v) {
        for (int k = 0; k < 3; ++k) {
            tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        wsync_chunk_t ch = tu_chunk(t, 3, WSYNC_CHUNK_LAST);
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        if (v == 1) {
            engine_send(&e[0], &req);
            assert_int_equal(engine_verdict(&e[0]), 0); /* holding its views */
        }
        engine_send(&e[1], &req);
        assert_int_equal(engine_verdict(&e[1]), 0);
        wsync_blob_free(&req);
        if (v == 1) {
            EXPECT_ERR(wsync_sender_flush(tx, 200), WSYNC_ERR_TIMEOUT, "receivers [0]");
            OK(wsync_sender_drop_receiver(tx, 0));
        }
        if (v == 2) { /* version 2 is in the bucket engine 0 reads: let it end */
            assert_int_equal(tu_send_frame(e[0].to, NULL, 0), 0);
            assert_int_equal(engine_verdict(&e[0]), 0);
            assert_int_equal(tu_wait_child(e[0].pid, 20000), 0);
            close(e[0].to);
            close(e[0].from);
        }
        OK(wsync_sender_flush(tx, 3000));
    }
    engine_finish(&e[1]);
    trainer_end(tx, s, &init);
    for (int k = 0; k < 3; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

static void a_dead_engine_fails_flush_with_peer(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536}", &e, 1, &s, &init, &tx);
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    usleep(200000); /* let the engine attach, then kill it before it sees the request */
    kill(e.pid, SIGKILL);
    tu_wait_child(e.pid, 5000);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(tx, 3000), WSYNC_ERR_PEER, "died without acknowledging");
    assert_true(tu_now_ms() - t0 < 2000);
    wsync_blob_free(&req);
    trainer_end(tx, s, &init);
}

static void cuda_ipc_options_are_checked_before_anything_happens(void **state) {
    (void)state;
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"packed\": false, \"dtype\": \"bfloat16\"}", &s),
               WSYNC_ERR_INVALID_ARGUMENT, "'dtype' needs packed=true");
    assert_null(s);
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"dtype\": \"fp8\"}", &s),
               WSYNC_ERR_INVALID_ARGUMENT, "option 'dtype'");
    /* What the GPU kinds would run on is reported, driver and NCCL version included. */
    char *json;
    OK(wsync_strategy_kinds(&json));
    assert_non_null(strstr(json, "\"runtime\":\"CUDA driver 13.0 ("));
    assert_non_null(strstr(json, "libwsync needs 12.0 or newer)"));
    assert_non_null(strstr(json, "; NCCL 2.28.9 ("));
    wsync_string_free(json);
}

/* ---- cuda_ipc: delta sync on the GPU (docs/delta.md, "On the GPU") -------------------------
 * The trainer's bf16 model changes about 1 element in 64 per version (delta_content); an engine
 * holds its own copy of every tensor in device memory and loads each version with
 * wsync_recv_copy, which applies a patch there (verified) or copies dense bytes. */
#define DT 4
static const int64_t delta_elems[DT] = {8192 * 3 + 5, 4000, 20, 70000};

/* Tensor k of version v: tu_fill of version 1, then for each later version u, every element
 * whose hash of (u, k, i) is 0 mod 64 gets u xor-ed in. */
static void delta_content(uint16_t *b, size_t n, uint64_t v, int k) {
    tu_fill(b, n * 2, 1, (uint64_t)k);
    for (uint64_t u = 2; u <= v; ++u)
        for (size_t i = 0; i < n; ++i) {
            uint64_t h = (u * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)k << 40) ^ (i * 0xBF58476D1CE4E5B9ull);
            h ^= h >> 31;
            h *= 0x94D049BB133111EBull;
            h ^= h >> 29;
            if ((h & 63) == 0) b[i] ^= (uint16_t)u;
        }
}

typedef struct {
    uint32_t index;
    uint64_t scribble_before; /* the engine changes its copy of t0 before this version */
    const char *kind;         /* NULL: cuda_ipc */
    int probe;                /* first try each patch into a misaligned or host destination */
    int announce;             /* writes one byte once its receiver is attached */
    uint64_t hold_at;         /* holds the loader's stream while it copies this version's tensors */
    uint64_t freeze_at;       /* holds it until after wsync_recv_end (receiver timeout 500 ms) */
    const char *visible;      /* CUDA_VISIBLE_DEVICES for the engine, or NULL */
} delta_engine_cfg;

/* Whether `got` is tensor k of version v (with the engine's scribble when `scribbled`). */
static int delta_holds(const uint16_t *got, int k, uint64_t v, int scribbled) {
    uint16_t *want = malloc((size_t)delta_elems[k] * 2);
    delta_content(want, (size_t)delta_elems[k], v, k);
    if (scribbled) want[17] ^= 0x4000;
    const int same = memcmp(got, want, (size_t)delta_elems[k] * 2) == 0;
    free(want);
    return same;
}

/* Answers each request with two bytes: 0 when every tensor holds what the trainer sent (else
 * the step that failed, or 0x80 | the status of a MISMATCH refusal that was expected), and
 * how many tensors of the chunk came as patches. Patches into device memory are queued on the
 * loader's stream by wsync_recv_copy and verified when the iteration ends, so a refusal is
 * wsync_recv_end's status. */
static int delta_engine_main(const delta_engine_cfg *cfg, int in, int out) {
    alarm(60);
    if (cfg->visible) setenv("CUDA_VISIBLE_DEVICES", cfg->visible, 1);
    uint8_t *init;
    size_t len;
    if (tu_recv_frame(in, &init, &len, 20000) || !init) return 10;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    const char *opts = cfg->freeze_at ? "{\"device\": 0, \"timeout_ms\": 500}" : "{\"device\": 0}";
    if (wsync_strategy_create(cfg->kind ? cfg->kind : "cuda_ipc", opts, &s) != WSYNC_OK ||
        wsync_receiver_create(s, init, len, cfg->index, &r) != WSYNC_OK)
        return 11;
    free(init);
    uint8_t attached = 1;
    if (cfg->announce && tu_write_all(out, &attached, 1)) return 15;
    use_device(0);
    uint16_t *mine[DT];
    for (int k = 0; k < DT; ++k) mine[k] = dalloc((size_t)delta_elems[k] * 2);
    for (;;) {
        uint8_t *req;
        if (tu_recv_frame(in, &req, &len, 20000)) return 12;
        if (!req) break;
        uint8_t answer[2] = {0, 0};
        wsync_recv_t *it;
        if (wsync_receiver_receive(r, req, len, &it) != WSYNC_OK) {
            answer[0] = 1;
        } else {
            wsync_recv_info_t info = {0};
            wsync_recv_info(it, &info);
            const int scribbled = info.version == cfg->scribble_before;
            if (scribbled) mine[0][17] ^= 0x4000;
            const int held = info.version == cfg->hold_at, frozen = info.version == cfg->freeze_at;
            if ((held || frozen) && drv.stream_hold(NULL) != 0) answer[0] = 9;
            wsync_status_t st = WSYNC_OK;
            for (size_t i = 0; i < info.count && st == WSYNC_OK; ++i) {
                wsync_tensor_t t;
                if (wsync_recv_peek(it, i, &t) != WSYNC_OK) { answer[0] = 2; break; }
                if (t.flags & WSYNC_TENSOR_PATCH) answer[1]++;
                const int k = t.name[1] - '0';
                if (cfg->probe && (t.flags & WSYNC_TENSOR_PATCH)) {
                    /* Bad destinations are refused by name and leave the iteration usable. */
                    const size_t n = (size_t)delta_elems[k] * 2;
                    uint8_t *odd = dalloc(n + 8);
                    if (wsync_recv_copy(it, i, 0, odd + 1, n) != WSYNC_ERR_INVALID_ARGUMENT ||
                        !strstr(wsync_last_error(), "not aligned to its 2-byte elements"))
                        answer[0] = 7;
                    uint8_t *host = malloc(n);
                    if (wsync_recv_copy(it, i, 0, host, n) != WSYNC_ERR_INVALID_ARGUMENT ||
                        !strstr(wsync_last_error(), "is not device memory"))
                        answer[0] = 8;
                    free(host);
                    drv.cuMemFree((CUdeviceptr)(uintptr_t)odd);
                }
                st = wsync_recv_copy(it, i, 0, mine[k], (size_t)delta_elems[k] * 2);
                if (st != WSYNC_OK) {
                    fprintf(stderr, "delta engine %u: %s\n", cfg->index, wsync_last_error());
                    answer[0] = 3;
                }
            }
            if (held) {
                /* Every copy returned with the stream parked: queued, none applied yet. */
                for (int k = 0; k < DT; ++k)
                    if (!delta_holds(mine[k], k, info.version - 1, 0)) answer[0] = 10;
                drv.stream_release_held();
            }
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            wsync_status_t end = wsync_recv_end(it);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (end != WSYNC_OK) fprintf(stderr, "delta engine %u: end: %s\n", cfg->index, wsync_last_error());
            if (frozen) {
                /* The GPU never runs the queued apply: the one wait ends at the receiver's
                 * deadline, naming the step, and nothing waits for the same stream again. */
                const double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
                if (st == WSYNC_OK && end == WSYNC_ERR_TIMEOUT && s >= 0.45 && s < 0.95 &&
                    strstr(wsync_last_error(), "patches of chunk 0 of version") &&
                    strstr(wsync_last_error(), "on the GPU"))
                    answer[0] = (uint8_t)(0x80 | end);
                else
                    answer[0] = 12;
                drv.stream_release_held();
            } else if (scribbled && st == WSYNC_OK) {
                /* t0 no longer holds the base: refused by name when the chunk ends, t0 left as
                 * the engine made it. */
                if (end == WSYNC_ERR_MISMATCH && strstr(wsync_last_error(), "does not hold version") &&
                    strstr(wsync_last_error(), "'t0'") && delta_holds(mine[0], 0, info.version - 1, 1))
                    answer[0] = (uint8_t)(0x80 | end);
                else
                    answer[0] = 11;
            } else if (st == WSYNC_OK && end != WSYNC_OK) {
                answer[0] = 4;
            }
            /* nccl_broadcast's recv_end only fences the dense copies for the next receive. */
            if (cfg->kind && !strcmp(cfg->kind, "nccl_broadcast") && drv.cuCtxSynchronize() != 0)
                answer[0] = 6;
            if (st == WSYNC_OK && end == WSYNC_OK && (info.flags & WSYNC_CHUNK_LAST)) {
                for (int k = 0; k < DT; ++k)
                    if (!delta_holds(mine[k], k, info.version, 0)) answer[0] = 5;
            }
        }
        free(req);
        if (tu_write_all(out, answer, 2)) return 13;
    }
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    /* Nothing left behind: every mapping of the trainer's memory closed, also after a frozen
     * apply (its handles stay open only until the stream ran it). */
    struct wsync_fake_stats fs;
    drv.stats(&fs);
    if (fs.ipc_live != 0) return 14;
    return 0;
}

static int delta_engine_entry(const void *cfg, int in, int out) {
    return delta_engine_main((const delta_engine_cfg *)cfg, in, out);
}

/* Sends version v of the model (one chunk) and returns the engines' answers. */
static void delta_version(wsync_sender_t *tx, engine_t *e, int engines, uint16_t *data[DT],
                          uint64_t v, uint8_t answers[][2]) {
    wsync_tensor_t t[DT];
    char name[DT][4];
    for (int k = 0; k < DT; ++k) {
        delta_content(data[k], (size_t)delta_elems[k], v, k);
        snprintf(name[k], sizeof name[k], "t%d", k);
        t[k] = gpu_tensor(name[k], data[k], &delta_elems[k], 1, WSYNC_DTYPE_BFLOAT, 16, 0);
    }
    wsync_chunk_t ch = tu_chunk(t, DT, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    for (int i = 0; i < engines; ++i) engine_send(&e[i], &req);
    for (int i = 0; i < engines; ++i) {
        assert_int_equal(tu_read_all(e[i].from, answers[i], 2, 20000), 0);
    }
    wsync_blob_free(&req);
}

static void delta_engine_finish(engine_t *e) {
    assert_int_equal(tu_send_frame(e->to, NULL, 0), 0);
    assert_int_equal(tu_wait_child(e->pid, 20000), 0);
    close(e->to);
    close(e->from);
}

/* A delta trainer on GPU 0: its strategy (`kind` with `options`), init info (sent to the
 * first `engines` engines), sender, and the model's device buffers. */
typedef struct {
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    uint16_t *data[DT];
} delta_trainer_t;

static void delta_trainer_start(delta_trainer_t *t, const char *kind, const char *options,
                                engine_t *e, int engines) {
    use_device(0);
    OK(wsync_strategy_create(kind, options, &t->s));
    OK(wsync_strategy_create_init_info(t->s, &t->init));
    for (int i = 0; i < engines; ++i) engine_send(&e[i], &t->init);
    OK(wsync_sender_create(t->s, t->init.data, t->init.size, &t->tx));
    for (int k = 0; k < DT; ++k) t->data[k] = dalloc((size_t)delta_elems[k] * 2);
}

static void delta_trainer_end(delta_trainer_t *t) {
    trainer_end(t->tx, t->s, &t->init);
    for (int k = 0; k < DT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)t->data[k]);
}

/* Version v to the engines: each must load it bit-identical with `patches` tensors as patches
 * (-1: any number); then the trainer's flush succeeds. */
static void delta_step(delta_trainer_t *t, engine_t *e, int engines, uint64_t v, int patches) {
    uint8_t a[2][2];
    delta_version(t->tx, e, engines, t->data, v, a);
    for (int i = 0; i < engines; ++i) {
        assert_int_equal(a[i][0], 0);
        if (patches >= 0) assert_int_equal(a[i][1], patches);
    }
    OK(wsync_sender_flush(t->tx, 5000));
}

static void cuda_ipc_delta_keeps_engines_bit_identical_while_patches_cross(void **state) {
    (void)state;
    delta_engine_cfg c0 = {0, 0, NULL, 1, 0, 0, 0, NULL}, c1 = {1, 0, NULL, 0, 0, 4, 0, NULL};
    engine_t e[2] = {tu_fork_peer(delta_engine_entry, &c0), tu_fork_peer(delta_engine_entry, &c1)};
    delta_trainer_t t;
    delta_trainer_start(&t, "cuda_ipc", "{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\"}", e, 2);
    /* Version 1 is dense; after it, every tensor but the 20-element one (whose patch would not
     * be smaller) crosses as a patch. */
    for (uint64_t v = 1; v <= 6; ++v) delta_step(&t, e, 2, v, v == 1 ? 0 : DT - 1);
    for (int i = 0; i < 2; ++i) delta_engine_finish(&e[i]);
    delta_trainer_end(&t);
}

/* The same for either GPU kind: versions 1 and 2 arrive; before version 3 the engine changes
 * its copy of t0, whose patch it then refuses by name (wsync_recv_end), memory untouched; the
 * trainer hears it (cuda_ipc through its board, nccl_broadcast through its control channel), so
 * version 4 is dense for everyone (no anchors) and makes the engine whole; patches flow again
 * after. */
static void delta_refusal_and_dense_recovery(const char *kind) {
    const int ipc = !strcmp(kind, "cuda_ipc");
    delta_engine_cfg c0 = {0, 3, kind, 0, 0, 5, 0, ipc ? NULL : NCCL_ENGINE_GPUS};
    if (!ipc) nccl_three_gpus();
    engine_t e = tu_fork_peer(delta_engine_entry, &c0);
    delta_trainer_t t;
    delta_trainer_start(&t, kind, "{\"bucket_bytes\": 1048576, \"delta\": \"on\"}", &e, 1);
    for (uint64_t v = 1; v <= 2; ++v) delta_step(&t, &e, 1, v, -1);
    /* Version 3: the engine's t0 is no longer version 2, so its patch is refused by name, the
     * engine's memory untouched, and the trainer hears it. */
    uint8_t a[1][2];
    delta_version(t.tx, &e, 1, t.data, 3, a);
    assert_int_equal(a[0][0], 0x80 | WSYNC_ERR_MISMATCH);
    assert_int_equal(a[0][1], DT); /* every tensor a patch, all queued; t0's refused at the end */
    EXPECT_ERR(wsync_sender_flush(t.tx, 5000), WSYNC_ERR_PEER, "does not hold version 2");
    /* Version 4 is dense for everyone and makes the engine whole; patches flow again after. */
    delta_step(&t, &e, 1, 4, 0);
    delta_step(&t, &e, 1, 5, DT);
    delta_engine_finish(&e);
    delta_trainer_end(&t);
}

static void cuda_ipc_delta_an_engine_that_changed_its_copy_refuses_the_patch_and_the_next_version_is_dense(
    void **state) {
    (void)state;
    delta_refusal_and_dense_recovery("cuda_ipc");
}

static void nccl_delta_an_engine_that_changed_its_copy_refuses_the_patch_and_the_next_version_is_dense(
    void **state) {
    (void)state;
    delta_refusal_and_dense_recovery("nccl_broadcast");
}

/* "delta_base_memory": "pinned_host": the trainer's bases (and dense tensors' staged copies)
 * live in pinned host memory the compare and fold kernels reach through its device mapping, so
 * they cost no GPU memory; engines stay bit-identical while patches cross, as with bases on
 * the GPU. */
static void cuda_ipc_delta_bases_in_pinned_host_memory_cost_no_gpu_memory(void **state) {
    (void)state;
    delta_engine_cfg c0 = {0, 0, NULL, 0, 0, 0, 0, NULL};
    engine_t e = tu_fork_peer(delta_engine_entry, &c0);
    engine_t e2 = tu_fork_peer(delta_engine_entry, &c0); /* forked before this process uses CUDA */
    delta_trainer_t t;
    delta_trainer_start(&t, "cuda_ipc",
                        "{\"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\", \"delta_base_memory\": \"pinned_host\"}",
                        &e, 1);
    struct wsync_fake_stats before, after;
    drv.stats(&before);
    for (uint64_t v = 1; v <= 5; ++v) delta_step(&t, &e, 1, v, v == 1 ? 0 : DT - 1);
    drv.stats(&after);
    /* Every tensor's base and staged copy is pinned host memory... */
    assert_true(after.pinned_live - before.pinned_live >= DT);
    assert_true(after.host_allocs - before.host_allocs >= DT);
    const long long device_grew = after.live_allocs - before.live_allocs;
    delta_engine_finish(&e);
    delta_trainer_end(&t);
    drv.stats(&after);
    assert_int_equal(after.pinned_live, before.pinned_live); /* freed with the sender */
    /* ... and none is device memory: the same run with bases on the GPU allocates at least one
     * device buffer more per tensor. */
    delta_trainer_t t2;
    delta_trainer_start(&t2, "cuda_ipc", "{\"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\"}", &e2, 1);
    drv.stats(&before);
    for (uint64_t v = 1; v <= 5; ++v) delta_step(&t2, &e2, 1, v, v == 1 ? 0 : DT - 1);
    drv.stats(&after);
    assert_true(after.pinned_live == before.pinned_live);
    assert_true(after.live_allocs - before.live_allocs >= device_grew + DT);
    delta_engine_finish(&e2);
    delta_trainer_end(&t2);
}

/* An engine whose GPU never runs the queued apply (its loader's stream frozen): every
 * wsync_recv_copy of a patch returned at once, and wsync_recv_end fails with TIMEOUT naming the
 * patches within the receiver's deadline; the trainer's flush reports it, and the next version,
 * dense, makes the engine whole once its stream moves again. */
static void cuda_ipc_delta_a_frozen_apply_fails_recv_end_within_the_deadline_on_both_sides(void **state) {
    (void)state;
    delta_engine_cfg c0 = {0, 0, NULL, 0, 0, 0, 3, NULL};
    engine_t e = tu_fork_peer(delta_engine_entry, &c0);
    delta_trainer_t t;
    delta_trainer_start(&t, "cuda_ipc", "{\"bucket_bytes\": 1048576, \"delta\": \"on\"}", &e, 1);
    for (uint64_t v = 1; v <= 2; ++v) delta_step(&t, &e, 1, v, -1);
    uint8_t a[1][2];
    delta_version(t.tx, &e, 1, t.data, 3, a);
    assert_int_equal(a[0][0], 0x80 | WSYNC_ERR_TIMEOUT);
    assert_int_equal(a[0][1], DT);
    EXPECT_ERR(wsync_sender_flush(t.tx, 5000), WSYNC_ERR_PEER, "patches of chunk 0 of version 3");
    delta_step(&t, &e, 1, 4, 0);
    delta_step(&t, &e, 1, 5, DT);
    delta_engine_finish(&e);
    delta_trainer_end(&t);
}

/* An engine that restarts (a new process attaching as the same receiver) holds no base: the
 * version after it attached is dense, so its first version completes, and patches follow. */
static void cuda_ipc_delta_a_restarted_engine_is_sent_the_next_version_dense(void **state) {
    (void)state;
    delta_engine_cfg first = {0, 0, NULL, 0, 0, 0, 0, NULL}, again = {0, 0, NULL, 0, 1, 0, 0, NULL};
    engine_t e1 = tu_fork_peer(delta_engine_entry, &first);
    engine_t e2 = tu_fork_peer(delta_engine_entry, &again); /* forked before this process uses CUDA */
    delta_trainer_t t;
    delta_trainer_start(&t, "cuda_ipc", "{\"bucket_bytes\": 1048576, \"delta\": \"on\"}", &e1, 1);
    for (uint64_t v = 1; v <= 2; ++v) delta_step(&t, &e1, 1, v, v == 1 ? 0 : DT);
    delta_engine_finish(&e1);  /* receiver 0 leaves */
    engine_send(&e2, &t.init); /* and a new process attaches as receiver 0 */
    uint8_t attached = 0;
    assert_int_equal(tu_read_all(e2.from, &attached, 1, 20000), 0);
    delta_step(&t, &e2, 1, 3, 0); /* dense: the newcomer holds no base */
    delta_step(&t, &e2, 1, 4, DT);
    delta_engine_finish(&e2);
    delta_trainer_end(&t);
}

/* A version the trainer abandons after its first chunk (whose patches the engine applied) never
 * touches the trainer's bases, and the version after it is dense for everyone: the engine is
 * whole again, and patches follow. */
static void cuda_ipc_delta_the_version_after_an_abandoned_one_is_dense(void **state) {
    (void)state;
    delta_engine_cfg c0 = {0, 0, NULL, 0, 0, 0, 0, NULL};
    engine_t e = tu_fork_peer(delta_engine_entry, &c0);
    delta_trainer_t t;
    delta_trainer_start(&t, "cuda_ipc", "{\"bucket_bytes\": 1048576, \"delta\": \"on\"}", &e, 1);
    for (uint64_t v = 1; v <= 2; ++v) delta_step(&t, &e, 1, v, -1);
    /* Version 3: its first chunk (t0, t1) goes out as patches and is applied; then it is
     * abandoned. */
    wsync_tensor_t ts[2];
    for (int k = 0; k < 2; ++k) {
        delta_content(t.data[k], (size_t)delta_elems[k], 3, k);
        ts[k] = gpu_tensor(k ? "t1" : "t0", t.data[k], &delta_elems[k], 1, WSYNC_DTYPE_BFLOAT, 16, 0);
    }
    wsync_chunk_t ch = tu_chunk(ts, 2, 0);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(t.tx, &ch, &req));
    engine_send(&e, &req);
    uint8_t a[2];
    assert_int_equal(tu_read_all(e.from, a, 2, 20000), 0);
    assert_int_equal(a[0], 0);
    assert_int_equal(a[1], 2);
    wsync_blob_free(&req);
    OK(wsync_sender_abandon(t.tx));
    /* Version 4 is dense, whatever the engine holds; then patches again. */
    delta_step(&t, &e, 1, 4, 0);
    delta_step(&t, &e, 1, 5, DT);
    delta_engine_finish(&e);
    delta_trainer_end(&t);
}

static void gpu_delta_needs_packed_buckets_and_no_cast_and_takes_no_mirror(void **state) {
    (void)state;
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"packed\": false, \"delta\": \"auto\"}", &s),
               WSYNC_ERR_UNSUPPORTED, "which needs packed=true");
    assert_null(s);
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"dtype\": \"bfloat16\", \"delta\": \"on\"}", &s),
               WSYNC_ERR_UNSUPPORTED, "a cast changes that");
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"delta_mirror\": true}", &s),
               WSYNC_ERR_UNSUPPORTED, "applies patches on the GPU");
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"senders\": 2, \"delta\": \"auto\"}", &s),
               WSYNC_ERR_UNSUPPORTED, "with 2 senders: each sender's patches differ");
    EXPECT_ERR(wsync_strategy_create("nccl_broadcast", "{\"dtype\": \"float16\", \"delta\": \"auto\", \"delta_anchor_every\": 4}", &s),
               WSYNC_ERR_UNSUPPORTED, "a cast changes that");
    EXPECT_ERR(wsync_strategy_create("nccl_broadcast", "{\"delta_mirror\": true}", &s),
               WSYNC_ERR_UNSUPPORTED, "applies patches on the GPU");
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"delta_base_memory\": \"host\"}", &s),
               WSYNC_ERR_INVALID_ARGUMENT, "delta_base_memory");
}

/* ---- cuda_ipc: lifetimes of shared memory (issue 10 A) ------------------------------------- */
/* Sends one version of one chunk (t0 at a, t1 at b, filled for version v) to one engine and
 * returns the engine's verdict; the version is flushed when the verdict is 0. */
static uint8_t sync_two(wsync_sender_t *tx, engine_t *e, void *a, void *b, uint64_t v) {
    tu_fill(a, 64 * 32 * 4, v, 0);
    tu_fill(b, 7 * 3 * 4, v, 1);
    wsync_tensor_t t[2] = {gpu_tensor("t0", a, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0),
                           gpu_tensor("t1", b, shapes[1], 2, WSYNC_DTYPE_FLOAT, 32, 0)};
    wsync_chunk_t ch = tu_chunk(t, 2, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(e, &req);
    uint8_t verdict = engine_verdict(e);
    wsync_blob_free(&req);
    if (verdict == 0) OK(wsync_sender_flush(tx, 5000));
    return verdict;
}

static void the_fake_counts_memory_freed_while_an_engine_maps_it(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", &e, 1, &s, &init, &tx);
    void *a = dalloc(64 * 32 * 4), *b = dalloc(4096);
    assert_int_equal(sync_two(tx, &e, a, b, 1), 0);
    long long before = drv.freed_while_imported();
    drv.cuMemFree((CUdeviceptr)(uintptr_t)a); /* version 1 still uses it: the engine maps it */
    assert_int_equal(drv.freed_while_imported() - before, 1);
    engine_finish(&e);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)b);
}

static void unpacked_memory_a_version_no_longer_uses_is_freed_after_wait_released(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", &e, 1, &s, &init, &tx);
    void *a = dalloc(64 * 32 * 4), *b = dalloc(4096);
    assert_int_equal(sync_two(tx, &e, a, b, 1), 0);
    /* The trainer moves t0 (an optimizer re-allocates it); version 2 no longer names old a. */
    void *moved = dalloc(64 * 32 * 4);
    assert_int_equal(sync_two(tx, &e, moved, b, 2), 0);
    long long before = drv.freed_while_imported();
    OK(wsync_sender_wait_released(tx, 2, 5000));
    drv.cuMemFree((CUdeviceptr)(uintptr_t)a);
    assert_int_equal(drv.freed_while_imported() - before, 0);
    /* Versions not finished by this sender, and negative timeouts, are refused by name. */
    EXPECT_ERR(wsync_sender_wait_released(tx, 3, 0), WSYNC_ERR_INVALID_ARGUMENT, "version 3");
    EXPECT_ERR(wsync_sender_wait_released(tx, 2, -1), WSYNC_ERR_INVALID_ARGUMENT, "timeout_ms");
    /* Memory version 2 still uses stays mapped until the engine is gone. */
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_wait_released(tx, WSYNC_ALL_VERSIONS, 200), WSYNC_ERR_TIMEOUT,
               "receivers [0] still map");
    assert_true(tu_now_ms() - t0 < 2000);
    size_t n = 0;
    OK(wsync_sender_failure_count(tx, &n));
    assert_int_equal(n, 1);
    struct wsync_fake_stats es = engine_finish(&e);
    assert_int_equal(es.ipc_open, 3);
    assert_int_equal(es.ipc_live, 0);
    OK(wsync_sender_wait_released(tx, WSYNC_ALL_VERSIONS, 2000));
    drv.cuMemFree((CUdeviceptr)(uintptr_t)moved);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)b);
    assert_int_equal(drv.freed_while_imported() - before, 0);
    trainer_end(tx, s, &init);
}

static void destroying_a_packed_sender_waits_for_engines_to_unmap_its_buckets(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 0, 0, 0, 300};
    engine_t e = engine_start(&c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"release_timeout_ms\": 5000}", &e, 1, &s, &init, &tx);
    void *a = dalloc(64 * 32 * 4), *b = dalloc(4096);
    assert_int_equal(sync_two(tx, &e, a, b, 1), 0);
    long long before = drv.freed_while_imported();
    assert_int_equal(tu_send_frame(e.to, NULL, 0), 0); /* the engine ends 300 ms from now */
    long t0 = tu_now_ms();
    wsync_sender_destroy(tx); /* frees the buckets once the engine has unmapped them */
    long took = tu_now_ms() - t0;
    assert_int_equal(drv.freed_while_imported() - before, 0);
    assert_true(took >= 200 && took < 4000);
    struct wsync_fake_stats es;
    assert_int_equal(tu_read_all(e.from, &es, sizeof es, 20000), 0);
    assert_int_equal(tu_wait_child(e.pid, 20000), 0);
    close(e.to);
    close(e.from);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)a);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)b);
}

static void destroying_a_packed_sender_leaves_buckets_an_engine_still_maps_allocated(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"release_timeout_ms\": 300}", &e, 1, &s, &init, &tx);
    void *a = dalloc(64 * 32 * 4), *b = dalloc(4096);
    assert_int_equal(sync_two(tx, &e, a, b, 1), 0);
    long long before = drv.freed_while_imported();
    long t0 = tu_now_ms();
    wsync_sender_destroy(tx); /* the engine serves on: bounded wait, then the buckets stay */
    long took = tu_now_ms() - t0;
    assert_true(took >= 250 && took < 3000);
    assert_int_equal(drv.freed_while_imported() - before, 0);
    engine_finish(&e);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)a);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)b);
}

static void unpacked_refuses_unexportable_memory_naming_the_tensor_and_packed_true(void **state) {
    (void)state;
    use_device(0);
    CUdeviceptr pool = 0;
    assert_int_equal(drv.alloc_unexportable(&pool, 64 * 32 * 4), 0);
    wsync_tensor_t t = gpu_tensor("layers.0.w", (void *)(uintptr_t)pool, shapes[0], 2,
                                  WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", NULL, 0, &s, &init, &tx);
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_UNSUPPORTED,
               "tensor 'layers.0.w' lives in memory that cannot be exported");
    assert_non_null(strstr(wsync_last_error(), "packed: true"));
    uint64_t v = 0;
    OK(wsync_sender_version(tx, &v));
    assert_int_equal(v, 1); /* refused input: nothing published, the version untouched */
    trainer_end(tx, s, &init);
    /* packed: true copies it into an exportable bucket. */
    ipc_trainer("{\"bucket_bytes\": 65536}", NULL, 0, &s, &init, &tx);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    wsync_blob_free(&req);
    trainer_end(tx, s, &init);
    drv.cuMemFree(pool);
}

/* A tensor the pack kernel cannot read (host memory labelled CUDA by a buggy binding, a shape
 * larger than its allocation) is refused by name before anything is launched: a kernel that
 * faults ends the trainer's CUDA context (the fake fails the stream for good, as a sticky
 * error). Until 2026-11-27 the pack ran and the send failed with CUDA_ERROR_ILLEGAL_ADDRESS, and
 * every later send of the sender failed the same way. Now the sender keeps working: the next
 * chunk reaches the engine bit for bit. */
static void packed_sources_the_driver_does_not_know_are_refused_and_the_sender_keeps_working(
    void **state) {
    (void)state;
    engine_t e[1] = {ipc_engine(0)};
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"receivers\": 1, \"bucket_bytes\": 65536}", e, 1, &s, &init, &tx);
    const size_t n = (size_t)shapes[0][0] * shapes[0][1] * 4;
    void *host = malloc(n);
    assert_non_null(host);
    tu_fill(host, n, 1, 0);
    wsync_tensor_t t = gpu_tensor("layers.0.w", host, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "cuda_ipc: tensor 'layers.0.w' (8192 bytes at 0x");
    assert_non_null(strstr(wsync_last_error(), "is not memory the CUDA driver knows"));
    /* Device memory, but a shape of 1 TiB: its last byte is outside every allocation. (A shape
     * just past the allocation could end in a neighbouring mapping, which the check accepts as
     * a real GPU would read it: seen once under ASan's address layout.) */
    void *small = dalloc(n / 2);
    const int64_t huge[2] = {(int64_t)1 << 20, (int64_t)1 << 18};
    t = gpu_tensor("layers.0.w", small, huge, 2, WSYNC_DTYPE_FLOAT, 32, 0);
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "runs past the memory the CUDA driver knows (its allocation holds 4096 bytes");
    uint64_t v = 0;
    OK(wsync_sender_version(tx, &v));
    assert_int_equal(v, 1); /* refused input: nothing published, the version untouched */
    struct wsync_fake_stats before = stats_now();
    void *good[NT];
    wsync_tensor_t ts[NT];
    for (int k = 0; k < NT; ++k) {
        const size_t bytes = (size_t)shapes[k][0] * shapes[k][1] * 4;
        good[k] = dalloc(bytes);
        tu_fill(good[k], bytes, 1, (uint64_t)k);
        ts[k] = gpu_tensor(names[k], good[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    }
    ch = tu_chunk(ts, NT, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e[0], &req);
    assert_int_equal(engine_verdict(&e[0]), 0);
    wsync_blob_free(&req);
    OK(wsync_sender_flush(tx, 5000));
    assert_int_equal(stats_now().kernel_launches - before.kernel_launches, 1);
    engine_finish(&e[0]);
    trainer_end(tx, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)good[k]);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)small);
    free(host);
}

/* A float32 source off a 4-byte boundary with a cast: the kernel's loads would fault (on an
 * H200: CUDA_ERROR_MISALIGNED_ADDRESS, which ends the trainer's CUDA context). Refused by name
 * before anything is queued; the version is untouched and the next chunk goes through. */
static void a_misaligned_float32_source_for_a_cast_is_refused_before_the_launch(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 1, 0, 0, 0};
    engine_t e = engine_start(&c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"dtype\": \"bfloat16\", \"bucket_bytes\": 65536}", &e, 1, &s, &init, &tx);
    const size_t n = (size_t)shapes[0][0] * shapes[0][1] * 4;
    uint8_t *base = (uint8_t *)dalloc(n + 16);
    wsync_tensor_t t = gpu_tensor(names[0], base + 2, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    struct wsync_fake_stats before = stats_now();
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "tensor 't0' (float32 at 0x");
    assert_non_null(strstr(wsync_last_error(), "is not 4-byte aligned"));
    assert_int_equal(stats_now().kernel_launches, before.kernel_launches); /* nothing queued */
    uint64_t v = 0;
    OK(wsync_sender_version(tx, &v));
    assert_int_equal(v, 1);
    /* The same bytes from an aligned address: sent, cast and checked by the engine. */
    float *aligned = (float *)dalloc(n);
    for (size_t i = 0; i < n / 4; ++i) aligned[i] = tu_float(1, 0, i);
    t = gpu_tensor(names[0], aligned, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e, &req);
    assert_int_equal(engine_verdict(&e), 0);
    wsync_blob_free(&req);
    OK(wsync_sender_flush(tx, 5000));
    engine_finish(&e);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)base);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)aligned);
}

/* A GPU older than compute capability 8.0 runs none of libwsync's kernels (PTX for
 * compute_80): the kernel paths are UNAVAILABLE by name when the sender binds its GPU (its
 * first chunk), instead of a module-load error; per-allocation without a cast needs no kernel. */
static void a_gpu_below_compute_capability_8_is_unavailable_for_the_kernel_paths(void **state) {
    (void)state;
    setenv("WSYNC_FAKE_CUDA_CC", "7.5", 1);
    use_device(0);
    const size_t n = (size_t)shapes[0][0] * shapes[0][1] * 4;
    void *data = dalloc(n);
    wsync_tensor_t t = gpu_tensor(names[0], data, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    /* Packed: the sender binds its GPU at the first chunk, and refuses it by name. */
    ipc_trainer("{\"receivers\": 1, \"bucket_bytes\": 65536}", NULL, 0, &s, &init, &tx);
    struct wsync_fake_stats before = stats_now();
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_UNAVAILABLE,
               "has compute capability 7.5");
    assert_non_null(strstr(wsync_last_error(), "the pack kernel"));
    assert_non_null(strstr(wsync_last_error(), "need 8.0 or newer"));
    assert_int_equal(stats_now().modules_loaded, before.modules_loaded); /* no kernel loaded */
    trainer_end(tx, s, &init);
    /* Per-allocation without a cast runs no kernel: the chunk is published. */
    ipc_trainer("{\"receivers\": 1, \"packed\": false}", NULL, 0, &s, &init, &tx);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    wsync_blob_free(&req);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)data);
    unsetenv("WSYNC_FAKE_CUDA_CC");
}

/* ---- cuda_ipc: waits with deadlines on the library's own events (issue 10 B) --------------- */
static void *release_held_after(void *ms) {
    usleep((useconds_t)(uintptr_t)ms * 1000);
    drv.stream_release_held();
    return NULL;
}

/* Holds `stream` (NULL: the legacy default stream) from now on; another thread, which the
 * caller joins, releases every held stream `ms` later. */
static pthread_t hold_stream_for(void *stream, int ms) {
    assert_int_equal(drv.stream_hold(stream), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_held_after, (void *)(uintptr_t)ms), 0);
    return th;
}

/* ---- wsync_recv_apply: the kernel table grows while earlier work is still queued ------------ */
#define APPLY_MANY 100
/* An engine with a destination table over APPLY_MANY small tensors. Chunk 0 (one tensor) is
 * applied with the loader's stream held, so its launch stays queued; chunk 1 (the other 99)
 * needs a larger kernel table. Freeing the old table there would wait for the whole device
 * (cuMemFree synchronises), i.e. for the held stream: a hang with no deadline. Verdicts: 0, or
 * 40 + the step that failed; 50: chunk 1's apply blocked. */
static int growing_engine(const void *cfg, int in, int out) {
    (void)cfg;
    uint8_t *init;
    size_t len;
    if (tu_recv_frame(in, &init, &len, 20000) || !init) return 10;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    if (wsync_strategy_create("cuda_ipc", "{\"device\": 0}", &s) != WSYNC_OK ||
        wsync_receiver_create(s, init, len, 0, &r) != WSYNC_OK)
        return 11;
    free(init);
    use_device(0);
    static char names[APPLY_MANY][8];
    static const int64_t shape[1] = {64};
    wsync_dest_t d[APPLY_MANY];
    memset(d, 0, sizeof d);
    uint8_t *mem = (uint8_t *)dalloc(APPLY_MANY * 256);
    memset(mem, 0, APPLY_MANY * 256);
    for (int k = 0; k < APPLY_MANY; ++k) {
        snprintf(names[k], sizeof names[k], "t%d", k);
        d[k].name = names[k];
        d[k].data = mem + 256 * k;
        d[k].shape = shape;
        d[k].ndim = 1;
        d[k].dtype.code = WSYNC_DTYPE_FLOAT;
        d[k].dtype.bits = 32;
        d[k].dtype.lanes = 1;
    }
    wsync_dest_table_t *table;
    if (wsync_dest_table_create(r, d, APPLY_MANY, &table) != WSYNC_OK) return 12;
    pthread_t th;
    for (int chunk = 0; chunk < 2; ++chunk) {
        uint8_t *req;
        if (tu_recv_frame(in, &req, &len, 20000) || !req) return 13;
        uint8_t verdict = 0;
        wsync_recv_t *it;
        if (wsync_receiver_receive(r, req, len, &it) != WSYNC_OK) return 14;
        free(req);
        if (chunk == 0) th = hold_stream_for(NULL, 600); /* the loader's (legacy) stream */
        const long t0 = tu_now_ms();
        if (wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, NULL) != WSYNC_OK) {
            fprintf(stderr, "engine: apply: %s\n", wsync_last_error());
            verdict = (uint8_t)(41 + chunk);
        }
        if (chunk == 1 && tu_now_ms() - t0 > 300) verdict = 50; /* waited for the held stream */
        if (wsync_recv_end(it) != WSYNC_OK) verdict = (uint8_t)(43 + chunk);
        if (tu_write_all(out, &verdict, 1)) return 15;
    }
    pthread_join(th, NULL);
    drv.cuCtxSynchronize();
    uint8_t verdict = 0;
    for (int k = 0; k < APPLY_MANY; ++k)
        if (!tu_check(mem + 256 * k, 256, 1, (uint64_t)k)) verdict = 46;
    wsync_dest_table_destroy(table);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)mem);
    return tu_write_all(out, &verdict, 1) ? 16 : 0;
}

static void an_apply_whose_kernel_table_grows_does_not_wait_for_queued_work(void **state) {
    (void)state;
    engine_t e = tu_fork_peer(growing_engine, NULL);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"receivers\": 1, \"packed\": false}", &e, 1, &s, &init, &tx);
    static char names[APPLY_MANY][8];
    static const int64_t shape[1] = {64};
    wsync_tensor_t t[APPLY_MANY];
    uint8_t *mem = (uint8_t *)dalloc(APPLY_MANY * 256);
    for (int k = 0; k < APPLY_MANY; ++k) {
        snprintf(names[k], sizeof names[k], "t%d", k);
        tu_fill(mem + 256 * k, 256, 1, (uint64_t)k);
        t[k] = gpu_tensor(names[k], mem + 256 * k, shape, 1, WSYNC_DTYPE_FLOAT, 32, 0);
    }
    wsync_chunk_t first = tu_chunk(t, 1, 0), rest = tu_chunk(t + 1, APPLY_MANY - 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &first, &req));
    engine_send(&e, &req);
    wsync_blob_free(&req);
    assert_int_equal(engine_verdict(&e), 0);
    OK(wsync_sender_send_chunk(tx, &rest, &req));
    engine_send(&e, &req);
    wsync_blob_free(&req);
    assert_int_equal(engine_verdict(&e), 0); /* 50: the apply waited for the held stream */
    OK(wsync_sender_flush(tx, 5000));
    assert_int_equal(engine_verdict(&e), 0); /* every destination bit for bit */
    assert_int_equal(tu_wait_child(e.pid, 20000), 0);
    close(e.to);
    close(e.from);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)mem);
}

static void sender_does_not_wait_for_work_on_other_streams(void **state) {
    (void)state;
    use_device(0);
    void *collective = NULL; /* a training collective that does not finish meanwhile */
    assert_int_equal(drv.cuStreamCreate(&collective, 1 /* non-blocking */), 0);
    pthread_t th = hold_stream_for(collective, 1500);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false, \"timeout_ms\": 10000}", NULL, 0, &s, &init, &tx);
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    long t0 = tu_now_ms();
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    assert_true(tu_now_ms() - t0 < 1000);
    pthread_join(th, NULL);
    wsync_blob_free(&req);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)d);
}

static void sender_times_out_naming_the_chunk_when_the_default_stream_does_not_drain(void **state) {
    (void)state;
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"timeout_ms\": 400}", NULL, 0, &s, &init, &tx);
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    pthread_t th = hold_stream_for(NULL, 1500); /* the trainer's own stream never drains */
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_TIMEOUT,
               "legacy default stream of GPU-");
    long took = tu_now_ms() - t0;
    assert_non_null(strstr(wsync_last_error(), "chunk 0 of version 1"));
    assert_true(took >= 350 && took < 2000);
    pthread_join(th, NULL);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)d);
}

/* Issue 10, defect 4: the caller names the stream its writes are queued on
 * (wsync_sender_set_stream); the sender then orders itself after that stream, not after the
 * legacy default stream. With the caller's stream held, send_chunk times out naming it; with
 * the default stream held instead, send_chunk does not wait for it. NULL restores the default. */
static void a_sender_given_the_callers_stream_orders_after_it_and_not_the_default_stream(void **state) {
    (void)state;
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"timeout_ms\": 400}", NULL, 0, &s, &init, &tx);
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    void *mine = NULL;
    assert_int_equal(drv.cuStreamCreate(&mine, 1 /* non-blocking */), 0);
    OK(wsync_sender_set_stream(tx, mine));
    pthread_t th = hold_stream_for(mine, 1500); /* the trainer's writes are still queued there */
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_TIMEOUT, "the caller's stream 0x");
    assert_true(tu_now_ms() - t0 < 1500);
    pthread_join(th, NULL);
    th = hold_stream_for(NULL, 1500); /* now the default stream never drains */
    t0 = tu_now_ms();
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    assert_true(tu_now_ms() - t0 < 1000);
    wsync_blob_free(&req);
    OK(wsync_sender_set_stream(tx, NULL)); /* back to the legacy default stream: it waits */
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &req), WSYNC_ERR_TIMEOUT,
               "legacy default stream of GPU-");
    pthread_join(th, NULL);
    EXPECT_ERR(wsync_sender_set_stream(NULL, mine), WSYNC_ERR_INVALID_ARGUMENT, "sender");
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)d);
}

/* Issue 9 observation 6 on cuda_ipc: a restarted engine could not re-attach once the board's
 * name was gone. Engine A completes version 1 (every process attached: the name is removed), is
 * SIGKILLed, and the trainer's flush of version 2 names it (PEER, < 2 s). Engine B starts with
 * the same index, gets the board's descriptor from the trainer over its rendezvous socket, and
 * version 3 reaches it bit for bit. Left behind: no name in /dev/shm at any point after v1. */
static void cuda_ipc_engine_restarted_after_the_name_is_gone_reattaches_and_gets_the_next_version(
    void **state) {
    (void)state;
    /* Both engine processes are forked before this process touches the driver (a child forked
     * after cuInit cannot use it); B, the restarted engine, idles until it gets the init info. */
    engine_t a = ipc_engine(0), b = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536}", &a, 1, &s, &init, &tx);
    void *x = dalloc(64 * 32 * 4), *y = dalloc(7 * 3 * 4);
    assert_int_equal(sync_two(tx, &a, x, y, 1), 0);
    assert_false(tu_segment_named_in(init.data, init.size)); /* all attached: the name is gone */
    kill(a.pid, SIGKILL);
    tu_wait_child(a.pid, 5000);
    close(a.to);
    close(a.from);
    tu_fill(x, 64 * 32 * 4, 2, 0);
    wsync_tensor_t t = gpu_tensor("t0", x, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    wsync_blob_free(&req);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(tx, 5000), WSYNC_ERR_PEER, "receiver 0");
    assert_true(tu_now_ms() - t0 < 2000);
    engine_send(&b, &init);
    usleep(300 * 1000); /* B attaches (through the trainer's socket) before version 3 begins */
    assert_int_equal(sync_two(tx, &b, x, y, 3), 0);
    assert_false(tu_segment_named_in(init.data, init.size));
    engine_finish(&b);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)x);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)y);
}

/* ---- cuda_ipc: one outcome for engine and trainer (issue 10 C) ----------------------------- */
static void a_failed_engine_synchronise_fails_recv_end_and_flush_alike(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 0, 0, 1, 0};
    engine_t e = engine_start(&c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536}", &e, 1, &s, &init, &tx);
    void *d = dalloc(64 * 32 * 4);
    tu_fill(d, 64 * 32 * 4, 1, 0);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e, &req);
    uint8_t verdict = engine_verdict(&e);
    /* The engine's wsync_recv_end failed, with this status ... */
    assert_true(verdict & 0x80);
    wsync_status_t engine_status = (wsync_status_t)(verdict & 0x7f);
    assert_int_not_equal(engine_status, WSYNC_OK);
    /* ... and the trainer's flush reports the same failure of the same chunk. */
    EXPECT_ERR(wsync_sender_flush(tx, 3000), WSYNC_ERR_PEER, "receiver 0");
    size_t n = 0;
    OK(wsync_sender_failure_count(tx, &n));
    assert_int_equal(n, 1);
    wsync_failure_t f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
    OK(wsync_sender_failure(tx, 0, &f));
    assert_int_equal(f.what, WSYNC_FAILURE_FAILED);
    assert_int_equal(f.status, engine_status);
    assert_int_equal(f.receiver, 0);
    assert_int_equal(f.version, 1);
    assert_int_equal(f.chunk_index, 0);
    assert_non_null(strstr(f.message, "legacy default stream"));
    wsync_blob_free(&req);
    engine_finish(&e);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)d);
}

/* ---- cuda_ipc: several senders (issue 10 D, issue 9 observation 5) ------------------------- */
/* Each of two senders (GPU g) sends its part of one chunk of version v; merged for engine e. */
static void two_sender_chunk(wsync_sender_t *tx[2], void *data[2], uint64_t v, int only,
                             wsync_blob_t parts[2]) {
    for (int g = 0; g < 2; ++g) {
        if (only >= 0 && g != only) continue;
        tu_fill(data[g], 64 * 32 * 4, v, 0);
        wsync_tensor_t t = gpu_tensor("t0", data[g], shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, g);
        wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
        OK(wsync_sender_send_chunk(tx[g], &ch, &parts[g]));
    }
}

static void two_senders_setup(engine_cfg *cfg, engine_t *e, wsync_strategy_t **s, wsync_blob_t *init,
                              wsync_sender_t *tx[2], void *data[2]) {
    *e = engine_start(cfg);
    use_device(0);
    OK(wsync_strategy_create("cuda_ipc", "{\"senders\": 2, \"bucket_bytes\": 65536}", s));
    OK(wsync_strategy_create_init_info(*s, init));
    engine_send(e, init);
    for (int g = 0; g < 2; ++g) {
        use_device(g);
        OK(wsync_sender_create(*s, init->data, init->size, &tx[g]));
        data[g] = dalloc(64 * 32 * 4);
    }
}

static void every_cuda_ipc_senders_flush_reports_an_engines_failure(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 0, 1, 0, 0};
    engine_t e;
    wsync_strategy_t *s;
    wsync_blob_t init, parts[2], merged;
    wsync_sender_t *tx[2];
    void *data[2];
    two_senders_setup(&c0, &e, &s, &init, tx, data);
    two_sender_chunk(tx, data, 1, -1, parts);
    OK(wsync_request_merge(parts, 2, &merged));
    engine_send(&e, &merged);
    assert_int_equal(engine_verdict(&e), 4); /* the loader failed version 1 */
    for (int g = 0; g < 2; ++g) {
        EXPECT_ERR(wsync_sender_flush(tx[g], 3000), WSYNC_ERR_PEER, "the loader refused tensor t0");
        size_t n = 0;
        OK(wsync_sender_failure_count(tx[g], &n));
        assert_int_equal(n, 1);
        wsync_failure_t f;
        memset(&f, 0, sizeof f);
        f.struct_size = sizeof f;
        OK(wsync_sender_failure(tx[g], 0, &f));
        assert_int_equal(f.what, WSYNC_FAILURE_FAILED);
        assert_int_equal(f.status, WSYNC_ERR_MISMATCH);
        assert_int_equal(f.receiver, 0);
        assert_int_equal(f.version, 1);
        wsync_blob_free(&parts[g]);
    }
    wsync_blob_free(&merged);
    engine_finish(&e);
    for (int g = 0; g < 2; ++g) wsync_sender_destroy(tx[g]);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

static void a_cuda_ipc_senders_flush_waits_only_for_its_own_chunks(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0}", NULL, 0, 0, 0, 0, 0, 0};
    engine_t e;
    wsync_strategy_t *s;
    wsync_blob_t init, parts[2], merged;
    wsync_sender_t *tx[2];
    void *data[2];
    two_senders_setup(&c0, &e, &s, &init, tx, data);
    two_sender_chunk(tx, data, 1, -1, parts);
    OK(wsync_request_merge(parts, 2, &merged));
    engine_send(&e, &merged);
    assert_int_equal(engine_verdict(&e), 0);
    wsync_blob_free(&merged);
    for (int g = 0; g < 2; ++g) wsync_blob_free(&parts[g]);
    /* Sender 0 runs ahead with version 2; the engine cannot have it yet (no merged request). */
    two_sender_chunk(tx, data, 2, 0, parts);
    OK(wsync_sender_flush(tx[1], 300)); /* its own chunks are acknowledged */
    EXPECT_ERR(wsync_sender_flush(tx[0], 300), WSYNC_ERR_TIMEOUT, "receivers [0]");
    two_sender_chunk(tx, data, 2, 1, parts);
    OK(wsync_request_merge(parts, 2, &merged));
    engine_send(&e, &merged);
    assert_int_equal(engine_verdict(&e), 0);
    for (int g = 0; g < 2; ++g) OK(wsync_sender_flush(tx[g], 3000));
    for (int g = 0; g < 2; ++g) wsync_blob_free(&parts[g]);
    wsync_blob_free(&merged);
    engine_finish(&e);
    for (int g = 0; g < 2; ++g) wsync_sender_destroy(tx[g]);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

static void a_destroyed_cuda_ipc_sender_is_not_counted_as_attached(void **state) {
    (void)state;
    use_device(0);
    wsync_strategy_t *s, *other, *rs;
    wsync_blob_t init, req;
    wsync_sender_t *tx, *restarted, *rank1;
    wsync_receiver_t *rx;
    OK(wsync_strategy_create("cuda_ipc", "{\"senders\": 2, \"bucket_bytes\": 65536}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    OK(wsync_strategy_create("cuda_ipc", "{\"device\": 1}", &rs));
    OK(wsync_receiver_create(rs, init.data, init.size, 0, &rx)); /* every receiver is present */
    /* Rank 0's sender is destroyed and made again (a restarted trainer rank). */
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    wsync_sender_destroy(tx);
    OK(wsync_sender_create(s, init.data, init.size, &restarted));
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(restarted, &ch, &req)); /* counts attached senders */
    wsync_receiver_destroy(rx);
    /* Rank 1 (another process: its own strategy) attaches by name: one sender was still
     * missing, so the name must still be there. */
    OK(wsync_strategy_create("cuda_ipc", NULL, &other));
    use_device(1);
    OK(wsync_sender_create(other, init.data, init.size, &rank1));
    wsync_blob_free(&req);
    wsync_sender_destroy(rank1);
    wsync_sender_destroy(restarted);
    wsync_strategy_destroy(other);
    wsync_strategy_destroy(rs);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    use_device(0);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)d);
}

/* ---- nccl_broadcast ----------------------------------------------------------------------- */
/* Two engines, receivers 0 and 1, each alone on its fake GPU; the trainer then on GPU 0, its
 * strategy for both made with `options` and its init info made. */
static void nccl_two_engines(engine_t e[2], const char *options, wsync_strategy_t **s, wsync_blob_t *init) {
    static engine_cfg c[2] = {{"nccl_broadcast", "{\"device\": 0}", NCCL_ENGINE_GPUS, 0, 0, 0, 0, 0, 0},
                              {"nccl_broadcast", "{\"device\": 1}", NCCL_ENGINE_GPUS, 1, 0, 0, 0, 0, 0}};
    nccl_three_gpus();
    for (int i = 0; i < 2; ++i) e[i] = engine_start(&c[i]);
    use_device(0);
    OK(wsync_strategy_create("nccl_broadcast", options, s));
    OK(wsync_strategy_create_init_info(*s, init));
}

static void nccl_broadcast_reaches_two_engines_bit_for_bit(void **state) {
    (void)state;
    engine_t e[2];
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    nccl_two_engines(e, "{\"receivers\": 2, \"bucket_bytes\": 65536, \"timeout_ms\": 10000}", &s, &init);
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &init);
    OK(wsync_sender_create(s, init.data, init.size, &tx)); /* joins the group of 3 */
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    for (uint64_t v = 1; v <= 4; ++v) {
        wsync_tensor_t t[NT];
        wsync_blob_t req[2];
        for (int k = 0; k < NT; ++k) {
            tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
            t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        }
        /* Both chunks are queued before any engine receives: the double buffer at work. */
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            OK(wsync_sender_send_chunk(tx, &ch, &req[c]));
        }
        for (int c = 0; c < 2; ++c) {
            for (int i = 0; i < 2; ++i) engine_send(&e[i], &req[c]);
            for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
            wsync_blob_free(&req[c]);
        }
        OK(wsync_sender_flush(tx, 5000));
    }
    for (int i = 0; i < 2; ++i) engine_finish(&e[i]);
    trainer_end(tx, s, &init);
}

/* The trainer's control port (its receivers' reports) as a stranger finds it: the port from the
 * init info (anyone on the network can scan for it). Returns a connected socket. */
static int nccl_control_connect(const wsync_blob_t *init) {
    char *json;
    OK(wsync_blob_describe(init->data, init->size, &json));
    const char *at = strstr(json, "\"port\": ");
    assert_non_null(at);
    int port = atoi(at + 8);
    wsync_string_free(json);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Strangers on the control port without the init info's key: 40 silent connections made before
 * the engines connect (a flood), a hello claiming receiver 1 with a made-up MAC, an
 * acknowledgement sent without a hello, and bytes that are not frames. The engines' own
 * connections are taken and the strangers' refused: each version's flush succeeds once both
 * engines loaded it. */
static void nccl_strangers_on_the_control_port_are_refused_and_the_engines_report(void **state) {
    (void)state;
    engine_t e[2];
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    nccl_two_engines(e, "{\"receivers\": 2, \"bucket_bytes\": 65536, \"timeout_ms\": 10000, "
                        "\"control_interface\": \"lo\"}", &s, &init);
    int strangers[44];
    for (int i = 0; i < 44; ++i) strangers[i] = nccl_control_connect(&init);
    uint8_t frame[32 + 16 + 32] = {0};
    const uint32_t magic = 0x4e435743, hello = 1, ack = 3;
    const uint64_t index1 = (uint64_t)1 << 32;
    memcpy(frame, &magic, 4), memcpy(frame + 4, &hello, 4), memcpy(frame + 16, &index1, 8);
    frame[28] = 16; /* a nonce; the MAC after it is made up */
    assert_int_equal(write(strangers[40], frame, sizeof frame), (ssize_t)sizeof frame);
    memcpy(frame + 4, &ack, 4), frame[28] = 0;
    assert_int_equal(write(strangers[41], frame, 64), 64);
    memset(frame, 0xab, sizeof frame);
    assert_int_equal(write(strangers[42], frame, sizeof frame), (ssize_t)sizeof frame);
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &init);
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    for (uint64_t v = 1; v <= 2; ++v) {
        wsync_blob_t req;
        tu_fill(d, 64 * 32 * 4, v, 0);
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        for (int i = 0; i < 2; ++i) engine_send(&e[i], &req);
        for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
        OK(wsync_sender_flush(tx, 5000));
        wsync_blob_free(&req);
    }
    for (int i = 0; i < 44; ++i) close(strangers[i]);
    for (int i = 0; i < 2; ++i) engine_finish(&e[i]);
    trainer_end(tx, s, &init);
}

/* Receivers report to the control channel that create_init_info opened, so only the strategy
 * that made the init info makes its sender: another strategy is refused at once, naming why,
 * before it joins the group. */
static void nccl_a_sender_is_made_only_by_the_strategy_that_made_the_init_info(void **state) {
    (void)state;
    nccl_three_gpus();
    use_device(0);
    wsync_strategy_t *s, *other;
    wsync_blob_t init;
    wsync_sender_t *tx = (wsync_sender_t *)1;
    OK(wsync_strategy_create("nccl_broadcast", "{\"timeout_ms\": 300}", &s));
    OK(wsync_strategy_create("nccl_broadcast", "{\"timeout_ms\": 300}", &other));
    OK(wsync_strategy_create_init_info(s, &init));
    EXPECT_ERR(wsync_sender_create(other, init.data, init.size, &tx), WSYNC_ERR_INVALID_ARGUMENT,
               "did not make the init info");
    assert_null(tx);
    wsync_strategy_destroy(other);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* The trainer's control port stays with the process that opened it: a child it forked (a
 * data-loader worker) holds no copy, so once the strategy that made the init info is gone a
 * receiver is refused at once, naming the control channel, instead of connecting to the
 * child's copy and waiting for a group that never forms. */
static void nccl_a_forked_child_keeps_no_copy_of_the_control_port(void **state) {
    (void)state;
    nccl_three_gpus();
    use_device(0);
    wsync_strategy_t *s, *rs;
    wsync_blob_t init;
    wsync_receiver_t *rx = (wsync_receiver_t *)1;
    OK(wsync_strategy_create("nccl_broadcast", "{\"control_interface\": \"lo\"}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    if (child == 0) { /* its fork handlers have run when fork returns here */
        if (write(ready[1], "r", 1) != 1) _exit(1);
        sleep(5);
        _exit(0);
    }
    char r;
    assert_int_equal(read(ready[0], &r, 1), 1);
    close(ready[0]), close(ready[1]);
    wsync_strategy_destroy(s);
    OK(wsync_strategy_create("nccl_broadcast", "{\"device\": 1, \"timeout_ms\": 3000}", &rs));
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_receiver_create(rs, init.data, init.size, 0, &rx), WSYNC_ERR_PEER,
               "could not reach the sender's control channel");
    assert_true(tu_now_ms() - t0 < 2500); /* not the 3000 ms of a group that never forms */
    assert_null(rx);
    kill(child, SIGKILL);
    assert_int_equal(tu_wait_child(child, 5000), 128 + SIGKILL);
    wsync_strategy_destroy(rs);
    wsync_blob_free(&init);
}

static void nccl_group_that_never_completes_times_out_and_aborts(void **state) {
    (void)state;
    nccl_three_gpus();
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx = (wsync_sender_t *)1;
    OK(wsync_strategy_create("nccl_broadcast", "{\"receivers\": 2, \"timeout_ms\": 500}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_ERR_TIMEOUT,
               "communicator aborted");
    assert_null(tx);
    long took = tu_now_ms() - t0;
    assert_true(took >= 450 && took < 3000);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

static void nccl_failed_broadcast_times_the_receiver_out_and_fails_flush(void **state) {
    (void)state;
    nccl_three_gpus();
    engine_cfg c0 = {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 400}", NCCL_ENGINE_GPUS, 0, 0, 0, 0, 0, 0};
    engine_t e = engine_start(&c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    OK(wsync_strategy_create("nccl_broadcast", "{\"bucket_bytes\": 65536, \"timeout_ms\": 10000}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    engine_send(&e, &init);
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    void *d = dalloc(64 * 32 * 4);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    tu_fill(d, 64 * 32 * 4, 1, 0);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e, &req);
    assert_int_equal(engine_verdict(&e), 0);
    OK(wsync_sender_flush(tx, 5000));
    wsync_blob_free(&req);
    /* The trainer's next broadcast dies on the GPU: its receiver must not wait forever. */
    drv.set_fail("ncclBroadcast@async", 0, 2 /* ncclSystemError */);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    long t0 = tu_now_ms();
    engine_send(&e, &req);
    assert_int_equal(engine_verdict(&e), 1); /* its receive failed (timeout, comm aborted) */
    long took = tu_now_ms() - t0;
    assert_true(took >= 350 && took < 5000);
    EXPECT_ERR(wsync_sender_flush(tx, 2000), WSYNC_ERR_PEER, "communicator aborted");
    /* Once aborted, the sender says so instead of hanging. */
    wsync_blob_t r3;
    EXPECT_ERR(wsync_sender_send_chunk(tx, &ch, &r3), WSYNC_ERR_PEER, "aborted by an earlier failure");
    engine_finish(&e);
    wsync_blob_free(&req);
    trainer_end(tx, s, &init);
}

/* A test control of the fake (fake_gpu.h), looked up in the library the driver came from. */
static void *fake_control(const char *name) {
    load_driver();
    void *f = dlsym(drv.h, name);
    assert_non_null(f);
    return f;
}

/* Fills tensors 0..NT-1 of version v into data[] (device memory) and describes them. */
static void nccl_fill_version(void *data[NT], wsync_tensor_t t[NT], uint64_t v) {
    for (int k = 0; k < NT; ++k) {
        tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
        t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    }
}

/* A trainer with two engines, each version sent as two chunks of NT / 2 tensors. */
typedef struct {
    engine_t e[2];
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
} nccl_group_t;

/* Forks the group's engines: before this process first uses a device (a child forked after
 * that could not use CUDA, as the fake models). */
static void nccl_group_fork(nccl_group_t *g) {
    nccl_three_gpus();
    static engine_cfg c0 = {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 10000}", NCCL_ENGINE_GPUS, 0, 0, 0, 0, 0, 0};
    static engine_cfg c1 = {"nccl_broadcast", "{\"device\": 1, \"timeout_ms\": 10000}", NCCL_ENGINE_GPUS, 1, 0, 0, 0, 0, 0};
    g->e[0] = engine_start(&c0);
    g->e[1] = engine_start(&c1);
}

/* The group's trainer: its init info goes to the engines nccl_group_fork started. */
static void nccl_group_open(nccl_group_t *g) {
    use_device(0);
    OK(wsync_strategy_create("nccl_broadcast", "{\"receivers\": 2, \"bucket_bytes\": 65536, \"timeout_ms\": 10000}", &g->s));
    OK(wsync_strategy_create_init_info(g->s, &g->init));
    for (int i = 0; i < 2; ++i) engine_send(&g->e[i], &g->init);
    OK(wsync_sender_create(g->s, g->init.data, g->init.size, &g->tx));
}

static void nccl_group_start(nccl_group_t *g) {
    nccl_group_fork(g);
    nccl_group_open(g);
}

static void nccl_group_forward(nccl_group_t *g, wsync_blob_t *req) {
    for (int i = 0; i < 2; ++i) engine_send(&g->e[i], req);
    for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&g->e[i]), 0);
    wsync_blob_free(req);
}

static void nccl_group_finish(nccl_group_t *g) {
    OK(wsync_sender_flush(g->tx, 5000));
    for (int i = 0; i < 2; ++i) engine_finish(&g->e[i]);
    wsync_sender_destroy(g->tx);
    wsync_strategy_destroy(g->s);
    wsync_blob_free(&g->init);
}

static void nccl_receiver_polls_an_in_progress_broadcast_to_completion_before_returning_views(void **state) {
    (void)state;
    wsync_fake_nccl_set_in_progress_fn in_progress =
        (wsync_fake_nccl_set_in_progress_fn)fake_control("wsync_fake_nccl_set_in_progress");
    in_progress(3); /* the engines fork with it: their broadcasts return ncclInProgress */
    nccl_group_t g;
    nccl_group_start(&g);
    in_progress(0); /* the trainer's do not */
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    for (uint64_t v = 1; v <= 3; ++v) {
        wsync_tensor_t t[NT];
        nccl_fill_version(data, t, v);
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(g.tx, &ch, &req));
            nccl_group_forward(&g, &req); /* each engine checks every byte of every view */
        }
    }
    nccl_group_finish(&g);
}

/* As cuda_ipc's: an nccl_broadcast request carried only its seq, so an engine handed another
 * group's request of the seq it expects posted a broadcast on its own communicator with the
 * other trainer's table, and then refused its own trainer's request as out of order. Engine:
 * the foreign request is refused as another trainer's (verdict 6) and no broadcast is posted;
 * its own requests then complete both versions bit for bit, as on the other group. */
static void nccl_a_request_of_another_group_is_refused_and_changes_nothing(void **state) {
    (void)state;
    nccl_group_t a, b;
    nccl_group_fork(&a);
    nccl_group_fork(&b);
    nccl_group_open(&a);
    nccl_group_open(&b);
    void *da[NT], *db[NT];
    for (int k = 0; k < NT; ++k) {
        da[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
        db[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    }
    for (uint64_t v = 1; v <= 2; ++v) {
        wsync_tensor_t ta[NT], tb[NT];
        nccl_fill_version(da, ta, v);
        nccl_fill_version(db, tb, v);
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t cha = tu_chunk(ta + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            wsync_chunk_t chb = tu_chunk(tb + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t qa, qb;
            OK(wsync_sender_send_chunk(a.tx, &cha, &qa));
            OK(wsync_sender_send_chunk(b.tx, &chb, &qb));
            engine_send(&a.e[0], &qb);
            assert_int_equal(engine_verdict(&a.e[0]), 6);
            nccl_group_forward(&a, &qa);
            nccl_group_forward(&b, &qb);
        }
    }
    nccl_group_finish(&a);
    nccl_group_finish(&b);
}

typedef struct {
    wsync_sender_t *tx;
    wsync_chunk_t chunk;
    wsync_blob_t req;
    wsync_status_t status;
} send_job_t;

static void *send_chunk_thread(void *arg) {
    send_job_t *job = (send_job_t *)arg;
    job->status = wsync_sender_send_chunk(job->tx, &job->chunk, &job->req);
    return NULL;
}

static void nccl_sender_polls_an_in_progress_broadcast_to_completion_before_reusing_its_bucket(void **state) {
    (void)state;
    nccl_group_t g;
    nccl_group_start(&g);
    ((wsync_fake_nccl_set_in_progress_fn)fake_control("wsync_fake_nccl_set_in_progress"))(1);
    void *data[3][NT]; /* one set per version: only bucket reuse can mix them up */
    wsync_tensor_t t[3][NT];
    for (uint64_t v = 1; v <= 2; ++v) {
        for (int k = 0; k < NT; ++k) data[v][k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
        nccl_fill_version(data[v], t[v], v);
    }
    wsync_blob_t req[2];
    wsync_chunk_t ch0 = tu_chunk(t[1], 3, 0), ch1 = tu_chunk(t[1] + 3, 3, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(g.tx, &ch0, &req[0]));
    OK(wsync_sender_send_chunk(g.tx, &ch1, &req[1]));
    /* The third chunk needs the first one's bucket: its send must wait until the engines have
     * received chunk 1, which they do only once they get its request, after this pause. */
    send_job_t third = {g.tx, tu_chunk(t[2], 3, 0), {0}, WSYNC_ERR_INTERNAL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, send_chunk_thread, &third), 0);
    usleep(200 * 1000);
    nccl_group_forward(&g, &req[0]); /* each engine checks every byte of every view */
    assert_int_equal(pthread_join(th, NULL), 0);
    OK(third.status);
    nccl_group_forward(&g, &req[1]);
    nccl_group_forward(&g, &third.req);
    wsync_chunk_t last = tu_chunk(t[2] + 3, 3, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(g.tx, &last, &req[0]));
    nccl_group_forward(&g, &req[0]);
    nccl_group_finish(&g);
}

static void nccl_send_chunk_returns_only_after_the_pack_has_read_the_tensors(void **state) {
    (void)state;
    nccl_group_t g;
    nccl_group_start(&g);
    /* The trainer's GPU runs late: work nobody waits for is not done when a call returns. */
    ((wsync_fake_set_stream_delay_ms_fn)fake_control("wsync_fake_set_stream_delay_ms"))(300);
    void *data[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    for (uint64_t v = 1; v <= 2; ++v) {
        wsync_tensor_t t[NT];
        nccl_fill_version(data, t, v);
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 3 * c, 3, c == 1 ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(g.tx, &ch, &req));
            /* wsync.h: the tensors "may be changed once the call returns". */
            for (int k = 3 * c; k < 3 * c + 3; ++k)
                memset(data[k], 0x5a, (size_t)shapes[k][0] * shapes[k][1] * 4);
            nccl_group_forward(&g, &req);
        }
    }
    nccl_group_finish(&g);
}

/* Destroys a sender on a thread of its own, so a destroy that never returns fails the test
 * instead of hanging it. */
typedef struct {
    wsync_sender_t *tx;
    int done;
} destroy_job_t;

static void *destroy_sender_thread(void *arg) {
    destroy_job_t *job = (destroy_job_t *)arg;
    wsync_sender_destroy(job->tx);
    __atomic_store_n(&job->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void nccl_sender_destroy_is_bounded_when_a_receiver_never_posts_its_broadcast(void **state) {
    (void)state;
    nccl_three_gpus();
    engine_cfg c0 = {"nccl_broadcast", "{\"device\": 0}", NCCL_ENGINE_GPUS, 0, 0, 0, 0, 0, 0};
    engine_t e = engine_start(&c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    OK(wsync_strategy_create("nccl_broadcast", "{\"bucket_bytes\": 65536, \"timeout_ms\": 500}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    engine_send(&e, &init);
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    void *d = dalloc(64 * 32 * 4);
    tu_fill(d, 64 * 32 * 4, 1, 0);
    wsync_tensor_t t = gpu_tensor("t0", d, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req)); /* never forwarded: rank 1 never posts it */
    destroy_job_t job = {tx, 0};
    pthread_t th;
    long t0 = tu_now_ms();
    assert_int_equal(pthread_create(&th, NULL, destroy_sender_thread, &job), 0);
    while (!__atomic_load_n(&job.done, __ATOMIC_ACQUIRE) && tu_now_ms() - t0 < 5000) usleep(1000);
    long took = tu_now_ms() - t0;
    if (!__atomic_load_n(&job.done, __ATOMIC_ACQUIRE))
        fail_msg("wsync_sender_destroy did not return within 5000 ms (teardown bound: timeout_ms 500)");
    pthread_join(th, NULL);
    assert_true(took >= 400); /* NCCL was given its bound to finish the broadcast first */
    assert_int_equal(stats_now().comms_live, 0); /* the communicator was aborted, not leaked */
    engine_finish(&e);
    wsync_blob_free(&req);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* The start of a hand-written engine process: a 30 s alarm (it never outlives its test), the
 * init info as the first frame, its strategy and receiver. 0, or the exit code to return. */
static int engine_attach(const engine_cfg *cfg, int in, wsync_strategy_t **s, wsync_receiver_t **r) {
    alarm(30);
    if (cfg->visible) setenv("CUDA_VISIBLE_DEVICES", cfg->visible, 1);
    uint8_t *init;
    size_t len;
    if (tu_recv_frame(in, &init, &len, 20000) || !init) return 10;
    int rc = wsync_strategy_create(cfg->kind, cfg->options, s) != WSYNC_OK ||
                     wsync_receiver_create(*s, init, len, cfg->index, r) != WSYNC_OK
                 ? 11
                 : 0;
    free(init);
    return rc;
}

/* An engine whose loader copies out of the first chunk's views on the legacy default stream
 * while that stream is stuck behind other work. Answers: 0 if wsync_recv_end returned OK within
 * 1 s; then 0 if the next receive failed with WSYNC_ERR_TIMEOUT naming the default stream. */
static int stalled_loader_engine_main(const engine_cfg *cfg, int in, int out) {
    uint8_t *req;
    size_t len;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    int attached = engine_attach(cfg, in, &s, &r);
    if (attached) return attached;
    use_device(0); /* the loader's own context, as the engine's framework makes it current */
    uint8_t verdict = 1;
    wsync_recv_t *it;
    if (tu_recv_frame(in, &req, &len, 20000) || !req) return 13;
    if (wsync_receiver_receive(r, req, len, &it) == WSYNC_OK) {
        CUdeviceptr mine = 0;
        wsync_tensor_t v;
        bool has;
        if (drv.stream_hold(NULL) != 0) return 12; /* the default stream stops running work */
        while (wsync_recv_next(it, &v, &has) == WSYNC_OK && has) {
            size_t n = (size_t)v.shape[0] * (size_t)v.shape[1] * 4;
            if (!mine && drv.cuMemAlloc(&mine, 1 << 20) != 0) return 14;
            if (drv.cuMemcpyDtoDAsync(mine, (CUdeviceptr)(uintptr_t)v.data, n, NULL) != 0) return 15;
        }
        long t0 = tu_now_ms();
        wsync_status_t st = wsync_recv_end(it);
        verdict = st == WSYNC_OK && tu_now_ms() - t0 < 1000 ? 0 : 2;
    }
    free(req);
    if (tu_write_all(out, &verdict, 1)) return 16;
    if (tu_recv_frame(in, &req, &len, 20000) || !req) return 17;
    wsync_status_t st = wsync_receiver_receive(r, req, len, &it);
    fprintf(stderr, "stalled engine: second receive: %s\n", wsync_last_error());
    verdict = st == WSYNC_ERR_TIMEOUT && strstr(wsync_last_error(), "default stream") ? 0 : 3;
    if (st == WSYNC_OK) wsync_recv_end(it);
    free(req);
    drv.stream_release_held();
    if (tu_write_all(out, &verdict, 1)) return 18;
    if (tu_recv_frame(in, &req, &len, 20000) || req) return 19;
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    return 0;
}

static int stalled_loader_engine_entry(const void *cfg, int in, int out) {
    return stalled_loader_engine_main((const engine_cfg *)cfg, in, out);
}

static void nccl_recv_end_does_not_wait_unbounded_for_the_loaders_default_stream(void **state) {
    (void)state;
    nccl_three_gpus();
    engine_cfg c0 = {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 400}", NCCL_ENGINE_GPUS, 0, 0, 0, 0, 0, 0};
    engine_t e = tu_fork_peer(stalled_loader_engine_entry, &c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    OK(wsync_strategy_create("nccl_broadcast", "{\"bucket_bytes\": 65536, \"timeout_ms\": 2000}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    engine_send(&e, &init);
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    nccl_fill_version(data, t, 1);
    wsync_chunk_t ch = tu_chunk(t, 3, 0);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e, &req);
    wsync_blob_free(&req);
    assert_int_equal(tu_peer_byte(&e, 5000), 0); /* recv_end returned at once */
    ch = tu_chunk(t + 3, 3, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e, &req);
    wsync_blob_free(&req);
    assert_int_equal(tu_peer_byte(&e, 5000), 0); /* the next receive timed out, naming why */
    assert_int_not_equal(wsync_sender_flush(tx, 1000), WSYNC_OK); /* rank 1 gave up on it */
    assert_int_equal(tu_send_frame(e.to, NULL, 0), 0);
    assert_int_equal(tu_wait_child(e.pid, 10000), 0);
    close(e.to);
    close(e.from);
    trainer_end(tx, s, &init);
}

/* An engine that loads every chunk with wsync_recv_copy into buffers of its own, as a GPU
 * loader does. cfg->copy_faults 0 or 2: the legacy default stream is held while chunk 1 (not the
 * last) is copied and ended, and released when chunk 2 arrives (2: with a receiver timeout
 * shorter than that); 1: chunk 1's copy faults on the GPU; 3: as 2, but the stream stays held
 * and the receiver is destroyed after the last chunk (answering 1 more byte), the stream
 * released only at the end. After each chunk it answers the recv_end status (0, else 0x80 | status) and the ms
 * recv_end took (capped at 255); after the last, its completed version. */
static int overlapping_loader_engine_main(const engine_cfg *cfg, int in, int out) {
    uint8_t *req;
    size_t len;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    int attached = engine_attach(cfg, in, &s, &r);
    if (attached) return attached;
    use_device(0);
    CUdeviceptr mine = 0;
    if (drv.cuMemAlloc(&mine, 1 << 20) != 0) return 12;
    for (int chunk = 1;; ++chunk) {
        if (tu_recv_frame(in, &req, &len, 20000)) return 13;
        if (!req) break;
        if (chunk == 2 && cfg->copy_faults != 3) drv.stream_release_held();
        wsync_recv_t *it;
        if (wsync_receiver_receive(r, req, len, &it) != WSYNC_OK) return 14;
        free(req);
        wsync_recv_info_t info = {0};
        wsync_recv_info(it, &info);
        if (chunk == 1 && cfg->copy_faults != 1 && drv.stream_hold(NULL) != 0) return 15;
        if (chunk == 1 && cfg->copy_faults == 1) drv.set_fail("cuMemcpyDtoDAsync@async", 0, 0);
        size_t at = 0;
        for (size_t i = 0; i < info.count; ++i) {
            wsync_tensor_t t;
            wsync_recv_peek(it, i, &t);
            size_t n = t.dtype.bits / 8;
            for (int d = 0; d < t.ndim; ++d) n *= (size_t)t.shape[d];
            if (wsync_recv_copy(it, i, 0, (void *)(uintptr_t)(mine + at), n) != WSYNC_OK)
                fprintf(stderr, "overlapping engine: copy: %s\n", wsync_last_error());
            at += (n + 255) / 256 * 256;
        }
        long t0 = tu_now_ms();
        wsync_status_t st = wsync_recv_end(it);
        long took = tu_now_ms() - t0;
        if (st != WSYNC_OK) fprintf(stderr, "overlapping engine: chunk %d: %s\n", chunk, wsync_last_error());
        uint8_t answer[2] = {st == WSYNC_OK ? 0 : (uint8_t)(0x80 | st), (uint8_t)(took > 255 ? 255 : took)};
        if (tu_write_all(out, answer, 2)) return 17;
        if (info.flags & WSYNC_CHUNK_LAST) {
            uint64_t v = 0;
            wsync_receiver_completed_version(r, &v);
            uint8_t b = (uint8_t)v;
            if (tu_write_all(out, &b, 1)) return 18;
            if (cfg->copy_faults == 3) {  /* destroyed while the held copies have not run */
                wsync_receiver_destroy(r);
                uint8_t done = 1;
                if (tu_write_all(out, &done, 1)) return 19;
                if (tu_recv_frame(in, &req, &len, 20000) || req) return 20;
                drv.stream_release_held();
                drv.cuCtxSynchronize();
                drv.cuMemFree(mine);
                wsync_strategy_destroy(s);
                return 0;
            }
        }
    }
    drv.cuMemFree(mine);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    return 0;
}

static void overlapping_engine_finish(engine_t *e) {
    assert_int_equal(tu_send_frame(e->to, NULL, 0), 0);
    assert_int_equal(tu_wait_child(e->pid, 20000), 0);
    close(e->to);
    close(e->from);
}

static int overlapping_loader_engine_entry(const void *cfg, int in, int out) {
    return overlapping_loader_engine_main((const engine_cfg *)cfg, in, out);
}

/* Tensors t0..t2 of version 1 in device memory of GPU 0, for the overlapping-engine tests. */
static void overlapping_tensors(void *data[3], wsync_tensor_t t[3]) {
    for (int k = 0; k < 3; ++k) {
        size_t n = (size_t)shapes[k][0] * shapes[k][1] * 4;
        data[k] = dalloc(n);
        tu_fill(data[k], n, 1, (uint64_t)k);
        t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    }
}

/* The trainer of the two tests below: a version of two chunks (tensors t0 and t1, then t2) to
 * one overlapping engine; `between` runs after the engine ended chunk 1 and before chunk 2 goes. */
static void overlapping_sync(engine_t *e, const char *trainer_opts, wsync_strategy_t **s,
                             wsync_blob_t *init, wsync_sender_t **tx, void *data[3],
                             void (*between)(engine_t *, wsync_sender_t *)) {
    ipc_trainer(trainer_opts, e, 1, s, init, tx);
    wsync_tensor_t t[3];
    overlapping_tensors(data, t);
    wsync_blob_t req;
    wsync_chunk_t ch = tu_chunk(t, 2, 0);
    OK(wsync_sender_send_chunk(*tx, &ch, &req));
    engine_send(e, &req);
    wsync_blob_free(&req);
    between(e, *tx);
    ch = tu_chunk(t + 2, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(*tx, &ch, &req));
    engine_send(e, &req);
    wsync_blob_free(&req);
}

/* One overlapping_sync to an overlapping engine with `engine_opts` and loader mode `mode`;
 * then the last chunk's recv_end answer must be `last_status` (0 or 0x80 | status) and the
 * engine's completed version `version`. */
static void run_overlapping(const char *engine_opts, int mode, const char *trainer_opts,
                            void (*between)(engine_t *, wsync_sender_t *), uint8_t last_status,
                            uint8_t version) {
    engine_cfg c0 = {"cuda_ipc", engine_opts, NULL, 0, 0, 0, 0, mode, 0};
    engine_t e = tu_fork_peer(overlapping_loader_engine_entry, &c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    void *data[3];
    overlapping_sync(&e, trainer_opts, &s, &init, &tx, data, between);
    uint8_t a[3];
    assert_int_equal(tu_read_all(e.from, a, 3, 5000), 0);
    assert_int_equal(a[0], last_status);
    assert_int_equal(a[2], version);
    if (version) OK(wsync_sender_flush(tx, 5000));
    overlapping_engine_finish(&e);
    trainer_end(tx, s, &init);
    for (int k = 0; k < 3; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

static void while_chunk_1_is_still_being_copied(engine_t *e, wsync_sender_t *tx) {
    uint8_t a[2];
    assert_int_equal(tu_read_all(e->from, a, 2, 5000), 0);
    assert_int_equal(a[0], 0);
    assert_true(a[1] < 200); /* recv_end did not wait for the held stream (its timeout: 2 s) */
    /* ...but the trainer is not told chunk 1 is done while its copies have not run. */
    EXPECT_ERR(wsync_sender_flush(tx, 300), WSYNC_ERR_TIMEOUT, "receiver 0");
}

/* Issue 10 on hardware (docs/gpu-validation.md, runs 4-5): an engine that waited in every
 * wsync_recv_end for its copies serialised its GPU with its CPU. A chunk that does not end its
 * version is acknowledged when its copies complete, not when its iteration ends; the trainer
 * still hears of it only then, and the version completes only once everything is copied. */
static void cuda_ipc_an_earlier_chunk_is_acknowledged_when_its_copies_complete_not_when_it_ends(void **state) {
    (void)state;
    run_overlapping("{\"device\": 0, \"timeout_ms\": 2000}", 0, "{\"packed\": false}",
                    while_chunk_1_is_still_being_copied, 0, 1);
}

static void chunk_1_reported_failed(engine_t *e, wsync_sender_t *tx) {
    uint8_t a[2];
    assert_int_equal(tu_read_all(e->from, a, 2, 5000), 0);
    assert_int_equal(a[0], 0); /* its iteration ended before the copy ran */
    EXPECT_ERR(wsync_sender_flush(tx, 5000), WSYNC_ERR_PEER, "chunk 0 of version 1");
}

/* A copy of an earlier chunk that fails on the GPU after its iteration ended: the trainer's
 * flush names that chunk, and the engine's wsync_recv_end of the version's last chunk fails,
 * so the version does not complete on either side. */
static void cuda_ipc_a_failed_copy_of_an_earlier_chunk_fails_the_version_on_both_sides(void **state) {
    (void)state;
    /* the last chunk reports the earlier failure; version 1 does not complete */
    run_overlapping("{\"device\": 0, \"timeout_ms\": 2000}", 1,
                    "{\"bucket_bytes\": 65536, \"buckets\": 2}", chunk_1_reported_failed,
                    0x80 | WSYNC_ERR_SYSTEM, 0);
}

static void chunk_1_reported_late(engine_t *e, wsync_sender_t *tx) {
    uint8_t a[2];
    assert_int_equal(tu_read_all(e->from, a, 2, 5000), 0);
    assert_int_equal(a[0], 0);
    EXPECT_ERR(wsync_sender_flush(tx, 5000), WSYNC_ERR_PEER, "did not finish in 300 ms");
}

/* Copies of an earlier chunk that outlive the receiver's deadline (its stream held past it):
 * the trainer hears that chunk failed with the reason, and although the stream then runs and
 * the last chunk's own copies complete, the engine's wsync_recv_end of the last chunk reports
 * the earlier failure and the version does not complete. */
static void cuda_ipc_copies_of_an_earlier_chunk_past_the_deadline_fail_the_version(void **state) {
    (void)state;
    run_overlapping("{\"device\": 0, \"timeout_ms\": 300}", 2, "{\"packed\": false}",
                    chunk_1_reported_late, 0x80 | WSYNC_ERR_TIMEOUT, 0);
}

/* After a version failed on a late earlier chunk, the trainer abandons it and sends the next:
 * that version completes on the engine (the old chunk's failure, already reported, does not
 * fail it) and bit-exact on the trainer's flush. */
static void cuda_ipc_the_version_after_a_failed_earlier_chunk_completes(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0, \"timeout_ms\": 300}", NULL, 0, 0, 0, 0, 2, 0};
    engine_t e = tu_fork_peer(overlapping_loader_engine_entry, &c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", &e, 1, &s, &init, &tx);
    void *data[3];
    wsync_tensor_t t[3];
    overlapping_tensors(data, t);
    wsync_chunk_t ch = tu_chunk(t, 2, 0);
    OK(wsync_sender_send_chunk(tx, &ch, &req)); /* version 1, chunk 0: held past 300 ms */
    engine_send(&e, &req);
    wsync_blob_free(&req);
    chunk_1_reported_late(&e, tx);
    OK(wsync_sender_abandon(tx));
    for (int c = 0; c < 2; ++c) { /* version 2: chunk 0 (the engine releases its stream), 1 */
        ch = c ? tu_chunk(t + 2, 1, WSYNC_CHUNK_LAST) : tu_chunk(t, 2, 0);
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        engine_send(&e, &req);
        wsync_blob_free(&req);
        uint8_t a[2];
        assert_int_equal(tu_read_all(e.from, a, 2, 5000), 0);
        assert_int_equal(a[0], 0);
    }
    uint8_t version = 0;
    assert_int_equal(tu_read_all(e.from, &version, 1, 5000), 0);
    assert_int_equal(version, 2);
    OK(wsync_sender_flush(tx, 5000));
    overlapping_engine_finish(&e);
    trainer_end(tx, s, &init);
    for (int k = 0; k < 3; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* Issue 33: an engine destroys its receiver while copies it queued out of the trainer's bucket
 * are stuck on its stream (past every deadline). That work may still run and read the bucket,
 * so the receiver neither closes the mapping nor tells the board it released it: the trainer's
 * destroy waits its "release_timeout_ms" and leaves the buckets allocated instead of freeing
 * memory the engine's work still reads (the fake counts such frees). */
static void cuda_ipc_a_receiver_destroyed_under_stuck_copies_keeps_the_trainers_memory(void **state) {
    (void)state;
    engine_cfg c0 = {"cuda_ipc", "{\"device\": 0, \"timeout_ms\": 300}", NULL, 0, 0, 0, 0, 3, 0};
    engine_t e = tu_fork_peer(overlapping_loader_engine_entry, &c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    void *data[3];
    overlapping_sync(&e, "{\"bucket_bytes\": 65536, \"buckets\": 2, \"release_timeout_ms\": 600}", &s,
                     &init, &tx, data, chunk_1_reported_late);
    uint8_t a[3];
    assert_int_equal(tu_read_all(e.from, a, 3, 5000), 0);
    assert_int_equal(a[0], 0x80 | WSYNC_ERR_TIMEOUT); /* the last chunk waited for the held stream */
    assert_int_equal(a[2], 0);
    uint8_t destroyed = 0;
    assert_int_equal(tu_read_all(e.from, &destroyed, 1, 5000), 0);
    const long long freed_before = drv.freed_while_imported();
    const long t0 = tu_now_ms();
    wsync_sender_destroy(tx);
    const long took = tu_now_ms() - t0;
    assert_true(took >= 550 && took < 5000); /* it waited for the receiver, bounded */
    assert_int_equal(drv.freed_while_imported() - freed_before, 0);
    overlapping_engine_finish(&e);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    for (int k = 0; k < 3; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* nccl_broadcast engines take tensors with wsync_recv_copy into device memory too: refused
 * destinations named, the copy queued on the loader's stream (fenced before the next
 * broadcast) and bit-exact, on both engines' GPUs. */
static void nccl_recv_copy_into_device_memory_is_queued_on_the_loaders_stream_and_bit_exact(void **state) {
    (void)state;
    nccl_three_gpus();
    engine_cfg c0 = {"nccl_broadcast", "{\"device\": 0}", NCCL_ENGINE_GPUS, 0, 0, 0, 0, 0, 0};
    engine_cfg c1 = {"nccl_broadcast", "{\"device\": 1}", NCCL_ENGINE_GPUS, 1, 0, 0, 0, 0, 0};
    g_engines_try_copy = 1;
    engine_t e[2] = {engine_start(&c0), engine_start(&c1)};
    g_engines_try_copy = 0;
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    OK(wsync_strategy_create("nccl_broadcast", "{\"receivers\": 2, \"bucket_bytes\": 65536, \"timeout_ms\": 10000}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &init);
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    size_t n = (size_t)shapes[0][0] * shapes[0][1] * 4;
    void *data = dalloc(n);
    for (uint64_t v = 1; v <= 2; ++v) {
        tu_fill(data, n, v, 0);
        wsync_tensor_t t = gpu_tensor(names[0], data, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
        wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tx, &ch, &req));
        for (int i = 0; i < 2; ++i) engine_send(&e[i], &req);
        for (int i = 0; i < 2; ++i) assert_int_equal(engine_verdict(&e[i]), 0);
        wsync_blob_free(&req);
    }
    OK(wsync_sender_flush(tx, 10000));
    for (int i = 0; i < 2; ++i) engine_finish(&e[i]);
    trainer_end(tx, s, &init);
    drv.cuMemFree((CUdeviceptr)(uintptr_t)data);
}

static void nccl_too_old_or_missing_is_unavailable_naming_it(void **state) {
    (void)state;
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("nccl_broadcast", "{\"nccl_library\": \"/nonexistent/libnccl.so.2\"}", &s),
               WSYNC_ERR_UNAVAILABLE, "/nonexistent/libnccl.so.2");
    assert_null(s);
    setenv("WSYNC_FAKE_NCCL_VERSION", "21300", 1); /* read by the fake when it is asked */
    EXPECT_ERR(wsync_strategy_create("nccl_broadcast", NULL, &s), WSYNC_ERR_UNAVAILABLE,
               "NCCL 2.13.0; libwsync needs 2.14 or newer");
    unsetenv("WSYNC_FAKE_NCCL_VERSION");
}

/* Issue 10, defect 7: the GPU kinds need a CUDA 12.0 driver; an older one is UNAVAILABLE at
 * creation (not at first use), naming the driver's version and the minimum, and `wsync kinds`
 * says the minimum beside the driver it found. */
static void a_cuda_driver_older_than_12_0_is_unavailable_naming_both_versions(void **state) {
    (void)state;
    setenv("WSYNC_FAKE_CUDA_DRIVER_VERSION", "11080", 1); /* read once, at the driver's load */
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", NULL, &s), WSYNC_ERR_UNAVAILABLE, "is 11.8");
    assert_non_null(strstr(wsync_last_error(), "need a CUDA 12.0 driver"));
    assert_null(s);
    s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("nccl_broadcast", NULL, &s), WSYNC_ERR_UNAVAILABLE, "is 11.8");
    assert_null(s);
    char *kinds = NULL;
    OK(wsync_strategy_kinds(&kinds));
    assert_non_null(strstr(kinds, "need a CUDA 12.0 driver"));
    wsync_string_free(kinds);
    unsetenv("WSYNC_FAKE_CUDA_DRIVER_VERSION");
}

/* ---- nccl_broadcast: one GPU per rank (issue 33) -------------------------------------------
 * NCCL refuses two ranks of one communicator on one GPU. On an H200 a trainer and an engine on
 * the same GPU (the colocated layout) both failed after 0.9 s with "ncclResult_t 5 (invalid
 * usage (run with NCCL_DEBUG=WARN for details))", which named no cause. */

/* What an engine saw when it created its receiver. */
typedef struct {
    int32_t status;        /* of wsync_receiver_create */
    int32_t took_ms;       /* how long that call took */
    long long init_calls;  /* ncclCommInitRankConfig calls of the engine, in all */
    long long comms_live;  /* after the call (and the destroy of a receiver it made) */
    long long live_allocs; /* likewise */
    char message[1024];    /* wsync_last_error() of a failed call */
} create_report_t;

/* An engine that creates its receiver from the init info (its first frame), destroys it if it
 * was made, and reports (create_report_t). */
static int create_reporting_engine_main(const engine_cfg *cfg, int in, int out) {
    alarm(30);
    if (cfg->visible) setenv("CUDA_VISIBLE_DEVICES", cfg->visible, 1);
    uint8_t *init;
    size_t len;
    if (tu_recv_frame(in, &init, &len, 20000) || !init) return 10;
    create_report_t rep;
    memset(&rep, 0, sizeof rep);
    wsync_strategy_t *s;
    if (wsync_strategy_create(cfg->kind, cfg->options, &s) != WSYNC_OK) return 11;
    wsync_receiver_t *r = NULL;
    long t0 = tu_now_ms();
    rep.status = wsync_receiver_create(s, init, len, cfg->index, &r);
    rep.took_ms = (int32_t)(tu_now_ms() - t0);
    if (rep.status != WSYNC_OK) snprintf(rep.message, sizeof rep.message, "%s", wsync_last_error());
    free(init);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    load_driver();
    wsync_fake_nccl_init_calls_fn calls =
        (wsync_fake_nccl_init_calls_fn)dlsym(drv.h, "wsync_fake_nccl_init_calls");
    if (!calls) return 12;
    rep.init_calls = calls();
    struct wsync_fake_stats st;
    drv.stats(&st);
    rep.comms_live = st.comms_live;
    rep.live_allocs = st.live_allocs;
    return tu_write_all(out, &rep, sizeof rep) ? 13 : 0;
}

static int create_reporting_engine_entry(const void *cfg, int in, int out) {
    return create_reporting_engine_main((const engine_cfg *)cfg, in, out);
}

/* The engine's report, and its exit. */
static create_report_t create_report(engine_t *e) {
    create_report_t rep;
    assert_int_equal(tu_read_all(e->from, &rep, sizeof rep, 20000), 0);
    rep.message[sizeof rep.message - 1] = 0;
    assert_int_equal(tu_wait_child(e->pid, 20000), 0);
    close(e->to);
    close(e->from);
    return rep;
}

static const uint8_t *find_bytes(const uint8_t *hay, size_t n, const char *needle) {
    const size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; ++i)
        if (!memcmp(hay + i, needle, k)) return hay + i;
    return NULL;
}

/* A request whose virtual-memory part is malformed (the socket or the runs missing, a run
 * naming a piece the part does not list) is refused MALFORMED naming the field before anything
 * is fetched or mapped, and the receiver takes the intact request afterwards. */
static void unpacked_virtual_memory_part_is_validated_before_anything_is_mapped(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    ipc_trainer("{\"packed\": false}", &e, 1, &s, &init, &tx);
    CUdeviceptr span = 0;
    assert_int_equal(drv.alloc_span(&span, 2u << 20, 1u << 20), 0);
    void *data = (void *)(uintptr_t)(span + (1u << 20) - 64);
    tu_fill(data, (size_t)shapes[0][0] * shapes[0][1] * 4, 1, 0);
    wsync_tensor_t t = gpu_tensor(names[0], data, shapes[0], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    const char *fields[] = {"socket", "runs", "pieces"};
    for (int f = 0; f < 3; ++f) {
        wsync_blob_t bad = {malloc(req.size), req.size};
        memcpy(bad.data, req.data, req.size);
        uint8_t *key = (uint8_t *)find_bytes(bad.data, bad.size, fields[f]);
        assert_non_null(key);
        key[strlen(fields[f]) - 1] = 'X'; /* the key renamed: the field is missing */
        tu_reseal(bad.data, bad.size);
        engine_send(&e, &bad);
        assert_int_equal(engine_verdict(&e), 1); /* refused at receive */
        free(bad.data);
    }
    engine_send(&e, &req); /* the intact request still loads, bit for bit */
    assert_int_equal(engine_verdict(&e), 0);
    wsync_blob_free(&req);
    OK(wsync_sender_flush(tx, 5000));
    struct wsync_fake_stats es = engine_finish(&e);
    assert_int_equal(es.vmm_imports, 2); /* only the intact request's two pieces were fetched */
    assert_int_equal(es.vmm_maps_live, 0);
    trainer_end(tx, s, &init);
    drv.cuMemFree(span);
    drv.cuMemFree(span + (1u << 20));
}

/* The fake NCCL's control segments of the group an init info names ("/wsync-fakenccl-<hex of
 * the 16 random bytes after the fake unique id's magic>"): 0 once every rank left. */
static int nccl_segments_of(const wsync_blob_t *init) {
    const uint8_t *id = find_bytes(init->data, init->size, "WSFKNCCL");
    assert_non_null(id);
    static const char hex[] = "0123456789abcdef";
    char prefix[64] = "wsync-fakenccl-";
    size_t n = strlen(prefix);
    for (int i = 0; i < 16; ++i) {
        prefix[n++] = hex[id[8 + i] >> 4];
        prefix[n++] = hex[id[8 + i] & 15];
    }
    prefix[n] = 0;
    load_driver();
    wsync_fake_shm_count_fn count = (wsync_fake_shm_count_fn)dlsym(drv.h, "wsync_fake_shm_count");
    assert_non_null(count);
    return count(prefix);
}

static long long nccl_init_calls_here(void) {
    load_driver();
    wsync_fake_nccl_init_calls_fn calls =
        (wsync_fake_nccl_init_calls_fn)dlsym(drv.h, "wsync_fake_nccl_init_calls");
    assert_non_null(calls);
    return calls();
}

#define TRAINER_GPU "GPU-0fa6e000-0000-4000-8000-000000000000"

/* The colocated layout: the receiver is refused at creation by name, before any NCCL call,
 * pointing at cuda_ipc; the trainer's creation times out at its deadline naming its GPU and
 * that cause (NCCL cannot tell it which rank is missing); nothing is left behind. */
static void nccl_an_engine_on_the_trainers_gpu_is_refused_before_joining_naming_both_and_cuda_ipc(
    void **state) {
    (void)state;
    engine_cfg c0 = {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 1000}", NULL, 0, 0, 0, 0, 0, 0};
    engine_t e = tu_fork_peer(create_reporting_engine_entry, &c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx = (wsync_sender_t *)1;
    OK(wsync_strategy_create("nccl_broadcast", "{\"timeout_ms\": 1000}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    engine_send(&e, &init);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_ERR_TIMEOUT,
               "nccl_broadcast rank 0 on " TRAINER_GPU
               ": the group of 2 ranks was not complete after 1000 ms");
    long took = tu_now_ms() - t0;
    assert_true(took >= 950 && took < 3000);
    assert_null(tx);
    assert_non_null(strstr(wsync_last_error(), "a receiver on the sender's GPU is refused before it joins"));
    create_report_t rep = create_report(&e);
    fprintf(stderr, "engine: %s\n", rep.message);
    assert_int_equal(rep.status, WSYNC_ERR_UNSUPPORTED);
    assert_non_null(strstr(rep.message, "the sender (rank 0) is on " TRAINER_GPU));
    assert_non_null(strstr(rep.message, "this receiver index 0 (rank 1, device 0) is on the same GPU"));
    assert_non_null(strstr(rep.message, "NCCL refuses two ranks of one communicator on one GPU"));
    assert_non_null(strstr(rep.message, "takes the weights with \"cuda_ipc\""));
    assert_true(rep.took_ms < 500);     /* at once, not at a deadline */
    assert_int_equal(rep.init_calls, 0); /* refused before any NCCL call */
    assert_int_equal(rep.comms_live, 0);
    assert_int_equal(rep.live_allocs, 0);
    struct wsync_fake_stats st = stats_now();
    assert_int_equal(st.comms_live, 0);  /* the trainer's communicator was aborted */
    assert_int_equal(st.live_allocs, 0);
    assert_int_equal(nccl_segments_of(&init), 0);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* Two engines on one GPU (not the trainer's) cannot be seen before NCCL's init, which fails
 * both with invalid usage: each names the likely cause; the trainer times out at its deadline;
 * nothing is left behind. */
static void nccl_two_engines_on_one_gpu_fail_naming_the_likely_cause_and_the_trainer_times_out(
    void **state) {
    (void)state;
    nccl_three_gpus();
    engine_cfg c[2] = {
        {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 5000}", NCCL_ENGINE_GPUS, 0, 0, 0, 0, 0, 0},
        {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 5000}", NCCL_ENGINE_GPUS, 1, 0, 0, 0, 0, 0}};
    engine_t e[2] = {tu_fork_peer(create_reporting_engine_entry, &c[0]),
                     tu_fork_peer(create_reporting_engine_entry, &c[1])};
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx = (wsync_sender_t *)1;
    OK(wsync_strategy_create("nccl_broadcast", "{\"receivers\": 2, \"timeout_ms\": 1500}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    for (int i = 0; i < 2; ++i) engine_send(&e[i], &init);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_ERR_TIMEOUT,
               "the group of 3 ranks was not complete after 1500 ms");
    long took = tu_now_ms() - t0;
    assert_true(took >= 1450 && took < 4000);
    assert_null(tx);
    for (int i = 0; i < 2; ++i) {
        create_report_t rep = create_report(&e[i]);
        fprintf(stderr, "engine %d: %s\n", i, rep.message);
        char who[128];
        snprintf(who, sizeof who, "nccl_broadcast rank %d on GPU-1fa6e000-0000-4000-8000-000000000001: "
                 "communicator creation failed: ncclResult_t 5 (invalid usage", i + 1);
        assert_int_equal(rep.status, WSYNC_ERR_PEER);
        assert_non_null(strstr(rep.message, who));
        assert_non_null(strstr(rep.message, "the likely cause: another rank of this group on the same GPU"));
        assert_true(rep.took_ms < 4000); /* NCCL's refusal, before the engine's deadline */
        assert_int_equal(rep.init_calls, 1);
        assert_int_equal(rep.comms_live, 0);
        assert_int_equal(rep.live_allocs, 0);
    }
    assert_int_equal(stats_now().comms_live, 0);
    assert_int_equal(nccl_segments_of(&init), 0);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* An init info without "sender_gpu" (a trainer from before the field): renamed to a key no
 * reader knows, as an older blob lacks it, and resealed. */
static void strip_sender_gpu(wsync_blob_t *init) {
    uint8_t *key = (uint8_t *)find_bytes(init->data, init->size, "sender_gpu");
    assert_non_null(key);
    key[9] = 'X';
    tu_reseal(init->data, init->size);
}

/* Such an init info is still accepted; a colocated engine then reaches NCCL's init, which fails
 * both ranks with invalid usage (the H200 run), and both messages name the likely cause. */
static void nccl_an_init_info_without_sender_gpu_is_accepted_and_a_shared_gpu_names_the_likely_cause(
    void **state) {
    (void)state;
    engine_cfg c0 = {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 5000}", NULL, 0, 0, 0, 0, 0, 0};
    engine_t e = tu_fork_peer(create_reporting_engine_entry, &c0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx = (wsync_sender_t *)1;
    OK(wsync_strategy_create("nccl_broadcast", "{\"timeout_ms\": 5000}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    strip_sender_gpu(&init);
    engine_send(&e, &init);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_ERR_PEER,
               "nccl_broadcast rank 0 on " TRAINER_GPU
               ": communicator creation failed: ncclResult_t 5 (invalid usage");
    assert_true(tu_now_ms() - t0 < 4000);
    assert_null(tx);
    assert_non_null(strstr(wsync_last_error(), "the likely cause: another rank of this group on the same GPU"));
    assert_non_null(strstr(wsync_last_error(), "engines on the trainer's GPU use \"cuda_ipc\""));
    create_report_t rep = create_report(&e);
    fprintf(stderr, "engine: %s\n", rep.message);
    assert_int_equal(rep.status, WSYNC_ERR_PEER);
    assert_non_null(strstr(rep.message, "nccl_broadcast rank 1 on " TRAINER_GPU
                                        ": communicator creation failed: ncclResult_t 5"));
    assert_non_null(strstr(rep.message, "the likely cause"));
    assert_int_equal(rep.init_calls, 1);
    assert_int_equal(rep.comms_live, 0);
    assert_int_equal(stats_now().comms_live, 0);
    assert_int_equal(nccl_segments_of(&init), 0);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* "sender_gpu" is a promise receivers act on: a sender on another GPU than the init info names
 * is refused before it joins (so no receiver is refused for a GPU the sender is not on), and a
 * value that is no GPU UUID is malformed. */
static void nccl_the_init_infos_sender_gpu_binds_the_sender_and_is_validated(void **state) {
    (void)state;
    use_device(0);
    wsync_strategy_t *s, *other;
    wsync_blob_t init;
    wsync_sender_t *tx = (wsync_sender_t *)1;
    wsync_receiver_t *rx = (wsync_receiver_t *)1;
    OK(wsync_strategy_create("nccl_broadcast", "{\"timeout_ms\": 500}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    OK(wsync_strategy_create("nccl_broadcast", "{\"device\": 1, \"timeout_ms\": 500}", &other));
    EXPECT_ERR(wsync_sender_create(other, init.data, init.size, &tx), WSYNC_ERR_MISMATCH,
               "the init info names the sender's GPU as " TRAINER_GPU);
    assert_non_null(strstr(wsync_last_error(), "device 1 is GPU-1fa6e000-0000-4000-8000-000000000001"));
    assert_null(tx);
    assert_int_equal(nccl_init_calls_here(), 0);
    uint8_t *text = (uint8_t *)find_bytes(init.data, init.size, TRAINER_GPU);
    assert_non_null(text);
    text[5] = 'z';
    tu_reseal(init.data, init.size);
    EXPECT_ERR(wsync_receiver_create(other, init.data, init.size, 0, &rx), WSYNC_ERR_MALFORMED,
               "sender_gpu 'GPU-0za6e000");
    assert_null(rx);
    assert_int_equal(nccl_init_calls_here(), 0);
    wsync_strategy_destroy(other);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* ---- fork (issue 38; the shm specifications are test_fork.c) ------------------------------ */

/* tensors of version v in data[], as ipc_send_version fills them */
static void ipc_fill_version(void **data, wsync_tensor_t *t, uint64_t v) {
    for (int k = 0; k < NT; ++k) {
        tu_fill(data[k], (size_t)shapes[k][0] * shapes[k][1] * 4, v, (uint64_t)k);
        t[k] = gpu_tensor(names[k], data[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32, 0);
    }
}

/* An engine forks a worker that keeps its descriptors and is SIGKILLed mid-version. Trainer:
 * the flush fails with PEER naming receiver 1 within 1 s (deadline 20 s), the record DIED; a
 * restarted engine takes index 1 at once while the worker lives, and the next version reaches
 * both bit-exact. Engine 0: every version bit-exact. */
static void cuda_ipc_an_engine_whose_forked_worker_outlives_it_is_dead_at_once_and_its_index_free(
    void **state) {
    (void)state;
    engine_t e[2] = {ipc_engine(0), ipc_engine(1)};
    engine_t restarted = ipc_engine(1); /* forked now: later this process uses the driver */
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"receivers\": 2, \"bucket_bytes\": 65536, \"buckets\": 4, \"timeout_ms\": 20000}",
                e, 2, &s, &init, &tx);
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    ipc_send_version(tx, data, 1, e, 2);
    OK(wsync_sender_flush(tx, 5000));
    pid_t worker = engine_fork_worker(&e[1]);
    ipc_fill_version(data, t, 2);
    wsync_chunk_t ch = tu_chunk(t, 3, 0);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e[0], &req);
    engine_send(&e[1], &req);
    assert_int_equal(engine_verdict(&e[0]), 0);
    assert_int_equal(engine_verdict(&e[1]), 0);
    wsync_blob_free(&req);
    kill(e[1].pid, SIGKILL);
    assert_int_equal(tu_wait_child(e[1].pid, 5000), 128 + SIGKILL);
    close(e[1].to);
    close(e[1].from);
    assert_int_equal(kill(worker, 0), 0);
    ch = tu_chunk(t + 3, 3, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tx, &ch, &req));
    engine_send(&e[0], &req);
    assert_int_equal(engine_verdict(&e[0]), 0);
    wsync_blob_free(&req);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(tx, 20000), WSYNC_ERR_PEER, "receiver 1");
    assert_true(tu_now_ms() - t0 < 1000);
    wsync_failure_t f = {.struct_size = sizeof f};
    OK(wsync_sender_failure(tx, 0, &f));
    assert_int_equal(f.what, WSYNC_FAILURE_DIED);
    assert_int_equal(f.receiver, 1);
    engine_send(&restarted, &init); /* attaches at once: the worker is still alive */
    usleep(300 * 1000);             /* (joining) before version 3 begins */
    engine_t two[2] = {e[0], restarted};
    ipc_send_version(tx, data, 3, two, 2);
    OK(wsync_sender_flush(tx, 5000));
    kill(worker, SIGKILL); /* init reaps it: the dead engine was its parent */
    engine_finish(&two[0]);
    engine_finish(&two[1]);
    trainer_end(tx, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* A cuda_ipc trainer in its own process with `options` (cfg): forks a worker when asked, sends
 * its init info and the worker's pid (4 bytes, 0 for none), then on a byte from the test sends
 * chunk 0 of version 1 and waits to be killed with that version open. */
typedef struct {
    const char *options;
    int fork_worker;
} ipc_far_cfg;

static int ipc_far_trainer_main(const void *p, int in, int out) {
    const ipc_far_cfg *cfg = (const ipc_far_cfg *)p;
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    if (wsync_strategy_create("cuda_ipc", cfg->options, &s) ||
        wsync_strategy_create_init_info(s, &init) ||
        wsync_sender_create(s, init.data, init.size, &tx))
        return 2;
    int32_t worker = 0;
    if (cfg->fork_worker) {
        pid_t w = fork();
        if (w == 0) {
            tu_detach_stdio(); /* keeps every other descriptor */
            for (;;) pause();
        }
        worker = (int32_t)w;
    }
    if (tu_send_frame(out, init.data, init.size) || tu_send_frame(out, &worker, sizeof worker))
        return 3;
    uint8_t go;
    if (tu_read_all(in, &go, 1, 20000)) return 4;
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    ipc_fill_version(data, t, 1);
    wsync_chunk_t ch = tu_chunk(t, 3, 0);
    if (wsync_sender_send_chunk(tx, &ch, &req)) return 5;
    tu_send_frame(out, req.data, req.size);
    for (;;) pause(); /* killed here, version 1 open */
}

typedef struct {
    tu_peer_t peer;
    wsync_blob_t init; /* data malloc'd here */
    pid_t worker;
} ipc_far_t;

static ipc_far_t ipc_far_start(const ipc_far_cfg *cfg) {
    ipc_far_t t;
    t.peer = tu_fork_peer(ipc_far_trainer_main, cfg);
    uint8_t *init, *w;
    size_t n, wn;
    assert_int_equal(tu_recv_frame(t.peer.from, &init, &n, 20000), 0);
    assert_int_equal(tu_recv_frame(t.peer.from, &w, &wn, 20000), 0);
    assert_int_equal(wn, 4);
    int32_t worker;
    memcpy(&worker, w, 4);
    free(w);
    t.init.data = init;
    t.init.size = n;
    t.worker = (pid_t)worker;
    return t;
}

/* Kills the far trainer (and its worker); removes what the fake driver of a killed process
 * leaves in /dev/shm (a real driver frees a dead process's memory) and, when `board` is set,
 * the board's name, which a cuda_ipc engine leaves for a sender made again (options "senders"). */
static void ipc_far_end(ipc_far_t *t, int board) {
    kill(t->peer.pid, SIGKILL);
    tu_wait_child(t->peer.pid, 5000);
    if (t->worker > 0) kill(t->worker, SIGKILL);
    char pattern[64];
    snprintf(pattern, sizeof pattern, "wsync-fakecuda-%d-", (int)t->peer.pid);
    DIR *shm = opendir("/dev/shm");
    assert_non_null(shm);
    for (struct dirent *d; (d = readdir(shm)) != NULL;)
        if (strncmp(d->d_name, pattern, strlen(pattern)) == 0) {
            char path[320];
            snprintf(path, sizeof path, "/dev/shm/%s", d->d_name);
            unlink(path);
        }
    closedir(shm);
    if (board) {
        char name[128];
        tu_init_field(&t->init, "segment", name, sizeof name);
        shm_unlink(name);
    }
    close(t->peer.to);
    close(t->peer.from);
    free(t->init.data);
}

static void ipc_receive_first_chunk(ipc_far_t *t, wsync_receiver_t *r) {
    uint8_t go = 1;
    tu_write_all(t->peer.to, &go, 1);
    uint8_t *req;
    size_t len;
    assert_int_equal(tu_recv_frame(t->peer.from, &req, &len, 20000), 0);
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req, len, &it));
    wsync_tensor_t v;
    bool has = true;
    while (has) OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    free(req);
}

/* The trainer forks a worker and is SIGKILLed with version 1 open. Engine 0: its next poll,
 * within 100 ms, says SENDER_GONE with version 1 failed (PEER). A new engine for index 1 and
 * engine 0 restarted: refused at once, UNAVAILABLE naming the gone sender (before: the worker's
 * copy of the trainer's lock kept it "live", and they attached to a board nobody serves). */
static void cuda_ipc_a_trainer_whose_forked_worker_outlives_it_is_gone_to_engines(void **state) {
    (void)state;
    const ipc_far_cfg cfg = {"{\"receivers\": 2, \"bucket_bytes\": 65536, \"timeout_ms\": 3000}", 1};
    ipc_far_t t = ipc_far_start(&cfg);
    assert_true(t.worker > 0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("cuda_ipc", "{\"device\": 0, \"timeout_ms\": 3000}", &s));
    OK(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r));
    ipc_receive_first_chunk(&t, r);
    wsync_receiver_state_t st = {.struct_size = sizeof st};
    OK(wsync_receiver_poll(r, &st));
    assert_int_equal(st.open_version, 1);
    assert_int_equal(st.flags & WSYNC_RECEIVER_SENDER_GONE, 0);
    kill(t.peer.pid, SIGKILL);
    assert_int_equal(tu_wait_child(t.peer.pid, 5000), 128 + SIGKILL);
    assert_int_equal(kill(t.worker, 0), 0);
    long t0 = tu_now_ms();
    OK(wsync_receiver_poll(r, &st));
    assert_true(tu_now_ms() - t0 < 100);
    assert_true(st.flags & WSYNC_RECEIVER_SENDER_GONE);
    assert_int_equal(st.failed_version, 1);
    assert_int_equal(st.failed_status, WSYNC_ERR_PEER);
    assert_int_equal(st.completed_version, 0);
    wsync_receiver_t *late = NULL;
    t0 = tu_now_ms();
    EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 1, &late), WSYNC_ERR_UNAVAILABLE,
               "sender of this segment is gone");
    assert_null(late);
    wsync_receiver_destroy(r);
    EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r), WSYNC_ERR_UNAVAILABLE,
               "sender of this segment is gone");
    assert_true(tu_now_ms() - t0 < 1000);
    wsync_strategy_destroy(s);
    ipc_far_end(&t, 1);
}

/* A child forked by an engine holds a copy of its receiver: poll refused (WRONG_STATE naming
 * the fork), its destroy a no-op; the engine's next version completes bit-exact. The trainer's
 * child alike: send_chunk refused, destroys no-ops, the trainer's flush OK afterwards. */
static void cuda_ipc_a_forked_child_cannot_use_or_tear_down_its_parents_objects(void **state) {
    (void)state;
    engine_t e = ipc_engine(0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_blob_t init, req;
    wsync_sender_t *tx;
    ipc_trainer("{\"bucket_bytes\": 65536, \"timeout_ms\": 3000}", &e, 1, &s, &init, &tx);
    void *data[NT];
    wsync_tensor_t t[NT];
    for (int k = 0; k < NT; ++k) data[k] = dalloc((size_t)shapes[k][0] * shapes[k][1] * 4);
    ipc_send_version(tx, data, 1, &e, 1);
    OK(wsync_sender_flush(tx, 3000));
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        ipc_fill_version(data, t, 2);
        wsync_chunk_t ch = tu_chunk(t, 3, 0);
        int bad = wsync_sender_send_chunk(tx, &ch, &req) != WSYNC_ERR_WRONG_STATE ||
                  !strstr(wsync_last_error(), "forked");
        wsync_sender_destroy(tx);
        wsync_strategy_destroy(s);
        _exit(bad);
    }
    assert_int_equal(tu_wait_child(c, 5000), 0);
    assert_int_equal(tu_send_frame(e.to, "COPY", 4), 0);
    assert_int_equal(engine_verdict(&e), 0);
    ipc_send_version(tx, data, 2, &e, 1);
    OK(wsync_sender_flush(tx, 3000));
    engine_finish(&e);
    trainer_end(tx, s, &init);
    for (int k = 0; k < NT; ++k) drv.cuMemFree((CUdeviceptr)(uintptr_t)data[k]);
}

/* After the trainer died and its board's name is gone, a restarting engine is handed a board
 * by an impostor at the trainer's rendezvous: one of the trainer's user serving the real board
 * (opened while its name existed) is refused as not its creator; one of another user (root
 * only) is refused naming its uid before any descriptor is accepted. */
static void cuda_ipc_a_rendezvous_served_by_anyone_but_the_trainer_is_refused_by_name(void **state) {
    (void)state;
    const ipc_far_cfg cfg = {"{\"receivers\": 1, \"bucket_bytes\": 65536, \"timeout_ms\": 3000}", 0};
    ipc_far_t t = ipc_far_start(&cfg);
    char board[128], rendezvous[128];
    tu_init_field(&t.init, "segment", board, sizeof board);
    tu_init_field(&t.init, "rendezvous", rendezvous, sizeof rendezvous);
    int stolen = shm_open(board, O_RDWR, 0);
    assert_true(stolen >= 0);
    struct stat sb;
    assert_int_equal(fstat(stolen, &sb), 0);
    use_device(0);
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("cuda_ipc", "{\"device\": 0, \"timeout_ms\": 3000}", &s));
    OK(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r));
    ipc_receive_first_chunk(&t, r); /* the sender removes the name once every process attached */
    assert_false(tu_segment_named_in(t.init.data, t.init.size));
    wsync_receiver_destroy(r);
    kill(t.peer.pid, SIGKILL);
    assert_int_equal(tu_wait_child(t.peer.pid, 5000), 128 + SIGKILL);
    const tu_impostor_cfg_t same = {rendezvous, stolen, 0, 0};
    tu_peer_t imp = tu_fork_peer(tu_impostor_main, &same);
    assert_int_equal(tu_peer_byte(&imp, 5000), 0);
    EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r), WSYNC_ERR_UNAVAILABLE,
               "is not the one that created it");
    kill(imp.pid, SIGKILL);
    tu_wait_child(imp.pid, 5000);
    close(imp.to), close(imp.from);
    int other_user_ran = 0;
    if (geteuid() == 0) {
        const tu_impostor_cfg_t other = {rendezvous, -1, 65534, (size_t)sb.st_size};
        imp = tu_fork_peer(tu_impostor_main, &other);
        if (tu_peer_byte(&imp, 5000) == 0) {
            EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r),
                       WSYNC_ERR_UNAVAILABLE, "uid 65534");
            other_user_ran = 1;
        }
        kill(imp.pid, SIGKILL);
        tu_wait_child(imp.pid, 5000);
        close(imp.to), close(imp.from);
    }
    close(stolen);
    wsync_strategy_destroy(s);
    ipc_far_end(&t, 0);
    if (!other_user_ran) {
        print_message("skipped the other-user impostor: this process cannot switch users\\n");
        skip();
    }
}

/* RLIMIT_FSIZE below the board's size: create_init_info returns NO_MEMORY naming the limit
 * and the process lives on (not killed by SIGXFSZ). */
static void cuda_ipc_a_file_size_limit_below_the_board_is_a_status_not_a_signal(void **state) {
    (void)state;
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        use_device(0);
        struct rlimit lim = {1, RLIM_INFINITY};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(20);
        wsync_strategy_t *s;
        wsync_blob_t init;
        if (wsync_strategy_create("cuda_ipc", "{\"device\": 0}", &s) != WSYNC_OK) _exit(1);
        if (wsync_strategy_create_init_info(s, &init) != WSYNC_ERR_NO_MEMORY) _exit(2);
        if (!strstr(wsync_last_error(), "RLIMIT_FSIZE")) _exit(3);
        wsync_strategy_destroy(s);
        _exit(0);
    }
    assert_int_equal(tu_wait_child(c, 10000), 0); /* not 128 + SIGXFSZ */
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(packed_sync_reaches_two_engines_bit_for_bit_with_one_launch_per_chunk),
    cmocka_unit_test(cuda_ipc_moves_a_split_tensor_as_one_view_per_part_packed_or_not),
    cmocka_unit_test(recv_copy_into_device_memory_is_queued_on_the_loaders_stream_and_bit_exact),
    cmocka_unit_test(packed_cast_to_bfloat16_rounds_to_nearest_even),
    cmocka_unit_test(unpacked_steady_state_opens_no_new_handle_over_1000_syncs),
    cmocka_unit_test(unpacked_moved_tensor_gets_a_new_handle_and_the_old_one_is_closed),
    cmocka_unit_test(unpacked_virtual_memory_is_exported_and_mapped_once_and_let_go_when_moved),
    cmocka_unit_test(cuda_ipc_a_receiver_destroyed_under_stuck_copies_keeps_the_trainers_memory),
    cmocka_unit_test(unpacked_refuses_virtual_memory_it_cannot_export_naming_the_tensor),
    cmocka_unit_test(unpacked_virtual_memory_of_a_sender_gone_fails_the_engines_receive_at_once),
    cmocka_unit_test(unpacked_virtual_memory_part_is_validated_before_anything_is_mapped),
    cmocka_unit_test(each_engine_takes_the_part_of_its_own_gpu_even_when_remapped),
    cmocka_unit_test(a_request_without_this_gpu_is_a_mismatch_naming_the_uuid),
    cmocka_unit_test(a_dead_engine_fails_flush_with_peer),
    cmocka_unit_test(cuda_ipc_an_engine_whose_forked_worker_outlives_it_is_dead_at_once_and_its_index_free),
    cmocka_unit_test(cuda_ipc_a_trainer_whose_forked_worker_outlives_it_is_gone_to_engines),
    cmocka_unit_test(cuda_ipc_a_forked_child_cannot_use_or_tear_down_its_parents_objects),
    cmocka_unit_test(cuda_ipc_a_rendezvous_served_by_anyone_but_the_trainer_is_refused_by_name),
    cmocka_unit_test(cuda_ipc_a_file_size_limit_below_the_board_is_a_status_not_a_signal),
    cmocka_unit_test(cuda_ipc_a_receiver_dropped_while_it_reads_never_completes_the_version),
    cmocka_unit_test(cuda_ipc_a_request_of_another_sync_is_refused_and_changes_nothing),
    cmocka_unit_test(nccl_a_request_of_another_group_is_refused_and_changes_nothing),
    cmocka_unit_test(cuda_ipc_options_are_checked_before_anything_happens),
    cmocka_unit_test(cuda_ipc_delta_keeps_engines_bit_identical_while_patches_cross),
    cmocka_unit_test(cuda_ipc_delta_an_engine_that_changed_its_copy_refuses_the_patch_and_the_next_version_is_dense),
    cmocka_unit_test(nccl_delta_an_engine_that_changed_its_copy_refuses_the_patch_and_the_next_version_is_dense),
    cmocka_unit_test(cuda_ipc_delta_a_frozen_apply_fails_recv_end_within_the_deadline_on_both_sides),
    cmocka_unit_test(cuda_ipc_delta_bases_in_pinned_host_memory_cost_no_gpu_memory),
    cmocka_unit_test(cuda_ipc_delta_a_restarted_engine_is_sent_the_next_version_dense),
    cmocka_unit_test(cuda_ipc_delta_the_version_after_an_abandoned_one_is_dense),
    cmocka_unit_test(cuda_ipc_chunks_nobody_was_given_do_not_wedge_the_trainer),
    cmocka_unit_test(cuda_ipc_a_version_skipped_whole_is_reported_like_one_skipped_in_part),
    cmocka_unit_test(cuda_ipc_an_abandoned_chunk_nobody_began_does_not_hold_the_only_slot),
    cmocka_unit_test(cuda_ipc_a_sole_sender_made_again_goes_on_after_its_predecessors_versions),
    cmocka_unit_test(cuda_ipc_a_sole_sender_made_again_waits_only_for_its_own_chunks),
    cmocka_unit_test(cuda_ipc_a_sender_made_again_after_its_trainer_was_killed_mid_version_completes_its_first),
    cmocka_unit_test(gpu_delta_needs_packed_buckets_and_no_cast_and_takes_no_mirror),
    cmocka_unit_test(the_fake_counts_memory_freed_while_an_engine_maps_it),
    cmocka_unit_test(unpacked_memory_a_version_no_longer_uses_is_freed_after_wait_released),
    cmocka_unit_test(destroying_a_packed_sender_waits_for_engines_to_unmap_its_buckets),
    cmocka_unit_test(destroying_a_packed_sender_leaves_buckets_an_engine_still_maps_allocated),
    cmocka_unit_test(unpacked_refuses_unexportable_memory_naming_the_tensor_and_packed_true),
    cmocka_unit_test(sender_does_not_wait_for_work_on_other_streams),
    cmocka_unit_test(sender_times_out_naming_the_chunk_when_the_default_stream_does_not_drain),
    cmocka_unit_test(a_sender_given_the_callers_stream_orders_after_it_and_not_the_default_stream),
    cmocka_unit_test(cuda_ipc_engine_restarted_after_the_name_is_gone_reattaches_and_gets_the_next_version),
    cmocka_unit_test(a_receiver_says_whether_it_orders_the_loaders_work),
    cmocka_unit_test(a_failed_engine_synchronise_fails_recv_end_and_flush_alike),
    cmocka_unit_test(every_cuda_ipc_senders_flush_reports_an_engines_failure),
    cmocka_unit_test(a_cuda_ipc_senders_flush_waits_only_for_its_own_chunks),
    cmocka_unit_test(a_destroyed_cuda_ipc_sender_is_not_counted_as_attached),
    cmocka_unit_test(packed_sources_the_driver_does_not_know_are_refused_and_the_sender_keeps_working),
    cmocka_unit_test(a_misaligned_float32_source_for_a_cast_is_refused_before_the_launch),
    cmocka_unit_test(a_gpu_below_compute_capability_8_is_unavailable_for_the_kernel_paths),
    cmocka_unit_test(an_apply_whose_kernel_table_grows_does_not_wait_for_queued_work),
    cmocka_unit_test(nccl_broadcast_reaches_two_engines_bit_for_bit),
    cmocka_unit_test(nccl_strangers_on_the_control_port_are_refused_and_the_engines_report),
    cmocka_unit_test(nccl_a_sender_is_made_only_by_the_strategy_that_made_the_init_info),
    cmocka_unit_test(nccl_a_forked_child_keeps_no_copy_of_the_control_port),
    cmocka_unit_test(nccl_group_that_never_completes_times_out_and_aborts),
    cmocka_unit_test(nccl_failed_broadcast_times_the_receiver_out_and_fails_flush),
    cmocka_unit_test(cuda_ipc_an_earlier_chunk_is_acknowledged_when_its_copies_complete_not_when_it_ends),
    cmocka_unit_test(cuda_ipc_a_failed_copy_of_an_earlier_chunk_fails_the_version_on_both_sides),
    cmocka_unit_test(cuda_ipc_copies_of_an_earlier_chunk_past_the_deadline_fail_the_version),
    cmocka_unit_test(cuda_ipc_the_version_after_a_failed_earlier_chunk_completes),
    cmocka_unit_test(nccl_recv_copy_into_device_memory_is_queued_on_the_loaders_stream_and_bit_exact),
    cmocka_unit_test(nccl_too_old_or_missing_is_unavailable_naming_it),
    cmocka_unit_test(a_cuda_driver_older_than_12_0_is_unavailable_naming_both_versions),
    cmocka_unit_test(nccl_receiver_polls_an_in_progress_broadcast_to_completion_before_returning_views),
    cmocka_unit_test(nccl_sender_polls_an_in_progress_broadcast_to_completion_before_reusing_its_bucket),
    cmocka_unit_test(nccl_send_chunk_returns_only_after_the_pack_has_read_the_tensors),
    cmocka_unit_test(nccl_sender_destroy_is_bounded_when_a_receiver_never_posts_its_broadcast),
    cmocka_unit_test(nccl_recv_end_does_not_wait_unbounded_for_the_loaders_default_stream),
    cmocka_unit_test(nccl_an_engine_on_the_trainers_gpu_is_refused_before_joining_naming_both_and_cuda_ipc),
    cmocka_unit_test(nccl_two_engines_on_one_gpu_fail_naming_the_likely_cause_and_the_trainer_times_out),
    cmocka_unit_test(nccl_an_init_info_without_sender_gpu_is_accepted_and_a_shared_gpu_names_the_likely_cause),
    cmocka_unit_test(nccl_the_init_infos_sender_gpu_binds_the_sender_and_is_validated),
};

TU_MAIN(tests)
