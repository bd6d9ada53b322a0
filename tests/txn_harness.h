/* The harness of the multi-process transaction specifications (test_transactions.c,
 * test_isolation.c): a trainer in the test process and engines as forked processes that get
 * only init and request bytes over a pipe and answer one byte per request. */
#ifndef WSYNC_TXN_HARNESS_H
#define WSYNC_TXN_HARNESS_H

#include <signal.h>

#include "testutil.h"

#define NT 4 /* tensors per version, two chunks of two */
static const char *kNames[NT] = {"layers.0.q.weight", "layers.0.k.weight", "layers.1.q.weight",
                                 "layers.1.k.weight"};
static const int64_t kShape[2] = {64, 48};
#define TBYTES (64 * 48 * 4)

enum { MODE_LOAD = 0, MODE_FAIL_LAST_VIEW_AT_V2 = 1, MODE_FAIL_V1_CHUNK0 = 2, MODE_FAIL_V1_CHUNK1 = 3 };

/* The loader failures an engine in a MODE_FAIL_* mode reports, after taking every view. */
typedef struct {
    int mode;
    uint64_t version;
    uint32_t chunk;
    wsync_status_t status;
    const char *message;
} engine_failure_t;
static const engine_failure_t kEngineFailures[] = {
    {MODE_FAIL_LAST_VIEW_AT_V2, 2, 1, WSYNC_ERR_MISMATCH,
     "engine cannot load 'layers.1.k.weight': fused qkv shape differs"},
    {MODE_FAIL_V1_CHUNK0, 1, 0, WSYNC_ERR_MISMATCH, "engine cannot load 'layers.0.q.weight'"},
    {MODE_FAIL_V1_CHUNK1, 1, 1, WSYNC_ERR_INTEGRITY, "engine found 'layers.1.q.weight' corrupt"},
};
static const engine_failure_t *planned_failure(int mode, uint64_t version, uint32_t chunk) {
    for (size_t i = 0; i < sizeof kEngineFailures / sizeof kEngineFailures[0]; ++i)
        if (kEngineFailures[i].mode == mode && kEngineFailures[i].version == version &&
            kEngineFailures[i].chunk == chunk)
            return &kEngineFailures[i];
    return NULL;
}

typedef struct {
    const uint8_t *init;
    size_t init_len;
    uint32_t index;
    int mode;
    pid_t ns_pid; /* engine_in_pid_namespace_main(): the engine's pid inside its namespace */
} engine_cfg_t;

/* The engine turns hostile: writes pseudo-random words (raw, small, all-ones, 16-bit) over
 * every writable shared mapping of the segment, i.e. its whole control block and board.
 * Returns how many mappings it wrote. */
static int scribble_shared_control(uint64_t seed) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3) continue;
        if (!strstr(line, "/wsync-") || perms[1] != 'w' || perms[3] != 's') continue;
        for (unsigned long a = lo; a + 8 <= hi; a += 8) {
            uint64_t v = tu_splitmix(seed ^ a);
            switch (v & 3) {
                case 1: v = (v >> 2) & 7; break;
                case 2: v = ~0ull; break;
                case 3: v = (v >> 2) & 0xffff; break;
                default: break;
            }
            memcpy((void *)a, &v, 8);
        }
        ++n;
    }
    fclose(f);
    return n;
}

/* Engine: for each request frame, answers one byte: 0 chunk loaded, the status of a refused or
 * failed chunk, 50 if a completed version is not bit-exact, 51 if it did not complete. A frame
 * "S" + 8-byte seed makes it scribble over the shared control block (answer 0, or 52 if it found
 * no writable mapping of the segment); "F" forks a worker that keeps every descriptor and lives
 * until killed (answer: its pid, 4 bytes); "U" forks a child that tries the engine's receiver
 * (answer 0: refused as a copy, WRONG_STATE naming the fork, and its destroy left it be);
 * "Q" ends it. */
