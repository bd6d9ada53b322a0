/* Split tensors (wsync_part_t): a tensor larger than a bucket travels as byte-range parts in
 * consecutive chunks of one version, each with its own checksum, and arrives bit-exact in the
 * engine's parameter through wsync_recv_copy; a version whose parts are out of order or
 * incomplete never commits on either side. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "testutil.h"

#define BUCKET 16384 /* bytes: the shm bucket and the planner's chunk_bytes */

/* small (1 KiB), embed (40000 bytes: parts of 16384, 16384, 7232), tail (2 KiB). */
enum { SMALL, EMBED, TAIL, NT };
static const char *kNames[NT] = {"a.small.weight", "model.embed.weight", "z.tail.weight"};
static const int64_t kShapes[NT][2] = {{16, 16}, {100, 100}, {16, 32}};

typedef struct {
    void *data[NT];
    size_t bytes[NT];
    wsync_tensor_t t[NT];
} model_t;

static void model_init(model_t *m) {
    for (int i = 0; i < NT; ++i) {
        m->bytes[i] = (size_t)(kShapes[i][0] * kShapes[i][1]) * 4;
        m->data[i] = malloc(m->bytes[i]);
        m->t[i] = tu_tensor(kNames[i], m->data[i], kShapes[i], 2, WSYNC_DTYPE_FLOAT, 32);
    }
}
static void model_free(model_t *m) {
    for (int i = 0; i < NT; ++i) free(m->data[i]);
}

typedef struct {
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
    wsync_receiver_t *receiver;
    wsync_plan_t *plan;
    size_t chunks;
} sync_t;

static void sync_open(sync_t *s, const model_t *m, const char *options) {
    OK(wsync_strategy_create("shm", options, &s->strategy));
    OK(wsync_strategy_create_init_info(s->strategy, &s->init));
    OK(wsync_sender_create(s->strategy, s->init.data, s->init.size, &s->sender));
    OK(wsync_receiver_create(s->strategy, s->init.data, s->init.size, 0, &s->receiver));
    OK(wsync_plan_create(m->t, NT, "{\"chunk_bytes\": 16384, \"split\": true}", &s->plan));
    OK(wsync_plan_chunk_count(s->plan, &s->chunks));
}
static void sync_close(sync_t *s) {
    wsync_plan_destroy(s->plan);
    wsync_receiver_destroy(s->receiver);
    wsync_sender_destroy(s->sender);
    wsync_strategy_destroy(s->strategy);
    wsync_blob_free(&s->init);
}

/* Sends plan chunk c: the chunk's descriptors and its parts. */
static wsync_status_t send_planned(sync_t *s, const model_t *m, size_t c, wsync_blob_t *req) {
    const size_t *idx;
    size_t n;
    const wsync_part_t *parts;
    OK(wsync_plan_chunk(s->plan, c, &idx, &n, NULL));
    OK(wsync_plan_chunk_parts(s->plan, c, &parts));
    wsync_tensor_t t[NT];
    for (size_t k = 0; k < n; ++k) t[k] = m->t[idx[k]];
    wsync_chunk_t ch = tu_chunk(t, n, c + 1 == s->chunks ? WSYNC_CHUNK_LAST : 0);
    return wsync_sender_send_parts(s->sender, &ch, parts, req);
}

/* Torch places a large CPU tensor 64 bytes past a page. */
static uint8_t *torch_like(size_t n, void **base) {
    if (posix_memalign(base, 4096, n + 64) != 0) return NULL;
    return (uint8_t *)*base + 64;
}

/* Receives one request and copies every entry whole into its parameter, as a loader that does
 * not know parts does; returns the request's payload bytes. */
static uint64_t load_all(sync_t *s, const wsync_blob_t *req, uint8_t *const *params) {
    wsync_recv_t *it;
    OK(wsync_receiver_receive(s->receiver, req->data, req->size, &it));
    wsync_recv_info_t info = {.struct_size = sizeof info};
    OK(wsync_recv_info(it, &info));
    for (size_t i = 0; i < info.count; ++i) {
        wsync_tensor_t v;
        OK(wsync_recv_peek(it, i, &v));
        int id = 0;
        while (strcmp(kNames[id], v.name) != 0) ++id;
        size_t whole = (size_t)(v.shape[0] * v.shape[1]) * 4;
        OK(wsync_recv_copy(it, i, 0, params[id], whole));
    }
    OK(wsync_recv_end(it));
    return info.bytes;
}

