/* Engines are other processes, possibly in other containers, and the trainer trusts nothing
 * they write: specified across real processes. Liveness comes from a kernel-held lock, so pids
 * from another PID namespace neither kill a live engine nor keep a dead one alive; and an
 * engine scribbling over every shared word it can write cannot crash the trainer or the other
 * engines, or make anyone serve a version that is not bit-exact. */
#define _GNU_SOURCE
#include <sched.h>
#include <sys/prctl.h>

#include "txn_harness.h"

/* Runs engine_main() inside a new PID namespace as pid cfg->ns_pid (1: the namespace's init;
 * larger: the init sets ns_last_pid and forks, so the engine gets exactly that pid). Killing
 * this launcher kills the namespace. Answers 77 (and the test skips) where the kernel or the
 * container refuses a new PID namespace. */
static int engine_in_pid_namespace_main(const void *p, int in, int out) {
    const engine_cfg_t *cfg = (const engine_cfg_t *)p;
    uint8_t refused = 77;
    if (unshare(CLONE_NEWPID) != 0) {
        tu_write_all(out, &refused, 1);
        return 77;
    }
    pid_t init = fork();
    if (init < 0) return 78;
    if (init == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (cfg->ns_pid <= 1) _exit(engine_main(cfg, in, out));
        FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
        if (!f || fprintf(f, "%d", (int)cfg->ns_pid - 1) < 0 || fclose(f) != 0) {
            tu_write_all(out, &refused, 1);
            _exit(77);
        }
        pid_t engine = fork();
        if (engine == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getpid() != cfg->ns_pid) {
                tu_write_all(out, &refused, 1);
                _exit(77);
            }
            _exit(engine_main(cfg, in, out));
        }
        int status;
        waitpid(engine, &status, 0);
        _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 79);
    }
    int status;
    waitpid(init, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 80;
}

/* A pid that names no process in this (the trainer's) namespace. */
static pid_t unused_pid(void) {
    long max = 32768;
    FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
    if (f) {
        if (fscanf(f, "%ld", &max) != 1) max = 32768;
        fclose(f);
    }
    for (pid_t p = (pid_t)max - 10; p > 300; --p)
        if (kill(p, 0) != 0 && errno == ESRCH) return p;
    return 0;
}

/* Observation 7: liveness was a bare pid, so an engine in another container (another PID
 * namespace) was declared dead at once when its pid named nothing here, and a dead one whose
 * pid named a live process here cost a full timeout. Engine 0 runs as pid 1 of its own
 * namespace (here pid 1 is init, alive); engine 1 as a pid that names no process here.
 * Trainer: three versions complete on both (flush OK, so engine 1 was never taken for dead);
 * engine 0 is SIGKILLed and the next flush fails with PEER naming receiver 0 within 1 s
 * although its deadline is 20 s, the failure record carrying pid 1 (the pid as the engine saw
 * itself: for messages only). Engines: every version bit-exact. Left behind: nothing. */
static void engines_in_other_pid_namespaces_are_alive_by_their_lock_not_their_pid(void **state) {
    (void)state;
    pid_t far_pid = unused_pid();
    if (far_pid == 0) skip();
    trainer_t *tr = trainer_new("{\"receivers\": 2, \"bucket_bytes\": 65536}");
    engine_cfg_t cfg[2];
    tu_peer_t e[2];
    for (uint32_t i = 0; i < 2; ++i) {
        cfg[i] = (engine_cfg_t){tr->init.data, tr->init.size, i, MODE_LOAD, i == 0 ? 1 : far_pid};
        e[i] = tu_fork_peer(engine_in_pid_namespace_main, &cfg[i]);
        uint8_t ready = tu_peer_byte(&e[i], 5000);
        if (ready == 77) {
            for (uint32_t k = 0; k <= i; ++k) tu_wait_child(e[k].pid, 100), close(e[k].to), close(e[k].from);
            trainer_free(tr);
            skip(); /* no new PID namespace here (needs CAP_SYS_ADMIN) */
        }
        assert_int_equal(ready, 0);
    }
    tu_peer_t *both[2] = {&e[0], &e[1]};
    for (uint64_t v = 1; v <= 3; ++v) {
        send_version_to(tr, v, both, 2);
        OK(wsync_sender_flush(tr->sender, 5000));
    }
    kill(e[0].pid, SIGKILL); /* the launcher; the namespace and its engine go with it */
    assert_int_equal(tu_wait_child(e[0].pid, 5000), 128 + SIGKILL);
    usleep(100 * 1000); /* the engine itself dies of the launcher's death signal */
    send_version_to(tr, 4, both + 1, 1);
    long t0 = tu_now_ms();
    EXPECT_ERR(wsync_sender_flush(tr->sender, 20000), WSYNC_ERR_PEER, "receiver 0");
    assert_true(tu_now_ms() - t0 < 1000);
    wsync_failure_t f = failure(tr, 0);
    assert_int_equal(f.what, WSYNC_FAILURE_DIED);
    assert_int_equal(f.receiver, 0);
    assert_int_equal(f.pid, 1);
    stop_engine(&e[1]);
    close(e[0].to);
    close(e[0].from);
    assert_false(tu_segment_named_in(tr->init.data, tr->init.size));
    trainer_free(tr);
}

