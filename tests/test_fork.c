/* Processes fork: a tokenizer or data-loader worker started with fork() inherits every
 * descriptor of the engine or trainer that started it. Specified across real processes (issue
 * 38): a killed parent is dead to its peers while its forked worker lives on, its place is free
 * at once, the child cannot use or tear down the parent's objects, the rendezvous hands the
 * segment over only from the process that made it and only to its own user, and a file-size
 * limit below the segment's size is a status, never the signal SIGXFSZ. The twins on cuda_ipc
 * (fake driver) are in test_gpu_strategies.c. */
#define _GNU_SOURCE
#include <sys/resource.h>
#include <sys/stat.h>

#include "txn_harness.h"
#include "fork_util.h"

/* A worker the engine forked: engine_main's "F" answers its pid. */
static pid_t fork_worker_in(tu_peer_t *e) {
    uint8_t f = 'F';
    assert_int_equal(tu_send_frame(e->to, &f, 1), 0);
    int32_t pid = 0;
    assert_int_equal(tu_read_all(e->from, &pid, sizeof pid, 5000), 0);
    assert_true(pid > 0);
    return (pid_t)pid;
}

/* An engine forks a worker (which keeps every descriptor, as a tokenizer pool started with
 * fork does) and is then SIGKILLed mid-version while the worker lives on. Trainer: the flush of
 * that version fails with PEER naming receiver 1 within 1 s though its deadline is 20 s, the
 * record saying DIED; before, the worker's copy of the engine's lock kept it "alive" until the
 * deadline (TIMEOUT). Restarted engine: takes index 1 at once, with the worker still alive
 * (before: "already attached"). Both engines: the next two versions bit-exact. Left behind:
 * nothing (the worker is killed by the test). */
static void an_engine_whose_forked_worker_outlives_it_is_dead_at_once_and_its_index_free(
    void **state) {
    (void)state;
    trainer_t *tr = trainer_new("{\"receivers\": 2, \"bucket_bytes\": 65536}");
    engines_t es;
    start_engines(&es, tr, 2, MODE_LOAD);
    tu_peer_t *e = es.e, **both = es.all;
    send_version_to(tr, 1, both, 2);
    OK(wsync_sender_flush(tr->sender, 5000));
    pid_t worker = fork_worker_in(&e[1]);
    OK(send_chunk_to(tr, 2, 0, both, 2));
    assert_int_equal(tu_peer_byte(&e[0], 5000), 0);
    assert_int_equal(tu_peer_byte(&e[1], 5000), 0);
    kill(e[1].pid, SIGKILL); /* version 2 half-loaded; its worker lives on */
    assert_int_equal(tu_wait_child(e[1].pid, 5000), 128 + SIGKILL);
    close(e[1].to);
    close(e[1].from);
    assert_int_equal(kill(worker, 0), 0);
    OK(send_chunk_to(tr, 2, 1, both, 1));
    assert_int_equal(tu_peer_byte(&e[0], 5000), 0);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(tr->sender, 20000), WSYNC_ERR_PEER, "receiver 1");
    assert_true(tu_now_ms() - t0 < 1000);
    wsync_failure_t f = failure(tr, 0);
    assert_int_equal(f.what, WSYNC_FAILURE_DIED);
    assert_int_equal(f.receiver, 1);
    e[1] = start_engine(&es.cfg[1], tr, 1, MODE_LOAD); /* at once: the worker is still alive */
    for (uint64_t v = 3; v <= 4; ++v) {
        send_version_to(tr, v, both, 2);
        OK(wsync_sender_flush(tr->sender, 5000));
    }
    kill(worker, SIGKILL); /* init reaps it: the dead engine was its parent */
    stop_engine(&e[0]);
    stop_engine(&e[1]);
    assert_false(tu_segment_named_in(tr->init.data, tr->init.size));
    trainer_free(tr);
}

/* A trainer in its own process: creates a shm sender with the options given, forks a worker
 * when asked (it keeps every descriptor and lives until killed), sends its init info and the
 * worker's pid (4 bytes, 0 for none), then on a byte from the test sends chunk 0 of version 1
 * and waits to be killed with that version open. */
typedef struct {
    const char *options;
    int fork_worker;
} trainer_cfg_t;

