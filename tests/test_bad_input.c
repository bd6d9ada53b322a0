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

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(options_nested_60000_deep_under_a_known_key_are_invalid_argument_not_a_crash),
    cmocka_unit_test(options_nested_60000_deep_under_an_unknown_key_are_invalid_argument_not_a_crash),
    cmocka_unit_test(options_nested_60000_deep_at_the_top_are_invalid_argument_not_a_crash),
    cmocka_unit_test(planner_options_nested_60000_deep_are_invalid_argument_not_a_crash),
    cmocka_unit_test(option_values_and_keys_quoted_in_messages_are_truncated),
};

TU_MAIN(tests)
