/* The shm strategy, specified: what a sync moves, in what order, what every failure looks like,
 * and what is left behind. Multi-process tests fork receivers that talk to the sender only
 * through request bytes on a pipe and the library itself. */
#define _GNU_SOURCE
#include <dirent.h>
#include <sys/stat.h>

#include <pthread.h>

#include "testutil.h"

/* A small "model": 6 tensors in 3 modules, float32 and bf16. */
#define NT 6
static const char *kNames[NT] = {
    "model.layers.0.attn.q.weight", "model.layers.0.attn.k.weight", "model.layers.0.attn.v.weight",
    "model.layers.0.mlp.up.weight", "model.layers.0.mlp.down.weight", "lm_head.weight"};
static const int64_t kShapes[NT][2] = {{64, 32}, {64, 32}, {64, 32}, {128, 32}, {32, 128}, {100, 32}};
static const uint8_t kCodes[NT] = {WSYNC_DTYPE_FLOAT, WSYNC_DTYPE_FLOAT, WSYNC_DTYPE_FLOAT,
                                   WSYNC_DTYPE_BFLOAT, WSYNC_DTYPE_BFLOAT, WSYNC_DTYPE_FLOAT};
static const uint8_t kBits[NT] = {32, 32, 32, 16, 16, 32};

typedef struct {
    void *data[NT];
    size_t bytes[NT];
    wsync_tensor_t t[NT];
} model_t;

static void model_init(model_t *m) {
    for (int i = 0; i < NT; ++i) {
        m->bytes[i] = (size_t)(kShapes[i][0] * kShapes[i][1]) * (kBits[i] / 8);
        m->data[i] = malloc(m->bytes[i]);
        m->t[i] = tu_tensor(kNames[i], m->data[i], kShapes[i], 2, kCodes[i], kBits[i]);
    }
}
static void model_fill(model_t *m, uint64_t step) {
    for (int i = 0; i < NT; ++i) tu_fill(m->data[i], m->bytes[i], step, (uint64_t)i);
}
static void model_free(model_t *m) {
    for (int i = 0; i < NT; ++i) free(m->data[i]);
}

/* Strategy + init info + sender, the trainer side. */
typedef struct {
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
} trainer_t;

static void trainer_open(trainer_t *tr, const char *options) {
    OK(wsync_strategy_create("shm", options, &tr->strategy));
    OK(wsync_strategy_create_init_info(tr->strategy, &tr->init));
    OK(wsync_sender_create(tr->strategy, tr->init.data, tr->init.size, &tr->sender));
}
static void trainer_close(trainer_t *tr) {
    wsync_sender_destroy(tr->sender);
    wsync_strategy_destroy(tr->strategy);
    wsync_blob_free(&tr->init);
}

static wsync_receiver_t *open_receiver(const wsync_blob_t *init, uint32_t index) {
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("shm", NULL, &s));
    OK(wsync_receiver_create(s, init->data, init->size, index, &r));
    wsync_strategy_destroy(s); /* the receiver keeps what it needs */
    return r;
}

/* The segment name an init blob carries, read through wsync_blob_describe. */
static void segment_name(const wsync_blob_t *init, char *out, size_t cap) {
    char *json;
    OK(wsync_blob_describe(init->data, init->size, &json));
    const char *p = strstr(json, "\"/wsync-");
    assert_non_null(p);
    const char *e = strchr(p + 1, '"');
    size_t n = (size_t)(e - p - 1);
    assert_true(n < cap);
    memcpy(out, p + 1, n);
    out[n] = '\0';
    wsync_string_free(json);
}

static int segment_exists(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    return stat(path, &st) == 0;
}

/* Receives one chunk, checks every tensor against the pattern for `step`, ends it. */
static int receive_and_check(wsync_receiver_t *r, const wsync_blob_t *req, uint64_t step,
                             const int *tensor_ids, size_t n) {
    wsync_recv_t *it;
    if (wsync_receiver_receive(r, req->data, req->size, &it) != WSYNC_OK) return 0;
    size_t k = 0;
    int ok = 1;
    for (;;) {
        wsync_tensor_t v;
        bool has;
        if (wsync_recv_next(it, &v, &has) != WSYNC_OK) { ok = 0; break; }
        if (!has) break;
        int id = tensor_ids[k++];
        size_t bytes = (size_t)(kShapes[id][0] * kShapes[id][1]) * (kBits[id] / 8);
        if (strcmp(v.name, kNames[id]) != 0 || v.ndim != 2 || v.shape[0] != kShapes[id][0] ||
            v.dtype.code != kCodes[id] || !(v.flags & WSYNC_TENSOR_READ_ONLY) ||
            !tu_check(v.data, bytes, step, (uint64_t)id))
            ok = 0;
    }
    if (wsync_recv_end(it) != WSYNC_OK) ok = 0;
    return ok && k == n;
}

/* --- a whole sync, in one process ------------------------------------------------------- */

static void sync_moves_every_tensor_bit_for_bit_over_several_steps(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    trainer_t tr;
    trainer_open(&tr, "{\"bucket_bytes\": 65536}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    int ids_a[3] = {0, 1, 2}, ids_b[3] = {3, 4, 5};
    for (uint64_t step = 1; step <= 4; ++step) {
        model_fill(&m, step);
        wsync_chunk_t a = tu_chunk(&m.t[0], 3, 0), b = tu_chunk(&m.t[3], 3, WSYNC_CHUNK_LAST);
        wsync_blob_t ra, rb;
        OK(wsync_sender_send_chunk(tr.sender, &a, &ra));
        memset(m.data[0], 0, m.bytes[0]); /* the sender's memory may change once send returns */
        OK(wsync_sender_send_chunk(tr.sender, &b, &rb));
        assert_true(receive_and_check(r, &ra, step, ids_a, 3));
        uint64_t done;
        OK(wsync_receiver_completed_version(r, &done));
        assert_int_equal(done, step - 1); /* not complete until the last chunk ends */
        assert_true(receive_and_check(r, &rb, step, ids_b, 3));
        OK(wsync_receiver_completed_version(r, &done));
        assert_int_equal(done, step);
        OK(wsync_sender_flush(tr.sender, 2000));
        wsync_blob_free(&ra);
        wsync_blob_free(&rb);
    }
    uint64_t v;
    OK(wsync_sender_version(tr.sender, &v));
    assert_int_equal(v, 5);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
    model_free(&m);
}

static void request_describes_version_chunk_and_tensors(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    model_fill(&m, 1);
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t c = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    wsync_recv_info_t info = {0};
    OK(wsync_recv_info(it, &info));
    assert_int_equal(info.version, 1);
    assert_int_equal(info.chunk_index, 0);
    assert_int_equal(info.flags, WSYNC_CHUNK_LAST);
    assert_int_equal(info.count, NT);
    uint64_t total = 0;
    for (int i = 0; i < NT; ++i) total += m.bytes[i];
    assert_int_equal(info.bytes, total);
    /* dry run: metadata without data */
    wsync_tensor_t v;
    OK(wsync_recv_peek(it, 3, &v));
    assert_string_equal(v.name, kNames[3]);
    assert_null(v.data);
    assert_int_equal(v.dtype.code, WSYNC_DTYPE_BFLOAT);
    assert_int_equal(v.shape[1], 32);
    EXPECT_ERR(wsync_recv_peek(it, NT, &v), WSYNC_ERR_INVALID_ARGUMENT, "out of range");
    bool has;
    for (int i = 0; i < NT; ++i) OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
    model_free(&m);
}

static void views_are_aligned_to_256_bytes(void **state) {
    (void)state;
    float a[3] = {1, 2, 3}, b[5] = {4, 5, 6, 7, 8};
    int64_t sa = 3, sb = 5;
    wsync_tensor_t t[2] = {tu_tensor("a", a, &sa, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("b", b, &sb, 1, WSYNC_DTYPE_FLOAT, 32)};
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t c = tu_chunk(t, 2, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    wsync_tensor_t v;
    bool has;
    for (int i = 0; i < 2; ++i) {
        OK(wsync_recv_next(it, &v, &has));
        assert_int_equal((uintptr_t)v.data % 256, 0);
        assert_memory_equal(v.data, i ? (void *)b : (void *)a, i ? sizeof b : sizeof a);
    }
    OK(wsync_recv_end(it));
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

/* --- several processes -------------------------------------------------------------------- */

/* Child: receiver `index`; reads request frames until an empty frame; checks each step. */
static int receiver_child(const wsync_blob_t *init, uint32_t index, int fd, uint64_t steps) {
    wsync_receiver_t *r = NULL;
    wsync_strategy_t *s = NULL;
    if (wsync_strategy_create("shm", NULL, &s) != WSYNC_OK ||
        wsync_receiver_create(s, init->data, init->size, index, &r) != WSYNC_OK) {
        fprintf(stderr, "receiver %u: %s\n", index, wsync_last_error());
        return 10;
    }
    int ids_a[3] = {0, 1, 2}, ids_b[3] = {3, 4, 5};
    for (uint64_t step = 1; step <= steps; ++step) {
        for (int half = 0; half < 2; ++half) {
            wsync_blob_t req;
            if (tu_recv_frame(fd, &req.data, &req.size, 10000) || !req.size) return 11;
            if (!receive_and_check(r, &req, step, half ? ids_b : ids_a, 3)) {
                fprintf(stderr, "receiver %u step %llu: %s\n", index, (unsigned long long)step,
                        wsync_last_error());
                return 12;
            }
            free(req.data);
        }
        uint64_t done;
        wsync_receiver_completed_version(r, &done);
        if (done != step) return 13;
    }
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    return 0;
}

static void three_receiver_processes_sync_five_steps_bit_for_bit(void **state) {
    (void)state;
    enum { R = 3, STEPS = 5 };
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 3, \"buckets\": 2, \"bucket_bytes\": 65536}");
    int fds[R][2];
    pid_t pids[R];
    for (int i = 0; i < R; ++i) {
        assert_int_equal(pipe(fds[i]), 0);
        pids[i] = fork();
        if (pids[i] == 0) {
            close(fds[i][1]);
            _exit(receiver_child(&tr.init, (uint32_t)i, fds[i][0], STEPS));
        }
        close(fds[i][0]);
    }
    model_t m;
    model_init(&m);
    for (uint64_t step = 1; step <= STEPS; ++step) {
        model_fill(&m, step);
        for (int half = 0; half < 2; ++half) {
            wsync_chunk_t c = tu_chunk(&m.t[half * 3], 3, half ? WSYNC_CHUNK_LAST : 0);
            wsync_blob_t req;
            OK(wsync_sender_send_chunk(tr.sender, &c, &req));
            for (int i = 0; i < R; ++i) assert_int_equal(tu_send_frame(fds[i][1], req.data, req.size), 0);
            wsync_blob_free(&req);
        }
        OK(wsync_sender_flush(tr.sender, 10000));
    }
    for (int i = 0; i < R; ++i) {
        close(fds[i][1]);
        assert_int_equal(tu_wait_child(pids[i], 20000), 0);
    }
    model_free(&m);
    trainer_close(&tr);
}

static void killed_receiver_fails_flush_within_deadline_and_leaves_no_segment(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 2, \"bucket_bytes\": 65536}");
    char name[128];
    segment_name(&tr.init, name, sizeof name);
    assert_true(segment_exists(name));
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t healthy = fork();
    if (healthy == 0) {
        close(go[1]);
        wsync_receiver_t *r = open_receiver(&tr.init, 0);
        wsync_blob_t req;
        if (tu_recv_frame(go[0], &req.data, &req.size, 10000)) _exit(1);
        wsync_recv_t *it;
        if (wsync_receiver_receive(r, req.data, req.size, &it)) _exit(2);
        wsync_tensor_t v;
        bool has = true;
        while (has) wsync_recv_next(it, &v, &has);
        _exit(wsync_recv_end(it) == WSYNC_OK ? 0 : 3);
    }
    int attached[2];
    assert_int_equal(pipe(attached), 0);
    pid_t doomed = fork();
    if (doomed == 0) {
        wsync_receiver_t *r = open_receiver(&tr.init, 1);
        (void)r;
        char c = 'x';
        if (write(attached[1], &c, 1) != 1) _exit(1);
        pause(); /* mid-sync: attached, never acknowledges */
        _exit(0);
    }
    char c;
    assert_int_equal(read(attached[0], &c, 1), 1);
    model_t m;
    model_init(&m);
    model_fill(&m, 1);
    wsync_chunk_t ch = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &ch, &req));
    assert_int_equal(tu_send_frame(go[1], req.data, req.size), 0);
    assert_int_equal(tu_wait_child(healthy, 10000), 0);
    kill(doomed, SIGKILL);
    assert_int_equal(tu_wait_child(doomed, 5000), 128 + SIGKILL);

    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(tr.sender, 3000), WSYNC_ERR_PEER, "receiver 1");
    assert_true(strstr(wsync_last_error(), "died") != NULL);
    assert_true(tu_now_ms() - t0 < 3000);
    wsync_blob_free(&req);
    model_free(&m);
    trainer_close(&tr);
    assert_false(segment_exists(name));
}