static int trainer_main(const void *p, int in, int out) {
    const trainer_cfg_t *cfg = (const trainer_cfg_t *)p;
    trainer_t *tr = trainer_new(cfg->options);
    int32_t worker = 0;
    if (cfg->fork_worker) {
        pid_t w = fork();
        if (w == 0) {
            tu_detach_stdio(); /* keeps every other descriptor */
            for (;;) pause();
        }
        worker = (int32_t)w;
    }
    if (tu_send_frame(out, tr->init.data, tr->init.size) != 0) return 1;
    if (tu_send_frame(out, &worker, sizeof worker) != 0) return 1;
    uint8_t go;
    if (tu_read_all(in, &go, 1, 20000) != 0) return 2;
    for (int k = 0; k < 2; ++k) tu_fill(tr->data[k], TBYTES, 1, (uint64_t)k);
    wsync_chunk_t ch = tu_chunk(tr->t, 2, 0);
    wsync_blob_t req;
    if (wsync_sender_send_chunk(tr->sender, &ch, &req) != WSYNC_OK) return 3;
    tu_send_frame(out, req.data, req.size);
    for (;;) pause(); /* killed here, version 1 open */
    return 0;
}

typedef struct {
    tu_peer_t peer;
    wsync_blob_t init; /* the trainer's init info (data malloc'd here) */
    pid_t worker;
} far_trainer_t;

static far_trainer_t start_far_trainer(const trainer_cfg_t *cfg) {
    far_trainer_t t;
    t.peer = tu_fork_peer(trainer_main, cfg);
    uint8_t *init, *w;
    size_t n, wn;
    assert_int_equal(tu_recv_frame(t.peer.from, &init, &n, 10000), 0);
    assert_int_equal(tu_recv_frame(t.peer.from, &w, &wn, 10000), 0);
    assert_int_equal(wn, 4);
    int32_t worker;
    memcpy(&worker, w, 4);
    free(w);
    t.init.data = init;
    t.init.size = n;
    t.worker = (pid_t)worker;
    return t;
}

/* Receives the far trainer's chunk 0 of version 1 on r. */
static void receive_first_chunk(far_trainer_t *t, wsync_receiver_t *r) {
    uint8_t go = 1;
    tu_write_all(t->peer.to, &go, 1);
    uint8_t *req;
    size_t len;
    assert_int_equal(tu_recv_frame(t->peer.from, &req, &len, 10000), 0);
    wsync_recv_t *it;
    OK(wsync_receiver_receive(r, req, len, &it));
    wsync_tensor_t v;
    bool has = true;
    while (has) OK(wsync_recv_next(it, &v, &has));
    OK(wsync_recv_end(it));
    free(req);
}

static void end_far_trainer(far_trainer_t *t) {
    if (t->worker > 0) kill(t->worker, SIGKILL); /* init reaps it: the trainer was its parent */
    close(t->peer.to);
    close(t->peer.from);
    free(t->init.data);
}

/* The trainer forks a worker and is SIGKILLed with version 1 open while the worker lives on.
 * Engine 0 (attached, chunk 0 loaded): its next poll, within 100 ms, says SENDER_GONE with
 * version 1 failed (PEER) and nothing completed; before, the worker's copy of the trainer's
 * lock kept the dead trainer "live" forever. A new engine for index 1 (the segment's name still
 * exists): refused at once, UNAVAILABLE naming the gone sender, and its name then removed
 * (before: attached to the dead board as if it were live). Engine 0 restarted (the name is
 * gone, so through the rendezvous): UNAVAILABLE within 1 s (before: the worker kept the socket
 * bound and the engine waited out its 3 s deadline). Left behind: nothing in /dev/shm. */
static void a_trainer_whose_forked_worker_outlives_it_is_gone_to_engines_and_refuses_new_ones(
    void **state) {
    (void)state;
    const trainer_cfg_t cfg = {"{\"receivers\": 2, \"bucket_bytes\": 65536}", 1};
    far_trainer_t t = start_far_trainer(&cfg);
    assert_true(t.worker > 0);
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("shm", "{\"timeout_ms\": 3000}", &s));
    OK(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r));
    receive_first_chunk(&t, r);
    wsync_receiver_state_t st = {.struct_size = sizeof st};
    OK(wsync_receiver_poll(r, &st));
    assert_int_equal(st.open_version, 1);
    assert_int_equal(st.flags & WSYNC_RECEIVER_SENDER_GONE, 0);
    kill(t.peer.pid, SIGKILL);
    assert_int_equal(tu_wait_child(t.peer.pid, 5000), 128 + SIGKILL);
    assert_int_equal(kill(t.worker, 0), 0);
    long t0 = tu_now_ms();
    OK(wsync_receiver_poll(r, &st));
    assert_true(tu_now_ms() - t0 < 100);
    assert_true(st.flags & WSYNC_RECEIVER_SENDER_GONE);
    assert_int_equal(st.open_version, 0);
    assert_int_equal(st.failed_version, 1);
    assert_int_equal(st.failed_status, WSYNC_ERR_PEER);
    assert_int_equal(st.completed_version, 0);
    assert_true(tu_segment_named_in(t.init.data, t.init.size)); /* index 1 never attached */
    wsync_receiver_t *late = NULL;
    t0 = tu_now_ms();
    EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 1, &late), WSYNC_ERR_UNAVAILABLE,
               "sender of this segment is gone");
    assert_true(tu_now_ms() - t0 < 1000);
    assert_null(late);
    assert_false(tu_segment_named_in(t.init.data, t.init.size));
    wsync_receiver_destroy(r);
    t0 = tu_now_ms();
    EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r), WSYNC_ERR_UNAVAILABLE,
               "the sender is gone");
    assert_true(tu_now_ms() - t0 < 1000);
    wsync_strategy_destroy(s);
    end_far_trainer(&t);
}

