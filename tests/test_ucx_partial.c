/* Partial pulls over the ucx kind ("select" option), trainer and engines in this one process
 * over loopback tcp (the sender's progress thread serves the fetches). The engines load UCX through
 * tests/ucx/ucp_count.c, which counts every fetch and its bytes at the UCP API, so "only the
 * selected bytes move" is measured where UCX is asked to move them. */
#define _GNU_SOURCE /* memmem */
#include <dlfcn.h>

#include "testutil.h"

#ifndef WSYNC_UCP_COUNT_PATH
#error "WSYNC_UCP_COUNT_PATH (the counting libucp stand-in) must be defined"
#endif

static uint64_t (*get_bytes)(void);
static uint64_t (*get_calls)(void);
static void (*get_reset)(void);

/* The model: two 64x32 float32 weights, a 32-float norm and a 128x16 float32 embedding. */
enum { Q, K, NORM, EMBED, NT };
static const char *const names[NT] = {"layers.0.q.weight", "layers.0.k.weight", "layers.0.norm", "embed"};
static const int64_t shapes[NT][2] = {{64, 32}, {64, 32}, {32, 0}, {128, 16}};
static const int32_t ndims[NT] = {2, 2, 1, 2};
static const uint64_t nbytes[NT] = {8192, 8192, 128, 8192};

#define OPTS "\"transports\":\"tcp\",\"net_devices\":\"lo\",\"timeout_ms\":10000"

struct trainer {
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *snd;
    uint8_t data[NT][8192];
};

static int setup(void **state) {
    (void)state;
    wsync_strategy_t *s = NULL;
    if (wsync_strategy_create("ucx", "{" OPTS "}", &s) != WSYNC_OK) return 0;  /* skipped per test */
    wsync_strategy_destroy(s);
    void *h = dlopen(WSYNC_UCP_COUNT_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
    get_bytes = (uint64_t (*)(void))dlsym(h, "wsync_test_get_bytes");
    get_calls = (uint64_t (*)(void))dlsym(h, "wsync_test_get_calls");
    get_reset = (void (*)(void))dlsym(h, "wsync_test_get_reset");
    return get_bytes && get_calls && get_reset ? 0 : -1;
}

static void need_ucx(void) {
    if (!get_bytes) skip();
}

static void trainer_start_with(struct trainer *t, unsigned receivers, const char *extra) {
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"receivers\":%u%s}", receivers, extra);
    OK(wsync_strategy_create("ucx", o, &t->s));
    OK(wsync_strategy_create_init_info(t->s, &t->init));
    OK(wsync_sender_create(t->s, t->init.data, t->init.size, &t->snd));
}

static void trainer_start(struct trainer *t, unsigned receivers) { trainer_start_with(t, receivers, ""); }

static void trainer_stop(struct trainer *t) {
    wsync_sender_destroy(t->snd);
    wsync_blob_free(&t->init);
    wsync_strategy_destroy(t->s);
}

static wsync_tensor_t desc(struct trainer *t, int i) {
    wsync_tensor_t d;
    memset(&d, 0, sizeof d);
    d.name = names[i];
    d.data = t->data[i];
    d.shape = shapes[i];
    d.ndim = ndims[i];
    d.dtype = (wsync_dtype_t){WSYNC_DTYPE_FLOAT, 32, 1};
    d.device = (wsync_device_t){WSYNC_DEVICE_CPU, 0};
    return d;
}

/* Sends version v: every tensor's bytes from tu_fill(v, tensor); in two chunks (q, k | norm,
 * embed) or, with one_chunk, all four in one committing chunk. */
static size_t send_version(struct trainer *t, uint64_t v, int one_chunk, wsync_blob_t req[2]) {
    for (int i = 0; i < NT; ++i) tu_fill(t->data[i], nbytes[i], v, (uint64_t)i);
    wsync_tensor_t all[NT];
    for (int i = 0; i < NT; ++i) all[i] = desc(t, i);
    if (one_chunk) {
        wsync_chunk_t c = {all, NT, WSYNC_CHUNK_LAST, 0};
        OK(wsync_sender_send_chunk(t->snd, &c, &req[0]));
        return 1;
    }
    wsync_chunk_t c0 = {all, 2, 0, 0}, c1 = {all + 2, 2, WSYNC_CHUNK_LAST, 0};
    OK(wsync_sender_send_chunk(t->snd, &c0, &req[0]));
    OK(wsync_sender_send_chunk(t->snd, &c1, &req[1]));
    return 2;
}

