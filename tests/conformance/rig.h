/* The conformance rig: one trainer (this process) and engines (forked processes) of any kind,
 * the kind named by $WSYNC_CONFORMANCE_KIND. The specifications (conformance.c) are written
 * once against this rig; what a kind does differently comes from its capabilities
 * (wsync_strategy_kinds), never from its name. The only per-kind table here, kRigKinds, says
 * how to make a strategy of the kind on one machine (ucx over loopback), not how it behaves.
 *
 * GPU kinds (capability "tensor_memory" without "host") run on the fake driver
 * (tests/fake_gpu; CTest sets WSYNC_CUDA_LIBRARY and WSYNC_NCCL_LIBRARY): its device memory is
 * host shared memory, so the trainer fills it and engines check their views directly. A real
 * CUDA process cannot use the driver after a fork from one that did, and the fake models that;
 * so every engine process a specification needs is forked by rig_begin(), before the trainer
 * touches the driver, and waits there until rig_engine_start() gives it an index. With
 * "gpu_per_receiver", the trainer is on fake GPU 0 and receiver i alone sees GPU i + 1. */
#ifndef WSYNC_CONFORMANCE_RIG_H
#define WSYNC_CONFORMANCE_RIG_H

#include <dlfcn.h>
#include <signal.h>

#include "testutil.h"

#define RIG_TENSORS 4 /* per version: two chunks of two */
#define RIG_BYTES (64 * 48 * 4)
#define RIG_MAX_ENGINES 5
static const char *kRigNames[RIG_TENSORS] = {"layers.0.q.weight", "layers.0.k.weight",
                                             "layers.1.q.weight", "layers.1.k.weight"};
static const int64_t kRigShape[2] = {64, 48};

/* How to make a strategy of a kind here: options the trainer's and every engine's strategy
 * take besides those the rig sets ("receivers", "bucket_bytes", "buckets"). */
typedef struct {
    const char *kind, *both;
} rig_kind_t;
static const rig_kind_t kRigKinds[] = {
    {"shm", ""},
    {"ucx", "\"transports\": \"tcp\", \"net_devices\": \"lo\", \"timeout_ms\": 10000"},
    {"cuda_ipc", ""},
    {"nccl_broadcast", "\"timeout_ms\": 3000, \"control_interface\": \"lo\""},
};

/* A kind's capabilities, read from wsync_strategy_kinds(). */
typedef struct {
    bool host_memory, drop_receiver, reattach, collective, gpu_per_receiver;
} rig_caps_t;

/* An engine's behaviour, fixed when it is started. */
enum { LOAD = 0, FAIL_V2_LAST_CHUNK = 1, FAIL_V1_CHUNK0 = 2, FAIL_V1_CHUNK1 = 3 };
typedef struct {
    int mode;
    uint64_t version;
    uint32_t chunk;
    wsync_status_t status;
    const char *message;
} rig_failure_t;
static const rig_failure_t kRigFailures[] = {
    {FAIL_V2_LAST_CHUNK, 2, 1, WSYNC_ERR_MISMATCH, "engine cannot load 'layers.1.k.weight'"},
    {FAIL_V1_CHUNK0, 1, 0, WSYNC_ERR_MISMATCH, "engine cannot load 'layers.0.q.weight'"},
    {FAIL_V1_CHUNK1, 1, 1, WSYNC_ERR_INTEGRITY, "engine found 'layers.1.q.weight' corrupt"},
};

typedef struct {
    const char *kind;
    const rig_kind_t *make;
    rig_caps_t caps;
    char *options_doc; /* wsync_strategy_describe_options(kind) */
    tu_peer_t e[RIG_MAX_ENGINES];
    int engines;
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
    void *data[RIG_TENSORS];
    wsync_tensor_t t[RIG_TENSORS];
} rig_t;

/* The part of the JSON object `obj` (text up to its matching brace) holding `"key":true`. */
static bool rig_json_true(const char *obj, size_t len, const char *key) {
    char want[64];
    snprintf(want, sizeof want, "\"%s\":true", key);
    const char *hit = strstr(obj, want);
    return hit && (size_t)(hit - obj) < len;
}

/* Reads the kind's capabilities; skips the test, with the library's reason, where the kind is
 * unavailable here (e.g. a build without UCX). */
