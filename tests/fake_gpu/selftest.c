/* Self-test of libwsync_fakegpu.so, the fake CUDA driver + NCCL that the GPU strategies' tests
 * run against. It loads the fake the way libwsync does (dlopen + dlsym by symbol name) and
 * checks the behaviour the tests rely on, across threads and forked processes.
 *
 * Usage: fake_gpu_selftest [PATH_TO_libwsync_fakegpu.so [TEST_NAME_PATTERN]]
 * (the path defaults to $WSYNC_CUDA_LIBRARY). Every test arms alarm(), and every child process
 * its own, so nothing here can hang CI. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fake_gpu.h"

/* ---- the contract, restated in C (src/gpu/api.hpp is C++) ---------------------------------- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUevent, *CUmodule, *CUfunction;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char bytes[16]; } CUuuid;
typedef int ncclResult_t;
typedef void *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
    size_t size;
    unsigned int magic, version;
    int blocking, cgaClusterSize, minCTAs, maxCTAs;
    const char *netName;
} ncclConfig_t;
typedef struct {
    uint64_t src, dst, count;
    uint32_t op, first_tile; /* tiles of 65536 bytes (copy) or 16384 elements (casts) */
} PackEntry;

enum {
    OK = 0, E_VALUE = 1, E_OOM = 2, E_NOT_INIT = 3, E_NO_DEVICE = 100, E_DEVICE = 101,
    E_IMAGE = 200, E_CONTEXT = 201, E_HANDLE = 400, E_NOT_FOUND = 500, E_NOT_READY = 600,
    E_ILLEGAL = 700,
};
enum { nSuccess = 0, nSystem = 2, nArg = 4, nUsage = 5, nInProgress = 7 };

#define CUDA_FUNCS(X)                                                                           \
    X(cuInit, "cuInit", CUresult, (unsigned))                                                   \
    X(cuDriverGetVersion, "cuDriverGetVersion", CUresult, (int *))                              \
    X(cuGetErrorName, "cuGetErrorName", CUresult, (CUresult, const char **))                    \
    X(cuGetErrorString, "cuGetErrorString", CUresult, (CUresult, const char **))                \
    X(cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *))                                  \
    X(cuDeviceGet, "cuDeviceGet", CUresult, (CUdevice *, int))                                  \
    X(cuDeviceGetUuid, "cuDeviceGetUuid_v2", CUresult, (CUuuid *, CUdevice))                    \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext *, CUdevice))  \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice))          \
    X(cuCtxGetCurrent, "cuCtxGetCurrent", CUresult, (CUcontext *))                              \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", CUresult, (CUcontext))                                \
    X(cuCtxSynchronize, "cuCtxSynchronize", CUresult, (void))                                   \
    X(cuMemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr *, size_t))                           \
    X(cuMemFree, "cuMemFree_v2", CUresult, (CUdeviceptr))                                       \
    X(cuMemGetAddressRange, "cuMemGetAddressRange_v2", CUresult, (CUdeviceptr *, size_t *, CUdeviceptr)) \
    X(cuPointerGetAttribute, "cuPointerGetAttribute", CUresult, (void *, int, CUdeviceptr))    \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult, (CUdeviceptr, const void *, size_t, CUstream)) \
    X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", CUresult, (CUipcMemHandle *, CUdeviceptr))       \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", CUresult, (CUdeviceptr *, CUipcMemHandle, unsigned)) \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", CUresult, (CUdeviceptr))                     \
    X(cuStreamCreate, "cuStreamCreate", CUresult, (CUstream *, unsigned))                       \
    X(cuStreamDestroy, "cuStreamDestroy_v2", CUresult, (CUstream))                              \
    X(cuStreamQuery, "cuStreamQuery", CUresult, (CUstream))                                     \
    X(cuStreamWaitEvent, "cuStreamWaitEvent", CUresult, (CUstream, CUevent, unsigned))          \
    X(cuEventCreate, "cuEventCreate", CUresult, (CUevent *, unsigned))                          \
    X(cuEventDestroy, "cuEventDestroy_v2", CUresult, (CUevent))                                 \
    X(cuEventRecord, "cuEventRecord", CUresult, (CUevent, CUstream))                            \
    X(cuEventQuery, "cuEventQuery", CUresult, (CUevent))                                        \
    X(cuModuleLoadData, "cuModuleLoadData", CUresult, (CUmodule *, const void *))               \
    X(cuModuleUnload, "cuModuleUnload", CUresult, (CUmodule))                                   \
    X(cuModuleGetFunction, "cuModuleGetFunction", CUresult, (CUfunction *, CUmodule, const char *)) \
    X(cuLaunchKernel, "cuLaunchKernel", CUresult,                                               \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,        \
       CUstream, void **, void **))

#define NCCL_FUNCS(X)                                                                           \
    X(ncclGetVersion, "ncclGetVersion", ncclResult_t, (int *))                                  \
    X(ncclGetErrorString, "ncclGetErrorString", const char *, (ncclResult_t))                   \
    X(ncclGetUniqueId, "ncclGetUniqueId", ncclResult_t, (ncclUniqueId *))                       \
    X(ncclCommInitRankConfig, "ncclCommInitRankConfig", ncclResult_t,                           \
      (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *))                                   \
    X(ncclCommGetAsyncError, "ncclCommGetAsyncError", ncclResult_t, (ncclComm_t, ncclResult_t *)) \
    X(ncclCommAbort, "ncclCommAbort", ncclResult_t, (ncclComm_t))                               \
    X(ncclCommDestroy, "ncclCommDestroy", ncclResult_t, (ncclComm_t))                           \
    X(ncclBroadcast, "ncclBroadcast", ncclResult_t,                                             \
      (const void *, void *, size_t, int, int, ncclComm_t, CUstream))

#define HOOKS(X)                                                                                \
    X(stats, "wsync_fake_stats", void, (struct wsync_fake_stats *))                             \
    X(reset_stats, "wsync_fake_reset_stats", void, (void))                                      \
    X(set_fail, "wsync_fake_set_fail", void, (const char *, int, int))                          \
    X(set_init_delay, "wsync_fake_nccl_set_init_delay_ms", void, (int))                         \
    X(shm_count, "wsync_fake_shm_count", int, (const char *))                                   \
    X(nccl_init_calls, "wsync_fake_nccl_init_calls", long long, (void))                         \
    X(allow_driver_after_fork, "wsync_fake_allow_driver_after_fork", void, (int))

#define FIELD(name, sym, ret, params) ret(*name) params;
static struct {
    CUDA_FUNCS(FIELD)
    NCCL_FUNCS(FIELD)
    HOOKS(FIELD)
} F;
#undef FIELD

static const char *g_lib_path;
static void *g_lib;

static int load(const char *path) {
    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        return -1;
    }
    int missing = 0;
#define BIND(name, sym, ret, params)                                                            \
    *(void **)(&F.name) = dlsym(g_lib, sym);                                                    \
    if (!F.name) {                                                                              \
        fprintf(stderr, "%s lacks %s\n", path, sym);                                            \
        missing = 1;                                                                            \
    }
    CUDA_FUNCS(BIND)
    NCCL_FUNCS(BIND)
    HOOKS(BIND)
#undef BIND
    return missing ? -1 : 0;
}

/* ---- helpers --------------------------------------------------------------------------------- */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The fake's allocations of process `pid` still in /dev/shm. */
static int shm_of_pid(pid_t pid) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "wsync-fakecuda-%d-", (int)pid);
    return F.shm_count(prefix);
}

static int shm_of_id(const ncclUniqueId *id) {
    static const char hex[] = "0123456789abcdef";
    char prefix[64] = "wsync-fakenccl-";
    size_t n = strlen(prefix);
    for (int i = 0; i < 16; ++i) {
        prefix[n++] = hex[(unsigned char)id->internal[8 + i] >> 4];
        prefix[n++] = hex[(unsigned char)id->internal[8 + i] & 15];
    }
    prefix[n] = 0;
    return F.shm_count(prefix);
}

static struct wsync_fake_stats stats(void) {
    struct wsync_fake_stats s;
    F.stats(&s);
    return s;
}

/* Retains device `dev`'s primary context and makes it current. */
static CUcontext use_device(int dev) {
    CUcontext ctx = NULL;
    assert_int_equal(F.cuDevicePrimaryCtxRetain(&ctx, dev), OK);
    assert_int_equal(F.cuCtxSetCurrent(ctx), OK);
    return ctx;
}

static void drop_device(int dev) {
    assert_int_equal(F.cuCtxSetCurrent(NULL), OK);
    assert_int_equal(F.cuDevicePrimaryCtxRelease(dev), OK);
}

/* Polls a stream until it is no longer CUDA_ERROR_NOT_READY (bounded by the test's alarm). */
static CUresult stream_wait(CUstream s) {
    CUresult rc;
    while ((rc = F.cuStreamQuery(s)) == E_NOT_READY) sleep_ms(1);
    return rc;
}

/* Checks in child processes: report and exit non-zero, never longjmp into cmocka. */
#define CK(cond)                                                                                \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "child %d: check failed at %s:%d: %s\n", (int)getpid(), __FILE__,   \
                    __LINE__, #cond);                                                           \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)
#define CK_EQ(a, b)                                                                             \
    do {                                                                                        \
        long long a_ = (long long)(a), b_ = (long long)(b);                                     \
        if (a_ != b_) {                                                                         \
            fprintf(stderr, "child %d: %s:%d: %s == %lld, want %s == %lld\n", (int)getpid(),     \
                    __FILE__, __LINE__, #a, a_, #b, b_);                                        \
            return 1;                                                                           \
        }                                                                                       \
    } while (0)

typedef int (*child_fn)(void *arg);

static pid_t spawn(child_fn fn, void *arg) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        int rc = fn(arg);
        fflush(stderr);
        _exit(rc);
    }
    assert_true(pid > 0);
    return pid;
}

/* The child's exit status (128 + signal if it died of one). */
static int reap(pid_t pid) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Runs this binary again in a fresh process (no cuInit yet) with `env` added; returns its exit
 * status. For what the driver reads only once per process. */
static int run_fresh(const char *mode, const char *const *env) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);
        for (const char *const *e = env; *e; e += 2) {
            if (e[1]) setenv(e[0], e[1], 1);
            else unsetenv(e[0]);
        }
        execl("/proc/self/exe", "fake_gpu_selftest", "--fresh", mode, (char *)NULL);
        _exit(127);
    }
    return reap(pid);
}

/* Entries named for this pid before the test: left by an earlier process that had the same pid
 * and was killed (a killed process cannot clean up; pids are reused on a busy machine). */