static void flush_times_out_naming_receivers_that_never_answered(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 3}");
    wsync_receiver_t *r0 = open_receiver(&tr.init, 0);
    wsync_receiver_t *r2 = open_receiver(&tr.init, 2);
    float x[4] = {1, 2, 3, 4};
    int64_t s = 4;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r0, req.data, req.size, &it));
    wsync_tensor_t v;
    bool has;
    OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(tr.sender, 300), WSYNC_ERR_TIMEOUT, "receivers [1, 2]");
    long took = tu_now_ms() - t0;
    assert_true(took >= 290 && took < 2000);
    assert_non_null(strstr(wsync_last_error(), "never attached: [1]"));
    /* The chunk as the trainer knows it, not only the board's internal seq. */
    assert_non_null(strstr(wsync_last_error(), "receiver 1 is behind on chunk 0 of version 1 (seq 1)"));
    EXPECT_ERR(wsync_sender_flush(tr.sender, -1), WSYNC_ERR_INVALID_ARGUMENT, "timeout_ms");
    wsync_blob_free(&req);
    wsync_receiver_destroy(r0);
    wsync_receiver_destroy(r2);
    trainer_close(&tr);
}

static void send_blocks_for_a_free_bucket_then_times_out(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 1, \"timeout_ms\": 200}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    float x[4] = {1, 2, 3, 4};
    int64_t s = 4;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(&t, 1, 0);
    wsync_blob_t r1, r2;
    OK(wsync_sender_send_chunk(tr.sender, &c, &r1));
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &r2), WSYNC_ERR_TIMEOUT, "no free bucket");
    assert_true(tu_now_ms() - t0 >= 190);
    assert_null(r2.data);
    /* Once the receiver is done, the same chunk goes through: nothing was half-published. */
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, r1.data, r1.size, &it));
    wsync_tensor_t v;
    bool has;
    OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    /* The failed send abandoned version 1: the next chunk begins version 2 (observation 1 of the
     * transactions issue: it used to continue version 1 as chunk 1, mixing two steps). */
    uint64_t next;
    OK(wsync_sender_version(tr.sender, &next));
    assert_int_equal(next, 2);
    OK(wsync_sender_send_chunk(tr.sender, &c, &r2));
    OK(wsync_receiver_receive(r, r2.data, r2.size, &it));
    wsync_recv_info_t info = {0};
    OK(wsync_recv_info(it, &info));
    assert_int_equal(info.version, 2);
    assert_int_equal(info.chunk_index, 0);
    OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    /* The engine knows version 1 will never complete, and why. */
    wsync_receiver_state_t st = {0};
    OK(wsync_receiver_poll(r, &st));
    assert_int_equal(st.failed_version, 1);
    assert_int_equal(st.failed_status, WSYNC_ERR_ABANDONED);
    assert_int_equal(st.open_version, 2);
    assert_int_equal(st.completed_version, 0);
    wsync_blob_free(&r1);
    wsync_blob_free(&r2);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

/* --- integrity and order ------------------------------------------------------------------ */

/* Flips one bit of the checksum the request carries for its only tensor (found by value). */
static void corrupt_checksum(wsync_blob_t *req) {
    char *json;
    OK(wsync_blob_describe(req->data, req->size, &json));
    const char *p = strstr(json, "\"tree\"");
    assert_non_null(p);
    p = strchr(p, '[');
    unsigned long long sum = strtoull(p + 1, NULL, 10);
    wsync_string_free(json);
    unsigned char be[8];
    for (int i = 0; i < 8; ++i) be[i] = (unsigned char)(sum >> (56 - 8 * i));
    for (size_t i = 0; i + 9 <= req->size; ++i)
        if (req->data[i] == 0x1b && memcmp(req->data + i + 1, be, 8) == 0) {
            req->data[i + 8] ^= 1;
            tu_reseal(req->data, req->size); /* the request is authentic; the bytes are not */
            return;
        }
    fail_msg("checksum bytes not found in request");
}

static void corrupted_checksum_fails_the_iteration_and_the_version(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    uint64_t x[64];
    tu_fill(x, sizeof x, 1, 0);
    int64_t s = 64;
    wsync_tensor_t t = tu_tensor("w", x, &s, 1, WSYNC_DTYPE_UINT, 64);
    wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    corrupt_checksum(&req);
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    wsync_tensor_t v;
    bool has;
    EXPECT_ERR(wsync_recv_next(it, &v, &has), WSYNC_ERR_INTEGRITY, "tensor 'w'");
    assert_false(has);
    /* Later calls say the iteration failed before (delta user trial: a copy into a good
     * destination repeated the earlier failure's text, which then described this call). */
    EXPECT_ERR(wsync_recv_next(it, &v, &has), WSYNC_ERR_INTEGRITY,
               "this iteration already failed: tensor 'w' in chunk 0 of version 1: checksum");
    uint64_t into[64];
    EXPECT_ERR(wsync_recv_copy(it, 0, 0, into, sizeof into), WSYNC_ERR_INTEGRITY,
               "this iteration already failed: tensor 'w' in chunk 0 of version 1: "
               "checksum mismatch");
    EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_INTEGRITY, "checksum");
    uint64_t done;
    OK(wsync_receiver_completed_version(r, &done));
    assert_int_equal(done, 0);
    EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER, "WSYNC_ERR_INTEGRITY");
    OK(wsync_sender_flush(tr.sender, 1000)); /* each failure is reported once */
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

static void verify_false_skips_checksums(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("shm", "{\"verify\": false}", &s));
    OK(wsync_receiver_create(s, tr.init.data, tr.init.size, 0, &r));
    uint64_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t n = 8;
    wsync_tensor_t t = tu_tensor("w", x, &n, 1, WSYNC_DTYPE_UINT, 64);
    wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    corrupt_checksum(&req);
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    wsync_tensor_t v;
    bool has;
    OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    trainer_close(&tr);
}

static void ending_early_acknowledges_failure_and_keeps_the_old_version(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    model_fill(&m, 1);
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t c = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    wsync_tensor_t v;
    bool has;
    OK(wsync_recv_next(it, &v, &has));
    EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_WRONG_STATE, "after 1 of 6 tensors");
    uint64_t done;
    OK(wsync_receiver_completed_version(r, &done));
    assert_int_equal(done, 0);
    /* The trainer sees the engine's own status, version, chunk and message. */
    EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER,
               "failed chunk 0 of version 1: WSYNC_ERR_WRONG_STATE: iteration over chunk 0 of version 1 ended after 1 of 6");
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
    model_free(&m);
}

