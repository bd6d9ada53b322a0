/*
 * wsync.h — libwsync: move model weights from trainers to inference engines.
 *
 * One C99 header; it includes only <stddef.h>, <stdint.h> and <stdbool.h>.
 *
 * ---------------------------------------------------------------------------------------------
 * Overview
 * ---------------------------------------------------------------------------------------------
 * A *strategy* (wsync_strategy_t) is made from a kind name and a JSON options string. Kinds:
 *   "shm"            host memory through one POSIX shared-memory segment (one machine);
 *   "cuda_ipc"       GPU memory through CUDA IPC handles (processes on the same GPUs), packed
 *                    into reusable device buckets or shared per allocation ("packed": false);
 *   "nccl_broadcast" GPU memory broadcast from the trainer to every receiver over NCCL.
 * The GPU kinds open the CUDA driver (libcuda.so.1, or $WSYNC_CUDA_LIBRARY) and NCCL
 * (libnccl.so.2, $WSYNC_NCCL_LIBRARY or the "nccl_library" option) at run time: libwsync has no
 * load-time dependency on either, and without them those kinds fail with WSYNC_ERR_UNAVAILABLE.
 * The The trainer side asks it for an *init-info blob*, which a controller forwards to the
 * engines. Trainers make a *sender* from the blob, engines a *receiver* (with their receiver
 * index). Each training step the trainer sends *chunks* (many tensors each) and gets one
 * *request blob* per chunk; the controller forwards those bytes to every receiver, whose loader
 * drives a *receive iteration* over tensor views. Ending the iteration acknowledges the chunk;
 * wsync_sender_flush() returns once every receiver has acknowledged every chunk.
 *
 * ---------------------------------------------------------------------------------------------
 * Rules that hold for every function (read these once)
 * ---------------------------------------------------------------------------------------------
 * Status.   Every function that can fail returns wsync_status_t. WSYNC_OK is 0. Error values
 *           are pinned forever; new ones may be added, so treat an unknown value as an error.
 * Messages. On failure a function stores a message naming the cause (the option key, the
 *           tensor, the receiver index, the peer's pid) in a per-thread slot read by
 *           wsync_last_error(). On success the slot is left untouched (like errno).
 * Outputs.  An output handle is written NULL (an output blob {NULL, 0}) when a call fails, so
 *           a failed call leaves nothing to free. Functions never keep a caller's pointer past
 *           their return unless the comment says so.
 * Freeing.  Every wsync_*_destroy(NULL), wsync_blob_free(NULL) and wsync_string_free(NULL) is
 *           a no-op. Blobs and strings returned by the library are freed only with
 *           wsync_blob_free() and wsync_string_free().
 * Threads.  The library is thread-safe in the sense that distinct handles may be used from
 *           distinct threads at the same time. One handle (and everything made from it, such as
 *           a receiver's iteration) must be used by one thread at a time; callers serialise.
 *           A handle may move between threads. Functions without a handle argument may be
 *           called from any thread at any time.
 * Blocking. Only functions documented as "Blocks" wait, and every wait has a deadline
 *           (an explicit timeout_ms argument or the strategy's "timeout_ms" option). Nothing
 *           waits forever.
 * Errors never cross as exceptions, signals or aborts: every failure is a status.
 * fork():   handles do not survive fork() in the child; create them after forking.
 *
 * ---------------------------------------------------------------------------------------------
 * Sections: 1 versions and statuses, 2 tensors, chunks and blobs, 3 strategies, 4 sender,
 *           5 receiver and receive iteration, 6 planner, 7 blobs and introspection.
 */
#ifndef WSYNC_H
#define WSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#  define WSYNC_API
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define WSYNC_API __attribute__((visibility("default")))
#else
#  define WSYNC_API
#endif

/* =============================================================================================
 * 1. Versions and statuses
 * ===========================================================================================*/

#define WSYNC_VERSION_MAJOR 0
#define WSYNC_VERSION_MINOR 1
#define WSYNC_VERSION_PATCH 0
/* One formula, forever: MAJOR * 10000 + MINOR * 100 + PATCH (0.1.0 -> 100). */
#define WSYNC_VERSION_NUMBER \
    (WSYNC_VERSION_MAJOR * 10000 + WSYNC_VERSION_MINOR * 100 + WSYNC_VERSION_PATCH)