static int shm_before;

static int setup(void **state) {
    (void)state;
    alarm(60);
    shm_before = shm_of_pid(getpid());
    assert_int_equal(F.cuInit(0), OK);
    assert_int_equal(F.cuCtxSetCurrent(NULL), OK);
    F.set_fail(NULL, 0, 0);
    /* These tests check the fake's cross-process mechanisms from children forked after the
     * setup's cuInit, which the real driver (and the fake by default) forbids. */
    F.allow_driver_after_fork(1);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    F.set_fail(NULL, 0, 0);
    /* Every test frees what it made: nothing of this process is left in /dev/shm. Fewer than
     * before is fine: the fake sweeps a dead namesake's leftovers (a killed process that had
     * this pid; pids wrap at 32768 and scenario tests kill processes) at its first allocation,
     * or another process's sweep may. */
    assert_true(shm_of_pid(getpid()) <= shm_before);
    alarm(0);
    return 0;
}

/* ---- tests ----------------------------------------------------------------------------------- */
static void test_exports(void **state) {
    (void)state;
    /* load() already bound every symbol of both tables; check a few details of the loader's
     * view: versioned names only, and the plain hooks. */
    assert_null(dlsym(g_lib, "cuMemAlloc"));
    assert_null(dlsym(g_lib, "cuIpcOpenMemHandle"));
    assert_non_null(dlsym(g_lib, "cuMemAlloc_v2"));
    assert_non_null(dlsym(g_lib, "wsync_fake_stats"));
    /* Nothing internal leaks out. */
    assert_null(dlsym(g_lib, "_ZN10wsync_fake2stEv"));
}

static void test_init_and_devices(void **state) {
    (void)state;
    int v = 0, n = 0;
    assert_int_equal(F.cuInit(1), E_VALUE);
    assert_int_equal(F.cuDriverGetVersion(&v), OK);
    assert_int_equal(v, 13000);
    assert_int_equal(F.cuDeviceGetCount(&n), OK);
    assert_int_equal(n, 2);
    CUuuid u0, u1;
    CUdevice d;
    assert_int_equal(F.cuDeviceGet(&d, 1), OK);
    assert_int_equal(d, 1);
    assert_int_equal(F.cuDeviceGet(&d, 2), E_DEVICE);
    assert_int_equal(F.cuDeviceGetUuid(&u0, 0), OK);
    assert_int_equal(F.cuDeviceGetUuid(&u1, 1), OK);
    assert_int_equal((unsigned char)u0.bytes[0], 0x0f);
    assert_int_equal((unsigned char)u1.bytes[0], 0x1f);
    assert_memory_not_equal(u0.bytes, u1.bytes, 16);
    static const CUresult codes[] = {0, 1, 2, 3, 100, 101, 200, 201, 400, 500, 600, 700, 801, 999};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
        const char *name = NULL, *text = NULL;
        assert_int_equal(F.cuGetErrorName(codes[i], &name), OK);
        assert_int_equal(F.cuGetErrorString(codes[i], &text), OK);
        assert_true(strncmp(name, codes[i] ? "CUDA_ERROR_" : "CUDA_SUCCESS", 11) == 0);
        assert_true(strlen(text) > 0);
    }
    const char *name = NULL, *text = "x";
    assert_int_equal(F.cuGetErrorName(100, &name), OK);
    assert_string_equal(name, "CUDA_ERROR_NO_DEVICE");
    assert_int_equal(F.cuGetErrorName(12345, &name), E_VALUE);
    assert_null(name);
    assert_int_equal(F.cuGetErrorString(12345, &text), E_VALUE);
    assert_null(text);
}

#define UA "GPU-aaaaaaaa-0000-4000-8000-00000000000a"
#define UB "bbbbbbbb00004000800000000000000b"
#define UC "GPU-cccccccc-0000-4000-8000-00000000000c"

/* Runs in a fresh process (see run_fresh): checks one device configuration. Exit 0 = pass. */
static int fresh_devices(const char *mode) {
    if (strcmp(mode, "no-device") == 0) {
        CK_EQ(F.cuInit(0), E_NO_DEVICE);
        int n = -1;
        CK_EQ(F.cuDeviceGetCount(&n), E_NOT_INIT);
        CK_EQ(F.cuInit(0), E_NO_DEVICE);  /* the first answer stays */
        return 0;
    }
    if (strcmp(mode, "bad-list") == 0) {
        CK_EQ(F.cuInit(0), E_VALUE);
        return 0;
    }
    /* mode: the expected first bytes of the visible devices' UUIDs, e.g. "ca" */
    CUresult rc = F.cuInit(0);
    if (!*mode) {
        CK_EQ(rc, E_NO_DEVICE);
        return 0;
    }
    CK_EQ(rc, OK);
    int n = 0;
    CK_EQ(F.cuDeviceGetCount(&n), OK);
    CK_EQ(n, (int)strlen(mode));
    for (int i = 0; i < n; ++i) {
        CUuuid u;
        CK_EQ(F.cuDeviceGetUuid(&u, i), OK);
        int want = mode[i] - 'a' + 10;
        CK_EQ((unsigned char)u.bytes[0], want * 16 + want);
        CK_EQ((unsigned char)u.bytes[15], want);
    }
    return 0;
}