/* A child forked by a trainer or an engine holds copies of their objects, not the objects.
 * Trainer's child: send_chunk, flush and create_init_info on the copies are WRONG_STATE naming
 * the fork, destroying them leaves the parent's as they are, and a strategy it makes itself
 * works (init info made and destroyed). Engine's child: poll and completed_version refused
 * alike, its destroy a no-op. Parent trainer and engine: the next two versions bit-exact,
 * flush OK (the children's destroys abandoned nothing and removed nothing). */
static int trainer_child_main(trainer_t *tr) {
    wsync_blob_t req;
    wsync_chunk_t ch = tu_chunk(tr->t, 2, 0);
    if (wsync_sender_send_chunk(tr->sender, &ch, &req) != WSYNC_ERR_WRONG_STATE) return 1;
    if (!strstr(wsync_last_error(), "forked")) return 2;
    if (wsync_sender_flush(tr->sender, 100) != WSYNC_ERR_WRONG_STATE) return 3;
    wsync_blob_t again;
    if (wsync_strategy_create_init_info(tr->strategy, &again) != WSYNC_ERR_WRONG_STATE) return 4;
    wsync_sender_destroy(tr->sender); /* copies: left as they are */
    wsync_strategy_destroy(tr->strategy);
    wsync_strategy_t *own;
    wsync_blob_t init;
    if (wsync_strategy_create("shm", "{\"bucket_bytes\": 4096}", &own) != WSYNC_OK) return 5;
    if (wsync_strategy_create_init_info(own, &init) != WSYNC_OK) return 6;
    wsync_blob_free(&init);
    wsync_strategy_destroy(own);
    return 0;
}

static void a_forked_child_cannot_use_or_tear_down_its_parents_objects(void **state) {
    (void)state;
    trainer_t *tr = trainer_new("{\"receivers\": 1, \"bucket_bytes\": 65536}");
    engines_t es;
    start_engines(&es, tr, 1, MODE_LOAD);
    send_version_to(tr, 1, es.all, 1);
    OK(wsync_sender_flush(tr->sender, 5000));
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) _exit(trainer_child_main(tr));
    assert_int_equal(tu_wait_child(c, 5000), 0);
    uint8_t u = 'U';
    assert_int_equal(tu_send_frame(es.e[0].to, &u, 1), 0);
    assert_int_equal(tu_peer_byte(&es.e[0], 5000), 0);
    for (uint64_t v = 2; v <= 3; ++v) {
        send_version_to(tr, v, es.all, 1);
        OK(wsync_sender_flush(tr->sender, 5000));
    }
    stop_engine(&es.e[0]);
    trainer_free(tr);
}

/* Once the trainer is dead and every engine attached (so the segment's name is gone), an
 * impostor binds the trainer's rendezvous name. A process of another user serving its own
 * memory: a restarting engine refuses it, UNAVAILABLE naming its uid, before accepting any
 * descriptor (before: attached, OK, to that user's bytes). A process of the trainer's user
 * serving the real segment (it opened the name while it existed): refused, UNAVAILABLE, as not
 * the process that created the segment. Skips the other-user half where this process cannot
 * switch users (not root). */