static wsync_receiver_t *engine(struct trainer *t, uint32_t index, const char *select, const char *rest) {
    char o[2048];
    snprintf(o, sizeof o, "{" OPTS ",\"ucx_library\":\"%s\"%s%s%s%s%s}", WSYNC_UCP_COUNT_PATH,
             select ? ",\"select\":" : "", select ? select : "", rest ? ",\"select_rest\":\"" : "",
             rest ? rest : "", rest ? "\"" : "");
    wsync_strategy_t *s = NULL;
    OK(wsync_strategy_create("ucx", o, &s));
    wsync_receiver_t *r = NULL;
    OK(wsync_receiver_create(s, t->init.data, t->init.size, index, &r));
    wsync_strategy_destroy(s);  /* the receiver keeps what it needs */
    return r;
}

/* What one entry of an iteration must be: tensor, and the byte range of it. */
struct want {
    int tensor;
    uint64_t offset, bytes;
};

static int tensor_of(const char *name) {
    for (int i = 0; i < NT; ++i)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

/* Receives one request, yields every entry with wsync_recv_next_part and checks each against
 * `w` (in order) and its bytes bit for bit against version v's; ends the iteration. */
static void take(wsync_receiver_t *r, const wsync_blob_t *req, uint64_t v, const struct want *w, size_t n) {
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(r, req->data, req->size, &it));
    wsync_recv_info_t info = {.struct_size = sizeof info};
    OK(wsync_recv_info(it, &info));
    assert_int_equal(info.count, n);
    uint64_t want_bytes = 0;
    for (size_t k = 0; k < n; ++k) want_bytes += w[k].bytes;
    assert_int_equal(info.bytes, want_bytes);
    static uint8_t ref[8192];
    for (size_t k = 0;; ++k) {
        wsync_tensor_t view;
        wsync_part_t part;
        bool has = false;
        OK(wsync_recv_next_part(it, &view, &part, &has));
        if (!has) {
            assert_int_equal(k, n);
            break;
        }
        assert_true(k < n);
        int i = tensor_of(view.name);
        assert_int_equal(i, w[k].tensor);
        assert_int_equal(view.ndim, ndims[i]);
        assert_int_equal(view.shape[0], shapes[i][0]);
        assert_int_equal(part.offset, w[k].offset);
        assert_int_equal(part.bytes, w[k].bytes);
        tu_fill(ref, nbytes[i], v, (uint64_t)i);
        assert_memory_equal(view.data, ref + part.offset, part.bytes);
    }
    OK(wsync_recv_end(it));
}

static uint64_t completed(wsync_receiver_t *r) {
    uint64_t v = 0;
    OK(wsync_receiver_completed_version(r, &v));
    return v;
}

/* Two engines pull different tensor-parallel shards (rank 0 and 1 of 2 along dimension 0) of
 * the same two weights plus the whole norm, over three versions (the trainer carrying 4 KiB
 * block checksums, so each shard is verified block by block): each gets exactly its rows,
 * bit-exact, and UCX is asked for exactly those bytes, one fetch per range (no two ranges of a
 * rank touch in the trainer's chunk: q's half, k's half, the norm). An engine without a
 * selection pulls every byte of each chunk, which shows the counter sees whole pulls too. */
static void two_tp_shards_get_exactly_their_bytes_over_three_versions(void **state) {
    (void)state;
    need_ucx();
    static struct trainer t;
    trainer_start_with(&t, 3, ",\"block_checksum_bytes\":4096");
    wsync_receiver_t *r0 = engine(&t, 0,
        "[{\"tensors\":[\"layers.0.q.weight\",\"layers.0.k.weight\"],\"rank\":0,\"ranks\":2,"
        "\"dtype\":\"float32\",\"shape\":[64,32]},{\"tensor\":\"layers.0.norm\"}]", NULL);
    wsync_receiver_t *r1 = engine(&t, 1,
        "[{\"tensors\":[\"layers.0.q.weight\",\"layers.0.k.weight\"],\"rank\":1,\"ranks\":2},"
        "{\"tensor\":\"layers.0.norm\"}]", NULL);
    wsync_receiver_t *all = engine(&t, 2, NULL, NULL);
    const struct want w0c0[] = {{Q, 0, 4096}, {K, 0, 4096}}, w1c0[] = {{Q, 4096, 4096}, {K, 4096, 4096}};
    const struct want norm[] = {{NORM, 0, 128}};
    const struct want everything0[] = {{Q, 0, 8192}, {K, 0, 8192}}, everything1[] = {{NORM, 0, 128}, {EMBED, 0, 8192}};
    for (uint64_t v = 1; v <= 3; ++v) {
        wsync_blob_t req[2] = {{0}};
        assert_int_equal(send_version(&t, v, 0, req), 2);
        get_reset();
        take(r0, &req[0], v, w0c0, 2);
        take(r0, &req[1], v, norm, 1);
        assert_int_equal(get_bytes(), 4096 + 4096 + 128);
        assert_int_equal(get_calls(), 3);
        get_reset();
        take(r1, &req[0], v, w1c0, 2);
        take(r1, &req[1], v, norm, 1);
        assert_int_equal(get_bytes(), 4096 + 4096 + 128);
        assert_int_equal(get_calls(), 3);
        get_reset();
        take(all, &req[0], v, everything0, 2);
        take(all, &req[1], v, everything1, 2);
        assert_int_equal(get_bytes(), 16384 + 256 + 8192);  /* norm padded to 256, then embed */
        assert_int_equal(get_calls(), 2);
        OK(wsync_sender_flush(t.snd, 10000));
        assert_int_equal(completed(r0), v);
        assert_int_equal(completed(r1), v);
        assert_int_equal(completed(all), v);
        wsync_blob_free(&req[0]);
        wsync_blob_free(&req[1]);
    }
    wsync_receiver_destroy(r0);
    wsync_receiver_destroy(r1);
    wsync_receiver_destroy(all);
    trainer_stop(&t);
}

