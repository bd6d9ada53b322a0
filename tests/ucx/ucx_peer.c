/* One "host" of the ucx scenario tests (tests/ucx/scenarios.sh): a trainer or an engine
 * process that talks to the others only through the ucx kind and files in a shared folder
 * (the controller: init.bin, req-V-K.bin, latest). Prints one line per event for the script
 * to assert on:
 *   trainer DIR OPTIONS VERSIONS ENGINES [STEP]
 *                                          waits for engines 0..ENGINES-1 to attach (their
 *                                          DIR/attached-I), then sends VERSIONS versions of CHUNKS
 *                                          chunks and flushes each (a flush failure is printed
 *                                          and the next version still goes); with STEP it waits
 *                                          for DIR/go-V before version V; with
 *                                          $WSYNC_PEER_DROP_ON_TIMEOUT it drops each receiver a
 *                                          flush timed out on (with $WSYNC_PEER_DROP_ON_DIED, each named DIED)
 *   engine DIR OPTIONS INDEX FROM TO [SLOW_MS]
 *                                          receives versions FROM..TO (FROM 0: the latest
 *                                          committed one) bit for bit; SLOW_MS sleeps between
 *                                          tensors (so a test can act mid-pull); prints
 *                                          "in vV chunk K" once it holds chunk K's first
 *                                          tensor, before acknowledging it; with
 *                                          $WSYNC_PEER_SHARD "R/N" it pulls only rank R of N
 *                                          along dimension 0 of every tensor (the "select"
 *                                          option), checks those bytes, and prints the bytes
 *                                          it took and, when $WSYNC_UCX_LIBRARY is the counting
 *                                          stand-in (tests/ucx/ucp_count.c), the bytes fetched;
 *                                          with $WSYNC_PEER_FAIL "V/K/STATUS" it fails chunk K
 *                                          of version V with that status (wsync_recv_fail) and
 *                                          goes on with version V + 1; with
 *                                          $WSYNC_PEER_ATTACH_RETRY_MS it retries an attach
 *                                          refused with WSYNC_ERR_WRONG_STATE (its index still
 *                                          held by a predecessor) every 100 ms for that long
 * Exit status: 0 all went well; 1 a flush, receive or check failed (printed); 2 setup failed;
 * 3 a file the test must provide never came. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "wsync.h"

enum { CHUNKS = 2, PER_CHUNK = 4 };
static size_t g_bytes = 1 << 20; /* per tensor; $WSYNC_PEER_TENSOR_BYTES */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static void fill(uint8_t *p, size_t n, uint64_t v, uint64_t t) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t x = mix((v << 40) ^ (t << 24) ^ (i >> 3));
        memcpy(p + i, &x, n - i < 8 ? n - i : 8);
    }
}
/* Bytes [off, off + n) of tensor t at version v (off a multiple of 8). */
static int check(const uint8_t *p, size_t n, uint64_t v, uint64_t t, size_t off) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t x = mix((v << 40) ^ (t << 24) ^ ((off + i) >> 3));
        if (memcmp(p + i, &x, n - i < 8 ? n - i : 8)) return 0;
    }
    return 1;
}

static void put_file(const char *dir, const char *name, const void *p, size_t n) {
    char tmp[512], fin[512];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
    snprintf(fin, sizeof fin, "%s/%s", dir, name);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        printf("io error writing %s\n", fin);
        exit(3);
    }
    rename(tmp, fin);
}

/* Waits up to 60 s for DIR/name; returns its bytes (malloc'd, NUL-terminated past *n) or NULL. */
static uint8_t *get_file(const char *dir, const char *name, size_t *n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; i < 6000; ++i) {
        FILE *f = fopen(path, "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            long len = ftell(f);
            fseek(f, 0, SEEK_SET);
            if (len < 0) {
                fclose(f);
                return NULL;
            }
            /* One byte more, always NUL: callers parse small files ("latest") as text. */
            uint8_t *p = malloc((size_t)len + 1);
            if (!p) {
                fclose(f);
                return NULL;
            }
            *n = fread(p, 1, (size_t)len, f);
            p[*n] = 0;
            fclose(f);
            return p;
        }
        usleep(10000);
    }
    return NULL;
}