/* The version of the library actually loaded, by the formula above. Never fails. A binding
 * compares (wsync_version_number() / 10000) with the major version it was written for. */
WSYNC_API uint32_t wsync_version_number(void);

/* The loaded library's version as static text, e.g. "0.1.0". Never NULL; never free it. */
WSYNC_API const char *wsync_version_string(void);

/* Status codes. Values are pinned; new codes may be added later. Forced to 32 bits. */
typedef enum wsync_status_t {
    WSYNC_OK = 0,
    WSYNC_ERR_INVALID_ARGUMENT = 1, /* a NULL, out-of-range or ill-formed argument or option   */
    WSYNC_ERR_UNSUPPORTED = 2,      /* valid, but not supported by this strategy or build      */
    WSYNC_ERR_UNAVAILABLE = 3,      /* a run-time dependency is missing (driver, NCCL, /dev/shm)*/
    WSYNC_ERR_MALFORMED = 4,        /* a blob is truncated, corrupt, foreign or of a wrong version*/
    WSYNC_ERR_MISMATCH = 5,         /* well-formed but does not fit: other strategy, stale
                                       request, chunk out of order, plan differs from the model */
    WSYNC_ERR_TIMEOUT = 6,          /* a deadline passed before the peers answered              */
    WSYNC_ERR_PEER = 7,             /* a peer died, detached, or reported failure               */
    WSYNC_ERR_NO_MEMORY = 8,        /* an allocation or a shared-memory reservation failed      */
    WSYNC_ERR_WRONG_STATE = 9,      /* a call out of order (e.g. receive while iterating)       */
    WSYNC_ERR_SYSTEM = 10,          /* an operating-system call failed; the message has errno   */
    WSYNC_ERR_INTERNAL = 11,        /* a bug in libwsync; please report the message             */
    WSYNC_ERR_INTEGRITY = 12,       /* received bytes failed their checksum                     */
    WSYNC_STATUS_FORCE_32BIT_ = 0x7fffffff
} wsync_status_t;

/* Static name of a status, e.g. "WSYNC_ERR_TIMEOUT"; "WSYNC_ERR_UNKNOWN" for values this
 * version does not know. Never NULL; never free it. Does not touch wsync_last_error(). */
WSYNC_API const char *wsync_status_string(wsync_status_t status);

/* The message of the last failure on the calling thread, e.g.
 * "shm: flush timed out after 2000 ms: receivers [1] did not acknowledge chunk seq 12".
 * Never NULL ("" when this thread has had no failure). The pointer stays valid until the next
 * failing wsync call on this thread; copy it to keep it. Never free it. */
WSYNC_API const char *wsync_last_error(void);

/* =============================================================================================
 * 2. Tensors, chunks and blobs
 * ===========================================================================================*/

/* Element type, laid out exactly as DLPack's DLDataType; the codes are DLPack's codes.
 * Element size in bytes is bits * lanes / 8, which must be a whole number. */
typedef struct wsync_dtype_t {
    uint8_t code;   /* WSYNC_DTYPE_* */
    uint8_t bits;   /* bits per lane: 8, 16, 32, 64, ... */
    uint16_t lanes; /* 1 for scalars */
} wsync_dtype_t;

#define WSYNC_DTYPE_INT 0
#define WSYNC_DTYPE_UINT 1
#define WSYNC_DTYPE_FLOAT 2
/* 3 is DLPack's opaque handle: rejected. */
#define WSYNC_DTYPE_BFLOAT 4
#define WSYNC_DTYPE_COMPLEX 5
#define WSYNC_DTYPE_BOOL 6
#define WSYNC_DTYPE_FLOAT8_E3M4 7
#define WSYNC_DTYPE_FLOAT8_E4M3 8
#define WSYNC_DTYPE_FLOAT8_E4M3B11FNUZ 9
#define WSYNC_DTYPE_FLOAT8_E4M3FN 10
#define WSYNC_DTYPE_FLOAT8_E4M3FNUZ 11
#define WSYNC_DTYPE_FLOAT8_E5M2 12
#define WSYNC_DTYPE_FLOAT8_E5M2FNUZ 13
#define WSYNC_DTYPE_FLOAT8_E8M0FNU 14
#define WSYNC_DTYPE_FLOAT6_E2M3FN 15
#define WSYNC_DTYPE_FLOAT6_E3M2FN 16
#define WSYNC_DTYPE_FLOAT4_E2M1FN 17

