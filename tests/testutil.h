/* Shared helpers for libwsync's cmocka tests: status assertions that print the library's
 * message, a deterministic weight pattern, length-prefixed frames over pipes, and bounded
 * waits for child processes. Header-only so every test binary stays one file. */
#ifndef WSYNC_TESTUTIL_H
#define WSYNC_TESTUTIL_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "wsync.h"

/* Asserts a call returns WSYNC_OK, printing the library's message when it does not. */
#define OK(call)                                                                        \
    do {                                                                                \
        wsync_status_t st_ = (call);                                                    \
        if (st_ != WSYNC_OK)                                                            \
            fail_msg("%s -> %s: %s", #call, wsync_status_string(st_), wsync_last_error()); \
    } while (0)

/* Asserts a call fails with `status` and that the message contains `needle`. */
#define EXPECT_ERR(call, status, needle)                                                 \
    do {                                                                                 \
        wsync_status_t st_ = (call);                                                     \
        if (st_ != (status))                                                             \
            fail_msg("%s -> %s (want %s): %s", #call, wsync_status_string(st_),           \
                     wsync_status_string(status), wsync_last_error());                   \
        if (!strstr(wsync_last_error(), (needle)))                                       \
            fail_msg("%s: message \"%s\" does not mention \"%s\"", #call, wsync_last_error(), \
                     (needle));                                                          \
    } while (0)

/* Re-seals a blob after a test changed its content (as a sender producing that content would):
 * the last 8 bytes are the XXH3-64 of every byte before the CBOR uint64 head (0x1b). */
#define XXH_INLINE_ALL
#include <xxhash.h>
static inline void tu_reseal(uint8_t *blob, size_t size) {
    uint64_t h = XXH3_64bits(blob, size - 9);
    for (int i = 0; i < 8; ++i) blob[size - 8 + i] = (uint8_t)(h >> (56 - 8 * i));
}

/* The tree hash that shm and ucx requests carry for each tensor ("tree", docs/wire-format.md),
 * written here from its definition rather than taken from the library: XXH3-64 over the
 * little-endian array of the XXH3-64 of each 65536-byte piece (the last one shorter). */
static inline uint64_t tu_tree_hash(const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t pieces = (n + 65535) / 65536;
    unsigned char *le = (unsigned char *)malloc(pieces * 8 + 1);
    for (size_t k = 0; k < pieces; ++k) {
        size_t at = k * 65536;
        uint64_t h = XXH3_64bits(p + at, n - at < 65536 ? n - at : 65536);
        for (int i = 0; i < 8; ++i) le[8 * k + (size_t)i] = (unsigned char)(h >> (8 * i));
    }
    uint64_t out = XXH3_64bits(le, pieces * 8);
    free(le);
    return out;
}

static inline uint64_t tu_splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The bytes tensor `t` holds at sync `step`: independent of the library, so receivers can
 * check what arrived bit for bit. */
static inline void tu_fill(void *buf, size_t n, uint64_t step, uint64_t t) {
    unsigned char *p = (unsigned char *)buf;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = tu_splitmix((step << 40) ^ (t << 24) ^ (i >> 3));
        size_t k = n - i < 8 ? n - i : 8;
        memcpy(p + i, &v, k);
    }
}

static inline int tu_check(const void *buf, size_t n, uint64_t step, uint64_t t) {
    const unsigned char *p = (const unsigned char *)buf;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = tu_splitmix((step << 40) ^ (t << 24) ^ (i >> 3));
        size_t k = n - i < 8 ? n - i : 8;
        if (memcmp(p + i, &v, k) != 0) return 0;
    }
    return 1;
}

static inline wsync_tensor_t tu_tensor(const char *name, void *data, const int64_t *shape,
                                       int32_t ndim, uint8_t code, uint8_t bits) {
    wsync_tensor_t t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.data = data;
    t.shape = shape;
    t.ndim = ndim;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    t.device.type = WSYNC_DEVICE_CPU;
    return t;
}

static inline wsync_chunk_t tu_chunk(const wsync_tensor_t *t, size_t n, uint32_t flags) {
    wsync_chunk_t c;
    memset(&c, 0, sizeof c);
    c.tensors = t;
    c.count = n;
    c.flags = flags;
    return c;
}