/* Host memory needs no stream ordering: shm accepts and ignores a caller's CUDA stream. */
static void shm_accepts_and_ignores_a_callers_stream(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    OK(wsync_sender_set_stream(tr.sender, (void *)0x1000));
    OK(wsync_receiver_set_stream(r, (void *)0x1000));
    OK(wsync_receiver_set_stream(r, NULL));
    EXPECT_ERR(wsync_receiver_set_stream(NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT, "receiver");
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

static void receive_while_iterating_is_wrong_state(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t c = tu_chunk(&t, 1, 0);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_recv_t *it, *it2;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    EXPECT_ERR(wsync_receiver_receive(r, req.data, req.size, &it2), WSYNC_ERR_WRONG_STATE,
               "still open");
    assert_null(it2);
    /* The loader's stream cannot change under an open iteration, even where it is ignored. */
    EXPECT_ERR(wsync_receiver_set_stream(r, (void *)0x1000), WSYNC_ERR_WRONG_STATE, "end or fail it");
    wsync_blob_free(&req);
    wsync_receiver_destroy(r); /* ends the open iteration as failed */
    EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER, "receiver 0");
    trainer_close(&tr);
}

static void chunks_out_of_order_or_replayed_are_mismatch(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 4}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t c = tu_chunk(&t, 1, 0);
    wsync_blob_t q0, q1, q2;
    OK(wsync_sender_send_chunk(tr.sender, &c, &q0));
    OK(wsync_sender_send_chunk(tr.sender, &c, &q1));
    OK(wsync_sender_send_chunk(tr.sender, &c, &q2));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, q0.data, q0.size, &it));
    wsync_tensor_t v;
    bool has;
    OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    EXPECT_ERR(wsync_receiver_receive(r, q0.data, q0.size, &it), WSYNC_ERR_MISMATCH,
               "stale or replayed");
    OK(wsync_sender_flush(tr.sender, 0) == WSYNC_ERR_TIMEOUT ? WSYNC_OK : WSYNC_ERR_INTERNAL);
    /* A gap (chunk 1 lost) fails the version here and is reported to the trainer as the
     * engine's MISMATCH, not as a bare timeout (observation 4). */
    EXPECT_ERR(wsync_receiver_receive(r, q2.data, q2.size, &it), WSYNC_ERR_MISMATCH,
               "expected chunk 1 of version 1");
    EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER,
               "failed chunk 2 of version 1: WSYNC_ERR_MISMATCH: received chunk 2 of version 1 but expected chunk 1");
    /* The late chunk 1 of the failed version is refused with the version's status. */
    EXPECT_ERR(wsync_receiver_receive(r, q1.data, q1.size, &it), WSYNC_ERR_SKIPPED,
               "version 1 already failed here");
    wsync_blob_free(&q0);
    wsync_blob_free(&q1);
    wsync_blob_free(&q2);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

static wsync_receiver_state_t polled(wsync_receiver_t *r) {
    wsync_receiver_state_t st = {.struct_size = sizeof st};
    OK(wsync_receiver_poll(r, &st));
    return st;
}

static void load_chunk(wsync_receiver_t *r, const wsync_blob_t *q) {
    wsync_recv_t *it;
    wsync_tensor_t v;
    bool has = true;
    OK(wsync_receiver_receive(r, q->data, q->size, &it));
    while (has) OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
}

/* A receiver between versions (version 1 completed) is handed chunk 1 of version 2 before its
 * chunk 0 (issue 12 user trial: the message showed chunk 4294967295, completed version 1 was
 * reported failed, and version 2 then completed here while the trainer was told it failed).
 * Engine: version 2 fails here with MISMATCH and none of its chunks can complete it (the late
 * chunk 0, the last chunk); version 1 stays completed and unfailed until then, version 3
 * completes. Trainer: the flush names chunk 1 of version 2. */
static void a_chunk_of_the_next_version_before_its_chunk_0_fails_that_version_only(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 4}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t one = tu_chunk(&t, 1, WSYNC_CHUNK_LAST), first = tu_chunk(&t, 1, 0);
    wsync_blob_t v1, c0, c1, c2, v3;
    OK(wsync_sender_send_chunk(tr.sender, &one, &v1));
    load_chunk(r, &v1);
    OK(wsync_sender_flush(tr.sender, 1000));
    OK(wsync_sender_send_chunk(tr.sender, &first, &c0));
    OK(wsync_sender_send_chunk(tr.sender, &first, &c1));
    OK(wsync_sender_send_chunk(tr.sender, &one, &c2));
    wsync_recv_t *it = NULL;
    EXPECT_ERR(wsync_receiver_receive(r, c1.data, c1.size, &it), WSYNC_ERR_MISMATCH,
               "received chunk 1 of version 2 but expected chunk 0 of a version after 1");
    assert_null(strstr(wsync_last_error(), "4294967295"));
    wsync_receiver_state_t st = polled(r);
    assert_int_equal(st.completed_version, 1);
    assert_int_equal(st.failed_version, 2);
    assert_int_equal(st.failed_status, WSYNC_ERR_MISMATCH);
    assert_int_equal(st.open_version, 0);
    EXPECT_ERR(wsync_receiver_receive(r, c0.data, c0.size, &it), WSYNC_ERR_MISMATCH, "version 2");
    EXPECT_ERR(wsync_receiver_receive(r, c2.data, c2.size, &it), WSYNC_ERR_SKIPPED,
               "version 2 already failed here");
    st = polled(r);
    assert_int_equal(st.completed_version, 1);
    assert_int_equal(st.failed_version, 2);
    EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER, "failed chunk 1 of version 2");
    OK(wsync_sender_send_chunk(tr.sender, &one, &v3));
    load_chunk(r, &v3);
    st = polled(r);
    assert_int_equal(st.completed_version, 3);
    assert_int_equal(st.failed_version, 2);
    OK(wsync_sender_flush(tr.sender, 1000));
    wsync_blob_t *all[] = {&v1, &c0, &c1, &c2, &v3};
    for (size_t k = 0; k < 5; ++k) wsync_blob_free(all[k]);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

/* Delta user trial: a request of another sync (trainer B's, or a restarted trainer's) handed to
 * trainer A's engine was judged by its version before its segment: "expected chunk 0 of a
 * version after 3", version 5 marked failed, and A's own versions 4 and 5 then refused as
 * stale, which wedged A's trainer (no free bucket) until it dropped the engine. Engine: the
 * foreign request is MISMATCH naming both segments and changes nothing (poll as before);
 * A's next versions complete. Trainer A: its flush is OK. */
static void a_request_of_another_sync_is_refused_and_changes_nothing(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t a, b;
    trainer_open(&a, "{\"buckets\": 4}");
    trainer_open(&b, "{\"buckets\": 4}");
    wsync_receiver_t *ra = open_receiver(&a.init, 0), *rb = open_receiver(&b.init, 0);
    wsync_chunk_t one = tu_chunk(&t, 1, WSYNC_CHUNK_LAST), first = tu_chunk(&t, 1, 0);
    wsync_blob_t q;
    for (int v = 0; v < 3; ++v) { /* A at version 3 */
        OK(wsync_sender_send_chunk(a.sender, &one, &q));
        load_chunk(ra, &q);
        wsync_blob_free(&q);
    }
    OK(wsync_sender_flush(a.sender, 1000));
    wsync_blob_t b0, b1;
    for (int v = 0; v < 4; ++v) { /* B at version 5: chunk 0, then chunk 1 */
        OK(wsync_sender_send_chunk(b.sender, &one, &q));
        load_chunk(rb, &q);
        wsync_blob_free(&q);
    }
    OK(wsync_sender_send_chunk(b.sender, &first, &b0));
    OK(wsync_sender_send_chunk(b.sender, &one, &b1));
    char seg_a[128], seg_b[128];
    segment_name(&a.init, seg_a, sizeof seg_a);
    segment_name(&b.init, seg_b, sizeof seg_b);
    wsync_recv_t *it = NULL;
    const wsync_blob_t *foreign[] = {&b1, &b0};
    for (size_t k = 0; k < 2; ++k) {
        EXPECT_ERR(wsync_receiver_receive(ra, foreign[k]->data, foreign[k]->size, &it),
                   WSYNC_ERR_MISMATCH, seg_b);
        assert_non_null(strstr(wsync_last_error(), seg_a));
        assert_null(it);
        wsync_receiver_state_t st = polled(ra);
        assert_int_equal(st.completed_version, 3);
        assert_int_equal(st.failed_version, 0);
        assert_int_equal(st.open_version, 0);
    }
    for (int v = 0; v < 2; ++v) { /* A's versions 4 and 5 complete there */
        OK(wsync_sender_send_chunk(a.sender, &one, &q));
        load_chunk(ra, &q);
        wsync_blob_free(&q);
    }
    OK(wsync_sender_flush(a.sender, 1000));
    assert_int_equal(polled(ra).completed_version, 5);
    load_chunk(rb, &b0); /* and B's engine takes B's requests as usual */
    load_chunk(rb, &b1);
    OK(wsync_sender_flush(b.sender, 1000));
    wsync_blob_free(&b0);
    wsync_blob_free(&b1);
    wsync_receiver_destroy(ra);
    wsync_receiver_destroy(rb);
    trainer_close(&a);
    trainer_close(&b);
}

/* Delta user trial: an engine that lags (it has not read version 2, which the trainer
 * committed) while the trainer abandons version 3 failed version 2 as "the sender abandoned
 * version 2" once it read chunk 0, and the trainer's flush said OK: the engine never held
 * version 2 and nobody was told. Engine: version 2 completes (poll shows it open, not failed,
 * between its chunks). Trainer: the flush is OK, and the engine is on version 2 indeed. */
