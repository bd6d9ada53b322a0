/* Test hooks of libwsync_fakegpu.so, the fake CUDA driver + NCCL that CI points
 * WSYNC_CUDA_LIBRARY and WSYNC_NCCL_LIBRARY at (see fake_cuda.cpp and fake_nccl.cpp for what
 * the fake mimics and where it differs from the real libraries).
 *
 * The fake is normally dlopen()ed by libwsync, so a test reaches these hooks with
 *     void *h = dlopen(getenv("WSYNC_CUDA_LIBRARY"), RTLD_NOW | RTLD_LOCAL);
 *     wsync_fake_stats_fn stats = (wsync_fake_stats_fn)dlsym(h, "wsync_fake_stats");
 * dlopen() of the same file returns the same handle, so the test sees the library's state.
 *
 * Everything here is per process. After fork() the child starts with zeroed counters and no
 * contexts, memory, streams, modules or communicators; it keeps cuInit's result, the device
 * list, pending failure injections, the NCCL init delay and the timing controls below. */
#ifndef WSYNC_FAKE_GPU_H
#define WSYNC_FAKE_GPU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct wsync_fake_stats {
    /* The fields the tests rely on. Counters count successful calls since the process started
     * or since wsync_fake_reset_stats(); gauges ("live") describe the state now and are not
     * touched by a reset. */
    long long allocs;          /* cuMemAlloc_v2 */
    long long frees;           /* cuMemFree_v2 (not counting what a context release reclaimed) */
    long long live_allocs;     /* gauge: cuMemAlloc allocations not freed yet */
    long long ipc_get_handle;  /* cuIpcGetMemHandle */
    long long ipc_open;        /* cuIpcOpenMemHandle_v2, refcounted repeats included */
    long long ipc_close;       /* cuIpcCloseMemHandle */
    long long ipc_live;        /* gauge: distinct IPC mappings open now */
    long long kernel_launches; /* cuLaunchKernel */
    long long memcpy_calls;    /* cuMemcpy{HtoD,DtoD,DtoH}Async_v2 */
    long long streams_live;    /* gauge: cuStreamCreate streams not destroyed (NULL stream not counted) */
    long long modules_loaded;  /* cuModuleLoadData */
    /* Extras. */
    long long modules_live;    /* gauge */
    long long events_live;     /* gauge */
    long long comms_live;      /* gauge: NCCL communicators neither destroyed nor aborted */
    long long broadcasts;      /* ncclBroadcast calls enqueued */
    long long stream_failures; /* enqueued operations that failed (their stream is then failed) */
    long long reclaimed;       /* allocations + IPC mappings released by the last
                                  cuDevicePrimaryCtxRelease of their device (leaks, in effect) */
    long long host_allocs;     /* cuMemHostAlloc (pinned host memory; not in allocs) */
    long long host_frees;      /* cuMemFreeHost */
    long long pinned_live;     /* gauge: cuMemHostAlloc allocations not freed yet (not in live_allocs) */
    /* The virtual memory management calls (cuMemRetainAllocationHandle & co.). */
    long long vmm_exports;     /* cuMemExportToShareableHandle */
    long long vmm_imports;     /* cuMemImportFromShareableHandle */
    long long vmm_handles_live;  /* gauge: retained or imported handles not released yet */
    long long vmm_maps_live;     /* gauge: cuMemMap mappings not unmapped yet */
    long long vmm_reserved_live; /* gauge: cuMemAddressReserve ranges not freed yet */
};

/* Copies this process's counters. */
void wsync_fake_stats(struct wsync_fake_stats *out);
/* Zeroes the counters (not the gauges). */
void wsync_fake_reset_stats(void);

/* Failure injection: the entry point `function_name` (its exported symbol, e.g.
 * "cuIpcOpenMemHandle_v2" or "ncclCommInitRankConfig"; the name without "_v2" also matches a
 * "_v2" symbol) lets `after_n_calls` more calls through and then fails once, returning `result`
 * without doing anything. So (name, 2, CUDA_ERROR_OUT_OF_MEMORY) fails the 3rd call from now.
 * With the suffix "@async" (e.g. "cuLaunchKernel@async", "cuMemcpyHtoDAsync_v2@async",
 * "cuMemcpyDtoDAsync_v2@async", "ncclBroadcast@async") the call itself succeeds but the
 * enqueued operation fails when the stream runs it: the stream becomes failed
 * (CUDA_ERROR_ILLEGAL_ADDRESS) and, for ncclBroadcast, the communicator's asynchronous error
 * becomes `result` (ncclSystemError if `result` is 0). One pending injection per name; a new one
 * replaces it; after_n_calls < 0 cancels it; function_name NULL cancels all. */
void wsync_fake_set_fail(const char *function_name, int after_n_calls, int result);

/* Every ncclCommInitRankConfig from now on waits `ms` milliseconds before it starts joining
 * (a slow bootstrap). 0 (the default) for none. */
void wsync_fake_nccl_set_init_delay_ms(int ms);

/* Late GPU work. Every stream operation enqueued from now on starts `ms` milliseconds after it
 * was enqueued, or earlier once something waits for it (cuEventQuery of an event recorded after
 * it, cuStreamQuery, cuStreamWaitEvent, cuCtxSynchronize, cuStreamDestroy, cuMemFree): code
 * that returns without waiting for its kernels and copies sees them not done. 0 (the default)
 * for none. Kept across fork(). */
void wsync_fake_set_stream_delay_ms(int ms);

