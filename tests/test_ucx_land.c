/* Landing (wsync_receiver_land): a ucx receiver given a destination table reads each chunk
 * pulled over the data stream straight into the destinations, hashing each piece as it lands,
 * and wsync_recv_apply() then verifies without copying. These tests specify what the engine and
 * the trainer see: a landed tensor's view is its destination, and every destination holds the
 * version bit for bit, landed or not (a tied weight with two destinations, a shard that keeps
 * half a tensor, a small tensor, a tensor that straddles pieces); a destination whose shape
 * differs is never written by the pull; a landed tensor whose bytes differ from what the
 * trainer hashed fails the version with INTEGRITY naming it, and the flush names the receiver;
 * a trainer killed mid-chunk fails the apply and the end as unreachable, the version not
 * completed; and the refusals of the call itself. Trainer and engine are in this process, over
 * loopback tcp (the killed trainer is a forked process). */
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include "testutil.h"

#define OPTS "\"transports\":\"tcp\",\"net_devices\":\"lo\",\"timeout_ms\":5000"

/* 73 MiB of float32 in one chunk: pulled in pieces of 4 MiB, so "embed" and "shard" straddle
 * pieces; "norm" is 300 bytes (the next tensor sits after padding); "tail" is the bulk, so a
 * trainer stopped right after the receive returned has not sent it yet. */
enum { NT = 5, EMBED = 0, TIED = 1, NORM = 2, SHARD = 3, TAIL = 4 };
static const char *const names[NT] = {"embed", "tied", "norm", "shard", "tail"};
static const int64_t elems[NT] = {(3 << 20) / 4 + 16, (2 << 20) / 4, 75, (4 << 20) / 4, (64 << 20) / 4 - 300};

static size_t bytes_of(int i) { return (size_t)elems[i] * 4; }
static size_t round256(size_t n) { return (n + 255) / 256 * 256; }

struct trainer {
    wsync_strategy_t *s;
    wsync_blob_t init;
    wsync_sender_t *snd;
    uint8_t *arena;  /* the model lies here in packed layout when the sender has one */
    uint8_t *heap;
    wsync_tensor_t t[NT];
    int64_t shape[NT][1];
};

/* A trainer for one engine, checksums on; with `arena` the model is laid out in the sender's
 * arena as it would be packed (so it is hashed at send_chunk and read where it lies). */
static unsigned receivers = 1;  /* the trainer's receiver indices */
static void trainer_start(struct trainer *t, int arena) {
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    memset(t, 0, sizeof *t);
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"receivers\":%u,\"arena_bytes\":%d}", receivers, arena ? 96 << 20 : 0);
    OK(wsync_strategy_create("ucx", o, &t->s));
    OK(wsync_strategy_create_init_info(t->s, &t->init));
    OK(wsync_sender_create(t->s, t->init.data, t->init.size, &t->snd));
    uint64_t size = 0;
    void *base = NULL;
    OK(wsync_sender_arena(t->snd, &base, &size));
    size_t total = 0;
    for (int i = 0; i < NT; ++i) total = round256(total + bytes_of(i));
    t->heap = arena ? NULL : malloc(total);
    uint8_t *at = arena ? base : t->heap;
    assert_non_null(at);
    size_t off = 0;
    for (int i = 0; i < NT; ++i) {
        t->shape[i][0] = elems[i];
        t->t[i] = tu_tensor(names[i], at + off, t->shape[i], 1, WSYNC_DTYPE_FLOAT, 32);
        off = round256(off + bytes_of(i));
    }
}

static void trainer_stop(struct trainer *t) {
    wsync_sender_destroy(t->snd);
    wsync_blob_free(&t->init);
    wsync_strategy_destroy(t->s);
    free(t->heap);
}

static void write_version(struct trainer *t, uint64_t v) {
    for (int i = 0; i < NT; ++i) tu_fill(t->t[i].data, bytes_of(i), v, (uint64_t)i);
}

static void send_version(struct trainer *t, uint64_t v, wsync_blob_t *req) {
    write_version(t, v);
    wsync_chunk_t c = tu_chunk(t->t, NT, WSYNC_CHUNK_LAST);
    OK(wsync_sender_send_chunk(t->snd, &c, req));
}

