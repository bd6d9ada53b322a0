/* wsync_dest_table_create / wsync_recv_apply over shm: a chunk loaded into declared
 * destinations by one call, bit for bit; every refusal named, made before any byte moves, and
 * leaving the iteration as it was. (The GPU kinds' one launch per chunk: test_gpu_apply.c.) */
#include "testutil.h"

typedef struct {
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
    wsync_receiver_t *receiver;
} sync_t;

static void sync_open(sync_t *s) {
    memset(s, 0, sizeof *s);
    OK(wsync_strategy_create("shm", "{\"bucket_bytes\": 4194304}", &s->strategy));
    OK(wsync_strategy_create_init_info(s->strategy, &s->init));
    OK(wsync_sender_create(s->strategy, s->init.data, s->init.size, &s->sender));
    OK(wsync_receiver_create(s->strategy, s->init.data, s->init.size, 0, &s->receiver));
}

static void sync_close(sync_t *s) {
    wsync_receiver_destroy(s->receiver);
    wsync_sender_destroy(s->sender);
    wsync_strategy_destroy(s->strategy);
    wsync_blob_free(&s->init);
}

/* The trainer's model: float32 "q" [4, 8], "k" [2, 8], "v" [2, 8], "emb" [16, 8]. */
static const char *const kNames[] = {"q", "k", "v", "emb"};
static const int64_t kShapes[][2] = {{4, 8}, {2, 8}, {2, 8}, {16, 8}};
#define NT 4
static size_t bytes_of(size_t t) { return (size_t)(kShapes[t][0] * kShapes[t][1]) * 4; }

/* Sends the tensors listed in `which` (indices into kNames) at `step` as one chunk. */
static wsync_recv_t *send_some(sync_t *s, const size_t *which, size_t n, uint64_t step, uint32_t flags) {
    wsync_tensor_t t[NT];
    void *data[NT];
    for (size_t k = 0; k < n; ++k) {
        data[k] = malloc(bytes_of(which[k]));
        tu_fill(data[k], bytes_of(which[k]), step, which[k]);
        t[k] = tu_tensor(kNames[which[k]], data[k], kShapes[which[k]], 2, WSYNC_DTYPE_FLOAT, 32);
    }
    wsync_chunk_t c = tu_chunk(t, n, flags);
    wsync_blob_t req;
    OK(wsync_sender_send_chunk(s->sender, &c, &req));
    for (size_t k = 0; k < n; ++k) free(data[k]);
    wsync_recv_t *it;
    OK(wsync_receiver_receive(s->receiver, req.data, req.size, &it));
    wsync_blob_free(&req);
    return it;
}

static const size_t kAll[] = {0, 1, 2, 3};

static wsync_dest_t dest(const char *name, void *data, size_t t, uint64_t src_offset, uint64_t bytes) {
    wsync_dest_t d;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.data = data;
    d.shape = kShapes[t];
    d.ndim = 2;
    d.dtype.code = WSYNC_DTYPE_FLOAT;
    d.dtype.bits = 32;
    d.dtype.lanes = 1;
    d.src_offset = src_offset;
    d.bytes = bytes;
    return d;
}

/* The engine's memory: q, k and v fused into one qkv [8, 8] (q rows 0-3, k 4-5, v 6-7), the
 * embedding kept twice (an untied lm_head), each with guard bytes around it. */
typedef struct {
    uint8_t qkv[64 + 256 + 64];
    uint8_t emb[64 + 512 + 64];
    uint8_t head[64 + 512 + 64];
} engine_t;

static void engine_reset(engine_t *e) { memset(e, 0xA5, sizeof *e); }

static wsync_dest_table_t *engine_table(sync_t *s, engine_t *e) {
    wsync_dest_t d[5] = {
        dest("q", e->qkv + 64, 0, 0, 0),
        dest("k", e->qkv + 64 + 128, 1, 0, 0),
        dest("v", e->qkv + 64 + 192, 2, 0, 0),
        dest("emb", e->emb + 64, 3, 0, 0),
        dest("emb", e->head + 64, 3, 0, 0),
    };
    wsync_dest_table_t *table;
    OK(wsync_dest_table_create(s->receiver, d, 5, &table));
    return table;
}

static int guards_intact(const engine_t *e) {
    for (size_t g = 0; g < 64; ++g)
        if (e->qkv[g] != 0xA5 || e->qkv[64 + 256 + g] != 0xA5 || e->emb[g] != 0xA5 ||
            e->emb[64 + 512 + g] != 0xA5 || e->head[g] != 0xA5 || e->head[64 + 512 + g] != 0xA5)
            return 0;
    return 1;
}