static void a_lagging_engine_completes_a_committed_version_after_a_later_one_is_abandoned(
    void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 4}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t one = tu_chunk(&t, 1, WSYNC_CHUNK_LAST), first = tu_chunk(&t, 1, 0);
    wsync_blob_t v1, c0, c1, v3;
    OK(wsync_sender_send_chunk(tr.sender, &one, &v1));
    load_chunk(r, &v1);
    OK(wsync_sender_send_chunk(tr.sender, &first, &c0));
    OK(wsync_sender_send_chunk(tr.sender, &one, &c1));
    OK(wsync_sender_send_chunk(tr.sender, &first, &v3));
    OK(wsync_sender_abandon(tr.sender));
    load_chunk(r, &c0);
    wsync_receiver_state_t st = polled(r);
    assert_int_equal(st.open_version, 2);
    assert_int_equal(st.failed_version, 0);
    load_chunk(r, &c1);
    st = polled(r);
    assert_int_equal(st.completed_version, 2);
    assert_int_equal(st.failed_version, 0);
    OK(wsync_sender_flush(tr.sender, 1000));
    wsync_blob_t *all[] = {&v1, &c0, &c1, &v3};
    for (size_t k = 0; k < 4; ++k) wsync_blob_free(all[k]);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

/* A chunk of an abandoned version that arrives without the chunks before it (they were
 * withdrawn, or lost) is refused as ABANDONED, as a withdrawn chunk is, not as "lost or
 * reordered" (delta user trial). Engine: that version shows failed with ABANDONED; the next
 * version completes. Trainer: its flush is OK (nothing of an abandoned version is waited for). */
static void a_late_chunk_of_an_abandoned_version_is_refused_as_abandoned(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 4}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t one = tu_chunk(&t, 1, WSYNC_CHUNK_LAST), first = tu_chunk(&t, 1, 0);
    wsync_blob_t v1, c0, c1, v3;
    OK(wsync_sender_send_chunk(tr.sender, &one, &v1));
    load_chunk(r, &v1);
    OK(wsync_sender_send_chunk(tr.sender, &first, &c0));
    OK(wsync_sender_send_chunk(tr.sender, &first, &c1));
    OK(wsync_sender_abandon(tr.sender));
    OK(wsync_sender_flush(tr.sender, 1000));
    wsync_recv_t *it = NULL;
    EXPECT_ERR(wsync_receiver_receive(r, c1.data, c1.size, &it), WSYNC_ERR_ABANDONED,
               "version 2 was abandoned by the sender; chunk 1 of version 2 arrived without");
    wsync_receiver_state_t st = polled(r);
    assert_int_equal(st.completed_version, 1);
    assert_int_equal(st.failed_version, 2);
    assert_int_equal(st.failed_status, WSYNC_ERR_ABANDONED);
    OK(wsync_sender_send_chunk(tr.sender, &one, &v3));
    load_chunk(r, &v3);
    assert_int_equal(polled(r).completed_version, 3);
    OK(wsync_sender_flush(tr.sender, 1000));
    wsync_blob_t *all[] = {&v1, &c0, &c1, &v3};
    for (size_t k = 0; k < 4; ++k) wsync_blob_free(all[k]);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

/* What happens after a version completed here never unmakes it (issue 12 user trial: poll
 * reported the completed version as failed with PEER once the trainer closed its sender, and
 * the trainer's abandoning a later version this receiver never saw did the same with
 * ABANDONED). Engine: after version 1 completed, the trainer abandons version 2 (its only
 * chunk delivered to nobody) and then closes: poll says completed 1, nothing failed, the
 * trainer gone. */
static void a_completed_version_stays_completed_whatever_the_trainer_does_next(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 4}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t one = tu_chunk(&t, 1, WSYNC_CHUNK_LAST), first = tu_chunk(&t, 1, 0);
    wsync_blob_t v1, v2;
    OK(wsync_sender_send_chunk(tr.sender, &one, &v1));
    load_chunk(r, &v1);
    OK(wsync_sender_send_chunk(tr.sender, &first, &v2));
    OK(wsync_sender_abandon(tr.sender));
    wsync_receiver_state_t st = polled(r);
    assert_int_equal(st.completed_version, 1);
    assert_int_equal(st.failed_version, 0);
    assert_int_equal(st.failed_status, WSYNC_OK);
    trainer_close(&tr); /* the sender and its strategy: the trainer's lock goes */
    st = polled(r);
    assert_int_equal(st.completed_version, 1);
    assert_int_equal(st.failed_version, 0);
    assert_true(st.flags & WSYNC_RECEIVER_SENDER_GONE);
    wsync_blob_free(&v1);
    wsync_blob_free(&v2);
    wsync_receiver_destroy(r);
}

/* Review of the skipped records: an engine that failed the version in flight and restarted
 * with its index before the trainer looked (a supervisor, a re-create-on-error loop) had its
 * failure skipped as a joining receiver's, and the trainer's flush said OK while engine 1
 * still served its old weights. The trainer hears of it (PEER naming receiver 1's failure);
 * the restarted engine takes part from the next version. */
static void an_engine_that_failed_and_restarted_before_the_trainer_looked_is_still_reported(
    void **state) {
    (void)state;
    float x[256];
    for (int k = 0; k < 256; ++k) x[k] = (float)k;
    int64_t s = 256;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 2, \"bucket_bytes\": 65536}");
    wsync_receiver_t *r[2] = {open_receiver(&tr.init, 0), open_receiver(&tr.init, 1)};
    wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t q;
    OK(wsync_sender_send_chunk(tr.sender, &c, &q));
    load_chunk(r[0], &q);
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r[1], q.data, q.size, &it));
    EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_WRONG_STATE, "acknowledged as failed");
    wsync_receiver_destroy(r[1]); /* engine 1 restarts with its index */
    r[1] = open_receiver(&tr.init, 1);
    EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER,
               "receiver 1 (pid");
    assert_non_null(strstr(wsync_last_error(), "failed chunk 0 of version 1: WSYNC_ERR_WRONG_STATE"));
    wsync_blob_free(&q);
    OK(wsync_sender_send_chunk(tr.sender, &c, &q));
    load_chunk(r[0], &q);
    load_chunk(r[1], &q);
    OK(wsync_sender_flush(tr.sender, 1000));
    assert_int_equal(polled(r[1]).completed_version, 2);
    wsync_blob_free(&q);
    for (int i = 0; i < 2; ++i) wsync_receiver_destroy(r[i]);
    trainer_close(&tr);
}

/* An engine restarted while a version is in flight (C++ user trial: its controller fed it the
 * requests of that version; it said "a request was lost or reordered" and its poll showed the
 * version failed). It is refused as joined too late and nothing changes in its state; the
 * trainer hears once that the engine left that version unfinished (not of the refusals); from
 * the next version on it takes part. */
static void a_restarted_engine_given_the_version_in_flight_is_refused_as_joined_late(void **state) {
    (void)state;
    float x[64] = {1, 2, 3};
    int64_t s = 64;
    wsync_tensor_t t[2] = {tu_tensor("a", x, &s, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("b", x, &s, 1, WSYNC_DTYPE_FLOAT, 32)};
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 2, \"bucket_bytes\": 65536}");
    wsync_receiver_t *r[2] = {open_receiver(&tr.init, 0), open_receiver(&tr.init, 1)};
    wsync_chunk_t c0 = tu_chunk(&t[0], 1, 0), c1 = tu_chunk(&t[1], 1, WSYNC_CHUNK_LAST);
    wsync_blob_t a, b;
    OK(wsync_sender_send_chunk(tr.sender, &c0, &a));
    load_chunk(r[0], &a);
    load_chunk(r[1], &a);
    wsync_receiver_destroy(r[1]); /* engine 1 restarts */
    r[1] = open_receiver(&tr.init, 1);
    OK(wsync_sender_send_chunk(tr.sender, &c1, &b));
    load_chunk(r[0], &b);
    wsync_recv_t *it;
    EXPECT_ERR(wsync_receiver_receive(r[1], b.data, b.size, &it), WSYNC_ERR_MISMATCH,
               "shm: chunk 1 of version 1: this receiver (re)attached after version 1 began (in "
               "flight then, or long done); it takes part from the next version the sender begins");
    EXPECT_ERR(wsync_receiver_receive(r[1], a.data, a.size, &it), WSYNC_ERR_MISMATCH,
               "(re)attached after version 1 began");
    wsync_receiver_state_t st = polled(r[1]);
    assert_int_equal(st.failed_version, 0);
    assert_int_equal(st.completed_version, 0);
    /* The trainer hears once that engine 1 left version 1 unfinished (its own refusal above is
     * not reported: a restarted engine's requests of that version are not its concern). */
    EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER,
               "receiver 1 went away without acknowledging chunk 1 of version 1 (seq 2) and a "
               "new process (pid");
    assert_non_null(strstr(wsync_last_error(), ") has re-attached with its index since"));
    assert_null(strstr(wsync_last_error(), "(re)attached after"));
    wsync_blob_free(&a);
    wsync_blob_free(&b);
    OK(wsync_sender_send_chunk(tr.sender, &c0, &a));
    OK(wsync_sender_send_chunk(tr.sender, &c1, &b));
    for (int i = 0; i < 2; ++i) {
        load_chunk(r[i], &a);
        load_chunk(r[i], &b);
    }
    OK(wsync_sender_flush(tr.sender, 1000));
    for (int i = 0; i < 2; ++i) assert_int_equal(polled(r[i]).completed_version, 2);
    wsync_blob_free(&a);
    wsync_blob_free(&b);
    for (int i = 0; i < 2; ++i) wsync_receiver_destroy(r[i]);
    trainer_close(&tr);
}

/* A receiver dropped while it still reads a chunk (Rust user trial: a slow loader held its views
 * past the trainer's flush deadline; the trainer dropped it, as the README shows, and packed the
 * next version into the same bucket; the engine's wsync_recv_end returned OK and reported the
 * version complete with bytes of the next one). One bucket, three engines.
 * Trainer: flush names engines 0 and 2 (TIMEOUT); it drops them and version 2 reaches engine 1.
 * Engine 0, holding a view of version 1 that now shows version 2's bytes: wsync_recv_end fails
 * with PEER saying it was dropped while it read chunk 0 of version 1; nothing is completed.
 * Engine 2, which had taken nothing yet: its copy fails with PEER (not INTEGRITY, the symptom),
 * and nothing is completed. */
