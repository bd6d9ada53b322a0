/* The ABI's general contract: versions, statuses, messages, NULL handling, options. */
#include "testutil.h"

static void version_number_follows_the_one_formula(void **state) {
    (void)state;
    assert_int_equal(wsync_version_number(), WSYNC_VERSION_NUMBER);
    assert_int_equal(WSYNC_VERSION_NUMBER, WSYNC_VERSION_MAJOR * 10000 + WSYNC_VERSION_MINOR * 100 +
                                               WSYNC_VERSION_PATCH);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", WSYNC_VERSION_MAJOR, WSYNC_VERSION_MINOR,
             WSYNC_VERSION_PATCH);
    assert_string_equal(wsync_version_string(), want);
}

static void status_values_are_pinned_and_named(void **state) {
    (void)state;
    /* These numbers are the ABI: they never change. */
    assert_int_equal(WSYNC_OK, 0);
    assert_int_equal(WSYNC_ERR_INVALID_ARGUMENT, 1);
    assert_int_equal(WSYNC_ERR_UNSUPPORTED, 2);
    assert_int_equal(WSYNC_ERR_UNAVAILABLE, 3);
    assert_int_equal(WSYNC_ERR_MALFORMED, 4);
    assert_int_equal(WSYNC_ERR_MISMATCH, 5);
    assert_int_equal(WSYNC_ERR_TIMEOUT, 6);
    assert_int_equal(WSYNC_ERR_PEER, 7);
    assert_int_equal(WSYNC_ERR_NO_MEMORY, 8);
    assert_int_equal(WSYNC_ERR_WRONG_STATE, 9);
    assert_int_equal(WSYNC_ERR_SYSTEM, 10);
    assert_int_equal(WSYNC_ERR_INTERNAL, 11);
    assert_int_equal(WSYNC_ERR_INTEGRITY, 12);
    assert_int_equal(sizeof(wsync_status_t), 4);
    assert_string_equal(wsync_status_string(WSYNC_OK), "WSYNC_OK");
    assert_string_equal(wsync_status_string(WSYNC_ERR_TIMEOUT), "WSYNC_ERR_TIMEOUT");
    assert_string_equal(wsync_status_string(WSYNC_ERR_INTEGRITY), "WSYNC_ERR_INTEGRITY");
    assert_string_equal(wsync_status_string((wsync_status_t)999), "WSYNC_ERR_UNKNOWN");
}

static void last_error_is_never_null_and_kept_on_success(void **state) {
    (void)state;
    assert_non_null(wsync_last_error());
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("nope", NULL, &s), WSYNC_ERR_UNSUPPORTED,
               "unknown strategy kind 'nope' (known: shm, cuda_ipc, nccl_broadcast");
    assert_null(s);
    OK(wsync_strategy_create("shm", NULL, &s));
    assert_non_null(strstr(wsync_last_error(), "'nope'")); /* success leaves the message alone */
    wsync_strategy_destroy(s);
}

static void *other_thread(void *arg) {
    (void)arg;
    wsync_strategy_t *s;
    wsync_strategy_create("other", NULL, &s);
    return NULL;
}

#include <pthread.h>
static void last_error_is_per_thread(void **state) {
    (void)state;
    wsync_strategy_t *s;
    EXPECT_ERR(wsync_strategy_create("mine", NULL, &s), WSYNC_ERR_UNSUPPORTED, "'mine'");
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, NULL), 0);
    pthread_join(th, NULL);
    assert_non_null(strstr(wsync_last_error(), "'mine'"));
}