/* A selected tensor the version does not hold fails by name (WSYNC_ERR_MISMATCH naming it and
 * the version) at the chunk that commits the version, before that chunk's fetch: in a one-chunk
 * version nothing moves at all; in a two-chunk version whose first chunk holds nothing
 * selected, nothing moves either. The trainer's flush names the engine and the tensor. */
static void a_selected_tensor_missing_from_the_version_fails_by_name_before_any_byte_moves(void **state) {
    (void)state;
    need_ucx();
    static struct trainer t;
    trainer_start(&t, 1);
    wsync_receiver_t *r = engine(&t, 0, "[{\"tensor\":\"layers.0.norm\"},{\"tensor\":\"layers.0.v.weight\"}]", NULL);
    wsync_blob_t req[2] = {{0}};
    send_version(&t, 1, 1, req);
    get_reset();
    wsync_recv_t *it = NULL;
    EXPECT_ERR(wsync_receiver_receive(r, req[0].data, req[0].size, &it), WSYNC_ERR_MISMATCH,
               "tensor 'layers.0.v.weight' (select[1]) is not in version 1");
    assert_int_equal(get_bytes(), 0);
    assert_int_equal(get_calls(), 0);
    EXPECT_ERR(wsync_sender_flush(t.snd, 10000), WSYNC_ERR_PEER, "layers.0.v.weight");
    wsync_failure_t f = {.struct_size = sizeof f};
    OK(wsync_sender_failure(t.snd, 0, &f));
    assert_int_equal(f.status, WSYNC_ERR_MISMATCH);
    assert_int_equal(f.version, 1);
    wsync_blob_free(&req[0]);

    send_version(&t, 2, 0, req);
    get_reset();
    take(r, &req[0], 2, NULL, 0);  /* q and k: nothing selected, nothing fetched */
    EXPECT_ERR(wsync_receiver_receive(r, req[1].data, req[1].size, &it), WSYNC_ERR_MISMATCH,
               "tensor 'layers.0.v.weight' (select[1]) is not in version 2");
    assert_int_equal(get_bytes(), 0);
    assert_int_equal(get_calls(), 0);
    assert_int_equal(completed(r), 0);
    EXPECT_ERR(wsync_sender_flush(t.snd, 10000), WSYNC_ERR_PEER, "is not in version 2");
    wsync_blob_free(&req[0]);
    wsync_blob_free(&req[1]);
    wsync_receiver_destroy(r);
    trainer_stop(&t);
}

/* A range past a tensor's end, a shard whose dimension 0 does not divide, a dtype or shape
 * other than declared: each fails WSYNC_ERR_MISMATCH naming the tensor and the version before
 * anything moves. */
