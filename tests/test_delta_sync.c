/* Delta sync end to end over shm (docs/delta.md): a trainer in the test process, engines as
 * forked processes that get only init and request bytes over a pipe, copy every tensor into
 * their own memory with wsync_recv_copy and answer one status byte per request. Random change
 * patterns (NaN payloads, -0.0 vs 0.0, all, none, one element; every element size; scalars and
 * odd shapes) must leave every engine that completed a version bit-identical to the trainer;
 * failed, missed and abandoned versions are recovered by the dense version that follows. */
#include "testutil.h"

#define NT 9
static const char *kNames[NT] = {"scalar", "u8.odd", "bf16.7x5", "f32.1000", "f64.33x17",
                                 "c128.9", "i16x3.5", "bf16.4096", "f32.big"};
static const uint8_t kCode[NT] = {WSYNC_DTYPE_FLOAT, WSYNC_DTYPE_UINT, WSYNC_DTYPE_BFLOAT,
                                  WSYNC_DTYPE_FLOAT, WSYNC_DTYPE_FLOAT, WSYNC_DTYPE_COMPLEX,
                                  WSYNC_DTYPE_INT, WSYNC_DTYPE_BFLOAT, WSYNC_DTYPE_FLOAT};
static const uint8_t kBits[NT] = {32, 8, 16, 32, 64, 128, 16, 16, 32};
static const uint16_t kLanes[NT] = {1, 1, 1, 1, 1, 1, 3, 1, 1};
static const int32_t kNdim[NT] = {0, 1, 2, 1, 2, 1, 1, 1, 2};
static const int64_t kShapes[NT][2] = {{0, 0}, {3, 0}, {7, 5}, {1000, 0}, {33, 17},
                                       {9, 0},  {5, 0}, {4096, 0}, {128, 257}};
#define ENGINES 2

typedef struct {
    void *data[NT];
    size_t bytes[NT], esize[NT];
    int64_t shape[NT][2];
    wsync_tensor_t t[NT];
} model_t;

static void model_init(model_t *m, uint64_t seed) {
    for (int i = 0; i < NT; ++i) {
        size_t elems = 1;
        for (int d = 0; d < kNdim[i]; ++d) elems *= (size_t)kShapes[i][d], m->shape[i][d] = kShapes[i][d];
        m->esize[i] = (size_t)kBits[i] * kLanes[i] / 8;
        m->bytes[i] = elems * m->esize[i];
        /* torch-like: 64-byte aligned, size rounded up for aligned_alloc */
        m->data[i] = aligned_alloc(64, (m->bytes[i] + 63) / 64 * 64);
        tu_fill(m->data[i], m->bytes[i], seed, (uint64_t)i);
        /* some exact zeros to turn into -0.0 later */
        for (size_t e = 0; e < elems; e += 11) memset((char *)m->data[i] + e * m->esize[i], 0, m->esize[i]);
        m->t[i] = tu_tensor(kNames[i], m->data[i], m->shape[i], kNdim[i], kCode[i], kBits[i]);
        m->t[i].dtype.lanes = kLanes[i];
    }
}

static void model_free(model_t *m) {
    for (int i = 0; i < NT; ++i) free(m->data[i]);
}

static uint64_t rnd(uint64_t *s) { return *s = tu_splitmix(*s); }

/* One element changed in a way a float compare would miss or mangle. */
static void change_element(uint8_t *p, size_t es, uint64_t r) {
    static const uint8_t zero[32];
    switch (r % 4) {
    case 0: /* random bits */
        for (size_t b = 0; b < es; ++b) p[b] ^= (uint8_t)(tu_splitmix(r + b) | 1);
        break;
    case 1: /* +0.0 <-> -0.0, or any value's sign */
        p[es - 1] ^= 0x80;
        break;
    case 2: /* a NaN, then another payload of it */
        if (es == 4) {
            uint32_t nan = 0x7fc00000u | (uint32_t)(r >> 40 & 0x3fffff);
            memcpy(p, &nan, 4);
        } else if (es == 2) {
            uint16_t nan = (uint16_t)(0x7fc0u | (r >> 50 & 0x3f));
            memcpy(p, &nan, 2);
        } else {
            p[0] ^= 0x5a;
        }
        break;
    default: /* back to exact zero (if it was -0.0, only the sign bit changes) */
        if (memcmp(p, zero, es - 1) == 0) p[es - 1] = 0;
        else p[0] ^= 1;
    }
}

static void mutate(model_t *m, uint64_t *seed) {
    for (int i = 0; i < NT; ++i) {
        uint8_t *p = (uint8_t *)m->data[i];
        size_t es = m->esize[i], n = m->bytes[i] / es;
        switch (rnd(seed) % 5) {
        case 0: break; /* unchanged */
        case 1:        /* every element */
            for (size_t e = 0; e < n; ++e) p[e * es] ^= (uint8_t)(1 + e % 255);
            break;
        case 2: /* one element */
            change_element(p + rnd(seed) % n * es, es, rnd(seed));
            break;
        default: /* about 1-3% of the elements */
            for (size_t e = 0; e < n; ++e)
                if (rnd(seed) % 100 < 2) change_element(p + e * es, es, rnd(seed));
        }
    }
}

/* --- the engine process ----------------------------------------------------------------- */
/* How an engine loads. LOAD_COPY: wsync_recv_copy of every tensor whole into memory that holds
 * the last version. The others give the receiver the "delta_mirror" option and load into memory
 * scrubbed before every load, so nothing of the base is there: LOAD_VIEWS copies each tensor out
 * of its wsync_recv_next view; LOAD_HALVES takes each tensor in two wsync_recv_copy ranges, as
 * a loader of shards does; LOAD_PATCHES applies patches itself from wsync_recv_patch (its memory
 * does hold the base) and copies dense tensors. */
enum { LOAD_COPY, LOAD_VIEWS, LOAD_HALVES, LOAD_PATCHES };
static int g_load[ENGINES] = {LOAD_COPY, LOAD_COPY};

/* The kind under test: "shm" (default), or "ucx" (engines pull over loopback tcp; the trainer's
 * progress thread serves them), whose options both sides also need. */
static const char *g_kind = "shm";
#define UCX_SIDE "\"transports\": \"tcp\", \"net_devices\": \"lo\", \"timeout_ms\": 20000"
/* ucx only: engine k's "select" (a partial pull that still takes every tensor whole:
 * "select_rest": "whole"), or NULL. */
