/* The conformance suite: the transaction and failure specifications every kind must pass, run
 * per kind (CTest: conformance.<kind>.<spec>, the kind in $WSYNC_CONFORMANCE_KIND) from one rig
 * (rig.h). A version arrives complete and bit-exact on an engine, or the engine and the trainer
 * both get a named reason within a deadline, and nobody serves a mix. Where a kind differs, the
 * specification asks its capabilities (docs/conformance.md); a specification a kind's
 * capabilities rule out is skipped saying which capability. */
#define _GNU_SOURCE
#include "conformance/rig.h"

static const int kOne[1] = {0}, kTwo[2] = {0, 1}, kThree[3] = {0, 1, 2};

static void need(bool capability, const char *what) {
    if (capability) return;
    fprintf(stderr, "not applicable: the kind's capabilities say %s\n", what);
    skip();
}

/* A loader that fails after taking every view of version 2's last chunk. Trainer: the flush
 * fails with PEER carrying the engine's status and message, once, as text and as fields.
 * Engine: version 2 does not complete; version 3 then completes bit-exact. */
static void loader_failure_after_the_last_view_reaches_the_trainer_once(void **state) {
    (void)state;
    rig_t *r = rig_begin(1);
    const int modes[1] = {FAIL_V2_LAST_CHUNK};
    rig_open(r, 1, 0, modes);
    rig_send_version(r, 1, kOne, 1);
    OK(wsync_sender_flush(r->sender, 5000));
    OK(rig_send_chunk(r, 2, 0, kOne, 1));
    assert_int_equal(rig_answer(r, 0), 0);
    OK(rig_send_chunk(r, 2, 1, kOne, 1));
    assert_int_equal(rig_answer(r, 0), WSYNC_ERR_MISMATCH);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(r->sender, 5000), WSYNC_ERR_PEER,
               "failed chunk 1 of version 2: WSYNC_ERR_MISMATCH: engine cannot load 'layers.1.k.weight'");
    assert_true(tu_now_ms() - t0 < 1000);
    assert_int_equal(rig_failure_count(r), 1);
    wsync_failure_t f = rig_failure(r, 0);
    assert_int_equal(f.what, WSYNC_FAILURE_FAILED);
    assert_int_equal(f.status, WSYNC_ERR_MISMATCH);
    assert_int_equal(f.receiver, 0);
    assert_int_equal(f.version, 2);
    assert_int_equal(f.chunk_index, 1);
    assert_int_equal(f.pid, r->e[0].pid);
    rig_poll_t p = rig_poll(r, 0);
    assert_int_equal(p.completed_version, 1);
    assert_int_equal(p.failed_version, 2);
    OK(wsync_sender_flush(r->sender, 1000)); /* reported once */
    rig_send_version(r, 3, kOne, 1);
    OK(wsync_sender_flush(r->sender, 5000));
    rig_end(r);
}

/* Version 1 failed by two engines: engine 0 fails its chunk 0 (MISMATCH), engine 1 its chunk 1
 * (INTEGRITY), both published before either engine loads. Trainer: one flush fails with PEER
 * and holds both records, each with its own receiver, status, chunk and message; the next
 * flush reports neither again. Engines: neither completes version 1; version 2 completes on
 * both. */
static void a_version_failed_by_two_engines_reports_both_once(void **state) {
    (void)state;
    rig_t *r = rig_begin(2);
    const int modes[2] = {FAIL_V1_CHUNK0, FAIL_V1_CHUNK1};
    rig_open(r, 2, 0, modes);
    wsync_blob_t req[2];
    for (int c = 0; c < 2; ++c) OK(rig_publish(r, 1, c, &req[c]));
    for (int c = 0; c < 2; ++c) rig_deliver(r, &req[c], kTwo, 2), wsync_blob_free(&req[c]);
    assert_int_equal(rig_answer(r, 0), WSYNC_ERR_MISMATCH);
    assert_int_equal(rig_answer(r, 0), WSYNC_ERR_SKIPPED); /* the rest of a failed version */
    assert_int_equal(rig_answer(r, 1), 0);
    assert_int_equal(rig_answer(r, 1), WSYNC_ERR_INTEGRITY);
    long t0 = tu_now_ms();
    wsync_status_t st = wsync_sender_flush(r->sender, 5000);
    assert_int_equal(st, WSYNC_ERR_PEER);
    assert_true(tu_now_ms() - t0 < 1000);
    size_t n = rig_failure_count(r);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; ++i) {
        wsync_failure_t f = rig_failure(r, i);
        assert_int_equal(f.what, WSYNC_FAILURE_FAILED);
        assert_int_equal(f.version, 1);
        assert_int_equal(f.status, f.receiver == 0 ? WSYNC_ERR_MISMATCH : WSYNC_ERR_INTEGRITY);
        assert_int_equal(f.chunk_index, f.receiver == 0 ? 0 : 1);
        assert_non_null(strstr(f.message, f.receiver == 0 ? "layers.0.q.weight" : "corrupt"));
    }
    assert_int_not_equal(rig_failure(r, 0).receiver, rig_failure(r, 1).receiver);
    OK(wsync_sender_flush(r->sender, 5000)); /* reported once */
    for (int i = 0; i < 2; ++i) assert_int_equal(rig_poll(r, i).completed_version, 0);
    rig_send_version(r, 2, kTwo, 2);
    OK(wsync_sender_flush(r->sender, 5000));
    rig_end(r);
}