static int engine_holds(const engine_t *e, uint64_t step) {
    return tu_check(e->qkv + 64, bytes_of(0), step, 0) && tu_check(e->qkv + 64 + 128, bytes_of(1), step, 1) &&
           tu_check(e->qkv + 64 + 192, bytes_of(2), step, 2) && tu_check(e->emb + 64, bytes_of(3), step, 3) &&
           tu_check(e->head + 64, bytes_of(3), step, 3) && guards_intact(e);
}

static void a_chunk_loads_into_fused_and_tied_destinations_by_one_call(void **state) {
    (void)state;
    sync_t s;
    sync_open(&s);
    engine_t e;
    engine_reset(&e);
    wsync_dest_table_t *table = engine_table(&s, &e);
    for (uint64_t v = 1; v <= 3; ++v) {
        wsync_recv_t *it = send_some(&s, kAll, NT, v, WSYNC_CHUNK_LAST);
        wsync_apply_result_t r;
        memset(&r, 0, sizeof r);
        r.struct_size = sizeof r;
        OK(wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, &r));
        assert_int_equal(r.tensors, 4);
        assert_int_equal(r.writes, 5);
        assert_int_equal(r.unmatched, 0);
        assert_int_equal(r.launches, 0); /* host memory: the copy loop, no kernel */
        assert_int_equal(r.bytes, bytes_of(0) + bytes_of(1) + bytes_of(2) + 2 * bytes_of(3));
        OK(wsync_recv_end(it));
        if (!engine_holds(&e, v)) fail_msg("version %llu: the engine's memory differs", (unsigned long long)v);
        uint64_t done;
        OK(wsync_receiver_completed_version(s.receiver, &done));
        assert_int_equal(done, v);
    }
    wsync_dest_table_destroy(table);
    sync_close(&s);
}

/* A program built against the 0.6.0 header passes that layout's struct_size (40 bytes, before
 * device_copies): it gets the fields it has, nothing is written past them, and struct_size says
 * 40 (before 0.7.0 such a caller was refused with INVALID_ARGUMENT by every apply). 0 stands for
 * that oldest layout too; a size below it is refused by name; WSYNC_APPLY_RESULT_INIT gives this
 * header's layout, device_copies included. */
static void a_caller_built_against_an_older_header_gets_the_result_fields_it_has(void **state) {
    (void)state;
    sync_t s;
    sync_open(&s);
    engine_t e;
    engine_reset(&e);
    wsync_dest_table_t *table = engine_table(&s, &e);
    const uint32_t sizes[3] = {WSYNC_APPLY_RESULT_SIZE_0_6_0, 0, (uint32_t)sizeof(wsync_apply_result_t)};
    for (uint64_t v = 1; v <= 3; ++v) {
        wsync_recv_t *it = send_some(&s, kAll, NT, v, WSYNC_CHUNK_LAST);
        union {
            wsync_apply_result_t r;
            unsigned char bytes[sizeof(wsync_apply_result_t) + 16];
        } u;
        memset(&u, 0xA5, sizeof u);
        if (v == 3) u.r = WSYNC_APPLY_RESULT_INIT;
        u.r.struct_size = sizes[v - 1];
        if (v == 1) { /* below the oldest layout: refused, nothing applied */
            wsync_apply_result_t tiny = {WSYNC_APPLY_RESULT_SIZE_0_6_0 - 8, 0, 0, 0, 0, 0, 0};
            EXPECT_ERR(wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, &tiny),
                       WSYNC_ERR_INVALID_ARGUMENT, "the oldest layout");
        }
        OK(wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, &u.r));
        const size_t written = v == 3 ? sizeof(wsync_apply_result_t) : WSYNC_APPLY_RESULT_SIZE_0_6_0;
        assert_int_equal(u.r.struct_size, written);
        assert_int_equal(u.r.tensors, 4);
        assert_int_equal(u.r.writes, 5);
        assert_int_equal(u.r.bytes, bytes_of(0) + bytes_of(1) + bytes_of(2) + 2 * bytes_of(3));
        for (size_t i = written; i < sizeof u.bytes; ++i) assert_int_equal(u.bytes[i], 0xA5);
        if (v == 3) assert_int_equal(u.r.device_copies, 0); /* host memory: no driver copy */
        OK(wsync_recv_end(it));
        if (!engine_holds(&e, v)) fail_msg("version %llu: the engine's memory differs", (unsigned long long)v);
    }
    wsync_dest_table_destroy(table);
    sync_close(&s);
}