static void a_receiver_dropped_while_it_reads_never_completes_the_version(void **state) {
    (void)state;
    float x[1024];
    for (int k = 0; k < 1024; ++k) x[k] = (float)k;
    int64_t s = 1024;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 3, \"buckets\": 1, \"bucket_bytes\": 65536}");
    wsync_receiver_t *r[3];
    for (uint32_t i = 0; i < 3; ++i) r[i] = open_receiver(&tr.init, i);
    wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t q1, q2;
    OK(wsync_sender_send_chunk(tr.sender, &c, &q1));
    wsync_recv_t *slow, *idle;
    wsync_tensor_t view;
    bool has;
    OK(wsync_receiver_receive(r[0], q1.data, q1.size, &slow));
    OK(wsync_recv_next(slow, &view, &has));
    assert_true(has);
    assert_memory_equal(view.data, x, sizeof x);
    OK(wsync_receiver_receive(r[2], q1.data, q1.size, &idle));
    load_chunk(r[1], &q1);
    EXPECT_ERR(wsync_sender_flush(tr.sender, 100), WSYNC_ERR_TIMEOUT, "receivers [0, 2]");
    OK(wsync_sender_drop_receiver(tr.sender, 0));
    OK(wsync_sender_drop_receiver(tr.sender, 2));
    OK(wsync_sender_flush(tr.sender, 1000));
    for (int k = 0; k < 1024; ++k) x[k] = -1.0f - (float)k;
    OK(wsync_sender_send_chunk(tr.sender, &c, &q2)); /* into the bucket engines 0 and 2 read */
    load_chunk(r[1], &q2);
    OK(wsync_sender_flush(tr.sender, 1000));
    assert_memory_equal(view.data, x, sizeof x); /* the hazard: the view shows version 2 */
    EXPECT_ERR(wsync_recv_end(slow), WSYNC_ERR_PEER,
               "dropped by the sender while it read chunk 0 of version 1");
    float got[1024];
    EXPECT_ERR(wsync_recv_copy(idle, 0, 0, got, sizeof got), WSYNC_ERR_PEER,
               "dropped by the sender while it read chunk 0 of version 1");
    EXPECT_ERR(wsync_recv_end(idle), WSYNC_ERR_PEER, "dropped by the sender");
    for (int i = 0; i < 3; i += 2) {
        wsync_receiver_state_t st = polled(r[i]);
        assert_int_equal(st.completed_version, 0);
        assert_int_equal(st.failed_version, 1);
        assert_int_equal(st.failed_status, WSYNC_ERR_PEER);
        assert_true(st.flags & WSYNC_RECEIVER_DROPPED);
    }
    assert_int_equal(polled(r[1]).completed_version, 2);
    /* Engine 0 re-attaches at once, as its error says, before the trainer looks again (C++
     * user trial: its failure of version 1 then reached the trainer's next send as PEER and
     * abandoned version 3 for engine 1 too). */
    wsync_receiver_destroy(r[0]);
    r[0] = open_receiver(&tr.init, 0);
    /* The trainer no longer hears of the engines it dropped (review: their failures reached
     * its next flush as PEER and abandoned its next version): engine 1 goes on, and the
     * re-attached engine 0 takes part from version 3. */
    OK(wsync_sender_flush(tr.sender, 1000));
    wsync_blob_t q3;
    OK(wsync_sender_send_chunk(tr.sender, &c, &q3));
    load_chunk(r[1], &q3);
    load_chunk(r[0], &q3);
    OK(wsync_sender_flush(tr.sender, 1000));
    assert_int_equal(polled(r[1]).completed_version, 3);
    assert_int_equal(polled(r[0]).completed_version, 3);
    wsync_blob_free(&q1);
    wsync_blob_free(&q2);
    wsync_blob_free(&q3);
    for (int i = 0; i < 3; ++i) wsync_receiver_destroy(r[i]);
    trainer_close(&tr);
}

/* Review of the withdrawal: late requests of an abandoned version that was only partly
 * withdrawn (two buckets: version 2's chunk 0 withdrew seq 1; seq 2 still sits in bucket 1).
 * Engine: both late requests are refused (stale, then ABANDONED), and it completes version
 * 2. Trainer: the engine's record of the refused chunk of abandoned version 1 is not reported
 * (it used to fail version 2's next send with PEER, abandoning it). */
static void late_requests_of_an_abandoned_version_do_not_fail_the_next_one(void **state) {
    (void)state;
    float x[16] = {1, 2, 3};
    int64_t s = 16;
    wsync_tensor_t t[2] = {tu_tensor("a", x, &s, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("b", x, &s, 1, WSYNC_DTYPE_FLOAT, 32)};
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 2, \"bucket_bytes\": 65536}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t c0 = tu_chunk(&t[0], 1, 0), c1 = tu_chunk(&t[1], 1, WSYNC_CHUNK_LAST);
    wsync_blob_t a0, a1, b0, b1;
    OK(wsync_sender_send_chunk(tr.sender, &c0, &a0)); /* version 1: seq 1, bucket 0 */
    OK(wsync_sender_send_chunk(tr.sender, &c0, &a1)); /* seq 2, bucket 1 */
    OK(wsync_sender_abandon(tr.sender));
    OK(wsync_sender_send_chunk(tr.sender, &c0, &b0)); /* version 2: seq 3, withdraws seq 1 */
    wsync_recv_t *it;
    EXPECT_ERR(wsync_receiver_receive(r, a0.data, a0.size, &it), WSYNC_ERR_MISMATCH,
               "stale or replayed request");
    EXPECT_ERR(wsync_receiver_receive(r, a1.data, a1.size, &it), WSYNC_ERR_ABANDONED,
               "version 1 was abandoned by the sender; chunk 1 of version 1 arrived without");
    load_chunk(r, &b0);
    OK(wsync_sender_send_chunk(tr.sender, &c1, &b1));
    load_chunk(r, &b1);
    OK(wsync_sender_flush(tr.sender, 1000));
    assert_int_equal(polled(r).completed_version, 2);
    wsync_blob_free(&a0);
    wsync_blob_free(&a1);
    wsync_blob_free(&b0);
    wsync_blob_free(&b1);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

static void replayed_request_is_mismatch_and_a_held_index_cannot_be_taken(void **state) {
    (void)state;
    float x[2] = {1, 2};
    int64_t s = 2;
    wsync_tensor_t t = tu_tensor("x", x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    trainer_t tr;
    trainer_open(&tr, "{\"buckets\": 1}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t q1, q2;
    OK(wsync_sender_send_chunk(tr.sender, &c, &q1));
    wsync_recv_t *it;
    wsync_tensor_t v;
    bool has;
    OK(wsync_receiver_receive(r, q1.data, q1.size, &it));
    OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    OK(wsync_sender_send_chunk(tr.sender, &c, &q2)); /* bucket 0 now holds seq 2 */
    EXPECT_ERR(wsync_receiver_receive(r, q1.data, q1.size, &it), WSYNC_ERR_MISMATCH,
               "stale or replayed");
    /* Every receiver had attached, so the name is gone; index 0 is held by a live receiver. */
    char name[64];
    segment_name(&tr.init, name, sizeof name);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    assert_int_equal(access(path, F_OK), -1);
    wsync_strategy_t *s2;
    wsync_receiver_t *late = NULL;
    OK(wsync_strategy_create("shm", NULL, &s2));
    EXPECT_ERR(wsync_receiver_create(s2, tr.init.data, tr.init.size, 0, &late),
               WSYNC_ERR_WRONG_STATE, "already attached");
    /* Dropped, its process alive: the refusal says so, and what to do. */
    OK(wsync_sender_drop_receiver(tr.sender, 0));
    EXPECT_ERR(wsync_receiver_create(s2, tr.init.data, tr.init.size, 0, &late),
               WSYNC_ERR_WRONG_STATE, "was dropped by the sender, but its process");
    assert_non_null(strstr(wsync_last_error(), "end that process (or destroy its receiver)"));
    wsync_strategy_destroy(s2);
    wsync_blob_free(&q1);
    wsync_blob_free(&q2);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

/* --- bad input ------------------------------------------------------------------------------ */

static void bad_tensors_are_rejected_by_name_and_nothing_is_published(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, "{\"bucket_bytes\": 4096}");
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    float x[4] = {1, 2, 3, 4};
    int64_t s4 = 4, s0 = 0, sneg = -2, big[3] = {INT64_MAX / 2, 4, 4}, s22[2] = {2, 2};
    int64_t bad_strides[2] = {1, 2};
    char longname[WSYNC_MAX_NAME_BYTES + 2];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    wsync_blob_t req;
    struct { wsync_tensor_t t; wsync_status_t st; const char *msg; } cases[9];
    int n = 0;
    cases[n].t = tu_tensor("zero", x, &s0, 1, WSYNC_DTYPE_FLOAT, 32);
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "'zero'): shape[0] = 0";
    cases[n].t = tu_tensor("neg", x, &sneg, 1, WSYNC_DTYPE_FLOAT, 32);
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "negative";
    cases[n].t = tu_tensor("nodata", NULL, &s4, 1, WSYNC_DTYPE_FLOAT, 32);
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "'nodata'): data is NULL";
    cases[n].t = tu_tensor("huge", x, big, 3, WSYNC_DTYPE_FLOAT, 32);
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "overflows";
    cases[n].t = tu_tensor(longname, x, &s4, 1, WSYNC_DTYPE_FLOAT, 32);
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "longer than 1024";
    cases[n].t = tu_tensor("strided", x, s22, 2, WSYNC_DTYPE_FLOAT, 32);
    cases[n].t.strides = bad_strides;
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "'strided'): not contiguous";
    cases[n].t = tu_tensor("opaque", x, &s4, 1, 3, 32);
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "unsupported dtype";
    cases[n].t = tu_tensor("gpu", x, &s4, 1, WSYNC_DTYPE_FLOAT, 32);
    cases[n].t.device.type = WSYNC_DEVICE_CUDA;
    cases[n].st = WSYNC_ERR_UNSUPPORTED; cases[n++].msg = "'gpu' is on cuda:0";
    cases[n].t = tu_tensor("", x, &s4, 1, WSYNC_DTYPE_FLOAT, 32);
    cases[n].st = WSYNC_ERR_INVALID_ARGUMENT; cases[n++].msg = "name is empty";
    for (int i = 0; i < n; ++i) {
        wsync_chunk_t c = tu_chunk(&cases[i].t, 1, 0);
        EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), cases[i].st, cases[i].msg);
        assert_null(req.data);
    }
    wsync_tensor_t dup[2] = {tu_tensor("same", x, &s4, 1, WSYNC_DTYPE_FLOAT, 32),
                             tu_tensor("same", x, &s4, 1, WSYNC_DTYPE_FLOAT, 32)};
    wsync_chunk_t c = tu_chunk(dup, 2, 0);
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "'same'): duplicate name");
    static float big_buf[2048];
    int64_t sb = 2048;
    wsync_tensor_t too_big = tu_tensor("too_big", big_buf, &sb, 1, WSYNC_DTYPE_FLOAT, 32);
    c = tu_chunk(&too_big, 1, 0);
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "does not fit in one bucket");
    c = tu_chunk(dup, 0, 0);
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT, "no tensors");
    c = tu_chunk(dup, 1, 0x80);
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT, "flags");
    /* none of that consumed a chunk: the next good one is chunk 0, seq 1 */
    c = tu_chunk(dup, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    wsync_tensor_t v;
    bool has;
    OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    OK(wsync_sender_flush(tr.sender, 1000));
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

static void receiver_index_out_of_range_or_taken_is_refused(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 2}");
    wsync_strategy_t *s;
    wsync_receiver_t *r = NULL, *r2 = NULL;
    OK(wsync_strategy_create("shm", NULL, &s));
    EXPECT_ERR(wsync_receiver_create(s, tr.init.data, tr.init.size, 2, &r),
               WSYNC_ERR_INVALID_ARGUMENT, "index 2 is out of range: this sync has 2 receivers, indices 0 to 1");
    assert_null(r);
    OK(wsync_receiver_create(s, tr.init.data, tr.init.size, 1, &r));
    EXPECT_ERR(wsync_receiver_create(s, tr.init.data, tr.init.size, 1, &r2), WSYNC_ERR_WRONG_STATE,
               "index 1 is already attached by a live process (pid ");
    /* ...and says what to do about it */
    assert_non_null(strstr(wsync_last_error(), "destroy that receiver or end that process first, or "
                                               "attach another index"));
    wsync_receiver_destroy(r);
    OK(wsync_receiver_create(s, tr.init.data, tr.init.size, 1, &r2)); /* free again once detached */
    wsync_receiver_destroy(r2);
    wsync_strategy_destroy(s);
    trainer_close(&tr);
    /* A sync of one receiver says so in words every language reads the same way. */
    wsync_strategy_t *one;
    wsync_blob_t init;
    OK(wsync_strategy_create("shm", "{\"receivers\": 1}", &one));
    OK(wsync_strategy_create_init_info(one, &init));
    EXPECT_ERR(wsync_receiver_create(one, init.data, init.size, 1, &r), WSYNC_ERR_INVALID_ARGUMENT,
               "index 1 is out of range: this sync has 1 receiver, index 0 (set by \"receivers\"");
    wsync_blob_free(&init);
    wsync_strategy_destroy(one);
}