/* Three engines; engine 2 is SIGKILLed after version 1. Trainer: the flush of version 2 fails
 * with PEER naming receiver 2 as died, within 2 s. With "drop_receiver", it drops receiver 2
 * and the other two complete versions 2 to 5 bit-exact. "collective": nobody completes
 * version 2 (each engine gets a named reason), drop is UNSUPPORTED. */
static void a_killed_engine_is_named_and_the_others_go_on_or_fail_by_name(void **state) {
    (void)state;
    rig_t *r = rig_begin(3);
    rig_open(r, 3, 0, NULL);
    rig_send_version(r, 1, kThree, 3);
    OK(wsync_sender_flush(r->sender, 5000));
    rig_engine_kill(r, 2);
    if (r->caps.collective) {
        /* Version 2 to the survivors: each completes it bit-exact or fails it by name (never
         * 50 or 51: a mix); the trainer's flush fails within its deadline. */
        long t0 = tu_now_ms();
        for (int c = 0; c < 2; ++c) {
            if (rig_send_chunk(r, 2, c, kTwo, 2) != WSYNC_OK) break;
            for (int i = 0; i < 2; ++i) assert_true(rig_answer(r, i) < 50);
        }
        wsync_status_t st = wsync_sender_flush(r->sender, 5000);
        assert_true(st == WSYNC_ERR_PEER || st == WSYNC_ERR_TIMEOUT);
        assert_true(tu_now_ms() - t0 < 12000);
        EXPECT_ERR(wsync_sender_drop_receiver(r->sender, 2), WSYNC_ERR_UNSUPPORTED, "");
        rig_end(r);
        return;
    }
    rig_send_version(r, 2, kTwo, 2);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(r->sender, 5000), WSYNC_ERR_PEER, "receiver 2");
    assert_true(tu_now_ms() - t0 < 2000);
    wsync_failure_t f = rig_failure(r, 0);
    assert_int_equal(f.what, WSYNC_FAILURE_DIED);
    assert_int_equal(f.receiver, 2);
    need(r->caps.drop_receiver, "drop_receiver: false, yet the kind is not collective");
    OK(wsync_sender_drop_receiver(r->sender, 2));
    OK(wsync_sender_flush(r->sender, 5000)); /* version 2 is complete on the other two */
    for (uint64_t v = 3; v <= 5; ++v) {
        rig_send_version(r, v, kTwo, 2);
        OK(wsync_sender_flush(r->sender, 5000));
    }
    rig_end(r);
}

/* A frozen engine (SIGSTOP) with version 1 sent. Trainer: the flush ends in TIMEOUT at its
 * 300 ms deadline naming it (as a field too). With "drop_receiver": dropped, the trainer goes
 * on, and the engine, resumed, learns it was dropped (PEER) and does not complete version 1. */
