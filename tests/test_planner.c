/* The planner: module groups stay whole, chunks stay under the threshold, plans are
 * deterministic, and oversize tensors still move. */
#include "testutil.h"

typedef struct {
    const char *name;
    int64_t elems; /* float32 */
} spec_t;

static wsync_plan_t *plan_of(const spec_t *specs, size_t n, const char *options) {
    wsync_tensor_t t[64];
    static int64_t shapes[64];
    for (size_t i = 0; i < n; ++i) {
        shapes[i] = specs[i].elems;
        t[i] = tu_tensor(specs[i].name, NULL, &shapes[i], 1, WSYNC_DTYPE_FLOAT, 32);
    }
    wsync_plan_t *p;
    OK(wsync_plan_create(t, n, options, &p));
    return p;
}

/* Chunk i as a string "0,1,2" for easy comparison. */
static const char *chunk_str(const wsync_plan_t *p, size_t i) {
    static char buf[256];
    const size_t *idx;
    size_t n;
    OK(wsync_plan_chunk(p, i, &idx, &n, NULL));
    buf[0] = '\0';
    for (size_t k = 0; k < n; ++k)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), k ? ",%zu" : "%zu", idx[k]);
    return buf;
}

static size_t chunks(const wsync_plan_t *p) {
    size_t n;
    OK(wsync_plan_chunk_count(p, &n));
    return n;
}

/* 1024 floats = 4096 bytes per tensor */
static const spec_t kBlock[] = {
    {"model.layers.0.attn.q.weight", 1024}, {"model.layers.0.attn.k.weight", 1024},
    {"model.layers.0.attn.v.weight", 1024}, {"model.layers.0.mlp.up.weight", 1024},
    {"model.layers.0.mlp.down.weight", 1024}, {"model.layers.1.attn.q.weight", 1024},
    {"model.layers.1.attn.k.weight", 1024}, {"model.layers.1.attn.v.weight", 1024},
};

static void attention_projections_of_one_block_share_a_chunk(void **state) {
    (void)state;
    /* 3 tensors fit (12 KiB); q/k/v of a block must not be split even though 2 would fill. */
    wsync_plan_t *p = plan_of(kBlock, 8, "{\"chunk_bytes\": 12288}");
    assert_int_equal(chunks(p), 3);
    assert_string_equal(chunk_str(p, 0), "0,1,2");
    assert_string_equal(chunk_str(p, 1), "3,4");
    assert_string_equal(chunk_str(p, 2), "5,6,7");
    wsync_plan_destroy(p);
}

static void whole_groups_are_batched_up_to_the_threshold(void **state) {
    (void)state;
    wsync_plan_t *p = plan_of(kBlock, 8, "{\"chunk_bytes\": 20480}");
    assert_int_equal(chunks(p), 2);
    assert_string_equal(chunk_str(p, 0), "0,1,2,3,4");
    assert_string_equal(chunk_str(p, 1), "5,6,7");
    uint64_t bytes;
    const size_t *idx;
    size_t n;
    OK(wsync_plan_chunk(p, 0, &idx, &n, &bytes));
    assert_int_equal(bytes, 5 * 4096);
    wsync_plan_destroy(p);
}

static void a_tensor_larger_than_the_threshold_gets_its_own_chunk(void **state) {
    (void)state;
    const spec_t s[] = {{"a.weight", 10}, {"embed.weight", 100000}, {"b.weight", 10}};
    wsync_plan_t *p = plan_of(s, 3, "{\"chunk_bytes\": 1024, \"group_depth\": 1}");
    assert_int_equal(chunks(p), 3);
    assert_string_equal(chunk_str(p, 1), "1");
    uint64_t bytes;
    const size_t *idx;
    size_t n;
    OK(wsync_plan_chunk(p, 1, &idx, &n, &bytes));
    assert_int_equal(bytes, 400000);
    wsync_plan_destroy(p);
}

static void a_group_larger_than_the_threshold_is_split_between_tensors(void **state) {
    (void)state;
    wsync_plan_t *p = plan_of(kBlock, 3, "{\"chunk_bytes\": 8192}");
    assert_int_equal(chunks(p), 2);
    assert_string_equal(chunk_str(p, 0), "0,1");
    assert_string_equal(chunk_str(p, 1), "2");
    wsync_plan_destroy(p);
}