/* Where a tensor's bytes live, laid out exactly as DLPack's DLDevice; the codes are DLPack's. */
typedef struct wsync_device_t {
    int32_t type;  /* WSYNC_DEVICE_* */
    int32_t index; /* device ordinal; 0 for host memory */
} wsync_device_t;

#define WSYNC_DEVICE_CPU 1
#define WSYNC_DEVICE_CUDA 2
#define WSYNC_DEVICE_CUDA_HOST 3 /* pinned host memory: treated as host memory */
#define WSYNC_DEVICE_ROCM 10
#define WSYNC_DEVICE_ROCM_HOST 11
#define WSYNC_DEVICE_CUDA_MANAGED 13

#define WSYNC_MAX_NDIM 16        /* most dimensions a tensor may have */
#define WSYNC_MAX_NAME_BYTES 1024 /* longest tensor name in bytes, without the NUL */
#define WSYNC_MAX_CHUNK_TENSORS 4194304 /* most tensors in one chunk (2^22): the most a receiver
                                           accepts, so a sender refuses more */

/* wsync_tensor_t.flags */
#define WSYNC_TENSOR_READ_ONLY 1u /* set on views whose memory must not be written */

/* A tensor: a descriptor the caller fills for sending, or a view the library fills when
 * receiving. Only dense, row-major (C-contiguous) tensors with at least one element move.
 * As input, every pointer is borrowed for the duration of the call only. */
typedef struct wsync_tensor_t {
    const char *name;       /* NUL-terminated UTF-8, 1..WSYNC_MAX_NAME_BYTES bytes, unique in a
                               chunk; by convention dotted module paths ("layers.0.attn.q.weight") */
    void *data;             /* first element; ignored by the planner */
    const int64_t *shape;   /* ndim extents, each >= 1 */
    const int64_t *strides; /* NULL, or ndim strides in elements that must describe a compact
                               row-major layout (as torch reports for a contiguous tensor) */
    int32_t ndim;           /* 0..WSYNC_MAX_NDIM; 0 is a scalar of one element */
    wsync_dtype_t dtype;
    wsync_device_t device;
    uint32_t flags;         /* WSYNC_TENSOR_*; must be 0 on input */
    uint32_t reserved_;     /* must be 0 */
} wsync_tensor_t;

/* wsync_chunk_t.flags */
#define WSYNC_CHUNK_LAST 1u /* this chunk completes the current sync version */

/* A chunk: the tensors moved by one wsync_sender_send_chunk(). Usually one chunk of a plan. */
typedef struct wsync_chunk_t {
    const wsync_tensor_t *tensors; /* count descriptors, borrowed for the call */
    size_t count;                  /* >= 1 */
    uint32_t flags;                /* WSYNC_CHUNK_*; other bits must be 0 */
    uint32_t reserved_;            /* must be 0 */
} wsync_chunk_t;

/* Bytes owned by the library (init info, requests). Copy them anywhere; free with
 * wsync_blob_free(). Blobs are self-describing (see docs/wire-format.md): magic, format
 * version, blob type and strategy kind, then the strategy's fields, in CBOR. */
typedef struct wsync_blob_t {
    uint8_t *data;
    size_t size;
} wsync_blob_t;

/* Frees blob->data and sets *blob to {NULL, 0}. NULL, or a blob already {NULL, 0}, is a no-op. */
WSYNC_API void wsync_blob_free(wsync_blob_t *blob);

/* Frees a string returned by the library (JSON outputs). NULL is a no-op. */
WSYNC_API void wsync_string_free(char *str);

/* =============================================================================================
 * 3. Strategies
 * ===========================================================================================*/

typedef struct wsync_strategy_t wsync_strategy_t;