static const char *g_select[ENGINES] = {NULL, NULL};

typedef struct {
    uint32_t index;
    int load;
} engine_cfg_t;

/* CMD_SCRIBBLE: CMD_LOAD, then the engine writes into the view of tensor 7 (ignoring its
 * WSYNC_TENSOR_READ_ONLY flag): with LOAD_VIEWS that is the receiver's mirror. */
enum { CMD_LOAD = 'L', CMD_FAIL = 'F', CMD_STATE = 'S', CMD_REATTACH = 'A', CMD_SCRIBBLE = 'W' };

/* Loads entry k (tensor i, `bytes` long) into dst the engine's way. */
static wsync_status_t load_one(wsync_recv_t *it, size_t k, int load, void *dst, size_t bytes,
                               size_t esize, int scribble) {
    wsync_tensor_t v;
    wsync_recv_peek(it, k, &v);
    if (load == LOAD_COPY) return wsync_recv_copy(it, k, 0, dst, bytes);
    if (load == LOAD_PATCHES) {
        if (!(v.flags & WSYNC_TENSOR_PATCH)) return wsync_recv_copy(it, k, 0, dst, bytes);
        wsync_patch_t p = {.struct_size = sizeof p};
        wsync_status_t st = wsync_recv_patch(it, k, &p);
        if (st != WSYNC_OK) return st;
        for (uint64_t j = 0; j < p.count; ++j) {
            int64_t e = p.index_bits == 32 ? ((const int32_t *)p.indices)[j] : ((const int64_t *)p.indices)[j];
            memcpy((uint8_t *)dst + (size_t)e * esize, (const uint8_t *)p.values + j * esize, esize);
        }
        return XXH3_64bits(dst, bytes) == p.result_xxh3 ? WSYNC_OK : WSYNC_ERR_INTEGRITY;
    }
    memset(dst, 0xA5, bytes); /* no base here: the mirror must supply it */
    if (load == LOAD_HALVES) {
        size_t half = bytes / esize / 2 * esize;
        wsync_status_t st = wsync_recv_copy(it, k, half, (uint8_t *)dst + half, bytes - half);
        return st != WSYNC_OK ? st : wsync_recv_copy(it, k, 0, dst, half);
    }
    const char *name = v.name;
    bool has;
    wsync_status_t st = wsync_recv_next(it, &v, &has); /* entries are taken in order: this is k */
    if (st != WSYNC_OK) return st;
    if (!has || strcmp(v.name, name) != 0 || v.flags != WSYNC_TENSOR_READ_ONLY) return WSYNC_ERR_INTERNAL;
    memcpy(dst, v.data, bytes);
    if (scribble && strcmp(v.name, kNames[7]) == 0) ((uint8_t *)v.data)[5] ^= 0x40;
    return WSYNC_OK;
}

/* Frames down: CMD_LOAD/CMD_FAIL + request (receive, copy every tensor into its own memory;
 * CMD_FAIL then fails the chunk as a loader would), answered with one status byte; CMD_STATE,
 * answered with a frame of the completed version and the XXH3 of each tensor it holds;
 * CMD_REATTACH (a new receiver with the same index, memory kept), answered with a status byte. */
static int engine_main(const void *cfg_, int in, int out) {
    const engine_cfg_t *cfg = (const engine_cfg_t *)cfg_;
    /* The init info comes as the first frame: engines are forked before the trainer makes its
     * strategy, whose threads (the shm re-attach server) must not exist at a fork (a child can
     * inherit a lock one of them held: seen as an engine hung in ASan's allocator). */
    uint8_t *init;
    size_t init_len;
    if (tu_recv_frame(in, &init, &init_len, 20000) || !init) return 1;
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    const int ucx = strcmp(g_kind, "ucx") == 0;
    char opts[512];
    snprintf(opts, sizeof opts, "{%s%s%s%s%s}", ucx ? UCX_SIDE : "",
             cfg->load == LOAD_COPY ? "" : ucx ? ", \"delta_mirror\": true" : "\"delta_mirror\": true",
             ucx && g_select[cfg->index] ? ", \"select_rest\": \"whole\", \"select\": " : "",
             ucx && g_select[cfg->index] ? g_select[cfg->index] : "", "");
    if (wsync_strategy_create(g_kind, opts, &s) || wsync_receiver_create(s, init, init_len, cfg->index, &r))
        return 1;
    void *dst[NT] = {0};
    size_t dst_bytes[NT] = {0};
    for (;;) {
        uint8_t *f;
        size_t n;
        if (tu_recv_frame(in, &f, &n, 20000)) return 2;
        if (n == 0) break;
        if (f[0] == CMD_REATTACH) {
            wsync_receiver_destroy(r);
            uint8_t b = (uint8_t)wsync_receiver_create(s, init, init_len, cfg->index, &r);
            tu_write_all(out, &b, 1);
            free(f);
            continue;
        }
        if (f[0] == CMD_STATE) {
            uint64_t ans[NT + 1] = {0};
            wsync_receiver_completed_version(r, &ans[0]);
            for (int i = 0; i < NT; ++i) ans[i + 1] = dst[i] ? XXH3_64bits(dst[i], dst_bytes[i]) : 0;
            tu_send_frame(out, ans, sizeof ans);
            free(f);
            continue;
        }
        wsync_recv_t *it;
        wsync_status_t st = wsync_receiver_receive(r, f + 1, n - 1, &it);
        if (st == WSYNC_OK) {
            wsync_recv_info_t info = {.struct_size = sizeof info};
            wsync_recv_info(it, &info);
            for (size_t k = 0; k < info.count && st == WSYNC_OK; ++k) {
                wsync_tensor_t v;
                wsync_recv_peek(it, k, &v);
                int i = 0;
                while (i < NT && strcmp(kNames[i], v.name) != 0) ++i;
                if (i == NT) return 3;
                size_t bytes = (size_t)(v.dtype.bits * v.dtype.lanes / 8);
                for (int d = 0; d < v.ndim; ++d) bytes *= (size_t)v.shape[d];
                if (!dst[i]) dst[i] = calloc(1, bytes), dst_bytes[i] = bytes;
                st = load_one(it, k, cfg->load, dst[i], bytes, (size_t)(v.dtype.bits * v.dtype.lanes / 8),
                              f[0] == CMD_SCRIBBLE);
            }
            if (st == WSYNC_OK && f[0] == CMD_FAIL)
                st = wsync_recv_fail(it, WSYNC_ERR_INTEGRITY, "engine: planned failure") ? WSYNC_ERR_INTEGRITY : WSYNC_OK;
            else if (st == WSYNC_OK)
                st = wsync_recv_end(it);
            else
                wsync_recv_end(it);
        }
        uint8_t b = (uint8_t)st;
        tu_write_all(out, &b, 1);
        free(f);
    }
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    free(init);
    for (int i = 0; i < NT; ++i) free(dst[i]);
    return 0;
}

