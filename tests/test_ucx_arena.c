/* The ucx sender's arena ("arena_bytes", wsync_sender_arena()): a chunk whose tensors the
 * trainer keeps in the arena, laid out as the sender would pack them, is sent from there with
 * no pack copy (hashed where it lies), and is borrowed until its version's flush returns OK.
 * These tests specify what trainer and engine see: every version bit-exact; engines reading
 * the arena itself (a write before the flush shows, caught by the checksum of what was first
 * sent, or over active messages of what send_chunk hashed, and the flush names the receiver);
 * any other layout packed as usual (a later write does not
 * show); a version already flushed never read again from the arena (a late engine is refused
 * it by name and loads the next one). Trainer and engines are in this process, over loopback
 * tcp, with the data stream ("data_path" "auto") and with UCX active messages ("ucx"). */
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

#define OPTS "\"transports\":\"tcp\",\"net_devices\":\"lo\",\"timeout_ms\":3000"

/* Three tensors of awkward sizes: the second's end is not a multiple of 256, so the third sits
 * after padding, as a packed chunk has it. */
enum { NT = 3 };
static const int64_t elems[NT] = {(1 << 20) / 4, 75, (3 << 20) / 4 + 8};
static const char *const names[NT] = {"embed", "norm", "proj"};
static const char *data_path = "auto";

static size_t round256(size_t n) { return (n + 255) / 256 * 256; }

struct trainer {
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *snd;
    uint8_t *arena;
    uint64_t arena_bytes;
    wsync_tensor_t t[NT];
    int64_t shape[NT][1];
};

/* A trainer for `receivers` engines with an arena of `arena_bytes` (0: none), checksums on. */
static void trainer_start(struct trainer *t, unsigned receivers, uint64_t arena_bytes) {
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    memset(t, 0, sizeof *t);
    char o[512];
    snprintf(o, sizeof o, "{" OPTS ",\"receivers\":%u,\"data_path\":\"%s\",\"arena_bytes\":%llu}", receivers,
             data_path, (unsigned long long)arena_bytes);
    OK(wsync_strategy_create("ucx", o, &t->s));
    OK(wsync_strategy_create_init_info(t->s, &t->init));
    OK(wsync_sender_create(t->s, t->init.data, t->init.size, &t->snd));
    void *base = (void *)1;
    OK(wsync_sender_arena(t->snd, &base, &t->arena_bytes));
    t->arena = base;
}

static void trainer_stop(struct trainer *t) {
    wsync_sender_destroy(t->snd);
    wsync_blob_free(&t->init);
    wsync_strategy_destroy(t->s);
}

/* The model's tensors at `at` + their packed offsets plus `skew` bytes each (0: the packed
 * layout), so tensor i lies at at + offset_i + i * skew. */
static void lay_out(struct trainer *t, uint8_t *at, size_t skew) {
    size_t off = 0;
    for (int i = 0; i < NT; ++i) {
        t->shape[i][0] = elems[i];
        t->t[i] = tu_tensor(names[i], at + off + (size_t)i * skew, t->shape[i], 1, WSYNC_DTYPE_FLOAT, 32);
        off = round256(off + (size_t)elems[i] * 4);
    }
}

static void write_version(struct trainer *t, uint64_t v) {
    for (int i = 0; i < NT; ++i) tu_fill(t->t[i].data, (size_t)elems[i] * 4, v, (uint64_t)i);
}

static void send_version(struct trainer *t, uint64_t v, wsync_blob_t *req) {
    write_version(t, v);
    wsync_chunk_t c = tu_chunk(t->t, NT, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(t->snd, &c, req));
}

static wsync_receiver_t *engine(struct trainer *t, uint32_t index) {
    wsync_strategy_t *s = NULL;
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"data_path\":\"%s\"}", data_path);
    OK(wsync_strategy_create("ucx", o, &s));
    wsync_receiver_t *r = NULL;
    OK(wsync_receiver_create(s, t->init.data, t->init.size, index, &r));
    wsync_strategy_destroy(s);
    return r;
}

/* Engine r receives req: the status of the first call that fails (WSYNC_OK if none), and
 * with WSYNC_OK every tensor of version v bit for bit. */
static wsync_status_t take(wsync_receiver_t *r, const wsync_blob_t *req, uint64_t v) {
    wsync_recv_t *it = NULL;
    wsync_status_t st = wsync_receiver_receive(r, req->data, req->size, &it);
    if (st != WSYNC_OK) return st;
    int seen = 0;
    for (;;) {
        wsync_tensor_t view;
        bool has = false;
        st = wsync_recv_next(it, &view, &has);
        if (st != WSYNC_OK || !has) break;
        int i = 0;
        while (i < NT && strcmp(view.name, names[i]) != 0) ++i;
        assert_true(i < NT);
        assert_true(tu_check(view.data, (size_t)elems[i] * 4, v, (uint64_t)i));
        ++seen;
    }
    const wsync_status_t end = wsync_recv_end(it);
    if (st == WSYNC_OK) st = end;
    if (st == WSYNC_OK) assert_int_equal(seen, NT);
    return st;
}