static void null_arguments_are_invalid_and_name_the_argument(void **state) {
    (void)state;
    wsync_strategy_t *s;
    wsync_blob_t b;
    char *json;
    EXPECT_ERR(wsync_strategy_create(NULL, NULL, &s), WSYNC_ERR_INVALID_ARGUMENT, "kind is NULL");
    EXPECT_ERR(wsync_strategy_create("shm", NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_ERR(wsync_strategy_create_init_info(NULL, &b), WSYNC_ERR_INVALID_ARGUMENT, "strategy is NULL");
    EXPECT_ERR(wsync_sender_send_chunk(NULL, NULL, &b), WSYNC_ERR_INVALID_ARGUMENT, "sender is NULL");
    EXPECT_ERR(wsync_sender_flush(NULL, 0), WSYNC_ERR_INVALID_ARGUMENT, "sender is NULL");
    EXPECT_ERR(wsync_receiver_receive(NULL, NULL, 0, NULL), WSYNC_ERR_INVALID_ARGUMENT, "NULL");
    EXPECT_ERR(wsync_blob_describe(NULL, 0, &json), WSYNC_ERR_INVALID_ARGUMENT, "blob is NULL or empty");
    EXPECT_ERR(wsync_plan_create(NULL, 1, NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_ERR(wsync_request_merge(NULL, 1, &b), WSYNC_ERR_INVALID_ARGUMENT, "parts is NULL");
    EXPECT_ERR(wsync_recv_next(NULL, NULL, NULL), WSYNC_ERR_INVALID_ARGUMENT, "it is NULL");
    OK(wsync_strategy_create("shm", NULL, &s));
    EXPECT_ERR(wsync_sender_create(s, NULL, 0, NULL), WSYNC_ERR_INVALID_ARGUMENT, "out is NULL");
    wsync_strategy_destroy(s);
}

static void destroy_and_free_accept_null(void **state) {
    (void)state;
    wsync_strategy_destroy(NULL);
    wsync_sender_destroy(NULL);
    wsync_receiver_destroy(NULL);
    wsync_plan_destroy(NULL);
    wsync_blob_free(NULL);
    wsync_string_free(NULL);
    wsync_blob_t empty = {NULL, 0};
    wsync_blob_free(&empty);
    OK(wsync_recv_end(NULL));
}

static void options_are_strict_and_errors_name_the_key(void **state) {
    (void)state;
    wsync_strategy_t *s = NULL;
    EXPECT_ERR(wsync_strategy_create("shm", "{\"bucket_byts\": 4096}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "unknown option 'bucket_byts' (known: receivers, buckets, bucket_bytes");
    EXPECT_ERR(wsync_strategy_create("shm", "{\"buckets\": 0}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "'buckets' = 0 is out of range [1, 64]");
    EXPECT_ERR(wsync_strategy_create("shm", "{\"receivers\": 65}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "'receivers' = 65");
    EXPECT_ERR(wsync_strategy_create("shm", "{\"buckets\": \"two\"}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "'buckets' must be a non-negative integer, got \"two\"");
    EXPECT_ERR(wsync_strategy_create("shm", "{\"buckets\": -1}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "'buckets' must be a non-negative integer");
    EXPECT_ERR(wsync_strategy_create("shm", "{\"checksum\": 1}", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "'checksum' must be true or false");
    EXPECT_ERR(wsync_strategy_create("shm", "[1, 2]", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "must be a JSON object");
    EXPECT_ERR(wsync_strategy_create("shm", "{\"buckets\": 2", &s), WSYNC_ERR_INVALID_ARGUMENT,
               "not valid JSON");
    assert_null(s);
    OK(wsync_strategy_create("shm", "", &s));
    wsync_strategy_destroy(s);
    OK(wsync_strategy_create("shm", "{\"receivers\": 4, \"checksum\": false}", &s));
    const char *kind;
    OK(wsync_strategy_kind(s, &kind));
    assert_string_equal(kind, "shm");
    wsync_strategy_destroy(s);
}

/* Whether the JSON object around the first `at` (up to its closing brace) contains `want`. */
static bool object_has(const char *json, const char *at, const char *want) {
    const char *p = strstr(json, at);
    if (!p) return false;
    size_t n = strlen(at);
    if (n && at[n - 1] == '{')
        p += n - 1; /* `at` opens the object: "key": { */
    else /* `at` is inside it, maybe after a nested object ("capabilities") */
        for (int depth = 0; p > json && (*p != '{' || depth-- > 0); --p) depth += *p == '}';
    const char *end = p;
    for (int depth = 0; *end && (depth += *end == '{' ? 1 : *end == '}' ? -1 : 0) > 0;) ++end;
    const char *w = strstr(p, want);
    return end && w && w < end;
}

static void strategies_describe_their_options_and_availability(void **state) {
    (void)state;
    char *json;
    OK(wsync_strategy_describe_options("shm", &json));
    assert_non_null(strstr(json, "\"bucket_bytes\""));
    assert_non_null(strstr(json, "\"default\": 268435456"));
    assert_non_null(strstr(json, "\"doc\""));
    wsync_string_free(json);
    EXPECT_ERR(wsync_strategy_describe_options("carrier_pigeon", &json), WSYNC_ERR_UNSUPPORTED, "'carrier_pigeon'");
    OK(wsync_strategy_kinds(&json));
    assert_non_null(strstr(json, "{\"available\":true,\"capabilities\":{\"collective\":false,"
                                 "\"delta\":\"host\",\"drop_receiver\":true,\"gpu_per_receiver\":false,"
                                 "\"reattach\":true,\"senders\":\"one\",\"tensor_memory\":[\"host\"]},"
                                 "\"kind\":\"shm\",\"reason\":\"\",\"runtime\":\"\","
                                 "\"stability\":\"stable\"}"));
    if (strstr(json, "\"kind\":\"ucx\"")) /* built with the ucx kind: experimental in 0.5 */
        assert_true(object_has(json, "\"kind\":\"ucx\"", "\"stability\":\"experimental\""));
    wsync_string_free(json);
}

static void experimental_options_are_marked_and_the_rest_are_stable(void **state) {
    (void)state;
    char *json;
    OK(wsync_strategy_describe_options("shm", &json));
    assert_true(object_has(json, "\"delta_max_percent\": {", "\"stability\": \"experimental\""));
    assert_true(object_has(json, "\"delta\": {", "\"stability\": \"experimental\""));
    assert_true(object_has(json, "\"receivers\": {", "\"stability\": \"stable\""));
    assert_true(object_has(json, "\"timeout_ms\": {", "\"stability\": \"stable\""));
    assert_false(object_has(json, "\"receivers\": {", "experimental"));
    wsync_string_free(json);
}

/* Runs in its own process (CTest runs each test alone), so the driver path is read afresh. */
static void gpu_kinds_without_a_driver_are_unavailable_and_name_the_library(void **state) {
    (void)state;
    setenv("WSYNC_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
    wsync_strategy_t *s = (wsync_strategy_t *)1;
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", NULL, &s), WSYNC_ERR_UNAVAILABLE,
               "cannot load /nonexistent/libcuda.so.1");
    assert_null(s);
    EXPECT_ERR(wsync_strategy_create("nccl_broadcast", NULL, &s), WSYNC_ERR_UNAVAILABLE,
               "/nonexistent/libcuda.so.1");
    char *json;
    OK(wsync_strategy_kinds(&json));
    const char *ipc = strstr(json, "\"kind\":\"cuda_ipc\"");
    assert_non_null(ipc);
    assert_non_null(strstr(json, "{\"available\":false,\"capabilities\":{\"collective\":false,"
                                 "\"delta\":\"device\",\"drop_receiver\":true,\"gpu_per_receiver\":false,"
                                 "\"reattach\":true,\"senders\":\"many\",\"tensor_memory\":[\"cuda\"]},"
                                 "\"kind\":\"cuda_ipc\""));
    wsync_string_free(json);
    /* Options are still checked first, and name the key. */
    EXPECT_ERR(wsync_strategy_create("cuda_ipc", "{\"dtype\": \"int4\"}", &s),
               WSYNC_ERR_INVALID_ARGUMENT, "'dtype'");
}

static void abi_layout_reports_the_compiled_structs(void **state) {
    (void)state;
    char *json;
    OK(wsync_abi_layout(&json));
    char want[128];
    snprintf(want, sizeof want, "\"wsync_tensor_t\":{\"align\":%zu,", _Alignof(wsync_tensor_t));
    assert_non_null(strstr(json, want));
    snprintf(want, sizeof want, "\"size\":%zu}", sizeof(wsync_tensor_t));
    assert_non_null(strstr(json, want));
    snprintf(want, sizeof want, "\"device\":%zu", offsetof(wsync_tensor_t, device));
    assert_non_null(strstr(json, want));
    snprintf(want, sizeof want, "\"count\":%zu", offsetof(wsync_recv_info_t, count));
    assert_non_null(strstr(json, want));
    /* Every struct of the header is listed, wsync_part_t (0.5) included (C++ user trial). */
    snprintf(want, sizeof want, "\"wsync_part_t\":{\"align\":%zu,", _Alignof(wsync_part_t));
    assert_non_null(strstr(json, want));
    wsync_string_free(json);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(version_number_follows_the_one_formula),
    cmocka_unit_test(status_values_are_pinned_and_named),
    cmocka_unit_test(last_error_is_never_null_and_kept_on_success),
    cmocka_unit_test(last_error_is_per_thread),
    cmocka_unit_test(null_arguments_are_invalid_and_name_the_argument),
    cmocka_unit_test(destroy_and_free_accept_null),
    cmocka_unit_test(options_are_strict_and_errors_name_the_key),
    cmocka_unit_test(strategies_describe_their_options_and_availability),
    cmocka_unit_test(experimental_options_are_marked_and_the_rest_are_stable),
    cmocka_unit_test(abi_layout_reports_the_compiled_structs),
    cmocka_unit_test(gpu_kinds_without_a_driver_are_unavailable_and_name_the_library),
};

TU_MAIN(tests)
