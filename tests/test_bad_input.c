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

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(options_nested_60000_deep_under_a_known_key_are_invalid_argument_not_a_crash),
    cmocka_unit_test(options_nested_60000_deep_under_an_unknown_key_are_invalid_argument_not_a_crash),
    cmocka_unit_test(options_nested_60000_deep_at_the_top_are_invalid_argument_not_a_crash),
    cmocka_unit_test(planner_options_nested_60000_deep_are_invalid_argument_not_a_crash),
    cmocka_unit_test(option_values_and_keys_quoted_in_messages_are_truncated),
    cmocka_unit_test(tensor_names_that_are_not_utf8_are_invalid_argument_naming_the_tensor),
    cmocka_unit_test(sender_refuses_a_non_utf8_name_and_publishes_nothing),
    cmocka_unit_test(unknown_device_type_is_invalid_argument_naming_the_tensor_and_the_code),
    cmocka_unit_test(known_device_the_strategy_cannot_read_stays_unsupported),
};

TU_MAIN(tests)