static void test_visible_devices(void **state) {
    (void)state;
    const char *list = UA "," UB " , " UC;
    struct {
        const char *cvd, *expect;
    } cases[] = {
        {NULL, "abc"},
        {"2,0", "ca"},
        {"GPU-bb,5,0", "b"},          /* an unknown entry hides itself and the rest */
        {"GPU-CCCC,1", "cb"},         /* UUID prefixes, any case */
        {"1,1,0", "b"},               /* a repeat ends the list */
        {"0,MIG-abc,1", "a"},
        {"", ""},                     /* nothing visible: CUDA_ERROR_NO_DEVICE */
        {"-1", ""},
        {" 2 , 1 ", "cb"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        const char *env[] = {"WSYNC_FAKE_CUDA_DEVICES", list, "CUDA_VISIBLE_DEVICES", cases[i].cvd, NULL};
        int rc = run_fresh(cases[i].expect, env);
        if (rc != 0) fail_msg("CUDA_VISIBLE_DEVICES='%s': child exit %d", cases[i].cvd ? cases[i].cvd : "(unset)", rc);
    }
    const char *nodev[] = {"WSYNC_FAKE_CUDA_NO_DEVICE", "1", NULL};
    assert_int_equal(run_fresh("no-device", nodev), 0);
    const char *bad[] = {"WSYNC_FAKE_CUDA_DEVICES", "GPU-1234", NULL};
    assert_int_equal(run_fresh("bad-list", bad), 0);
    /* The defaults can be picked by prefix, too. */
    const char *defaults[] = {"CUDA_VISIBLE_DEVICES", "GPU-1,GPU-0f", NULL};
    assert_int_equal(run_fresh("default-swap", defaults), 0);
}

static int g_marker;

static void *thread_current(void *arg) {
    CUcontext c = (CUcontext)1;
    CUdeviceptr p = 0;
    int ok = F.cuCtxGetCurrent(&c) == OK && c == NULL && F.cuMemAlloc(&p, 64) == E_CONTEXT;
    return ok ? arg : NULL;
}

static void test_contexts(void **state) {
    (void)state;
    CUdeviceptr p = 0;
    CUstream s = NULL;
    CUmodule m = NULL;
    assert_int_equal(F.cuMemAlloc(&p, 64), E_CONTEXT);
    assert_int_equal(F.cuStreamCreate(&s, 0), E_CONTEXT);
    assert_int_equal(F.cuModuleLoadData(&m, ".entry wsync_pack("), E_CONTEXT);
    assert_int_equal(F.cuCtxSynchronize(), E_CONTEXT);
    assert_int_equal(F.cuCtxSetCurrent((CUcontext)&p), E_CONTEXT);
    CUcontext c0 = NULL, c0b = NULL, c1 = NULL, cur = NULL;
    assert_int_equal(F.cuDevicePrimaryCtxRetain(&c0, 0), OK);
    assert_int_equal(F.cuDevicePrimaryCtxRetain(&c0b, 0), OK);
    assert_int_equal(F.cuDevicePrimaryCtxRetain(&c1, 1), OK);
    assert_ptr_equal(c0, c0b);
    assert_ptr_not_equal(c0, c1);
    assert_int_equal(F.cuDevicePrimaryCtxRetain(&c1, 7), E_DEVICE);
    /* The current context is per thread and decides the device of new memory. */
    assert_int_equal(F.cuCtxSetCurrent(c1), OK);
    assert_int_equal(F.cuCtxGetCurrent(&cur), OK);
    assert_ptr_equal(cur, c1);
    pthread_t t;
    void *res = NULL;
    assert_int_equal(pthread_create(&t, NULL, thread_current, &g_marker), 0);
    pthread_join(t, &res);
    assert_ptr_equal(res, &g_marker);
    CUdeviceptr p1 = 0, p0 = 0;
    int ord = -1;
    assert_int_equal(F.cuMemAlloc(&p1, 100), OK);
    assert_int_equal(F.cuPointerGetAttribute(&ord, 9, p1), OK);
    assert_int_equal(ord, 1);
    assert_int_equal(F.cuCtxSetCurrent(c0), OK);
    assert_int_equal(F.cuMemAlloc(&p0, 100), OK);
    assert_int_equal(F.cuPointerGetAttribute(&ord, 9, p0), OK);
    assert_int_equal(ord, 0);
    /* Refcounted: one release of two leaves the context alive. */
    assert_int_equal(F.cuDevicePrimaryCtxRelease(0), OK);
    assert_int_equal(F.cuMemFree(p0), OK);
    F.reset_stats();
    /* The last release destroys device 1's context and with it its memory (a leak: "reclaimed"). */
    assert_int_equal(F.cuDevicePrimaryCtxRelease(1), OK);
    assert_int_equal(F.cuDevicePrimaryCtxRelease(1), E_CONTEXT);
    struct wsync_fake_stats st = stats();
    assert_int_equal(st.reclaimed, 1);
    assert_int_equal(st.frees, 0);
    assert_int_equal(st.live_allocs, 0);
    assert_int_equal(F.cuCtxSetCurrent(c1), OK);  /* a released context can be current... */
    assert_int_equal(F.cuMemAlloc(&p, 64), E_CONTEXT);  /* ...but not used */
    drop_device(0);
    assert_int_equal(F.cuDevicePrimaryCtxRelease(0), E_CONTEXT);
}

static void test_memory(void **state) {
    (void)state;
    use_device(0);
    F.reset_stats();
    const pid_t me = getpid();
    CUdeviceptr a = 0, b = 0, base = 0;
    size_t size = 0;
    assert_int_equal(F.cuMemAlloc(&a, 0), E_VALUE);
    assert_int_equal(F.cuMemAlloc(&a, 1000), OK);
    assert_int_equal(shm_of_pid(me), 1);
    memset((void *)a, 0x5a, 1000);  /* device memory is host-addressable here */
    assert_int_equal(F.cuMemGetAddressRange(&base, &size, a + 999), OK);
    assert_true(base == a && size == 1000);
    assert_int_equal(F.cuMemGetAddressRange(&base, NULL, a + 1000), E_NOT_FOUND);
    assert_int_equal(F.cuMemGetAddressRange(&base, &size, (CUdeviceptr)&base), E_NOT_FOUND);
    unsigned long long id_a = 0, id_b = 0, id_c = 0;
    assert_int_equal(F.cuPointerGetAttribute(&id_a, 7, a + 10), OK);
    assert_int_equal(F.cuPointerGetAttribute(&id_a, 7, (CUdeviceptr)&id_a), E_VALUE);
    assert_int_equal(F.cuPointerGetAttribute(&id_a, 12345, a), E_VALUE);
    assert_int_equal(F.cuMemAlloc(&b, 1 << 20), OK);
    assert_int_equal(F.cuPointerGetAttribute(&id_b, 7, b), OK);
    assert_true(id_a != id_b);
    assert_int_equal(F.cuMemFree(a + 8), E_VALUE);
    assert_int_equal(F.cuMemFree(a), OK);
    assert_int_equal(F.cuMemFree(a), E_VALUE);
    assert_int_equal(F.cuMemFree(12345), E_VALUE);
    /* Buffer ids are never reused, even if an address is. */
    CUdeviceptr c = 0;
    assert_int_equal(F.cuMemAlloc(&c, 1000), OK);
    assert_int_equal(F.cuPointerGetAttribute(&id_c, 7, c), OK);
    assert_true(id_c != id_a && id_c != id_b);
    struct wsync_fake_stats st = stats();
    assert_int_equal(st.allocs, 3);
    assert_int_equal(st.frees, 1);
    assert_int_equal(st.live_allocs, 2);
    assert_int_equal(F.cuMemFree(b), OK);
    assert_int_equal(F.cuMemFree(c), OK);
    assert_int_equal(shm_of_pid(me), 0);
    /* Injected out-of-memory: the 2nd call from now fails, once. */
    F.set_fail("cuMemAlloc", 1, E_OOM);
    assert_int_equal(F.cuMemAlloc(&a, 10), OK);
    assert_int_equal(F.cuMemAlloc(&b, 10), E_OOM);
    assert_int_equal(F.cuMemAlloc(&b, 10), OK);
    assert_int_equal(F.cuMemFree(a), OK);
    assert_int_equal(F.cuMemFree(b), OK);
    drop_device(0);
}

static void test_ipc_same_process(void **state) {
    (void)state;
    use_device(0);
    CUdeviceptr a = 0, p = 0;
    CUipcMemHandle h1, h2;
    assert_int_equal(F.cuMemAlloc(&a, 4096), OK);
    assert_int_equal(F.cuIpcGetMemHandle(&h1, a + 16), E_VALUE);  /* not the base */
    assert_int_equal(F.cuIpcGetMemHandle(&h1, a), OK);
    assert_int_equal(F.cuIpcGetMemHandle(&h2, a), OK);
    assert_memory_equal(&h1, &h2, sizeof h1);  /* the same bytes each time */
    assert_int_equal(F.cuIpcOpenMemHandle(&p, h1, 1), E_CONTEXT);  /* own memory: refused */
    memset(&h2, 0, sizeof h2);
    assert_int_equal(F.cuIpcOpenMemHandle(&p, h2, 1), E_VALUE);
    assert_int_equal(F.cuIpcCloseMemHandle(a), E_VALUE);
    assert_int_equal(F.cuMemFree(a), OK);
    drop_device(0);
}

struct ipc_arg {
    CUipcMemHandle h;
    int device;
};

/* Opens the parent's allocation twice, checks it, writes a reply, closes. */
static int child_ipc_open(void *argp) {
    struct ipc_arg *arg = argp;
    CUcontext ctx;
    CK_EQ(F.cuDevicePrimaryCtxRetain(&ctx, arg->device), OK);
    CK_EQ(F.cuCtxSetCurrent(ctx), OK);
    struct wsync_fake_stats st;
    F.stats(&st);
    CK_EQ(st.ipc_open, 0);  /* a forked child starts with fresh counters */
    CUdeviceptr p = 0, q = 0, base = 0;
    size_t size = 0;
    CK_EQ(F.cuIpcOpenMemHandle(&p, arg->h, 1), OK);
    CK_EQ(F.cuIpcOpenMemHandle(&q, arg->h, 1), OK);
    CK(p == q);
    F.stats(&st);
    CK_EQ(st.ipc_open, 2);
    CK_EQ(st.ipc_live, 1);
    const unsigned char *b = (const unsigned char *)p;
    for (int i = 0; i < 5000; ++i)
        if (i < 100 || i >= 105) CK_EQ(b[i], (unsigned char)(i * 7));  /* 100..104: a reply */
    CK_EQ(F.cuMemGetAddressRange(&base, &size, p + 4999), OK);
    CK(base == p && size == 5000);
    int ord = -1;
    unsigned long long id = 0;
    CK_EQ(F.cuPointerGetAttribute(&ord, 9, p), OK);
    CK_EQ(ord, arg->device);  /* owned by the opener's current device */
    CK_EQ(F.cuPointerGetAttribute(&id, 7, p), OK);
    memcpy((void *)(p + 100), "reply", 5);
    /* Injected failure of the next open; a repeat open works again. */
    F.set_fail("cuIpcOpenMemHandle_v2", 0, E_OOM);
    CK_EQ(F.cuIpcOpenMemHandle(&q, arg->h, 1), E_OOM);
    CK_EQ(F.cuIpcCloseMemHandle(p + 1), E_VALUE);
    CK_EQ(F.cuIpcCloseMemHandle(p), OK);
    F.stats(&st);
    CK_EQ(st.ipc_live, 1);
    CK_EQ(F.cuIpcCloseMemHandle(p), OK);
    CK_EQ(F.cuIpcCloseMemHandle(p), E_VALUE);
    F.stats(&st);
    CK_EQ(st.ipc_close, 2);
    CK_EQ(st.ipc_live, 0);
    CK_EQ(F.cuCtxSetCurrent(NULL), OK);
    CK_EQ(F.cuDevicePrimaryCtxRelease(arg->device), OK);
    return 0;
}

static int child_ipc_gone(void *argp) {
    struct ipc_arg *arg = argp;
    CUcontext ctx;
    CUdeviceptr p = 0;
    CK_EQ(F.cuDevicePrimaryCtxRetain(&ctx, 0), OK);
    CK_EQ(F.cuCtxSetCurrent(ctx), OK);
    CK_EQ(F.cuIpcOpenMemHandle(&p, arg->h, 1), E_HANDLE);
    CK_EQ(F.cuDevicePrimaryCtxRelease(0), OK);
    return 0;
}

static void test_ipc_two_process(void **state) {
    (void)state;
    use_device(0);
    F.reset_stats();
    CUdeviceptr a = 0;
    struct ipc_arg arg;
    assert_int_equal(F.cuMemAlloc(&a, 5000), OK);
    for (int i = 0; i < 5000; ++i) ((unsigned char *)a)[i] = (unsigned char)(i * 7);
    assert_int_equal(F.cuIpcGetMemHandle(&arg.h, a), OK);
    assert_int_equal(stats().ipc_get_handle, 1);
    arg.device = 1;
    assert_int_equal(reap(spawn(child_ipc_open, &arg)), 0);
    arg.device = 0;
    assert_int_equal(reap(spawn(child_ipc_open, &arg)), 0);
    assert_memory_equal((void *)(a + 100), "reply", 5);  /* the child wrote our memory */
    assert_int_equal(F.cuMemFree(a), OK);
    assert_int_equal(reap(spawn(child_ipc_gone, &arg)), 0);  /* freed: the name is gone */
    drop_device(0);
}

static const char kPtx[] =
    "//\n// Generated by a test\n//\n.version 9.0\n.target sm_80\n.address_size 64\n\n"
    ".visible .entry wsync_pack(\n\t.param .u64 wsync_pack_param_0,\n\t.param .u32 wsync_pack_param_1\n)\n{\n\tret;\n}\n";

static void test_streams_and_events(void **state) {
    (void)state;
    use_device(0);
    F.reset_stats();
    CUstream s1 = NULL, s2 = NULL;
    CUevent ev = NULL;
    assert_int_equal(F.cuStreamCreate(&s1, 2), E_VALUE);
    assert_int_equal(F.cuStreamCreate(&s1, 1), OK);
    assert_int_equal(F.cuStreamCreate(&s2, 0), OK);
    assert_int_equal(F.cuEventCreate(&ev, 2), OK);
    assert_int_equal(stats().streams_live, 2);
    assert_int_equal(F.cuEventQuery(ev), OK);  /* never recorded: complete */
    assert_int_equal(F.cuStreamWaitEvent(s2, ev, 0), OK);
    CUdeviceptr a = 0, b = 0;
    assert_int_equal(F.cuMemAlloc(&a, 4096), OK);
    assert_int_equal(F.cuMemAlloc(&b, 4096), OK);
    /* HtoD stages pageable host memory before it returns: the buffer may change at once. */
    char host[4096];
    memset(host, 'x', sizeof host);
    assert_int_equal(F.cuMemcpyHtoDAsync(a, host, sizeof host, s1), OK);
    memset(host, 'y', sizeof host);
    assert_int_equal(F.cuEventRecord(ev, s1), OK);
    assert_int_equal(F.cuStreamWaitEvent(s2, ev, 0), OK);
    assert_int_equal(F.cuMemcpyDtoDAsync(b, a, 4096, s2), OK);
    assert_int_equal(stream_wait(s2), OK);
    assert_int_equal(F.cuEventQuery(ev), OK);
    assert_int_equal(((char *)b)[0], 'x');
    assert_int_equal(((char *)b)[4095], 'x');
    /* The NULL stream is a queue of its own. */
    assert_int_equal(F.cuMemcpyHtoDAsync(a, host, 10, NULL), OK);
    assert_int_equal(F.cuCtxSynchronize(), OK);
    assert_int_equal(F.cuStreamQuery(NULL), OK);
    assert_int_equal(((char *)a)[9], 'y');
    assert_int_equal(F.cuStreamQuery((CUstream)&a), E_HANDLE);
    assert_int_equal(stats().memcpy_calls, 3);
    /* A bad device address fails the operation when it runs, and the stream for good. */
    assert_int_equal(F.cuMemcpyHtoDAsync(0, host, 8, s1), OK);
    assert_int_equal(F.cuEventRecord(ev, s1), OK);
    assert_int_equal(F.cuMemcpyHtoDAsync(a, "zz", 2, s1), OK);
    assert_int_equal(stream_wait(s1), E_ILLEGAL);
    assert_int_equal(F.cuStreamQuery(s1), E_ILLEGAL);
    assert_int_equal(F.cuEventQuery(ev), E_ILLEGAL);
    assert_int_equal(((char *)a)[0], 'y');  /* nothing after the failure ran */
    assert_int_equal(F.cuCtxSynchronize(), E_ILLEGAL);
    assert_int_equal(stats().stream_failures, 1);
    /* Copies from host memory that is not an allocation fail too. */
    assert_int_equal(F.cuMemcpyDtoDAsync(a, (CUdeviceptr)host, 8, s2), OK);
    assert_int_equal(stream_wait(s2), E_ILLEGAL);
    assert_int_equal(F.cuStreamDestroy(s1), OK);
    assert_int_equal(F.cuStreamDestroy(s1), E_HANDLE);
    assert_int_equal(F.cuStreamDestroy(s2), OK);
    assert_int_equal(F.cuCtxSynchronize(), OK);  /* the failed streams are gone */
    /* Injected asynchronous failure. */
    assert_int_equal(F.cuStreamCreate(&s1, 0), OK);
    F.set_fail("cuMemcpyDtoDAsync@async", 0, 0);
    assert_int_equal(F.cuMemcpyDtoDAsync(b, a, 16, s1), OK);
    assert_int_equal(stream_wait(s1), E_ILLEGAL);
    assert_int_equal(F.cuStreamDestroy(s1), OK);
    assert_int_equal(F.cuEventDestroy(ev), OK);
    assert_int_equal(F.cuEventDestroy(ev), E_HANDLE);
    assert_int_equal(stats().streams_live, 0);
    assert_int_equal(stats().events_live, 0);
    assert_int_equal(F.cuMemFree(a), OK);
    assert_int_equal(F.cuMemFree(b), OK);
    drop_device(0);
}

/* Reference conversions, written differently from the fake's bit tricks. */
static uint16_t ref_bf16(float f) {
    if (isnan(f)) return 0x7fff;
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t lo = x & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    if ((hi & 0x7f800000u) == 0x7f800000u) hi = (hi & 0x80000000u) | 0x7f800000u;  /* to inf */
    memcpy(&fhi, &hi, 4);
    if (isinf(f)) return (uint16_t)(x >> 16);
    double dlo = fabs((double)f - (double)flo), dhi = fabs((double)fhi - (double)f);
    /* Beyond the largest bfloat16 the "next" value is the binade above 2^128. */
    if (isinf(fhi)) dhi = fabs(ldexp(signbit(f) ? -1.0 : 1.0, 128) - (double)f);
    if (dlo < dhi || (dlo == dhi && !((lo >> 16) & 1))) return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

static uint16_t ref_f16(float f) {
    if (isnan(f)) return 0x7fff;
    const uint16_t sign = signbit(f) ? 0x8000 : 0;
    const double d = fabs((double)f);
    if (d >= 65520.0) return sign | 0x7c00;  /* halfway to 2^16 and beyond: infinity */
    int ex = 0;
    frexp(d, &ex);  /* d = m * 2^ex, m in [0.5, 1) */
    const int e = d < 0x1p-14 ? -14 : ex - 1;
    const double unit = ldexp(1.0, e - 10), q = d / unit, n = floor(q), r = q - n;
    const double k = r > 0.5 || (r == 0.5 && fmod(n, 2.0) == 1.0) ? n + 1 : n;
    if (d < 0x1p-14) return sign | (uint16_t)k;  /* subnormal (k may be 1024: the smallest normal) */
    return sign | (uint16_t)(((e + 15) << 10) + (int)k - 1024);
}

static uint16_t fake_cast(CUfunction fn, CUstream s, CUdeviceptr buf, float f, uint32_t op);

static void test_kernel_pack(void **state) {
    (void)state;
    CUmodule m = NULL;
    CUfunction fn = NULL;
    use_device(0);
    F.reset_stats();
    assert_int_equal(F.cuModuleLoadData(&m, "not ptx"), E_IMAGE);
    assert_int_equal(F.cuModuleLoadData(&m, ".entry wsync_pack2("), E_IMAGE);
    assert_int_equal(F.cuModuleLoadData(&m, "\x7f" "ELF\2\1\1"), E_IMAGE);
    assert_int_equal(F.cuModuleLoadData(&m, kPtx), OK);
    assert_int_equal(stats().modules_loaded, 1);
    assert_int_equal(F.cuModuleGetFunction(&fn, m, "other"), E_NOT_FOUND);
    assert_int_equal(F.cuModuleGetFunction(&fn, m, "wsync_pack"), OK);
    CUstream s = NULL;
    assert_int_equal(F.cuStreamCreate(&s, 1), OK);
    enum { N = 1000 };
    CUdeviceptr src = 0, dst = 0, table = 0;
    assert_int_equal(F.cuMemAlloc(&src, N * 4 + 64), OK);
    assert_int_equal(F.cuMemAlloc(&dst, 8192), OK);
    assert_int_equal(F.cuMemAlloc(&table, 3 * sizeof(PackEntry)), OK);
    float *fs = (float *)src;
    for (int i = 0; i < N; ++i) fs[i] = (float)(i - 500) * 0.37f + 1e-3f * (float)i;
    /* entry 0: copy 999 bytes to an odd address; 1: bf16; 2: f16 */
    PackEntry e[3] = {
        {src, dst + 1, 999, 0, 0},
        {src, dst + 1024, N, 1, 1},
        {src, dst + 3072, N / 2, 2, 2},
    };
    assert_int_equal(F.cuMemcpyHtoDAsync(table, e, sizeof e, s), OK);
    unsigned count = 3, tiles = 3;
    void *params[] = {&table, &count, &tiles};
    void *two_params[] = {&table, &count, NULL};
    assert_int_equal(F.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, s, two_params, NULL), E_VALUE);
    assert_int_equal(F.cuLaunchKernel(fn, 0, 1, 1, 256, 1, 1, 0, s, params, NULL), E_VALUE);
    assert_int_equal(F.cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, s, params, NULL), E_VALUE);
    assert_int_equal(F.cuLaunchKernel(fn, 4, 3, 1, 256, 1, 1, 0, s, params, NULL), OK);
    count = 0;  /* arguments are taken at launch */
    tiles = 0;
    assert_int_equal(stream_wait(s), OK);
    assert_int_equal(stats().kernel_launches, 1);
    assert_memory_equal((void *)(dst + 1), (void *)src, 999);
    const uint16_t *bf = (const uint16_t *)(dst + 1024), *hf = (const uint16_t *)(dst + 3072);
    for (int i = 0; i < N; ++i) assert_int_equal(bf[i], ref_bf16(fs[i]));
    for (int i = 0; i < N / 2; ++i) assert_int_equal(hf[i], ref_f16(fs[i]));
#ifdef __FLT16_MAX__
    /* And against the compiler's conversion, where it has one. */
    for (int i = 0; i < N / 2; ++i) {
        _Float16 h = (_Float16)fs[i];
        uint16_t bits;
        memcpy(&bits, &h, 2);
        assert_int_equal(hf[i], bits);
    }
#endif
    /* Special values, one launch each (exercises launch after launch on one stream). */
    static const struct {
        float f;
        uint16_t bf16, f16;
    } cases[] = {
        {1.0f, 0x3f80, 0x3c00},
        {-0.0f, 0x8000, 0x8000},
        {1.0f + 0x1p-8f, 0x3f80, 0x3c04},          /* bf16 tie to even */
        {1.0f + 0x3p-8f, 0x3f82, 0x3c0c},
        {1.0f + 0x1p-11f, 0x3f80, 0x3c00},         /* f16 tie to even */
        {1.0f + 0x3p-11f, 0x3f80, 0x3c02},
        {65504.0f, 0x4780, 0x7bff},                /* f16 max */
        {65519.99f, 0x4780, 0x7bff},
        {65520.0f, 0x4780, 0x7c00},                /* rounds to f16 infinity */
        {1e10f, 0x5015, 0x7c00},
        {-1e10f, 0xd015, 0xfc00},
        {0x1p-14f, 0x3880, 0x0400},                /* smallest f16 normal */
        {0x1p-24f, 0x3380, 0x0001},                /* smallest f16 subnormal */
        {0x1p-25f, 0x3300, 0x0000},                /* tie: to even (zero) */
        {0x1.8p-25f, 0x3340, 0x0001},
        {0x3p-25f, 0x33c0, 0x0002},                /* 1.5 units: tie to even (2) */
        {FLT_MAX, 0x7f80, 0x7c00},                 /* rounds to bf16 infinity */
        {INFINITY, 0x7f80, 0x7c00},
        {-INFINITY, 0xff80, 0xfc00},
        {NAN, 0x7fff, 0x7fff},                     /* canonical NaN */
        {-NAN, 0x7fff, 0x7fff},
        {1e-45f, 0x0000, 0x0000},                  /* f32 subnormal: too small for either */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        uint16_t b16 = fake_cast(fn, s, src, cases[i].f, 1), h16 = fake_cast(fn, s, src, cases[i].f, 2);
        if (b16 != cases[i].bf16 || h16 != cases[i].f16)
            fail_msg("case %zu (%a): bf16 %04x want %04x, f16 %04x want %04x", i, (double)cases[i].f,
                     b16, cases[i].bf16, h16, cases[i].f16);
        assert_int_equal(ref_bf16(cases[i].f), cases[i].bf16);
        assert_int_equal(ref_f16(cases[i].f), cases[i].f16);
    }
    /* A sweep of float32 bit patterns over every exponent, both casts in one launch. */
    {
        enum { M = 1 << 18 };
        CUdeviceptr in = 0, out = 0, tab = 0;
        assert_int_equal(F.cuMemAlloc(&in, M * 4), OK);
        assert_int_equal(F.cuMemAlloc(&out, M * 4), OK);
        assert_int_equal(F.cuMemAlloc(&tab, 2 * sizeof(PackEntry)), OK);
        uint32_t *bits = (uint32_t *)in, x = 0x12345678u;
        for (int i = 0; i < M; ++i) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            bits[i] = i < 65536 ? (uint32_t)i << 16 | (x & 0xffffu) : x;  /* every bf16 pattern too */
        }
        PackEntry two[2] = {{in, out, M, 1, 0}, {in, out + M * 2, M, 2, M / 16384}};
        memcpy((void *)tab, two, sizeof two);
        CUdeviceptr tab_arg = tab;
        unsigned two_count = 2, two_tiles = 2 * (M / 16384);
        void *args[] = {&tab_arg, &two_count, &two_tiles};
        assert_int_equal(F.cuLaunchKernel(fn, 64, 1, 1, 256, 1, 1, 0, s, args, NULL), OK);
        assert_int_equal(stream_wait(s), OK);
        const uint16_t *ob = (const uint16_t *)out, *oh = (const uint16_t *)(out + M * 2);
        for (int i = 0; i < M; ++i) {
            float f;
            memcpy(&f, &bits[i], 4);
            if (ob[i] != ref_bf16(f) || oh[i] != ref_f16(f))
                fail_msg("0x%08x: bf16 %04x want %04x, f16 %04x want %04x", bits[i], ob[i],
                         ref_bf16(f), oh[i], ref_f16(f));
        }
        assert_int_equal(F.cuMemFree(in), OK);
        assert_int_equal(F.cuMemFree(out), OK);
        assert_int_equal(F.cuMemFree(tab), OK);
    }
    /* Tiles: a copy of 3.5 tiles, an empty entry, a cast of 2 tiles + 1 element; each tile is
     * found by first_tile as the kernel finds it. Numbered right, every byte lands; a tile count
     * that is not the entries' sum fails the launch; a wrong first_tile leaves bytes unpacked. */
    {
        enum { C = 65536 * 3 + 32768, E = 2 * 16384 + 1 };
        CUdeviceptr in = 0, out = 0, tab = 0;
        assert_int_equal(F.cuMemAlloc(&in, C), OK);
        assert_int_equal(F.cuMemAlloc(&out, C + 2 * E), OK);
        assert_int_equal(F.cuMemAlloc(&tab, 3 * sizeof(PackEntry)), OK);
        for (int i = 0; i < C; ++i) ((unsigned char *)in)[i] = (unsigned char)(i * 7 + 3);
        PackEntry three[3] = {{in, out, C, 0, 0}, {in, out, 0, 0, 4}, {in, out + C, E, 1, 4}};
        CUdeviceptr tab_arg = tab;
        unsigned n3 = 3, t3 = 7;
        void *args[] = {&tab_arg, &n3, &t3};
        memcpy((void *)tab, three, sizeof three);
        memset((void *)out, 0, C + 2 * E);
        assert_int_equal(F.cuLaunchKernel(fn, 7, 1, 1, 256, 1, 1, 0, s, args, NULL), OK);
        assert_int_equal(stream_wait(s), OK);
        assert_memory_equal((void *)out, (void *)in, C);
        const float *fin = (const float *)in;
        for (int i = 0; i < E; ++i) assert_int_equal(((const uint16_t *)(out + C))[i], ref_bf16(fin[i]));
        /* Each failure fails its stream for good (the driver's sticky error), so each gets one. */
        CUstream bad_s = NULL;
        t3 = 6;  /* one short of the entries' sum */
        assert_int_equal(F.cuStreamCreate(&bad_s, 1), OK);
        assert_int_equal(F.cuLaunchKernel(fn, 6, 1, 1, 256, 1, 1, 0, bad_s, args, NULL), OK);
        assert_int_equal(stream_wait(bad_s), E_ILLEGAL);
        assert_int_equal(F.cuStreamDestroy(bad_s), OK);
        t3 = 7;
        three[2].first_tile = 5;  /* entry 0's tile 4 (its last half tile) is never packed */
        memcpy((void *)tab, three, sizeof three);
        assert_int_equal(F.cuStreamCreate(&bad_s, 1), OK);
        assert_int_equal(F.cuLaunchKernel(fn, 7, 1, 1, 256, 1, 1, 0, bad_s, args, NULL), OK);
        assert_int_equal(stream_wait(bad_s), E_ILLEGAL);
        assert_int_equal(F.cuStreamDestroy(bad_s), OK);
        assert_int_equal(F.cuMemFree(in), OK);
        assert_int_equal(F.cuMemFree(out), OK);
        assert_int_equal(F.cuMemFree(tab), OK);
    }
    /* A bad address in an entry fails the launch and the stream. */
    PackEntry bad = {src, 8, 4, 0, 0};
    count = 1;
    tiles = 1;
    assert_int_equal(F.cuMemcpyHtoDAsync(table, &bad, sizeof bad, s), OK);
    assert_int_equal(F.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, s, params, NULL), OK);
    assert_int_equal(stream_wait(s), E_ILLEGAL);
    assert_int_equal(F.cuStreamDestroy(s), OK);
    assert_int_equal(F.cuModuleUnload(m), OK);
    assert_int_equal(F.cuModuleUnload(m), E_HANDLE);
    assert_int_equal(F.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, NULL, params, NULL), E_HANDLE);
    assert_int_equal(stats().modules_live, 0);
    assert_int_equal(F.cuMemFree(src), OK);
    assert_int_equal(F.cuMemFree(dst), OK);
    assert_int_equal(F.cuMemFree(table), OK);
    drop_device(0);
}