static void a_range_past_the_end_or_a_conflicting_dtype_or_shape_fails_by_name_before_any_byte_moves(void **state) {
    (void)state;
    need_ucx();
    static const struct {
        const char *select, *needle;
    } cases[] = {
        {"[{\"tensor\":\"layers.0.norm\",\"offset\":64,\"bytes\":128}]",
         "select[0] selects bytes [64, 192) of tensor 'layers.0.norm' of version 1, which has 128 bytes"},
        {"[{\"tensor\":\"layers.0.q.weight\",\"rank\":1,\"ranks\":3}]",
         "of tensor 'layers.0.q.weight' of version 1, whose shape is [64, 32]: dimension 0 does not divide by 3"},
        {"[{\"tensor\":\"embed\",\"dtype\":\"bfloat16\"}]", "tensor 'embed' of version 1 is float32, but select[0] expects bfloat16"},
        {"[{\"tensor\":\"embed\",\"shape\":[16,128]}]", "tensor 'embed' of version 1 has shape [128, 16], but select[0] expects [16, 128]"},
        {"[{\"tensor\":\"embed\",\"offset\":2,\"bytes\":8}]", "which are not whole elements of its dtype"},
    };
    const size_t n = sizeof cases / sizeof *cases;
    static struct trainer t;
    trainer_start(&t, (unsigned)n);
    wsync_receiver_t *r[8];
    for (size_t i = 0; i < n; ++i) r[i] = engine(&t, (uint32_t)i, cases[i].select, NULL);
    wsync_blob_t req[2] = {{0}};
    send_version(&t, 1, 1, req);
    get_reset();
    for (size_t i = 0; i < n; ++i) {
        wsync_recv_t *it = NULL;
        EXPECT_ERR(wsync_receiver_receive(r[i], req[0].data, req[0].size, &it), WSYNC_ERR_MISMATCH, cases[i].needle);
        assert_int_equal(get_bytes(), 0);
    }
    size_t count = 0;
    EXPECT_ERR(wsync_sender_flush(t.snd, 10000), WSYNC_ERR_PEER, "MISMATCH");
    /* flush fails at the first failure it hears; the others travel over UCX on their own
     * time (seconds under a sanitizer), each reported by a later flush. */
    OK(wsync_sender_failure_count(t.snd, &count));
    size_t total = count;
    for (long t0 = tu_now_ms(); total < n && tu_now_ms() - t0 < 10000;) {
        if (wsync_sender_flush(t.snd, 200) == WSYNC_ERR_PEER) {
            OK(wsync_sender_failure_count(t.snd, &count));
            total += count;
        }
    }
    assert_int_equal(total, n);
    wsync_blob_free(&req[0]);
    for (size_t i = 0; i < n; ++i) wsync_receiver_destroy(r[i]);
    trainer_stop(&t);
}

/* Byte ranges with "select_rest": "whole": the other tensors arrive whole, the two ranges of
 * embed as parts; wsync_recv_copy of each entry whole writes exactly the ranges into a
 * tensor-sized buffer and leaves the rest of it alone. Ranges coalesce into one fetch where only
 * padding lies between them: q and k (back to back), and the norm with embed's first range
 * (the 128 padding bytes between them travel too); embed's second range is a fetch of its own. */
static void byte_ranges_with_the_rest_whole_copy_into_place(void **state) {
    (void)state;
    need_ucx();
    static struct trainer t;
    trainer_start(&t, 1);
    wsync_receiver_t *r = engine(&t, 0,
        "[{\"tensor\":\"embed\",\"offset\":4096,\"bytes\":1024},{\"tensor\":\"embed\",\"offset\":0,\"bytes\":2048}]",
        "whole");
    static uint8_t dst[NT][8192], ref[8192];
    for (uint64_t v = 1; v <= 2; ++v) {
        wsync_blob_t req[2] = {{0}};
        send_version(&t, v, 0, req);
        memset(dst, 0xab, sizeof dst);
        get_reset();
        for (int c = 0; c < 2; ++c) {
            wsync_recv_t *it = NULL;
            OK(wsync_receiver_receive(r, req[c].data, req[c].size, &it));
            wsync_recv_info_t info = {.struct_size = sizeof info};
            OK(wsync_recv_info(it, &info));
            assert_int_equal(info.count, c == 0 ? 2 : 3);
            for (size_t i = 0; i < info.count; ++i) {
                wsync_tensor_t view;
                wsync_part_t part;
                OK(wsync_recv_peek(it, i, &view));
                OK(wsync_recv_part(it, i, &part));
                int ti = tensor_of(view.name);
                if (c == 1 && i > 0) {  /* embed's ranges, in offset order */
                    assert_int_equal(ti, EMBED);
                    assert_int_equal(part.offset, i == 1 ? 0 : 4096);
                    assert_int_equal(part.bytes, i == 1 ? 2048 : 1024);
                }
                OK(wsync_recv_copy(it, i, 0, dst[ti], nbytes[ti]));
            }
            OK(wsync_recv_end(it));
        }
        assert_int_equal(get_bytes(), 16384 + (128 + 128 + 2048) + 1024);
        assert_int_equal(get_calls(), 1 + 2);
        for (int i = 0; i < NT; ++i) {
            tu_fill(ref, nbytes[i], v, (uint64_t)i);
            if (i != EMBED) {
                assert_memory_equal(dst[i], ref, nbytes[i]);
                continue;
            }
            assert_memory_equal(dst[i], ref, 2048);
            assert_memory_equal(dst[i] + 4096, ref + 4096, 1024);
            for (uint64_t b = 2048; b < 8192; ++b)
                if (b < 4096 || b >= 5120) assert_int_equal(dst[i][b], 0xab);
        }
        OK(wsync_sender_flush(t.snd, 10000));
        assert_int_equal(completed(r), v);
        wsync_blob_free(&req[0]);
        wsync_blob_free(&req[1]);
    }
    wsync_receiver_destroy(r);
    trainer_stop(&t);
}

