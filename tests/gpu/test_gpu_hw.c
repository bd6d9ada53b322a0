/* GPU strategies on a real GPU: two processes on one GPU over cuda_ipc (both modes, casts
 * checked), NCCL init and abort, NCCL's refusal of two ranks on one GPU, and a broadcast when
 * two GPUs are present. Every test skips
 * with its reason when the machine has no usable CUDA driver or too few GPUs, so CI (no GPU)
 * reports them as skipped; CTest also runs this file against the fake driver (label gpu-fake)
 * to keep the test itself honest. Results on real hardware go to docs/gpu-validation.md.
 *
 * Unlike tests/test_gpu_strategies.c, device memory is only written and read through the
 * driver's copies, and no process touches CUDA before it forks (a real driver does not
 * survive fork): availability is probed in a child. */
#include <dlfcn.h>
#include <math.h>

#include "fake_gpu/fake_gpu.h"
#include "testutil.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
static struct {
    void *h;
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGet)(int *, int);
    CUresult (*cuDevicePrimaryCtxRetain)(void **, int);
    CUresult (*cuCtxSetCurrent)(void *);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
    /* The virtual memory management API, for sources made as PyTorch's expandable segments
     * make them (hardware only: the fake makes spans with wsync_fake_mem_alloc_span). */
    CUresult (*cuMemCreate)(unsigned long long *, size_t, const void *, unsigned long long);
    CUresult (*cuMemGetAllocationGranularity)(size_t *, const void *, int);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
    CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
    CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
    CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const void *, size_t);
    CUresult (*cuMemRelease)(unsigned long long);
} cu;

static const char *driver_path(void) {
    const char *p = getenv("WSYNC_CUDA_LIBRARY");
    return p && *p ? p : "libcuda.so.1";
}

/* Loads the driver and runs cuInit; 0 on success, else writes why. */
static int cu_load(char *why, size_t cap) {
    if (cu.h) return 0;
    void *h = dlopen(driver_path(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, cap, "no CUDA driver: %s", dlerror());
        return -1;
    }
#define SYM(f, name)                                                                       \
    if (!(*(void **)&cu.f = dlsym(h, name))) {                                             \
        snprintf(why, cap, "%s lacks %s", driver_path(), name);                            \
        return -1;                                                                         \
    }
    SYM(cuInit, "cuInit");
    SYM(cuDeviceGetCount, "cuDeviceGetCount");
    SYM(cuDeviceGet, "cuDeviceGet");
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuMemAlloc, "cuMemAlloc_v2");
    SYM(cuMemFree, "cuMemFree_v2");
    SYM(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
#undef SYM
    *(void **)&cu.cuMemCreate = dlsym(h, "cuMemCreate");
    *(void **)&cu.cuMemGetAllocationGranularity = dlsym(h, "cuMemGetAllocationGranularity");
    *(void **)&cu.cuMemAddressReserve = dlsym(h, "cuMemAddressReserve");
    *(void **)&cu.cuMemAddressFree = dlsym(h, "cuMemAddressFree");
    *(void **)&cu.cuMemMap = dlsym(h, "cuMemMap");
    *(void **)&cu.cuMemUnmap = dlsym(h, "cuMemUnmap");
    *(void **)&cu.cuMemSetAccess = dlsym(h, "cuMemSetAccess");
    *(void **)&cu.cuMemRelease = dlsym(h, "cuMemRelease");
    CUresult rc = cu.cuInit(0);
    if (rc != 0) {
        snprintf(why, cap, "cuInit failed with CUresult %d (no usable GPU)", rc);
        return -1;
    }
    cu.h = h;
    return 0;
}

static void cu_use(int ordinal) {
    char why[256];
    if (cu_load(why, sizeof why)) fail_msg("%s", why);
    int dev;
    void *ctx;
    assert_int_equal(cu.cuDeviceGet(&dev, ordinal), 0);
    assert_int_equal(cu.cuDevicePrimaryCtxRetain(&ctx, dev), 0);
    assert_int_equal(cu.cuCtxSetCurrent(ctx), 0);
}

/* Number of GPUs, probed in a child so this process stays fork-safe; -1 and why if none. */
static int gpu_count(char *why, size_t cap) {
    int p[2];
    if (pipe(p)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        char msg[256] = "";
        int n = -1;
        if (cu_load(msg, sizeof msg) == 0 && cu.cuDeviceGetCount(&n) != 0) n = -1;
        if (write(p[1], &n, sizeof n) < 0 || write(p[1], msg, sizeof msg) < 0) _exit(1);
        _exit(0);
    }
    close(p[1]);
    int n = -1;
    char msg[256] = "probe failed";
    if (tu_read_all(p[0], &n, sizeof n, 20000) || tu_read_all(p[0], msg, sizeof msg, 20000)) n = -1;
    close(p[0]);
    tu_wait_child(pid, 20000);
    snprintf(why, cap, "%s", msg);
    return n;
}

#define REQUIRE_GPUS(want)                                                                  \
    do {                                                                                    \
        char why_[256];                                                                     \
        int have_ = gpu_count(why_, sizeof why_);                                           \
        if (have_ < (want)) {                                                               \
            if (have_ < 0) print_message("skipped: %s\n", why_);                            \
            else print_message("skipped: needs %d GPU(s), this machine has %d\n", (want), have_); \
            skip();                                                                         \
        }                                                                                   \
    } while (0)

/* ---- an engine process -------------------------------------------------------------------- */
typedef struct {
    const char *kind, *options;
    uint32_t index;
    int cast;   /* 1: tensors arrive as bfloat16 of tu_value() */
    int device; /* the engine's GPU, as in its options */
    int copy;   /* 1: take every tensor with wsync_recv_copy into device buffers, check after end */
    int host;   /* 1: the kind hands the engine host memory ("ucx"): views are read directly */
    int apply;  /* 1: load every chunk with wsync_recv_apply into a destination table (below) */
} engine_cfg;