static void a_frozen_engine_times_out_by_name_and_is_dropped(void **state) {
    (void)state;
    rig_t *r = rig_begin(2);
    rig_open(r, 2, 0, NULL);
    kill(r->e[1].pid, SIGSTOP);
    OK(rig_send_chunk(r, 1, 0, kTwo, 2));
    OK(rig_send_chunk(r, 1, 1, kTwo, 2));
    if (!r->caps.collective)
        for (int c = 0; c < 2; ++c) assert_int_equal(rig_answer(r, 0), 0);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(r->sender, 300), WSYNC_ERR_TIMEOUT, "receiver");
    long took = tu_now_ms() - t0;
    assert_true(took >= 290 && took < 1300);
    wsync_failure_t f = rig_failure(r, 0);
    assert_int_equal(f.what, WSYNC_FAILURE_TIMEOUT);
    assert_int_equal(f.receiver, 1);
    if (!r->caps.drop_receiver) {
        EXPECT_ERR(wsync_sender_drop_receiver(r->sender, 1), WSYNC_ERR_UNSUPPORTED, "");
        kill(r->e[1].pid, SIGCONT);
        rig_end(r);
        return;
    }
    OK(wsync_sender_drop_receiver(r->sender, 1));
    OK(wsync_sender_flush(r->sender, 1000));
    kill(r->e[1].pid, SIGCONT);
    assert_int_equal(rig_answer(r, 1), WSYNC_ERR_PEER); /* "dropped by the sender" */
    assert_int_equal(rig_answer(r, 1), WSYNC_ERR_PEER);
    assert_int_equal(rig_poll(r, 1).completed_version, 0);
    rig_send_version(r, 2, kOne, 1);
    OK(wsync_sender_flush(r->sender, 5000));
    rig_end(r);
}

/* Engine 1 is SIGKILLed with version 1 half-loaded and restarted (a new process) with the same
 * index. Trainer: the flush of version 1 names receiver 1 (died owing a chunk); versions 2 and
 * 3 reach both engines, bit-exact. Needs "reattach". */
static void a_restarted_engine_reattaches_and_receives_the_next_version(void **state) {
    (void)state;
    rig_t *r = rig_begin(3);
    need(r->caps.reattach, "reattach: false");
    rig_open(r, 2, 0, NULL);
    OK(rig_send_chunk(r, 1, 0, kTwo, 2));
    for (int i = 0; i < 2; ++i) assert_int_equal(rig_answer(r, i), 0);
    rig_engine_kill(r, 1);
    assert_int_equal(rig_engine_start(r, 2, 1, LOAD), 0); /* process 2 is receiver 1 now */
    OK(rig_send_chunk(r, 1, 1, kOne, 1));
    assert_int_equal(rig_answer(r, 0), 0);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(r->sender, 5000), WSYNC_ERR_PEER, "receiver 1");
    assert_true(tu_now_ms() - t0 < 2000);
    assert_int_equal(rig_failure(r, 0).what, WSYNC_FAILURE_DIED);
    const int restarted[2] = {0, 2};
    for (uint64_t v = 2; v <= 3; ++v) {
        rig_send_version(r, v, restarted, 2);
        OK(wsync_sender_flush(r->sender, 5000));
    }
    rig_end(r);
}

/* Abandon: with one bucket (where the kind has buckets), version 1's chunk 0 is published,
 * delivered to nobody, and abandoned. Trainer: the flush succeeds at once; the request,
 * delivered late, is refused as ABANDONED; version 2 completes on both. Then version 3's
 * chunk 0 reaches engine 0 only, which loads it, and the trainer abandons: the flush and
 * version 4 go through at once, and both engines complete version 4. */
static void an_abandoned_version_holds_nothing_and_its_requests_are_refused(void **state) {
    (void)state;
    rig_t *r = rig_begin(2);
    rig_open(r, 2, 1, NULL);
    wsync_chunk_t ch = tu_chunk(&r->t[0], 2, 0);
    wsync_blob_t late;
    OK(wsync_sender_send_chunk(r->sender, &ch, &late)); /* version 1, chunk 0: to nobody */
    OK(wsync_sender_abandon(r->sender));
    long t0 = tu_now_ms();
    OK(wsync_sender_flush(r->sender, 5000));
    assert_true(tu_now_ms() - t0 < 1000);
    rig_deliver(r, &late, kTwo + 1, 1);
    assert_int_equal(rig_answer(r, 1), WSYNC_ERR_ABANDONED);
    wsync_blob_free(&late);
    t0 = tu_now_ms();
    rig_send_version(r, 2, kTwo, 2);
    OK(wsync_sender_flush(r->sender, 5000));
    assert_true(tu_now_ms() - t0 < 2000);

    OK(rig_send_chunk(r, 3, 0, kOne, 1)); /* engine 0 only */
    assert_int_equal(rig_answer(r, 0), 0);
    OK(wsync_sender_abandon(r->sender));
    t0 = tu_now_ms();
    OK(wsync_sender_flush(r->sender, 5000));
    rig_send_version(r, 4, kTwo, 2);
    OK(wsync_sender_flush(r->sender, 5000));
    assert_true(tu_now_ms() - t0 < 2000);
    for (int i = 0; i < 2; ++i) assert_int_equal(rig_poll(r, i).completed_version, 4);
    rig_end(r);
}