/* One value through the emulated kernel: src[0] = f, cast into src + 64. */
static uint16_t fake_cast(CUfunction fn, CUstream s, CUdeviceptr buf, float f, uint32_t op) {
    PackEntry e = {buf, buf + 64, 1, op, 0};
    memcpy((void *)buf, &f, 4);
    memcpy((void *)(buf + 32), &e, sizeof e);
    CUdeviceptr table = buf + 32;
    unsigned count = 1, tiles = 1;
    void *params[] = {&table, &count, &tiles};
    assert_int_equal(F.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, s, params, NULL), OK);
    assert_int_equal(stream_wait(s), OK);
    uint16_t out;
    memcpy(&out, (void *)(buf + 64), 2);
    return out;
}

static void test_fail_injection(void **state) {
    (void)state;
    use_device(0);
    CUstream s = NULL;
    CUevent ev = NULL;
    F.set_fail("cuStreamCreate", 2, 999);
    for (int i = 0; i < 2; ++i) {
        assert_int_equal(F.cuStreamCreate(&s, 0), OK);
        assert_int_equal(F.cuStreamDestroy(s), OK);
    }
    assert_int_equal(F.cuStreamCreate(&s, 0), 999);
    assert_int_equal(F.cuStreamCreate(&s, 0), OK);  /* once only */
    F.set_fail("cuEventCreate", 0, 2);
    F.set_fail("cuEventCreate", -1, 0);  /* cancelled */
    assert_int_equal(F.cuEventCreate(&ev, 0), OK);
    F.set_fail("cuEventRecord", 0, 2);
    F.set_fail("cuEventQuery", 0, 3);
    F.set_fail(NULL, 0, 0);  /* all cancelled */
    assert_int_equal(F.cuEventRecord(ev, s), OK);
    F.set_fail("cuEventQuery", 0, 3);
    assert_int_equal(F.cuEventQuery(ev), 3);
    assert_int_equal(stream_wait(s), OK);
    assert_int_equal(F.cuEventQuery(ev), OK);
    assert_int_equal(F.cuEventDestroy(ev), OK);
    assert_int_equal(F.cuStreamDestroy(s), OK);
    drop_device(0);
}