typedef struct {
    wsync_strategy_t *strategy;
    wsync_sender_t *sender;
    wsync_blob_t init;
    engine_cfg_t cfg[ENGINES];
    tu_peer_t e[ENGINES];
} rig_t;

static void rig_open(rig_t *g, const char *options) {
    for (uint32_t k = 0; k < ENGINES; ++k) {  /* fork first, then make handles */
        g->cfg[k] = (engine_cfg_t){k, g_load[k]};
        g->e[k] = tu_fork_peer(engine_main, &g->cfg[k]);
    }
    OK(wsync_strategy_create(g_kind, options, &g->strategy));
    OK(wsync_strategy_create_init_info(g->strategy, &g->init));
    OK(wsync_sender_create(g->strategy, g->init.data, g->init.size, &g->sender));
    for (uint32_t k = 0; k < ENGINES; ++k)
        assert_int_equal(tu_send_frame(g->e[k].to, g->init.data, g->init.size), 0);
    if (strcmp(g_kind, "ucx") == 0)  /* ucx engines attach on their own time: wait for each */
        for (uint32_t k = 0; k < ENGINES; ++k) {
            uint8_t c = CMD_STATE, *f;
            size_t n;
            assert_int_equal(tu_send_frame(g->e[k].to, &c, 1), 0);
            assert_int_equal(tu_recv_frame(g->e[k].from, &f, &n, 20000), 0);
            free(f);
        }
}

static void rig_close(rig_t *g) {
    for (int k = 0; k < ENGINES; ++k) {
        tu_send_frame(g->e[k].to, NULL, 0);
        assert_int_equal(tu_wait_child(g->e[k].pid, 10000), 0);
        close(g->e[k].to), close(g->e[k].from);
    }
    wsync_sender_destroy(g->sender);
    wsync_strategy_destroy(g->strategy);
    wsync_blob_free(&g->init);
}

static int g_scribbler = -1; /* the engine that gets CMD_SCRIBBLE instead of CMD_LOAD */

/* Forwards one request to every engine (engine `failing` fails it); returns each answer. */
static void forward(rig_t *g, const wsync_blob_t *req, int failing, uint8_t ans[ENGINES]) {
    uint8_t *frame = malloc(req->size + 1);
    memcpy(frame + 1, req->data, req->size);
    for (int k = 0; k < ENGINES; ++k) {
        frame[0] = k == failing ? CMD_FAIL : k == g_scribbler ? CMD_SCRIBBLE : CMD_LOAD;
        assert_int_equal(tu_send_frame(g->e[k].to, frame, req->size + 1), 0);
    }
    for (int k = 0; k < ENGINES; ++k) ans[k] = tu_peer_byte(&g->e[k], 20000);
    free(frame);
}

/* Forwards one request to engine k alone; returns its answer. */
static uint8_t forward_one(rig_t *g, int k, const wsync_blob_t *req) {
    uint8_t *frame = malloc(req->size + 1);
    frame[0] = CMD_LOAD;
    memcpy(frame + 1, req->data, req->size);
    assert_int_equal(tu_send_frame(g->e[k].to, frame, req->size + 1), 0);
    free(frame);
    return (uint8_t)tu_peer_byte(&g->e[k], 20000);
}

static int has_patches(const wsync_blob_t *req) {
    char *json;
    OK(wsync_blob_describe(req->data, req->size, &json));
    int yes = strstr(json, "\"patches\"") != NULL;
    wsync_string_free(json);
    return yes;
}

/* Engine k's completed version, and whether every tensor it holds is the trainer's. */
static uint64_t engine_state(rig_t *g, int k, const model_t *m, int *identical) {
    uint8_t c = CMD_STATE;
    assert_int_equal(tu_send_frame(g->e[k].to, &c, 1), 0);
    uint8_t *f;
    size_t n;
    assert_int_equal(tu_recv_frame(g->e[k].from, &f, &n, 20000), 0);
    assert_int_equal(n, sizeof(uint64_t) * (NT + 1));
    uint64_t ans[NT + 1];
    memcpy(ans, f, sizeof ans);
    free(f);
    *identical = 1;
    for (int i = 0; i < NT; ++i)
        if (ans[i + 1] != XXH3_64bits(m->data[i], m->bytes[i])) *identical = 0;
    return ans[0];
}

/* Sends the model as one version in three chunks; engine `failing` fails chunk `fail_chunk`;
 * with `abandon_after` >= 0 the trainer abandons after that chunk. Returns the version number
 * when it committed (0 if abandoned, by the trainer or by a send that heard of the engine's
 * failure: then *heard is set) and counts the chunks that carried patches. */
static uint64_t sync_version(rig_t *g, model_t *m, int failing, int fail_chunk, int abandon_after,
                             int *patched_chunks, int *heard) {
    static const size_t cut[4] = {0, 3, 6, NT};
    uint64_t v;
    OK(wsync_sender_version(g->sender, &v));
    for (int c = 0; c < 3; ++c) {
        wsync_chunk_t ch = tu_chunk(&m->t[cut[c]], cut[c + 1] - cut[c], c == 2 ? WSYNC_CHUNK_LAST : 0);
        wsync_blob_t req;
        wsync_status_t st = wsync_sender_send_chunk(g->sender, &ch, &req);
        if (st != WSYNC_OK) { /* it heard of an engine's failure: the version is abandoned */
            if (failing < 0 || st != WSYNC_ERR_PEER)
                fail_msg("send_chunk -> %s: %s", wsync_status_string(st), wsync_last_error());
            *heard = 1;
            return 0;
        }
        *patched_chunks += has_patches(&req);
        uint8_t ans[ENGINES];
        forward(g, &req, c == fail_chunk ? failing : -1, ans);
        wsync_blob_free(&req);
        if (c == abandon_after) {
            OK(wsync_sender_abandon(g->sender));
            return 0;
        }
    }
    return v;
}