static float tu_value(uint64_t v, uint64_t k, size_t i) {
    uint64_t r = tu_splitmix((v << 40) ^ (k << 24) ^ i);
    float x = ldexpf(1.0f + (float)(r & 0xffffff) / 16777216.0f, (int)((r >> 24) % 40) - 20);
    return (r >> 63) ? -x : x;
}

static uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static int view_ok(const engine_cfg *cfg, const wsync_tensor_t *v, uint64_t version) {
    if (v->device.type != (cfg->host ? WSYNC_DEVICE_CPU : WSYNC_DEVICE_CUDA)) return 0;
    size_t elems = 1;
    for (int d = 0; d < v->ndim; ++d) elems *= (size_t)v->shape[d];
    size_t bytes = elems * v->dtype.bits / 8;
    unsigned char *host = (unsigned char *)malloc(bytes);
    if (host && cfg->host) memcpy(host, v->data, bytes);
    else if (!host || cu.cuMemcpyDtoH(host, (CUdeviceptr)(uintptr_t)v->data, bytes) != 0) {
        free(host);
        return 0;
    }
    uint64_t k = strtoull(v->name + 1, NULL, 10);
    int ok = 1;
    if (cfg->cast) {
        ok = v->dtype.code == WSYNC_DTYPE_BFLOAT;
        for (size_t i = 0; ok && i < elems; ++i)
            ok = ((uint16_t *)host)[i] == bf16_rne(tu_value(version, k, i));
    } else {
        ok = tu_check(host, bytes, version, k);
    }
    free(host);
    return ok;
}

/* ---- the apply engine: a destination table over the engine's own device memory ----------- */
#define APPLY_NT 4
static const int64_t apply_shapes[APPLY_NT][2] = {{4096, 1024}, {1024, 1}, {333, 77}, {2048, 512}};
static size_t apply_bytes(int k) { return (size_t)(apply_shapes[k][0] * apply_shapes[k][1]) * 4; }

typedef struct {
    wsync_dest_table_t *table;
    CUdeviceptr t0;          /* t0 alone: a virtual-memory span of 4 MiB pieces on the fake */
    size_t t0_pieces;        /* pieces to free (0: one cuMemAlloc) */
    CUdeviceptr fused;       /* t1, t2, t3 one after the other, as fused parameters */
    CUdeviceptr tied;        /* a second copy of t1 (an untied head) */
    CUdeviceptr where[APPLY_NT + 1];
    int of[APPLY_NT + 1];    /* which tensor each destination takes */
} apply_dests;

static void *fake_sym(const char *name) { return cu.h ? dlsym(cu.h, name) : NULL; }

static int apply_setup(wsync_receiver_t *r, apply_dests *a) {
    memset(a, 0, sizeof *a);
    int (*span)(unsigned long long *, size_t, size_t) =
        (int (*)(unsigned long long *, size_t, size_t))fake_sym("wsync_fake_mem_alloc_span");
    if (span) { /* as PyTorch's expandable segments map it: the driver sees four allocations */
        if (span(&a->t0, apply_bytes(0), 4u << 20) != 0) return 30;
        a->t0_pieces = (apply_bytes(0) + (4u << 20) - 1) / (4u << 20);
    } else if (cu.cuMemAlloc(&a->t0, apply_bytes(0)) != 0) {
        return 30;
    }
    size_t fused = 0;
    for (int k = 1; k < APPLY_NT; ++k) fused += (apply_bytes(k) + 255) / 256 * 256;
    if (cu.cuMemAlloc(&a->fused, fused) != 0 || cu.cuMemAlloc(&a->tied, apply_bytes(1)) != 0) return 31;
    static const char *const names[APPLY_NT] = {"t0", "t1", "t2", "t3"};
    wsync_dest_t d[APPLY_NT + 1];
    memset(d, 0, sizeof d);
    CUdeviceptr at = a->fused;
    for (int j = 0; j <= APPLY_NT; ++j) {
        const int k = j < APPLY_NT ? j : 1;
        a->of[j] = k;
        a->where[j] = j == 0 ? a->t0 : j == APPLY_NT ? a->tied : at;
        if (j > 0 && j < APPLY_NT) at += (apply_bytes(k) + 255) / 256 * 256;
        d[j].name = names[k];
        d[j].data = (void *)(uintptr_t)a->where[j];
        d[j].shape = apply_shapes[k];
        d[j].ndim = 2;
        d[j].dtype.code = WSYNC_DTYPE_FLOAT;
        d[j].dtype.bits = 32;
        d[j].dtype.lanes = 1;
    }
    if (wsync_dest_table_create(r, d, APPLY_NT + 1, &a->table) != WSYNC_OK) {
        fprintf(stderr, "engine: table: %s\n", wsync_last_error());
        return 32;
    }
    return 0;
}

static void apply_teardown(apply_dests *a) {
    wsync_dest_table_destroy(a->table);
    for (size_t p = 0; p < a->t0_pieces; ++p) cu.cuMemFree(a->t0 + p * (4u << 20));
    if (!a->t0_pieces) cu.cuMemFree(a->t0);
    cu.cuMemFree(a->fused);
    cu.cuMemFree(a->tied);
}

/* A table over memory freed since it was made: refused by name, nothing queued. */
static int apply_refuses_freed_memory(wsync_receiver_t *r, wsync_recv_t *it) {
    CUdeviceptr gone = 0;
    if (cu.cuMemAlloc(&gone, apply_bytes(0)) != 0) return 33;
    wsync_dest_t d;
    memset(&d, 0, sizeof d);
    d.name = "t0";
    d.data = (void *)(uintptr_t)gone;
    d.shape = apply_shapes[0];
    d.ndim = 2;
    d.dtype.code = WSYNC_DTYPE_FLOAT;
    d.dtype.bits = 32;
    d.dtype.lanes = 1;
    wsync_dest_table_t *stale;
    if (wsync_dest_table_create(r, &d, 1, &stale) != WSYNC_OK) return 34;
    cu.cuMemFree(gone);
    const wsync_status_t st = wsync_recv_apply(it, stale, WSYNC_APPLY_PARTIAL, NULL);
    const int named = strstr(wsync_last_error(), "'t0'") && strstr(wsync_last_error(), "freed or mapped anew");
    wsync_dest_table_destroy(stale);
    if (st != WSYNC_ERR_INVALID_ARGUMENT || !named) {
        fprintf(stderr, "engine: stale table: %s: %s\n", wsync_status_string(st), wsync_last_error());
        return 35;
    }
    return 0;
}