static void a_rendezvous_served_by_anyone_but_the_trainer_is_refused_by_name(void **state) {
    (void)state;
    const trainer_cfg_t cfg = {"{\"receivers\": 1, \"bucket_bytes\": 65536}", 0};
    far_trainer_t t = start_far_trainer(&cfg);
    char segment[128], rendezvous[128];
    tu_init_field(&t.init, "segment", segment, sizeof segment);
    tu_init_field(&t.init, "rendezvous", rendezvous, sizeof rendezvous);
    int stolen = shm_open(segment, O_RDWR, 0); /* while the name exists */
    assert_true(stolen >= 0);
    struct stat sb;
    assert_int_equal(fstat(stolen, &sb), 0);
    wsync_strategy_t *s;
    wsync_receiver_t *r;
    OK(wsync_strategy_create("shm", "{\"timeout_ms\": 3000}", &s));
    OK(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r));
    assert_false(tu_segment_named_in(t.init.data, t.init.size));
    wsync_receiver_destroy(r);
    kill(t.peer.pid, SIGKILL);
    assert_int_equal(tu_wait_child(t.peer.pid, 5000), 128 + SIGKILL);

    const tu_impostor_cfg_t same = {rendezvous, stolen, 0, 0};
    tu_peer_t imp = tu_fork_peer(tu_impostor_main, &same);
    assert_int_equal(tu_peer_byte(&imp, 5000), 0);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d", (int)imp.pid);
    EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r), WSYNC_ERR_UNAVAILABLE,
               "is not the one that created it");
    assert_non_null(strstr(wsync_last_error(), pid));
    kill(imp.pid, SIGKILL);
    tu_wait_child(imp.pid, 5000);
    close(imp.to), close(imp.from);

    int other_user_ran = 0;
    if (geteuid() == 0) {
        const tu_impostor_cfg_t other = {rendezvous, -1, 65534, (size_t)sb.st_size};
        imp = tu_fork_peer(tu_impostor_main, &other);
        uint8_t ready = tu_peer_byte(&imp, 5000);
        if (ready == 0) {
            EXPECT_ERR(wsync_receiver_create(s, t.init.data, t.init.size, 0, &r),
                       WSYNC_ERR_UNAVAILABLE, "uid 65534");
            assert_non_null(strstr(wsync_last_error(), "not this user's"));
            other_user_ran = 1;
        }
        kill(imp.pid, SIGKILL);
        tu_wait_child(imp.pid, 5000);
        close(imp.to), close(imp.from);
    }
    close(stolen);
    wsync_strategy_destroy(s);
    end_far_trainer(&t);
    if (!other_user_ran) {
        print_message("skipped the other-user impostor: this process cannot switch users "
                      "(needs root, and uid 65534)\n");
        skip();
    }
}

/* A file-size limit (ulimit -f) below the segment's size: growing the segment would raise
 * SIGXFSZ and end the trainer, which did not ignore it. In a child with RLIMIT_FSIZE at 1 MiB,
 * create_init_info of a 4 MiB segment returns NO_MEMORY naming RLIMIT_FSIZE and the child lives
 * on; a segment under the limit is still made. Left behind: nothing in /dev/shm. */
static int fsize_child_main(void) {
    struct rlimit lim = {1 << 20, RLIM_INFINITY};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) return 20;
    wsync_strategy_t *s;
    wsync_blob_t init;
    if (wsync_strategy_create("shm", "{\"buckets\": 2, \"bucket_bytes\": 2097152}", &s) != WSYNC_OK)
        return 1;
    if (wsync_strategy_create_init_info(s, &init) != WSYNC_ERR_NO_MEMORY) return 2;
    if (!strstr(wsync_last_error(), "RLIMIT_FSIZE")) return 3;
    wsync_strategy_destroy(s);
    if (wsync_strategy_create("shm", "{\"buckets\": 2, \"bucket_bytes\": 65536}", &s) != WSYNC_OK)
        return 4;
    if (wsync_strategy_create_init_info(s, &init) != WSYNC_OK) return 5;
    wsync_blob_free(&init);
    wsync_strategy_destroy(s);
    return 0;
}

static void a_file_size_limit_below_the_segment_is_a_status_not_a_signal(void **state) {
    (void)state;
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) _exit(fsize_child_main());
    assert_int_equal(tu_wait_child(c, 10000), 0); /* not 128 + SIGXFSZ */
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(an_engine_whose_forked_worker_outlives_it_is_dead_at_once_and_its_index_free),
    cmocka_unit_test(a_trainer_whose_forked_worker_outlives_it_is_gone_to_engines_and_refuses_new_ones),
    cmocka_unit_test(a_forked_child_cannot_use_or_tear_down_its_parents_objects),
    cmocka_unit_test(a_rendezvous_served_by_anyone_but_the_trainer_is_refused_by_name),
    cmocka_unit_test(a_file_size_limit_below_the_segment_is_a_status_not_a_signal),
};

TU_MAIN(tests)