static void property(const char *options, uint64_t seed, int versions) {
    rig_t g;
    rig_open(&g, options);
    model_t m;
    model_init(&m, seed);
    int patched = 0, recovered = 0;
    int dense_due = 1; /* the first version, and any after a failure or abandon, is dense */
    for (int step = 0; step < versions; ++step) {
        if (step) mutate(&m, &seed);
        uint64_t r = rnd(&seed) % 10;
        int failing = r == 0 ? (int)(rnd(&seed) % ENGINES) : -1;
        int abandon_after = r == 1 ? (int)(rnd(&seed) % 2) : -1;
        int before = patched, heard = 0;
        uint64_t v = sync_version(&g, &m, failing, (int)(rnd(&seed) % 3), abandon_after, &patched, &heard);
        if (dense_due) assert_int_equal(patched, before); /* no patch right after trouble */
        wsync_status_t fl = wsync_sender_flush(g.sender, 5000);
        if (fl == WSYNC_ERR_PEER && failing >= 0) heard = 1;
        else OK(fl);
        if (failing >= 0) assert_true(heard); /* the trainer learnt of it, by send or flush */
        for (int k = 0; k < ENGINES; ++k) {
            int same;
            uint64_t done = engine_state(&g, k, &m, &same);
            if (v && k != failing) {
                assert_int_equal(done, v);
                if (!same) fail_msg("engine %d is not bit-identical after version %llu (seed %llu)", k,
                                    (unsigned long long)v, (unsigned long long)seed);
                if (dense_due && step) ++recovered;
            } else {
                assert_true(done < v || v == 0);
            }
        }
        dense_due = failing >= 0 || abandon_after >= 0;
    }
    assert_true(patched > versions / 3); /* the patch path did run */
    assert_true(recovered > 0); /* and the dense fallback did too */
    model_free(&m);
    rig_close(&g);
}

static void random_versions_leave_every_engine_bit_identical_with_delta_auto(void **state) {
    (void)state;
    for (uint64_t seed = 1; seed <= 3; ++seed)
        property("{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\"}", seed, 40);
}

/* The trainer compares a chunk's tensors on several threads at once ("delta_threads"); one
 * thread, and more threads than this machine has cores, give the same bit-identical engines. */
static void random_versions_leave_every_engine_bit_identical_with_1_or_4_compare_threads(void **state) {
    (void)state;
    property("{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\", \"delta_threads\": 1}", 11, 30);
    property("{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\", \"delta_threads\": 4}", 12, 30);
}

static void random_versions_leave_every_engine_bit_identical_with_delta_on(void **state) {
    (void)state;
    property("{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"on\", \"checksum\": false}", 7, 40);
}

/* An engine that re-attaches (a new receiver, same index: it holds no base) is admitted at the
 * next version's first chunk, and the trainer, seeing it admitted, sends that version dense:
 * both engines complete it bit-identical, no version is lost, and patches follow. */
static void reattach_spec(const char *options, uint64_t seed) {
    rig_t g;
    rig_open(&g, options);
    model_t m;
    model_init(&m, seed);
    uint8_t ans[ENGINES];
    for (int step = 1; step <= 4; ++step) {
        if (step > 1) ((uint8_t *)m.data[3])[8 * step] ^= 1;
        if (step == 3) {
            uint8_t c = CMD_REATTACH;
            assert_int_equal(tu_send_frame(g.e[1].to, &c, 1), 0);
            assert_int_equal(tu_peer_byte(&g.e[1], 20000), WSYNC_OK);
        }
        wsync_chunk_t ch = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(g.sender, &ch, &req));
        assert_int_equal(has_patches(&req), step == 2 || step == 4); /* 3: dense for the newcomer */
        forward(&g, &req, -1, ans);
        wsync_blob_free(&req);
        assert_int_equal(ans[0], WSYNC_OK);
        assert_int_equal(ans[1], WSYNC_OK);
        OK(wsync_sender_flush(g.sender, 5000));
        for (int k = 0; k < ENGINES; ++k) {
            int same;
            assert_int_equal(engine_state(&g, k, &m, &same), (uint64_t)step);
            assert_true(same);
        }
    }
    for (int k = 0; k < ENGINES; ++k) {
        int same;
        assert_int_equal(engine_state(&g, k, &m, &same), 4);
        assert_true(same);
    }
    model_free(&m);
    rig_close(&g);
}

static void a_reattached_receiver_is_sent_the_next_version_dense_and_patches_follow(void **state) {
    (void)state;
    reattach_spec("{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\"}", 11);
}

/* With delta "on" a patch of a tensor that changed everywhere (indices and values, twice the
 * tensor's bytes) may not fit the bucket the tensor fits. The refusal says it is the patch
 * (delta user trial: the message named "tensor 'w' of 80032 bytes" for a 40000-byte tensor) and
 * that "auto" never makes such patches; "auto" sends the same change (dense) and it lands. */