/* ---- NCCL ------------------------------------------------------------------------------------ */
static ncclConfig_t config(int blocking) {
    ncclConfig_t c;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    c.magic = 0xcafebeef;
    c.version = 21400;
    c.blocking = blocking;
    c.cgaClusterSize = c.minCTAs = c.maxCTAs = INT32_MIN;
    return c;
}

/* Polls a communicator's asynchronous state until it is not ncclInProgress. */
static ncclResult_t comm_wait(ncclComm_t comm) {
    ncclResult_t st = nInProgress;
    for (;;) {
        if (F.ncclCommGetAsyncError(comm, &st) != nSuccess) return -1;
        if (st != nInProgress) return st;
        sleep_ms(1);
    }
}

static void test_nccl_basics(void **state) {
    (void)state;
    int v = 0;
    assert_int_equal(F.ncclGetVersion(&v), nSuccess);
    assert_int_equal(v, 22809);
    setenv("WSYNC_FAKE_NCCL_VERSION", "21300", 1);
    assert_int_equal(F.ncclGetVersion(&v), nSuccess);
    assert_int_equal(v, 21300);
    unsetenv("WSYNC_FAKE_NCCL_VERSION");
    for (int r = 0; r <= 7; ++r) {
        assert_non_null(F.ncclGetErrorString(r));
        for (int q = 0; q < r; ++q) assert_string_not_equal(F.ncclGetErrorString(r), F.ncclGetErrorString(q));
    }
    ncclUniqueId id, id2;
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    assert_int_equal(F.ncclGetUniqueId(&id2), nSuccess);
    assert_memory_not_equal(&id, &id2, sizeof id);
    ncclComm_t comm = (ncclComm_t)1;
    ncclConfig_t cfg = config(1);
    /* No current context. */
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), nUsage);
    use_device(0);
    cfg.magic = 1;
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), nArg);
    cfg = config(1);
    cfg.size = offsetof(ncclConfig_t, netName);
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), nArg);
    cfg = config(1);
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 0, id, 0, &cfg), nArg);
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 2, id, 2, &cfg), nArg);
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 2, id, -1, &cfg), nArg);
    /* One rank, blocking (INT_MIN is "undefined": the default, blocking). */
    cfg.blocking = INT32_MIN;
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), nSuccess);
    assert_int_equal(shm_of_id(&id), 1);
    assert_int_equal(comm_wait(comm), nSuccess);
    assert_int_equal(stats().comms_live, 1);
    CUdeviceptr a = 0;
    CUstream s = NULL;
    assert_int_equal(F.cuMemAlloc(&a, 256), OK);
    assert_int_equal(F.cuStreamCreate(&s, 1), OK);
    memset((void *)a, 'q', 128);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)(a + 128), 128, 2, 0, comm, s), nArg);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)(a + 128), 128, 1, 1, comm, s), nArg);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)(a + 128), 128, 1, 0, comm, s), nSuccess);
    assert_int_equal(stream_wait(s), OK);
    assert_int_equal(((char *)a)[255], 'q');  /* root copies send to recv */
    assert_int_equal(F.ncclCommDestroy(comm), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    ncclResult_t err = nSuccess;
    assert_int_equal(F.ncclCommDestroy(comm), nUsage);
    assert_int_equal(F.ncclCommAbort(comm), nUsage);
    assert_int_equal(F.ncclCommGetAsyncError(comm, &err), nUsage);
    assert_int_equal(err, nUsage);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)a, 1, 1, 0, comm, s), nUsage);
    assert_int_equal(F.ncclCommAbort(NULL), nSuccess);
    assert_int_equal(F.ncclCommDestroy(NULL), nSuccess);
    /* A slow bootstrap: non-blocking init stays in progress for a while. */
    F.set_init_delay(150);
    cfg = config(0);
    double t0 = now_s();
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), nInProgress);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)a, 1, 1, 0, comm, s), nUsage);  /* not ready */
    assert_int_equal(F.ncclCommGetAsyncError(comm, &err), nSuccess);
    assert_true(err == nInProgress || now_s() - t0 >= 0.15);
    assert_int_equal(comm_wait(comm), nSuccess);
    assert_true(now_s() - t0 >= 0.15);
    F.set_init_delay(0);
    assert_int_equal(F.ncclCommDestroy(comm), nSuccess);
    /* WSYNC_FAKE_NCCL_INIT_ERROR: blocking init fails and gives no communicator; a non-blocking
     * one ends in ncclSystemError. */
    setenv("WSYNC_FAKE_NCCL_INIT_ERROR", "1", 1);
    cfg = config(1);
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), nSystem);
    assert_null(comm);
    cfg = config(0);
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 1, id, 0, &cfg), nInProgress);
    assert_int_equal(comm_wait(comm), nSystem);
    assert_int_equal(F.ncclCommAbort(comm), nSuccess);
    unsetenv("WSYNC_FAKE_NCCL_INIT_ERROR");
    /* A rank held by a live process cannot be taken again. */
    ncclComm_t c1 = NULL, c2 = NULL;
    cfg = config(1);
    assert_int_equal(F.ncclCommInitRankConfig(&c1, 1, id, 0, &cfg), nSuccess);
    assert_int_equal(F.ncclCommInitRankConfig(&c2, 1, id, 0, &cfg), nUsage);
    assert_null(c2);
    cfg = config(0);
    assert_int_equal(F.ncclCommInitRankConfig(&c2, 1, id, 0, &cfg), nInProgress);
    assert_int_equal(comm_wait(c2), nUsage);
    assert_int_equal(F.ncclCommAbort(c2), nSuccess);
    assert_int_equal(F.ncclCommDestroy(c1), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    /* Abort is prompt while the init waits for a rank that never comes. */
    assert_int_equal(F.ncclCommInitRankConfig(&c1, 2, id, 0, &cfg), nInProgress);
    sleep_ms(20);
    assert_int_equal(F.ncclCommGetAsyncError(c1, &err), nSuccess);
    assert_int_equal(err, nInProgress);
    t0 = now_s();
    assert_int_equal(F.ncclCommAbort(c1), nSuccess);
    assert_true(now_s() - t0 < 1.0);
    assert_int_equal(shm_of_id(&id), 0);
    assert_int_equal(stats().comms_live, 0);
    assert_int_equal(F.cuStreamDestroy(s), OK);
    assert_int_equal(F.cuMemFree(a), OK);
    drop_device(0);
}

