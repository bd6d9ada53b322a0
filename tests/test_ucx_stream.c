/* A ucx chunk larger than a piece (4 MiB) is pulled in pieces while the loader reads it
 * (docs/architecture.md, "Pulling while the loader reads"): receive returns once the chunk is
 * leased and every piece asked for, and each tensor is waited for when it is first read. These
 * tests specify what the engine sees: every tensor bit-exact in whatever order it is read, and,
 * when the trainer freezes or dies mid-chunk, the read that waits failing with a named status
 * within the receiver's deadline, the iteration's end saying the same, the version not
 * completed, and no thread left behind. The trainer is a forked process (it can be frozen and
 * killed); the engine is this one, over loopback tcp. */
#include <dirent.h>

#include "testutil.h"

#define OPTS "\"transports\":\"tcp\",\"net_devices\":\"lo\""
/* How chunk bytes travel ("data_path", both sides): over tcp "auto" is the data stream (one
 * plain TCP connection, src/transport/ucx/stream.hpp); the *_as_active_messages tests run the
 * same specification with "ucx" (UCX's rendezvous). The forked trainer inherits it. */
static const char *data_path = "auto";

/* The model: five float32 tensors, 64 MiB in all; tensors straddle pieces and the last one
 * ends the chunk, so it lands last. */
enum { NT = 5 };
static const char *const names[NT] = {"a", "b", "c", "d", "tail"};
static const int64_t elems[NT] = {(3 << 20) / 4 + 16, (9 << 20) / 4, 256, (12 << 20) / 4, (40 << 20) / 4 - 272};

/* --- the trainer process ------------------------------------------------------------------ */
/* Frames from the test: "v" sends the next version (answered with its request frame), "f"
 * flushes (answered with one byte: the flush's status), an empty frame ends it. */
static int trainer_main(const void *cfg, int in, int out) {
    (void)cfg;
    tu_detach_stdio();
    wsync_strategy_t *s = NULL;
    wsync_blob_t init, req;
    wsync_sender_t *snd = NULL;
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"receivers\":1,\"timeout_ms\":20000,\"data_path\":\"%s\"}", data_path);
    if (wsync_strategy_create("ucx", o, &s) != WSYNC_OK ||
        wsync_strategy_create_init_info(s, &init) != WSYNC_OK ||
        wsync_sender_create(s, init.data, init.size, &snd) != WSYNC_OK || tu_send_frame(out, init.data, init.size))
        return 2;
    void *data[NT];
    int64_t shape[NT][1];
    wsync_tensor_t t[NT];
    for (int i = 0; i < NT; ++i) {
        data[i] = malloc((size_t)elems[i] * 4);
        if (!data[i]) return 3;
        shape[i][0] = elems[i];
        t[i] = tu_tensor(names[i], data[i], shape[i], 1, WSYNC_DTYPE_FLOAT, 32);
    }
    for (uint64_t v = 1;;) {
        uint8_t *frame;
        size_t len;
        if (tu_recv_frame(in, &frame, &len, 60000)) return 4;
        if (len == 0) break;
        const char what = (char)frame[0];
        free(frame);
        if (what == 'v') {
            for (int i = 0; i < NT; ++i) tu_fill(data[i], (size_t)elems[i] * 4, v, (uint64_t)i);
            wsync_chunk_t c = tu_chunk(t, NT, WSYNC_CHUNK_LAST);
            if (wsync_sender_send_chunk(snd, &c, &req) != WSYNC_OK || tu_send_frame(out, req.data, req.size)) return 5;
            wsync_blob_free(&req);
            ++v;
        } else {
            const uint8_t st = (uint8_t)wsync_sender_flush(snd, 10000);
            if (tu_write_all(out, &st, 1)) return 6;
        }
    }
    wsync_sender_destroy(snd);
    wsync_blob_free(&init);
    wsync_strategy_destroy(s);
    return 0;
}

/* --- the engine (this process) ------------------------------------------------------------ */
struct rig {
    tu_peer_t trainer;
    wsync_receiver_t *r;
    int threads_before;
};