/* --- frames: u64 length then bytes; length 0 means "no more" ---------------------------- */
static inline int tu_write_all(int fd, const void *p, size_t n) {
    const char *c = (const char *)p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static inline int tu_read_all(int fd, void *p, size_t n, int timeout_ms) {
    char *c = (char *)p;
    while (n) {
        struct pollfd pfd = {fd, POLLIN, 0};
        int r = poll(&pfd, 1, timeout_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t got = read(fd, c, n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        c += got;
        n -= (size_t)got;
    }
    return 0;
}

static inline int tu_send_frame(int fd, const void *p, size_t n) {
    uint64_t len = n;
    return tu_write_all(fd, &len, sizeof len) || (n && tu_write_all(fd, p, n)) ? -1 : 0;
}

/* Reads one frame into a malloc'd buffer (*out, *len); 0 on success. */
static inline int tu_recv_frame(int fd, uint8_t **out, size_t *len, int timeout_ms) {
    uint64_t n;
    *out = NULL;
    *len = 0;
    if (tu_read_all(fd, &n, sizeof n, timeout_ms)) return -1;
    if (n > ((uint64_t)1 << 30)) return -1;
    if (n == 0) return 0;
    *out = (uint8_t *)malloc(n);
    if (!*out || tu_read_all(fd, *out, n, timeout_ms)) {
        free(*out);
        *out = NULL;
        return -1;
    }
    *len = n;
    return 0;
}

/* Waits for a child up to timeout_ms, then kills it. Returns its exit status, 128+signal,
 * or -1 if it had to be killed. */
/* Whether a strategy of `kind` can be made with `options` (JSON) here: the ucx tests skip
 * where libucp is missing or the transports named are not available. */
static inline int tu_kind_here(const char *kind, const char *options) {
    wsync_strategy_t *s = NULL;
    if (wsync_strategy_create(kind, options, &s) != WSYNC_OK) return 0;
    wsync_strategy_destroy(s);
    return 1;
}

static inline int tu_wait_child(pid_t pid, int timeout_ms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (r < 0 || ms > timeout_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        usleep(2000);
    }
}

/* A forked peer process talking frames over two pipes: `to` carries frames down to it, `from`
 * carries its answers up. The child runs main_fn(cfg, in, out) and _exits with its result. */
typedef struct {
    pid_t pid;
    int to, from;
} tu_peer_t;

static inline tu_peer_t tu_fork_peer(int (*main_fn)(const void *cfg, int in, int out),
                                     const void *cfg) {
    int down[2], up[2];
    assert_int_equal(pipe(down), 0);
    assert_int_equal(pipe(up), 0);
    tu_peer_t e;
    e.pid = fork();
    assert_true(e.pid >= 0);
    if (e.pid == 0) {
        close(down[1]);
        close(up[0]);
        _exit(main_fn(cfg, down[0], up[1]));
    }
    close(down[0]);
    close(up[1]);
    e.to = down[1];
    e.from = up[0];
    return e;
}

static inline long tu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Prints, on stderr, what each thread of process `pid` is doing (state and kernel wait channel
 * from /proc): a peer that gave no answer is told apart as stuck (S, futex_wait...) or slow (R). */
static inline void tu_print_threads(pid_t pid) {
    char path[320], line[512];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "  peer %d: gone (%s)\n", (int)pid, strerror(errno));
        return;
    }
    struct dirent *t;
    while ((t = readdir(d)) != NULL) {
        if (t->d_name[0] == '.') continue;
        char stat[256] = "", wchan[64] = "";
        snprintf(path, sizeof path, "/proc/%d/task/%s/stat", (int)pid, t->d_name);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fgets(line, sizeof line, f)) snprintf(stat, sizeof stat, "%.200s", line);
            fclose(f);
        }
        snprintf(path, sizeof path, "/proc/%d/task/%s/wchan", (int)pid, t->d_name);
        f = fopen(path, "r");
        if (f) {
            if (fgets(wchan, sizeof wchan, f) == NULL) wchan[0] = 0;
            fclose(f);
        }
        fprintf(stderr, "  peer %d thread %s: wchan %s stat %s", (int)pid, t->d_name, wchan, stat);
    }
    closedir(d);
    /* With WSYNC_TEST_GDB_ON_HANG set, also every thread's stack (how the ASan-only fork hang
     * fixed by sys::start_thread was found). */
    if (getenv("WSYNC_TEST_GDB_ON_HANG")) {
        char cmd[200];
        snprintf(cmd, sizeof cmd, "gdb -batch -p %d -ex 'thread apply all bt 30' 1>&2 2>/dev/null", (int)pid);
        if (system(cmd) != 0) fprintf(stderr, "gdb failed\n");
    }
}

/* The peer's one-byte answer (99 if none came within timeout_ms: the assertion fails, after
 * printing whether the peer is stuck or slow). */
static inline uint8_t tu_peer_byte(tu_peer_t *e, int timeout_ms) {
    uint8_t v = 99;
    long t0 = tu_now_ms();
    if (tu_read_all(e->from, &v, 1, timeout_ms) != 0) {
        fprintf(stderr, "no answer from peer %d after %ld ms (limit %d ms):\n", (int)e->pid,
                tu_now_ms() - t0, timeout_ms);
        tu_print_threads(e->pid);
        fail();
    }
    return v;
}

/* A forked worker that must outlive a failed test without holding CTest's output open (CTest
 * waits for every holder): points stdin, stdout and stderr at /dev/null. */
static inline void tu_detach_stdio(void) {
    int n = open("/dev/null", O_RDWR);
    if (n < 0) return;
    for (int fd = 0; fd <= 2; ++fd) dup2(n, fd);
    if (n > 2) close(n);
}

/* Whether the shared-memory segment an init blob names ("/wsync-...": shm's segment,
 * cuda_ipc's board) is still in /dev/shm. */
static inline int tu_segment_named_in(const uint8_t *init, size_t len) {
    char *json;
    OK(wsync_blob_describe(init, len, &json));
    const char *p = strstr(json, "\"/wsync-");
    assert_non_null(p);
    char path[128] = "/dev/shm";
    size_t n = (size_t)(strchr(p + 1, '"') - p - 1);
    assert_true(n < 100);
    memcpy(path + 8, p + 1, n);
    path[8 + n] = '\0';
    wsync_string_free(json);
    return access(path, F_OK) == 0;
}

/* The test entry point: `prog [NAME]` runs every test, or only the one called NAME (CTest runs
 * each test as its own process so a crash or skip shows against its name). */
#define TU_MAIN(tests)                                                     \
    int main(int argc, char **argv) {                                      \
        if (argc > 1) cmocka_set_test_filter(argv[1]);                     \
        return cmocka_run_group_tests(tests, NULL, NULL);                  \
    }

#endif
