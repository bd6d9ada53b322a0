/* Bad input from the caller: every defect gets its own status and a message naming the cause
 * (the key, the tensor, the index), and none of it crashes the process. */
#include "testutil.h"

/* "{"KEY": [[[...0...]]]}" with `depth` brackets; KEY NULL puts the array at the top. */
static char *nested_options(const char *key, size_t depth) {
    size_t cap = 2 * depth + 64;
    char *s = (char *)malloc(cap);
    assert_non_null(s);
    size_t n = 0;
    if (key) n += (size_t)snprintf(s, cap, "{\"%s\": ", key);
    memset(s + n, '[', depth);
    n += depth;
    s[n++] = '0';
    memset(s + n, ']', depth);
    n += depth;
    if (key) s[n++] = '}';
    s[n] = '\0';
    return s;
}

/* --- 1. options JSON ------------------------------------------------------------------------ */

static void options_nested_60000_deep_under_a_known_key_are_invalid_argument_not_a_crash(
    void **state) {
    (void)state;
    char *text = nested_options("receivers", 60000);
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("shm", text, &s), WSYNC_ERR_INVALID_ARGUMENT,
               "shm: option 'receivers' nests deeper than 16 levels");
    assert_null(s);
    free(text);
}

static void options_nested_60000_deep_under_an_unknown_key_are_invalid_argument_not_a_crash(
    void **state) {
    (void)state;
    char *text = nested_options("no_such_option", 60000);
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("shm", text, &s), WSYNC_ERR_INVALID_ARGUMENT,
               "shm: option 'no_such_option' nests deeper than 16 levels");
    assert_null(s);
    free(text);
}

static void options_nested_60000_deep_at_the_top_are_invalid_argument_not_a_crash(void **state) {
    (void)state;
    char *text = nested_options(NULL, 60000);
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("shm", text, &s), WSYNC_ERR_INVALID_ARGUMENT,
               "shm: options nest deeper than 16 levels");
    assert_null(s);
    free(text);
}