/* Two ranks of one communicator in this process (ranks may share a process, as in NCCL), each
 * on a GPU of its own as NCCL requires: rank 0 on device 0 (current before and after), rank 1
 * on device 1 (ctx1). */
static void init_pair(const ncclUniqueId *id, CUcontext ctx0, CUcontext ctx1, ncclComm_t *c0,
                      ncclComm_t *c1) {
    ncclConfig_t cfg = config(0);
    assert_int_equal(F.ncclCommInitRankConfig(c0, 2, *id, 0, &cfg), nInProgress);
    assert_int_equal(F.cuCtxSetCurrent(ctx1), OK);
    assert_int_equal(F.ncclCommInitRankConfig(c1, 2, *id, 1, &cfg), nInProgress);
    assert_int_equal(F.cuCtxSetCurrent(ctx0), OK);
    assert_int_equal(comm_wait(*c0), nSuccess);
    assert_int_equal(comm_wait(*c1), nSuccess);
}

/* A stream of the device whose context is `ctx` (rank 1's streams must be of its device). */
static CUstream stream_in(CUcontext ctx, CUcontext back) {
    CUstream s = NULL;
    assert_int_equal(F.cuCtxSetCurrent(ctx), OK);
    assert_int_equal(F.cuStreamCreate(&s, 1), OK);
    assert_int_equal(F.cuCtxSetCurrent(back), OK);
    return s;
}

static void test_nccl_streams_and_abort(void **state) {
    (void)state;
    CUcontext ctx1 = use_device(1), ctx0 = use_device(0);
    ncclUniqueId id;
    ncclComm_t c0 = NULL, c1 = NULL;
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    init_pair(&id, ctx0, ctx1, &c0, &c1);
    CUstream sa = NULL, sb = NULL, sc = NULL;
    CUevent ev = NULL;
    CUdeviceptr a = 0, b = 0, c = 0;
    assert_int_equal(F.cuStreamCreate(&sa, 1), OK);
    sb = stream_in(ctx1, ctx0);
    assert_int_equal(F.cuStreamCreate(&sc, 1), OK);
    assert_int_equal(F.cuEventCreate(&ev, 2), OK);
    assert_int_equal(F.cuMemAlloc(&a, 1 << 16), OK);
    assert_int_equal(F.cuMemAlloc(&b, 1 << 16), OK);
    assert_int_equal(F.cuMemAlloc(&c, 1 << 16), OK);
    memset((void *)a, 'r', 1 << 16);
    /* The receiver's operation waits for the root: its stream, an event after it and a stream
     * waiting on that event are all not ready until the root broadcasts. */
    assert_int_equal(F.ncclBroadcast((void *)b, (void *)b, 1 << 16, 1, 0, c1, sb), nSuccess);
    assert_int_equal(F.cuEventRecord(ev, sb), OK);
    assert_int_equal(F.cuStreamWaitEvent(sc, ev, 0), OK);
    assert_int_equal(F.cuMemcpyDtoDAsync(c, b, 1 << 16, sc), OK);
    sleep_ms(50);
    assert_int_equal(F.cuStreamQuery(sb), E_NOT_READY);
    assert_int_equal(F.cuEventQuery(ev), E_NOT_READY);
    assert_int_equal(F.cuStreamQuery(sc), E_NOT_READY);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)a, 1 << 16, 1, 0, c0, sa), nSuccess);
    assert_int_equal(stream_wait(sc), OK);
    assert_int_equal(stream_wait(sa), OK);
    assert_int_equal(F.cuEventQuery(ev), OK);
    assert_int_equal(((char *)c)[0], 'r');
    assert_int_equal(((char *)c)[(1 << 16) - 1], 'r');
    /* Abort while an operation waits: it returns promptly and the operation fails. */
    assert_int_equal(F.ncclBroadcast((void *)b, (void *)b, 16, 1, 0, c1, sb), nSuccess);
    sleep_ms(20);
    assert_int_equal(F.cuStreamQuery(sb), E_NOT_READY);
    double t0 = now_s();
    assert_int_equal(F.ncclCommAbort(c1), nSuccess);
    assert_true(now_s() - t0 < 1.0);
    assert_int_equal(stream_wait(sb), E_ILLEGAL);
    assert_int_equal(F.ncclBroadcast((void *)b, (void *)b, 16, 1, 0, c1, sb), nUsage);
    /* The root now waits for a rank that left: hangs as in NCCL, until its own abort. */
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)a, 16, 1, 0, c0, sa), nSuccess);
    sleep_ms(20);
    assert_int_equal(F.cuStreamQuery(sa), E_NOT_READY);
    assert_int_equal(F.ncclCommAbort(c0), nSuccess);
    assert_int_equal(stream_wait(sa), E_ILLEGAL);
    assert_int_equal(shm_of_id(&id), 0);
    /* A root whose send buffer is not device memory fails, and so do its receivers (with
     * ncclRemoteError) instead of hanging. */
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    init_pair(&id, ctx0, ctx1, &c0, &c1);
    assert_int_equal(F.cuStreamDestroy(sa), OK);
    assert_int_equal(F.cuStreamDestroy(sb), OK);
    assert_int_equal(F.cuStreamCreate(&sa, 1), OK);
    sb = stream_in(ctx1, ctx0);
    char host[16];
    assert_int_equal(F.ncclBroadcast((void *)b, (void *)b, 16, 1, 0, c1, sb), nSuccess);
    assert_int_equal(F.ncclBroadcast(host, host, 16, 1, 0, c0, sa), nSuccess);
    assert_int_equal(stream_wait(sa), E_ILLEGAL);
    assert_int_equal(stream_wait(sb), E_ILLEGAL);
    assert_int_equal(comm_wait(c1), 6);
    assert_int_equal(F.ncclCommDestroy(c0), nSuccess);
    assert_int_equal(F.ncclCommDestroy(c1), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    /* Injected asynchronous failure of a broadcast. */
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    init_pair(&id, ctx0, ctx1, &c0, &c1);
    assert_int_equal(F.cuStreamDestroy(sa), OK);
    assert_int_equal(F.cuStreamCreate(&sa, 1), OK);
    F.set_fail("ncclBroadcast@async", 0, 6);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)a, 16, 1, 0, c0, sa), nSuccess);
    assert_int_equal(stream_wait(sa), E_ILLEGAL);
    assert_int_equal(comm_wait(c0), 6);
    assert_int_equal(F.ncclBroadcast((void *)a, (void *)a, 16, 1, 0, c0, sa), nUsage);
    assert_int_equal(F.ncclCommDestroy(c0), nSuccess);
    assert_int_equal(F.ncclCommDestroy(c1), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    assert_int_equal(F.cuStreamDestroy(sa), OK);
    assert_int_equal(F.cuStreamDestroy(sb), OK);
    assert_int_equal(F.cuStreamDestroy(sc), OK);
    assert_int_equal(F.cuEventDestroy(ev), OK);
    assert_int_equal(F.cuMemFree(a), OK);
    assert_int_equal(F.cuMemFree(b), OK);
    assert_int_equal(F.cuMemFree(c), OK);
    drop_device(0);
    assert_int_equal(F.cuDevicePrimaryCtxRelease(1), OK);
}