/* get_file for a file the test must provide: gives up loudly (exit 3), never goes on without it. */
static uint8_t *need_file(const char *dir, const char *name, const char *who) {
    size_t n;
    uint8_t *p = get_file(dir, name, &n);
    if (!p) {
        printf("%s: gave up waiting 60 s for %s/%s\n", who, dir, name);
        exit(3);
    }
    return p;
}

static int trainer(const char *dir, const char *opts, int versions, int engines, int step) {
    wsync_strategy_t *s = NULL;
    wsync_sender_t *snd = NULL;
    wsync_blob_t init = {0};
    if (wsync_strategy_create("ucx", opts, &s) || wsync_strategy_create_init_info(s, &init) ||
        wsync_sender_create(s, init.data, init.size, &snd)) {
        printf("trainer: setup failed: %s\n", wsync_last_error());
        return 2;
    }
    put_file(dir, "init.bin", init.data, init.size);
    wsync_blob_free(&init);
    for (int i = 0; i < engines; ++i) {
        char name[32];
        snprintf(name, sizeof name, "attached-%d", i);
        free(need_file(dir, name, "trainer"));
    }
    printf("trainer: ready\n");
    fflush(stdout);
    int64_t shape[1] = {(int64_t)g_bytes};
    uint8_t *data = malloc(g_bytes * CHUNKS * PER_CHUNK);
    char names[CHUNKS * PER_CHUNK][32];
    int failed = 0;
    for (int v = 1; v <= versions; ++v) {
        if (step) {
            char go[32];
            snprintf(go, sizeof go, "go-%d", v);
            free(need_file(dir, go, "trainer"));
        }
        for (int k = 0; k < CHUNKS; ++k) {
            wsync_tensor_t t[PER_CHUNK];
            memset(t, 0, sizeof t);
            for (int j = 0; j < PER_CHUNK; ++j) {
                int id = k * PER_CHUNK + j;
                snprintf(names[id], sizeof names[id], "layer%d.w", id);
                fill(data + (size_t)id * g_bytes, g_bytes, (uint64_t)v, (uint64_t)id);
                t[j].name = names[id];
                t[j].data = data + (size_t)id * g_bytes;
                t[j].shape = shape;
                t[j].ndim = 1;
                t[j].dtype.code = WSYNC_DTYPE_UINT;
                t[j].dtype.bits = 8;
                t[j].dtype.lanes = 1;
                t[j].device.type = WSYNC_DEVICE_CPU;
            }
            wsync_chunk_t c = {0};
            c.tensors = t;
            c.count = PER_CHUNK;
            c.flags = k == CHUNKS - 1 ? WSYNC_CHUNK_LAST : 0;
            wsync_blob_t req = {0};
            if (wsync_sender_send_chunk(snd, &c, &req)) {
                printf("trainer: send v%d chunk %d failed: %s\n", v, k, wsync_last_error());
                return 2;
            }
            char name[32];
            snprintf(name, sizeof name, "req-%d-%d.bin", v, k);
            put_file(dir, name, req.data, req.size);
            wsync_blob_free(&req);
        }
        char latest[16];
        int n = snprintf(latest, sizeof latest, "%d", v);
        put_file(dir, "latest", latest, (size_t)n);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        const char *fm = getenv("WSYNC_PEER_FLUSH_MS");
        wsync_status_t st = wsync_sender_flush(snd, fm && *fm ? atoll(fm) : 60000);
        clock_gettime(CLOCK_MONOTONIC, &b);
        long ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
        if (st == WSYNC_OK) {
            printf("trainer: flush v%d ok (%ld ms)\n", v, ms);
        } else {
            failed = 1;
            printf("trainer: flush v%d %s (%ld ms): %s\n", v, wsync_status_string(st), ms, wsync_last_error());
            size_t count = 0;
            wsync_sender_failure_count(snd, &count);
            for (size_t i = 0; i < count; ++i) {
                wsync_failure_t f;
                memset(&f, 0, sizeof f);
                f.struct_size = sizeof f;
                wsync_sender_failure(snd, i, &f);
                printf("trainer: failure what=%u receiver=%u status=%s: %s\n", f.what, f.receiver,
                       wsync_status_string(f.status), f.message);
                if ((f.what == WSYNC_FAILURE_TIMEOUT && getenv("WSYNC_PEER_DROP_ON_TIMEOUT")) ||
                    (f.what == WSYNC_FAILURE_DIED && getenv("WSYNC_PEER_DROP_ON_DIED"))) {
                    wsync_status_t d = wsync_sender_drop_receiver(snd, f.receiver);
                    printf("trainer: dropped receiver %u: %s\n", f.receiver, wsync_status_string(d));
                }
            }
        }
        fflush(stdout);
    }
    free(data);
    wsync_sender_destroy(snd);
    wsync_strategy_destroy(s);
    printf("trainer: done\n");
    return failed;
}