static void a_table_that_does_not_fit_is_refused_by_name_before_any_byte_moves(void **state) {
    (void)state;
    sync_t s;
    sync_open(&s);
    engine_t e;
    engine_reset(&e);
    /* k declared [4, 8]: the chunk's k is [2, 8]. */
    static const int64_t wrong[2] = {4, 8};
    wsync_dest_t d[4] = {
        dest("q", e.qkv + 64, 0, 0, 0), dest("k", e.qkv + 64 + 128, 1, 0, 0),
        dest("v", e.qkv + 64 + 192, 2, 0, 0), dest("emb", e.emb + 64, 3, 0, 0),
    };
    d[1].shape = wrong;
    d[2].dtype.code = WSYNC_DTYPE_BFLOAT; /* v declared bfloat16 [2, 16]: same bytes, other dtype */
    d[2].dtype.bits = 16;
    static const int64_t v16[2] = {2, 16};
    d[2].shape = v16;
    d[1].bytes = 64; /* k takes rows 0-1 of a [4, 8] tensor */
    wsync_dest_table_t *table;
    OK(wsync_dest_table_create(s.receiver, d, 4, &table));
    wsync_recv_t *it = send_some(&s, kAll, NT, 1, WSYNC_CHUNK_LAST);
    wsync_apply_result_t r;
    memset(&r, 0, sizeof r);
    EXPECT_ERR(wsync_recv_apply(it, table, 0, &r), WSYNC_ERR_MISMATCH, "'k'");
    assert_non_null(strstr(wsync_last_error(), "[2, 8]"));
    assert_non_null(strstr(wsync_last_error(), "[4, 8]"));
    engine_t untouched;
    engine_reset(&untouched);
    assert_memory_equal(&e, &untouched, sizeof e); /* nothing moved */
    /* The iteration is as it was: the loader can take the chunk another way. */
    for (size_t i = 0; i < NT; ++i) OK(wsync_recv_copy(it, i, 0, e.emb + 64, bytes_of(i)));
    OK(wsync_recv_end(it));
    wsync_dest_table_destroy(table);
    sync_close(&s);
}

static void a_tensor_without_destination_is_refused_unless_partial_leaves_it(void **state) {
    (void)state;
    sync_t s;
    sync_open(&s);
    engine_t e;
    engine_reset(&e);
    wsync_dest_t d[3] = {dest("q", e.qkv + 64, 0, 0, 0), dest("k", e.qkv + 64 + 128, 1, 0, 0),
                         dest("v", e.qkv + 64 + 192, 2, 0, 0)};
    wsync_dest_table_t *table;
    OK(wsync_dest_table_create(s.receiver, d, 3, &table));
    wsync_recv_t *it = send_some(&s, kAll, NT, 1, WSYNC_CHUNK_LAST);
    EXPECT_ERR(wsync_recv_apply(it, table, 0, NULL), WSYNC_ERR_MISMATCH, "'emb'");
    assert_non_null(strstr(wsync_last_error(), "has no destination"));
    assert_true(guards_intact(&e) && e.qkv[64] == 0xA5);
    wsync_apply_result_t r;
    memset(&r, 0, sizeof r);
    OK(wsync_recv_apply(it, table, WSYNC_APPLY_PARTIAL, &r));
    assert_int_equal(r.tensors, 3);
    assert_int_equal(r.unmatched, 1);
    /* The one left comes as the only view; then the chunk ends complete. */
    wsync_tensor_t view;
    bool has;
    OK(wsync_recv_next(it, &view, &has));
    assert_true(has);
    assert_string_equal(view.name, "emb");
    OK(wsync_recv_next(it, &view, &has));
    assert_false(has);
    OK(wsync_recv_end(it));
    assert_true(tu_check(e.qkv + 64, bytes_of(0), 1, 0) && tu_check(e.qkv + 64 + 192, bytes_of(2), 1, 2));
    wsync_dest_table_destroy(table);
    sync_close(&s);
}

static void complete_refuses_a_version_that_misses_a_destination_and_it_never_commits(void **state) {
    (void)state;
    sync_t s;
    sync_open(&s);
    engine_t e;
    engine_reset(&e);
    wsync_dest_table_t *table = engine_table(&s, &e);
    /* Version 1: q, k in chunk 0; v, emb in chunk 1. Complete. */
    static const size_t first[] = {0, 1}, second[] = {2, 3}, without_emb[] = {2};
    wsync_recv_t *it = send_some(&s, first, 2, 1, 0);
    OK(wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, NULL));
    OK(wsync_recv_end(it));
    it = send_some(&s, second, 2, 1, WSYNC_CHUNK_LAST);
    OK(wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, NULL));
    OK(wsync_recv_end(it));
    assert_true(engine_holds(&e, 1));
    /* Version 2 sends q, k, then only v: emb (both of its destinations) never comes. */
    it = send_some(&s, first, 2, 2, 0);
    OK(wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, NULL));
    OK(wsync_recv_end(it));
    it = send_some(&s, without_emb, 1, 2, WSYNC_CHUNK_LAST);
    EXPECT_ERR(wsync_recv_apply(it, table, WSYNC_APPLY_COMPLETE, NULL), WSYNC_ERR_MISMATCH,
               "2 destination(s) of the table were not written by it: 'emb', 'emb'");
    assert_non_null(strstr(wsync_last_error(), "version 2"));
    assert_true(tu_check(e.qkv + 64 + 192, bytes_of(2), 1, 2)); /* v not written: still version 1 */
    OK(wsync_recv_fail(it, WSYNC_ERR_MISMATCH, wsync_last_error()));
    uint64_t done;
    OK(wsync_receiver_completed_version(s.receiver, &done));
    assert_int_equal(done, 1);
    wsync_dest_table_destroy(table);
    sync_close(&s);
}