/* Rank `rank` of a 2-rank communicator on device 0 in a child process: its init must fail with
 * ncclInvalidUsage (the parent's rank is on device 0 too). */
struct dup_arg {
    ncclUniqueId id;
    int rank;
};

static int child_duplicate_rank(void *arg) {
    const struct dup_arg *d = arg;
    CUcontext ctx;
    CK_EQ(F.cuDevicePrimaryCtxRetain(&ctx, 0), OK);
    CK_EQ(F.cuCtxSetCurrent(ctx), OK);
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = config(0);
    CK_EQ(F.ncclCommInitRankConfig(&comm, 2, d->id, d->rank, &cfg), nInProgress);
    CK_EQ(comm_wait(comm), nUsage);
    CK_EQ(F.ncclCommAbort(comm), nSuccess);
    CK_EQ(stats().comms_live, 0);
    CK_EQ(F.cuCtxSetCurrent(NULL), OK);
    CK_EQ(F.cuDevicePrimaryCtxRelease(0), OK);
    return 0;
}

/* NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected", invalid
 * usage during the init: a non-blocking init says so through ncclCommGetAsyncError, on each of
 * those ranks); the fake does too, whether the ranks share a process or not, and a rank on a
 * GPU of its own waits (its group never completes) until it is aborted. */