static void blobs_of_another_role_or_strategy_are_mismatch(void **state) {
    (void)state;
    trainer_t a, b;
    trainer_open(&a, NULL);
    OK(wsync_strategy_create("shm", NULL, &b.strategy));
    OK(wsync_strategy_create_init_info(b.strategy, &b.init));
    wsync_sender_t *snd = NULL;
    EXPECT_ERR(wsync_sender_create(b.strategy, a.init.data, a.init.size, &snd), WSYNC_ERR_MISMATCH,
               "but this strategy created");
    EXPECT_ERR(wsync_sender_create(a.strategy, a.init.data, a.init.size, &snd),
               WSYNC_ERR_WRONG_STATE, "already has a sender");
    wsync_blob_t again;
    EXPECT_ERR(wsync_strategy_create_init_info(a.strategy, &again), WSYNC_ERR_WRONG_STATE,
               "already created");
    wsync_strategy_t *fresh;
    OK(wsync_strategy_create("shm", NULL, &fresh));
    EXPECT_ERR(wsync_sender_create(fresh, a.init.data, a.init.size, &snd), WSYNC_ERR_WRONG_STATE,
               "has not created any");
    /* a request where init info is expected, and the other way round */
    float x = 1;
    int64_t s = 1;
    wsync_tensor_t t = tu_tensor("x", &x, &s, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(a.sender, &c, &req));
    wsync_receiver_t *r = NULL;
    EXPECT_ERR(wsync_receiver_create(fresh, req.data, req.size, 0, &r), WSYNC_ERR_MISMATCH,
               "expected an init blob, got a request blob");
    wsync_receiver_t *rb = open_receiver(&b.init, 0);
    wsync_recv_t *it = NULL;
    EXPECT_ERR(wsync_receiver_receive(rb, a.init.data, a.init.size, &it), WSYNC_ERR_MISMATCH,
               "got an init blob");
    EXPECT_ERR(wsync_receiver_receive(rb, req.data, req.size, &it), WSYNC_ERR_MISMATCH,
               "request is for segment");
    wsync_receiver_destroy(rb);
    wsync_blob_free(&req);
    wsync_strategy_destroy(fresh);
    trainer_close(&a);
    wsync_strategy_destroy(b.strategy);
    wsync_blob_free(&b.init);
}

/* A flush with the largest timeout still waits (a budget past the clock's range once ended at
 * once with TIMEOUT). */
static void *end_after_200ms(void *it) {
    usleep(200000);
    wsync_recv_t *i = (wsync_recv_t *)it;
    wsync_tensor_t v;
    bool has = true;
    while (has && wsync_recv_next(i, &v, &has) == WSYNC_OK) {
    }
    wsync_recv_end(i);
    return NULL;
}

static void *fail_after_200ms(void *it) {
    usleep(200000);
    wsync_recv_fail((wsync_recv_t *)it, WSYNC_ERR_MISMATCH, "the slower loader refused t1");
    return NULL;
}

static wsync_failure_t failure_at(wsync_sender_t *tx, size_t i) {
    wsync_failure_t f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    OK(wsync_sender_failure(tx, i, &f));
    return f;
}

/* A version that fails on two engines is reported whole by its flush: the receiver that
 * failed first is not waited for further, the others are until each answers, and one PEER
 * names both failures. Before, the flush raised with the faster engine's failure alone and
 * the slower one's failed the next version's first send, which abandoned that version
 * (Python trainer trial). With an engine that never answers, the flush ends at its deadline
 * with PEER naming the failure and the silent receiver. */
static void a_version_failed_by_two_engines_is_reported_whole_by_one_flush(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 3}");
    wsync_receiver_t *r[3];
    for (uint32_t i = 0; i < 3; ++i) r[i] = open_receiver(&tr.init, i);
    wsync_chunk_t c = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    wsync_recv_t *it[3];
    pthread_t th[2];

    model_fill(&m, 1);
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    for (int i = 0; i < 3; ++i) OK(wsync_receiver_receive(r[i], req.data, req.size, &it[i]));
    OK(wsync_recv_fail(it[0], WSYNC_ERR_MISMATCH, "the loader refused t0"));
    assert_int_equal(pthread_create(&th[0], NULL, fail_after_200ms, it[1]), 0);
    assert_int_equal(pthread_create(&th[1], NULL, end_after_200ms, it[2]), 0);
    long t0 = tu_now_ms();
    assert_int_equal(wsync_sender_flush(tr.sender, 5000), WSYNC_ERR_PEER);
    assert_true(tu_now_ms() - t0 >= 150);
    assert_non_null(strstr(wsync_last_error(), "receiver 0"));
    assert_non_null(strstr(wsync_last_error(), "the loader refused t0"));
    assert_non_null(strstr(wsync_last_error(), "the slower loader refused t1"));
    size_t n = 0;
    OK(wsync_sender_failure_count(tr.sender, &n));
    assert_int_equal(n, 2);
    for (size_t i = 0; i < 2; ++i) {
        wsync_failure_t f = failure_at(tr.sender, i);
        assert_int_equal(f.receiver, i);
        assert_int_equal(f.what, WSYNC_FAILURE_FAILED);
        assert_int_equal(f.status, WSYNC_ERR_MISMATCH);
        assert_int_equal(f.version, 1);
    }
    for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
    wsync_blob_free(&req);

    /* The next version owes nothing to the last one's failures: it sends and completes. */
    model_fill(&m, 2);
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    for (int i = 0; i < 3; ++i) load_chunk(r[i], &req);
    OK(wsync_sender_flush(tr.sender, 5000));
    wsync_blob_free(&req);

    /* A failure beside a receiver that never answers: PEER at the deadline, naming both. */
    model_fill(&m, 3);
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    OK(wsync_receiver_receive(r[0], req.data, req.size, &it[0]));
    OK(wsync_recv_fail(it[0], WSYNC_ERR_MISMATCH, "the loader refused t0"));
    load_chunk(r[1], &req);
    t0 = tu_now_ms();
    assert_int_equal(wsync_sender_flush(tr.sender, 300), WSYNC_ERR_PEER);
    assert_true(tu_now_ms() - t0 >= 250);
    assert_non_null(strstr(wsync_last_error(), "and receivers [2] did not acknowledge within 300 ms"));
    OK(wsync_sender_failure_count(tr.sender, &n));
    assert_int_equal(n, 2);
    wsync_failure_t f0 = failure_at(tr.sender, 0), f1 = failure_at(tr.sender, 1);
    assert_int_equal(f0.receiver, 0);
    assert_int_equal(f0.status, WSYNC_ERR_MISMATCH);
    assert_int_equal(f1.receiver, 2);
    assert_int_equal(f1.what, WSYNC_FAILURE_TIMEOUT);
    assert_int_equal(f1.version, 3);
    wsync_blob_free(&req);
    for (int i = 0; i < 3; ++i) wsync_receiver_destroy(r[i]);
    trainer_close(&tr);
    model_free(&m);
}