static void planner_options_nested_60000_deep_are_invalid_argument_not_a_crash(void **state) {
    (void)state;
    char *text = nested_options("chunk_bytes", 60000);
    int64_t shape = 4;
    wsync_tensor_t t = tu_tensor("w", NULL, &shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_plan_t *p = (wsync_plan_t *)1;
    EXPECT_ERR(wsync_plan_create(&t, 1, text, &p), WSYNC_ERR_INVALID_ARGUMENT,
               "planner: option 'chunk_bytes' nests deeper than 16 levels");
    assert_null(p);
    free(text);
}

static void option_values_and_keys_quoted_in_messages_are_truncated(void **state) {
    (void)state;
    enum { kBig = 100000 };
    char *text = (char *)malloc(kBig + 64);
    assert_non_null(text);
    wsync_strategy_t *s;
    /* a wrong-typed value of 100000 bytes */
    int n = snprintf(text, 64, "{\"receivers\": \"");
    memset(text + n, 'v', kBig);
    strcpy(text + n + kBig, "\"}");
    EXPECT_ERR(wsync_strategy_create("shm", text, &s), WSYNC_ERR_INVALID_ARGUMENT,
               "option 'receivers' must be a non-negative integer, got \"vvv");
    assert_true(strlen(wsync_last_error()) < 512);
    assert_non_null(strstr(wsync_last_error(), "..."));
    /* a wrong-typed array of 50000 elements */
    n = snprintf(text, 64, "{\"receivers\": [");
    for (int i = 0; i < kBig / 2 - 1; ++i) {
        text[n++] = '1';
        text[n++] = ',';
    }
    strcpy(text + n, "1]}");
    EXPECT_ERR(wsync_strategy_create("shm", text, &s), WSYNC_ERR_INVALID_ARGUMENT,
               "option 'receivers' must be a non-negative integer, got [1,1,");
    assert_true(strlen(wsync_last_error()) < 512);
    /* an unknown key of 100000 bytes */
    n = snprintf(text, 64, "{\"");
    memset(text + n, 'k', kBig);
    strcpy(text + n + kBig, "\": 1}");
    EXPECT_ERR(wsync_strategy_create("shm", text, &s), WSYNC_ERR_INVALID_ARGUMENT,
               "shm: unknown option 'kkk");
    assert_true(strlen(wsync_last_error()) < 512);
    assert_non_null(strstr(wsync_last_error(), "(known: "));
    free(text);
}

/* Strategy + init info + sender of the shm kind, the trainer side. */
typedef struct {
    wsync_strategy_t *strategy;
    wsync_blob_t init;
    wsync_sender_t *sender;
} trainer_t;

/* A key given twice (Rust user trial: {"receivers": 1, "receivers": 3} made an init info for 3
 * receivers, the last value silently winning) is refused naming it, at any depth of the text
 * (the planner's options go through the same parser). Distinct keys pass. */
static void an_option_key_given_twice_is_invalid_argument_naming_it(void **state) {
    (void)state;
    wsync_strategy_t *s = NULL;
    EXPECT_ERR(wsync_strategy_create("shm", "{\"receivers\": 1, \"receivers\": 3}", &s),
               WSYNC_ERR_INVALID_ARGUMENT, "key 'receivers' is given twice");
    assert_null(s);
    /* Inside a nested object too (refused while parsing, before the keys are looked up). */
    EXPECT_ERR(wsync_strategy_create("shm", "{\"receivers\": 1, \"x\": {\"a\": 1, \"a\": 2}}", &s),
               WSYNC_ERR_INVALID_ARGUMENT, "key 'a' is given twice");
    OK(wsync_strategy_create("shm", "{\"receivers\": 1, \"buckets\": 2}", &s));
    wsync_strategy_destroy(s);
}

static void trainer_open(trainer_t *tr) {
    OK(wsync_strategy_create("shm", "{\"bucket_bytes\": 65536}", &tr->strategy));
    OK(wsync_strategy_create_init_info(tr->strategy, &tr->init));
    OK(wsync_sender_create(tr->strategy, tr->init.data, tr->init.size, &tr->sender));
}

static void trainer_close(trainer_t *tr) {
    wsync_sender_destroy(tr->sender);
    wsync_strategy_destroy(tr->strategy);
    wsync_blob_free(&tr->init);
}

/* --- 2. tensor names must be UTF-8 ---------------------------------------------------------- */

static const struct {
    const char *name;
    const char *shown; /* as the message renders it */
} kBadUtf8[] = {
    {"w\xc0\xaf", "w\\xc0\\xaf"},                 /* overlong '/' in two bytes */
    {"w\xe0\x80\xaf", "w\\xe0\\x80\\xaf"},        /* overlong '/' in three bytes */
    {"w\xf0\x80\x80\xaf", "w\\xf0\\x80\\x80\\xaf"}, /* overlong '/' in four bytes */
    {"w\xed\xa0\x80", "w\\xed\\xa0\\x80"},        /* U+D800, a UTF-16 surrogate */
    {"w\xed\xbf\xbf", "w\\xed\\xbf\\xbf"},        /* U+DFFF */
    {"w\xf4\x90\x80\x80", "w\\xf4\\x90\\x80\\x80"}, /* U+110000, past U+10FFFF */
    {"w\xf8\x88\x80\x80\x80", "w\\xf8\\x88\\x80\\x80\\x80"}, /* old five-byte form */
    {"w\xc3", "w\\xc3"},                          /* truncated at the end */
    {"w\xe2\x82.bias", "w\\xe2\\x82.bias"},       /* truncated before ASCII */
    {"w\x80x", "w\\x80x"},                        /* stray continuation byte */
    {"w\xff", "w\\xff"},                          /* never valid */
};

static const char *const kGoodUtf8[] = {
    "caf\xc3\xa9.weight",          /* U+00E9 */
    "\xe5\xb1\x82.0.weight",       /* U+5C42 */
    "emoji.\xf0\x9f\x98\x80",      /* U+1F600 */
    "max.\xf4\x8f\xbf\xbf",        /* U+10FFFF */
    "edge.\xef\xbf\xbf.\xee\x80\x80", /* U+FFFF, U+E000 */
};

static void tensor_names_that_are_not_utf8_are_invalid_argument_naming_the_tensor(void **state) {
    (void)state;
    int64_t shape = 4;
    wsync_plan_t *p;
    for (size_t i = 0; i < sizeof kGoodUtf8 / sizeof *kGoodUtf8; ++i) {
        wsync_tensor_t t = tu_tensor(kGoodUtf8[i], NULL, &shape, 1, WSYNC_DTYPE_FLOAT, 32);
        OK(wsync_plan_create(&t, 1, NULL, &p));
        wsync_plan_destroy(p);
    }
    for (size_t i = 0; i < sizeof kBadUtf8 / sizeof *kBadUtf8; ++i) {
        wsync_tensor_t t[2] = {tu_tensor("ok", NULL, &shape, 1, WSYNC_DTYPE_FLOAT, 32),
                               tu_tensor(kBadUtf8[i].name, NULL, &shape, 1, WSYNC_DTYPE_FLOAT, 32)};
        char want[128];
        snprintf(want, sizeof want, "tensor 1 ('%s'): name is not valid UTF-8", kBadUtf8[i].shown);
        p = (wsync_plan_t *)1;
        EXPECT_ERR(wsync_plan_create(t, 2, NULL, &p), WSYNC_ERR_INVALID_ARGUMENT, want);
        assert_null(p);
    }
}

static void sender_refuses_a_non_utf8_name_and_publishes_nothing(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr);
    float x[4] = {1, 2, 3, 4};
    int64_t shape = 4;
    wsync_tensor_t t[2] = {tu_tensor("ok", x, &shape, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("bad\xed\xa0\x80", x, &shape, 1, WSYNC_DTYPE_FLOAT, 32)};
    wsync_chunk_t c = tu_chunk(t, 2, WSYNC_CHUNK_LAST);
    wsync_blob_t req;
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "tensor 1 ('bad\\xed\\xa0\\x80'): name is not valid UTF-8");
    assert_null(req.data);
    uint64_t version;
    OK(wsync_sender_version(tr.sender, &version));
    assert_int_equal(version, 1);
    trainer_close(&tr);
}