/* Loads the chunk with one call: one launch on the fake's count, every destination checked. */
static int apply_chunk(wsync_receiver_t *r, wsync_recv_t *it, const wsync_recv_info_t *info,
                       apply_dests *a) {
    if (info->version == 2 && info->chunk_index == 0) {
        int v = apply_refuses_freed_memory(r, it);
        if (v) return v;
    }
    /* Destinations of 4 MiB or more (t0, t3) go by the driver's device copy, the small ones
     * (t1 and its tied copy, t2) by one kernel launch: each chunk here has both. On the fake
     * driver, its counters: one launch, and one copy a large destination plus the launch's
     * entry table. */
    uint64_t large = 0;
    for (int j = 0; j <= APPLY_NT; ++j)
        for (uint64_t i = 0; i < info->count; ++i)
            if ((uint64_t)a->of[j] == 2 * info->chunk_index + i &&
                apply_bytes(a->of[j]) >= WSYNC_APPLY_DRIVER_COPY_MIN)
                ++large;
    wsync_fake_stats_fn stats = NULL;
    struct wsync_fake_stats before, after;
    *(void **)&stats = fake_sym("wsync_fake_stats");
    if (stats) stats(&before);
    wsync_apply_result_t res;
    memset(&res, 0, sizeof res);
    res.struct_size = sizeof res;
    if (wsync_recv_apply(it, a->table, WSYNC_APPLY_COMPLETE, &res) != WSYNC_OK) {
        fprintf(stderr, "engine: apply: %s\n", wsync_last_error());
        return 36;
    }
    if (res.launches != 1 || res.tensors != info->count || res.device_copies != large || large != 1) {
        fprintf(stderr, "engine: apply said %u launches, %llu device copies (%llu large), %llu tensors\n",
                res.launches, (unsigned long long)res.device_copies, (unsigned long long)large,
                (unsigned long long)res.tensors);
        return 37;
    }
    if (stats) {
        stats(&after);
        if (after.kernel_launches - before.kernel_launches != 1 ||
            after.memcpy_calls - before.memcpy_calls != (long long)large + 1) {
            fprintf(stderr, "engine: apply made %lld launches and %lld copies\n",
                    after.kernel_launches - before.kernel_launches, after.memcpy_calls - before.memcpy_calls);
            return 38;
        }
    }
    return 0;
}

static int apply_check(const apply_dests *a, uint64_t version, const int *in_chunk) {
    for (int j = 0; j <= APPLY_NT; ++j) {
        const int k = a->of[j];
        if (!in_chunk[k]) continue;
        unsigned char *host = (unsigned char *)malloc(apply_bytes(k));
        if (!host || cu.cuMemcpyDtoH(host, a->where[j], apply_bytes(k)) != 0 ||
            !tu_check(host, apply_bytes(k), version, (uint64_t)k)) {
            free(host);
            fprintf(stderr, "engine: destination %d (t%d) of version %llu differs\n", j, k,
                    (unsigned long long)version);
            return 39;
        }
        free(host);
    }
    return 0;
}

static int engine_main(const engine_cfg *cfg, int in, int out) {
    uint8_t *init;
    size_t len;
    if (tu_recv_frame(in, &init, &len, 60000) || !init) return 10;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    if (wsync_strategy_create(cfg->kind, cfg->options, &s) != WSYNC_OK ||
        wsync_receiver_create(s, init, len, cfg->index, &r) != WSYNC_OK) {
        fprintf(stderr, "engine: %s\n", wsync_last_error());
        return 11;
    }
    cu_use(cfg->device); /* for the test's own copies out of the views */
    apply_dests dests;
    if (cfg->apply) {
        int v = apply_setup(r, &dests);
        if (v) return v;
    }
    for (;;) {
        uint8_t *req;
        if (tu_recv_frame(in, &req, &len, 60000)) return 13;
        if (!req) break;
        uint8_t verdict = 0;
        wsync_recv_t *it;
        if (wsync_receiver_receive(r, req, len, &it) != WSYNC_OK) {
            fprintf(stderr, "engine: %s\n", wsync_last_error());
            verdict = 1;
        } else {
            wsync_recv_info_t info = {0};
            wsync_recv_info(it, &info);
            wsync_tensor_t v;
            bool has;
            /* copy: each tensor into a buffer of the engine's own (as a loader's parameters),
             * queued on the default stream by the library; read back after recv_end. */
            wsync_tensor_t seen[8]; /* name and shape copied: the iteration's die at end */
            char seen_name[8][16];
            int64_t seen_shape[8][WSYNC_MAX_NDIM];
            CUdeviceptr mine[8] = {0};
            size_t n_copied = 0;
            for (size_t i = 0; cfg->copy && i < info.count && i < 8; ++i) {
                wsync_recv_peek(it, i, &seen[i]);
                snprintf(seen_name[i], sizeof seen_name[i], "%s", seen[i].name);
                memcpy(seen_shape[i], seen[i].shape, sizeof(int64_t) * (size_t)seen[i].ndim);
                seen[i].name = seen_name[i];
                seen[i].shape = seen_shape[i];
                size_t bytes = seen[i].dtype.bits / 8;
                for (int d = 0; d < seen[i].ndim; ++d) bytes *= (size_t)seen[i].shape[d];
                if (cu.cuMemAlloc(&mine[i], bytes) != 0 ||
                    wsync_recv_copy(it, i, 0, (void *)(uintptr_t)mine[i], bytes) != WSYNC_OK) {
                    fprintf(stderr, "engine: copy: %s\n", wsync_last_error());
                    verdict = 4;
                }
                n_copied = i + 1;
            }
            int in_chunk[APPLY_NT] = {0};
            if (cfg->apply) {
                for (size_t i = 0; i < info.count; ++i) {
                    wsync_tensor_t t;
                    wsync_recv_peek(it, i, &t);
                    in_chunk[strtoul(t.name + 1, NULL, 10) % APPLY_NT] = 1;
                }
                verdict = (uint8_t)apply_chunk(r, it, &info, &dests);
            }
            while (wsync_recv_next(it, &v, &has) == WSYNC_OK && has)
                if (!view_ok(cfg, &v, info.version)) verdict = 2;
            if (wsync_recv_end(it) != WSYNC_OK) verdict = 3;
            if (cfg->apply && verdict == 0) verdict = (uint8_t)apply_check(&dests, info.version, in_chunk);
            engine_cfg in_device = *cfg; /* the copies are in device memory, whatever the kind */
            in_device.host = 0;
            for (size_t i = 0; i < n_copied; ++i) {
                wsync_tensor_t t = seen[i];
                t.data = (void *)(uintptr_t)mine[i];
                t.device.type = WSYNC_DEVICE_CUDA;
                if (verdict == 0 && !view_ok(&in_device, &t, info.version)) verdict = 5;
                cu.cuMemFree(mine[i]);
            }
        }
        free(req);
        if (tu_write_all(out, &verdict, 1)) return 14;
    }
    wsync_receiver_destroy(r);
    if (cfg->apply) apply_teardown(&dests);
    wsync_strategy_destroy(s);
    return 0;
}