static wsync_receiver_t *engine_at(const uint8_t *init, size_t len, uint32_t index) {
    wsync_strategy_t *s = NULL;
    OK(wsync_strategy_create("ucx", "{" OPTS "}", &s));
    wsync_receiver_t *r = NULL;
    OK(wsync_receiver_create(s, init, len, index, &r));
    wsync_strategy_destroy(s);
    return r;
}

static wsync_receiver_t *engine(const uint8_t *init, size_t len) { return engine_at(init, len, 0); }

/* The engine's memory: every tensor whole, "tied" twice, and the second half of "shard". */
struct params {
    uint8_t *at[NT];
    uint8_t *tied2;
    uint8_t *half;
    wsync_dest_table_t *table;
};

static void params_make(struct params *p, wsync_receiver_t *r, int64_t embed_rows) {
    static int64_t shape[NT][1];
    static int64_t wrong[1];
    wsync_dest_t d[NT + 2];
    memset(d, 0, sizeof d);
    const wsync_dtype_t f32 = {WSYNC_DTYPE_FLOAT, 32, 1};
    for (int i = 0; i < NT; ++i) {
        p->at[i] = calloc(1, bytes_of(i));
        assert_non_null(p->at[i]);
        shape[i][0] = elems[i];
        d[i] = (wsync_dest_t){.name = names[i], .data = p->at[i], .shape = shape[i], .ndim = 1, .dtype = f32};
    }
    /* embed_rows != elems[EMBED]: a destination of another shape. */
    wrong[0] = embed_rows;
    d[EMBED].shape = wrong;
    p->tied2 = calloc(1, bytes_of(TIED));
    p->half = calloc(1, bytes_of(SHARD) / 2);
    assert_non_null(p->tied2);
    assert_non_null(p->half);
    d[NT] = (wsync_dest_t){.name = names[TIED], .data = p->tied2, .shape = shape[TIED], .ndim = 1, .dtype = f32};
    /* "shard" is kept only as its second half: its destination is that half, not the tensor. */
    d[SHARD].data = p->half;
    d[SHARD].src_offset = bytes_of(SHARD) / 2;
    d[SHARD].bytes = bytes_of(SHARD) / 2;
    OK(wsync_dest_table_create(r, d, NT + 1, &p->table));
}

static void params_free(struct params *p) {
    wsync_dest_table_destroy(p->table);
    for (int i = 0; i < NT; ++i) free(p->at[i]);
    free(p->tied2);
    free(p->half);
}

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (p[i]) return 0;
    return 1;
}

/* A trainer (`arena`: the model in its arena) and an engine landing in its params, whose
 * "embed" destination has `embed_rows` elements. */
struct rig {
    struct trainer t;
    wsync_receiver_t *e;
    struct params p;
};

static void rig_start(struct rig *g, int arena, int64_t embed_rows) {
    trainer_start(&g->t, arena);
    g->e = engine(g->t.init.data, g->t.init.size);
    params_make(&g->p, g->e, embed_rows);
    OK(wsync_receiver_land(g->e, g->p.table));
}

static void rig_stop(struct rig *g) {
    params_free(&g->p);
    wsync_receiver_destroy(g->e);
    trainer_stop(&g->t);
}

/* Sends version v and opens the engine's iteration over it. */
static wsync_recv_t *rig_receive(struct rig *g, uint64_t v, wsync_blob_t *req) {
    send_version(&g->t, v, req);
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(g->e, req->data, req->size, &it));
    return it;
}

/* After a failed chunk: the trainer's flush fails and the engine completed no version. */
static void version_failed_on_both_sides(struct rig *g) {
    assert_int_not_equal(wsync_sender_flush(g->t.snd, 5000), WSYNC_OK);
    assert_non_null(strstr(wsync_last_error(), "receiver 0"));
    uint64_t done = 9;
    OK(wsync_receiver_completed_version(g->e, &done));
    assert_int_equal(done, 0);
}

/* ---- the specification ---------------------------------------------------------------------- */

/* Three versions: the first tensor is taken as a view (it landed: the view is its destination,
 * already holding the version), the rest by one apply; every destination then holds the version
 * bit for bit, the flush is OK and the version completes. */