static void planner_splits_a_tensor_over_chunk_bytes_into_page_parts(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    wsync_plan_t *p;
    OK(wsync_plan_create(m.t, NT, "{\"chunk_bytes\": 16384, \"split\": true}", &p));
    size_t chunks;
    OK(wsync_plan_chunk_count(p, &chunks));
    assert_int_equal(chunks, 5);
    /* chunk: (index, offset, bytes); each tensor is a module group of its own */
    static const uint64_t want[5][3] = {{SMALL, 0, 0},
                                        {EMBED, 0, 16384},
                                        {EMBED, 16384, 16384},
                                        {EMBED, 32768, 7232},
                                        {TAIL, 0, 0}};
    for (size_t c = 0; c < chunks; ++c) {
        const size_t *idx;
        size_t n;
        uint64_t bytes;
        const wsync_part_t *parts;
        OK(wsync_plan_chunk(p, c, &idx, &n, &bytes));
        OK(wsync_plan_chunk_parts(p, c, &parts));
        assert_int_equal(n, 1);
        assert_true(bytes <= 16384);
        assert_int_equal(idx[0], want[c][0]);
        assert_int_equal(parts[0].offset, want[c][1]);
        assert_int_equal(parts[0].bytes, want[c][2]);
    }
    wsync_plan_destroy(p);
    /* A limit below one part (4096 bytes) keeps every tensor whole, as without "split": the
       option never fails a plan that succeeds without it. */
    OK(wsync_plan_create(m.t, NT, "{\"chunk_bytes\": 1000, \"split\": true}", &p));
    OK(wsync_plan_chunk_count(p, &chunks));
    assert_int_equal(chunks, NT);
    for (size_t c = 0; c < chunks; ++c) {
        const wsync_part_t *whole;
        OK(wsync_plan_chunk_parts(p, c, &whole));
        assert_int_equal(whole[0].offset, 0);
        assert_int_equal(whole[0].bytes, 0);
    }
    wsync_plan_destroy(p);
    /* Without "split" the large tensor keeps a chunk of its own, whole. */
    OK(wsync_plan_create(m.t, NT, "{\"chunk_bytes\": 16384}", &p));
    OK(wsync_plan_chunk_count(p, &chunks));
    assert_int_equal(chunks, 3);
    const wsync_part_t *parts;
    OK(wsync_plan_chunk_parts(p, 1, &parts));
    assert_int_equal(parts[0].bytes, 0);
    wsync_plan_destroy(p);
    model_free(&m);
}

static void split_tensor_arrives_bit_exact_at_page_plus_64_over_several_versions(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    sync_t s;
    sync_open(&s, &m, "{\"bucket_bytes\": 16384, \"buckets\": 2}");
    void *bases[NT];
    uint8_t *params[NT];
    for (int i = 0; i < NT; ++i) params[i] = torch_like(m.bytes[i], &bases[i]);
    for (uint64_t step = 1; step <= 3; ++step) {
        for (int i = 0; i < NT; ++i) tu_fill(m.data[i], m.bytes[i], step, (uint64_t)i);
        uint64_t moved = 0;
        for (size_t c = 0; c < s.chunks; ++c) {
            wsync_blob_t req;
            OK(send_planned(&s, &m, c, &req));
            uint64_t done;
            OK(wsync_receiver_completed_version(s.receiver, &done));
            assert_int_equal(done, step - 1); /* nobody serves a half-arrived embedding */
            moved += load_all(&s, &req, params);
            wsync_blob_free(&req);
        }
        OK(wsync_sender_flush(s.sender, 5000));
        uint64_t done;
        OK(wsync_receiver_completed_version(s.receiver, &done));
        assert_int_equal(done, step);
        /* Each byte crossed once: the parts add up to the tensor, nothing is sent twice. */
        assert_int_equal(moved, m.bytes[SMALL] + m.bytes[EMBED] + m.bytes[TAIL]);
        for (int i = 0; i < NT; ++i) assert_true(tu_check(params[i], m.bytes[i], step, (uint64_t)i));
    }
    for (int i = 0; i < NT; ++i) free(bases[i]);
    sync_close(&s);
    model_free(&m);
}