static void group_depth_zero_batches_tensors_alone(void **state) {
    (void)state;
    wsync_plan_t *p = plan_of(kBlock, 8, "{\"chunk_bytes\": 8192, \"group_depth\": 0}");
    assert_int_equal(chunks(p), 4);
    assert_string_equal(chunk_str(p, 0), "0,1");
    assert_string_equal(chunk_str(p, 3), "6,7");
    wsync_plan_destroy(p);
}

static void sizes_count_the_256_byte_alignment_of_buckets(void **state) {
    (void)state;
    /* 4 tensors of 100 bytes take 4 x 256 bytes in a bucket: only 2 fit in 512. */
    const spec_t s[] = {{"a", 25}, {"b", 25}, {"c", 25}, {"d", 25}};
    wsync_plan_t *p = plan_of(s, 4, "{\"chunk_bytes\": 512}");
    assert_int_equal(chunks(p), 2);
    assert_string_equal(chunk_str(p, 0), "0,1");
    wsync_plan_destroy(p);
}

static void every_tensor_is_planned_once_in_order_and_plans_are_deterministic(void **state) {
    (void)state;
    wsync_plan_t *a = plan_of(kBlock, 8, "{\"chunk_bytes\": 9000}");
    wsync_plan_t *b = plan_of(kBlock, 8, "{\"chunk_bytes\": 9000}");
    assert_int_equal(chunks(a), chunks(b));
    size_t next = 0;
    for (size_t i = 0; i < chunks(a); ++i) {
        char sa[256];
        snprintf(sa, sizeof sa, "%s", chunk_str(a, i));
        assert_string_equal(sa, chunk_str(b, i));
        const size_t *idx;
        size_t n;
        OK(wsync_plan_chunk(a, i, &idx, &n, NULL));
        for (size_t k = 0; k < n; ++k) assert_int_equal(idx[k], next++);
    }
    assert_int_equal(next, 8);
    wsync_plan_destroy(a);
    wsync_plan_destroy(b);
}

static void bad_plan_input_is_named(void **state) {
    (void)state;
    int64_t s = 4, z = 0;
    wsync_tensor_t t[2] = {tu_tensor("x", NULL, &s, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("x", NULL, &s, 1, WSYNC_DTYPE_FLOAT, 32)};
    wsync_plan_t *p = NULL;
    EXPECT_ERR(wsync_plan_create(t, 2, NULL, &p), WSYNC_ERR_INVALID_ARGUMENT, "duplicate name");
    EXPECT_ERR(wsync_plan_create(t, 0, NULL, &p), WSYNC_ERR_INVALID_ARGUMENT, "no tensors");
    EXPECT_ERR(wsync_plan_create(t, 1, "{\"chunk_bytes\": 0}", &p), WSYNC_ERR_INVALID_ARGUMENT,
               "'chunk_bytes' = 0 is out of range");
    EXPECT_ERR(wsync_plan_create(t, 1, "{\"chunk\": 1}", &p), WSYNC_ERR_INVALID_ARGUMENT,
               "planner: unknown option 'chunk'");
    t[1] = tu_tensor("y", NULL, &z, 1, WSYNC_DTYPE_FLOAT, 32);
    EXPECT_ERR(wsync_plan_create(t, 2, NULL, &p), WSYNC_ERR_INVALID_ARGUMENT, "tensor 1 ('y')");
    assert_null(p);
    OK(wsync_plan_create(t, 1, NULL, &p));
    const size_t *idx;
    size_t n;
    EXPECT_ERR(wsync_plan_chunk(p, 1, &idx, &n, NULL), WSYNC_ERR_INVALID_ARGUMENT, "out of range");
    wsync_plan_destroy(p);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(attention_projections_of_one_block_share_a_chunk),
    cmocka_unit_test(whole_groups_are_batched_up_to_the_threshold),
    cmocka_unit_test(a_tensor_larger_than_the_threshold_gets_its_own_chunk),
    cmocka_unit_test(a_group_larger_than_the_threshold_is_split_between_tensors),
    cmocka_unit_test(group_depth_zero_batches_tensors_alone),
    cmocka_unit_test(sizes_count_the_256_byte_alignment_of_buckets),
    cmocka_unit_test(every_tensor_is_planned_once_in_order_and_plans_are_deterministic),
    cmocka_unit_test(bad_plan_input_is_named),
};

TU_MAIN(tests)