static void landed_tensors_are_their_destinations_and_every_destination_loads_bit_exact(void **state) {
    (void)state;
    struct rig g;
    rig_start(&g, 0, elems[EMBED]);
    const struct params *p = &g.p;
    for (uint64_t v = 1; v <= 3; ++v) {
        wsync_blob_t req;
        wsync_recv_t *it = rig_receive(&g, v, &req);
        wsync_tensor_t view;
        bool has = false;
        OK(wsync_recv_next(it, &view, &has));
        assert_true(has);
        assert_string_equal(view.name, names[EMBED]);
        assert_ptr_equal(view.data, p->at[EMBED]);  /* landed: the view is the destination */
        assert_true(tu_check(p->at[EMBED], bytes_of(EMBED), v, EMBED));
        wsync_apply_result_t res = {.struct_size = sizeof res};
        OK(wsync_recv_apply(it, p->table, 0, &res));
        assert_int_equal(res.tensors, NT - 1);
        assert_int_equal(res.writes, NT);  /* "tied" twice */
        OK(wsync_recv_end(it));
        for (int i = 1; i < NT; ++i)
            if (i != SHARD) assert_true(tu_check(p->at[i], bytes_of(i), v, (uint64_t)i));
        assert_true(tu_check(p->tied2, bytes_of(TIED), v, TIED));
        /* The shard's destination holds the second half; the first half went nowhere. */
        uint8_t *whole = malloc(bytes_of(SHARD));
        assert_non_null(whole);
        tu_fill(whole, bytes_of(SHARD), v, SHARD);
        assert_memory_equal(p->half, whole + bytes_of(SHARD) / 2, bytes_of(SHARD) / 2);
        assert_true(all_zero(p->at[SHARD], bytes_of(SHARD)));
        free(whole);
        OK(wsync_sender_flush(g.t.snd, 5000));
        uint64_t done = 0;
        OK(wsync_receiver_completed_version(g.e, &done));
        assert_int_equal(done, v);
        wsync_blob_free(&req);
    }
    /* Landing stopped: the next version arrives in the receive buffer (its view is not the
     * destination) and still loads bit for bit. */
    OK(wsync_receiver_land(g.e, NULL));
    wsync_blob_t req;
    wsync_recv_t *it = rig_receive(&g, 4, &req);
    wsync_tensor_t view;
    bool has = false;
    OK(wsync_recv_next(it, &view, &has));
    assert_ptr_not_equal(view.data, p->at[EMBED]);
    OK(wsync_recv_apply(it, p->table, 0, NULL));
    OK(wsync_recv_end(it));
    assert_true(tu_check(p->at[TAIL], bytes_of(TAIL), 4, TAIL));
    wsync_blob_free(&req);
    rig_stop(&g);
}

/* A destination of another shape takes nothing: the pull does not land in it, the apply
 * refuses the tensor by name, and the destination is still zero after the chunk failed. */
static void a_destination_of_another_shape_is_never_written_by_the_pull(void **state) {
    (void)state;
    struct rig g;
    rig_start(&g, 0, elems[EMBED] - 16);
    wsync_blob_t req;
    wsync_recv_t *it = rig_receive(&g, 1, &req);
    EXPECT_ERR(wsync_recv_apply(it, g.p.table, 0, NULL), WSYNC_ERR_MISMATCH, "'embed'");
    /* The other tensors did land; the failed chunk leaves them as they are, unverified. */
    OK(wsync_recv_fail(it, WSYNC_ERR_MISMATCH, "the engine's embed is of another shape"));
    assert_true(all_zero(g.p.at[EMBED], (size_t)(elems[EMBED] - 16) * 4));
    version_failed_on_both_sides(&g);
    wsync_blob_free(&req);
    rig_stop(&g);
}

/* The checksum is taken as the bytes land and compared with the trainer's: a tensor the trainer
 * wrote after hashing it (its arena, read where it lies, hashed as it was first sent: to engine
 * 1, which loads the version with views) fails the landing engine's apply with INTEGRITY naming
 * it, the iteration's end says the same, and the flush names receiver 0. */