/* A split tensor (embed in two parts, one per chunk): a range across the cut arrives as one
 * piece from each chunk, and a shard that is exactly the second part arrives whole-part (its
 * checksum verified), each bit-exact with only those bytes fetched. */
static void a_selection_spans_the_parts_of_a_split_tensor(void **state) {
    (void)state;
    need_ucx();
    static struct trainer t;
    trainer_start(&t, 2);
    wsync_receiver_t *a = engine(&t, 0, "[{\"tensor\":\"embed\",\"offset\":3072,\"bytes\":2048}]", NULL);
    wsync_receiver_t *b = engine(&t, 1, "[{\"tensor\":\"embed\",\"rank\":1,\"ranks\":2}]", NULL);
    for (uint64_t v = 1; v <= 2; ++v) {
        tu_fill(t.data[EMBED], 8192, v, EMBED);
        wsync_tensor_t e = desc(&t, EMBED);
        wsync_part_t p0 = {0, 4096}, p1 = {4096, 4096};
        wsync_chunk_t c0 = {&e, 1, 0, 0}, c1 = {&e, 1, WSYNC_CHUNK_LAST, 0};
        wsync_blob_t req[2] = {{0}};
        OK(wsync_sender_send_parts(t.snd, &c0, &p0, &req[0]));
        OK(wsync_sender_send_parts(t.snd, &c1, &p1, &req[1]));
        const struct want a0[] = {{EMBED, 3072, 1024}}, a1[] = {{EMBED, 4096, 1024}}, b1[] = {{EMBED, 4096, 4096}};
        get_reset();
        take(a, &req[0], v, a0, 1);
        take(a, &req[1], v, a1, 1);
        assert_int_equal(get_bytes(), 2048);
        get_reset();
        take(b, &req[0], v, NULL, 0);
        take(b, &req[1], v, b1, 1);
        assert_int_equal(get_bytes(), 4096);
        OK(wsync_sender_flush(t.snd, 10000));
        assert_int_equal(completed(a), v);
        assert_int_equal(completed(b), v);
        wsync_blob_free(&req[0]);
        wsync_blob_free(&req[1]);
    }
    wsync_receiver_destroy(a);
    wsync_receiver_destroy(b);
    trainer_stop(&t);
}

/* Review: the trainer abandons a version whose requests reach the engine afterwards (its first
 * chunk, and a later one after the engine took the first). The engine refuses them (ABANDONED)
 * and completes the next version; the trainer's flush is not failed by refusals of a version
 * it abandoned itself (it was: PEER naming receiver 0, which a controller would then drop). */
static void refusals_of_a_version_the_trainer_abandoned_do_not_fail_its_flush(void **state) {
    (void)state;
    need_ucx();
    struct trainer t;
    trainer_start(&t, 1);
    wsync_receiver_t *r = engine(&t, 0, NULL, NULL);
    wsync_tensor_t all[NT];
    for (int i = 0; i < NT; ++i) all[i] = desc(&t, i);
    for (int late_first = 1; late_first >= 0; --late_first) {
        for (int i = 0; i < NT; ++i) tu_fill(t.data[i], nbytes[i], 50 + (uint64_t)late_first, (uint64_t)i);
        wsync_blob_t a, b;
        wsync_chunk_t c0 = {all, 2, 0, 0}, c1 = {all + 2, 2, 0, 0};
        OK(wsync_sender_send_chunk(t.snd, &c0, &a));
        OK(wsync_sender_send_chunk(t.snd, &c1, &b));
        wsync_recv_t *it = NULL;
        if (!late_first) { /* the engine takes chunk 0 before the abandon */
            const struct want first[2] = {{0, 0, nbytes[0]}, {1, 0, nbytes[1]}};
            take(r, &a, 50, first, 2);
        }
        OK(wsync_sender_abandon(t.snd));
        if (late_first)
            EXPECT_ERR(wsync_receiver_receive(r, a.data, a.size, &it), WSYNC_ERR_ABANDONED, "");
        EXPECT_ERR(wsync_receiver_receive(r, b.data, b.size, &it), WSYNC_ERR_ABANDONED, "");
        OK(wsync_sender_flush(t.snd, 5000));
        wsync_blob_free(&a);
        wsync_blob_free(&b);
    }
    wsync_blob_t v[2];
    uint64_t next = 0;
    OK(wsync_sender_version(t.snd, &next));
    send_version(&t, next, 1, v);
    const struct want every[NT] = {{0, 0, nbytes[0]}, {1, 0, nbytes[1]}, {2, 0, nbytes[2]}, {3, 0, nbytes[3]}};
    take(r, &v[0], next, every, NT);
    OK(wsync_sender_flush(t.snd, 5000));
    wsync_blob_free(&v[0]);
    wsync_receiver_destroy(r);
    trainer_stop(&t);
}