/* ---- the specification ---------------------------------------------------------------------- */

static void the_arena_is_whole_pages_and_a_sender_without_the_option_has_none(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 1, 5000);
    assert_non_null(t.arena);
    assert_int_equal(t.arena_bytes, 8192);
    assert_int_equal((uintptr_t)t.arena % 4096, 0);
    for (size_t i = 0; i < t.arena_bytes; ++i) assert_int_equal(t.arena[i], 0);  /* zero at first */
    trainer_stop(&t);

    trainer_start(&t, 1, 0);
    assert_null(t.arena);
    assert_int_equal(t.arena_bytes, 0);
    trainer_stop(&t);

    wsync_strategy_t *s = NULL;
    assert_int_equal(wsync_strategy_create("ucx", "{" OPTS ",\"arena_bytes\":1099511627777}", &s),
                     WSYNC_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(wsync_last_error(), "arena_bytes"));
}

/* Four versions from the arena, the trainer rewriting it after each flush: each loads bit-exact
 * and each flush is OK. */
static void versions_laid_out_in_the_arena_load_bit_exact(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 1, 8 << 20);
    lay_out(&t, t.arena + 4096, 0);
    wsync_receiver_t *e = engine(&t, 0);
    for (uint64_t v = 1; v <= 4; ++v) {
        wsync_blob_t req;
        send_version(&t, v, &req);
        assert_int_equal(take(e, &req, v), WSYNC_OK);
        OK(wsync_sender_flush(t.snd, 3000));
        wsync_blob_free(&req);
    }
    wsync_receiver_destroy(e);
    trainer_stop(&t);
}

static void versions_laid_out_in_the_arena_load_bit_exact_as_active_messages(void **state) {
    data_path = "ucx";
    versions_laid_out_in_the_arena_load_bit_exact(state);
    data_path = "auto";
}

/* Sent in place means read in place. Over the data stream a chunk is hashed as it is first sent
 * (its checksums follow its bytes, docs/data-path.md): bytes written before the flush, after
 * engine 0 read them, are what engine 1 reads, and the checksums of what was first sent catch
 * it: engine 1 fails the version with INTEGRITY, engine 0 loaded it bit-exact, and the flush
 * names receiver 1 alone. */
static void the_engines_read_the_arena_itself_and_a_write_before_the_flush_fails_the_version(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 2, 8 << 20);
    lay_out(&t, t.arena, 0);
    wsync_receiver_t *e0 = engine(&t, 0), *e1 = engine(&t, 1);
    wsync_blob_t req;
    send_version(&t, 1, &req);
    assert_int_equal(take(e0, &req, 1), WSYNC_OK);
    write_version(&t, 2);  /* too early: the version is still the engines' to read */
    assert_int_equal(take(e1, &req, 1), WSYNC_ERR_INTEGRITY);
    assert_int_not_equal(wsync_sender_flush(t.snd, 3000), WSYNC_OK);
    assert_non_null(strstr(wsync_last_error(), "receiver 1"));
    assert_null(strstr(wsync_last_error(), "receiver 0"));
    wsync_blob_free(&req);
    wsync_receiver_destroy(e0);
    wsync_receiver_destroy(e1);
    trainer_stop(&t);
}

/* Over UCX active messages a chunk is hashed at send_chunk, where it lies: a write even before
 * any engine read it is caught, the engine fails with INTEGRITY and the flush names it. */
static void over_active_messages_a_write_before_any_read_fails_the_version(void **state) {
    (void)state;
    data_path = "ucx";
    struct trainer t;
    trainer_start(&t, 1, 8 << 20);
    lay_out(&t, t.arena, 0);
    wsync_receiver_t *e = engine(&t, 0);
    wsync_blob_t req;
    send_version(&t, 1, &req);
    write_version(&t, 2);
    assert_int_equal(take(e, &req, 1), WSYNC_ERR_INTEGRITY);
    assert_int_not_equal(wsync_sender_flush(t.snd, 3000), WSYNC_OK);
    assert_non_null(strstr(wsync_last_error(), "receiver 0"));
    wsync_blob_free(&req);
    wsync_receiver_destroy(e);
    trainer_stop(&t);
    data_path = "auto";
}

/* Any other layout is packed at send_chunk: a tensor 64 bytes off its packed place, in the
 * arena or on the heap; a write after send_chunk does not show, the version loads bit-exact. */