static void a_landed_tensor_that_differs_from_what_the_trainer_hashed_fails_with_integrity(void **state) {
    (void)state;
    struct rig g;
    receivers = 2;
    rig_start(&g, 1, elems[EMBED]);
    receivers = 1;
    wsync_receiver_t *first = engine_at(g.t.init.data, g.t.init.size, 1);
    wsync_blob_t req;
    send_version(&g.t, 1, &req);
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(first, req.data, req.size, &it));
    wsync_tensor_t view;
    bool has = false;
    for (int i = 0; i < NT; ++i) {
        OK(wsync_recv_next(it, &view, &has));
        assert_true(has);
        assert_true(tu_check(view.data, bytes_of(i), 1, (uint64_t)i));
    }
    OK(wsync_recv_end(it));
    ((uint8_t *)g.t.t[TAIL].data)[bytes_of(TAIL) - 1] ^= 1;  /* after the hash, before the pull */
    it = NULL;
    OK(wsync_receiver_receive(g.e, req.data, req.size, &it));
    EXPECT_ERR(wsync_recv_apply(it, g.p.table, 0, NULL), WSYNC_ERR_INTEGRITY, "'tail'");
    EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_INTEGRITY, "checksum mismatch");
    version_failed_on_both_sides(&g);
    assert_null(strstr(wsync_last_error(), "receiver 1"));  /* it loaded what was first sent */
    wsync_blob_free(&req);
    wsync_receiver_destroy(first);
    rig_stop(&g);
}

/* Destinations of different names that share memory (an engine that aliases "embed" and
 * "norm") land neither: both come through the receive buffer (their views are not the
 * destination), and one apply writes both, in the chunk's order. */
static void destinations_of_different_names_that_share_memory_do_not_land(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 0);
    wsync_receiver_t *e = engine(t.init.data, t.init.size);
    uint8_t *mem = calloc(1, bytes_of(EMBED));
    assert_non_null(mem);
    const wsync_dtype_t f32 = {WSYNC_DTYPE_FLOAT, 32, 1};
    wsync_dest_t d[2] = {
        {.name = names[EMBED], .data = mem, .shape = t.shape[EMBED], .ndim = 1, .dtype = f32},
        {.name = names[NORM], .data = mem + 4096, .shape = t.shape[NORM], .ndim = 1, .dtype = f32},
    };
    wsync_dest_table_t *table = NULL;
    OK(wsync_dest_table_create(e, d, 2, &table));
    OK(wsync_receiver_land(e, table));
    wsync_blob_t req;
    send_version(&t, 1, &req);
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(e, req.data, req.size, &it));
    wsync_tensor_t view;
    bool has = false;
    OK(wsync_recv_next(it, &view, &has));
    assert_ptr_not_equal(view.data, mem);  /* not landed */
    assert_true(tu_check(view.data, bytes_of(EMBED), 1, EMBED));
    memcpy(mem, view.data, bytes_of(EMBED));
    wsync_apply_result_t res = {.struct_size = sizeof res};
    OK(wsync_recv_apply(it, table, WSYNC_APPLY_PARTIAL, &res));
    assert_int_equal(res.writes, 1);  /* "norm", over its share of "embed" */
    do OK(wsync_recv_next(it, &view, &has));  /* the tensors this engine does not keep */
    while (has);
    OK(wsync_recv_end(it));
    assert_true(tu_check(mem + 4096, bytes_of(NORM), 1, NORM));
    assert_true(tu_check(mem, 4096, 1, EMBED));
    OK(wsync_sender_flush(t.snd, 5000));
    wsync_blob_free(&req);
    wsync_dest_table_destroy(table);
    wsync_receiver_destroy(e);
    free(mem);
    trainer_stop(&t);
}

/* A tensor split into two parts (two chunks of one version, each pulled in pieces): each part
 * lands at its place in the one destination of the whole tensor (a part's view is that place),
 * and the version completes bit for bit. */