/* An engine too slow for keep_versions (ucx user trial): the trainer no longer keeps version
 * 1's chunks when the engine asks. The first refused pull fails version 1 here with ABANDONED
 * (poll says so, and says why); its next chunk is refused as part of that failed version, not
 * as "a request was lost or reordered" (MISMATCH, which the poll and the trainer used to show);
 * the engine then completes the newest version bit for bit. */
static void a_chunk_no_longer_kept_fails_its_version_with_abandoned_and_the_next_version_loads(void **state) {
    (void)state;
    need_ucx();
    struct trainer t;
    trainer_start_with(&t, 1, ",\"keep_versions\":1");
    wsync_receiver_t *r = engine(&t, 0, NULL, NULL);
    wsync_blob_t v1[2], v2[2], v3[2];
    send_version(&t, 1, 0, v1);
    send_version(&t, 2, 0, v2);
    send_version(&t, 3, 0, v3);
    wsync_recv_t *it = NULL;
    EXPECT_ERR(wsync_receiver_receive(r, v1[0].data, v1[0].size, &it), WSYNC_ERR_ABANDONED,
               "is no longer kept");
    EXPECT_ERR(wsync_receiver_receive(r, v1[1].data, v1[1].size, &it), WSYNC_ERR_ABANDONED,
               "version 1 already failed here with WSYNC_ERR_ABANDONED");
    wsync_receiver_state_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    OK(wsync_receiver_poll(r, &st));
    assert_int_equal(st.failed_version, 1);
    assert_int_equal(st.failed_status, WSYNC_ERR_ABANDONED);
    const struct want all[2] = {{0, 0, nbytes[0]}, {1, 0, nbytes[1]}};
    const struct want rest[2] = {{2, 0, nbytes[2]}, {3, 0, nbytes[3]}};
    take(r, &v3[0], 3, all, 2);
    take(r, &v3[1], 3, rest, 2);
    uint64_t done = 0;
    OK(wsync_receiver_completed_version(r, &done));
    assert_int_equal(done, 3);
    for (int c = 0; c < 2; ++c) wsync_blob_free(&v1[c]), wsync_blob_free(&v2[c]), wsync_blob_free(&v3[c]);
    wsync_receiver_destroy(r);
    trainer_stop(&t);
}

/* Options that name a device or transport this host lacks are refused by name (ucx user trial:
 * "eth9", "foo" came back as SYSTEM "ucp_init: No such device", naming neither option). */
static void a_device_or_transport_the_host_lacks_is_unavailable_naming_the_options(void **state) {
    (void)state;
    need_ucx();
    const char *cases[][2] = {{"\"transports\":\"tcp\",\"net_devices\":\"eth9\"", "'net_devices' = \"eth9\""},
                              {"\"transports\":\"foo\",\"net_devices\":\"lo\"", "'transports' = \"foo\""}};
    for (size_t i = 0; i < 2; ++i) {
        char o[256];
        snprintf(o, sizeof o, "{\"timeout_ms\":2000,%s}", cases[i][0]);
        wsync_strategy_t *s = NULL;
        OK(wsync_strategy_create("ucx", o, &s));
        wsync_blob_t init = {0};
        wsync_sender_t *snd = NULL;
        wsync_status_t st = wsync_strategy_create_init_info(s, &init);
        if (st == WSYNC_OK) st = wsync_sender_create(s, init.data, init.size, &snd);
        assert_int_equal(st, WSYNC_ERR_UNAVAILABLE);
        assert_non_null(strstr(wsync_last_error(), "UCX has no device for option"));
        assert_non_null(strstr(wsync_last_error(), cases[i][1]));
        assert_null(snd);
        wsync_blob_free(&init);
        wsync_strategy_destroy(s);
    }
}

/* Flips the first copy of `sum`'s 8 little-endian bytes in a request and re-seals it, as a
 * sender that carried a wrong block checksum would. */
static void corrupt_sum(wsync_blob_t *req, uint64_t sum) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = (uint8_t)(sum >> (8 * i));
    uint8_t *at = memmem(req->data, req->size, le, sizeof le);
    assert_non_null(at);
    at[0] ^= 1;
    tu_reseal(req->data, req->size);
}

/* With the trainer's "block_checksum_bytes", a range is verified block by block where it covers
 * a block whole: a corrupt block checksum fails the chunk with WSYNC_ERR_INTEGRITY naming the
 * tensor and the block (after its fetch; the trainer hears of it). A range covering a block only
 * in part is not verified, as documented: the same corrupt checksum goes unnoticed there. The
 * next, intact version arrives at both engines. */