static int threads_now(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static void need_ucx(void) {
    wsync_strategy_t *s = NULL;
    if (wsync_strategy_create("ucx", "{" OPTS "}", &s) != WSYNC_OK) skip();
    wsync_strategy_destroy(s);
}

static void rig_start(struct rig *g, int64_t timeout_ms) {
    need_ucx();
    g->threads_before = threads_now();
    g->trainer = tu_fork_peer(trainer_main, NULL);
    uint8_t *init;
    size_t len;
    assert_int_equal(tu_recv_frame(g->trainer.from, &init, &len, 20000), 0);
    char o[256];
    snprintf(o, sizeof o, "{" OPTS ",\"timeout_ms\":%lld,\"data_path\":\"%s\"}", (long long)timeout_ms, data_path);
    wsync_strategy_t *s = NULL;
    OK(wsync_strategy_create("ucx", o, &s));
    OK(wsync_receiver_create(s, init, len, 0, &g->r));
    wsync_strategy_destroy(s);
    free(init);
}

/* Asks the trainer for the next version; returns its request (malloc'd). */
static uint8_t *next_version(struct rig *g, size_t *len) {
    assert_int_equal(tu_send_frame(g->trainer.to, "v", 1), 0);
    uint8_t *req;
    assert_int_equal(tu_recv_frame(g->trainer.from, &req, len, 20000), 0);
    return req;
}

/* Destroys the receiver (bounded: within its deadline and a grace) and ends the trainer (killed
 * when `frozen`); no thread of the receiver's is left in this process. */
static void rig_stop(struct rig *g, int64_t destroy_within_ms, int frozen) {
    const long t0 = tu_now_ms();
    wsync_receiver_destroy(g->r);
    assert_true(tu_now_ms() - t0 <= destroy_within_ms);
    if (frozen) kill(g->trainer.pid, SIGKILL);
    tu_send_frame(g->trainer.to, NULL, 0);
    close(g->trainer.to);
    close(g->trainer.from);
    tu_wait_child(g->trainer.pid, 20000);
    /* UCX's own threads may linger a moment after its context goes: poll briefly. */
    for (long t = tu_now_ms(); threads_now() > g->threads_before && tu_now_ms() - t < 2000;) usleep(10000);
    assert_int_equal(threads_now(), g->threads_before);
}

static int index_of(const char *name) {
    for (int i = 0; i < NT; ++i)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

static void a_chunk_larger_than_a_piece_loads_bit_exact_in_whatever_order_the_loader_reads_it(void **state) {
    (void)state;
    struct rig g;
    rig_start(&g, 20000);
    void *mine = malloc((size_t)elems[NT - 1] * 4);
    assert_non_null(mine);
    for (uint64_t v = 1; v <= 3; ++v) {
        size_t len;
        uint8_t *req = next_version(&g, &len);
        /* Over the data stream the trainer hashes the chunk as it sends it: the request carries
         * no checksums and says they follow the bytes; over UCX they are in its table. */
        char *desc = NULL;
        OK(wsync_blob_describe(req, len, &desc));
        const int stream = strcmp(data_path, "auto") == 0;
        assert_true((strstr(desc, "\"sums_follow\"") != NULL) == stream);
        assert_true((strstr(desc, "\"tree\"") != NULL) == !stream);
        wsync_string_free(desc);
        wsync_recv_t *it = NULL;
        OK(wsync_receiver_receive(g.r, req, len, &it));
        free(req);
        /* Versions 1 and 3 read the last tensor (the chunk's last bytes) first, by a copy; the
         * views then yield the others in order. Version 2 reads views in order only. */
        if (v != 2) {
            OK(wsync_recv_copy(it, NT - 1, 0, mine, (uint64_t)elems[NT - 1] * 4));
            assert_true(tu_check(mine, (size_t)elems[NT - 1] * 4, v, NT - 1));
        }
        int seen = v != 2;
        for (;;) {
            wsync_tensor_t view;
            bool has = false;
            OK(wsync_recv_next(it, &view, &has));
            if (!has) break;
            const int i = index_of(view.name);
            assert_true(i >= 0);
            assert_true(tu_check(view.data, (size_t)elems[i] * 4, v, (uint64_t)i));
            ++seen;
        }
        assert_int_equal(seen, NT);
        OK(wsync_recv_end(it));
        assert_int_equal(tu_send_frame(g.trainer.to, "f", 1), 0);
        assert_int_equal(tu_peer_byte(&g.trainer, 15000), WSYNC_OK);  /* the trainer's flush: OK */
        uint64_t done = 0;
        OK(wsync_receiver_completed_version(g.r, &done));
        assert_int_equal(done, v);
    }
    free(mine);
    rig_stop(&g, 3000, 0);
}

/* Starts the rig, receives version 1's chunk and freezes the trainer (SIGSTOP) right after the
 * receive returned: the last tensor cannot land. Returns the open iteration. */
static wsync_recv_t *receive_then_freeze(struct rig *g, int64_t timeout_ms) {
    rig_start(g, timeout_ms);
    size_t len;
    uint8_t *req = next_version(g, &len);
    wsync_recv_t *it = NULL;
    OK(wsync_receiver_receive(g->r, req, len, &it));
    free(req);
    kill(g->trainer.pid, SIGSTOP);
    return it;
}

/* The trainer freezes or dies (SIGKILL after freezing, so no more bytes leave it) right after
 * the engine's receive returned. */
static void mid_chunk(int sig, wsync_status_t want, const char *needle) {
    const int64_t timeout_ms = 1500;
    struct rig g;
    wsync_recv_t *it = receive_then_freeze(&g, timeout_ms);
    if (sig == SIGKILL) kill(g.trainer.pid, SIGKILL);
    const long t0 = tu_now_ms();
    void *mine = malloc((size_t)elems[NT - 1] * 4);
    assert_non_null(mine);
    EXPECT_ERR(wsync_recv_copy(it, NT - 1, 0, mine, (uint64_t)elems[NT - 1] * 4), want, needle);
    assert_non_null(strstr(wsync_last_error(), "chunk 0 of version 1"));
    assert_true(tu_now_ms() - t0 <= timeout_ms + 2500);  /* the pull's deadline, and its grace */
    free(mine);
    /* The iteration's end says the same; the version is not completed, it failed here. */
    EXPECT_ERR(wsync_recv_end(it), want, needle);
    wsync_receiver_state_t st = {.struct_size = sizeof st};
    OK(wsync_receiver_poll(g.r, &st));
    assert_int_equal(st.completed_version, 0);
    assert_int_equal(st.failed_version, 1);
    rig_stop(&g, 3000, 1);
}

static void a_trainer_frozen_mid_chunk_fails_the_read_that_waits_for_it_by_the_deadline(void **state) {
    (void)state;
    mid_chunk(SIGSTOP, WSYNC_ERR_TIMEOUT, "did not finish within 1500 ms");
}

static void a_trainer_killed_mid_chunk_fails_the_read_that_waits_for_it_as_unreachable(void **state) {
    (void)state;
    mid_chunk(SIGKILL, WSYNC_ERR_PEER, "unreachable");
}

static void the_same_chunks_load_bit_exact_as_active_messages(void **state) {
    data_path = "ucx";
    a_chunk_larger_than_a_piece_loads_bit_exact_in_whatever_order_the_loader_reads_it(state);
    data_path = "auto";
}

static void a_trainer_frozen_mid_chunk_fails_the_same_way_as_active_messages(void **state) {
    data_path = "ucx";
    a_trainer_frozen_mid_chunk_fails_the_read_that_waits_for_it_by_the_deadline(state);
    data_path = "auto";
}

static void a_trainer_killed_mid_chunk_fails_the_same_way_as_active_messages(void **state) {
    data_path = "ucx";
    a_trainer_killed_mid_chunk_fails_the_read_that_waits_for_it_as_unreachable(state);
    data_path = "auto";
}

static void a_receiver_destroyed_mid_chunk_returns_within_its_deadline_and_leaves_no_thread(void **state) {
    (void)state;
    const int64_t timeout_ms = 1500;
    struct rig g;
    (void)receive_then_freeze(&g, timeout_ms);
    /* The iteration is still open: destroying the receiver ends it (and the pull) too. */
    rig_stop(&g, timeout_ms + 3000, 1);
}

int main(int argc, char **argv) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_chunk_larger_than_a_piece_loads_bit_exact_in_whatever_order_the_loader_reads_it),
        cmocka_unit_test(a_trainer_frozen_mid_chunk_fails_the_read_that_waits_for_it_by_the_deadline),
        cmocka_unit_test(a_trainer_killed_mid_chunk_fails_the_read_that_waits_for_it_as_unreachable),
        cmocka_unit_test(a_receiver_destroyed_mid_chunk_returns_within_its_deadline_and_leaves_no_thread),
        cmocka_unit_test(the_same_chunks_load_bit_exact_as_active_messages),
        cmocka_unit_test(a_trainer_frozen_mid_chunk_fails_the_same_way_as_active_messages),
        cmocka_unit_test(a_trainer_killed_mid_chunk_fails_the_same_way_as_active_messages),
    };
    signal(SIGPIPE, SIG_IGN);  /* a dead trainer's pipe fails a write, not the test */
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