static void a_chunk_not_laid_out_as_packed_is_packed_and_a_later_write_does_not_show(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 1, 8 << 20);
    size_t heap_bytes = 0;
    for (int i = 0; i < NT; ++i) heap_bytes = round256(heap_bytes + (size_t)elems[i] * 4);
    uint8_t *heap = aligned_alloc(4096, (heap_bytes + 4096) / 4096 * 4096 + 4096);
    assert_non_null(heap);
    wsync_receiver_t *e = engine(&t, 0);
    uint8_t *where[2] = {t.arena, heap};
    size_t skew[2] = {64, 0};
    for (uint64_t v = 1; v <= 2; ++v) {
        lay_out(&t, where[v - 1], skew[v - 1]);
        wsync_blob_t req;
        send_version(&t, v, &req);
        write_version(&t, v + 10);
        assert_int_equal(take(e, &req, v), WSYNC_OK);
        OK(wsync_sender_flush(t.snd, 3000));
        wsync_blob_free(&req);
    }
    wsync_receiver_destroy(e);
    trainer_stop(&t);
    free(heap);
}

static int says_sums_follow(const wsync_blob_t *req) {
    char *desc = NULL;
    OK(wsync_blob_describe(req->data, req->size, &desc));
    const int follow = strstr(desc, "\"sums_follow\"") != NULL;
    wsync_string_free(desc);
    return follow;
}

/* Checksums that follow the bytes need every engine on a data stream. An engine whose bytes
 * travel over UCX ("data_path" "ucx") that attaches after a chunk was sent so gets its
 * checksums over UCX too (the trainer hashes what no stream sent, from memory); while it is
 * attached the trainer hashes each chunk at send_chunk and the request carries the checksums.
 * Both engines load every version bit-exact and every flush is OK. */
static void an_engine_without_a_data_stream_gets_the_checksums_either_way(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 2, 0);
    size_t bytes = 0;
    for (int i = 0; i < NT; ++i) bytes = round256(bytes + (size_t)elems[i] * 4);
    uint8_t *heap = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    assert_non_null(heap);
    lay_out(&t, heap, 0);
    wsync_receiver_t *streamed = engine(&t, 0);
    wsync_blob_t req;
    send_version(&t, 1, &req);
    assert_true(says_sums_follow(&req));
    data_path = "ucx";
    wsync_receiver_t *plain = engine(&t, 1);
    data_path = "auto";
    assert_int_equal(take(streamed, &req, 1), WSYNC_OK);
    assert_int_equal(take(plain, &req, 1), WSYNC_OK);
    OK(wsync_sender_flush(t.snd, 3000));
    wsync_blob_free(&req);
    for (uint64_t v = 2; v <= 3; ++v) {
        send_version(&t, v, &req);
        assert_false(says_sums_follow(&req));
        assert_int_equal(take(plain, &req, v), WSYNC_OK);
        assert_int_equal(take(streamed, &req, v), WSYNC_OK);
        OK(wsync_sender_flush(t.snd, 3000));
        wsync_blob_free(&req);
    }
    wsync_receiver_destroy(streamed);
    wsync_receiver_destroy(plain);
    trainer_stop(&t);
    free(heap);
}

/* Once its flush returns OK a version's arena bytes are the trainer's again: an engine that
 * attaches afterwards and asks for it is refused by name (ABANDONED: it does not owe it), with
 * no byte of the rewritten arena loaded, and loads the next version bit-exact with the first. */
static void a_flushed_version_is_never_read_from_the_arena_again(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 2, 8 << 20);
    lay_out(&t, t.arena, 0);
    wsync_receiver_t *e0 = engine(&t, 0);
    wsync_blob_t req1, req2;
    send_version(&t, 1, &req1);
    assert_int_equal(take(e0, &req1, 1), WSYNC_OK);
    OK(wsync_sender_flush(t.snd, 3000));
    write_version(&t, 7);  /* the trainer's next step, before version 2 is sent */

    wsync_receiver_t *e1 = engine(&t, 1);
    assert_int_equal(take(e1, &req1, 1), WSYNC_ERR_ABANDONED);
    assert_non_null(strstr(wsync_last_error(), "arena"));

    send_version(&t, 2, &req2);
    assert_int_equal(take(e0, &req2, 2), WSYNC_OK);
    assert_int_equal(take(e1, &req2, 2), WSYNC_OK);
    OK(wsync_sender_flush(t.snd, 3000));
    wsync_blob_free(&req1);
    wsync_blob_free(&req2);
    wsync_receiver_destroy(e0);
    wsync_receiver_destroy(e1);
    trainer_stop(&t);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_arena_is_whole_pages_and_a_sender_without_the_option_has_none),
        cmocka_unit_test(versions_laid_out_in_the_arena_load_bit_exact),
        cmocka_unit_test(versions_laid_out_in_the_arena_load_bit_exact_as_active_messages),
        cmocka_unit_test(the_engines_read_the_arena_itself_and_a_write_before_the_flush_fails_the_version),
        cmocka_unit_test(over_active_messages_a_write_before_any_read_fails_the_version),
        cmocka_unit_test(an_engine_without_a_data_stream_gets_the_checksums_either_way),
        cmocka_unit_test(a_chunk_not_laid_out_as_packed_is_packed_and_a_later_write_does_not_show),
        cmocka_unit_test(a_flushed_version_is_never_read_from_the_arena_again),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