static void each_part_of_a_split_tensor_lands_at_its_place_in_the_tensors_destination(void **state) {
    (void)state;
    struct trainer t;
    trainer_start(&t, 0);
    wsync_receiver_t *e = engine(t.init.data, t.init.size);
    const size_t whole = bytes_of(TAIL), half = whole / 2 / 4 * 4;
    uint8_t *mine = calloc(1, whole);
    assert_non_null(mine);
    wsync_dest_t d = {.name = names[TAIL], .data = mine, .shape = t.shape[TAIL], .ndim = 1,
                      .dtype = {WSYNC_DTYPE_FLOAT, 32, 1}};
    wsync_dest_table_t *table = NULL;
    OK(wsync_dest_table_create(e, &d, 1, &table));
    OK(wsync_receiver_land(e, table));
    write_version(&t, 1);
    const wsync_part_t parts[2] = {{0, half}, {half, whole - half}};
    for (int k = 0; k < 2; ++k) {
        wsync_chunk_t c = tu_chunk(&t.t[TAIL], 1, k ? WSYNC_CHUNK_LAST : 0);
        wsync_blob_t req;
        OK(wsync_sender_send_parts(t.snd, &c, &parts[k], &req));
        wsync_recv_t *it = NULL;
        OK(wsync_receiver_receive(e, req.data, req.size, &it));
        wsync_tensor_t view;
        wsync_part_t part;
        bool has = false;
        OK(wsync_recv_next_part(it, &view, &part, &has));
        assert_true(has);
        assert_int_equal(part.offset, parts[k].offset);
        assert_ptr_equal(view.data, mine + parts[k].offset);  /* landed at its place */
        OK(wsync_recv_end(it));
        wsync_blob_free(&req);
    }
    OK(wsync_sender_flush(t.snd, 5000));
    assert_true(tu_check(mine, whole, 1, TAIL));
    uint64_t done = 0;
    OK(wsync_receiver_completed_version(e, &done));
    assert_int_equal(done, 1);
    wsync_dest_table_destroy(table);  /* the receiver keeps what it needs; mine stays */
    wsync_receiver_destroy(e);
    free(mine);
    trainer_stop(&t);
}

/* --- a trainer that dies mid-chunk (a forked process) ------------------------------------ */
/* Frames from the test: "v" sends version 1 (answered with its request), an empty frame ends it. */
static int trainer_main(const void *cfg, int in, int out) {
    (void)cfg;
    tu_detach_stdio();
    struct trainer t;
    memset(&t, 0, sizeof t);
    if (wsync_strategy_create("ucx", "{" OPTS ",\"receivers\":1}", &t.s) != WSYNC_OK ||
        wsync_strategy_create_init_info(t.s, &t.init) != WSYNC_OK ||
        wsync_sender_create(t.s, t.init.data, t.init.size, &t.snd) != WSYNC_OK ||
        tu_send_frame(out, t.init.data, t.init.size))
        return 2;
    void *data[NT];
    for (int i = 0; i < NT; ++i) {
        data[i] = malloc(bytes_of(i));
        if (!data[i]) return 3;
        t.shape[i][0] = elems[i];
        t.t[i] = tu_tensor(names[i], data[i], t.shape[i], 1, WSYNC_DTYPE_FLOAT, 32);
        tu_fill(data[i], bytes_of(i), 1, (uint64_t)i);
    }
    for (;;) {
        uint8_t *frame;
        size_t len;
        if (tu_recv_frame(in, &frame, &len, 60000)) return 4;
        free(frame);
        if (len == 0) break;
        wsync_blob_t req;
        wsync_chunk_t c = tu_chunk(t.t, NT, WSYNC_CHUNK_LAST);
        if (wsync_sender_send_chunk(t.snd, &c, &req) != WSYNC_OK || tu_send_frame(out, req.data, req.size)) return 5;
        wsync_blob_free(&req);
    }
    return 0;
}

/* The trainer is frozen right after the engine's receive returned, then killed: the apply,
 * which waits for the landed bytes, fails as unreachable within the deadline and a grace; the
 * end says the same; the version is not completed. */