static int engine_main(const void *p, int in, int out) {
    const engine_cfg_t *cfg = (const engine_cfg_t *)p;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    if (wsync_strategy_create("shm", NULL, &s) != WSYNC_OK) return 10;
    if (wsync_receiver_create(s, cfg->init, cfg->init_len, cfg->index, &r) != WSYNC_OK) return 11;
    uint8_t ready = 0;
    tu_write_all(out, &ready, 1);
    static uint8_t weights[NT][TBYTES];
    for (;;) {
        uint8_t *req;
        size_t len;
        if (tu_recv_frame(in, &req, &len, 30000) != 0) break;
        if (len == 1 && req[0] == 'Q') {
            free(req);
            break;
        }
        if (len == 1 && req[0] == 'P') { /* poll: answers failed_version (low byte), then its status */
            free(req);
            wsync_receiver_state_t stt = {.struct_size = sizeof stt};
            uint8_t b[2] = {0xff, 0xff};
            if (wsync_receiver_poll(r, &stt) == WSYNC_OK)
                b[0] = (uint8_t)stt.failed_version, b[1] = (uint8_t)stt.failed_status;
            tu_write_all(out, b, 2);
            continue;
        }
        if (len == 1 && req[0] == 'F') { /* a worker forked now keeps our descriptors; answers its pid */
            free(req);
            pid_t w = fork();
            if (w == 0) {
                tu_detach_stdio(); /* keeps every other descriptor; the test kills it */
                for (;;) pause();
            }
            int32_t wp = (int32_t)w;
            tu_write_all(out, &wp, sizeof wp);
            continue;
        }
        if (len == 1 && req[0] == 'U') { /* a forked child tries our receiver: 0 if refused right */
            free(req);
            pid_t c = fork();
            if (c == 0) {
                wsync_receiver_state_t stt = {.struct_size = sizeof stt};
                int ok = wsync_receiver_poll(r, &stt) == WSYNC_ERR_WRONG_STATE &&
                         strstr(wsync_last_error(), "forked") != NULL;
                uint64_t done = 0;
                ok = ok && wsync_receiver_completed_version(r, &done) == WSYNC_ERR_WRONG_STATE;
                wsync_receiver_destroy(r); /* a copy: left as it is */
                _exit(ok ? 0 : 1);
            }
            uint8_t b = (uint8_t)tu_wait_child(c, 5000);
            tu_write_all(out, &b, 1);
            continue;
        }
        if (len == 9 && req[0] == 'S') { /* scribble, seeded by the frame's next 8 bytes */
            uint64_t seed;
            memcpy(&seed, req + 1, 8);
            free(req);
            uint8_t b = scribble_shared_control(seed) > 0 ? 0 : 52;
            tu_write_all(out, &b, 1);
            continue;
        }
        wsync_recv_t *it;
        wsync_status_t st = wsync_receiver_receive(r, req, len, &it);
        free(req);
        if (st != WSYNC_OK) {
            uint8_t b = (uint8_t)st;
            tu_write_all(out, &b, 1);
            continue;
        }
        wsync_recv_info_t info = {.struct_size = sizeof info};
        wsync_recv_info(it, &info);
        wsync_tensor_t v;
        bool has = true;
        while (has && (st = wsync_recv_next(it, &v, &has)) == WSYNC_OK && has)
            for (int k = 0; k < NT; ++k)
                if (strcmp(v.name, kNames[k]) == 0) memcpy(weights[k], v.data, TBYTES);
        const engine_failure_t *fail = planned_failure(cfg->mode, info.version, info.chunk_index);
        if (st == WSYNC_OK && fail) {
            /* Every view was taken; the loader fails afterwards. */
            wsync_recv_fail(it, fail->status, fail->message);
            uint8_t b = (uint8_t)fail->status;
            tu_write_all(out, &b, 1);
            continue;
        }
        st = st == WSYNC_OK ? wsync_recv_end(it) : (wsync_recv_end(it), st);
        uint8_t b = (uint8_t)st;
        if (st == WSYNC_OK && (info.flags & WSYNC_CHUNK_LAST)) {
            uint64_t done = 0;
            wsync_receiver_completed_version(r, &done);
            if (done != info.version) b = 51;
            for (int k = 0; k < NT; ++k)
                if (!tu_check(weights[k], TBYTES, info.version, (uint64_t)k)) b = 50;
        }
        tu_write_all(out, &b, 1);
    }
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    return 0;
}

typedef struct {
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
    float data[NT][TBYTES / 4];
    wsync_tensor_t t[NT];
} trainer_t;