static void bad_tables_and_arguments_are_refused_by_name(void **state) {
    (void)state;
    sync_t s, other;
    sync_open(&s);
    sync_open(&other);
    engine_t e;
    engine_reset(&e);
    wsync_dest_table_t *table = NULL;
    wsync_dest_t d = dest("q", e.qkv + 64, 0, 0, 0);
    EXPECT_ERR(wsync_dest_table_create(s.receiver, &d, 0, &table), WSYNC_ERR_INVALID_ARGUMENT, "n is 0");
    EXPECT_ERR(wsync_dest_table_create(NULL, &d, 1, &table), WSYNC_ERR_INVALID_ARGUMENT, "receiver");
    assert_null(table);
    d.data = NULL;
    EXPECT_ERR(wsync_dest_table_create(s.receiver, &d, 1, &table), WSYNC_ERR_INVALID_ARGUMENT, "data is NULL");
    d = dest("q", e.qkv + 64, 0, 120, 16); /* past the tensor's 128 bytes */
    EXPECT_ERR(wsync_dest_table_create(s.receiver, &d, 1, &table), WSYNC_ERR_INVALID_ARGUMENT, "'q'");
    d = dest("q", e.qkv + 64, 0, 2, 8); /* not whole float32 elements */
    EXPECT_ERR(wsync_dest_table_create(s.receiver, &d, 1, &table), WSYNC_ERR_INVALID_ARGUMENT, "whole elements");
    d = dest("q", e.qkv + 64, 0, 0, 0);
    d.flags = 1;
    EXPECT_ERR(wsync_dest_table_create(s.receiver, &d, 1, &table), WSYNC_ERR_INVALID_ARGUMENT, "flags");
    wsync_dest_t two[2] = {dest("q", e.qkv + 64, 0, 0, 0), dest("q", e.qkv + 64 + 64, 0, 0, 0)};
    EXPECT_ERR(wsync_dest_table_create(s.receiver, two, 2, &table), WSYNC_ERR_INVALID_ARGUMENT, "overlaps");
    wsync_dest_t nameless = dest(NULL, e.qkv + 64, 0, 0, 0);
    EXPECT_ERR(wsync_dest_table_create(s.receiver, &nameless, 1, &table), WSYNC_ERR_INVALID_ARGUMENT, "name");
    /* A table of another receiver, and unknown flags: refused, the iteration goes on. */
    wsync_dest_table_t *theirs = engine_table(&other, &e);
    wsync_recv_t *it = send_some(&s, kAll, NT, 1, WSYNC_CHUNK_LAST);
    EXPECT_ERR(wsync_recv_apply(it, theirs, 0, NULL), WSYNC_ERR_INVALID_ARGUMENT, "another receiver");
    wsync_dest_table_t *mine = engine_table(&s, &e);
    EXPECT_ERR(wsync_recv_apply(it, mine, 0x80, NULL), WSYNC_ERR_INVALID_ARGUMENT, "unknown flags");
    EXPECT_ERR(wsync_recv_apply(it, NULL, 0, NULL), WSYNC_ERR_INVALID_ARGUMENT, "table");
    OK(wsync_recv_apply(it, mine, 0, NULL));
    OK(wsync_recv_end(it));
    assert_true(engine_holds(&e, 1));
    wsync_dest_table_destroy(NULL);
    wsync_dest_table_destroy(mine);
    wsync_dest_table_destroy(theirs);
    sync_close(&other);
    sync_close(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_chunk_loads_into_fused_and_tied_destinations_by_one_call),
        cmocka_unit_test(a_caller_built_against_an_older_header_gets_the_result_fields_it_has),
        cmocka_unit_test(a_table_that_does_not_fit_is_refused_by_name_before_any_byte_moves),
        cmocka_unit_test(a_tensor_without_destination_is_refused_unless_partial_leaves_it),
        cmocka_unit_test(complete_refuses_a_version_that_misses_a_destination_and_it_never_commits),
        cmocka_unit_test(bad_tables_and_arguments_are_refused_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