static int rig_kinds_main(const void *cfg, int in, int out) {
    (void)cfg, (void)in;
    char *json;
    if (wsync_strategy_kinds(&json) != WSYNC_OK) return 1;
    int rc = tu_send_frame(out, json, strlen(json) + 1);
    wsync_string_free(json);
    return rc ? 1 : 0;
}
static void rig_read_capabilities(rig_t *r) {
    /* Listing the GPU kinds initialises the driver, after which no engine could be forked:
     * a child asks. */
    tu_peer_t lister = tu_fork_peer(rig_kinds_main, NULL);
    uint8_t *list;
    size_t n;
    assert_int_equal(tu_recv_frame(lister.from, &list, &n, 20000), 0);
    assert_int_equal(tu_wait_child(lister.pid, 20000), 0);
    close(lister.to);
    close(lister.from);
    char *json = (char *)list;
    char key[64];
    snprintf(key, sizeof key, "\"kind\":\"%s\"", r->kind);
    const char *obj = NULL;
    size_t len = 0;
    for (const char *p = json; *p && !obj; ++p) { /* each object of the top-level array */
        if (*p != '{') continue;
        int depth = 0;
        const char *q = p;
        for (; *q; ++q) {
            depth += *q == '{' ? 1 : *q == '}' ? -1 : 0;
            if (depth == 0) break;
        }
        const char *k = strstr(p, key);
        if (k && k < q) obj = p, len = (size_t)(q - p);
        p = q;
    }
    if (!obj || !rig_json_true(obj, len, "available")) {
        fprintf(stderr, "kind %s is not available here: %s\n", r->kind, json);
        free(json);
        skip();
    }
    const char *mem = strstr(obj, "\"tensor_memory\":[");
    assert_true(mem && (size_t)(mem - obj) < len); /* a kind without capabilities fails here */
    r->caps.host_memory = strncmp(mem + 17, "\"host\"", 6) == 0;
    r->caps.drop_receiver = rig_json_true(obj, len, "drop_receiver");
    r->caps.reattach = rig_json_true(obj, len, "reattach");
    r->caps.collective = rig_json_true(obj, len, "collective");
    r->caps.gpu_per_receiver = rig_json_true(obj, len, "gpu_per_receiver");
    free(json);
}

/* ---- the fake driver, for kinds whose tensors are device memory ---------------------------- */
static void *rig_driver(void) {
    static void *h;
    if (h) return h;
    const char *path = getenv("WSYNC_CUDA_LIBRARY");
    assert_non_null(path); /* a GPU kind's conformance tests run on the fake (tests/CMakeLists) */
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    return h;
}
static void rig_call(const char *fn_name, int (*call)(void *fn)) {
    void *fn = dlsym(rig_driver(), fn_name);
    assert_non_null(fn);
    assert_int_equal(call(fn), 0);
}
static int rig_init_fn(void *fn) { return ((int (*)(unsigned))fn)(0); }
static int rig_ctx_fn(void *fn) {
    void *ctx = NULL;
    int rc = ((int (*)(void **, int))fn)(&ctx, 0);
    if (rc == 0) {
        int (*set)(void *) = (int (*)(void *))dlsym(rig_driver(), "cuCtxSetCurrent");
        rc = set ? set(ctx) : -1;
    }
    return rc;
}
/* Device memory on the trainer's GPU (device 0 of this process). */
static void *rig_device_alloc(size_t n) {
    rig_call("cuInit", rig_init_fn);
    rig_call("cuDevicePrimaryCtxRetain", rig_ctx_fn);
    int (*alloc)(unsigned long long *, size_t) =
        (int (*)(unsigned long long *, size_t))dlsym(rig_driver(), "cuMemAlloc_v2");
    unsigned long long p = 0;
    assert_true(alloc && alloc(&p, n) == 0);
    return (void *)(uintptr_t)p;
}

/* ---- options -------------------------------------------------------------------------------- */
static bool rig_has_option(const rig_t *r, const char *key) {
    char want[64];
    snprintf(want, sizeof want, "\"%s\"", key);
    return strstr(r->options_doc, want) != NULL;
}
/* The engine's strategy options: the kind's own, and GPU 0 of those it sees for GPU kinds. */
static void rig_engine_options(const rig_t *r, char *out, size_t n) {
    snprintf(out, n, "{%s%s%s}", r->make->both, *r->make->both && !r->caps.host_memory ? ", " : "",
             r->caps.host_memory ? "" : "\"device\": 0");
}

/* An engine's receiver state, as it answers "P": {failed_version, failed_status, completed_version, flags}. */
typedef struct {
    uint64_t failed_version, completed_version;
    uint32_t failed_status, flags;
} rig_poll_t;