static void block_checksums_verify_whole_blocks_of_a_range_and_name_a_corrupt_one(void **state) {
    (void)state;
    need_ucx();
    static struct trainer t;
    trainer_start_with(&t, 2, ",\"block_checksum_bytes\":4096");
    wsync_receiver_t *shard = engine(&t, 0,
        "[{\"tensors\":[\"layers.0.q.weight\",\"layers.0.k.weight\"],\"rank\":0,\"ranks\":2}]", NULL);
    wsync_receiver_t *inside = engine(&t, 1, "[{\"tensor\":\"layers.0.q.weight\",\"offset\":1024,\"bytes\":2048}]", NULL);
    wsync_blob_t req[2] = {{0}};
    send_version(&t, 1, 0, req);
    corrupt_sum(&req[0], XXH3_64bits(t.data[Q], 4096));  /* q's block 0 */
    get_reset();
    wsync_recv_t *it = NULL;
    EXPECT_ERR(wsync_receiver_receive(shard, req[0].data, req[0].size, &it), WSYNC_ERR_INTEGRITY,
               "tensor 'layers.0.q.weight' in chunk 0 of version 1: block 0 (bytes [0, 4096) of the entry) checksum mismatch");
    assert_int_equal(get_bytes(), 8192);
    assert_int_not_equal(wsync_receiver_receive(shard, req[1].data, req[1].size, &it), WSYNC_OK);
    const struct want part[] = {{Q, 1024, 2048}};
    take(inside, &req[0], 1, part, 1);
    take(inside, &req[1], 1, NULL, 0);
    assert_int_equal(completed(inside), 1);
    EXPECT_ERR(wsync_sender_flush(t.snd, 10000), WSYNC_ERR_PEER, "checksum mismatch");
    wsync_failure_t f = {.struct_size = sizeof f};
    OK(wsync_sender_failure(t.snd, 0, &f));
    assert_int_equal(f.receiver, 0);
    assert_int_equal(f.status, WSYNC_ERR_INTEGRITY);
    wsync_blob_free(&req[0]);
    wsync_blob_free(&req[1]);

    send_version(&t, 2, 0, req);
    const struct want w0[] = {{Q, 0, 4096}, {K, 0, 4096}};
    take(shard, &req[0], 2, w0, 2);
    take(shard, &req[1], 2, NULL, 0);
    take(inside, &req[0], 2, part, 1);
    take(inside, &req[1], 2, NULL, 0);
    OK(wsync_sender_flush(t.snd, 10000));
    assert_int_equal(completed(shard), 2);
    assert_int_equal(completed(inside), 2);
    wsync_blob_free(&req[0]);
    wsync_blob_free(&req[1]);
    wsync_receiver_destroy(shard);
    wsync_receiver_destroy(inside);
    trainer_stop(&t);
}

/* Sixteen ranges of one tensor, each a fetch of its own (bytes of the tensor lie between them),
 * are served without waiting on the trainer's idle timer: its progress thread answers at most 4
 * fetches of one receiver at a time (kFetchesInFlight) and no longer spins between rounds, so
 * fetches past those 4 must be dispatched as places free up, not after its 100 ms sleep. Ten
 * versions of 16 such fetches take well under a second (3-7 ms measured; a 100 ms wait per
 * batch of 4 would make it 3 s), each range bit-exact. (A review feared that a Data send
 * completing in place would let the thread sleep with fetches waiting; serve.cpp now checks
 * for that, though this test also passed without the check.) */
static void sixteen_small_ranges_of_a_chunk_are_served_without_idle_waits(void **state) {
    (void)state;
    need_ucx();
    static struct trainer t;
    trainer_start(&t, 1);
    char sel[2048] = "[";
    for (int k = 0; k < 16; ++k)
        snprintf(sel + strlen(sel), sizeof sel - strlen(sel), "%s{\"tensor\":\"embed\",\"offset\":%d,\"bytes\":64}",
                 k ? "," : "", k * 512);
    strcat(sel, "]");
    wsync_receiver_t *r = engine(&t, 0, sel, NULL);
    static uint8_t ref[8192];
    long waited = 0;
    for (uint64_t v = 1; v <= 10; ++v) {
        wsync_blob_t req[2] = {{0}};
        send_version(&t, v, 1, req);
        get_reset();
        const long t0 = tu_now_ms();
        wsync_recv_t *it = NULL;
        OK(wsync_receiver_receive(r, req[0].data, req[0].size, &it));
        waited += tu_now_ms() - t0;
        assert_int_equal(get_calls(), 16);  /* one fetch a range */
        tu_fill(ref, nbytes[EMBED], v, EMBED);
        for (int k = 0;; ++k) {
            wsync_tensor_t view;
            wsync_part_t part;
            bool has = false;
            OK(wsync_recv_next_part(it, &view, &part, &has));
            if (!has) {
                assert_int_equal(k, 16);
                break;
            }
            assert_int_equal(part.offset, (uint64_t)k * 512);
            assert_memory_equal(view.data, ref + part.offset, 64);
        }
        OK(wsync_recv_end(it));
        OK(wsync_sender_flush(t.snd, 10000));
        wsync_blob_free(&req[0]);
    }
    print_message("10 versions of 16 one-range fetches: %ld ms in receive\n", waited);
    assert_true(waited < 1000);
    wsync_receiver_destroy(r);
    trainer_stop(&t);
}