/* A loader that keeps a shard of the embedding: a byte range across the first two parts. */
static void a_range_across_parts_is_assembled_from_both_chunks(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    sync_t s;
    sync_open(&s, &m, "{\"bucket_bytes\": 16384, \"buckets\": 4}");
    for (int i = 0; i < NT; ++i) tu_fill(m.data[i], m.bytes[i], 1, (uint64_t)i);
    const uint64_t lo = 10000, hi = 20000;
    uint8_t shard[20000 - 10000];
    memset(shard, 0xee, sizeof shard);
    for (size_t c = 0; c < s.chunks; ++c) {
        wsync_blob_t req;
        OK(send_planned(&s, &m, c, &req));
        wsync_recv_t *it;
        OK(wsync_receiver_receive(s.receiver, req.data, req.size, &it));
        wsync_recv_info_t info = {.struct_size = sizeof info};
        OK(wsync_recv_info(it, &info));
        for (size_t i = 0; i < info.count; ++i) {
            wsync_tensor_t v;
            wsync_part_t part;
            OK(wsync_recv_peek(it, i, &v));
            OK(wsync_recv_part(it, i, &part));
            if (strcmp(v.name, kNames[EMBED]) == 0) {
                assert_true(part.bytes < m.bytes[EMBED]);
                if (part.offset < hi && lo < part.offset + part.bytes)
                    OK(wsync_recv_copy(it, i, lo, shard, hi - lo));
                else /* a range outside this part: nothing to copy, nothing taken */
                    OK(wsync_recv_copy(it, i, lo, shard, hi - lo));
            }
        }
        /* Whatever was not taken by a copy is taken as one view per part. */
        for (;;) {
            wsync_tensor_t v;
            wsync_part_t part;
            bool has;
            OK(wsync_recv_next_part(it, &v, &part, &has));
            if (!has) break;
            if (strcmp(v.name, kNames[EMBED]) == 0) {
                /* the third part: its view starts at its own first byte */
                assert_int_equal(part.offset, 32768);
                assert_memory_equal(v.data, (uint8_t *)m.data[EMBED] + 32768, part.bytes);
                assert_int_equal(v.shape[0], 100); /* the whole tensor's shape */
            } else {
                assert_int_equal(part.offset, 0);
            }
        }
        OK(wsync_recv_end(it));
        wsync_blob_free(&req);
    }
    assert_memory_equal(shard, (uint8_t *)m.data[EMBED] + lo, hi - lo);
    sync_close(&s);
    model_free(&m);
}

static void recv_next_refuses_a_part_by_name(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    sync_t s;
    sync_open(&s, &m, "{\"bucket_bytes\": 16384}");
    wsync_blob_t req;
    OK(send_planned(&s, &m, 0, &req));
    void *b;
    uint8_t *params[NT] = {torch_like(m.bytes[SMALL], &b), NULL, NULL};
    load_all(&s, &req, params);
    free(b);
    wsync_blob_free(&req);
    OK(send_planned(&s, &m, 1, &req));
    wsync_recv_t *it;
    OK(wsync_receiver_receive(s.receiver, req.data, req.size, &it));
    wsync_tensor_t v;
    bool has;
    EXPECT_ERR(wsync_recv_next(it, &v, &has), WSYNC_ERR_UNSUPPORTED, "model.embed.weight");
    EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_UNSUPPORTED, "wsync_recv_next_part");
    wsync_blob_free(&req);
    sync_close(&s);
    model_free(&m);
}