/* Creates a strategy of the given kind ("shm"; see wsync_strategy_kinds()) with options, a JSON
 * object as text ("{\"receivers\": 2}"); NULL or "" means all defaults. Options are strictly
 * validated: an unknown key, a value of the wrong type or out of range fails with
 * WSYNC_ERR_INVALID_ARGUMENT naming the key. A kind this build does not know fails with
 * WSYNC_ERR_UNSUPPORTED; a kind whose run-time dependency is missing (e.g. no CUDA driver)
 * fails with WSYNC_ERR_UNAVAILABLE naming what is missing.
 * Borrows kind and options_json for the call. On success *out is a new strategy, freed with
 * wsync_strategy_destroy(). Does not block. */
WSYNC_API wsync_status_t wsync_strategy_create(const char *kind, const char *options_json,
                                               wsync_strategy_t **out);

/* Destroys a strategy. Senders and receivers made from it stay valid (they hold what they need);
 * resources the strategy made for its init info (the shm segment) live until the sender made
 * from that init info is destroyed too. NULL is a no-op. Does not block. */
WSYNC_API void wsync_strategy_destroy(wsync_strategy_t *strategy);

/* Writes the strategy's kind name to *kind_out: static text, never freed. */
WSYNC_API wsync_status_t wsync_strategy_kind(const wsync_strategy_t *strategy,
                                             const char **kind_out);

/* Lists the kinds this build knows, as a JSON array of objects
 * [{"kind": "shm", "available": true, "reason": "", "runtime": ""}, ...]: "reason" says what is
 * missing when a kind is unavailable; "runtime" what an available GPU kind would use, e.g.
 * "CUDA driver 13000 (libcuda.so.1); NCCL 2.28.9 (libnccl.so.2)". *json_out is freed with
 * wsync_string_free(). Does not block. */
WSYNC_API wsync_status_t wsync_strategy_kinds(char **json_out);

/* Describes a kind's options as a JSON object: {"key": {"type": "uint", "default": 2,
 * "min": 1, "max": 64, "side": "sender", "doc": "..."}, ...}. *json_out is freed with
 * wsync_string_free(). Fails with WSYNC_ERR_UNSUPPORTED for an unknown kind. */
WSYNC_API wsync_status_t wsync_strategy_describe_options(const char *kind, char **json_out);

/* Trainer side: makes the init info that every sender and receiver of this sync is created
 * from, and whatever the kind needs to exist first (for "shm": the shared-memory segment,
 * mode 0600, unguessable name, its buckets reserved and pre-faulted; for "cuda_ipc": a small
 * acknowledgement segment and this host's boot id; for "nccl_broadcast": the NCCL unique id,
 * carried in the blob itself, so this process must stay alive until the group is formed).
 * Call once per strategy;
 * a second call fails with WSYNC_ERR_WRONG_STATE. On success *out holds the blob, freed with
 * wsync_blob_free(). May take time proportional to the buckets' size (pre-faulting); does not
 * wait for peers. */
WSYNC_API wsync_status_t wsync_strategy_create_init_info(wsync_strategy_t *strategy,
                                                         wsync_blob_t *out);

/* =============================================================================================
 * 4. Sender (trainer side)
 * ===========================================================================================*/

typedef struct wsync_sender_t wsync_sender_t;

/* Creates a sender from init info (len bytes at init, borrowed for the call). For "shm" the
 * strategy must be the one whose wsync_strategy_create_init_info() made this blob; a blob of
 * another strategy or kind fails with WSYNC_ERR_MISMATCH, a corrupt one with
 * WSYNC_ERR_MALFORMED. For "cuda_ipc" any process of the host may create a sender from the blob
 * (one per trainer GPU, "senders" in all). On success *out is freed with wsync_sender_destroy().
 * Does not block, except for "nccl_broadcast": it joins the group as rank 0 and blocks until
 * every receiver has joined, up to the "timeout_ms" option; then the communicator is aborted
 * and the call fails with WSYNC_ERR_TIMEOUT (or WSYNC_ERR_PEER if NCCL reported an error). */
WSYNC_API wsync_status_t wsync_sender_create(wsync_strategy_t *strategy, const uint8_t *init,
                                             size_t len, wsync_sender_t **out);