static void flush_with_the_largest_timeout_waits_for_the_receiver(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, NULL);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    model_t m;
    model_init(&m);
    model_fill(&m, 1);
    wsync_chunk_t c = tu_chunk(m.t, NT, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, end_after_200ms, it), 0);
    long t0 = tu_now_ms();
    OK(wsync_sender_flush(tr.sender, INT64_MAX));
    assert_true(tu_now_ms() - t0 >= 150);
    pthread_join(th, NULL);
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    model_free(&m);
    trainer_close(&tr);
}

/* --- what is left behind ------------------------------------------------------------------- */

static void segment_is_private_unguessable_and_removed(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, "{\"receivers\": 2}");
    char name[128];
    segment_name(&tr.init, name, sizeof name);
    assert_int_equal(strlen(name), strlen("/wsync-") + 32); /* 128 random bits */
    char path[256];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* Once every receiver has attached, the name is no longer needed and disappears, so even a
     * trainer killed with SIGKILL leaves nothing in /dev/shm. */
    wsync_receiver_t *r0 = open_receiver(&tr.init, 0);
    OK(wsync_sender_flush(tr.sender, 0));
    assert_true(segment_exists(name));
    wsync_receiver_t *r1 = open_receiver(&tr.init, 1);
    OK(wsync_sender_flush(tr.sender, 0));
    assert_false(segment_exists(name));
    wsync_receiver_destroy(r0);
    wsync_receiver_destroy(r1);
    trainer_close(&tr);
}

static void strategy_destroyed_without_sender_removes_its_segment(void **state) {
    (void)state;
    wsync_strategy_t *s;
    wsync_blob_t init;
    OK(wsync_strategy_create("shm", NULL, &s));
    OK(wsync_strategy_create_init_info(s, &init));
    char name[128];
    segment_name(&init, name, sizeof name);
    assert_true(segment_exists(name));
    wsync_strategy_destroy(s);
    assert_false(segment_exists(name));
    wsync_strategy_t *s2;
    wsync_receiver_t *r = NULL;
    OK(wsync_strategy_create("shm", NULL, &s2));
    EXPECT_ERR(wsync_receiver_create(s2, init.data, init.size, 0, &r), WSYNC_ERR_UNAVAILABLE,
               "the sender is gone");
    wsync_strategy_destroy(s2);
    wsync_blob_free(&init);
}

static void oversized_segment_is_no_memory_not_sigbus(void **state) {
    (void)state;
    /* 64 buckets of 1 TiB cannot be reserved in /dev/shm: the failure is immediate and named. */
    wsync_strategy_t *s;
    wsync_blob_t init;
    OK(wsync_strategy_create("shm", "{\"buckets\": 64, \"bucket_bytes\": 1099511627776}", &s));
    wsync_status_t st = wsync_strategy_create_init_info(s, &init);
    assert_true(st == WSYNC_ERR_NO_MEMORY || st == WSYNC_ERR_SYSTEM);
    assert_non_null(strstr(wsync_last_error(), "bytes"));
    assert_null(init.data);
    wsync_strategy_destroy(s);
}


/* --- the sender's arena: tensors kept in the segment cross in place ------------------------ */

/* Whether the request's JSON (wsync_blob_describe), with its whitespace taken out, contains
 * `needle`. */
static int request_says(const wsync_blob_t *req, const char *needle) {
    char *json;
    OK(wsync_blob_describe(req->data, req->size, &json));
    size_t w = 0;
    for (size_t i = 0; json[i]; ++i)
        if (!strchr(" \n\t", json[i])) json[w++] = json[i];
    json[w] = '\0';
    int found = strstr(json, needle) != NULL;
    wsync_string_free(json);
    return found;
}

static void arena_is_null_without_the_option_and_arguments_are_checked(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, NULL);
    void *base = (void *)1;
    uint64_t bytes = 1;
    OK(wsync_sender_arena(tr.sender, &base, &bytes));
    assert_null(base);
    assert_int_equal(bytes, 0);
    EXPECT_ERR(wsync_sender_arena(NULL, &base, &bytes), WSYNC_ERR_INVALID_ARGUMENT, "sender");
    EXPECT_ERR(wsync_sender_arena(tr.sender, NULL, &bytes), WSYNC_ERR_INVALID_ARGUMENT, "base");
    EXPECT_ERR(wsync_sender_arena(tr.sender, &base, NULL), WSYNC_ERR_INVALID_ARGUMENT, "bytes");
    trainer_close(&tr);
}

/* Tensors 0-2 live in the arena (0 and 1 at 256-byte multiples, 2 at 64 bytes past one), the
 * rest in the trainer's heap: 0 and 1 cross in place, 2 and the heap ones are packed. Every
 * step is bit for bit, and the request names exactly the in-place entries. */
static void arena_tensors_cross_in_place_and_the_rest_are_packed(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    trainer_t tr;
    trainer_open(&tr, "{\"bucket_bytes\": 65536, \"arena_bytes\": 65000}");
    uint8_t *arena;
    uint64_t arena_bytes;
    OK(wsync_sender_arena(tr.sender, (void **)&arena, &arena_bytes));
    assert_non_null(arena);
    assert_int_equal(arena_bytes, 65536); /* rounded up to whole pages */
    const size_t at[3] = {0, 8192, 16384 + 64};
    for (int i = 0; i < 3; ++i) {
        assert_true(at[i] + m.bytes[i] <= arena_bytes);
        m.t[i].data = arena + at[i];
    }
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    int ids_a[3] = {0, 1, 2}, ids_b[3] = {3, 4, 5};
    for (uint64_t step = 1; step <= 3; ++step) {
        for (int i = 0; i < NT; ++i) tu_fill((void *)m.t[i].data, m.bytes[i], step, (uint64_t)i);
        wsync_chunk_t a = tu_chunk(&m.t[0], 3, 0), b = tu_chunk(&m.t[3], 3, WSYNC_CHUNK_LAST);
        wsync_blob_t ra, rb;
        OK(wsync_sender_send_chunk(tr.sender, &a, &ra));
        OK(wsync_sender_send_chunk(tr.sender, &b, &rb));
        assert_true(request_says(&ra, "\"arena\":[0,1]"));
        assert_false(request_says(&rb, "\"arena\""));
        assert_true(receive_and_check(r, &ra, step, ids_a, 3));
        assert_true(receive_and_check(r, &rb, step, ids_b, 3));
        OK(wsync_sender_flush(tr.sender, 2000)); /* from here the arena may be written again */
        wsync_blob_free(&ra);
        wsync_blob_free(&rb);
    }
    wsync_receiver_destroy(r);
    for (int i = 0; i < 3; ++i) m.t[i].data = m.data[i];
    trainer_close(&tr);
    model_free(&m);
}

/* An in-place tensor is the trainer's memory until the chunk is acknowledged: a write after
 * send and before the engine reads is what the engine sees. With checksums off it is loaded
 * (that is the borrow rule's point); with checksums on the version fails with INTEGRITY on the
 * engine and the trainer's flush reports it, and the engine keeps its old version. */
static void arena_tensor_written_before_the_ack_is_seen_or_refused_by_checksum(void **state) {
    (void)state;
    for (int checksum = 0; checksum <= 1; ++checksum) {
        trainer_t tr;
        trainer_open(&tr, checksum ? "{\"arena_bytes\": 4096, \"checksum\": true}"
                                   : "{\"arena_bytes\": 4096, \"checksum\": false}");
        uint8_t *arena;
        uint64_t arena_bytes;
        OK(wsync_sender_arena(tr.sender, (void **)&arena, &arena_bytes));
        int64_t n = 512;
        wsync_tensor_t t = tu_tensor("w", arena, &n, 1, WSYNC_DTYPE_UINT, 64);
        tu_fill(arena, 4096, 1, 0);
        wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tr.sender, &c, &req));
        assert_true(request_says(&req, "\"arena\":[0]"));
        arena[100] ^= 0xff; /* the breach: written before the engine acknowledged */
        wsync_receiver_t *r = open_receiver(&tr.init, 0);
        wsync_recv_t *it;
        OK(wsync_receiver_receive(r, req.data, req.size, &it));
        wsync_tensor_t v;
        bool has;
        uint64_t done;
        if (!checksum) {
            OK(wsync_recv_next(it, &v, &has));
            assert_true(has);
            assert_memory_equal(v.data, arena, 4096); /* read in place: the engine sees the write */
            OK(wsync_recv_end(it));
            OK(wsync_receiver_completed_version(r, &done));
            assert_int_equal(done, 1);
            OK(wsync_sender_flush(tr.sender, 1000));
        } else {
            EXPECT_ERR(wsync_recv_next(it, &v, &has), WSYNC_ERR_INTEGRITY, "tensor 'w'");
            EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_INTEGRITY, "checksum");
            OK(wsync_receiver_completed_version(r, &done));
            assert_int_equal(done, 0);
            EXPECT_ERR(wsync_sender_flush(tr.sender, 1000), WSYNC_ERR_PEER, "WSYNC_ERR_INTEGRITY");
        }
        wsync_blob_free(&req);
        wsync_receiver_destroy(r);
        trainer_close(&tr);
    }
}