typedef tu_peer_t engine_t;

static int engine_entry(const void *cfg, int in, int out) {
    return engine_main((const engine_cfg *)cfg, in, out);
}

static engine_t engine_start(const engine_cfg *cfg) { return tu_fork_peer(engine_entry, cfg); }

static uint8_t engine_verdict(engine_t *e) { return tu_peer_byte(e, 60000); }

static void engine_finish(engine_t *e) {
    assert_int_equal(tu_send_frame(e->to, NULL, 0), 0);
    assert_int_equal(tu_wait_child(e->pid, 60000), 0);
    close(e->to);
    close(e->from);
}

/* ---- a trainer on device 0 syncing NT tensors for `versions` versions ---------------------- */
#define NT 4
static const int64_t shapes[NT][2] = {{4096, 1024}, {1024, 1}, {333, 77}, {2048, 512}};
static const char *names[NT] = {"t0", "t1", "t2", "t3"};

/* ---- trainer tensors in virtual memory, as PyTorch's expandable segments hold them ------- */
/* CUmemAllocationProp (cuda.h): pinned device memory whose handle exports as a POSIX file
 * descriptor, as PyTorch requests for its expandable segments. */
typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requested_handle_types; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 */
    int location_type;        /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int location_id;
    void *win32_meta;
    unsigned char alloc_flags[8];
} mem_prop;
typedef struct {
    int location_type, location_id, flags; /* CUmemAccessDesc: PROT_READWRITE = 3 */
} mem_access;

typedef struct {
    CUdeviceptr base;
    size_t bytes, piece;
    unsigned long long handles[64];
    int pieces;
    int fake;
} vmm_span;

/* One range of `bytes` (rounded up) mapped as several physical allocations side by side: the
 * fake's span of 1 MiB pieces, or on hardware cuMemCreate pieces of twice the granularity. */
static int vmm_span_make(vmm_span *v, size_t bytes, int device) {
    memset(v, 0, sizeof *v);
    int (*span)(unsigned long long *, size_t, size_t) =
        (int (*)(unsigned long long *, size_t, size_t))fake_sym("wsync_fake_mem_alloc_span");
    if (span) {
        v->fake = 1;
        v->piece = 1u << 20;
        v->bytes = (bytes + v->piece - 1) / v->piece * v->piece;
        v->pieces = (int)(v->bytes / v->piece);
        return span(&v->base, v->bytes, v->piece);
    }
    if (!cu.cuMemCreate || !cu.cuMemGetAllocationGranularity || !cu.cuMemMap) return -1;
    mem_prop prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.requested_handle_types = 1;
    prop.location_type = 1;
    prop.location_id = device;
    size_t g = 0;
    if (cu.cuMemGetAllocationGranularity(&g, &prop, 0) != 0 || g == 0) return -2;
    v->piece = 2 * g;
    v->bytes = (bytes + v->piece - 1) / v->piece * v->piece;
    v->pieces = (int)(v->bytes / v->piece);
    if (v->pieces > 64 || cu.cuMemAddressReserve(&v->base, v->bytes, 0, 0, 0) != 0) return -3;
    for (int k = 0; k < v->pieces; ++k) {
        if (cu.cuMemCreate(&v->handles[k], v->piece, &prop, 0) != 0) return -4;
        if (cu.cuMemMap(v->base + (size_t)k * v->piece, v->piece, 0, v->handles[k], 0) != 0) return -5;
    }
    mem_access acc = {1, device, 3};
    return cu.cuMemSetAccess(v->base, v->bytes, &acc, 1) != 0 ? -6 : 0;
}

static void vmm_span_free(vmm_span *v) {
    if (v->fake) {
        for (int k = 0; k < v->pieces; ++k) cu.cuMemFree(v->base + (size_t)k * v->piece);
        return;
    }
    cu.cuMemUnmap(v->base, v->bytes);
    for (int k = 0; k < v->pieces; ++k) cu.cuMemRelease(v->handles[k]);
    cu.cuMemAddressFree(v->base, v->bytes);
}

/* Set by a test: the one allocation of g_offsets is a virtual-memory span (vmm_span_make). */
static int g_vmm_sources;

/* Where the trainer's tensors live: NULL gives each its own allocation; else tensor k sits at
 * byte offset g_offsets[k] of one allocation (as views into a flat buffer, at 4, 8 and 12 bytes
 * past a 16-byte boundary, which takes the pack kernel off its 16-byte path). */
static const size_t *g_offsets;
/* Set by a test: the engine takes every tensor with wsync_recv_copy into device memory. */
static int g_engine_copies;
/* Set by a test: the engine loads every chunk with wsync_recv_apply (see apply_chunk). */
static int g_engine_applies;

