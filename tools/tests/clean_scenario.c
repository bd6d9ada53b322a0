/* wsync clean, as an operator runs it: a trainer SIGKILLed before any engine attached left its
 * "shm" segment in /dev/shm; another trainer (this process) is alive with its own. `wsync clean
 * --dry-run` names the first as removable and the second as in use, removing nothing; `wsync
 * clean` removes the first only; the live trainer's segment goes when it is destroyed.
 * Usage: clean_scenario PATH_TO_WSYNC. Prints "clean scenario: OK" and exits 0, or names the
 * check that failed and exits 1. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wsync.h"

#define CHECK(cond, ...)                                               \
    do {                                                               \
        if (!(cond)) {                                                 \
            fprintf(stderr, "clean scenario: FAILED: " __VA_ARGS__);   \
            fprintf(stderr, "\n");                                     \
            exit(1);                                                   \
        }                                                              \
    } while (0)

/* The segment an init blob names ("wsync-<hex>", without "/dev/shm/"). */
static void segment_of(const uint8_t *init, size_t len, char *out, size_t cap) {
    char *json = NULL;
    CHECK(wsync_blob_describe(init, len, &json) == WSYNC_OK, "describe: %s", wsync_last_error());
    const char *p = strstr(json, "\"segment\": \"/");
    CHECK(p != NULL, "no segment in %s", json);
    p += strlen("\"segment\": \"/");
    const char *e = strchr(p, '"');
    CHECK(e && (size_t)(e - p) < cap, "segment name");
    memcpy(out, p, (size_t)(e - p));
    out[e - p] = '\0';
    wsync_string_free(json);
}

static int exists(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    struct stat st;
    return stat(path, &st) == 0;
}