/* Destroys a sender without waiting for receivers (call wsync_sender_flush() first to know
 * they are done) and releases what it holds; for "shm" the segment is unlinked, so no name is
 * left behind. NULL is a no-op. Does not block. */
WSYNC_API void wsync_sender_destroy(wsync_sender_t *sender);

/* Starts moving one chunk and writes its request blob to *request_out (freed with
 * wsync_blob_free()); forward those bytes to every receiver. The tensors' memory is read during
 * the call only (for "shm" it is packed into a bucket); it may be changed once the call
 * returns, except for "cuda_ipc" with "packed": false, whose receivers read the trainer's own
 * memory: those tensors must stay unchanged (and allocated) until wsync_sender_flush() returns.
 * GPU kinds take WSYNC_DEVICE_CUDA tensors, all on one GPU per sender; with "synchronize"
 * (default) the sender first waits for work queued on the device ("cuda_ipc":
 * cuCtxSynchronize; "nccl_broadcast": the legacy default stream), and a "dtype" option casts
 * float32 tensors to bfloat16 or float16 while packing. Tensor descriptors are validated first: NULL data, zero elements, non-contiguous
 * strides, unknown dtype or device, over-long or duplicate names, shape products that overflow
 * fail with WSYNC_ERR_INVALID_ARGUMENT naming the tensor, and nothing is published.
 * A chunk holds 1..WSYNC_MAX_CHUNK_TENSORS tensors (receivers refuse more); another count fails
 * with WSYNC_ERR_INVALID_ARGUMENT before any descriptor is read.
 * The chunk belongs to the sender's current sync version (starting at 1); a chunk flagged
 * WSYNC_CHUNK_LAST completes that version and the next chunk starts version + 1.
 * "cuda_ipc" returns once its pack is complete on the GPU (one kernel launch per chunk);
 * "nccl_broadcast" returns once pack and broadcast are queued, so the next chunk packs while
 * this one moves.
 * Blocks while every bucket is still being read by some receiver, up to the strategy's
 * "timeout_ms" option; then fails with WSYNC_ERR_TIMEOUT (or WSYNC_ERR_PEER if a receiver died
 * or reported failure) naming the receivers, and the chunk is not sent. */
WSYNC_API wsync_status_t wsync_sender_send_chunk(wsync_sender_t *sender,
                                                 const wsync_chunk_t *chunk,
                                                 wsync_blob_t *request_out);

/* Waits until every receiver has acknowledged every chunk sent so far. Returns WSYNC_OK, or
 * WSYNC_ERR_TIMEOUT after timeout_ms (>= 0; 0 polls) naming the receiver indices that did not
 * answer, or WSYNC_ERR_PEER naming a receiver that died, detached or failed a chunk (with its
 * status). Blocks up to timeout_ms. For "nccl_broadcast" it waits for the queued broadcasts to
 * complete (NCCL has no back channel, so a receiver's own loading failure is reported to that
 * receiver's caller only); at the deadline the communicator is aborted and every later call on
 * the sender fails with WSYNC_ERR_PEER. */
WSYNC_API wsync_status_t wsync_sender_flush(wsync_sender_t *sender, int64_t timeout_ms);

/* The sync version the next chunk will belong to (1 before any chunk is sent). */
WSYNC_API wsync_status_t wsync_sender_version(const wsync_sender_t *sender,
                                              uint64_t *version_out);

/* Merges the partial requests of several senders of one chunk (one per trainer GPU, for kinds
 * with several senders) into one request. n >= 1; parts are borrowed for the call. Every part
 * must be of one kind, version and chunk; kinds with a single sender ("shm", "nccl_broadcast")
 * accept only n == 1 and return a copy. For "cuda_ipc" the parts' per-GPU entries are
 * concatenated and a GPU UUID in two parts fails with WSYNC_ERR_MISMATCH naming it. *out is freed with wsync_blob_free(). Does not block. */
WSYNC_API wsync_status_t wsync_request_merge(const wsync_blob_t *parts, size_t n,
                                             wsync_blob_t *out);

/* =============================================================================================
 * 5. Receiver and receive iteration (engine side)
 * ===========================================================================================*/

typedef struct wsync_receiver_t wsync_receiver_t;
typedef struct wsync_recv_t wsync_recv_t;