static void sender_refuses_parts_out_of_order_and_a_commit_before_the_last_part(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    sync_t s;
    sync_open(&s, &m, "{\"bucket_bytes\": 16384, \"buckets\": 4}");
    wsync_chunk_t ch = tu_chunk(&m.t[EMBED], 1, 0);
    wsync_blob_t req;
    wsync_part_t second = {16384, 16384}, first = {0, 16384}, last = {32768, 7232};
    EXPECT_ERR(wsync_sender_send_parts(s.sender, &ch, &second, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "must start at 0");
    wsync_part_t odd = {2, 16384};
    EXPECT_ERR(wsync_sender_send_parts(s.sender, &ch, &odd, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "element size");
    OK(wsync_sender_send_parts(s.sender, &ch, &first, &req)); /* the version stayed open */
    wsync_blob_free(&req);
    wsync_chunk_t commit = tu_chunk(&m.t[EMBED], 1, WSYNC_CHUNK_LAST);
    EXPECT_ERR(wsync_sender_send_parts(s.sender, &commit, &second, &req),
               WSYNC_ERR_INVALID_ARGUMENT, "commits the version");
    EXPECT_ERR(wsync_sender_commit(s.sender, &req), WSYNC_ERR_INVALID_ARGUMENT, "incomplete");
    wsync_chunk_t whole = tu_chunk(&m.t[EMBED], 1, 0);
    EXPECT_ERR(wsync_sender_send_chunk(s.sender, &whole, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "came whole");
    OK(wsync_sender_send_parts(s.sender, &ch, &second, &req));
    wsync_blob_free(&req);
    OK(wsync_sender_send_parts(s.sender, &commit, &last, &req));
    wsync_blob_free(&req);
    uint64_t v;
    OK(wsync_sender_version(s.sender, &v));
    assert_int_equal(v, 2);
    sync_close(&s);
    model_free(&m);
}

static void receiver_missing_a_part_never_completes_the_version(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    sync_t s;
    sync_open(&s, &m, "{\"bucket_bytes\": 16384, \"buckets\": 8, \"timeout_ms\": 300}");
    for (int i = 0; i < NT; ++i) tu_fill(m.data[i], m.bytes[i], 1, (uint64_t)i);
    wsync_blob_t req[5];
    for (size_t c = 0; c < s.chunks; ++c) OK(send_planned(&s, &m, c, &req[c]));
    void *bases[NT];
    uint8_t *params[NT];
    for (int i = 0; i < NT; ++i) params[i] = torch_like(m.bytes[i], &bases[i]);
    load_all(&s, &req[0], params);
    load_all(&s, &req[1], params);
    wsync_recv_t *it; /* the middle part is lost: the rest is refused, the version fails */
    EXPECT_ERR(wsync_receiver_receive(s.receiver, req[3].data, req[3].size, &it),
               WSYNC_ERR_MISMATCH, "expected chunk 2");
    uint64_t done;
    OK(wsync_receiver_completed_version(s.receiver, &done));
    assert_int_equal(done, 0);
    EXPECT_ERR(wsync_sender_flush(s.sender, 2000), WSYNC_ERR_PEER, "");
    for (int i = 0; i < NT; ++i) free(bases[i]);
    for (size_t c = 0; c < s.chunks; ++c) wsync_blob_free(&req[c]);
    sync_close(&s);
    model_free(&m);
}

static void delta_sender_refuses_parts_with_a_named_error(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    sync_t s;
    sync_open(&s, &m, "{\"bucket_bytes\": 16384, \"delta\": \"auto\", \"delta_decide\": \"size\"}");
    wsync_chunk_t ch = tu_chunk(&m.t[EMBED], 1, 0);
    wsync_part_t first = {0, 16384};
    wsync_blob_t req;
    EXPECT_ERR(wsync_sender_send_parts(s.sender, &ch, &first, &req), WSYNC_ERR_UNSUPPORTED,
               "tensor 'model.embed.weight' is a part of a split tensor, and delta sync does not "
               "take split tensors");
    sync_close(&s);
    model_free(&m);
}

static void each_part_carries_its_own_checksum(void **state) {
    (void)state;
    model_t m;
    model_init(&m);
    sync_t s;
    sync_open(&s, &m, "{\"bucket_bytes\": 16384, \"checksum\": true}");
    for (int i = 0; i < NT; ++i) tu_fill(m.data[i], m.bytes[i], 1, (uint64_t)i);
    wsync_blob_t req;
    OK(send_planned(&s, &m, 0, &req));
    wsync_blob_free(&req);
    OK(send_planned(&s, &m, 1, &req));
    char *json;
    OK(wsync_blob_describe(req.data, req.size, &json));
    assert_non_null(strstr(json, "\"parts\""));
    /* The part's checksum (a tree hash) is of its 16384 bytes, not of the whole tensor. */
    char want[32];
    snprintf(want, sizeof want, "%llu", (unsigned long long)tu_tree_hash(m.data[EMBED], 16384));
    assert_non_null(strstr(json, want));
    wsync_string_free(json);
    wsync_blob_free(&req);
    sync_close(&s);
    model_free(&m);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(planner_splits_a_tensor_over_chunk_bytes_into_page_parts),
    cmocka_unit_test(split_tensor_arrives_bit_exact_at_page_plus_64_over_several_versions),
    cmocka_unit_test(a_range_across_parts_is_assembled_from_both_chunks),
    cmocka_unit_test(recv_next_refuses_a_part_by_name),
    cmocka_unit_test(sender_refuses_parts_out_of_order_and_a_commit_before_the_last_part),
    cmocka_unit_test(receiver_missing_a_part_never_completes_the_version),
    cmocka_unit_test(delta_sender_refuses_parts_with_a_named_error),
    cmocka_unit_test(each_part_carries_its_own_checksum),
};
TU_MAIN(tests)