/* Runs `wsync clean ARGS`; its output in out, its exit status returned. */
static int run_clean(const char *cli, const char *args, char *out, size_t cap) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' clean %s 2>&1", cli, args);
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL, "popen");
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    printf("$ wsync clean %s\n%s", args, out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs `wsync clean ARGS` as user `uid`; output in out, exit status returned. */
static int run_clean_as(uid_t uid, const char *cli, const char *args, char *out, size_t cap) {
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    pid_t c = fork();
    CHECK(c >= 0, "fork");
    if (c == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        close(p[0]);
        if (setgid(uid) != 0 || setuid(uid) != 0) _exit(90);
        char copy[256], *argv[8] = {(char *)"wsync", (char *)"clean"};
        int n = 2;
        snprintf(copy, sizeof copy, "%s", args);
        for (char *tok = strtok(copy, " "); tok && n < 7; tok = strtok(NULL, " ")) argv[n++] = tok;
        argv[n] = NULL;
        execv(cli, argv);
        _exit(91);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(p[0], out + n, cap - 1 - n)) > 0) n += (size_t)r;
    out[n] = '\0';
    close(p[0]);
    int st;
    CHECK(waitpid(c, &st, 0) == c, "waitpid");
    printf("$ (uid %d) wsync clean %s\n%s", (int)uid, args, out);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A trainer of another user (nobody) that made itself not dumpable: that user's `wsync clean`
 * cannot read its descriptors or mappings, so it removes nothing (review: the live segment was
 * removed as "used by no process"); once the trainer is gone, the segment is removed. */
static void blind_to_a_process_it_cannot_inspect(const char *cli) {
    const uid_t nobody = 65534;
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    pid_t trainer = fork();
    CHECK(trainer >= 0, "fork");
    if (trainer == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  /* never outlives a failed check */
        if (setgid(nobody) != 0 || setuid(nobody) != 0) _exit(80);
        wsync_strategy_t *s;
        wsync_blob_t init;
        if (wsync_strategy_create("shm", "{\"bucket_bytes\": 65536}", &s) != WSYNC_OK ||
            wsync_strategy_create_init_info(s, &init) != WSYNC_OK)
            _exit(81);
        char name[128];
        segment_of(init.data, init.size, name, sizeof name);
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        if (write(p[1], name, sizeof name) != (ssize_t)sizeof name) _exit(82);
        pause();
        _exit(0);
    }
    close(p[1]);
    char name[128];
    CHECK(read(p[0], name, sizeof name) == (ssize_t)sizeof name, "the other user's trainer is up");
    close(p[0]);
    char out[8192], want[512];
    CHECK(run_clean_as(nobody, cli, "--dry-run", out, sizeof out) == 0, "exit status (nobody)");
    snprintf(want, sizeof want, "kept %s: pid ", name);
    CHECK(strstr(out, want) != NULL && strstr(out, "of this user cannot be inspected"),
          "a process it cannot inspect keeps %s", name);
    CHECK(run_clean_as(nobody, cli, "", out, sizeof out) == 0, "exit status (nobody)");
    CHECK(exists(name), "the non-dumpable trainer's live segment is kept");
    CHECK(run_clean_as(nobody, cli, "--dry-run --force", out, sizeof out) == 0, "exit status");
    snprintf(want, sizeof want, "would remove %s (", name);
    CHECK(strstr(out, want) != NULL && exists(name), "--force would remove it (a dry run does not)");
    CHECK(kill(trainer, SIGKILL) == 0, "kill");
    int status;
    CHECK(waitpid(trainer, &status, 0) == trainer, "waitpid");
    CHECK(run_clean_as(nobody, cli, "", out, sizeof out) == 0, "exit status (nobody)");
    snprintf(want, sizeof want, "removed %s (", name);
    CHECK(strstr(out, want) != NULL && !exists(name), "its segment is removed once it is gone");
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: clean_scenario PATH_TO_WSYNC");
    const char *cli = argv[1];
    /* A trainer that made its init info (so its segment exists) and is SIGKILLed before any
     * engine attached. It hands its init info over a pipe, then waits to be killed. */
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    pid_t child = fork();
    CHECK(child >= 0, "fork");
    if (child == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  /* never outlives a failed check */
        wsync_strategy_t *s;
        wsync_blob_t init;
        if (wsync_strategy_create("shm", "{\"bucket_bytes\": 65536}", &s) != WSYNC_OK ||
            wsync_strategy_create_init_info(s, &init) != WSYNC_OK)
            _exit(3);
        uint64_t len = init.size;
        if (write(p[1], &len, sizeof len) != (ssize_t)sizeof len ||
            write(p[1], init.data, init.size) != (ssize_t)init.size)
            _exit(4);
        pause();
        _exit(0);
    }
    close(p[1]);
    uint64_t len = 0;
    CHECK(read(p[0], &len, sizeof len) == (ssize_t)sizeof len && len < 65536, "init length");
    uint8_t *init = malloc(len);
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(p[0], init + got, len - got);
        CHECK(r > 0, "init bytes");
        got += (size_t)r;
    }
    char dead[128], live[128];
    segment_of(init, len, dead, sizeof dead);
    free(init);
    CHECK(kill(child, SIGKILL) == 0, "kill");
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFSIGNALED(status), "the trainer was killed");
    CHECK(exists(dead), "the killed trainer's segment %s is left behind", dead);

    /* A live trainer: this process. */
    wsync_strategy_t *s;
    wsync_blob_t linit;
    CHECK(wsync_strategy_create("shm", "{\"bucket_bytes\": 65536}", &s) == WSYNC_OK, "strategy");
    CHECK(wsync_strategy_create_init_info(s, &linit) == WSYNC_OK, "init info");
    segment_of(linit.data, linit.size, live, sizeof live);
    CHECK(exists(live), "the live trainer's segment");

    char out[8192], want[512];
    CHECK(run_clean(cli, "--dry-run", out, sizeof out) == 0, "dry run exit status");
    snprintf(want, sizeof want, "would remove %s (", dead);
    CHECK(strstr(out, want) != NULL, "dry run names %s as removable", dead);
    snprintf(want, sizeof want, "kept %s: in use (pid %d)", live, (int)getpid());
    CHECK(strstr(out, want) != NULL, "dry run keeps %s, in use by this process", live);
    CHECK(exists(dead) && exists(live), "a dry run removes nothing");

    CHECK(run_clean(cli, "", out, sizeof out) == 0, "exit status");
    snprintf(want, sizeof want, "removed %s (", dead);
    CHECK(strstr(out, want) != NULL, "clean says it removed %s", dead);
    CHECK(!exists(dead), "the killed trainer's segment is gone");
    CHECK(exists(live), "the live trainer's segment is kept");
    CHECK(run_clean(cli, "--bogus", out, sizeof out) == 2, "an unknown option exits 2");

    wsync_blob_free(&linit);
    wsync_strategy_destroy(s);
    CHECK(!exists(live), "the live trainer's segment goes with its strategy");
    if (getuid() == 0) blind_to_a_process_it_cannot_inspect(cli);
    else printf("(not root: the non-dumpable trainer case needs another uid, skipped)\n");
    printf("clean scenario: OK\n");
    return 0;
}