/* A bad selection is refused when the engine's strategy is created, naming the option and the
 * entry. */
static void a_bad_selection_is_refused_at_creation_naming_the_entry(void **state) {
    (void)state;
    need_ucx();
    static const struct {
        const char *opts, *needle;
    } cases[] = {
        {"\"select\":5", "option 'select' must be a JSON array or object"},
        {"\"select\":{}", "option 'select' must be an array"},
        {"\"select\":[]", "option 'select' lists no tensor"},
        {"\"select\":[{\"tensor\":\"a\",\"offst\":1}]", "option 'select[0]' has unknown key 'offst'"},
        {"\"select\":[{\"offset\":0,\"bytes\":4}]", "option 'select[0]' needs exactly one of \"tensor\""},
        {"\"select\":[{\"tensor\":\"a\",\"rank\":2,\"ranks\":2}]", "option 'select[0]' has rank 2 of 2 ranks"},
        {"\"select\":[{\"tensor\":\"a\",\"offset\":0,\"bytes\":0}]", "option 'select[0]' has \"bytes\": 0"},
        {"\"select\":[{\"tensor\":\"a\",\"offset\":0}]", "option 'select[0]' needs both \"offset\" and \"bytes\""},
        {"\"select\":[{\"tensor\":\"a\",\"offset\":-4,\"bytes\":4}]", "option 'select[0]' has \"offset\" that is not a non-negative integer"},
        {"\"select\":[{\"tensor\":\"a\",\"offset\":0,\"bytes\":8},{\"tensor\":\"a\",\"offset\":4,\"bytes\":8}]",
         "option 'select[1]' overlaps select[0]"},
        {"\"select\":[{\"tensor\":\"a\"},{\"tensor\":\"a\",\"offset\":0,\"bytes\":4}]", "only byte ranges may share a tensor"},
        {"\"select\":[{\"tensors\":[\"a\",\"\"],\"rank\":0,\"ranks\":2}]", "option 'select[0].tensors[1]' names no valid tensor"},
        {"\"select_rest\":\"whole\"", "option 'select_rest' needs 'select'"},
        {"\"select\":[{\"tensor\":\"a\"}],\"select_rest\":\"all\"", "option 'select_rest'"},
        {"\"block_checksum_bytes\":5000", "option 'block_checksum_bytes' = 5000 is not a multiple of 4096"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; ++i) {
        char o[512];
        snprintf(o, sizeof o, "{" OPTS ",%s}", cases[i].opts);
        wsync_strategy_t *s = NULL;
        EXPECT_ERR(wsync_strategy_create("ucx", o, &s), WSYNC_ERR_INVALID_ARGUMENT, cases[i].needle);
        assert_null(s);
    }
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_tp_shards_get_exactly_their_bytes_over_three_versions),
        cmocka_unit_test(a_selected_tensor_missing_from_the_version_fails_by_name_before_any_byte_moves),
        cmocka_unit_test(a_range_past_the_end_or_a_conflicting_dtype_or_shape_fails_by_name_before_any_byte_moves),
        cmocka_unit_test(byte_ranges_with_the_rest_whole_copy_into_place),
        cmocka_unit_test(a_selection_spans_the_parts_of_a_split_tensor),
        cmocka_unit_test(refusals_of_a_version_the_trainer_abandoned_do_not_fail_its_flush),
        cmocka_unit_test(a_device_or_transport_the_host_lacks_is_unavailable_naming_the_options),
        cmocka_unit_test(a_chunk_no_longer_kept_fails_its_version_with_abandoned_and_the_next_version_loads),
        cmocka_unit_test(block_checksums_verify_whole_blocks_of_a_range_and_name_a_corrupt_one),
        cmocka_unit_test(a_bad_selection_is_refused_at_creation_naming_the_entry),
        cmocka_unit_test(sixteen_small_ranges_of_a_chunk_are_served_without_idle_waits),
    };
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, setup, NULL);
}