/* --- 3. device types ------------------------------------------------------------------------ */

static void unknown_device_type_is_invalid_argument_naming_the_tensor_and_the_code(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr);
    float x[4] = {1, 2, 3, 4};
    int64_t shape = 4;
    const int32_t unknown[] = {0, 4, 99, -1, INT32_MAX};
    wsync_blob_t req;
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; ++i) {
        wsync_tensor_t t[2] = {tu_tensor("a", x, &shape, 1, WSYNC_DTYPE_FLOAT, 32),
                               tu_tensor("b", x, &shape, 1, WSYNC_DTYPE_FLOAT, 32)};
        t[1].device.type = unknown[i];
        wsync_chunk_t c = tu_chunk(t, 2, 0);
        char want[128];
        snprintf(want, sizeof want, "tensor 1 ('b'): device type %d is not a WSYNC_DEVICE_* code",
                 (int)unknown[i]);
        EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT, want);
        assert_null(req.data);
    }
    trainer_close(&tr);
}

static void known_device_the_strategy_cannot_read_stays_unsupported(void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr);
    float x[4] = {1, 2, 3, 4};
    int64_t shape = 4;
    wsync_tensor_t t = tu_tensor("g", x, &shape, 1, WSYNC_DTYPE_FLOAT, 32);
    t.device.type = WSYNC_DEVICE_CUDA;
    wsync_chunk_t c = tu_chunk(&t, 1, 0);
    wsync_blob_t req;
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_UNSUPPORTED,
               "shm: tensor 'g' is on cuda:0");
    t.device.type = WSYNC_DEVICE_CUDA_HOST; /* pinned host memory moves */
    c = tu_chunk(&t, 1, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(tr.sender, &c, &req));
    wsync_blob_free(&req);
    trainer_close(&tr);
}