static void a_trainer_killed_mid_chunk_fails_the_apply_and_the_end_as_unreachable(void **state) {
    (void)state;
    if (!tu_kind_here("ucx", "{" OPTS "}")) skip();
    tu_peer_t tr = tu_fork_peer(trainer_main, NULL);
    uint8_t *init, *req;
    size_t len, rlen;
    assert_int_equal(tu_recv_frame(tr.from, &init, &len, 20000), 0);
    wsync_receiver_t *e = engine(init, len);
    struct params p;
    params_make(&p, e, elems[EMBED]);
    OK(wsync_receiver_land(e, p.table));
    assert_int_equal(tu_send_frame(tr.to, "v", 1), 0);
    assert_int_equal(tu_recv_frame(tr.from, &req, &rlen, 20000), 0);
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(e, req, rlen, &it));
    kill(tr.pid, SIGSTOP);
    kill(tr.pid, SIGKILL);
    const long t0 = tu_now_ms();
    EXPECT_ERR(wsync_recv_apply(it, p.table, 0, NULL), WSYNC_ERR_PEER, "unreachable");
    assert_true(tu_now_ms() - t0 <= 5000 + 2500);
    EXPECT_ERR(wsync_recv_end(it), WSYNC_ERR_PEER, "unreachable");
    uint64_t done = 9;
    OK(wsync_receiver_completed_version(e, &done));
    assert_int_equal(done, 0);
    params_free(&p);
    wsync_receiver_destroy(e);
    tu_send_frame(tr.to, NULL, 0);
    close(tr.to);
    close(tr.from);
    tu_wait_child(tr.pid, 20000);
    free(init);
    free(req);
}

/* The call's own refusals: a NULL receiver or a table of another receiver (INVALID_ARGUMENT),
 * an iteration open (WRONG_STATE), a kind that does not land bytes (UNSUPPORTED, NULL OK). */
static void land_refuses_what_it_cannot_do_and_changes_nothing(void **state) {
    (void)state;
    /* An shm receiver, whose kind maps the trainer's memory: nothing to land. */
    wsync_strategy_t *s = NULL;
    wsync_blob_t init;
    wsync_receiver_t *r = NULL;
    OK(wsync_strategy_create("shm", "{\"receivers\":1}", &s));
    OK(wsync_strategy_create_init_info(s, &init));
    OK(wsync_receiver_create(s, init.data, init.size, 0, &r));
    static int64_t shape[1] = {4};
    static float mem[4];
    wsync_dest_t d = {.name = "w", .data = mem, .shape = shape, .ndim = 1, .dtype = {WSYNC_DTYPE_FLOAT, 32, 1}};
    wsync_dest_table_t *table = NULL;
    OK(wsync_dest_table_create(r, &d, 1, &table));
    EXPECT_ERR(wsync_receiver_land(r, table), WSYNC_ERR_UNSUPPORTED, "does not land");
    OK(wsync_receiver_land(r, NULL));

    struct trainer t;
    trainer_start(&t, 0);
    wsync_receiver_t *e = engine(t.init.data, t.init.size);
    struct params p;
    params_make(&p, e, elems[EMBED]);
    EXPECT_ERR(wsync_receiver_land(NULL, p.table), WSYNC_ERR_INVALID_ARGUMENT, "receiver");
    EXPECT_ERR(wsync_receiver_land(e, table), WSYNC_ERR_INVALID_ARGUMENT, "another receiver");
    wsync_blob_t req;
    send_version(&t, 1, &req);
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(e, req.data, req.size, &it));
    EXPECT_ERR(wsync_receiver_land(e, p.table), WSYNC_ERR_WRONG_STATE, "iteration is open");
    OK(wsync_recv_apply(it, p.table, 0, NULL));
    OK(wsync_recv_end(it));
    wsync_blob_free(&req);
    params_free(&p);
    wsync_receiver_destroy(e);
    trainer_stop(&t);
    wsync_dest_table_destroy(table);
    wsync_receiver_destroy(r);
    wsync_blob_free(&init);
    wsync_strategy_destroy(s);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(landed_tensors_are_their_destinations_and_every_destination_loads_bit_exact),
        cmocka_unit_test(a_destination_of_another_shape_is_never_written_by_the_pull),
        cmocka_unit_test(each_part_of_a_split_tensor_lands_at_its_place_in_the_tensors_destination),
        cmocka_unit_test(destinations_of_different_names_that_share_memory_do_not_land),
        cmocka_unit_test(a_landed_tensor_that_differs_from_what_the_trainer_hashed_fails_with_integrity),
        cmocka_unit_test(a_trainer_killed_mid_chunk_fails_the_apply_and_the_end_as_unreachable),
        cmocka_unit_test(land_refuses_what_it_cannot_do_and_changes_nothing),
    };
    signal(SIGPIPE, SIG_IGN);  /* a dead trainer's pipe fails a write, not the test */
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