#include "engine.h"

/* Engine processes a failed assertion left behind (frozen ones too) are killed at exit, so
 * none holds CTest's output open. */
static pid_t g_rig_pids[RIG_MAX_ENGINES];
static void rig_kill_leftovers(void) {
    for (int i = 0; i < RIG_MAX_ENGINES; ++i)
        if (g_rig_pids[i] > 0 && waitpid(g_rig_pids[i], NULL, WNOHANG) == 0) kill(g_rig_pids[i], SIGKILL);
}

/* Starts the rig for $WSYNC_CONFORMANCE_KIND with `processes` engine processes forked now,
 * each waiting to be given an index (rig_engine_start). */
static rig_t *rig_begin(int processes) {
    rig_t *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->kind = getenv("WSYNC_CONFORMANCE_KIND");
    assert_non_null(r->kind);
    for (size_t i = 0; i < sizeof kRigKinds / sizeof kRigKinds[0]; ++i)
        if (!strcmp(kRigKinds[i].kind, r->kind)) r->make = &kRigKinds[i];
    assert_non_null(r->make); /* a new kind: add how to make it to kRigKinds */
    rig_read_capabilities(r);
    OK(wsync_strategy_describe_options(r->kind, &r->options_doc));
    if (r->caps.gpu_per_receiver) /* the fake reads its GPUs at cuInit */
        setenv("WSYNC_FAKE_CUDA_DEVICES",
               "GPU-0c0f0000-0000-4000-8000-000000000000,GPU-1c0f0000-0000-4000-8000-000000000001,"
               "GPU-2c0f0000-0000-4000-8000-000000000002,GPU-3c0f0000-0000-4000-8000-000000000003",
               1);
    assert_true(processes <= RIG_MAX_ENGINES);
    for (int i = 0; i < processes; ++i) g_rig_pids[i] = (r->e[i] = tu_fork_peer(rig_engine_main, r)).pid;
    atexit(rig_kill_leftovers);
    r->engines = processes;
    return r;
}

/* Gives engine process `slot` its receiver index and mode (and the init info); does not wait. */
static void rig_engine_give(rig_t *r, int slot, uint32_t index, int mode) {
    uint8_t start[5];
    memcpy(start, &index, 4);
    start[4] = (uint8_t)mode;
    assert_int_equal(tu_send_frame(r->e[slot].to, start, 5), 0);
    assert_int_equal(tu_send_frame(r->e[slot].to, r->init.data, r->init.size), 0);
}
/* Starts engine process `slot` as receiver `index`; returns the status of its receiver_create. */
static uint8_t rig_engine_start(rig_t *r, int slot, uint32_t index, int mode) {
    rig_engine_give(r, slot, index, mode);
    return tu_peer_byte(&r->e[slot], 20000);
}

/* Opens the trainer with `receivers` receivers (and `buckets` buckets where the kind has them,
 * 0: its default) and attaches engine processes 0..receivers-1 as receivers 0..receivers-1 in
 * the given modes (NULL: all LOAD). A collective kind's sender joins with its receivers, so
 * every engine is given its index before the sender is made. */
static void rig_open(rig_t *r, int receivers, unsigned buckets, const int *modes) {
    char opts[512];
    int n = snprintf(opts, sizeof opts, "{\"receivers\": %d", receivers);
    if (rig_has_option(r, "bucket_bytes")) n += snprintf(opts + n, sizeof opts - (size_t)n, ", \"bucket_bytes\": 65536");
    if (buckets && rig_has_option(r, "buckets"))
        n += snprintf(opts + n, sizeof opts - (size_t)n, ", \"buckets\": %u", buckets);
    snprintf(opts + n, sizeof opts - (size_t)n, "%s%s}", *r->make->both ? ", " : "", r->make->both);
    OK(wsync_strategy_create(r->kind, opts, &r->strategy));
    OK(wsync_strategy_create_init_info(r->strategy, &r->init));
    for (int i = 0; i < receivers; ++i) rig_engine_give(r, i, (uint32_t)i, modes ? modes[i] : LOAD);
    OK(wsync_sender_create(r->strategy, r->init.data, r->init.size, &r->sender));
    for (int i = 0; i < receivers; ++i) assert_int_equal(tu_peer_byte(&r->e[i], 20000), 0);
    for (int k = 0; k < RIG_TENSORS; ++k) {
        r->data[k] = r->caps.host_memory ? calloc(1, RIG_BYTES) : rig_device_alloc(RIG_BYTES);
        assert_non_null(r->data[k]);
        r->t[k] = tu_tensor(kRigNames[k], r->data[k], kRigShape, 2, WSYNC_DTYPE_FLOAT, 32);
        if (!r->caps.host_memory) r->t[k].device.type = WSYNC_DEVICE_CUDA;
    }
}