static int named_cause(wsync_status_t st) {
    return st != WSYNC_ERR_INTERNAL && st != WSYNC_ERR_SYSTEM &&
           (st == WSYNC_OK || wsync_last_error()[0] != '\0');
}

/* Observation 11: a receiver could crash the trainer, which re-read the segment's geometry
 * from memory every receiver can write. Engine 1 turns hostile: before each of 8 versions it
 * writes pseudo-random words over its whole writable mapping of the segment (geometry, states,
 * locks' owners' pids, acks, failure rings, the abandoned version, the futex word). Trainer:
 * every send and flush returns within its deadline (sends 1 s, flush 0.5 s) with OK or a named
 * status, never INTERNAL or SYSTEM, and the trainer process survives (under ASan in CI, with
 * no invalid access). Engine 0: answers every request (no crash, no hang) and whatever version
 * it completes is bit-exact. Both engines exit cleanly; nothing is left in /dev/shm. */
static void engine_scribbling_over_the_shared_board_cannot_crash_the_trainer_or_its_peers(
    void **state) {
    (void)state;
    trainer_t *tr = trainer_new("{\"receivers\": 2, \"bucket_bytes\": 65536, \"timeout_ms\": 1000}");
    engines_t es;
    start_engines(&es, tr, 2, MODE_LOAD);
    tu_peer_t *e = es.e, **honest = es.all;
    int completed = 0;
    for (uint64_t round = 1; round <= 8; ++round) {
        uint8_t cmd[9] = {'S'};
        memcpy(cmd + 1, &round, 8);
        assert_int_equal(tu_send_frame(e[1].to, cmd, sizeof cmd), 0);
        assert_int_equal(tu_peer_byte(&e[1], 5000), 0);
        for (int c = 0; c < 2; ++c) {
            uint64_t v;
            OK(wsync_sender_version(tr->sender, &v));
            long t0 = tu_now_ms();
            wsync_status_t st = send_chunk_to(tr, v, c, honest, 1);
            if (tu_now_ms() - t0 >= 2000) print_message("send took %ld ms: %s: %s\n", tu_now_ms() - t0, wsync_status_string(st), wsync_last_error());
            assert_true(tu_now_ms() - t0 < 2000);
            assert_true(named_cause(st));
            if (st != WSYNC_OK) break; /* the version is abandoned; the next round begins anew */
            uint8_t b = tu_peer_byte(&e[0], 5000);
            assert_true(b != 50 && b != 51); /* never a version that is not bit-exact */
            if (c == 1 && b == 0) ++completed;
        }
        long t0 = tu_now_ms();
        wsync_status_t st = wsync_sender_flush(tr->sender, 500);
        assert_true(tu_now_ms() - t0 < 1500);
        assert_true(named_cause(st));
    }
    print_message("engine 0 completed %d of 8 versions while engine 1 scribbled\n", completed);
    stop_engine(&e[0]);
    stop_engine(&e[1]);
    assert_false(tu_segment_named_in(tr->init.data, tr->init.size));
    trainer_free(tr);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(engines_in_other_pid_namespaces_are_alive_by_their_lock_not_their_pid),
    cmocka_unit_test(engine_scribbling_over_the_shared_board_cannot_crash_the_trainer_or_its_peers),
};

TU_MAIN(tests)