static void run_sync(const char *kind, const char *trainer_opts, const char *engine_opts,
                     int engine_device, int cast, int versions) {
    engine_cfg cfg = {kind, engine_opts, 0, cast, engine_device, g_engine_copies, !strcmp(kind, "ucx"),
                      g_engine_applies};
    engine_t e = engine_start(&cfg); /* before this process touches CUDA */
    cu_use(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    OK(wsync_strategy_create(kind, trainer_opts, &s));
    OK(wsync_strategy_create_init_info(s, &init));
    assert_int_equal(tu_send_frame(e.to, init.data, init.size), 0);
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    CUdeviceptr dev[NT], flat = 0;
    void *host[NT];
    size_t bytes[NT], total = 0;
    for (int k = 0; k < NT; ++k) {
        bytes[k] = (size_t)(shapes[k][0] * shapes[k][1]) * 4;
        host[k] = malloc(bytes[k]);
        if (g_offsets && g_offsets[k] + bytes[k] > total) total = g_offsets[k] + bytes[k];
        if (!g_offsets) assert_int_equal(cu.cuMemAlloc(&dev[k], bytes[k]), 0);
    }
    vmm_span span;
    if (g_offsets && g_vmm_sources) {
        assert_int_equal(vmm_span_make(&span, total, 0), 0);
        for (int k = 0; k < NT; ++k) dev[k] = span.base + g_offsets[k];
    } else if (g_offsets) {
        assert_int_equal(cu.cuMemAlloc(&flat, total), 0);
        for (int k = 0; k < NT; ++k) dev[k] = flat + g_offsets[k];
    }
    for (uint64_t v = 1; v <= (uint64_t)versions; ++v) {
        wsync_tensor_t t[NT];
        for (int k = 0; k < NT; ++k) {
            if (cast) {
                for (size_t i = 0; i < bytes[k] / 4; ++i) ((float *)host[k])[i] = tu_value(v, (uint64_t)k, i);
            } else {
                tu_fill(host[k], bytes[k], v, (uint64_t)k);
            }
            assert_int_equal(cu.cuMemcpyHtoD(dev[k], host[k], bytes[k]), 0);
            t[k] = tu_tensor(names[k], (void *)(uintptr_t)dev[k], shapes[k], 2, WSYNC_DTYPE_FLOAT, 32);
            t[k].device.type = WSYNC_DEVICE_CUDA;
        }
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 2 * c, 2, c ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(tx, &ch, &req));
            assert_int_equal(tu_send_frame(e.to, req.data, req.size), 0);
            assert_int_equal(engine_verdict(&e), 0);
            wsync_blob_free(&req);
        }
        OK(wsync_sender_flush(tx, 30000));
    }
    engine_finish(&e);
    wsync_sender_destroy(tx);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    for (int k = 0; k < NT; ++k) {
        if (!g_offsets) cu.cuMemFree(dev[k]);
        free(host[k]);
    }
    if (flat) cu.cuMemFree(flat);
    if (g_offsets && g_vmm_sources) vmm_span_free(&span);
}

/* Byte offsets of t0..t3 in one allocation: 4, 8, 0 and 12 past a 16-byte boundary, apart. */
static const size_t unaligned_offsets[NT] = {4, (16u << 20) + 4096 + 8, (16u << 20) + 16384,
                                             (16u << 20) + 16384 + 131072 + 12};

static void cuda_ipc_packed_two_processes_one_gpu_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    run_sync("cuda_ipc", "{\"bucket_bytes\": 33554432}", "{\"device\": 0}", 0, 0, 5);
}

static void cuda_ipc_per_allocation_two_processes_one_gpu_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    run_sync("cuda_ipc", "{\"packed\": false}", "{\"device\": 0}", 0, 0, 5);
}

static void cuda_ipc_packed_cast_to_bfloat16_matches_round_to_nearest_even(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    run_sync("cuda_ipc", "{\"bucket_bytes\": 33554432, \"dtype\": \"bfloat16\"}", "{\"device\": 0}", 0, 1, 3);
}

/* Each run_sync forks its engine before this process touches CUDA (a forked child of a CUDA
 * process cannot use CUDA), so each layout is a test of its own: CTest runs each in a process. */
static void cuda_ipc_packed_tensors_off_16_byte_boundaries_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_offsets = unaligned_offsets;
    run_sync("cuda_ipc", "{\"bucket_bytes\": 33554432}", "{\"device\": 0}", 0, 0, 3);
    g_offsets = NULL;
}

static void cuda_ipc_packed_cast_off_16_byte_boundaries_matches_round_to_nearest_even(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_offsets = unaligned_offsets;
    run_sync("cuda_ipc", "{\"bucket_bytes\": 33554432, \"dtype\": \"bfloat16\"}", "{\"device\": 0}", 0, 1, 2);
    g_offsets = NULL;
}

static void cuda_ipc_per_allocation_views_inside_one_allocation_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_offsets = unaligned_offsets;
    run_sync("cuda_ipc", "{\"packed\": false}", "{\"device\": 0}", 0, 0, 3);
    g_offsets = NULL;
}

/* PyTorch's expandable segments: the trainer's tensors lie in virtual memory mapped as several
 * physical allocations (t0 spans many), which cuIpcGetMemHandle cannot export. Per-allocation
 * mode shares each allocation's handle as a file descriptor and the engine maps the pieces side
 * by side again: views and one-call applies read them bit for bit over versions. */
static void cuda_ipc_per_allocation_virtual_memory_sources_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_offsets = unaligned_offsets;
    g_vmm_sources = 1;
    run_sync("cuda_ipc", "{\"packed\": false}", "{\"device\": 0}", 0, 0, 3);
    g_vmm_sources = 0;
    g_offsets = NULL;
}

static void cuda_ipc_per_allocation_virtual_memory_sources_apply_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_offsets = unaligned_offsets;
    g_vmm_sources = 1;
    g_engine_applies = 1;
    run_sync("cuda_ipc", "{\"packed\": false}", "{\"device\": 0}", 0, 0, 3);
    g_engine_applies = 0;
    g_vmm_sources = 0;
    g_offsets = NULL;
}