/* Ends engine `slot` (it quits; 0 if it exited cleanly) and closes its pipes. */
static int rig_engine_stop(rig_t *r, int slot) {
    uint8_t q = 'Q';
    tu_send_frame(r->e[slot].to, &q, 1);
    int rc = tu_wait_child(r->e[slot].pid, 20000);
    close(r->e[slot].to);
    close(r->e[slot].from);
    r->e[slot].pid = 0;
    return rc;
}
/* SIGKILLs engine `slot` and reaps it. */
static void rig_engine_kill(rig_t *r, int slot) {
    kill(r->e[slot].pid, SIGKILL);
    assert_int_equal(tu_wait_child(r->e[slot].pid, 5000), 128 + SIGKILL);
    close(r->e[slot].to);
    close(r->e[slot].from);
    r->e[slot].pid = 0;
}

/* Ends every engine process still running (each must exit cleanly), then the trainer. */
static void rig_end(rig_t *r) {
    for (int i = 0; i < r->engines; ++i)
        if (r->e[i].pid) assert_int_equal(rig_engine_stop(r, i), 0);
    wsync_sender_destroy(r->sender);
    wsync_strategy_destroy(r->strategy);
    wsync_blob_free(&r->init);
    if (r->caps.host_memory)
        for (int k = 0; k < RIG_TENSORS; ++k) free(r->data[k]);
    wsync_string_free(r->options_doc);
    free(r);
}

/* Sends chunk c (0 or 1) of version v to the engines in `slots` (n of them); returns the status
 * of the send (the engines get nothing when it fails). */
static wsync_status_t rig_publish(rig_t *r, uint64_t v, int c, wsync_blob_t *req) {
    for (int k = 2 * c; k < 2 * c + 2; ++k) tu_fill(r->data[k], RIG_BYTES, v, (uint64_t)k);
    wsync_chunk_t ch = tu_chunk(&r->t[2 * c], 2, c == 1 ? WSYNC_CHUNK_LAST : 0);
    return wsync_sender_send_chunk(r->sender, &ch, req);
}
/* Delivers a request to the engines in `slots` (n of them). */
static void rig_deliver(rig_t *r, const wsync_blob_t *req, const int *slots, int n) {
    for (int i = 0; i < n; ++i) assert_int_equal(tu_send_frame(r->e[slots[i]].to, req->data, req->size), 0);
}
static wsync_status_t rig_send_chunk(rig_t *r, uint64_t v, int c, const int *slots, int n) {
    wsync_blob_t req;
    wsync_status_t st = rig_publish(r, v, c, &req);
    if (st != WSYNC_OK) return st;
    rig_deliver(r, &req, slots, n);
    wsync_blob_free(&req);
    return WSYNC_OK;
}
/* Engine `slot`'s answer to its next request (see engine.h). */
static uint8_t rig_answer(rig_t *r, int slot) { return tu_peer_byte(&r->e[slot], 20000); }

/* Both chunks of version v to the engines in `slots`; each loads both and completes v
 * bit-exact. The caller flushes. */
static void rig_send_version(rig_t *r, uint64_t v, const int *slots, int n) {
    for (int c = 0; c < 2; ++c) {
        OK(rig_send_chunk(r, v, c, slots, n));
        for (int i = 0; i < n; ++i) assert_int_equal(rig_answer(r, slots[i]), 0);
    }
}

static rig_poll_t rig_poll(rig_t *r, int slot) {
    uint8_t p = 'P';
    rig_poll_t got;
    assert_int_equal(tu_send_frame(r->e[slot].to, &p, 1), 0);
    assert_int_equal(tu_read_all(r->e[slot].from, &got, sizeof got, 20000), 0);
    return got;
}

static wsync_failure_t rig_failure(const rig_t *r, size_t i) {
    wsync_failure_t f = {.struct_size = sizeof f};
    OK(wsync_sender_failure(r->sender, i, &f));
    return f;
}
static size_t rig_failure_count(const rig_t *r) {
    size_t n = 0;
    OK(wsync_sender_failure_count(r->sender, &n));
    return n;
}

#endif