/* --- 5, 6. tensors per chunk ---------------------------------------------------------------- */

static void chunk_count_of_size_max_is_invalid_argument_before_anything_is_allocated(
    void **state) {
    (void)state;
    trainer_t tr;
    trainer_open(&tr);
    float x[4] = {1, 2, 3, 4};
    int64_t shape = 4;
    wsync_tensor_t t = tu_tensor("a", x, &shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(&t, SIZE_MAX, 0);
    wsync_blob_t req;
    char want[128];
    snprintf(want, sizeof want, "chunk count %zu exceeds the maximum of %d tensors per chunk",
             (size_t)SIZE_MAX, WSYNC_MAX_CHUNK_TENSORS);
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT, want);
    assert_null(req.data);
    trainer_close(&tr);
}

static void chunk_of_one_tensor_over_the_limit_is_refused_by_the_sender(void **state) {
    (void)state;
    assert_int_equal(WSYNC_MAX_CHUNK_TENSORS, 1 << 22);
    trainer_t tr;
    trainer_open(&tr);
    /* A real array, so the old code reading it is no fault; only descriptor 0 is filled: the
     * count is refused before any descriptor is read. */
    size_t n = (size_t)WSYNC_MAX_CHUNK_TENSORS + 1;
    wsync_tensor_t *t = (wsync_tensor_t *)calloc(n, sizeof *t);
    assert_non_null(t);
    float x[4] = {1, 2, 3, 4};
    int64_t shape = 4;
    t[0] = tu_tensor("a", x, &shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_chunk_t c = tu_chunk(t, n, 0);
    wsync_blob_t req;
    EXPECT_ERR(wsync_sender_send_chunk(tr.sender, &c, &req), WSYNC_ERR_INVALID_ARGUMENT,
               "chunk count 4194305 exceeds the maximum of 4194304 tensors per chunk");
    assert_null(req.data);
    free(t);
    trainer_close(&tr);
}

/* 2^22 + 1 one-element tensors in one module: a plan with any n is fine, but no chunk may hold
 * more tensors than a receiver accepts, whether the tensors form one group or none. */
static void planner_never_puts_more_than_the_chunk_tensor_limit_in_one_chunk(void **state) {
    (void)state;
    size_t n = (size_t)WSYNC_MAX_CHUNK_TENSORS + 1;
    wsync_tensor_t *t = (wsync_tensor_t *)calloc(n, sizeof *t);
    char *names = (char *)malloc(n * 12);
    assert_non_null(t);
    assert_non_null(names);
    static const int64_t one = 1;
    for (size_t i = 0; i < n; ++i) {
        snprintf(names + 12 * i, 12, "m.%07zu", i);
        t[i] = tu_tensor(names + 12 * i, NULL, &one, 1, WSYNC_DTYPE_FLOAT, 32);
    }
    const char *options[] = {"{\"chunk_bytes\": 4611686018427387904, \"group_depth\": 1}",
                             "{\"chunk_bytes\": 4611686018427387904, \"group_depth\": 0}"};
    for (int k = 0; k < 2; ++k) {
        wsync_plan_t *p;
        OK(wsync_plan_create(t, n, options[k], &p));
        size_t chunks, count;
        const size_t *idx;
        uint64_t bytes;
        OK(wsync_plan_chunk_count(p, &chunks));
        assert_int_equal(chunks, 2);
        OK(wsync_plan_chunk(p, 0, &idx, &count, &bytes));
        assert_int_equal(count, WSYNC_MAX_CHUNK_TENSORS);
        assert_int_equal(bytes, 4 * (uint64_t)WSYNC_MAX_CHUNK_TENSORS);
        OK(wsync_plan_chunk(p, 1, &idx, &count, &bytes));
        assert_int_equal(count, 1);
        assert_int_equal(idx[0], WSYNC_MAX_CHUNK_TENSORS);
        wsync_plan_destroy(p);
    }
    free(names);
    free(t);
}

static void plan_of_size_max_tensors_is_invalid_argument_before_anything_is_allocated(
    void **state) {
    (void)state;
    int64_t shape = 4;
    wsync_tensor_t t = tu_tensor("w", NULL, &shape, 1, WSYNC_DTYPE_FLOAT, 32);
    wsync_plan_t *p = (wsync_plan_t *)1;
    EXPECT_ERR(wsync_plan_create(&t, SIZE_MAX, NULL, &p), WSYNC_ERR_INVALID_ARGUMENT,
               "18446744073709551615 tensor descriptors are more than memory can hold");
    assert_null(p);
}

/* --- 7. planner byte sums ------------------------------------------------------------------- */

static void planner_byte_sum_overflow_is_invalid_argument_naming_the_tensor(void **state) {
    (void)state;
    /* Four float32 tensors of 2^60 elements: 2^62 bytes each, the most one tensor may have;
     * together 2^64 bytes, which wrapped to a chunk of 0 bytes. */
    static const int64_t quarter = (int64_t)1 << 60;
    wsync_tensor_t t[4] = {tu_tensor("m.a", NULL, &quarter, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("m.b", NULL, &quarter, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("m.c", NULL, &quarter, 1, WSYNC_DTYPE_FLOAT, 32),
                           tu_tensor("m.d", NULL, &quarter, 1, WSYNC_DTYPE_FLOAT, 32)};
    wsync_plan_t *p = (wsync_plan_t *)1;
    EXPECT_ERR(wsync_plan_create(t, 4, "{\"chunk_bytes\": 4611686018427387904, \"group_depth\": 1}",
                                 &p),
               WSYNC_ERR_INVALID_ARGUMENT, "planner: tensor 3 ('m.d'): size of");
    assert_non_null(strstr(wsync_last_error(), "overflows 64 bits"));
    assert_null(p);
    /* Without the group each tensor gets its own chunk, and each chunk's sum is exact. */
    OK(wsync_plan_create(t, 4, "{\"chunk_bytes\": 4611686018427387904, \"group_depth\": 0}", &p));
    size_t chunks;
    OK(wsync_plan_chunk_count(p, &chunks));
    assert_int_equal(chunks, 4);
    for (size_t i = 0; i < 4; ++i) {
        const size_t *idx;
        size_t count;
        uint64_t bytes;
        OK(wsync_plan_chunk(p, i, &idx, &count, &bytes));
        assert_int_equal(count, 1);
        assert_int_equal(bytes, (uint64_t)1 << 62);
    }
    wsync_plan_destroy(p);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(options_nested_60000_deep_under_a_known_key_are_invalid_argument_not_a_crash),
    cmocka_unit_test(options_nested_60000_deep_under_an_unknown_key_are_invalid_argument_not_a_crash),
    cmocka_unit_test(options_nested_60000_deep_at_the_top_are_invalid_argument_not_a_crash),
    cmocka_unit_test(planner_options_nested_60000_deep_are_invalid_argument_not_a_crash),
    cmocka_unit_test(option_values_and_keys_quoted_in_messages_are_truncated),
    cmocka_unit_test(an_option_key_given_twice_is_invalid_argument_naming_it),
    cmocka_unit_test(tensor_names_that_are_not_utf8_are_invalid_argument_naming_the_tensor),
    cmocka_unit_test(sender_refuses_a_non_utf8_name_and_publishes_nothing),
    cmocka_unit_test(unknown_device_type_is_invalid_argument_naming_the_tensor_and_the_code),
    cmocka_unit_test(known_device_the_strategy_cannot_read_stays_unsupported),
    cmocka_unit_test(chunk_count_of_size_max_is_invalid_argument_before_anything_is_allocated),
    cmocka_unit_test(chunk_of_one_tensor_over_the_limit_is_refused_by_the_sender),
    cmocka_unit_test(planner_never_puts_more_than_the_chunk_tensor_limit_in_one_chunk),
    cmocka_unit_test(plan_of_size_max_tensors_is_invalid_argument_before_anything_is_allocated),
    cmocka_unit_test(planner_byte_sum_overflow_is_invalid_argument_naming_the_tensor),
};

TU_MAIN(tests)