static void trainer_open(trainer_t *tr, const char *options) {
    OK(wsync_strategy_create("shm", options, &tr->strategy));
    OK(wsync_strategy_create_init_info(tr->strategy, &tr->init));
    OK(wsync_sender_create(tr->strategy, tr->init.data, tr->init.size, &tr->sender));
    for (int k = 0; k < NT; ++k)
        tr->t[k] = tu_tensor(kNames[k], tr->data[k], kShape, 2, WSYNC_DTYPE_FLOAT, 32);
}
static void trainer_close(trainer_t *tr) {
    wsync_sender_destroy(tr->sender);
    wsync_strategy_destroy(tr->strategy);
    wsync_blob_free(&tr->init);
}

/* A trainer on the heap (its tensors take 48 KiB), opened with `options`; trainer_free() ends it. */
static trainer_t *trainer_new(const char *options) {
    trainer_t *tr = calloc(1, sizeof *tr);
    assert_non_null(tr);
    trainer_open(tr, options);
    return tr;
}
static void trainer_free(trainer_t *tr) {
    trainer_close(tr);
    free(tr);
}

static tu_peer_t start_engine(engine_cfg_t *cfg, const trainer_t *tr, uint32_t index, int mode) {
    cfg->init = tr->init.data;
    cfg->init_len = tr->init.size;
    cfg->index = index;
    cfg->mode = mode;
    tu_peer_t e = tu_fork_peer(engine_main, cfg);
    assert_int_equal(tu_peer_byte(&e, 5000), 0); /* attached */
    return e;
}
static void stop_engine(tu_peer_t *e) {
    uint8_t q = 'Q';
    tu_send_frame(e->to, &q, 1);
    assert_int_equal(tu_wait_child(e->pid, 5000), 0);
    close(e->to);
    close(e->from);
}

/* n engines of one trainer, all in the same mode: engine i is receiver i. `all` lists them as
 * send_chunk_to() and send_version_to() take them. */
#define MAX_ENGINES 3
typedef struct {
    engine_cfg_t cfg[MAX_ENGINES];
    tu_peer_t e[MAX_ENGINES];
    tu_peer_t *all[MAX_ENGINES];
} engines_t;

static void start_engines(engines_t *es, const trainer_t *tr, int n, int mode) {
    assert_true(n <= MAX_ENGINES);
    for (int i = 0; i < n; ++i) {
        es->e[i] = start_engine(&es->cfg[i], tr, (uint32_t)i, mode);
        es->all[i] = &es->e[i];
    }
}

/* Sends chunk c (0 or 1) of version v to the given engines; returns the send status. */
static wsync_status_t send_chunk_to(trainer_t *tr, uint64_t v, int c, tu_peer_t **es, int n) {
    for (int k = 2 * c; k < 2 * c + 2; ++k) tu_fill(tr->data[k], TBYTES, v, (uint64_t)k);
    wsync_chunk_t ch = tu_chunk(&tr->t[2 * c], 2, c == 1 ? WSYNC_CHUNK_LAST : 0);
    wsync_blob_t req;
    wsync_status_t st = wsync_sender_send_chunk(tr->sender, &ch, &req);
    if (st != WSYNC_OK) return st;
    for (int i = 0; i < n; ++i) assert_int_equal(tu_send_frame(es[i]->to, req.data, req.size), 0);
    wsync_blob_free(&req);
    return WSYNC_OK;
}

/* Sends both chunks of version v to the given engines, then checks that each loaded both and
 * completed the version bit-exact (answers 0 and 0). The caller flushes. */
static void send_version_to(trainer_t *tr, uint64_t v, tu_peer_t **es, int n) {
    OK(send_chunk_to(tr, v, 0, es, n));
    OK(send_chunk_to(tr, v, 1, es, n));
    for (int i = 0; i < n; ++i) {
        assert_int_equal(tu_peer_byte(es[i], 5000), 0);
        assert_int_equal(tu_peer_byte(es[i], 5000), 0); /* completed, bit-exact */
    }
}

static wsync_failure_t failure(const trainer_t *tr, size_t i) {
    wsync_failure_t f = {.struct_size = sizeof f};
    OK(wsync_sender_failure(tr->sender, i, &f));
    return f;
}

#endif