/* A large tensor's checksum is a tree hash whose 64 KiB pieces the engine's copy threads verify
 * while they copy (docs/data-path.md). One byte written into a 12 MiB in-place tensor after the
 * trainer hashed it (the borrow breach above) fails the copy with INTEGRITY naming the tensor,
 * wherever it lands: first byte, either side of a piece boundary, the middle, the last byte; the
 * trainer's flush reports each; a clean version after them is copied bit-exact. Trainer and
 * engine each run 3 copy threads, between which the tensor's 192 pieces are shared out. */
static void a_byte_changed_anywhere_in_a_large_tensor_fails_the_threaded_verification(void **state) {
    (void)state;
    enum { N = 12 << 20 };
    trainer_t tr;
    trainer_open(&tr, "{\"arena_bytes\": 12582912, \"checksum\": true, \"copy_threads\": 3}");
    uint8_t *arena;
    uint64_t arena_bytes;
    OK(wsync_sender_arena(tr.sender, (void **)&arena, &arena_bytes));
    tu_fill(arena, N, 7, 0);
    wsync_strategy_t *rs;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("shm", "{\"copy_threads\": 3}", &rs));
    OK(wsync_receiver_create(rs, tr.init.data, tr.init.size, 0, &r));
    uint8_t *dst = malloc(N + 64);
    int64_t n = N;
    wsync_tensor_t t = tu_tensor("w", arena, &n, 1, WSYNC_DTYPE_UINT, 8);
    const size_t at[] = {0, 65535, 65536, N / 2 + 12345, N - 1};
    for (size_t k = 0; k <= sizeof at / sizeof at[0]; ++k) {
        const int breach = k < sizeof at / sizeof at[0];
        wsync_chunk_t c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
        wsync_blob_t req;
        OK(wsync_sender_send_chunk(tr.sender, &c, &req));
        assert_true(request_says(&req, "\"tree\""));
        if (breach) arena[at[k]] ^= 0x20;
        wsync_recv_t *it;
        OK(wsync_receiver_receive(r, req.data, req.size, &it));
        uint64_t done;
        if (breach) {
            EXPECT_ERR(wsync_recv_copy(it, 0, 0, dst + 64, N), WSYNC_ERR_INTEGRITY, "tensor 'w'");
            wsync_recv_end(it);
            EXPECT_ERR(wsync_sender_flush(tr.sender, 5000), WSYNC_ERR_PEER, "WSYNC_ERR_INTEGRITY");
            arena[at[k]] ^= 0x20;
            OK(wsync_receiver_completed_version(r, &done));
            assert_int_equal(done, 0);
        } else {
            OK(wsync_recv_copy(it, 0, 0, dst + 64, N));
            OK(wsync_recv_end(it));
            OK(wsync_sender_flush(tr.sender, 5000));
            assert_memory_equal(dst + 64, arena, N);
            OK(wsync_receiver_completed_version(r, &done));
            assert_int_equal(done, k + 1);
        }
        wsync_blob_free(&req);
    }
    free(dst);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(rs);
    trainer_close(&tr);
}

/* The request's "arena" list is checked before any byte is read: entries out of order, past the
 * table, or whose offset and size do not fit in the arena are MALFORMED, and the chunk can still
 * be taken from an intact copy of the request. */
static void arena_list_that_lies_is_malformed(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr, "{\"arena_bytes\": 4096, \"checksum\": false}");
    uint8_t *arena;
    uint64_t arena_bytes;
    OK(wsync_sender_arena(tr.sender, (void **)&arena, &arena_bytes));
    /* a: 2048 bytes in the arena at 0 and 2048; b: 8 KiB packed into the bucket at offset 0,
     * c: 8 KiB packed at 8192, which as an arena offset lies outside the 4096-byte arena. */
    static uint64_t b[1024], c[1024];
    int64_t na = 256, nb = 1024;
    wsync_tensor_t t[4] = {tu_tensor("a0", arena, &na, 1, WSYNC_DTYPE_UINT, 64),
                           tu_tensor("a1", arena + 2048, &na, 1, WSYNC_DTYPE_UINT, 64),
                           tu_tensor("b", b, &nb, 1, WSYNC_DTYPE_UINT, 64),
                           tu_tensor("c", c, &nb, 1, WSYNC_DTYPE_UINT, 64)};
    tu_fill(arena, 4096, 1, 0);
    tu_fill(b, sizeof b, 1, 2);
    tu_fill(c, sizeof c, 1, 3);
    wsync_chunk_t ch = tu_chunk(t, 4, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(tr.sender, &ch, &req));
    assert_true(request_says(&req, "\"arena\":[0,1]"));
    /* CBOR: text "arena" (0x65 'a' 'r' 'e' 'n' 'a'), array of 2 (0x82), then 0x00 0x01. */
    size_t at = 0;
    for (size_t i = 0; i + 9 <= req.size; ++i)
        if (memcmp(req.data + i, "\x65" "arena" "\x82\x00\x01", 9) == 0) at = i + 7;
    assert_int_not_equal(at, 0);
    wsync_receiver_t *r = open_receiver(&tr.init, 0);
    const struct {
        uint8_t first, second;
        const char *why;
    } lies[] = {{0x01, 0x00, "strictly increasing"},
                {0x00, 0x00, "strictly increasing"},
                {0x00, 0x04, "arena"},  /* index 4 of a 4-tensor table */
                {0x00, 0x03, "outside the 4096-byte arena"}};
    for (size_t k = 0; k < sizeof lies / sizeof lies[0]; ++k) {
        wsync_blob_t bad = {malloc(req.size), req.size};
        memcpy(bad.data, req.data, req.size);
        bad.data[at] = lies[k].first;
        bad.data[at + 1] = lies[k].second;
        tu_reseal(bad.data, bad.size);
        wsync_recv_t *it = NULL;
        EXPECT_ERR(wsync_receiver_receive(r, bad.data, bad.size, &it), WSYNC_ERR_MALFORMED, lies[k].why);
        assert_null(it);
        free(bad.data);
    }
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req.data, req.size, &it));
    for (int i = 0; i < 4; ++i) {
        uint64_t got[1024];
        const uint64_t len = i < 2 ? 2048 : 8192;
        OK(wsync_recv_copy(it, (size_t)i, 0, got, len));
        assert_memory_equal(got, i < 2 ? (const void *)(arena + 2048 * i) : (i == 2 ? (void *)b : (void *)c), len);
    }
    OK(wsync_recv_end(it));
    OK(wsync_sender_flush(tr.sender, 1000));
    wsync_blob_free(&req);
    wsync_receiver_destroy(r);
    trainer_close(&tr);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(sync_moves_every_tensor_bit_for_bit_over_several_steps),
    cmocka_unit_test(request_describes_version_chunk_and_tensors),
    cmocka_unit_test(views_are_aligned_to_256_bytes),
    cmocka_unit_test(three_receiver_processes_sync_five_steps_bit_for_bit),
    cmocka_unit_test(killed_receiver_fails_flush_within_deadline_and_leaves_no_segment),
    cmocka_unit_test(flush_times_out_naming_receivers_that_never_answered),
    cmocka_unit_test(send_blocks_for_a_free_bucket_then_times_out),
    cmocka_unit_test(corrupted_checksum_fails_the_iteration_and_the_version),
    cmocka_unit_test(verify_false_skips_checksums),
    cmocka_unit_test(ending_early_acknowledges_failure_and_keeps_the_old_version),
    cmocka_unit_test(receive_while_iterating_is_wrong_state),
    cmocka_unit_test(shm_accepts_and_ignores_a_callers_stream),
    cmocka_unit_test(chunks_out_of_order_or_replayed_are_mismatch),
    cmocka_unit_test(a_chunk_of_the_next_version_before_its_chunk_0_fails_that_version_only),
    cmocka_unit_test(a_request_of_another_sync_is_refused_and_changes_nothing),
    cmocka_unit_test(a_lagging_engine_completes_a_committed_version_after_a_later_one_is_abandoned),
    cmocka_unit_test(a_late_chunk_of_an_abandoned_version_is_refused_as_abandoned),
    cmocka_unit_test(a_completed_version_stays_completed_whatever_the_trainer_does_next),
    cmocka_unit_test(a_receiver_dropped_while_it_reads_never_completes_the_version),
    cmocka_unit_test(a_restarted_engine_given_the_version_in_flight_is_refused_as_joined_late),
    cmocka_unit_test(an_engine_that_failed_and_restarted_before_the_trainer_looked_is_still_reported),
    cmocka_unit_test(late_requests_of_an_abandoned_version_do_not_fail_the_next_one),
    cmocka_unit_test(replayed_request_is_mismatch_and_a_held_index_cannot_be_taken),
    cmocka_unit_test(bad_tensors_are_rejected_by_name_and_nothing_is_published),
    cmocka_unit_test(receiver_index_out_of_range_or_taken_is_refused),
    cmocka_unit_test(blobs_of_another_role_or_strategy_are_mismatch),
    cmocka_unit_test(segment_is_private_unguessable_and_removed),
    cmocka_unit_test(a_version_failed_by_two_engines_is_reported_whole_by_one_flush),
    cmocka_unit_test(flush_with_the_largest_timeout_waits_for_the_receiver),
    cmocka_unit_test(strategy_destroyed_without_sender_removes_its_segment),
    cmocka_unit_test(oversized_segment_is_no_memory_not_sigbus),
    cmocka_unit_test(arena_is_null_without_the_option_and_arguments_are_checked),
    cmocka_unit_test(arena_tensors_cross_in_place_and_the_rest_are_packed),
    cmocka_unit_test(arena_tensor_written_before_the_ack_is_seen_or_refused_by_checksum),
    cmocka_unit_test(a_byte_changed_anywhere_in_a_large_tensor_fails_the_threaded_verification),
    cmocka_unit_test(arena_list_that_lies_is_malformed),
};

TU_MAIN(tests)