static void test_nccl_refuses_two_ranks_on_one_device(void **state) {
    (void)state;
    CUcontext ctx1 = use_device(1), ctx0 = use_device(0);
    const long long calls = F.nccl_init_calls();
    ncclUniqueId id;
    ncclComm_t c0 = NULL, c1 = NULL, c2 = NULL;
    ncclConfig_t cfg = config(0);
    /* Two ranks in this process, both on device 0. */
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    assert_int_equal(F.ncclCommInitRankConfig(&c0, 2, id, 0, &cfg), nInProgress);
    assert_int_equal(F.ncclCommInitRankConfig(&c1, 2, id, 1, &cfg), nInProgress);
    assert_int_equal(comm_wait(c0), nUsage);
    assert_int_equal(comm_wait(c1), nUsage);
    assert_int_equal(F.nccl_init_calls(), calls + 2);
    assert_int_equal(F.ncclCommAbort(c0), nSuccess);
    assert_int_equal(F.ncclCommAbort(c1), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    /* Blocking: the init returns the error and no communicator. One rank waits in a child. */
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    struct dup_arg d = {id, 1};
    pid_t child = spawn(child_duplicate_rank, &d);
    cfg = config(1);
    c0 = (ncclComm_t)1;
    assert_int_equal(F.ncclCommInitRankConfig(&c0, 2, id, 0, &cfg), nUsage);
    assert_null(c0);
    assert_int_equal(reap(child), 0);
    assert_int_equal(shm_of_id(&id), 0);
    /* Three ranks, 1 and 2 on device 1: they fail; rank 0 (device 0) is never ready, and its
     * abort is prompt. */
    cfg = config(0);
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    assert_int_equal(F.ncclCommInitRankConfig(&c0, 3, id, 0, &cfg), nInProgress);
    assert_int_equal(F.cuCtxSetCurrent(ctx1), OK);
    assert_int_equal(F.ncclCommInitRankConfig(&c1, 3, id, 1, &cfg), nInProgress);
    assert_int_equal(F.ncclCommInitRankConfig(&c2, 3, id, 2, &cfg), nInProgress);
    assert_int_equal(F.cuCtxSetCurrent(ctx0), OK);
    assert_int_equal(comm_wait(c1), nUsage);
    assert_int_equal(comm_wait(c2), nUsage);
    sleep_ms(50);
    ncclResult_t err = nSuccess;
    assert_int_equal(F.ncclCommGetAsyncError(c0, &err), nSuccess);
    assert_int_equal(err, nInProgress);
    double t0 = now_s();
    assert_int_equal(F.ncclCommAbort(c0), nSuccess);
    assert_true(now_s() - t0 < 1.0);
    assert_int_equal(F.ncclCommAbort(c1), nSuccess);
    assert_int_equal(F.ncclCommAbort(c2), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    assert_int_equal(stats().comms_live, 0);
    /* The same ranks on two devices form the group. */
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    init_pair(&id, ctx0, ctx1, &c0, &c1);
    assert_int_equal(F.ncclCommDestroy(c0), nSuccess);
    assert_int_equal(F.ncclCommDestroy(c1), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    drop_device(0);
    assert_int_equal(F.cuDevicePrimaryCtxRelease(1), OK);
}

enum { BC_BYTES = 3 << 20, BC_ROUNDS = 4 };

static void fill(unsigned char *p, size_t n, int round) {
    for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(i * 31 + (size_t)round * 17 + (i >> 12));
}

static int check_fill(const unsigned char *p, size_t n, int round) {
    for (size_t i = 0; i < n; ++i)
        if (p[i] != (unsigned char)(i * 31 + (size_t)round * 17 + (i >> 12))) return 0;
    return 1;
}

/* Rank 1 (receiver) in a child process; `arg` is the unique id. */
static int child_receiver(void *arg) {
    const ncclUniqueId *id = arg;
    CUcontext ctx;
    CK_EQ(F.cuDevicePrimaryCtxRetain(&ctx, 1), OK);
    CK_EQ(F.cuCtxSetCurrent(ctx), OK);
    CUstream s = NULL;
    CUdeviceptr buf = 0;
    CK_EQ(F.cuStreamCreate(&s, 1), OK);
    CK_EQ(F.cuMemAlloc(&buf, BC_BYTES), OK);
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = config(0);
    CK_EQ(F.ncclCommInitRankConfig(&comm, 2, *id, 1, &cfg), nInProgress);
    ncclResult_t st = nInProgress;
    while (st == nInProgress) {
        CK_EQ(F.ncclCommGetAsyncError(comm, &st), nSuccess);
        sleep_ms(1);
    }
    CK_EQ(st, nSuccess);
    for (int r = 0; r < BC_ROUNDS; ++r) {
        memset((void *)buf, 0, BC_BYTES);
        CK_EQ(F.ncclBroadcast((void *)buf, (void *)buf, BC_BYTES, 1, 0, comm, s), nSuccess);
        CK_EQ(stream_wait(s), OK);
        CK(check_fill((const unsigned char *)buf, BC_BYTES, r));
    }
    /* The root sends BC_BYTES, this rank expects fewer: this rank's operation fails. */
    CK_EQ(F.ncclBroadcast((void *)buf, (void *)buf, BC_BYTES / 2, 1, 0, comm, s), nSuccess);
    CK_EQ(stream_wait(s), E_ILLEGAL);
    CK_EQ(F.ncclCommGetAsyncError(comm, &st), nSuccess);
    CK_EQ(st, nUsage);
    CK_EQ(F.ncclCommDestroy(comm), nSuccess);
    CK_EQ(F.cuStreamDestroy(s), OK);
    CK_EQ(F.cuMemFree(buf), OK);
    CK_EQ(F.cuCtxSetCurrent(NULL), OK);
    CK_EQ(F.cuDevicePrimaryCtxRelease(1), OK);
    CK_EQ(shm_of_pid(getpid()), 0);
    return 0;
}

static void test_nccl_two_process_broadcast(void **state) {
    (void)state;
    use_device(0);
    F.reset_stats();
    ncclUniqueId id;
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    pid_t child = spawn(child_receiver, &id);
    CUstream s = NULL;
    CUdeviceptr buf = 0;
    assert_int_equal(F.cuStreamCreate(&s, 1), OK);
    assert_int_equal(F.cuMemAlloc(&buf, BC_BYTES), OK);
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = config(0);
    assert_int_equal(F.ncclCommInitRankConfig(&comm, 2, id, 0, &cfg), nInProgress);
    assert_int_equal(comm_wait(comm), nSuccess);
    for (int r = 0; r < BC_ROUNDS; ++r) {
        fill((unsigned char *)buf, BC_BYTES, r);
        assert_int_equal(F.ncclBroadcast((void *)buf, (void *)buf, BC_BYTES, 1, 0, comm, s), nSuccess);
        /* The root's operation completes only once the receiver has its copy, so the buffer can
         * be refilled afterwards. */
        assert_int_equal(stream_wait(s), OK);
    }
    assert_int_equal(F.ncclBroadcast((void *)buf, (void *)buf, BC_BYTES, 1, 0, comm, s), nSuccess);
    assert_int_equal(stream_wait(s), OK);  /* the mismatch fails the receiver only */
    ncclResult_t err = -1;
    assert_int_equal(F.ncclCommGetAsyncError(comm, &err), nSuccess);
    assert_int_equal(err, nSuccess);
    assert_int_equal(stats().broadcasts, BC_ROUNDS + 1);
    assert_int_equal(reap(child), 0);
    assert_int_equal(F.ncclCommDestroy(comm), nSuccess);
    assert_int_equal(shm_of_id(&id), 0);
    assert_int_equal(shm_of_pid(child), 0);
    assert_int_equal(F.cuStreamDestroy(s), OK);
    assert_int_equal(F.cuMemFree(buf), OK);
    drop_device(0);
}

/* Leaves memory and a communicator behind and ends with exit(): the fake cleans up as the
 * driver frees a process's memory when it ends. */
static int child_exit_leaky(void *arg) {
    const ncclUniqueId *id = arg;
    CUcontext ctx;
    CUdeviceptr a = 0, b = 0;
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = config(1);
    CK_EQ(F.cuDevicePrimaryCtxRetain(&ctx, 0), OK);
    CK_EQ(F.cuCtxSetCurrent(ctx), OK);
    CK_EQ(F.cuMemAlloc(&a, 100), OK);
    CK_EQ(F.cuMemAlloc(&b, 100), OK);
    CK_EQ(F.ncclCommInitRankConfig(&comm, 1, *id, 0, &cfg), nSuccess);
    CK_EQ(shm_of_pid(getpid()), 2);
    CK_EQ(shm_of_id(id), 1);
    exit(0);
}

/* A child forked after its parent's cuInit, under the default rule. */
static int child_after_parent_init(void *arg) {
    (void)arg;
    CUcontext ctx;
    int n = -1;
    CK_EQ(F.cuInit(0), 3);  /* CUDA_ERROR_NOT_INITIALIZED: "initialization error" */
    CK_EQ(F.cuDeviceGetCount(&n), 3);
    CK_EQ(F.cuDevicePrimaryCtxRetain(&ctx, 0), 3);
    return 0;
}

/* As the real driver: a process that initialised the driver cannot hand it to a forked child;
 * every call there, cuInit included, is CUDA_ERROR_NOT_INITIALIZED. (A test that forks an engine
 * after touching the driver fails on the fake as it would on a GPU.) */
static void test_driver_unusable_in_a_child_forked_after_cuinit(void **state) {
    (void)state;
    F.allow_driver_after_fork(0);
    pid_t child = spawn(child_after_parent_init, NULL);
    F.allow_driver_after_fork(1);
    assert_int_equal(reap(child), 0);
}

/* Plays a process whose pid was used before by one that was killed holding device memory:
 * the leftover is named for this pid before anything here allocates. */
static int child_after_a_dead_namesake(void *arg) {
    (void)arg;
    char name[96];
    snprintf(name, sizeof name, "/wsync-fakecuda-%d-424242", (int)getpid());
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    CK_EQ(fd >= 0, 1);
    close(fd);
    CK_EQ(shm_of_pid(getpid()), 1);
    CK_EQ(F.cuInit(0), OK);  /* the driver frees a dead process's memory: so does the fake */
    CK_EQ(shm_of_pid(getpid()), 0);
    return 0;
}

static void test_memory_of_a_killed_namesake_is_freed(void **state) {
    (void)state;
    pid_t child = spawn(child_after_a_dead_namesake, NULL);
    assert_int_equal(reap(child), 0);
    assert_int_equal(shm_of_pid(child), 0);
}

/* Allocates and ends in _exit() (spawn's end), as a forked test child or a killed process does:
 * nothing of it is freed on the way out. */
static int child_leaves_memory_behind(void *arg) {
    (void)arg;
    CUcontext ctx;
    CUdeviceptr a = 0, b = 0;
    CK_EQ(F.cuDevicePrimaryCtxRetain(&ctx, 0), OK);
    CK_EQ(F.cuCtxSetCurrent(ctx), OK);
    CK_EQ(F.cuMemAlloc(&a, 100), OK);
    CK_EQ(F.cuMemAlloc(&b, 100), OK);
    return 0;
}

/* A later process's first driver call (here cuInit in a fresh child). */
static int child_first_call(void *arg) {
    (void)arg;
    CK_EQ(F.cuInit(0), OK);
    return 0;
}

/* The driver frees a process's memory however it ends; the fake's files of a process that ended
 * in _exit() are removed by the next process's first call, and a live process's are not. */
static void test_memory_of_any_dead_process_is_swept_by_the_next(void **state) {
    (void)state;
    CUdeviceptr mine = 0;
    use_device(0);
    assert_int_equal(F.cuMemAlloc(&mine, 4096), OK);
    const int held = shm_of_pid(getpid());
    pid_t leaky = spawn(child_leaves_memory_behind, NULL);
    assert_int_equal(reap(leaky), 0);
    assert_int_equal(shm_of_pid(leaky), 2); /* dead, and its files are still there */
    /* and an import marker of its memory, as a dead opener leaves one */
    char marker[96], prefix[64];
    snprintf(marker, sizeof marker, "/wsyncfk-imp-%d-1-%d", (int)leaky, (int)getpid());
    int fd = shm_open(marker, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    close(fd);
    snprintf(prefix, sizeof prefix, "wsyncfk-imp-%d-", (int)leaky);
    assert_int_equal(F.shm_count(prefix), 1);
    pid_t next = spawn(child_first_call, NULL);
    assert_int_equal(reap(next), 0);
    assert_int_equal(shm_of_pid(leaky), 0);
    assert_int_equal(F.shm_count(prefix), 0);
    assert_int_equal(shm_of_pid(getpid()), held); /* this live process's memory is untouched */
    assert_int_equal(F.cuMemFree(mine), OK);
    drop_device(0);
}

static void test_exit_cleanup(void **state) {
    (void)state;
    ncclUniqueId id;
    assert_int_equal(F.ncclGetUniqueId(&id), nSuccess);
    pid_t child = spawn(child_exit_leaky, &id);
    assert_int_equal(reap(child), 0);
    assert_int_equal(shm_of_pid(child), 0);
    assert_int_equal(shm_of_id(&id), 0);
}

/* ---- threads --------------------------------------------------------------------------------- */
struct worker_arg {
    int index;
    int failures;
};

static void *worker(void *p) {
    struct worker_arg *w = p;
    const int dev = w->index % 2;
    CUcontext ctx;
    CUstream s = NULL;
    if (F.cuDevicePrimaryCtxRetain(&ctx, dev) != OK || F.cuCtxSetCurrent(ctx) != OK ||
        F.cuStreamCreate(&s, 1) != OK) {
        w->failures++;
        return NULL;
    }
    unsigned char host[512];
    for (int i = 0; i < 100; ++i) {
        CUdeviceptr a = 0;
        int ord = -1;
        memset(host, (unsigned char)(i + w->index), sizeof host);
        if (F.cuMemAlloc(&a, 512 + (size_t)i) != OK) {
            w->failures++;
            continue;
        }
        if (F.cuPointerGetAttribute(&ord, 9, a) != OK || ord != dev) w->failures++;
        if (F.cuMemcpyHtoDAsync(a, host, sizeof host, s) != OK || stream_wait(s) != OK ||
            memcmp((void *)a, host, sizeof host) != 0)
            w->failures++;
        if (F.cuMemFree(a) != OK) w->failures++;
    }
    if (F.cuStreamDestroy(s) != OK || F.cuCtxSetCurrent(NULL) != OK ||
        F.cuDevicePrimaryCtxRelease(dev) != OK)
        w->failures++;
    return NULL;
}

struct rank_arg {
    ncclUniqueId id;
    int rank;
    int failures;
};

/* A blocking init per thread: each waits for the other, as with NCCL. */
static void *rank_thread(void *p) {
    struct rank_arg *r = p;
    CUcontext ctx;
    CUstream s = NULL;
    CUdeviceptr buf = 0;
    ncclComm_t comm = NULL;
    ncclConfig_t cfg = config(1);
    if (F.cuDevicePrimaryCtxRetain(&ctx, r->rank) != OK || F.cuCtxSetCurrent(ctx) != OK ||
        F.cuStreamCreate(&s, 1) != OK || F.cuMemAlloc(&buf, 1 << 20) != OK) {
        r->failures++;
        return NULL;
    }
    if (F.ncclCommInitRankConfig(&comm, 2, r->id, r->rank, &cfg) != nSuccess) {
        r->failures++;
        return NULL;
    }
    for (int round = 0; round < 5; ++round) {
        if (r->rank == 0) fill((unsigned char *)buf, 1 << 20, round);
        if (F.ncclBroadcast((void *)buf, (void *)buf, 1 << 20, 1, 0, comm, s) != nSuccess ||
            stream_wait(s) != OK || !check_fill((const unsigned char *)buf, 1 << 20, round))
            r->failures++;
    }
    if (F.ncclCommDestroy(comm) != nSuccess || F.cuStreamDestroy(s) != OK || F.cuMemFree(buf) != OK ||
        F.cuCtxSetCurrent(NULL) != OK || F.cuDevicePrimaryCtxRelease(r->rank) != OK)
        r->failures++;
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    F.reset_stats();
    pthread_t t[6];
    struct worker_arg w[6];
    for (int i = 0; i < 6; ++i) {
        w[i].index = i;
        w[i].failures = 0;
        assert_int_equal(pthread_create(&t[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < 6; ++i) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    struct wsync_fake_stats st = stats();
    assert_int_equal(st.allocs, 600);
    assert_int_equal(st.frees, 600);
    assert_int_equal(st.live_allocs, 0);
    assert_int_equal(st.streams_live, 0);
    assert_int_equal(st.reclaimed, 0);
    struct rank_arg r[2];
    assert_int_equal(F.ncclGetUniqueId(&r[0].id), nSuccess);
    for (int i = 0; i < 2; ++i) {
        r[i].id = r[0].id;
        r[i].rank = i;
        r[i].failures = 0;
        assert_int_equal(pthread_create(&t[i], NULL, rank_thread, &r[i]), 0);
    }
    for (int i = 0; i < 2; ++i) {
        pthread_join(t[i], NULL);
        assert_int_equal(r[i].failures, 0);
    }
    assert_int_equal(shm_of_id(&r[0].id), 0);
}

/* ---- main ------------------------------------------------------------------------------------ */
int main(int argc, char **argv) {
    /* A fresh process for one device configuration (run_fresh). */
    if (argc == 3 && strcmp(argv[1], "--fresh") == 0) {
        if (load(getenv("WSYNC_CUDA_LIBRARY")) != 0) return 126;
        if (strcmp(argv[2], "default-swap") == 0) {
            CUuuid u;
            int n = 0;
            CK_EQ(F.cuInit(0), OK);
            CK_EQ(F.cuDeviceGetCount(&n), OK);
            CK_EQ(n, 2);
            CK_EQ(F.cuDeviceGetUuid(&u, 0), OK);
            CK_EQ((unsigned char)u.bytes[0], 0x1f);
            return 0;
        }
        return fresh_devices(argv[2]);
    }
    g_lib_path = argc > 1 ? argv[1] : getenv("WSYNC_CUDA_LIBRARY");
    if (!g_lib_path) {
        fprintf(stderr, "usage: %s PATH_TO_libwsync_fakegpu.so [TEST_PATTERN]\n", argv[0]);
        return 2;
    }
    /* Defaults only: nothing from the caller's environment changes the fake's behaviour. */
    static const char *const clear[] = {"CUDA_VISIBLE_DEVICES", "WSYNC_FAKE_CUDA_DEVICES",
                                        "WSYNC_FAKE_CUDA_NO_DEVICE", "WSYNC_FAKE_NCCL_VERSION",
                                        "WSYNC_FAKE_NCCL_INIT_ERROR"};
    for (size_t i = 0; i < sizeof clear / sizeof clear[0]; ++i) unsetenv(clear[i]);
    setenv("WSYNC_CUDA_LIBRARY", g_lib_path, 1);
    setenv("WSYNC_NCCL_LIBRARY", g_lib_path, 1);
    if (load(g_lib_path) != 0) return 1;
    if (argc > 2) cmocka_set_test_filter(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_exports, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_and_devices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_driver_unusable_in_a_child_forked_after_cuinit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_visible_devices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_contexts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_same_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_two_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streams_and_events, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kernel_pack, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_injection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nccl_basics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nccl_streams_and_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nccl_refuses_two_ranks_on_one_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nccl_two_process_broadcast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exit_cleanup, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_of_a_killed_namesake_is_freed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_of_any_dead_process_is_swept_by_the_next, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