/* Creates receiver number `index` (0 .. receivers-1 as the init info says) from init info
 * (borrowed for the call). For "shm" it maps the segment once, read-only for data, and
 * registers its pid so the sender can tell a dead receiver from a slow one. An index out of
 * range fails with WSYNC_ERR_INVALID_ARGUMENT, an index already taken by a live process with
 * WSYNC_ERR_WRONG_STATE, a vanished segment with WSYNC_ERR_UNAVAILABLE. GPU kinds work on the
 * GPU named by the "device" option (an ordinal in this process, after CUDA_VISIBLE_DEVICES).
 * On success *out is freed with wsync_receiver_destroy(). Does not block, except for
 * "nccl_broadcast", which joins the group as rank index + 1 and blocks like
 * wsync_sender_create(). */
WSYNC_API wsync_status_t wsync_receiver_create(wsync_strategy_t *strategy, const uint8_t *init,
                                               size_t len, uint32_t index,
                                               wsync_receiver_t **out);

/* Destroys a receiver; an open iteration must be ended first (else it is ended as failed).
 * The sender learns that this receiver detached. NULL is a no-op. Does not block. */
WSYNC_API void wsync_receiver_destroy(wsync_receiver_t *receiver);

/* Starts receiving the chunk described by a request (len bytes at request, borrowed for the
 * call; the iteration keeps its own copy of what it needs). The request is fully validated
 * before any tensor memory is touched: malformed bytes fail with WSYNC_ERR_MALFORMED, another
 * kind or a stale or out-of-order chunk with WSYNC_ERR_MISMATCH. Chunks must be received in the
 * order they were sent. Only one iteration per receiver may be open
 * (WSYNC_ERR_WRONG_STATE otherwise). For "cuda_ipc" the receiver takes the request's part
 * whose GPU UUID equals its own device's ("GPU-" or "MIG-" prefixed, compared as 16 bytes);
 * none fails with WSYNC_ERR_MISMATCH naming this GPU and the ones present. IPC handles are
 * opened once and cached by their bytes; one a whole version did not use is closed. On success
 * *out is the iteration; it must be ended with wsync_recv_end(). Does not block for "shm" and
 * "cuda_ipc" (the bytes are in place when the request exists); "nccl_broadcast" posts its side
 * of the broadcast and blocks until it arrives, up to its "timeout_ms" option (then
 * WSYNC_ERR_TIMEOUT and the communicator is aborted). */
WSYNC_API wsync_status_t wsync_receiver_receive(wsync_receiver_t *receiver,
                                                const uint8_t *request, size_t len,
                                                wsync_recv_t **out);

/* The newest sync version whose every chunk this receiver has received, verified and ended
 * successfully (0 if none). A version with a failed chunk never becomes complete, so an engine
 * can keep serving its old weights. */
WSYNC_API wsync_status_t wsync_receiver_completed_version(const wsync_receiver_t *receiver,
                                                          uint64_t *version_out);

/* What an iteration carries. */
typedef struct wsync_recv_info_t {
    uint64_t version;     /* sync version of this chunk */
    uint64_t bytes;       /* payload bytes of all tensors */
    uint32_t chunk_index; /* 0-based position of the chunk within its version */
    uint32_t flags;       /* WSYNC_CHUNK_LAST if this chunk completes the version */
    size_t count;         /* number of tensors */
} wsync_recv_info_t;

/* Writes the iteration's summary to *info. Does not touch tensor memory. */
WSYNC_API wsync_status_t wsync_recv_info(const wsync_recv_t *it, wsync_recv_info_t *info);

/* Dry run: describes tensor i (0 .. count-1) without touching its bytes, so a loader can check
 * names, dtypes and shapes against its parameters before any byte moves. view->data is NULL.
 * The name and shape pointers stay valid until wsync_recv_end(). */
WSYNC_API wsync_status_t wsync_recv_peek(const wsync_recv_t *it, size_t i, wsync_tensor_t *view);