static int pull(const char *dir, wsync_receiver_t *r, unsigned index, int from, int to, int slow_ms,
                unsigned ranks, unsigned rank, uint64_t (*fetched)(void));

static int engine(const char *dir, const char *opts, unsigned index, int from, int to, int slow_ms) {
    size_t n;
    /* A shard: "select" every tensor's rank R of N along dimension 0. */
    const char *shard = getenv("WSYNC_PEER_SHARD");
    unsigned rank = 0, ranks = 1;
    char with_select[4096];
    if (shard && *shard) {
        if (sscanf(shard, "%u/%u", &rank, &ranks) != 2 || ranks == 0 || rank >= ranks) {
            printf("engine %u: bad WSYNC_PEER_SHARD '%s'\n", index, shard);
            return 2;
        }
        size_t len = strlen(opts);
        int w = snprintf(with_select, sizeof with_select, "%.*s,\"select\":[{\"tensors\":[", (int)(len - 1), opts);
        for (int id = 0; id < CHUNKS * PER_CHUNK; ++id)
            w += snprintf(with_select + w, sizeof with_select - (size_t)w, "%s\"layer%d.w\"", id ? "," : "", id);
        snprintf(with_select + w, sizeof with_select - (size_t)w, "],\"rank\":%u,\"ranks\":%u}]}", rank, ranks);
        opts = with_select;
    }
    uint64_t (*fetched)(void) = NULL;  /* the counting stand-in's fetched-byte counter, if loaded */
    const char *lib = getenv("WSYNC_UCX_LIBRARY");
    if (lib && *lib) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (h) fetched = (uint64_t (*)(void))dlsym(h, "wsync_test_get_bytes");
    }
    uint8_t *init = get_file(dir, "init.bin", &n);
    wsync_strategy_t *s = NULL;
    wsync_receiver_t *r = NULL;
    int rc = 2;
    const char *retry = getenv("WSYNC_PEER_ATTACH_RETRY_MS");
    long retry_ms = retry && *retry ? atol(retry) : 0;
    wsync_status_t made = WSYNC_ERR_UNAVAILABLE;
    if (init && wsync_strategy_create("ucx", opts, &s) == WSYNC_OK)
        while ((made = wsync_receiver_create(s, init, n, index, &r)) == WSYNC_ERR_WRONG_STATE && retry_ms > 0) {
            printf("engine %u: attach refused, retrying: %s\n", index, wsync_last_error());
            usleep(100000);
            retry_ms -= 100;
        }
    if (made != WSYNC_OK) {
        printf("engine %u: attach %s\n", index, init ? wsync_last_error() : "no init info");
    } else {
        rc = pull(dir, r, index, from, to, slow_ms, ranks, rank, fetched);
    }
    /* Every way out frees what it made, so the ASan run's leak check holds on failures too. */
    free(init);
    wsync_receiver_destroy(r);
    wsync_strategy_destroy(s);
    return rc;
}

/* The engine's versions from..to (0: the latest published), each chunk's parts checked against
 * the trainer's pattern. 0 when all arrived; 1 on a failure the scenario expects to see; 2 when
 * the scenario's files are missing. An open iteration is always ended (or failed) first. */