static void a_patch_too_large_for_the_bucket_is_named_as_a_patch(void **state) {
    (void)state;
    static float w[10000];
    int64_t shape[1] = {10000};
    for (int i = 0; i < 10000; ++i) w[i] = (float)i;
    wsync_tensor_t t = tu_tensor("w", w, shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    const char *modes[2] = {"{\"bucket_bytes\": 65536, \"delta\": \"on\"}",
                            "{\"bucket_bytes\": 65536, \"delta\": \"auto\", \"delta_decide\": \"size\"}"};
    for (int m = 0; m < 2; ++m) {
        wsync_strategy_t *s, *rs;
        wsync_blob_t init, req;
        wsync_sender_t *snd;
        wsync_receiver_t *r;
        wsync_recv_t *it;
        static float dst[10000];
        OK(wsync_strategy_create("shm", modes[m], &s));
        OK(wsync_strategy_create_init_info(s, &init));
        OK(wsync_sender_create(s, init.data, init.size, &snd));
        OK(wsync_strategy_create("shm", NULL, &rs));
        OK(wsync_receiver_create(rs, init.data, init.size, 0, &r));
        for (int v = 1; v <= 2; ++v) {
            if (v == 2)
                for (int i = 0; i < 10000; ++i) w[i] += 1.0f; /* every element changed */
            if (v == 2 && m == 0) {
                EXPECT_ERR(wsync_sender_send_chunk(snd, &ch, &req), WSYNC_ERR_INVALID_ARGUMENT,
                           "the delta patch of tensor 'w' (");
                assert_non_null(strstr(wsync_last_error(), "bytes: indices and values) would end "
                                                           "past it"));
                assert_non_null(strstr(wsync_last_error(), "use delta \"auto\""));
                break;
            }
            OK(wsync_sender_send_chunk(snd, &ch, &req));
            OK(wsync_receiver_receive(r, req.data, req.size, &it));
            wsync_blob_free(&req);
            OK(wsync_recv_copy(it, 0, 0, dst, sizeof dst));
            OK(wsync_recv_end(it));
            assert_memory_equal(dst, w, sizeof w);
        }
        for (int i = 0; i < 10000; ++i) w[i] = (float)i;
        wsync_receiver_destroy(r);
        wsync_sender_destroy(snd);
        wsync_blob_free(&init);
        wsync_strategy_destroy(rs);
        wsync_strategy_destroy(s);
    }
}

/* An engine whose memory no longer holds the base (it changed a weight itself) refuses the
 * patch and keeps what it had; the next version is dense and makes it whole. */
static void a_destination_without_the_base_is_left_unchanged_and_refused(void **state) {
    (void)state;
    wsync_strategy_t *s, *rs;
    wsync_blob_t init, req;
    wsync_sender_t *snd;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("shm", "{\"bucket_bytes\": 1048576, \"delta\": \"on\"}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    OK(wsync_sender_create(s, init.data, init.size, &snd));
    OK(wsync_strategy_create("shm", NULL, &rs));
    OK(wsync_receiver_create(rs, init.data, init.size, 0, &r));
    float w[256], dst[256], kept[256];
    int64_t shape[1] = {256};
    for (int i = 0; i < 256; ++i) w[i] = (float)i;
    wsync_tensor_t t = tu_tensor("w", w, shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_recv_t *it;
    for (int v = 1; v <= 3; ++v) {
        if (v > 1) w[v] = -w[v];
        OK(wsync_sender_send_chunk(snd, &ch, &req));
        OK(wsync_receiver_receive(r, req.data, req.size, &it));
        wsync_blob_free(&req);
        if (v == 2) {
            dst[100] = 0.5f; /* the engine's own change */
            memcpy(kept, dst, sizeof dst);
            EXPECT_ERR(wsync_recv_copy(it, 0, 0, dst, sizeof dst), WSYNC_ERR_MISMATCH,
                       "the destination does not hold version 1 of it");
            assert_memory_equal(dst, kept, sizeof dst);
            EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_MISMATCH, "left unchanged");
            assert_int_equal(wsync_sender_flush(snd, 5000), WSYNC_ERR_PEER);
            continue;
        }
        wsync_tensor_t view;
        bool has;
        if (v == 3) { /* dense after the failure: a view works too */
            OK(wsync_recv_next(it, &view, &has));
            assert_true(has);
        }
        OK(wsync_recv_copy(it, 0, 0, dst, sizeof dst));
        OK(wsync_recv_end(it));
        assert_memory_equal(dst, w, sizeof w);
    }
    OK(wsync_sender_flush(snd, 5000));
    /* Version 4 is a patch again: a view of it is refused by name, a partial copy too. */
    w[7] = 1e9f;
    OK(wsync_sender_send_chunk(snd, &ch, &req));
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    wsync_blob_free(&req);
    EXPECT_ERR(wsync_recv_copy(it, 0, 4, dst, 8), WSYNC_ERR_INVALID_ARGUMENT, "is a patch: copy it whole");
    wsync_tensor_t view;
    bool has;
    EXPECT_ERR(wsync_recv_next(it, &view, &has), WSYNC_ERR_UNSUPPORTED, "is a patch against version 3");
    wsync_recv_end(it);
    wsync_receiver_destroy(r);
    wsync_sender_destroy(snd);
    wsync_strategy_destroy(rs);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* "delta_anchor_every": 3 makes versions 1, 4, 7 dense; the others carry patches. */
static void anchors_make_every_nth_version_dense(void **state) {
    (void)state;
    wsync_strategy_t *s, *rs;
    wsync_blob_t init, req;
    wsync_sender_t *snd;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("shm", "{\"bucket_bytes\": 65536, \"delta\": \"auto\", \"delta_decide\": \"size\", \"delta_anchor_every\": 3}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    OK(wsync_sender_create(s, init.data, init.size, &snd));
    OK(wsync_strategy_create("shm", NULL, &rs));
    OK(wsync_receiver_create(rs, init.data, init.size, 0, &r));
    uint16_t w[4096], dst[4096];
    int64_t shape[1] = {4096};
    for (int i = 0; i < 4096; ++i) w[i] = (uint16_t)i;
    wsync_tensor_t t = tu_tensor("w", w, shape, 1, WSYNC_DTYPE_BFLOAT, 16);
    wsync_chunk_t ch = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    for (int v = 1; v <= 7; ++v) {
        w[v * 13] ^= 0x8000;
        OK(wsync_sender_send_chunk(snd, &ch, &req));
        assert_int_equal(has_patches(&req), v % 3 != 1);
        wsync_recv_t *it;
        OK(wsync_receiver_receive(r, req.data, req.size, &it));
        wsync_blob_free(&req);
        OK(wsync_recv_copy(it, 0, 0, dst, sizeof dst));
        OK(wsync_recv_end(it));
        assert_memory_equal(dst, w, sizeof w);
    }
    OK(wsync_sender_flush(snd, 5000));
    wsync_receiver_destroy(r);
    wsync_sender_destroy(snd);
    wsync_strategy_destroy(rs);
    wsync_strategy_destroy(s);
    wsync_blob_free(&init);
}

/* "delta_mirror": engines that load from views, or by ranges into memory that never held the
 * base, or apply wsync_recv_patch themselves, stay bit-identical through random versions; the
 * receiver's own copy supplies the base and every result is verified. */
static void engines_with_a_mirror_load_patched_tensors_from_views_and_ranges_bit_identical(void **state) {
    (void)state;
    g_load[0] = LOAD_VIEWS, g_load[1] = LOAD_HALVES;
    property("{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"auto\", \"delta_decide\": \"size\"}", 11, 40);
    g_load[0] = LOAD_PATCHES, g_load[1] = LOAD_VIEWS;
    property("{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"on\", \"checksum\": false}", 12, 30);
    g_load[0] = g_load[1] = LOAD_COPY;
}

/* An engine that writes into a view of its mirror (ignoring WSYNC_TENSOR_READ_ONLY) is not
 * patched into a mix: the next patch of that tensor fails there with WSYNC_ERR_MISMATCH naming
 * the mirror and the version, the trainer's flush names the engine, the other engine completes,
 * and the dense version that follows makes the first whole again. */
static void a_mirror_written_through_a_view_refuses_the_next_patch_and_the_dense_version_heals_it(void **state) {
    (void)state;
    g_load[0] = LOAD_VIEWS, g_load[1] = LOAD_VIEWS;
    rig_t g;
    rig_open(&g, "{\"receivers\": 2, \"bucket_bytes\": 1048576, \"delta\": \"on\"}");
    model_t m;
    model_init(&m, 21);
    int patched = 0, heard = 0, same;
    assert_int_equal(sync_version(&g, &m, -1, -1, -1, &patched, &heard), 1);
    OK(wsync_sender_flush(g.sender, 5000));
    ((uint8_t *)m.data[7])[100] ^= 1;
    g_scribbler = 0; /* engine 0 writes into its mirror of tensor 7 after loading version 2 */
    assert_int_equal(sync_version(&g, &m, -1, -1, -1, &patched, &heard), 2);
    g_scribbler = -1;
    OK(wsync_sender_flush(g.sender, 5000));
    assert_true(patched > 0);
    ((uint8_t *)m.data[7])[200] ^= 1;
    static const size_t cut[4] = {0, 3, 6, NT};
    uint8_t ans[ENGINES], last[ENGINES];
    memset(last, 0, sizeof last);
    for (int c = 0; c < 3; ++c) {
        wsync_chunk_t ch = tu_chunk(&m.t[cut[c]], cut[c + 1] - cut[c], c == 2 ? WSYNC_CHUNK_LAST : 0);
        wsync_blob_t req;
        wsync_status_t st = wsync_sender_send_chunk(g.sender, &ch, &req);
        if (st != WSYNC_OK) {
            assert_int_equal(st, WSYNC_ERR_PEER); /* it heard of engine 0 before the last chunk */
            break;
        }
        forward(&g, &req, -1, ans);
        wsync_blob_free(&req);
        if (c == 2) memcpy(last, ans, sizeof ans);
        if (c == 2) assert_int_equal(ans[0], WSYNC_ERR_MISMATCH); /* chunk 2 holds tensor 7 */
    }
    wsync_status_t fl = wsync_sender_flush(g.sender, 5000);
    if (last[1] == WSYNC_OK) {
        assert_int_equal(fl, WSYNC_ERR_PEER);
        assert_non_null(strstr(wsync_last_error(), "receiver 0"));
        assert_non_null(strstr(wsync_last_error(), "mirror does not hold version 2"));
        uint64_t done = engine_state(&g, 1, &m, &same);
        assert_int_equal(done, 3);
        assert_true(same);
    }
    assert_int_equal(engine_state(&g, 0, &m, &same), 2);
    /* The next version is dense for everyone and heals engine 0's mirror. */
    ((uint8_t *)m.data[7])[300] ^= 1;
    patched = 0;
    uint64_t v = sync_version(&g, &m, -1, -1, -1, &patched, &heard);
    assert_int_equal(v, 4);
    assert_int_equal(patched, 0);
    OK(wsync_sender_flush(g.sender, 5000));
    for (int k = 0; k < ENGINES; ++k) {
        assert_int_equal(engine_state(&g, k, &m, &same), v);
        assert_true(same);
    }
    /* and patches flow again */
    ((uint8_t *)m.data[7])[400] ^= 1;
    patched = 0;
    v = sync_version(&g, &m, -1, -1, -1, &patched, &heard);
    assert_true(patched > 0);
    OK(wsync_sender_flush(g.sender, 5000));
    for (int k = 0; k < ENGINES; ++k) {
        assert_int_equal(engine_state(&g, k, &m, &same), v);
        assert_true(same);
    }
    model_free(&m);
    rig_close(&g);
    g_load[0] = g_load[1] = LOAD_COPY;
}

static void kinds_without_delta_refuse_it_by_name_and_every_kind_lists_the_options(void **state) {
    (void)state;
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    /* The GPU kinds carry delta on the GPU (test_gpu_strategies), where a host mirror has no use. */
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"delta_mirror\": true}", &s), WSYNC_ERR_UNSUPPORTED,
               "applies patches on the GPU");
    assert_null(s);
    EXPECT_ERR(wsync_strategy_create("nccl_broadcast", "{\"delta_mirror\": true}", &s), WSYNC_ERR_UNSUPPORTED,
               "applies patches on the GPU");
    assert_null(s);
    /* shm's bases are host memory already: pinned host bases are a GPU kinds' choice. */
    EXPECT_ERR(wsync_strategy_create("shm", "{\"delta\": \"auto\", \"delta_base_memory\": \"pinned_host\"}", &s),
               WSYNC_ERR_UNSUPPORTED, "option 'delta_base_memory' is \"pinned_host\", but this kind compares host");
    assert_null(s);
    EXPECT_ERR(wsync_strategy_create("shm", "{\"delta_base_memory\": \"gpu\"}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "delta_base_memory");
    assert_null(s);
    /* ucx carries delta too (below), on host memory; where this build or machine has no UCX
       the kind is unavailable or unknown instead. */
    wsync_strategy_t *u = NULL;
    wsync_status_t st = wsync_strategy_create("ucx", "{\"delta\": \"on\", \"net_devices\": \"lo\"}", &u);
    if (st == WSYNC_OK) wsync_strategy_destroy(u);
    else assert_true(st == WSYNC_ERR_UNAVAILABLE || st == WSYNC_ERR_UNSUPPORTED);
    for (int k = 0; k < 2; ++k) { /* every kind lists the delta options */
        char *json;
        OK(wsync_strategy_describe_options(k ? "cuda_ipc" : "shm", &json));
        assert_non_null(strstr(json, "\"delta_anchor_every\""));
        assert_non_null(strstr(json, "\"delta_max_percent\""));
        assert_non_null(strstr(json, "\"delta_mirror\""));
        wsync_string_free(json);
    }
    EXPECT_ERR(wsync_strategy_create("shm", "{\"delta\": \"sometimes\"}", &s), WSYNC_ERR_INVALID_ARGUMENT, "delta");
    EXPECT_ERR(wsync_strategy_create("shm", "{\"delta_max_percent\": 101}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "delta_max_percent");
}

/* ---- the same specifications over ucx --------------------------------------------------- */
/* Skips where this build or machine has no ucx kind. */
static void use_ucx(void) {
    wsync_strategy_t *s = NULL;
    if (wsync_strategy_create("ucx", "{" UCX_SIDE "}", &s) != WSYNC_OK) {
        print_message("skipped: %s\n", wsync_last_error());
        skip();
    }
    wsync_strategy_destroy(s);
    g_kind = "ucx";
}

/* Random versions over ucx: engines pull patches across the "network" and stay bit-identical;
 * a failed or abandoned version is healed by the next one, dense. */
static void ucx_random_versions_leave_every_engine_bit_identical_with_delta_auto(void **state) {
    (void)state;
    use_ucx();
    for (uint64_t seed = 21; seed <= 22; ++seed)
        property("{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"auto\", \"delta_decide\": \"size\"}", seed, 30);
    property("{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"on\", \"checksum\": false}", 23, 30);
    g_kind = "shm";
}

/* Engines that keep a mirror and load from views or ranges, over ucx. */
static void ucx_engines_with_a_mirror_stay_bit_identical(void **state) {
    (void)state;
    use_ucx();
    g_load[0] = LOAD_VIEWS, g_load[1] = LOAD_HALVES;
    property("{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"auto\", \"delta_decide\": \"size\"}", 24, 25);
    g_load[0] = g_load[1] = LOAD_COPY;
    g_kind = "shm";
}

/* An engine that re-attaches over ucx (a new receiver, same index, no base) makes the trainer's
 * next version dense (the sender's begin_version hears of the attach); patches follow. */
static void ucx_a_reattached_receiver_is_sent_the_next_version_dense_and_patches_follow(void **state) {
    (void)state;
    use_ucx();
    reattach_spec("{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"auto\", \"delta_decide\": \"size\"}", 31);
    g_kind = "shm";
}

/* An engine that attaches after the trainer began a version (here: its first chunk was refused
 * after the version began, the engine attached, and the chunk was sent again) does not owe that
 * version, which was already decided as patches: it fails it with MISMATCH (it holds no base),
 * the trainer's flush does not count that against it, the next version is dense for it, and
 * patches follow. */
static void ucx_an_engine_attaching_after_a_version_began_does_not_owe_it(void **state) {
    (void)state;
    use_ucx();
    rig_t g;
    rig_open(&g, "{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"auto\", \"delta_decide\": \"size\"}");
    model_t m;
    model_init(&m, 41);
    uint8_t ans[ENGINES];
    for (int step = 1; step <= 5; ++step) {
        if (step > 1) ((uint8_t *)m.data[3])[8 * step] ^= 1;
        wsync_chunk_t ch = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        if (step == 3) {
            /* The version begins, then its first chunk is refused (a tensor said to be in GPU
               memory: the host compare refuses it by name); meanwhile engine 1 re-attaches. */
            wsync_tensor_t bad[NT];
            memcpy(bad, m.t, sizeof bad);
            bad[4].device.type = WSYNC_DEVICE_CUDA;
            wsync_chunk_t bc = tu_chunk(bad, NT, WSYNC_CHUNK_LAST);
            assert_int_equal(wsync_sender_send_chunk(g.sender, &bc, &req), WSYNC_ERR_UNSUPPORTED);
            uint8_t c = CMD_REATTACH;
            assert_int_equal(tu_send_frame(g.e[1].to, &c, 1), 0);
            assert_int_equal(tu_peer_byte(&g.e[1], 20000), WSYNC_OK);
        }
        OK(wsync_sender_send_chunk(g.sender, &ch, &req));
        assert_int_equal(has_patches(&req), step == 2 || step == 3 || step == 5); /* 4: dense for it */
        forward(&g, &req, -1, ans);
        wsync_blob_free(&req);
        assert_int_equal(ans[0], WSYNC_OK);
        assert_int_equal(ans[1], step == 3 ? WSYNC_ERR_MISMATCH : WSYNC_OK);
        OK(wsync_sender_flush(g.sender, 5000)); /* it did not owe version 3 */
        for (int k = 0; k < ENGINES; ++k) {
            int same;
            const uint64_t done = engine_state(&g, k, &m, &same);
            if (k == 1 && step == 3) {
                assert_int_equal(done, 0);
            } else {
                assert_int_equal(done, (uint64_t)step);
                assert_true(same);
            }
        }
    }
    model_free(&m);
    rig_close(&g);
    g_kind = "shm";
}

/* An engine that takes patches itself (wsync_recv_patch: indices and values, applied onto the
 * memory that holds the base) beside one that loads from its mirror's views, over ucx. */
static void ucx_engines_applying_patches_themselves_stay_bit_identical(void **state) {
    (void)state;
    use_ucx();
    g_load[0] = LOAD_PATCHES, g_load[1] = LOAD_VIEWS;
    property("{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"auto\", \"delta_decide\": \"size\"}", 25, 25);
    g_load[0] = g_load[1] = LOAD_COPY;
    g_kind = "shm";
}

/* The trainer keeps two versions pullable ("keep_versions": 2, the default). Engine 1 falls
 * behind: it is handed version N-1 only after the trainer committed N, then N, each a patch on the
 * version before, and ends bit-identical with the trainer (it applies N-1 first, which is N's
 * base). Then it skips a version: handed N+2 while it holds N, it fails it with MISMATCH (its
 * completed version is not the patch's base); the trainer's flush hears of it (PEER), the next
 * version is dense, and both engines hold it bit-identical; patches follow. */
static void ucx_an_engine_behind_pulls_kept_versions_in_order_and_one_that_skips_is_healed_dense(void **state) {
    (void)state;
    use_ucx();
    rig_t g;
    rig_open(&g, "{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"auto\", \"delta_decide\": \"size\", \"keep_versions\": 2}");
    model_t m;
    model_init(&m, 61);
    wsync_blob_t req[8];
    uint8_t ans[ENGINES];
    for (int v = 1; v <= 7; ++v) {
        if (v > 1) ((uint8_t *)m.data[3])[8 * v] ^= 1;
        wsync_chunk_t ch = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
        OK(wsync_sender_send_chunk(g.sender, &ch, &req[v]));
        switch (v) {
        case 1: /* both load it */
        case 7:
            assert_int_equal(has_patches(&req[v]), v == 7);
            forward(&g, &req[v], -1, ans);
            assert_int_equal(ans[0], WSYNC_OK);
            assert_int_equal(ans[1], WSYNC_OK);
            OK(wsync_sender_flush(g.sender, 5000));
            break;
        case 2: /* engine 0 only, for now */
            assert_true(has_patches(&req[v]));
            assert_int_equal(forward_one(&g, 0, &req[v]), WSYNC_OK);
            break;
        case 3: /* engine 0; then engine 1 catches up: 2, then 3 */
            assert_true(has_patches(&req[v]));
            assert_int_equal(forward_one(&g, 0, &req[v]), WSYNC_OK);
            assert_int_equal(forward_one(&g, 1, &req[2]), WSYNC_OK);
            assert_int_equal(forward_one(&g, 1, &req[3]), WSYNC_OK);
            OK(wsync_sender_flush(g.sender, 5000));
            break;
        case 4: /* engine 0 only: engine 1 misses it */
            assert_true(has_patches(&req[v]));
            assert_int_equal(forward_one(&g, 0, &req[v]), WSYNC_OK);
            break;
        case 5: { /* engine 1 is handed 5 while it holds 3 */
            assert_true(has_patches(&req[v]));
            forward(&g, &req[v], -1, ans);
            assert_int_equal(ans[0], WSYNC_OK);
            assert_int_equal(ans[1], WSYNC_ERR_MISMATCH);
            assert_int_equal(wsync_sender_flush(g.sender, 5000), WSYNC_ERR_PEER);
            break;
        }
        case 6: /* dense, for both */
            assert_false(has_patches(&req[v]));
            forward(&g, &req[v], -1, ans);
            assert_int_equal(ans[0], WSYNC_OK);
            assert_int_equal(ans[1], WSYNC_OK);
            OK(wsync_sender_flush(g.sender, 5000));
            break;
        }
        for (int k = 0; k < ENGINES; ++k) {
            int same;
            const uint64_t done = engine_state(&g, k, &m, &same);
            const uint64_t want = k == 1 && v == 2 ? 1 : k == 1 && (v == 4 || v == 5) ? 3 : (uint64_t)v;
            if (done != want) fail_msg("after version %d engine %d holds %llu, not %llu", v, k,
                                       (unsigned long long)done, (unsigned long long)want);
            assert_int_equal(same, done == (uint64_t)v);
        }
    }
    for (int v = 1; v <= 7; ++v) wsync_blob_free(&req[v]);
    model_free(&m);
    rig_close(&g);
    g_kind = "shm";
}

/* An engine with a selection ("select", a partial pull) cannot take a patch: each version the
 * trainer sends as patches fails on it with UNSUPPORTED (the other engine loads it), the
 * trainer's flush hears of it (PEER), and the next version is dense for both, which heals it:
 * patches come every other version, as docs/delta.md says, and no version leaves either engine
 * holding a mix. */
static void ucx_an_engine_with_a_selection_fails_patch_versions_and_dense_ones_heal_it(void **state) {
    (void)state;
    use_ucx();
    g_select[0] = "[{\"tensor\": \"f32.1000\"}]";
    rig_t g;
    rig_open(&g, "{" UCX_SIDE ", \"receivers\": 2, \"delta\": \"auto\", \"delta_decide\": \"size\"}");
    model_t m;
    model_init(&m, 71);
    uint8_t ans[ENGINES];
    for (int v = 1; v <= 6; ++v) {
        if (v > 1) ((uint8_t *)m.data[3])[8 * v] ^= 1;
        wsync_chunk_t ch = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(g.sender, &ch, &req));
        const int patched = has_patches(&req);
        assert_int_equal(patched, v % 2 == 0); /* 1 first, 3 and 5 after a failure: dense */
        forward(&g, &req, -1, ans);
        wsync_blob_free(&req);
        assert_int_equal(ans[0], patched ? WSYNC_ERR_UNSUPPORTED : WSYNC_OK);
        assert_int_equal(ans[1], WSYNC_OK);
        assert_int_equal(wsync_sender_flush(g.sender, 5000), patched ? WSYNC_ERR_PEER : WSYNC_OK);
        for (int k = 0; k < ENGINES; ++k) {
            int same;
            const uint64_t done = engine_state(&g, k, &m, &same);
            assert_int_equal(done, k == 0 && patched ? (uint64_t)v - 1 : (uint64_t)v);
            assert_int_equal(same, !(k == 0 && patched));
        }
    }
    model_free(&m);
    rig_close(&g);
    g_select[0] = NULL;
    g_kind = "shm";
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(random_versions_leave_every_engine_bit_identical_with_delta_auto),
        cmocka_unit_test(random_versions_leave_every_engine_bit_identical_with_delta_on),
        cmocka_unit_test(random_versions_leave_every_engine_bit_identical_with_1_or_4_compare_threads),
        cmocka_unit_test(a_reattached_receiver_is_sent_the_next_version_dense_and_patches_follow),
        cmocka_unit_test(a_destination_without_the_base_is_left_unchanged_and_refused),
    cmocka_unit_test(a_patch_too_large_for_the_bucket_is_named_as_a_patch),
        cmocka_unit_test(anchors_make_every_nth_version_dense),
        cmocka_unit_test(kinds_without_delta_refuse_it_by_name_and_every_kind_lists_the_options),
        cmocka_unit_test(engines_with_a_mirror_load_patched_tensors_from_views_and_ranges_bit_identical),
        cmocka_unit_test(a_mirror_written_through_a_view_refuses_the_next_patch_and_the_dense_version_heals_it),
        cmocka_unit_test(ucx_random_versions_leave_every_engine_bit_identical_with_delta_auto),
        cmocka_unit_test(ucx_engines_with_a_mirror_stay_bit_identical),
        cmocka_unit_test(ucx_a_reattached_receiver_is_sent_the_next_version_dense_and_patches_follow),
        cmocka_unit_test(ucx_an_engine_attaching_after_a_version_began_does_not_owe_it),
        cmocka_unit_test(ucx_engines_applying_patches_themselves_stay_bit_identical),
        cmocka_unit_test(ucx_an_engine_behind_pulls_kept_versions_in_order_and_one_that_skips_is_healed_dense),
        cmocka_unit_test(ucx_an_engine_with_a_selection_fails_patch_versions_and_dense_ones_heal_it),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