/* Yields the next tensor: *has_view is true and *view describes it, or *has_view is false at
 * the end. Views are zero-copy where the kind allows ("shm": read-only shared memory; the GPU
 * kinds: device memory of the receiver's GPU, view->device CUDA; all flagged
 * WSYNC_TENSOR_READ_ONLY); copy the bytes into your parameters. A view's data, name and shape
 * stay valid until wsync_recv_end(). With checksums on, a tensor is verified before it is
 * yielded and a mismatch fails with WSYNC_ERR_INTEGRITY naming the tensor; the iteration is then
 * failed (later calls return the same error). Does not block. */
WSYNC_API wsync_status_t wsync_recv_next(wsync_recv_t *it, wsync_tensor_t *view, bool *has_view);

/* Ends an iteration, acknowledges the chunk to the sender and frees the iteration (always, even
 * on failure; `it` is invalid afterwards). Returns WSYNC_OK only if every tensor was yielded and
 * verified; an iteration ended early or after a failure is acknowledged as failed, so the
 * sender's flush reports it and the version is not completed, and the call returns
 * WSYNC_ERR_WRONG_STATE (ended early) or the iteration's error. GPU kinds with "synchronize"
 * (default) first synchronise the receiver's device, so copies the loader queued out of the
 * views are complete before the sender may reuse that memory; that waits on this process's own
 * GPU work only. NULL is a no-op returning WSYNC_OK. Does not block otherwise. */
WSYNC_API wsync_status_t wsync_recv_end(wsync_recv_t *it);

/* =============================================================================================
 * 6. Planner: tensors -> chunks
 * ===========================================================================================*/

typedef struct wsync_plan_t wsync_plan_t;

/* Groups n tensor descriptors (name, dtype, shape; data ignored) into chunks: consecutive
 * tensors of one module (the name without its last `group_depth` dotted parts, so
 * "layers.0.attn.q.weight" and "layers.0.attn.k.weight" share "layers.0.attn" at depth 2)
 * stay in one chunk so an engine can fuse them; whole groups are batched in order while a chunk
 * stays within "chunk_bytes"; a group larger than the threshold is split between tensors, and a
 * single tensor larger than the threshold gets a chunk of its own. Deterministic: the same input
 * gives the same plan. Options (JSON, NULL for defaults): "chunk_bytes" (default 256 MiB),
 * "group_depth" (default 2; 0 disables grouping). Borrows metas for the call (names are
 * copied). *out is freed with wsync_plan_destroy(). Does not block. */
WSYNC_API wsync_status_t wsync_plan_create(const wsync_tensor_t *metas, size_t n,
                                           const char *options_json, wsync_plan_t **out);

/* NULL is a no-op. */
WSYNC_API void wsync_plan_destroy(wsync_plan_t *plan);

/* Number of chunks (>= 1 for a plan of n >= 1 tensors). */
WSYNC_API wsync_status_t wsync_plan_chunk_count(const wsync_plan_t *plan, size_t *count_out);

/* Chunk i: *indices_out points at *count_out ascending indices into the metas array given to
 * wsync_plan_create(), owned by the plan (valid until wsync_plan_destroy()); *bytes_out (may be
 * NULL) is the chunk's payload size. */
WSYNC_API wsync_status_t wsync_plan_chunk(const wsync_plan_t *plan, size_t i,
                                          const size_t **indices_out, size_t *count_out,
                                          uint64_t *bytes_out);

/* =============================================================================================
 * 7. Blobs and introspection
 * ===========================================================================================*/

/* Renders any blob (init info or request, any kind) as JSON for logs and tools: {"magic":
 * "wsync", "format": 1, "type": "request", "kind": "shm", "body": {...}}. The blob is parsed
 * with the same bounded parser receivers use; malformed input fails with WSYNC_ERR_MALFORMED
 * saying where. *json_out is freed with wsync_string_free(). Does not block. */
WSYNC_API wsync_status_t wsync_blob_describe(const uint8_t *blob, size_t len, char **json_out);

/* Sizes and field offsets of this header's structs as the library was compiled, as JSON
 * {"wsync_tensor_t": {"size": 56, "align": 8, "fields": {"name": 0, ...}}, ...}, so bindings
 * can test their declarations. *json_out is freed with wsync_string_free(). */
WSYNC_API wsync_status_t wsync_abi_layout(char **json_out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WSYNC_H */