static void cuda_ipc_recv_copy_into_device_memory_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_engine_copies = 1;
    g_offsets = unaligned_offsets; /* sources off 16-byte boundaries too */
    run_sync("cuda_ipc", "{\"packed\": false}", "{\"device\": 0}", 0, 0, 3);
    g_offsets = NULL;
    g_engine_copies = 0;
}

static void cuda_ipc_packed_recv_copy_into_device_memory_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_engine_copies = 1;
    run_sync("cuda_ipc", "{\"bucket_bytes\": 33554432}", "{\"device\": 0}", 0, 0, 3);
    g_engine_copies = 0;
}

/* wsync_recv_apply: each chunk into the engine's declared destinations (t0 in a span of mapped
 * pieces on the fake, t1..t3 fused in one allocation, t1 again in a second one) by one kernel
 * launch, bit for bit; a table over memory freed since is refused by name. */
static void cuda_ipc_packed_apply_loads_each_chunk_by_one_launch_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_engine_applies = 1;
    run_sync("cuda_ipc", "{\"bucket_bytes\": 33554432}", "{\"device\": 0}", 0, 0, 3);
    g_engine_applies = 0;
}

static void cuda_ipc_per_allocation_apply_loads_each_chunk_by_one_launch_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    g_engine_applies = 1;
    g_offsets = unaligned_offsets; /* sources off 16-byte boundaries too */
    run_sync("cuda_ipc", "{\"packed\": false}", "{\"device\": 0}", 0, 0, 3);
    g_offsets = NULL;
    g_engine_applies = 0;
}

/* ---- ucx: a GPU trainer's tensors packed by the GPU into pinned staging memory -------------- */
/* Skips unless this build has the ucx kind and the machine's UCX loads (the device machine may
 * have none); probed without touching CUDA. */
#define UCX_OPTS "\"transports\": \"tcp\", \"net_devices\": \"lo\", \"timeout_ms\": 20000"
#define REQUIRE_UCX()                                                                       \
    do {                                                                                    \
        wsync_strategy_t *s_ = NULL;                                                        \
        if (wsync_strategy_create("ucx", "{" UCX_OPTS "}", &s_) != WSYNC_OK) {              \
            print_message("skipped: no ucx kind here: %s\n", wsync_last_error());           \
            skip();                                                                         \
        }                                                                                   \
        wsync_strategy_destroy(s_);                                                         \
    } while (0)

static void ucx_device_tensors_staged_through_pinned_memory_two_processes_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    REQUIRE_UCX();
    run_sync("ucx", "{" UCX_OPTS "}", "{" UCX_OPTS "}", 0, 0, 4);
}

/* A GPU engine ("device": 0) copies every tensor into its own device memory with
 * wsync_recv_copy: verified on the host, then one asynchronous copy from pinned memory each. */
static void ucx_gpu_trainer_to_gpu_engine_recv_copy_into_device_memory_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    REQUIRE_UCX();
    g_engine_copies = 1;
    run_sync("ucx", "{" UCX_OPTS "}", "{" UCX_OPTS ", \"device\": 0}", 0, 0, 4);
    g_engine_copies = 0;
}

static void ucx_device_tensors_off_16_byte_boundaries_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    REQUIRE_UCX();
    g_offsets = unaligned_offsets;
    run_sync("ucx", "{" UCX_OPTS ", \"checksum\": false}", "{" UCX_OPTS "}", 0, 0, 3);
    g_offsets = NULL;
}

/* ---- delta sync on the GPU: the trainer compares on its GPU, the engine applies there ------- */
/* Tensor k of version v (bf16 elements as uint16): tu_fill of version 1, then for each later
 * version u about one element in 64 changes (u xor-ed in). */
static void delta_content(uint16_t *b, size_t n, uint64_t v, uint64_t k) {
    tu_fill(b, n * 2, 1, k);
    for (uint64_t u = 2; u <= v; ++u)
        for (size_t i = 0; i < n; ++i)
            if ((tu_splitmix((u << 48) ^ (k << 40) ^ i) & 63) == 0) b[i] ^= (uint16_t)u;
}

/* The engine keeps its own copy of every tensor in device memory across versions and loads
 * each with wsync_recv_copy (a patch is applied there). Answers per request: 0 and then the
 * number of tensors that came as patches, or a failing step and 0. */
static int delta_engine_main(const engine_cfg *cfg, int in, int out) {
    uint8_t *init;
    size_t len;
    if (tu_recv_frame(in, &init, &len, 60000) || !init) return 10;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    if (wsync_strategy_create(cfg->kind, cfg->options, &s) != WSYNC_OK ||
        wsync_receiver_create(s, init, len, cfg->index, &r) != WSYNC_OK)
        return 11;
    free(init);
    cu_use(cfg->device);
    CUdeviceptr mine[NT] = {0};
    for (;;) {
        uint8_t *req;
        if (tu_recv_frame(in, &req, &len, 60000)) return 13;
        if (!req) break;
        uint8_t answer[2] = {0, 0};
        wsync_recv_t *it;
        if (wsync_receiver_receive(r, req, len, &it) != WSYNC_OK) {
            fprintf(stderr, "delta engine: %s\n", wsync_last_error());
            answer[0] = 1;
        } else {
            wsync_recv_info_t info = {0};
            wsync_recv_info(it, &info);
            for (size_t i = 0; i < info.count && !answer[0]; ++i) {
                wsync_tensor_t t;
                wsync_recv_peek(it, i, &t);
                const uint64_t k = strtoull(t.name + 1, NULL, 10);
                const size_t bytes = (size_t)(shapes[k][0] * shapes[k][1]) * 2;
                if (!mine[k] && cu.cuMemAlloc(&mine[k], bytes) != 0) answer[0] = 2;
                if (t.flags & WSYNC_TENSOR_PATCH) answer[1]++;
                if (!answer[0] && wsync_recv_copy(it, i, 0, (void *)(uintptr_t)mine[k], bytes) != WSYNC_OK) {
                    fprintf(stderr, "delta engine: copy: %s\n", wsync_last_error());
                    answer[0] = 3;
                }
            }
            if (wsync_recv_end(it) != WSYNC_OK && !answer[0]) answer[0] = 4;
            for (uint64_t k = 0; k < NT && !answer[0] && (info.flags & WSYNC_CHUNK_LAST); ++k) {
                const size_t n = (size_t)(shapes[k][0] * shapes[k][1]);
                uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
                delta_content(want, n, info.version, k);
                if (cu.cuMemcpyDtoH(got, mine[k], n * 2) != 0 || memcmp(got, want, n * 2)) answer[0] = 5;
                free(want);
                free(got);
            }
        }
        free(req);
        if (tu_write_all(out, answer, 2)) return 14;
    }
    for (int k = 0; k < NT; ++k)
        if (mine[k]) cu.cuMemFree(mine[k]);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    return 0;
}