/* polls > 0: every ncclBroadcast on a non-blocking communicator returns ncclInProgress and
 * enqueues nothing; the broadcast reaches its stream at the polls-th ncclCommGetAsyncError of
 * that communicator, which reports ncclSuccess (the earlier ones ncclInProgress), as NCCL may
 * finish enqueuing in the background. Until then any other NCCL call on it is
 * ncclInvalidUsage. 0 (the default) turns it off. Kept across fork(). */
void wsync_fake_nccl_set_in_progress(int polls);

/* ncclCommInitRankConfig calls this process made (every call, failed ones included; a forked
 * child starts at 0), so a test can tell that a layout was refused before any NCCL init. The
 * fake, like NCCL, refuses two ranks of one communicator on one device (same UUID) with
 * ncclInvalidUsage at init: for a non-blocking communicator through ncclCommGetAsyncError
 * (fake_nccl.cpp). */
long long wsync_fake_nccl_init_calls(void);

/* The number of entries in /dev/shm whose name starts with `prefix` (NULL: "wsync-fake", i.e.
 * every allocation and control segment of the fake, of any process). -1 if /dev/shm cannot be
 * read. */
int wsync_fake_shm_count(const char *prefix);

/* How many times this process freed an allocation (cuMemFree, or its context's destruction)
 * while another live process still had it open through cuIpcOpenMemHandle: undefined behaviour
 * on a real GPU ("Calling cuMemFree on an exported memory region before calling
 * cuIpcCloseMemHandle in the importing context will result in undefined behavior", cuda.h).
 * Each is also printed to stderr. Not reset by wsync_fake_reset_stats. */
long long wsync_fake_freed_while_imported(void);

/* Allocates device memory (like cuMemAlloc_v2 in the current context) that cannot be exported,
 * as a cudaMallocAsync pool or PyTorch's expandable segments make: cuPointerGetAttribute(
 * CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) reads 0 and cuIpcGetMemHandle fails with
 * CUDA_ERROR_INVALID_VALUE. Freed with cuMemFree_v2. The arguments are (CUdeviceptr *, size_t). */
int wsync_fake_mem_alloc_unexportable(unsigned long long *dptr, size_t bytes);

/* Allocates `bytes` of device memory (current context) as one contiguous virtual range mapped
 * in pieces of `piece_bytes` (a multiple of the page size; the last piece may be smaller), as
 * PyTorch's expandable segments and other cuMemMap users make it: cuMemGetAddressRange and
 * cuPointerGetAttribute answer for the piece holding an address (its own base, size and buffer
 * id), no piece is exportable with cuIpcGetMemHandle, and kernels and copies may cross pieces.
 * Free each piece with cuMemFree_v2 at its base (dptr + k * piece_bytes). Returns 0 or the
 * driver's error. The arguments are (CUdeviceptr *, size_t, size_t). */
int wsync_fake_mem_alloc_span(unsigned long long *dptr, size_t bytes, size_t piece_bytes);
typedef int (*wsync_fake_mem_alloc_span_fn)(unsigned long long *dptr, size_t bytes, size_t piece_bytes);
/* `bytes` as allocations of `piece_bytes` back to back in one address range, each its own
 * allocation as neighbouring cuMemAlloc allocations can be (not a span: a device copy running
 * from one into the next is refused, CUDA_ERROR_INVALID_VALUE, as by the driver). Free each
 * with cuMemFree. */
int wsync_fake_mem_alloc_adjacent(unsigned long long *dptr, size_t bytes, size_t piece_bytes);

/* Parks `stream` (a CUstream; 0 or 1 name the NULL/legacy stream): operations enqueued on it
 * after this call wait until wsync_fake_stream_release_held() (a collective, or on the NULL
 * stream a kernel, that does not finish); anything waiting for them waits. Returns 0 or the
 * driver's error for an unknown stream. A forked child starts with no stream held. */
int wsync_fake_stream_hold(void *stream);
/* The next `n` streams this process creates (cuStreamCreate) start held, as if
 * wsync_fake_stream_hold() were called on each at once: a library's own stream, whose handle
 * the test never sees, stalls until wsync_fake_stream_release_held(). 0 cancels. */
void wsync_fake_stream_hold_next(int n);
/* Lets every held stream of this process go on. */
void wsync_fake_stream_release_held(void);

/* on != 0: a child forked after this process's successful cuInit may use the driver (with fresh
 * state), which the real driver never allows. Only the fake's own self-test turns it on, to
 * check its cross-process mechanisms from forked children; 0 (the default) is the driver's
 * rule: every call in such a child, cuInit included, is CUDA_ERROR_NOT_INITIALIZED, so a
 * library test that forks an engine after its process touched the driver fails here as it
 * would on a GPU. Kept across fork(). */
void wsync_fake_allow_driver_after_fork(int on);

typedef void (*wsync_fake_stats_fn)(struct wsync_fake_stats *out);
typedef void (*wsync_fake_reset_stats_fn)(void);
typedef void (*wsync_fake_set_fail_fn)(const char *function_name, int after_n_calls, int result);
typedef void (*wsync_fake_nccl_set_init_delay_ms_fn)(int ms);
typedef int (*wsync_fake_shm_count_fn)(const char *prefix);
typedef void (*wsync_fake_set_stream_delay_ms_fn)(int ms);
typedef int (*wsync_fake_stream_hold_fn)(void *stream);
typedef void (*wsync_fake_stream_release_held_fn)(void);
typedef void (*wsync_fake_stream_hold_next_fn)(int n);
typedef void (*wsync_fake_nccl_set_in_progress_fn)(int polls);
typedef void (*wsync_fake_allow_driver_after_fork_fn)(int on);
typedef long long (*wsync_fake_nccl_init_calls_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* WSYNC_FAKE_GPU_H */