/* Replay: a request delivered a second time, after its version completed, and again after the
 * next version completed, is refused (MISMATCH) and changes nothing: the engine keeps serving
 * the newest version, and the trainer's flushes stay clean. */
static void a_replayed_request_is_refused_and_changes_nothing(void **state) {
    (void)state;
    rig_t *r = rig_begin(2);
    rig_open(r, 2, 0, NULL);
    OK(rig_send_chunk(r, 1, 0, kTwo, 2));
    for (int i = 0; i < 2; ++i) assert_int_equal(rig_answer(r, i), 0);
    wsync_blob_t last;
    OK(rig_publish(r, 1, 1, &last));
    rig_deliver(r, &last, kTwo, 2);
    for (int i = 0; i < 2; ++i) assert_int_equal(rig_answer(r, i), 0);
    OK(wsync_sender_flush(r->sender, 5000));
    rig_deliver(r, &last, kTwo + 1, 1);
    assert_int_equal(rig_answer(r, 1), WSYNC_ERR_MISMATCH);
    assert_int_equal(rig_poll(r, 1).completed_version, 1);
    OK(wsync_sender_flush(r->sender, 1000));
    rig_send_version(r, 2, kTwo, 2);
    OK(wsync_sender_flush(r->sender, 5000));
    rig_deliver(r, &last, kOne, 1);
    assert_int_equal(rig_answer(r, 0), WSYNC_ERR_MISMATCH);
    assert_int_equal(rig_poll(r, 0).completed_version, 2);
    OK(wsync_sender_flush(r->sender, 1000));
    wsync_blob_free(&last);
    rig_send_version(r, 3, kTwo, 2);
    OK(wsync_sender_flush(r->sender, 5000));
    rig_end(r);
}

/* Drop and re-attach: a live engine dropped between versions fails its next receive with PEER
 * (dropped) and completes nothing more; the trainer's flushes no longer wait for it. Once it
 * has ended, a new process claims its index and receives the next version bit-exact, and a
 * second process claiming the same index is refused (WRONG_STATE). */
static void a_dropped_engine_learns_it_and_its_index_is_claimed_once_again(void **state) {
    (void)state;
    rig_t *r = rig_begin(4);
    need(r->caps.drop_receiver, "drop_receiver: false");
    rig_open(r, 2, 0, NULL);
    rig_send_version(r, 1, kTwo, 2);
    OK(wsync_sender_flush(r->sender, 5000));
    OK(wsync_sender_drop_receiver(r->sender, 1));
    OK(rig_send_chunk(r, 2, 0, kTwo, 2));
    assert_int_equal(rig_answer(r, 0), 0);
    assert_int_equal(rig_answer(r, 1), WSYNC_ERR_PEER);
    OK(rig_send_chunk(r, 2, 1, kOne, 1));
    assert_int_equal(rig_answer(r, 0), 0);
    OK(wsync_sender_flush(r->sender, 5000));
    assert_int_equal(rig_poll(r, 1).completed_version, 1);
    assert_int_equal(rig_engine_stop(r, 1), 0);
    need(r->caps.reattach, "reattach: false");
    assert_int_equal(rig_engine_start(r, 2, 1, LOAD), 0);
    assert_int_equal(rig_engine_start(r, 3, 1, LOAD), WSYNC_ERR_WRONG_STATE);
    assert_int_equal(tu_wait_child(r->e[3].pid, 5000), 11);
    close(r->e[3].to);
    close(r->e[3].from);
    r->e[3].pid = 0;
    const int again[2] = {0, 2};
    for (uint64_t v = 3; v <= 4; ++v) {
        rig_send_version(r, v, again, 2);
        OK(wsync_sender_flush(r->sender, 5000));
    }
    rig_end(r);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(loader_failure_after_the_last_view_reaches_the_trainer_once),
    cmocka_unit_test(a_version_failed_by_two_engines_reports_both_once),
    cmocka_unit_test(a_killed_engine_is_named_and_the_others_go_on_or_fail_by_name),
    cmocka_unit_test(a_frozen_engine_times_out_by_name_and_is_dropped),
    cmocka_unit_test(a_restarted_engine_reattaches_and_receives_the_next_version),
    cmocka_unit_test(an_abandoned_version_holds_nothing_and_its_requests_are_refused),
    cmocka_unit_test(a_replayed_request_is_refused_and_changes_nothing),
    cmocka_unit_test(a_dropped_engine_learns_it_and_its_index_is_claimed_once_again),
};

TU_MAIN(tests)