static int delta_engine_entry(const void *cfg, int in, int out) {
    return delta_engine_main((const engine_cfg *)cfg, in, out);
}

static void cuda_ipc_delta_two_processes_one_gpu_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    engine_cfg cfg = {"cuda_ipc", "{\"device\": 0}", 0, 0, 0, 0, 0, 0};
    engine_t e = tu_fork_peer(delta_engine_entry, &cfg); /* before this process touches CUDA */
    cu_use(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    OK(wsync_strategy_create("cuda_ipc", "{\"bucket_bytes\": 33554432, \"delta\": \"auto\", \"delta_decide\": \"size\"}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    assert_int_equal(tu_send_frame(e.to, init.data, init.size), 0);
    OK(wsync_sender_create(s, init.data, init.size, &tx));
    CUdeviceptr dev[NT];
    uint16_t *host[NT];
    for (int k = 0; k < NT; ++k) {
        const size_t n = (size_t)(shapes[k][0] * shapes[k][1]);
        host[k] = malloc(n * 2);
        assert_int_equal(cu.cuMemAlloc(&dev[k], n * 2), 0);
    }
    for (uint64_t v = 1; v <= 5; ++v) {
        wsync_tensor_t t[NT];
        for (int k = 0; k < NT; ++k) {
            const size_t n = (size_t)(shapes[k][0] * shapes[k][1]);
            delta_content(host[k], n, v, (uint64_t)k);
            assert_int_equal(cu.cuMemcpyHtoD(dev[k], host[k], n * 2), 0);
            t[k] = tu_tensor(names[k], (void *)(uintptr_t)dev[k], shapes[k], 2, WSYNC_DTYPE_BFLOAT, 16);
            t[k].device.type = WSYNC_DEVICE_CUDA;
        }
        uint8_t patches = 0;
        for (int c = 0; c < 2; ++c) {
            wsync_chunk_t ch = tu_chunk(t + 2 * c, 2, c ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(tx, &ch, &req));
            assert_int_equal(tu_send_frame(e.to, req.data, req.size), 0);
            uint8_t answer[2];
            assert_int_equal(tu_read_all(e.from, answer, 2, 60000), 0);
            assert_int_equal(answer[0], 0);
            patches += answer[1];
            wsync_blob_free(&req);
        }
        OK(wsync_sender_flush(tx, 30000));
        assert_int_equal(patches, v == 1 ? 0 : NT); /* after version 1, every tensor is a patch */
    }
    engine_finish(&e);
    wsync_sender_destroy(tx);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
    for (int k = 0; k < NT; ++k) {
        cu.cuMemFree(dev[k]);
        free(host[k]);
    }
}

static void nccl_group_missing_a_rank_times_out_and_aborts(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    cu_use(0);
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *tx;
    if (wsync_strategy_create("nccl_broadcast", "{\"timeout_ms\": 2000}", &s) == WSYNC_ERR_UNAVAILABLE) {
        print_message("skipped: %s\n", wsync_last_error());
        skip();
    }
    OK(wsync_strategy_create_init_info(s, &init));
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_ERR_TIMEOUT, "communicator aborted");
    assert_true(tu_now_ms() - t0 < 10000);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

static void nccl_broadcast_between_two_gpus_bit_for_bit(void **state) {
    (void)state;
    REQUIRE_GPUS(2); /* NCCL refuses two ranks on one GPU */
    run_sync("nccl_broadcast", "{\"bucket_bytes\": 33554432, \"timeout_ms\": 30000}",
             "{\"device\": 1, \"timeout_ms\": 30000}", 1, 0, 3);
}

/* ---- nccl_broadcast: one GPU per rank (issue 33) -------------------------------------------
 * NCCL refuses two ranks of one communicator on one GPU: on an H200 a trainer and an engine on
 * GPU 0 both failed their init after 0.9 s with "ncclResult_t 5 (invalid usage ...)". */

/* An engine that creates its receiver from the init info and reports the status (int32) and
 * wsync_last_error() (1024 bytes), then destroys what it made. */
static int create_engine_main(const engine_cfg *cfg, int in, int out) {
    alarm(120);
    uint8_t *init;
    size_t len;
    if (tu_recv_frame(in, &init, &len, 60000)) return 10;
    if (!init) return 0; /* the test skipped */
    wsync_strategy_t *s;
    wsync_receiver_t *r = NULL;
    if (wsync_strategy_create(cfg->kind, cfg->options, &s) != WSYNC_OK) return 11;
    int32_t status = wsync_receiver_create(s, init, len, cfg->index, &r);
    char message[1024] = "";
    if (status != WSYNC_OK) snprintf(message, sizeof message, "%s", wsync_last_error());
    free(init);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    if (tu_write_all(out, &status, sizeof status) || tu_write_all(out, message, sizeof message)) return 12;
    return 0;
}

static int create_engine_entry(const void *cfg, int in, int out) {
    return create_engine_main((const engine_cfg *)cfg, in, out);
}

/* The engine's status and message, and its exit. */
static int32_t create_engine_report(engine_t *e, char message[1024]) {
    int32_t status = -1;
    assert_int_equal(tu_read_all(e->from, &status, sizeof status, 60000), 0);
    assert_int_equal(tu_read_all(e->from, message, 1024, 60000), 0);
    message[1023] = 0;
    assert_int_equal(tu_wait_child(e->pid, 60000), 0);
    close(e->to);
    close(e->from);
    return status;
}

/* A trainer on GPU 0 with one receiver: its strategy, or a skip (the engine is ended). */
static wsync_strategy_t *colocated_trainer(engine_t *e, const char *options) {
    cu_use(0);
    wsync_strategy_t *s;
    if (wsync_strategy_create("nccl_broadcast", options, &s) == WSYNC_ERR_UNAVAILABLE) {
        print_message("skipped: %s\n", wsync_last_error());
        assert_int_equal(tu_send_frame(e->to, NULL, 0), 0);
        assert_int_equal(tu_wait_child(e->pid, 60000), 0);
        skip();
    }
    return s;
}

/* The colocated layout: the receiver is refused at creation, naming both and cuda_ipc, before
 * NCCL is called; the trainer's creation times out at its deadline. */
static void nccl_an_engine_on_the_trainers_gpu_is_refused_by_name_before_joining(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    engine_cfg cfg = {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 5000}", 0, 0, 0, 0, 0, 0};
    engine_t e = tu_fork_peer(create_engine_entry, &cfg); /* before this process touches CUDA */
    wsync_strategy_t *s = colocated_trainer(&e, "{\"timeout_ms\": 3000}");
    wsync_blob_t init;
    wsync_sender_t *tx = NULL;
    OK(wsync_strategy_create_init_info(s, &init));
    assert_int_equal(tu_send_frame(e.to, init.data, init.size), 0);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_ERR_TIMEOUT,
               "a receiver on the sender's GPU is refused before it joins");
    assert_true(tu_now_ms() - t0 < 10000);
    char message[1024];
    int32_t status = create_engine_report(&e, message);
    print_message("engine: %s\n", message);
    assert_int_equal(status, WSYNC_ERR_UNSUPPORTED);
    assert_non_null(strstr(message, "is on the same GPU"));
    assert_non_null(strstr(message, "\"cuda_ipc\""));
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* An init info without "sender_gpu" (a trainer from before the field; the key renamed and the
 * blob resealed) is accepted; the colocated layout then reaches NCCL, whose init fails both
 * ranks with invalid usage, and each message names the likely cause. Against the fake this
 * checks that the fake refuses as NCCL does. */
static void nccl_two_ranks_on_one_gpu_fail_at_init_naming_the_likely_cause(void **state) {
    (void)state;
    REQUIRE_GPUS(1);
    engine_cfg cfg = {"nccl_broadcast", "{\"device\": 0, \"timeout_ms\": 20000}", 0, 0, 0, 0, 0, 0};
    engine_t e = tu_fork_peer(create_engine_entry, &cfg);
    wsync_strategy_t *s = colocated_trainer(&e, "{\"timeout_ms\": 20000}");
    wsync_blob_t init;
    wsync_sender_t *tx = NULL;
    OK(wsync_strategy_create_init_info(s, &init));
    uint8_t *key = NULL;
    for (size_t i = 0; i + 10 <= init.size && !key; ++i)
        if (!memcmp(init.data + i, "sender_gpu", 10)) key = init.data + i;
    assert_non_null(key);
    key[9] = 'X';
    tu_reseal(init.data, init.size);
    assert_int_equal(tu_send_frame(e.to, init.data, init.size), 0);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_create(s, init.data, init.size, &tx), WSYNC_ERR_PEER,
               "the likely cause: another rank of this group on the same GPU");
    print_message("trainer: %s (%ld ms)\n", wsync_last_error(), tu_now_ms() - t0);
    assert_non_null(strstr(wsync_last_error(), "ncclResult_t 5"));
    char message[1024];
    int32_t status = create_engine_report(&e, message);
    print_message("engine: %s\n", message);
    assert_int_equal(status, WSYNC_ERR_PEER);
    assert_non_null(strstr(message, "the likely cause"));
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(cuda_ipc_packed_two_processes_one_gpu_bit_for_bit),
    cmocka_unit_test(cuda_ipc_delta_two_processes_one_gpu_bit_for_bit),
    cmocka_unit_test(cuda_ipc_per_allocation_two_processes_one_gpu_bit_for_bit),
    cmocka_unit_test(cuda_ipc_packed_cast_to_bfloat16_matches_round_to_nearest_even),
    cmocka_unit_test(cuda_ipc_packed_tensors_off_16_byte_boundaries_bit_for_bit),
    cmocka_unit_test(cuda_ipc_packed_cast_off_16_byte_boundaries_matches_round_to_nearest_even),
    cmocka_unit_test(cuda_ipc_per_allocation_views_inside_one_allocation_bit_for_bit),
    cmocka_unit_test(cuda_ipc_per_allocation_virtual_memory_sources_bit_for_bit),
    cmocka_unit_test(cuda_ipc_per_allocation_virtual_memory_sources_apply_bit_for_bit),
    cmocka_unit_test(cuda_ipc_recv_copy_into_device_memory_bit_for_bit),
    cmocka_unit_test(cuda_ipc_packed_recv_copy_into_device_memory_bit_for_bit),
    cmocka_unit_test(cuda_ipc_packed_apply_loads_each_chunk_by_one_launch_bit_for_bit),
    cmocka_unit_test(cuda_ipc_per_allocation_apply_loads_each_chunk_by_one_launch_bit_for_bit),
    cmocka_unit_test(ucx_device_tensors_staged_through_pinned_memory_two_processes_bit_for_bit),
    cmocka_unit_test(ucx_device_tensors_off_16_byte_boundaries_bit_for_bit),
    cmocka_unit_test(ucx_gpu_trainer_to_gpu_engine_recv_copy_into_device_memory_bit_for_bit),
    cmocka_unit_test(nccl_group_missing_a_rank_times_out_and_aborts),
    cmocka_unit_test(nccl_broadcast_between_two_gpus_bit_for_bit),
    cmocka_unit_test(nccl_an_engine_on_the_trainers_gpu_is_refused_by_name_before_joining),
    cmocka_unit_test(nccl_two_ranks_on_one_gpu_fail_at_init_naming_the_likely_cause),
};

TU_MAIN(tests)