static int pull(const char *dir, wsync_receiver_t *r, unsigned index, int from, int to, int slow_ms,
                unsigned ranks, unsigned rank, uint64_t (*fetched)(void)) {
    size_t n = 0;
    if (from == 0) {
        uint8_t *latest = need_file(dir, "latest", "engine");
        from = atoi((char *)latest);
        free(latest);
    }
    int fail_v = -1, fail_k = -1, fail_st = 0;
    const char *fail_at = getenv("WSYNC_PEER_FAIL");
    if (fail_at && *fail_at && sscanf(fail_at, "%d/%d/%d", &fail_v, &fail_k, &fail_st) != 3) {
        printf("engine %u: bad WSYNC_PEER_FAIL '%s'\n", index, fail_at);
        return 2;
    }
    printf("engine %u: attached, from version %d\n", index, from);
    char mark[32];
    snprintf(mark, sizeof mark, "attached-%u", index);
    put_file(dir, mark, "1", 1);
    fflush(stdout);
    for (int v = from; v <= to; ++v) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        uint64_t took = 0, fetched_before = fetched ? fetched() : 0;
        for (int k = 0; k < CHUNKS; ++k) {
            char name[32];
            snprintf(name, sizeof name, "req-%d-%d.bin", v, k);
            uint8_t *req = get_file(dir, name, &n);
            if (!req) {
                printf("engine %u: no request for v%d chunk %d\n", index, v, k);
                return 2;
            }
            wsync_recv_t *it = NULL;
            if (k == 0) clock_gettime(CLOCK_MONOTONIC, &a); /* the pull, not the wait for it */
            wsync_status_t st = wsync_receiver_receive(r, req, n, &it);
            free(req);
            if (st) {
                printf("engine %u: v%d %s: %s\n", index, v, wsync_status_string(st), wsync_last_error());
                fflush(stdout);
                return 1;
            }
            bool has = true;
            for (int j = 0; has; ++j) {
                wsync_tensor_t view;
                memset(&view, 0, sizeof view);
                view.struct_size = sizeof view;
                wsync_part_t part;
                if ((st = wsync_recv_next_part(it, &view, &part, &has)) != WSYNC_OK) break;
                if (!has) break;
                const size_t share = g_bytes / ranks;
                if (part.offset != rank * share || part.bytes != share) {
                    printf("engine %u: v%d tensor %s is bytes %llu + %llu, want %zu + %zu\n", index, v,
                           view.name, (unsigned long long)part.offset, (unsigned long long)part.bytes,
                           rank * share, share);
                    wsync_recv_fail(it, WSYNC_ERR_MISMATCH, "ucx_peer: a part other than this rank's");
                    return 1;
                }
                if (!check(view.data, part.bytes, (uint64_t)v, (uint64_t)(k * PER_CHUNK + j), part.offset)) {
                    printf("engine %u: v%d tensor %s differs\n", index, v, view.name);
                    wsync_recv_fail(it, WSYNC_ERR_INTEGRITY, "ucx_peer: tensor bytes differ from the trainer's");
                    return 1;
                }
                took += part.bytes;
                /* A protocol point the scripts act at: the chunk is pulled, its iteration is
                   open and not yet acknowledged. */
                if (j == 0) printf("engine %u: in v%d chunk %d\n", index, v, k);
                if (v == fail_v && k == fail_k) {  /* frees the iteration */
                    st = wsync_recv_fail(it, (wsync_status_t)fail_st, "ucx_peer: told to fail this chunk");
                    it = NULL;
                    break;
                }
                if (slow_ms) usleep((useconds_t)slow_ms * 1000);
            }
            /* Ends the iteration whatever happened (a failed one returns its status). */
            if (!it) {
                printf("engine %u: v%d failed as told: %s\n", index, v, wsync_status_string(st));
                break;
            }
            const wsync_status_t ended = wsync_recv_end(it);
            if (st == WSYNC_OK) st = ended;
            if (st) {
                printf("engine %u: v%d %s: %s\n", index, v, wsync_status_string(st), wsync_last_error());
                return 1;
            }
        }
        if (v == fail_v) continue;
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
        printf("engine %u: version %d ok (%.3f s, %.2f GB/s); took %llu bytes", index, v, s,
               (double)took / s / 1e9, (unsigned long long)took);
        if (fetched) printf("; fetched %llu bytes", (unsigned long long)(fetched() - fetched_before));
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *b = getenv("WSYNC_PEER_TENSOR_BYTES");
    if (b && *b) g_bytes = (size_t)strtoull(b, NULL, 10);
    if (argc >= 6 && !strcmp(argv[1], "trainer"))
        return trainer(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), argc > 6 ? atoi(argv[6]) : 0);
    if (argc >= 7 && !strcmp(argv[1], "engine"))
        return engine(argv[2], argv[3], (unsigned)atoi(argv[4]), atoi(argv[5]), atoi(argv[6]),
                      argc > 7 ? atoi(argv[7]) : 0);
    fprintf(stderr, "usage: see the head of tests/ucx/ucx_peer.c\n");
    return 64;
}
